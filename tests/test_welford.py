"""One-pass sums of squared deviations (knob `welford`, `_Builder.blocked_sq_dev`):
`Sum_a((x - k)^2)` as per-block sums and deviations from each block's own mean, merged
by sum_b (q_b + B (s_b/B - k)^2), with the sum of x over a taken from the same pass.

Checked: the C program equals the float64 interpreter at every value of the knob (and
with the block loop split over the threads or not) on random shapes, for column
statistics with vector accumulators (batch norm), row statistics with lanes (variance,
layer norm), a k that is not the mean and a k read from an input; the identity itself
over exact rationals; the one-pass form reads its input once (one pass fewer in the
nest and in the schedule model); the block loop is split with no merge; the knob is
offered only where a long squared-deviation reduction exists; and on data with a large
offset the one-pass form is no less accurate than the two-pass one."""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.codegen import build, lower, reduce_sched
from kernelsat.codegen.combine import parallel_sums, slot_states
from kernelsat.codegen.loops import (
    Affine,
    Array,
    Assign,
    Call,
    Lit,
    Load,
    Loop,
    Ref,
    Stmt,
    stmt_lines,
)
from kernelsat.codegen.lower import LoweredProgram
from kernelsat.hardware.schedule_model import ScheduleModel
from kernelsat.hardware.targets import get_target
from kernelsat.interp import evaluate_as
from kernelsat.ir import Const, In, Max, Sum, Term, add, div, mul, sqrt, sub


@pytest.fixture(autouse=True)
def _small_sizes_offer_the_knob(monkeypatch: pytest.MonkeyPatch) -> None:
    """The knob is offered from 256 KiB sweeps; these tests use small ones."""
    monkeypatch.setattr(reduce_sched, "WELFORD_OFFER_BYTES", 0)
    monkeypatch.setattr(reduce_sched, "WELFORD_MIN_BYTES", 0)


def centred(x: Term, a: str, n: int) -> Term:
    return sub(x, div(Sum(a, x), Const(float(n))))


def variance(x: Term, a: str, n: int) -> Term:
    d = centred(x, a, n)
    return div(Sum(a, mul(d, d)), Const(float(n)))


def column_norm(n: int, c: int) -> tuple[Term, tuple[str, ...]]:
    x = In("x", (("n", n), ("c", c)))
    return div(centred(x, "n", n), sqrt(add(variance(x, "n", n), Const(1e-5)))), ("n", "c")


def row_variance(n: int, c: int) -> tuple[Term, tuple[str, ...]]:
    return variance(In("x", (("i", c), ("n", n))), "n", n), ("i",)


def row_norm(n: int, c: int) -> tuple[Term, tuple[str, ...]]:
    x = In("x", (("i", c), ("n", n)))
    return div(centred(x, "n", n), sqrt(add(variance(x, "n", n), Const(1e-5)))), ("i", "n")


def around_max(n: int, c: int) -> tuple[Term, tuple[str, ...]]:
    """Squared deviations from the column max: no sum of x to share."""
    x = In("x", (("n", n), ("c", c)))
    d = sub(x, Max("n", x))
    return Sum("n", mul(d, d)), ("c",)


def around_input(n: int, c: int) -> tuple[Term, tuple[str, ...]]:
    """Squared deviations from a k read from an input, per row."""
    x, m = In("x", (("i", c), ("n", n))), In("m", (("i", c),))
    d = sub(x, m)
    return Sum("n", mul(d, d)), ("i",)


KERNELS: dict[str, Callable[[int, int], tuple[Term, tuple[str, ...]]]] = {
    "column norm": column_norm, "row variance": row_variance, "row norm": row_norm,
    "around max": around_max, "around input": around_input,
}


def inputs(term: Term, seed: int, offset: float = 0.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    stack = [term]
    while stack:
        t = stack.pop()
        if t.op.name == "IN" and str(t.attrs[0]) not in out:
            shape = [s for dim in t.attrs[1] for _, s in dim]  # type: ignore[union-attr]
            sign = rng.choice([-1.0, 1.0], shape)
            out[str(t.attrs[0])] = (offset + sign * rng.uniform(0.5, 1.5, shape)).astype(
                np.float32)
        stack.extend(t.args)
    return out


def run(low: LoweredProgram, knobs: dict[str, object], env: dict[str, np.ndarray]
        ) -> tuple[np.ndarray, str]:
    exe = build(low, "c", [knobs])
    out = np.full(low.buffers["out"].shape, np.nan, np.float32)
    exe(env, out)
    return out, exe.source  # type: ignore[attr-defined]


def reference(term: Term, env: dict[str, np.ndarray], axes: tuple[str, ...]) -> np.ndarray:
    return np.asarray(evaluate_as(term, {k: v.astype(np.float64) for k, v in env.items()},
                                  axes))


@settings(max_examples=12, deadline=None)
@given(name=st.sampled_from(sorted(KERNELS)), blocks=st.integers(4, 24),
       block=st.sampled_from([16, 24, 64]), c=st.sampled_from([1, 3, 16, 61, 64, 100]),
       seed=st.integers(0, 2**16))
def test_every_block_length_equals_the_reference(name: str, blocks: int, block: int, c: int,
                                                 seed: int) -> None:
    term, axes = KERNELS[name](blocks * block, c)
    low = lower(term, axes)
    space = low.kernels[0].knob_space()
    assert "welford" in space
    env = inputs(term, seed)
    ref = reference(term, env, axes)
    scale = 1.0 + float(np.max(np.abs(ref)))
    for value in space["welford"]:
        for psum in (True, False) if "psum" in space else (True,):
            out, _ = run(low, {"welford": value, "psum": psum} if "psum" in space
                         else {"welford": value}, env)
            np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-6 * scale,
                                       err_msg=f"welford={value} psum={psum}")


def test_the_block_identity_holds_over_the_rationals() -> None:
    """sum (x - k)^2 = sum_b (q_b + B (mean_b - k)^2), exactly, for any k."""
    rng = np.random.default_rng(7)
    block, blocks = 5, 7
    xs = [Fraction(int(v), 97) for v in rng.integers(-1000, 1000, block * blocks)]
    for k in (Fraction(0), Fraction(3, 7), sum(xs) / len(xs)):
        direct = sum((x - k) ** 2 for x in xs)
        merged = Fraction(0)
        for b in range(blocks):
            part = xs[b * block:(b + 1) * block]
            mean = sum(part) / block
            merged += sum((x - mean) ** 2 for x in part) + block * (mean - k) ** 2
        assert merged == direct


def passes_over_input(body: tuple[Stmt, ...]) -> int:
    """Top-level statements of a nest that read the input `in0` somewhere."""
    return sum(1 for s in body if isinstance(s, Loop)
               and any("in0[" in line for line in stmt_lines(s, 0)))


def test_the_one_pass_form_reads_the_input_once_fewer() -> None:
    term, axes = column_norm(4096, 64)
    low = lower(term, axes)
    kernel = low.kernels[0]
    block = kernel.knob_space()["welford"][0]
    one, two = kernel.nest({"welford": block}), kernel.nest({"welford": 0})
    assert passes_over_input(two.body) == 3  # mean, deviations, normalize
    assert passes_over_input(one.body) == 2  # blocked statistics, normalize
    model = ScheduleModel(low, get_target("cpu"))
    assert model.features(0, {"welford": block}).dram_bytes < model.features(
        0, {"welford": 0}).dram_bytes


def test_the_block_loop_is_split_over_the_threads_with_no_merge() -> None:
    term, axes = column_norm(1 << 14, 64)
    low = lower(term, axes)
    block = low.kernels[0].knob_space()["welford"][0]
    splits = parallel_sums(low.kernels[0].nest({"welford": block}).body)
    assert [c.kind for cs in splits.values() for c in cs] == ["slot", "slot"]
    env = inputs(term, 3)
    out, source = run(low, {"welford": block}, env)
    again, _ = run(low, {"welford": block}, env)
    assert "omp_get_thread_num" in source and np.array_equal(out, again)


def test_slot_writes_must_be_disjoint_and_unread() -> None:
    b, j = Affine.var("b"), Affine.var("j")
    decls = {"s": Array("s", 64, 0.0, fill=False)}

    def loop(index: Affine, value: Call | None = None) -> Loop:
        expr: Call | Load = value if value is not None else Load("x", b.scale(8) + j)
        return Loop("b", 8, (Loop("j", 8, (Assign(Ref("s", index), expr),), "vector"),),
                    "reduce")

    assert [c.kind for c in slot_states(loop(b.scale(8) + j), decls) or ()] == ["slot"]
    assert slot_states(loop(b.scale(4) + j), decls) is None  # iterations overlap
    assert slot_states(loop(b.scale(8) + j, Call("add", (Ref("s", j), Lit(1.0)))),
                       decls) is None  # reads another iteration's slot
    assert slot_states(loop(b.scale(8) + j + Affine((), 1)), decls) is None  # offset
    assert slot_states(loop(b.scale(16) + j), decls) is None  # past the array


def test_the_knob_is_offered_only_for_long_squared_deviations(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reduce_sched, "WELFORD_OFFER_BYTES", 256 << 10)
    monkeypatch.setattr(reduce_sched, "WELFORD_MIN_BYTES", 1 << 20)
    space = lower(*column_norm(1 << 14, 64)).kernels[0].knob_space()  # 4 MiB per sweep
    assert space["welford"][0] > 0  # on by default: it shares the mean's pass
    assert "welford" not in lower(*row_norm(1024, 64)).kernels[0].knob_space()  # 4 KiB rows
    x = In("x", (("n", 1 << 16), ("c", 16)))
    assert "welford" not in lower(Sum("n", mul(x, x)), ("c",)).kernels[0].knob_space()
    prime = lower(*row_variance(65537, 4)).kernels[0].knob_space()  # no block divides
    assert "welford" not in prime
    y = In("x", (("c", 4), ("h", 256), ("w", 256)))  # over two axes: the inner sum is
    mean = div(Sum("h", Sum("w", y)), Const(65536.0))  # inside the outer one's operand
    two_axes = Sum("h", Sum("w", mul(sub(y, mean), sub(y, mean))))
    assert "welford" not in lower(two_axes, ("c",)).kernels[0].knob_space()
    around = lower(*around_max(1 << 16, 16)).kernels[0].knob_space()["welford"]
    assert around[0] == 0  # no sum to share: the two-pass form stays the default


def test_a_large_offset_loses_no_accuracy() -> None:
    term, axes = row_variance(1 << 14, 4)
    low = lower(term, axes)
    block = low.kernels[0].knob_space()["welford"][0]
    env = inputs(term, 11, offset=3000.0)
    ref = reference(term, env, axes)
    one, _ = run(low, {"welford": block}, env)
    two, _ = run(low, {"welford": 0}, env)
    err = float(np.max(np.abs(one - ref) / ref))
    assert err <= max(2.0 * float(np.max(np.abs(two - ref) / ref)), 1e-5)


def test_a_ragged_channel_tile_runs_the_one_pass_form_in_each_part() -> None:
    """100 channels: a whole tile of 64 and a rest of 36, each with its own blocked pass."""
    term, axes = column_norm(2048, 100)
    low = lower(term, axes)
    kernel = low.kernels[0]
    block = kernel.knob_space()["welford"][0]
    nest = kernel.nest({"welford": block})
    assert sum(1 for s in nest.body if isinstance(s, Loop) and s.axis == "n"
               and any("n/i" in line for line in stmt_lines(s, 0))) == 2
    env = inputs(term, 5)
    out, _ = run(low, {"welford": block}, env)
    ref = reference(term, env, axes)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-6 * (1 + float(np.max(ref))))


@pytest.mark.parametrize("name", ["column norm", "row variance"])
def test_the_cuda_rendering_of_the_one_pass_form_equals_the_reference(name: str) -> None:
    """The CUDA renderer maps the blocked nest like any other (emulated in float64 on
    the CPU, every row mode)."""
    from kernelsat.codegen.cuda import ROW_MODES, emulate
    from kernelsat.testing import random_inputs, relative_error

    term, axes = KERNELS[name](256, 5)
    low = lower(term, axes)
    space = low.kernels[0].knob_space()
    assert space["welford"][0] > 0
    env = random_inputs(term, seed=2)
    ref = evaluate_as(term, env, axes)
    for mode in ROW_MODES:
        knobs = {"welford": space["welford"][0], "cuda.rows": mode, "tpb": 64}
        out = emulate(low, low.nests([knobs]), env)
        assert relative_error(out, ref) < 1e-12, mode
