"""Reduction schedules (codegen/reduce_sched.py): `keep`, hoisting, transposed-reduction
tiles. The C output equals the float64 interpreter for every knob value the space allows,
at sizes that are not multiples of any tile or lane count, with rows holding -inf and
large values where the online and kept forms must stay exact."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelsat.codegen import build, lower
from kernelsat.codegen.reduce_sched import KEEP_CAP, keep_candidates
from kernelsat.interp import evaluate_as
from kernelsat.ir import LSE, In, Max, Store, Sum, Term, div, exp, input_dims, log, mul, sqrt, sub
from kernelsat.spec import load_spec

SPECS = Path(__file__).resolve().parent.parent / "specs"
EXP_FAMILY = ("softmax", "logsumexp", "cross_entropy")
"""Specs whose exps must survive -1e30 entries (the others square their inputs)."""
ROWS = ("softmax", "layernorm", "rmsnorm", "logsumexp", "cross_entropy", "l2norm",
        "variance", "rowsum", "row_range")
"""Specs with a row axis M (B) and a reduced axis N (C); batchnorm reduces its first axis."""


def spec_term(name: str, rows: int, cols: int) -> tuple[Term, tuple[str, ...]]:
    big, small = ("N", "C") if name == "batchnorm" else (("B", "C") if name == "cross_entropy"
                                                         else ("M", "N"))
    prog = load_spec(SPECS / f"{name}.ks", {big: rows, small: cols})
    return prog.term, tuple(prog.out_axes)


def inputs_for(term: Term, seed: int, extreme: bool, huge: bool = True
               ) -> dict[str, np.ndarray]:
    """Random inputs; `extreme`: some entries large (+-80, 1e4) and, with `huge`, some
    -1e30 (exp underflows to 0), so online maxima and kept exps see both ends."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for node in _inputs(term):
        name = str(node.attrs[0])
        shape = input_dims(node)
        x = rng.standard_normal(shape).astype(np.float32)
        if name == "T":  # a one-hot target
            x = np.zeros(shape, np.float32)
            x.reshape(-1, shape[-1])[np.arange(x.size // shape[-1]),
                                     rng.integers(0, shape[-1], x.size // shape[-1])] = 1
        elif extreme and x.size > 1:
            flat = x.reshape(-1)
            k = rng.integers(0, flat.size, max(1, flat.size // 7))
            flat[k[::3]] = -1e30 if huge else -300.0
            flat[k[1::3]] = 80.0
            flat[k[2::3]] = -80.0
            flat[0] = 1e4 if flat.size > 2 else flat[0]
        out[name] = x
    return out


def _inputs(term: Term) -> list[Term]:
    seen: dict[str, Term] = {}
    stack = [term]
    while stack:
        t = stack.pop()
        if t.op.name == "IN":
            seen.setdefault(str(t.attrs[0]), t)
        stack.extend(t.args)
    return list(seen.values())


def check(term: Term, axes: tuple[str, ...], knobs: Sequence[Mapping[str, Any] | None],
          env: dict[str, np.ndarray]) -> None:
    lowered = lower(term, axes)
    exe = build(lowered, "c", knobs)
    out = np.full(lowered.buffers["out"].shape, np.nan, np.float32)
    exe(env, out)
    ref = evaluate_as(term, {k: v.astype(np.float64) for k, v in env.items()}, axes)
    ref = np.asarray(ref, np.float64)
    assert np.all(np.isfinite(ref) == np.isfinite(out)), "non-finite values differ"
    fin = np.isfinite(ref)
    scale = 1.0 + float(np.max(np.abs(ref[fin]))) if fin.any() else 1.0
    np.testing.assert_allclose(out[fin], ref[fin], rtol=2e-4, atol=2e-5 * scale)


def knob_settings(lowered: Any) -> list[list[dict[str, Any]]]:
    """Every legal value of every knob, one knob at a time from the defaults (plus
    `keep` off under every `order`), per kernel."""
    settings_: list[list[dict[str, Any]]] = []
    for k, kern in enumerate(lowered.kernels):
        space = kern.knob_space()
        for name, values in space.items():
            if name in ("tpb", "omp") or name.startswith("cuda."):
                continue  # CUDA-only / threading: no effect on the loop nest's values
            for v in values[1:]:
                knobs: list[dict[str, Any]] = [{} for _ in lowered.kernels]
                knobs[k] = {name: v}
                settings_.append(knobs)
        if "keep" in space:
            for order in space["order"]:
                knobs = [{} for _ in lowered.kernels]
                knobs[k] = {"keep": False, "order": order}
                settings_.append(knobs)
    return settings_


@pytest.mark.parametrize("name", [*ROWS, "batchnorm"])
@pytest.mark.parametrize("size", [(3, 17), (1, 33)])
def test_spec_defaults_match_reference(name: str, size: tuple[int, int]) -> None:
    term, axes = spec_term(name, *size)
    check(term, axes, [None] * len(lower(term, axes).kernels),
          inputs_for(term, 1, True, name in EXP_FAMILY))


@pytest.mark.slow
@pytest.mark.parametrize("name", [*ROWS, "batchnorm"])
def test_every_knob_value_matches_reference(name: str) -> None:
    term, axes = spec_term(name, 5, 48)  # 48: lanes of 16 (3 steps) and of 8, 4; tiles
    env = inputs_for(term, 2, True, name in EXP_FAMILY)
    lowered = lower(term, axes)
    for knobs in knob_settings(lowered):
        check(term, axes, knobs, env)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["softmax", "logsumexp", "cross_entropy", "layernorm",
                             "batchnorm"]),
       rows=st.sampled_from([1, 3, 17]), cols=st.sampled_from([1, 3, 17, 33, 1000]),
       keep=st.booleans(), pick=st.integers(0, 10_000), seed=st.integers(0, 99))
def test_random_knobs_match_reference(name: str, rows: int, cols: int, keep: bool, pick: int,
                                      seed: int) -> None:
    term, axes = spec_term(name, rows, cols)
    lowered = lower(term, axes)
    knobs: list[dict[str, Any]] = []
    for kern in lowered.kernels:
        space = kern.knob_space()
        chosen = {k: v[pick % len(v)] for k, v in space.items() if k in ("order", "vec")}
        for k, v in space.items():
            if k.startswith("tile."):
                chosen[k] = v[(pick // 7) % len(v)]
        if "keep" in space:
            chosen["keep"] = keep
        knobs.append(chosen)
    check(term, axes, knobs, inputs_for(term, seed, seed % 2 == 0, name in EXP_FAMILY))


# -- keep ----------------------------------------------------------------------------------


def softmax_term(m: int, n: int) -> Term:
    x = In("x", (("i", m), ("n", n)))
    e = exp(sub(x, Max("n", x)))
    return div(e, Sum("n", e))


def test_keep_evaluates_one_exp_per_element() -> None:
    kern = lower(softmax_term(8, 40), ("i", "n")).kernels[0]
    assert kern.knob_space()["keep"] == (True, False)
    assert kern.stats.transcendentals == 8 * 40
    assert str(kern.nest({"keep": False})).count("exp") == 2
    for tile in kern.knob_space()["tile.n"]:  # an intra-tile output loop reads the row too
        assert str(kern.nest({"tile.n": tile})).count("exp") == 1


def test_keep_only_where_a_transcendental_is_shared() -> None:
    x = In("x", (("i", 4), ("n", 8)))
    plain = sub(x, div(Sum("n", x), Store(Sum("n", mul(x, x)))))  # shared, but no exp
    assert not keep_candidates(lower(plain, ("i", "n")).kernels[0].term)
    assert "keep" not in lower(plain, ("i", "n")).kernels[0].knob_space()
    assert "keep" not in lower(LSE("n", x), ("i",)).kernels[0].knob_space()
    too_long = softmax_term(2, KEEP_CAP + 16)
    assert "keep" not in lower(too_long, ("i", "n")).kernels[0].knob_space()


def test_keep_feeds_a_second_reduction() -> None:
    """Entropy-like: the kept exp row is read by another reduction over the same axis."""
    x = In("x", (("i", 5), ("n", 37)))
    e = exp(sub(x, Max("n", x)))
    term = sub(div(Sum("n", mul(e, x)), Sum("n", e)), log(Sum("n", e)))
    lowered = lower(term, ("i",))
    kern = lowered.kernels[0]
    assert "keep" in kern.knob_space()
    assert kern.stats.transcendentals == 5 * 37 + 5  # one exp per element, one log per row
    env = inputs_for(term, 3, True)
    for keep in (True, False):
        for vec in kern.knob_space()["vec"]:
            check(term, ("i",), [{"keep": keep, "vec": vec}], env)


@pytest.mark.parametrize("n", [1, 3, 16, 17, 1000])
def test_keep_rows_with_extremes(n: int) -> None:
    term = softmax_term(4, n)
    env = inputs_for(term, n, True)
    if n > 1:
        env["x"][1, :] = -1e30  # a row of huge negatives (finite): softmax is uniform
        env["x"][2, -1] = 88.0  # exp overflows without the max subtracted
    for keep in (True, False):
        check(term, ("i", "n"), [{"keep": keep}], env)


# -- transposed reductions and hoisting ---------------------------------------------------


def channel_norm(n: int, c: int) -> Term:
    x = In("x", (("n", n), ("c", c)))
    mean = div(Sum("n", x), float_const(n))
    d = sub(x, mean)
    return div(d, sqrt(div(Sum("n", mul(d, d)), float_const(n))))


def float_const(v: float) -> Term:
    from kernelsat.ir import Const

    return Const(float(v))


@pytest.mark.parametrize("c", [64, 24, 7, 200, 131])
def test_transposed_reduction_tiles_the_contiguous_axis(c: int) -> None:
    kern = lower(channel_norm(40, c), ("n", "c")).kernels[0]
    knobs = kern.default_knobs()
    want = min(c, 64)  # the whole axis when it fits 64 floats, else 64 (and a rest)
    assert knobs["tile.c"] == want
    assert knobs["order"][0] == "c"  # the channel-block loop outside the sample loop
    text = str(kern.nest())
    if want > 1 and c % want == 0:  # the per-channel sqrt runs once per channel
        assert text.count("sqrt(") == 1
        loops = [line for line in text.splitlines() if "sqrt(" in line]
        assert all(line.startswith("    ") for line in loops)
        # ... and so does the reciprocal the output pass multiplies by (no per-sample div)
        out_pass = text[text.rindex("parallel"):]
        assert "div(" not in out_pass and "div(1.0" in text
    check(channel_norm(40, c), ("n", "c"), [None], inputs_for(channel_norm(40, c), c, False))


def test_reduction_computed_once_with_vector_accumulators() -> None:
    """The mean inside the variance pass is the mean pass's value, not a second sum."""
    kern = lower(channel_norm(40, 64), ("n", "c")).kernels[0]
    text = str(kern.nest())
    assert text.count("reduce") == 2  # one pass for the mean, one for the variance


# -- division by a row invariant ------------------------------------------------------------


def test_division_by_a_row_value_is_one_reciprocal_per_row() -> None:
    x = In("x", (("i", 3), ("n", 40)))
    term = div(x, Sum("n", x))
    text = str(lower(term, ("i", "n")).kernels[0].nest())
    assert text.count("div(") == 1 and "div(1.0" in text


@pytest.mark.parametrize("d", [1.0, 3.0, 1e-39, 2e-38, 1e-45, 0.0, 3e38, np.inf, -np.inf,
                               np.nan, -2.5e-39])
def test_division_by_a_row_value_keeps_ieee_edges(d: float) -> None:
    """x / d row-wise, d the row's single element: the reciprocal form gives float32's
    x / d (finite within ~1 ulp; the same inf / NaN pattern) for tiny, zero, huge, inf
    and NaN divisors, with numerators up to 3e38."""
    xs = np.array([0.0, 1.0, -2.5, 1e-30, 3e38, -3e38, 1e-44, 7.0, np.inf, 0.5],
                  np.float32)
    x = In("x", (("i", 1), ("n", xs.size)))
    den = In("d", (("i", 1), ("k", 1)))
    term = div(x, Sum("k", den))
    lowered = lower(term, ("i", "n"))
    out = np.full((1, xs.size), np.nan, np.float32)
    build(lowered, "c")({"x": xs[None, :], "d": np.array([[d]], np.float32)}, out)
    with np.errstate(all="ignore"):
        want = xs / np.float32(d)
    got = out[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=3e-7, atol=0)
    np.testing.assert_array_equal(np.sign(got[~np.isnan(want)]), np.sign(want[~np.isnan(want)]))


# -- explicit SIMD of max lanes -------------------------------------------------------------


def test_max_lanes_are_marked_simd_for_c_only() -> None:
    """gcc leaves a max's unrolled lane loop scalar (16 vmaxss a step); the lane loop is
    kind "simd" and C marks it `#pragma omp simd` (one vmaxps); CUDA gets no pragma."""
    from kernelsat.codegen import render

    x = In("x", (("i", 4), ("n", 64)))
    lowered = lower(sub(Max("n", x), Max("n", mul(x, x))), ("i",))
    text = str(lowered.kernels[0].nest())
    assert text.count(" simd") == 2
    assert render(lowered, None, "c").count("#pragma omp simd") == 2
    assert "#pragma omp simd" not in render(lowered, None, "cuda")
    assert "simd" not in str(lowered.kernels[0].nest({"vec": 1}))  # no lanes, no mark
    check(sub(Max("n", x), Max("n", mul(x, x))), ("i",), [None], inputs_for(x, 5, True, False))


@pytest.mark.slow
def test_every_attention_candidate_lowers_and_builds(tmp_path) -> None:
    """The e-graph's candidates for attention (split key axis, partly fused forms) lower
    under the `keep` knob without errors: a kept value whose axes are bound elsewhere
    (a split part, an inner reduction axis) is recomputed instead (they once raised
    StopIteration and KeyError and were dropped)."""
    from kernelsat.driver.pipeline import optimize
    from kernelsat.spec import load_spec

    program = load_spec("specs/attention.ks", {"N": 128, "D": 16, "H": 2})
    result = optimize(program, "c", seconds=60, cache_dir=tmp_path)
    errors = [c.error for c in result.candidates
              if c.error and "too slow" not in c.error and "overflow" not in c.error]
    assert not errors
    assert len(result.candidates) > 3
