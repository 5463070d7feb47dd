"""Materialization as a searched choice: which values of an extracted program are stored.

A `Store` is a kernel boundary: the value is computed once by its own kernel, written,
and read back by its consumers; unstored, it is fused into each consumer and computed
wherever the consumer's loop nest needs it (a per-row statistic inside a loop over the
row's elements is hoisted by codegen, but a value consumed inside a loop over an axis it
does not have, such as `H[t, f]` in `sum(f: H[t, f] * W[f, e])`, is recomputed for every
`e`). Which is faster depends on sizes and the target, so every extraction's stores are
chosen by a whole-program cost (the roofline estimate of the lowered program, which counts
both the traffic of a stored buffer and the recomputation of a fused value).

Legal store points (`store_points`) are found from the program's structure, not from
names: a computed value (not an input, constant, index operation or `Store`) that holds
work worth keeping (a reduction or a transcendental below it in its kernel) and is
*reused*: read by more than one consumer, or by a consumer that iterates over an axis
the value lacks (a broadcast, so fusing it evaluates it once per point of that axis).
In a snapshot a point is legal only when its e-class holds `Store(itself)` (the
materialization rules proved the store optional), so every variant has a proof.

`materializations` proposes, per extracted program: the store set that is cheapest under
the cost (a hill climb over the points from no stores, all stores, the spec's own stores
and partial fusion), the partial-fusion set (`partial_fusion`: the statistics, values that
reduce an axis a consumer iterates over again, in kernels of their own, the rest fused
into the output or into the GEMM that reads the normalized value), the spec's own kernel
boundaries, a random subset when asked (the sampler's draw) and the unstored program;
none of them estimated beyond `RECOMPUTE_LIMIT` times the reference (the eager spec)
unless it is the cheapest materialization there is.

>>> from kernelsat.ir import In, Sum, sub, Const, mul
>>> x = In("X", (("i", 4), ("n", 8)))
>>> mean = mul(Sum("n", x), Const(0.125))
>>> y = sub(x, mean)  # mean[i] is read at every (i, n): a broadcast store point
>>> [str(p) for p in store_points(y)]
['(mul (Sum n (In X i:4 n:8)) (Const 0.125))']
>>> kernels = [t for t in partial_fusion(y, store_points(y))]
>>> str(with_stores(y, kernels))
'(sub (In X i:4 n:8) (Store (mul (Sum n (In X i:4 n:8)) (Const 0.125))))'
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract.base import check_extraction
from kernelsat.ir import Term, inputs, postorder
from kernelsat.ops import LEAVES, REDUCTIONS, SHAPE_ONLY, TRANSCENDENTAL, Op
from kernelsat.work import iteration_space

RECOMPUTE_LIMIT = 100.0
"""An unstored program estimated beyond this many times the reference (the eager spec)
is not proposed when one of its stored variants is cheaper."""

MAX_POINTS = 12
"""At most this many store points per program enter the search (the most reused first)."""

INDEX_OPS: frozenset[Op] = frozenset({Op.SPLIT, Op.READ, Op.GATHER, Op.STORE})
"""Ops that compute nothing of their own (index arithmetic, a load by labels, or a buffer
already stored): never a store point."""

TermCost = Callable[[Term], float]


@dataclass(frozen=True, slots=True)
class Materialized:
    """One materialization of a program: the term with its `Store`s, the points stored,
    how it was chosen (`chosen`, `partial`, `spec`, `sampled`, `none`) and its cost."""

    term: Term
    stored: frozenset[Term]
    how: str
    cost: float


def _consumers(root: Term) -> dict[Term, list[Term]]:
    """Each node's distinct parents in the DAG of `root` (hash-consed: one node per value)."""
    parents: dict[Term, list[Term]] = {}
    for node in postorder(root):
        for child in dict.fromkeys(node.args):
            parents.setdefault(child, []).append(node)
    return parents


def _space(node: Term) -> int:
    """Points `node` visits (its axes joined with its operands'; a reduction's too)."""
    return iteration_space(node.op, node.shape, (a.shape for a in node.args))


def _holds_work(node: Term) -> bool:
    """Whether `node`'s kernel-local subterm has a reduction or a transcendental."""
    return any(t.op in REDUCTIONS or t.op in TRANSCENDENTAL for t in _kernel_nodes(node))


def broadcast_into(node: Term, parents: Sequence[Term]) -> bool:
    """Whether a consumer of `node` visits more points than `node` has (it iterates over
    an axis `node` lacks, so a fused `node` is evaluated per point of that axis)."""
    size = math.prod(node.shape.values())
    return any(p.op is not Op.STORE and _space(p) > size for p in parents)


def store_points(root: Term, storable: Callable[[Term], bool] | None = None) -> list[Term]:
    """The legal store points of `root` (see the module notes), most reused first:
    computed, holding work, reading an input (a value of constants and indices alone,
    `sqrt(64)` or a mask, costs no traffic to recompute, and stored it is one more
    kernel), reused (two or more consumers, or broadcast into one), not already stored,
    not the root; and `storable` (default: any such node)."""
    parents = _consumers(root)
    found: list[tuple[int, Term]] = []
    for node in postorder(root):
        if node is root or node.op in LEAVES or node.op in INDEX_OPS or node.op in SHAPE_ONLY:
            continue
        users = parents.get(node, [])
        if any(p.op is Op.STORE for p in users):
            continue
        shared = sum(1 for p in users if p.op not in INDEX_OPS)
        if not (shared > 1 or broadcast_into(node, users)) or not _holds_work(node):
            continue
        if not inputs(node):  # made of constants and indices only: recomputed for free
            continue
        if storable is not None and not storable(node):
            continue
        reuse = sum(_space(p) for p in users) // max(1, math.prod(node.shape.values()))
        found.append((reuse, node))
    found.sort(key=lambda rn: -rn[0])
    return [n for _, n in found]


def partial_fusion(root: Term, points: Iterable[Term]) -> list[Term]:
    """The *statistics* among the points: values that reduce an axis which a consumer
    then iterates over again (a row's mean, variance or max read at every element of the
    row). Stored, they become kernels of their own and everything elementwise after them
    fuses into the consumer: the normalization into the output, or into the GEMM that
    reads the normalized value (a contraction operand such as swiglu's `H[t, f]` is
    broadcast over another axis, not over one it reduced, so it is no statistic)."""
    parents = _consumers(root)
    return [p for p in points if _restat(p, parents.get(p, []))]


def _base(axis: str) -> str:
    return axis.split("/", 1)[0]  # a split axis (`n/o64`) is its axis (`n`)


def _restat(node: Term, consumers: Sequence[Term]) -> bool:
    """Whether a consumer iterates over an axis that `node` reduced (its own Split
    halves count as the axis)."""
    reduced = {_base(t.axis) for t in _kernel_nodes(node) if t.op in REDUCTIONS}
    own = {_base(a) for a in node.shape}
    for p in consumers:
        if p.op is Op.STORE:
            continue
        space = {_base(a) for t in (p, *p.args) for a in t.shape}
        if p.op in REDUCTIONS:
            space.add(_base(p.axis))
        if (space - own) & reduced:
            return True
    return False


def _kernel_nodes(node: Term) -> Iterable[Term]:
    stack, seen = [node], set()
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        yield t
        if t.op is not Op.STORE:
            stack.extend(t.args)


def with_stores(root: Term, stored: Collection[Term]) -> Term:
    """`root` with each node of `stored` wrapped in a `Store` (once; a node already
    stored keeps its one Store). Identity semantics: the value does not change."""
    if not stored:
        return root
    memo: dict[Term, Term] = {}
    for node in postorder(root):
        args = tuple(memo[a] for a in node.args)
        t = node if args == node.args else Term(node.op, args, node.attrs)
        if node in stored and node.op is not Op.STORE and node is not root:
            t = Term(Op.STORE, (t,))
        memo[node] = t
    return memo[root]


def choose_stores(root: Term, points: Sequence[Term], cost: TermCost,
                  starts: Iterable[Collection[Term]] = (), max_evals: int = 40
                  ) -> tuple[frozenset[Term], float, dict[frozenset[Term], float]]:
    """The cheapest store set found under `cost`: the best of the starting sets (none,
    all points, and `starts`), improved by best-improvement single flips until none
    helps or `max_evals` costs were computed. Returns (set, cost, every set scored)."""
    scored: dict[frozenset[Term], float] = {}

    def score(s: frozenset[Term]) -> float:
        if s not in scored:
            try:
                scored[s] = float(cost(with_stores(root, s)))
            except Exception:  # a program the cost model cannot lower is not a choice
                scored[s] = math.inf
        return scored[s]

    pool = frozenset(points)
    initial = [frozenset(), pool, *(frozenset(s) & pool for s in starts)]
    best = min(initial, key=score)
    while len(scored) < max_evals:
        moves = [best ^ {p} for p in points if best ^ {p} not in scored]
        if not moves:
            break
        moves = moves[: max(1, max_evals - len(scored))]
        step = min(moves, key=score)
        if score(step) >= score(best):
            break
        best = step
    return best, score(best), scored


def materializations(root: Term, cost: TermCost, *,
                     storable: Callable[[Term], bool] | None = None,
                     reference: float | None = None,
                     spec_stores: Collection[Term] = (),
                     rng: np.random.Generator | None = None,
                     max_evals: int = 40) -> list[Materialized]:
    """The materializations of `root` worth proposing (see the module notes), the
    cost-chosen one first. `spec_stores` are values the spec itself stored (its eager
    kernel boundaries); `reference` is the cost the recompute limit is relative to;
    `rng` adds one random subset of the points (the sampler's draw)."""
    points = store_points(root, storable)[:MAX_POINTS]
    spec = frozenset(p for p in points if p in spec_stores)
    partial = frozenset(partial_fusion(root, points))
    best, _, scored = choose_stores(root, points, cost, (spec, partial), max_evals)
    picks: dict[frozenset[Term], str] = {best: "chosen" if best else "none"}
    for s, how in ((partial, "partial"), (spec, "spec")):
        if s:
            picks.setdefault(s, how)
    if rng is not None and points:
        drawn = frozenset(p for p in points if rng.random() < 0.5)
        if drawn:
            picks.setdefault(drawn, "sampled")
    picks.setdefault(frozenset(), "none")
    for s in picks:
        if s not in scored:
            scored[s] = _safe_cost(cost, with_stores(root, s))
    cheapest = min(scored[s] for s in picks)
    limit = math.inf if reference is None else RECOMPUTE_LIMIT * reference
    return [Materialized(with_stores(root, s), s, how, scored[s]) for s, how in picks.items()
            if scored[s] <= limit or scored[s] == cheapest]


def memo_cost(cost: TermCost) -> TermCost:
    """`cost` memoized by term key (extractions share most of their variants)."""
    seen: dict[str, float] = {}

    def cached(term: Term) -> float:
        if term.key not in seen:
            seen[term.key] = float(cost(term))
        return seen[term.key]

    return cached


def _safe_cost(cost: TermCost, term: Term) -> float:
    try:
        return float(cost(term))
    except Exception:
        return math.inf


def spread_kernel_counts[T](ranked: Sequence[T], kernels: Callable[[T], int]) -> list[T]:
    """`ranked` with the first item of each kernel count moved to the front (in their
    ranked order), the rest after in theirs: the few programs that are measured then
    differ in their kernel boundaries, not only in the order of a sum, so a
    materialization the cost model ranks low is still timed (the roofline puts a
    statistics kernel plus a fused normalization at 2x the fused softmax; measured, it
    was faster at 512x256).

    >>> spread_kernel_counts(["a1", "b1", "c3", "d1", "e2"], lambda s: int(s[1]))
    ['a1', 'c3', 'e2', 'b1', 'd1']
    """
    seen: set[int] = set()
    first: list[T] = []
    rest: list[T] = []
    for item in ranked:
        k = kernels(item)
        (rest if k in seen else first).append(item)
        seen.add(k)
    return first + rest


def class_terms(snapshot: Snapshot, root: int, choice: Mapping[int, int]) -> dict[Term, int]:
    """The e-class of every node of the term `choice` spells from `root` (checked), so
    that a store point can be asked whether its class is `storable`."""
    built: dict[int, Term] = {}
    for c in check_extraction(snapshot, root, choice):
        node = snapshot.nodes[choice[c]]
        built[c] = Term(node.op, tuple(built[k] for k in node.children), node.attrs)
    return {t: c for c, t in built.items()}


def storable_in(snapshot: Snapshot, classes: Mapping[Term, int]) -> Callable[[Term], bool]:
    """`storable` for `store_points`: the node's class holds `Store(itself)`, so storing
    it is one backward step of a materialization rule (provable)."""
    def ok(node: Term) -> bool:
        c = classes.get(node)
        return c is not None and snapshot.storable(c)

    return ok


__all__ = [
    "MAX_POINTS",
    "RECOMPUTE_LIMIT",
    "Materialized",
    "broadcast_into",
    "choose_stores",
    "class_terms",
    "materializations",
    "memo_cost",
    "partial_fusion",
    "spread_kernel_counts",
    "storable_in",
    "store_points",
    "with_stores",
]
