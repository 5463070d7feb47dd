"""Greedy bottom-up extraction, with tree cost and with DAG cost.

Both run the same loop (Knuth's generalization of Dijkstra's algorithm to e-graphs,
which reaches the same fixpoint as egg's bottom-up extractor): a node gets a cost only
once every child class has its final choice; the cheapest costed node of a class not yet
settled settles it. Node costs are non-negative and a node costs at least as much as
each child, so settling in cost order is final, and the choices are acyclic by
construction: a node's children always settle before its class.

- tree cost: a node costs its own cost plus the costs of its child classes (a shared
  sub-term counts once per use). Optimal for tree cost.
- DAG cost: a node costs the sum over the union of the node sets chosen below its
  children, plus its own (shared sub-terms count once). A heuristic; the union work is
  bounded by `max_work`, beyond which a node is scored by the tree-style sum of its
  children's DAG costs (an over-estimate) and the status says `work-limit`.

>>> from kernelsat.egraph.snapshot import ENode, Snapshot
>>> from kernelsat.extract.base import ASTSize
>>> from kernelsat.ops import Op
>>> import numpy as np
>>> snap = Snapshot(  # class 1 = neg(neg(c)) = c: the cheapest term is the leaf
...     nodes=[ENode(Op.CONST, (2.0,), ()), ENode(Op.NEG, (), (1,)), ENode(Op.NEG, (), (2,))],
...     node_class=np.array([2, 1, 2]), classes=[[], [1], [0, 2]],
...     class_shape=[{}, {}, {}], root=2)
>>> [(str(e.term), e.cost) for e in GreedyTree().extract(snap, 2, ASTSize())]
[('(Const 2.0)', 1.0)]
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract.base import (
    Cost,
    CostModel,
    Extraction,
    ExtractionError,
    finish,
    node_costs,
    reachable_classes,
    resolve_cost,
)

Payload = frozenset[int] | None
"""What a scored node carries to its class when it settles (the DAG node set)."""

Score = Callable[[int, dict[int, float], dict[int, Payload]], tuple[float, Payload]]
"""(node, settled class costs, settled class payloads) -> (node cost, payload)."""


@dataclass(frozen=True, slots=True)
class Settled:
    """The outcome of one bottom-up pass: the settled classes, in settling order."""

    best: dict[int, int]  # class -> chosen node
    cost: dict[int, float]  # class -> its cost under the pass's measure
    order: list[int]  # classes in the order they settled
    capped: bool  # the DAG work bound was hit


def settle(snapshot: Snapshot, root: int, score: Score, *, full: bool = False) -> Settled:
    """Run the bottom-up pass over the classes reachable from `root`; stop once `root`
    settles unless `full`. Classes with no acyclic way out never settle."""
    parents: dict[int, list[int]] = defaultdict(list)
    need: dict[int, int] = {}
    heap: list[tuple[float, int, Payload]] = []
    best: dict[int, int] = {}
    cost: dict[int, float] = {}
    payload: dict[int, Payload] = {}
    order: list[int] = []
    for c in reachable_classes(snapshot, root):
        for n in snapshot.classes[c]:
            kids = set(snapshot.nodes[n].children)
            need[n] = len(kids)
            for k in kids:
                parents[k].append(n)
            if not kids:
                value, carried = score(n, cost, payload)
                heapq.heappush(heap, (value, n, carried))
    while heap:
        value, n, carried = heapq.heappop(heap)
        c = int(snapshot.node_class[n])
        if c in best:
            continue
        best[c], cost[c], payload[c] = n, value, carried
        order.append(c)
        if c == root and not full:
            break
        for p in parents[c]:
            need[p] -= 1
            if need[p] == 0 and int(snapshot.node_class[p]) not in best:
                value, carried = score(p, cost, payload)
                heapq.heappush(heap, (value, p, carried))
    capped = any(payload[c] is None for c in order)
    return Settled(best, cost, order, capped)


def tree_score(snapshot: Snapshot, costs: list[float]) -> Score:
    """Own cost plus the child classes' costs, a child used twice counted twice."""

    def score(n: int, cost: dict[int, float], _: dict[int, Payload]) -> tuple[float, Payload]:
        return costs[n] + sum(cost[k] for k in snapshot.nodes[n].children), frozenset()

    return score


def dag_score(snapshot: Snapshot, costs: list[float], max_work: int) -> Score:
    """Own cost plus the cost of the union of the node sets below the children."""
    work = 0

    def score(n: int, cost: dict[int, float], sets: dict[int, Payload]) -> tuple[float, Payload]:
        nonlocal work
        kids = set(snapshot.nodes[n].children)
        below = [sets[k] for k in kids]
        work += sum(len(s) for s in below if s is not None)
        if work > max_work or any(s is None for s in below):
            return costs[n] + sum(cost[k] for k in kids), None
        union = frozenset({n}).union(*below)  # type: ignore[arg-type]
        return sum(costs[m] for m in union), union

    return score


def _require_root(settled: Settled, snapshot: Snapshot, root: int) -> None:
    if root not in settled.best:
        raise ExtractionError(
            f"class {root} has no acyclic extraction: every node of it leads back into a "
            f"cycle ({len(snapshot.classes[root])} nodes)"
        )


def greedy_tree_choice(snapshot: Snapshot, root: int, cost: CostModel) -> dict[int, int]:
    """The tree-cost-optimal choice (every settled class)."""
    settled = settle(snapshot, root, tree_score(snapshot, node_costs(snapshot, cost)))
    _require_root(settled, snapshot, root)
    return settled.best


def greedy_dag_choice(
    snapshot: Snapshot, root: int, cost: CostModel, max_work: int = 20_000_000
) -> tuple[dict[int, int], bool]:
    """The greedy DAG choice, or the tree choice when that is cheaper as a DAG;
    and whether the work bound was hit."""
    costs = node_costs(snapshot, cost)
    settled = settle(snapshot, root, dag_score(snapshot, costs, max_work))
    _require_root(settled, snapshot, root)
    tree = settle(snapshot, root, tree_score(snapshot, costs))
    if _dag_value(snapshot, root, tree.best, costs) < _dag_value(
        snapshot, root, settled.best, costs
    ):
        return tree.best, settled.capped
    return settled.best, settled.capped


def _dag_value(snapshot: Snapshot, root: int, choice: dict[int, int], costs: list[float]) -> float:
    seen = {root}
    stack = [root]
    total = 0.0
    while stack:
        c = stack.pop()
        total += costs[choice[c]]
        for k in snapshot.nodes[choice[c]].children:
            if k not in seen:
                seen.add(k)
                stack.append(k)
    return total


@dataclass(frozen=True, slots=True)
class GreedyTree:
    """Bottom-up greedy, optimal for tree cost; reports the DAG cost of its pick."""

    name: str = "greedy-tree"

    def extract(self, snapshot: Snapshot, root: int, cost: Cost) -> list[Extraction]:
        search, term_cost = resolve_cost(cost)
        choice = greedy_tree_choice(snapshot, root, search)
        return [finish(snapshot, root, choice, search, term_cost, self.name, "heuristic")]


@dataclass(frozen=True, slots=True)
class GreedyDag:
    """Bottom-up greedy on DAG cost (shared sub-terms once), never worse than
    `GreedyTree` on DAG cost: it also scores the tree pick and keeps the cheaper."""

    max_work: int = 20_000_000
    name: str = "greedy-dag"

    def extract(self, snapshot: Snapshot, root: int, cost: Cost) -> list[Extraction]:
        search, term_cost = resolve_cost(cost)
        choice, capped = greedy_dag_choice(snapshot, root, search, self.max_work)
        status = "work-limit" if capped else "heuristic"
        return [finish(snapshot, root, choice, search, term_cost, self.name, status)]
