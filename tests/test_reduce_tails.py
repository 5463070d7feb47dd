"""Reductions at sizes that are not multiples of the lane count: the lane split keeps its
vector lanes for the whole groups and runs the rest in a tail loop (no scalar fallback),
for every reduction kind (sum, max, min, online log-sum-exp, softmax, the staged softmax
average) and both layouts (the reduced axis contiguous or strided). The C output equals
the float64 interpreter at every size, N < lanes and N = 1 included."""

from __future__ import annotations

import shutil
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelsat.codegen import build, lower
from kernelsat.codegen.cuda_cpu import run_on_cpu
from kernelsat.codegen.loops import Loop, Stmt
from kernelsat.interp import evaluate_as
from kernelsat.ir import (
    LSE,
    In,
    Max,
    SoftmaxAvg,
    Sum,
    Term,
    div,
    exp,
    input_dims,
    mul,
    neg,
    sqrt,
    sub,
)

KINDS: dict[str, Callable[[Term], Term]] = {
    "sum": lambda x: Sum("n", x),
    "max": lambda x: Max("n", x),
    "min": lambda x: neg(Max("n", neg(x))),
    "lse": lambda x: LSE("n", x),
    "softmax": lambda x: div(exp(sub(x, Max("n", x))), Sum("n", exp(sub(x, Max("n", x))))),
    "l2norm": lambda x: div(x, sqrt(Sum("n", mul(x, x)))),
}
"""Row reductions over axis n of x[i, n] (or x[n, i]), by kind."""


def term_of(kind: str, rows: int, n: int, strided: bool) -> tuple[Term, tuple[str, ...]]:
    dims = (("n", n), ("i", rows)) if strided else (("i", rows), ("n", n))
    t = KINDS[kind](In("x", dims))
    return t, tuple(a for a in ("i", "n") if a in t.shape)


def attention_term(rows: int, n: int, d: int) -> tuple[Term, tuple[str, ...]]:
    """softmax(q k^T) v for one head: a SoftmaxAvg over the key axis n."""
    q, k = In("q", (("i", rows), ("d", d))), In("k", (("n", n), ("d", d)))
    v = In("v", (("n", n), ("e", d)))
    return SoftmaxAvg("n", Sum("d", mul(q, k)), v), ("i", "e")


def check(term: Term, axes: tuple[str, ...], knobs: dict[str, object] | None,
          seed: int) -> None:
    lowered = lower(term, axes)
    rng = np.random.default_rng(seed)
    env: dict[str, np.ndarray] = {}
    stack = [term]
    while stack:
        t = stack.pop()
        if t.op.name == "IN":
            env[str(t.attrs[0])] = rng.standard_normal(input_dims(t)).astype(np.float32) * 3
        stack.extend(t.args)
    out = np.full(lowered.buffers["out"].shape, np.nan, np.float32)
    build(lowered, "c", [knobs] * len(lowered.kernels))(env, out)
    ref = np.asarray(evaluate_as(term, {k: v.astype(np.float64) for k, v in env.items()},
                                 axes), np.float64)
    scale = 1.0 + float(np.max(np.abs(ref)))
    np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-5 * scale)


def loops(stmts: tuple[Stmt, ...]) -> list[Loop]:
    out: list[Loop] = []
    for s in stmts:
        if isinstance(s, Loop):
            out.append(s)
            out += loops(s.body)
    return out


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("n", [1, 7, 16, 17, 33, 1000])
def test_row_reductions_match_reference(kind: str, n: int) -> None:
    term, axes = term_of(kind, 3, n, strided=False)
    check(term, axes, None, n)


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(sorted(KINDS)), rows=st.sampled_from([1, 2, 5]),
       n=st.integers(1, 90), strided=st.booleans(), pick=st.integers(0, 1000),
       seed=st.integers(0, 99))
def test_random_sizes_and_knobs_match_reference(kind: str, rows: int, n: int, strided: bool,
                                                pick: int, seed: int) -> None:
    term, axes = term_of(kind, rows, n, strided)
    space = lower(term, axes).kernels[0].knob_space()
    knobs = {k: v[pick % len(v)] for k, v in space.items()
             if k in ("vec", "keep") or k.startswith("tile.")}
    check(term, axes, knobs, seed)


@pytest.mark.parametrize("kind", ["sum", "max", "lse", "softmax"])
@pytest.mark.parametrize("n", [1000, 4091, 23])
def test_irregular_rows_keep_their_lanes(kind: str, n: int) -> None:
    """At n = 1000 (not a multiple of 16), every reduction over n still runs 16 lanes over
    n // 16 groups, plus a tail of n % 16 lanes: never one scalar loop over all of n."""
    term, axes = term_of(kind, 2, n, strided=False)
    nest = lower(term, axes).kernels[0].nest({"vec": 16})
    reduce_loops = [lp for lp in loops(nest.body) if lp.kind == "reduce"]
    assert reduce_loops and all(lp.extent == n // 16 for lp in reduce_loops)
    tails = [lp for lp in loops(nest.body) if lp.extent == n % 16 and lp.kind in ("vector", "simd")]
    assert len(tails) == len(reduce_loops)


@pytest.mark.parametrize("n", [1, 5, 16, 31, 100, 1001])
@pytest.mark.parametrize("stage", [True, False])
def test_softmax_average_at_any_key_count(n: int, stage: bool) -> None:
    term, axes = attention_term(3, n, 8)
    check(term, axes, {"stage": stage, "flash": False}, n)
    check(term, axes, None, n)  # the default: the fused attention schedule


def test_staged_passes_keep_lanes_at_odd_key_counts() -> None:
    term, axes = attention_term(4, 1001, 8)
    nest = lower(term, axes).kernels[0].nest({"stage": True, "flash": False})
    extents = {lp.extent for lp in loops(nest.body) if lp.kind == "reduce"}
    assert 1001 // 16 in extents  # the staged max / exp-sum passes: 16 lanes + a tail of 9
    assert any(lp.extent == 1001 % 16 for lp in loops(nest.body) if lp.kind == "vector")


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("channels", [63, 65, 100, 1001])
def test_strided_reductions_tile_every_channel_count(kind: str, channels: int) -> None:
    """Per-channel reductions (the reduced axis strided, the channels contiguous) at
    channel counts with no divisor >= 16: the channels are still tiled (whole tiles,
    then a shorter last tile), never one strided scalar loop per channel."""
    term, axes = term_of(kind, channels, 7, strided=True)
    nest = lower(term, axes).kernels[0].nest()
    tiles = [lp for lp in loops(nest.body) if lp.kind in ("vector", "tile")]
    assert max(lp.extent for lp in tiles) == min(channels, 64)
    if channels > 64 and channels % 64 > 1:  # whole tiles of 64, then a shorter one
        assert any(lp.extent == channels % 64 for lp in tiles)
    check(term, axes, None, channels)
    check(term, axes, {"vec": 4}, channels + 1)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("channels", [70, 1001])
def test_strided_tiles_on_cuda_match_reference(channels: int) -> None:
    """The CUDA program of a ragged-tiled nest (several nests, one per part), run on the
    CPU through codegen/cuda_cpu.py, equals float64 under each row mapping."""
    term, axes = term_of("softmax", channels, 9, strided=True)
    lowered = lower(term, axes)
    rng = np.random.default_rng(channels)
    x = rng.standard_normal((9, channels)).astype(np.float32)
    ref = np.asarray(evaluate_as(term, {"x": x.astype(np.float64)}, axes))
    for rows in ("thread", "warp", "block"):
        nests = lowered.nests([{"cuda.rows": rows, "tpb": 64}])
        out = run_on_cpu(lowered, nests, {"x": x})
        np.testing.assert_allclose(out, ref, rtol=2e-4, atol=2e-5, err_msg=rows)
