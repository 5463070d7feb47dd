"""The roofline cost model: counts, monotonicity in sizes, kernels cut at Stores."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.hardware.cost import (
    KernelStats,
    estimate,
    estimate_term,
    kernel_roots,
    rank_correlation,
    stats_of_term,
)
from kernelsat.hardware.targets import get_target
from kernelsat.ir import Const, In, Max, Store, Sum, Term, div, exp, mul, sub

TARGETS = [get_target(n) for n in ("cpu", "h100", "mi300x")]


def softmax(rows: int, cols: int, fused: bool) -> Term:
    x = In("x", (("i", rows), ("n", cols)))
    m = Max("n", x)
    e = exp(sub(x, m if fused else Store(m)))
    return div(e, Sum("n", e) if fused else Store(Sum("n", Store(e))))


def matmul(m: int, k: int, n: int) -> Term:
    a = In("a", (("i", m), ("k", k)))
    b = In("b", (("k", k), ("j", n)))
    return Sum("k", mul(a, b))


def test_counts_of_a_reduction() -> None:
    [s] = stats_of_term(matmul(4, 8, 2))
    assert s.flops == 4 * 8 * 2 * 2  # one mul, one add per (i, k, j)
    assert s.bytes_read == (4 * 8 + 8 * 2) * 4 and s.bytes_written == 4 * 2 * 4


def test_inputs_read_once_per_kernel() -> None:
    x = In("x", (("i", 64),))
    [s] = stats_of_term(mul(x, exp(x)))
    assert s.bytes_read == 64 * 4


def test_cut_at_stores() -> None:
    t = softmax(8, 16, fused=False)
    assert len(kernel_roots(t)) == 4
    assert len(kernel_roots(softmax(8, 16, fused=True))) == 1
    eager = sum(s.bytes for s in stats_of_term(t))
    fused = sum(s.bytes for s in stats_of_term(softmax(8, 16, fused=True)))
    assert fused < eager


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 64), st.integers(1, 64), st.integers(1, 8), st.booleans())
def test_monotone_in_sizes(rows: int, cols: int, grow: int, fused: bool) -> None:
    for target in TARGETS:
        small = estimate_term(softmax(rows, cols, fused), target)
        assert small <= estimate_term(softmax(rows * grow, cols, fused), target)
        assert small <= estimate_term(softmax(rows, cols * grow, fused), target)
    assert estimate_term(matmul(rows, cols, 4), TARGETS[1]) <= estimate_term(
        matmul(rows, cols * grow, 4), TARGETS[1])


def test_roofline_regimes() -> None:
    h100 = get_target("h100")
    memory_bound = KernelStats(flops=1e6, bytes_read=1e9, bytes_written=0)
    compute_bound = KernelStats(flops=1e13, bytes_read=1e6, bytes_written=0)
    assert math.isclose(estimate(memory_bound, h100), 1e9 / h100.mem_bandwidth
                        + h100.launch_overhead)
    assert math.isclose(estimate(compute_bound, h100), 1e13 / h100.peak_fp32
                        + h100.launch_overhead)
    assert estimate([memory_bound, compute_bound], h100) == estimate(memory_bound, h100) + estimate(
        compute_bound, h100)


def test_transcendentals_weighted() -> None:
    cpu = get_target("cpu")
    plain = KernelStats(1e9, 0, 0)
    assert estimate(KernelStats(1e9, 0, 0, transcendentals=1e8), cpu) > estimate(plain, cpu)


def test_estimate_reads_codegen_like_objects() -> None:
    class K:
        def __init__(self, stats: dict[str, float]) -> None:
            self.stats = stats

    class Lowered:
        kernels = (K({"flops": 1e6, "bytes_read": 1e6, "bytes_written": 1e6}),) * 2

    h100 = get_target("h100")
    assert estimate(Lowered(), h100) == 2 * estimate(KernelStats(1e6, 1e6, 1e6), h100)


def test_memoized_and_constant_free() -> None:
    t = div(softmax(8, 16, True), Const(2.0))
    h100 = get_target("h100")
    assert estimate_term(t, h100) == estimate_term(t, h100)


def test_rank_correlation() -> None:
    assert rank_correlation([1, 2, 3], [10, 20, 30]) == 1.0
    assert rank_correlation([1, 2, 3], [30, 20, 10]) == -1.0
    assert math.isnan(rank_correlation([1], [2]))
    # failed measurements (NaN) are dropped pairwise
    assert rank_correlation([1, 2, 3, 4], [1, 2, float("nan"), 3]) == 1.0
    assert math.isnan(rank_correlation([1, 1, 1], [1, 2, 3]))
