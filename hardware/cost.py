"""The analytic roofline cost model.

One kernel takes `max(compute time, memory time) + launch overhead`, where

- compute time = (flops + transcendentals x target.transcendental_penalty) / peak FP32,
- memory time  = (bytes read + bytes written) / memory bandwidth,

and a program takes the sum over its kernels (kernels run one after another).

`estimate` reads the statistics codegen reports per kernel (`flops`, `bytes_read`,
`bytes_written`, `transcendentals`); `estimate_term` needs no codegen: it cuts the
term at `Store`s into kernels and counts each node's work over its iteration space
(`kernelsat.work.op_work`, the one counting codegen and extraction use too) with each
kernel's distinct inputs and stored buffers read once and its output written once.
It is memoized per kernel by term key and target fingerprint, so calling it on
every e-node during extraction costs one walk of each new kernel body.

>>> from kernelsat.ir import In, Store, exp
>>> from kernelsat.hardware.targets import get_target
>>> x = In("x", (("i", 1024),))
>>> s = stats_of_term(exp(x))
>>> (s[0].flops, s[0].bytes_read, s[0].bytes_written, s[0].transcendentals)
(8192.0, 4096.0, 4096.0, 1024.0)
>>> estimate_term(Store(exp(x)), get_target("h100")) > 0
True
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kernelsat.hardware.targets import Target
from kernelsat.ir import Term, input_dims
from kernelsat.ops import Op
from kernelsat.work import ITEMSIZE, KernelStats, op_work, term_points


def as_stats(obj: Any) -> KernelStats:
    """Codegen's per-kernel stats (an object with the four attributes, or a mapping)."""
    if isinstance(obj, KernelStats):
        return obj

    def get(name: str) -> float:
        value = obj.get(name, 0.0) if isinstance(obj, Mapping) else getattr(obj, name, 0.0)
        return float(value or 0.0)

    return KernelStats(get("flops"), get("bytes_read"), get("bytes_written"),
                       get("transcendentals"))


def kernel_time(stats: KernelStats, target: Target, *, peak: float | None = None) -> float:
    """Roofline seconds of one kernel on `target` (FP32 peak unless `peak` is given)."""
    compute = (stats.flops + stats.transcendentals * target.transcendental_penalty) / (
        peak or target.peak_fp32)
    memory = stats.bytes / target.mem_bandwidth
    return max(compute, memory) + target.launch_overhead


def _kernel_stats_list(lowered_or_stats: Any) -> list[KernelStats]:
    kernels = getattr(lowered_or_stats, "kernels", None)
    if kernels is not None:
        return [as_stats(k.stats) for k in kernels]
    if isinstance(lowered_or_stats, KernelStats | Mapping) or hasattr(lowered_or_stats, "flops"):
        return [as_stats(lowered_or_stats)]
    return [as_stats(s) for s in lowered_or_stats]


def estimate(lowered_or_stats: Any, target: Target) -> float:
    """Roofline seconds of a lowered program (anything with `.kernels`, each with
    `.stats`), of one kernel's stats, or of a sequence of stats."""
    return sum(kernel_time(s, target) for s in _kernel_stats_list(lowered_or_stats))


def roofline_fraction(measured_seconds: float, lowered_or_stats: Any, target: Target) -> float:
    """How close a measured time is to the roofline (1.0 = at the roofline)."""
    if not measured_seconds > 0:
        return math.nan
    return estimate(lowered_or_stats, target) / measured_seconds


# -- the IR-only estimate -------------------------------------------------------------


def _input_bytes(node: Term, itemsize: int) -> int:
    return math.prod(input_dims(node)) * itemsize


def _kernel_body(root: Term) -> Iterable[Term]:
    """The nodes computed by the kernel whose output is `root`: below it down to
    (and including) the `In` leaves and the `Store`s of other kernels."""
    seen: set[int] = set()
    stack = list(root.args) if root.op is Op.STORE else [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        if node.op is not Op.STORE:
            stack.extend(node.args)


def kernel_stats_of(root: Term, dtype: str = "float32") -> KernelStats:
    """Stats of the one kernel that computes `root` (a `Store` or the program's output)."""
    itemsize = ITEMSIZE[dtype]
    flops = trans = 0.0
    read = 0
    inputs_seen: set[str] = set()
    for node in _kernel_body(root):
        if node.op is Op.STORE:  # another kernel's buffer, read once
            read += node.size() * itemsize
            continue
        if node.op is Op.IN:
            name = str(node.attrs[0])
            if name not in inputs_seen:
                inputs_seen.add(name)
                read += _input_bytes(node, itemsize)
            continue
        node_flops, node_trans = op_work(node.op, term_points(node))
        flops += node_flops
        trans += node_trans
    return KernelStats(flops, float(read), float(root.size() * itemsize), trans)


def kernel_roots(term: Term) -> list[Term]:
    """The roots of the kernels of a program: the output and every `Store` below it."""
    roots = [term]
    seen = {id(term)}
    stack = [term]
    while stack:
        node = stack.pop()
        for child in node.args:
            if id(child) in seen:
                continue
            seen.add(id(child))
            if child.op is Op.STORE:
                roots.append(child)
            stack.append(child)
    return roots


_KERNEL_MEMO: dict[tuple[str, str], KernelStats] = {}
_TIME_MEMO: dict[tuple[str, Target, str], float] = {}
MEMO_LIMIT = 200_000


def _memo_put(memo: dict[Any, Any], key: Any, value: Any) -> None:
    if len(memo) >= MEMO_LIMIT:
        memo.clear()
    memo[key] = value


def stats_of_term(term: Term, dtype: str = "float32") -> list[KernelStats]:
    """Per-kernel stats of a term, output kernel first (memoized per kernel root)."""
    out = []
    for root in kernel_roots(term):
        key = (root.key, dtype)
        stats = _KERNEL_MEMO.get(key)
        if stats is None:
            stats = kernel_stats_of(root, dtype)
            _memo_put(_KERNEL_MEMO, key, stats)
        out.append(stats)
    return out


def estimate_term(term: Term, target: Target, dtype: str = "float32") -> float:
    """Roofline seconds of a term on `target`, without codegen (memoized by term key)."""
    key = (term.key, target, dtype)
    hit = _TIME_MEMO.get(key)
    if hit is None:
        hit = estimate(stats_of_term(term, dtype), target)
        _memo_put(_TIME_MEMO, key, hit)
    return hit


def rank_correlation(estimates: Sequence[float], measured: Sequence[float]) -> float:
    """Spearman's rank correlation between estimated and measured times (NaN when fewer
    than two finite pairs or either side is constant).

    >>> round(rank_correlation([1, 2, 3, 4], [10, 20, 30, 25]), 6)
    0.8
    """
    from scipy.stats import spearmanr  # slow to import (~0.8 s); only rank_correlation needs it

    pairs = [(e, m) for e, m in zip(estimates, measured, strict=True)
             if math.isfinite(e) and math.isfinite(m)]
    if len(pairs) < 2 or len({e for e, _ in pairs}) < 2 or len({m for _, m in pairs}) < 2:
        return math.nan
    rho = spearmanr([e for e, _ in pairs], [m for _, m in pairs]).statistic
    return float(rho)
