"""Reductions outside the kernel's OpenMP loop split over the threads (knob `psum`,
codegen/combine.py): per-channel statistics over a long outer axis (batch norm), a column
sum, a column dot, a column max, a one-pass column log-sum-exp (arrays of running
maxima and rescaled sums). Each equals the float64 interpreter with the split on and off, at
channel counts that the transposed tile divides and that it does not (a whole tile and a
rest), the split runs bit-for-bit the same twice, and the knob is offered only where
such a loop exists."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from kernelsat.codegen import build, lower
from kernelsat.codegen.combine import PSUM_MIN_POINTS, parallel_sums
from kernelsat.codegen.loops import Array, Loop
from kernelsat.codegen.lower import LoweredProgram
from kernelsat.hardware.schedule_model import ScheduleModel
from kernelsat.hardware.targets import get_target
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
    input_dims,
    mul,
    sqrt,
    sub,
)

SAMPLES = 4096


def column(c: int) -> Term:
    return In("x", (("n", SAMPLES), ("c", c)))


def batchnorm(c: int) -> Term:
    x = column(c)
    centred = sub(x, div(Sum("n", x), Const(float(SAMPLES))))
    var = div(Sum("n", mul(centred, centred)), Const(float(SAMPLES)))
    return div(centred, sqrt(add(var, Const(1e-5))))


TERMS: dict[str, Callable[[int], Term]] = {
    "batchnorm": batchnorm,
    "column sum": lambda c: Sum("n", column(c)),
    "column dot": lambda c: Sum("n", mul(column(c), In("w", (("n", SAMPLES), ("c", c))))),
    "column max": lambda c: Max("n", column(c)),
    "minus the column max": lambda c: sub(column(c), Max("n", column(c))),
    # an online pair: the running max of the scores and the rescaled sum and output row
    "softmax average over samples": lambda c: SoftmaxAvg("n", In("s", (("n", SAMPLES),)),
                                                         column(c)),
    # one-pass column log-sum-exp: an array of running maxima (one per column of the
    # vector tile) rescaling an array of sums element by element
    "column logsumexp": lambda c: LSE("n", column(c)),
    "minus the column logsumexp": lambda c: sub(column(c), LSE("n", column(c))),
}


def lowered_of(term: Term) -> LoweredProgram:
    return lower(term, tuple(a for a in ("n", "c") if a in term.shape))


def inputs(term: Term, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    env: dict[str, np.ndarray] = {}
    stack = [term]
    while stack:
        t = stack.pop()
        if t.op.name == "IN" and str(t.attrs[0]) not in env:
            shape = input_dims(t)
            sign = rng.choice([-1.0, 1.0], shape)
            env[str(t.attrs[0])] = (sign * rng.uniform(0.5, 1.5, shape) + 3.0).astype(
                np.float32)
        stack.extend(t.args)
    return env


def run(term: Term, psum: bool, env: dict[str, np.ndarray]) -> tuple[np.ndarray, str]:
    low = lowered_of(term)
    exe = build(low, "c", [{"psum": psum}] * len(low.kernels))
    out = np.full(low.buffers["out"].shape, np.nan, np.float32)
    exe(env, out)
    return out, exe.source  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", sorted(TERMS))
@pytest.mark.parametrize("channels", [64, 61, 100])
def test_split_reductions_equal_the_reference(name: str, channels: int) -> None:
    term = TERMS[name](channels)
    env = inputs(term, channels)
    axes = tuple(a for a in ("n", "c") if a in term.shape)
    ref = np.asarray(evaluate_as(term, {k: v.astype(np.float64) for k, v in env.items()},
                                 axes))
    split, source = run(term, True, env)
    whole, plain = run(term, False, env)
    assert "omp_get_thread_num" in source and "omp_get_thread_num" not in plain
    scale = 1.0 + float(np.max(np.abs(ref)))
    for out in (split, whole):
        np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5 * scale)
    again, _ = run(term, True, env)
    assert np.array_equal(split, again)  # partials added in thread order: reproducible


def test_the_split_loop_still_checks_the_cancel_flag() -> None:
    _, source = run(batchnorm(64), True, inputs(batchnorm(64), 0))
    head = source.index("#pragma omp for schedule(static)")
    assert "if (ks_cancel) continue;" in source[head:head + 200]


def test_psum_is_offered_only_where_a_reduction_runs_outside_the_parallel_loop() -> None:
    assert "psum" in lowered_of(batchnorm(64)).kernels[0].knob_space()
    rows = Sum("c", In("x", (("n", SAMPLES), ("c", 64))))  # one row per output element
    assert "psum" not in lower(rows, ("n",)).kernels[0].knob_space()
    assert "psum" in lowered_of(Max("n", column(64))).kernels[0].knob_space()  # a maximum
    online = LSE("n", column(64))  # one running max per column (an array of maxima)
    assert "psum" in lowered_of(online).kernels[0].knob_space()
    short = Sum("n", In("x", (("n", 16), ("c", 64))))  # too little work for a region
    assert PSUM_MIN_POINTS > 16 * 64
    assert "psum" not in lowered_of(short).kernels[0].knob_space()


def test_split_loops_are_the_top_level_sum_loops_of_the_nest() -> None:
    kernel = lowered_of(batchnorm(64)).kernels[0]
    split = parallel_sums(kernel.nest({"welford": 0}).body)  # the two-pass statistics
    assert len(split) == 2  # the mean's and the variance's passes
    assert all(c.kind == "sum" and c.size == 64 for cs in split.values() for c in cs)
    block = kernel.knob_space()["welford"][0]  # one pass: its block loop writes slots
    (one,) = parallel_sums(kernel.nest({"welford": block}).body).values()
    assert [c.kind for c in one] == ["slot", "slot"]


def test_the_schedule_model_prices_an_unsplit_pass_on_one_thread() -> None:
    many = replace(get_target("cpu"), units=16)
    model = ScheduleModel(lowered_of(batchnorm(64)), many)
    on, off = (model.features(0, {"psum": p, "welford": 0}) for p in (True, False))
    assert on.parallel_share == pytest.approx(1.0, abs=1e-3)
    assert 0.3 < off.parallel_share < 0.5  # two of the three passes on one thread
    assert model.kernel_seconds(0, {"psum": False, "welford": 0}) > 1.5 * model.kernel_seconds(
        0, {"psum": True, "welford": 0})
    assert model.identity(0, {"psum": True}) != model.identity(0, {"psum": False})


def _column_online(sum_size: int) -> tuple[Loop, dict]:
    """A one-pass column log-sum-exp's loop, as the lowering writes it: 64 running
    maxima m[c] and sums s (an array of `sum_size`, or a scalar at 0) updated together."""
    from kernelsat.codegen.loops import Affine, Array, Assign, Call, Let, Lit, Load, Loop, Ref

    n, c = Affine.var("n"), Affine.var("c")
    top = Ref("m", c)
    acc = Ref("s", c) if sum_size else Ref("s")
    body = (Let("t1", Load("x", n.scale(64) + c)),
            Let("t3", Call("sub", (Ref("t1"), top))),
            Let("t4", Call("exp", (Call("neg", (Call("abs", (Ref("t3"),)),)),))),
            Assign(acc, Call("select_gt", (Ref("t3"), Lit(0.0),
                                           Call("add", (Call("mul", (acc, Ref("t4"))),
                                                        Lit(1.0))),
                                           Call("add", (acc, Ref("t4")))))),
            Assign(top, Call("select_gt", (Ref("t3"), Lit(0.0), Ref("t1"), top))))
    loop = Loop("n", SAMPLES, (Loop("c", 64, body, "vector"),), "reduce")
    decls = {"m": Array("m", 64, -np.inf),
             "s": Array("s", sum_size, 0.0) if sum_size else Let("s", Lit(0.0), mutable=True)}
    return loop, decls


def test_an_array_of_online_maxima_rescales_an_array_of_its_length() -> None:
    from kernelsat.codegen.combine import Combine, infer_combines
    from kernelsat.codegen.cuda_emulate import combine_ok, initial_state

    loop, decls = _column_online(64)
    found = infer_combines(loop, decls)
    assert found is not None
    assert set(found) == {Combine("m", "online", 64), Combine("s", "scaled", 64, "m")}
    assert combine_ok(loop, initial_state(decls, ["m", "s"]), found)
    # a scalar rescaled by an array of maxima has no element-wise merge: refused
    scalar, decls = _column_online(0)
    assert infer_combines(scalar, decls) is None
    # sums of another length than the maxima: refused
    loop, decls = _column_online(64)
    assert infer_combines(loop, {**decls, "s": Array("s", 32, 0.0)}) is None


def test_a_split_column_logsumexp_merges_each_column_by_its_own_max() -> None:
    term = LSE("n", column(61))
    _, source = run(term, True, inputs(term, 0))
    merge = source[source.index("for (int ks_t = 0; ks_t < ks_nt; ks_t++)"):]
    assert "ks_top" in merge and "[k_] * ks_ca" in merge  # element by element
