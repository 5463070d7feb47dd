"""A kernel with no rows cut into launches for the GPU (`codegen/cuda_phases.py`): the cut
computes what the body computes (the phases run one after another by the interpreter,
scratch in buffers), the rendered CUDA source run on the CPU and the row mapping
emulated equal the float64 reference in every row mode, the wide loops spread over the
grid, a top-level sum, max or online pair is split into chunks over the grid and merged,
and kernels with rows are left as they were."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelsat.codegen import cuda_phases, lower, reduce_sched, render
from kernelsat.codegen.cuda import ROW_MODES, CUDARenderer, device_nests, emulate, thread_loops
from kernelsat.codegen.cuda_cpu import run_on_cpu
from kernelsat.codegen.cuda_emulate import Interp
from kernelsat.codegen.cuda_phases import chunks, grid_split, phases, wide
from kernelsat.codegen.loops import Affine, Array, Assign, Call, Let, Lit, Load, Loop, Ref, Write
from kernelsat.interp import evaluate_as
from kernelsat.ir import (
    LSE,
    Const,
    In,
    Max,
    SoftmaxAvg,
    Sum,
    Term,
    add,
    div,
    exp,
    mul,
    postorder,
    sqrt,
    sub,
)
from kernelsat.ops import COMPARISONS
from kernelsat.testing import programs, random_inputs, relative_error

i, j, k = Affine.var("i"), Affine.var("j"), Affine.var("k")


def _centred(x: Term, a: str, n: int) -> Term:
    return sub(x, div(Sum(a, x), Const(float(n))))


def column_norm(n: int, c: int) -> tuple[Term, tuple[str, ...]]:
    """Batch norm's statistics over `n` samples per channel, then every sample normalised."""
    x = In("x", (("n", n), ("c", c)))
    d = _centred(x, "n", n)
    var = div(Sum("n", mul(d, d)), Const(float(n)))
    return div(d, sqrt(add(var, Const(1e-5)))), ("n", "c")


def over_the_total(n: int, c: int) -> tuple[Term, tuple[str, ...]]:
    """Every element over the sum of all of them (a scalar crosses the phases)."""
    x = In("x", (("n", n), ("c", c)))
    return div(x, Sum("n", Sum("c", mul(x, x)))), ("n", "c")


def minus_the_max(n: int, c: int) -> tuple[Term, tuple[str, ...]]:
    """exp of each element minus the column's max (a max over the samples, then a pass)."""
    x = In("x", (("n", n), ("c", c)))
    return exp(sub(x, Max("n", x))), ("n", "c")


def column_logsumexp(n: int, c: int) -> tuple[Term, tuple[str, ...]]:
    """A one-pass log-sum-exp down each column: an array of running maxima rescaling an
    array of sums, split into chunks over the grid and merged by rescaling."""
    return LSE("n", In("x", (("n", n), ("c", c)))), ("c",)


def softmax_average(n: int, c: int) -> tuple[Term, tuple[str, ...]]:
    """The softmax-weighted average of the samples: one running max rescaling a row."""
    return SoftmaxAvg("n", In("s", (("n", n),)), In("x", (("n", n), ("c", c)))), ("c",)


KERNELS = {"column norm": column_norm, "over the total": over_the_total,
           "minus the max": minus_the_max, "column logsumexp": column_logsumexp,
           "softmax average": softmax_average}


def _knobs(low, mode: str, **extra: object) -> list[dict[str, object]]:
    out = []
    for kern in low.kernels:
        space = kern.knob_space()
        mine = {"cuda.rows": mode, "tpb": 64, **extra}
        out.append({**{key: v[0] for key, v in space.items()},
                    **{key: v for key, v in mine.items() if key in space}})
    return out


@pytest.fixture(autouse=True)
def _small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Split top-level reductions over the grid at test sizes."""
    monkeypatch.setattr(cuda_phases, "PSUM_MIN_POINTS", 0)


@pytest.fixture
def _blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Offer the one-pass statistics (`welford`: per-block slots) at test sizes."""
    monkeypatch.setattr(reduce_sched, "WELFORD_OFFER_BYTES", 0)
    monkeypatch.setattr(reduce_sched, "WELFORD_MIN_BYTES", 0)


@pytest.mark.usefixtures("_blocked")
@pytest.mark.parametrize("welford", [True, False])
@pytest.mark.parametrize("mode", ROW_MODES)
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_phases_equal_the_reference(name: str, mode: str, welford: bool) -> None:
    term, axes = KERNELS[name](96, 5)
    low = lower(term, axes)
    nests = low.nests(_knobs(low, mode, **({} if welford else {"welford": 0})))
    launched, scratch = device_nests(nests)
    assert len(launched) > len(nests) and scratch  # the kernel was cut
    env = random_inputs(term, seed=4)
    ref = evaluate_as(term, env, axes)
    assert relative_error(emulate(low, nests, env), ref) < 1e-12
    out = run_on_cpu(low, nests, env)  # the rendered source itself, on CPU threads
    assert relative_error(out.astype(np.float64), ref) < 1e-5


@pytest.mark.usefixtures("_blocked")
def test_the_wide_loops_spread_over_the_grid() -> None:
    """Batch norm's per-block statistics and its normalisation each get a grid of rows;
    only the merge of the blocks' statistics runs as one row."""
    term, axes = column_norm(4096, 64)
    low = lower(term, axes)
    (knobs,) = _knobs(low, "block")
    assert knobs["welford"] > 0
    launched, scratch = device_nests(low.nests([knobs]))
    blocks = [launch.blocks for launch in CUDARenderer().launches(launched)]
    assert blocks[0] == 4096 // int(knobs["welford"])  # one row per block of samples
    assert blocks[-1] == 4096  # one row per sample
    assert blocks.count(1) == 1
    source = render(low, [knobs], "cuda")
    launches = CUDARenderer().launches(launched)
    for nest, launch in zip(launched, launches, strict=True):
        assert f"void {nest.symbol}(" in source
        assert f"//   {nest.symbol}<<<{launch.blocks}, {launch.threads}>>>(" in source
    assert "// scratch buffers (float32 elements): " in source
    for buf in scratch:  # written by one launch, read (const) by a later one
        assert f"float* __restrict__ {buf}" in source
        assert f"const float* __restrict__ {buf}" in source


def test_kernels_with_rows_are_left_as_they_were() -> None:
    x = In("x", (("i", 40), ("n", 33)))
    low = lower(div(x, Sum("n", x)), ("i", "n"))
    nests = low.nests(_knobs(low, "warp"))
    launched, scratch = device_nests(nests)
    assert launched == nests and not scratch
    assert thread_loops(launched[0].body)[1]


def _run_sequential(body, bufs: dict[str, np.ndarray]) -> None:
    def load(b: str, at: int) -> float:
        return float(bufs[b][at])

    def store(b: str, at: int, v: float) -> None:
        bufs[b][at] = v

    Interp(load, store).run(body, {})


def test_every_crossing_kind_is_carried() -> None:
    """A scalar, an array filled before it is first written, an array an earlier phase
    wrote and a later one updates, and a slot loop: the phases run one after another
    compute what the body computes."""
    body = (
        Let("s", Lit(0.0), mutable=True),
        Loop("i", 6, (Assign(Ref("s"), Call("add", (Ref("s"), Load("in0", i)))),), "reduce"),
        Array("a", 12, 0.0, fill=False),
        Array("b", 6, 1.5),  # filled here, first used by the slot loop's phase below
        Loop("i", 3, (Loop("j", 4, (Assign(Ref("a", i.scale(4) + j),
                                           Call("mul", (Load("in0", j), Ref("s")))),),
                           "vector"),), "reduce"),  # a slot loop: wide
        Loop("k", 6, (Write("out", k, Call("add", (Ref("b", k), Load("in0", k)))),),
             "parallel"),
        Loop("i", 11, (Assign(Ref("a", i + Affine((), 1)),
                              Call("add", (Ref("a", i), Ref("a", i + Affine((), 1))))),),
             "serial"),  # a running sum in place: updates the slot loop's array
        Loop("k", 6, (Write("out", k + Affine((), 6),
                            Call("mul", (Ref("a", k.scale(2)), Ref("s")))),), "parallel"),
    )
    decls = {"s": body[0], "a": body[2], "b": body[3]}
    assert wide(body[4], decls) and wide(body[5], decls) and not wide(body[6], decls)
    parts, scratch = phases(0, body)
    assert len(parts) == 5
    assert scratch == {"ks_k0_s": 1, "ks_k0_a": 12, "ks_k0_b": 6}
    rng = np.random.default_rng(0)
    src = rng.uniform(0.5, 1.5, 6)
    want = {"in0": src.copy(), "out": np.full(12, np.nan)}
    _run_sequential(body, want)
    got = {"in0": src.copy(), "out": np.full(12, np.nan),
           **{b: np.full(n, np.nan) for b, n in scratch.items()}}
    for part in parts:
        _run_sequential(part, got)
    np.testing.assert_array_equal(got["out"], want["out"])


@settings(max_examples=15, deadline=None)
@given(name=st.sampled_from(sorted(KERNELS)), n=st.integers(2, 70),
       c=st.sampled_from([1, 2, 7, 33]), mode=st.sampled_from(ROW_MODES),
       seed=st.integers(0, 2**16))
def test_random_sizes_emulated(name: str, n: int, c: int, mode: str, seed: int) -> None:
    term, axes = KERNELS[name](n, c)
    low = lower(term, axes)
    env = random_inputs(term, seed=seed)
    out = emulate(low, low.nests(_knobs(low, mode)), env)
    assert relative_error(out, evaluate_as(term, env, axes)) < 1e-12


@pytest.mark.parametrize("mode", ROW_MODES)
def test_a_scalar_loss_over_rows_is_split_over_the_grid(mode: str) -> None:
    """The mean over rows of each row's log-sum-exp: one scalar accumulator."""
    x = In("x", (("b", 64), ("c", 9)))
    term = div(Sum("b", LSE("c", x)), Const(64.0))
    low = lower(term, ())
    nests = low.nests(_knobs(low, mode))
    launched, scratch = device_nests(nests)
    (rows,) = thread_loops(launched[0].body)[1]  # the first launch: a row per chunk
    assert rows.extent == chunks(64) > 1
    assert any(n.startswith("ks_k0_part") and size == chunks(64) for n, size in scratch.items())
    env = random_inputs(term, seed=7)
    ref = evaluate_as(term, env, ())
    assert relative_error(emulate(low, nests, env), ref) < 1e-12
    assert relative_error(run_on_cpu(low, nests, env).astype(np.float64), ref) < 1e-5


def test_chunks_divide_the_extent() -> None:
    assert chunks(262144) == 1024 and chunks(96) == 6 and chunks(31) == 1
    assert chunks(65537) == 1  # prime: no equal chunks
    for n in (48, 100, 999, 4096, 262144):
        g = chunks(n)
        assert n % g == 0 and n // g >= cuda_phases.GRID_MIN_CHUNK and g <= 1024


def test_an_online_pair_is_split_over_the_grid() -> None:
    """A column log-sum-exp's running maxima and sums: chunks of the samples, each from
    -inf and 0, then the merge rescales every chunk's part to the larger max."""
    term, axes = column_logsumexp(96, 5)
    low = lower(term, axes)
    nests = low.nests(_knobs(low, "thread"))
    (body,) = [n.body for n in nests]
    split = [s for s in body if isinstance(s, Loop) and grid_split(s, {
        d.name: d for d in body if isinstance(d, Let | Array)}, 0) is not None]
    assert split, "the online loop is split"
    _, scratch = device_nests(nests)
    assert any("_part" in name for name in scratch)
    src = render(low, _knobs(low, "thread"), "cuda")
    assert "ks_top" in src and "ks_ca" in src  # the rescaling merge


def test_only_sums_maxima_and_online_pairs_are_split() -> None:
    acc = Let("p", Lit(1.0), mutable=True)
    product = Loop("i", 64, (Assign(Ref("p"), Call("mul", (Ref("p"), Load("in0", i)))),),
                   "reduce")
    assert grid_split(product, {"p": acc}, 0) is None
    total = Let("s", Lit(0.0), mutable=True)
    sums = Loop("i", 64, (Assign(Ref("s"), Call("add", (Ref("s"), Load("in0", i)))),),
                "reduce")
    split = grid_split(sums, {"s": total}, 0)
    assert split is not None
    want = {"in0": np.arange(64.0), "out": np.zeros(1)}
    got = {"in0": np.arange(64.0), "out": np.zeros(1)}
    tail = (Write("out", Affine(), Ref("s")),)
    _run_sequential((total, sums, *tail), want)
    _run_sequential((total, *split, *tail), got)
    assert got["out"][0] == want["out"][0] == sum(range(64))
    # a scalar online pair: the running max m and the sum s of exp(x - m)
    m, acc = Let("m", Lit(-math.inf), mutable=True), Let("s", Lit(0.0), mutable=True)
    body = (Let("t", Load("in0", i)), Let("d", Call("sub", (Ref("t"), Ref("m")))),
            Let("e", Call("exp", (Call("neg", (Call("abs", (Ref("d"),)),)),))),
            Assign(Ref("s"), Call("select_gt", (Ref("d"), Lit(0.0), Call("add", (Call(
                "mul", (Ref("s"), Ref("e"))), Lit(1.0))), Call("add", (Ref("s"), Ref("e")))))),
            Assign(Ref("m"), Call("select_gt", (Ref("d"), Lit(0.0), Ref("t"), Ref("m")))))
    online = Loop("i", 64, body, "reduce")
    split = grid_split(online, {"m": m, "s": acc}, 0)
    assert split is not None and chunks(64) == 4
    x = np.random.default_rng(0).normal(0, 3, 64)
    tail = (Write("out", Affine(), Call("add", (Ref("m"), Call("log", (Ref("s"),))))),)
    want, got = ({"in0": x.copy(), "out": np.zeros(1)} for _ in range(2))
    _run_sequential((m, acc, online, *tail), want)
    _run_sequential((m, acc, *split, *tail), got)
    assert math.isclose(got["out"][0], float(np.log(np.exp(x).sum())), rel_tol=1e-12)
    assert math.isclose(got["out"][0], want["out"][0], rel_tol=1e-12)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(term=programs(max_depth=3, sizes=(1, 3, 32, 48)), mode=st.sampled_from(ROW_MODES),
       seed=st.integers(0, 1000))
def test_random_programs_cut_into_phases_emulated(term: Term, mode: str, seed: int) -> None:
    """Random programs (reductions, LSE, SoftmaxAvg, Dot, splits, stores), their row-less
    kernels cut into phases and their top-level sums, maxima and online pairs split over the grid at
    these sizes, equal the float64 reference under every row mapping."""
    axes = tuple(term.shape)
    if math.prod(term.all_sizes.values()) > 40_000:
        return
    # a comparison of two values equal over the reals flips on their last bit, whatever
    # the schedule (the emulator with no phases differs from the reference there too)
    if any(n.op in COMPARISONS for n in postorder(term)):
        return
    low = lower(term, axes)
    env = random_inputs(term, seed=seed)
    ref = evaluate_as(term, env, axes)
    out = emulate(low, low.nests(_knobs(low, mode)), env)
    finite = np.isfinite(ref)
    assert np.array_equal(np.isfinite(out), finite)
    if finite.any():
        assert relative_error(np.where(finite, out, 0), np.where(finite, ref, 0)) < 1e-9
