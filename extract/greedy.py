"""Greedy bottom-up extraction, with tree cost and with DAG cost.

Both run the same loop (Knuth's generalization of Dijkstra's algorithm to e-graphs,
which reaches the same fixpoint as egg's bottom-up extractor): a node gets a cost only
once every child class has its final choice; the cheapest costed node of a class not yet
settled settles it. With non-negative node costs a node costs at least as much as each
child, so settling in cost order is final; the choices are acyclic by construction
whatever the costs: a node's children always settle before its class.

- tree cost: a node costs its own cost plus the costs of its child classes (a shared
  sub-term counts once per use). Optimal for tree cost.
- DAG cost: a node costs the sum over the union of the node sets chosen below its
  children, plus its own (shared sub-terms count once). A heuristic; the union work is
  bounded by `max_work` (and by a deadline when the ILP asks for its incumbent), beyond
  which a node is scored by the tree-style sum of its children's DAG costs (an
  over-estimate) and the status says `work-limit`.

Negative node costs. Settling in cost order is no longer final (a class may settle
before a cheaper node of it is costed), so:

- on an e-graph whose classes reachable from the root form no cycle (self-loops aside,
  as no extraction can use them) both passes run in children-first order instead, which
  is exact for tree cost;
- with a cycle, the tree-cost minimum is not well defined: unrolling a cycle whose
  nodes cost less than nothing gives ever cheaper terms, and the best term that uses
  each class at most once is a shortest-simple-path problem (NP-hard). `greedy-tree`
  refuses with that reason. `greedy-dag` is a heuristic for DAG cost, which stays well
  defined (one node per class, finitely many choices), so it keeps the cheapest DAG
  value of its passes; the ILP is exact for it.

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
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract.base import (
    Cost,
    Extraction,
    ExtractionError,
    Graph,
    Pick,
    checked_costs,
    choice_dag_cost,
    extract_picks,
    reachable_classes,
    used_choice,
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
    stopped: bool = False  # the deadline passed before the pass was done


def settle(
    snapshot: Graph, root: int, score: Score, *, full: bool = False, deadline: float | None = None
) -> Settled:
    """Run the bottom-up pass over the classes reachable from `root`; stop once `root`
    settles unless `full`, or once `deadline` (a `time.monotonic()` value) passes, with
    `stopped` set. Classes with no acyclic way out never settle."""
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
    pops = 0
    while heap:
        pops += 1
        if deadline is not None and pops % 1024 == 0 and time.monotonic() > deadline:
            return Settled(best, cost, order, True, stopped=True)
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


def children_first(graph: Graph, root: int) -> list[int] | None:
    """The classes reachable from `root`, every child class before its parents, or None
    when they form a cycle (a node whose child is its own class does not count)."""
    state: dict[int, int] = {root: 1}  # 1 on the current path, 2 done
    order: list[int] = []
    stack: list[tuple[int, list[int]]] = [(root, _child_classes(graph, root))]
    while stack:
        c, pending = stack[-1]
        if not pending:
            stack.pop()
            state[c] = 2
            order.append(c)
            continue
        k = pending.pop()
        match state.get(k, 0):
            case 1:
                return None
            case 0:
                state[k] = 1
                stack.append((k, _child_classes(graph, k)))
    return order


def _child_classes(graph: Graph, c: int) -> list[int]:
    return sorted({k for n in graph.classes[c] for k in graph.nodes[n].children if k != c})


def settle_in_order(graph: Graph, root: int, score: Score) -> Settled | None:
    """The bottom-up pass in children-first order, each class taking its cheapest
    costed node: exact for tree cost whatever the signs of the costs. None when the
    classes reachable from `root` form a cycle."""
    order = children_first(graph, root)
    if order is None:
        return None
    best: dict[int, int] = {}
    cost: dict[int, float] = {}
    payload: dict[int, Payload] = {}
    settled: list[int] = []
    for c in order:
        found: tuple[float, int, Payload] | None = None
        for n in graph.classes[c]:
            kids = graph.nodes[n].children
            if c in kids or not all(k in best for k in kids):
                continue
            value, carried = score(n, cost, payload)
            if found is None or value < found[0]:
                found = (value, n, carried)
        if found is not None:
            cost[c], best[c], payload[c] = found
            settled.append(c)
    capped = any(payload[c] is None for c in settled)
    return Settled(best, cost, settled, capped)


def tree_score(snapshot: Graph, costs: Sequence[float]) -> Score:
    """Own cost plus the child classes' costs, a child used twice counted twice."""

    def score(n: int, cost: dict[int, float], _: dict[int, Payload]) -> tuple[float, Payload]:
        return costs[n] + sum(cost[k] for k in snapshot.nodes[n].children), frozenset()

    return score


def dag_score(
    snapshot: Graph, costs: Sequence[float], max_work: int, deadline: float | None = None
) -> Score:
    """Own cost plus the cost of the union of the node sets below the children; past
    `max_work` set elements or the `deadline` (a `time.monotonic()` value), the
    tree-style sum of the children's costs."""
    work = 0

    def score(n: int, cost: dict[int, float], sets: dict[int, Payload]) -> tuple[float, Payload]:
        nonlocal work
        kids = set(snapshot.nodes[n].children)
        below = [sets[k] for k in kids]
        work += sum(len(s) for s in below if s is not None)
        late = deadline is not None and time.monotonic() > deadline
        if late or work > max_work or any(s is None for s in below):
            return costs[n] + sum(cost[k] for k in kids), None
        union = frozenset({n}).union(*below)  # type: ignore[arg-type]
        return sum(costs[m] for m in union), union

    return score


def _require_root(settled: Settled, graph: Graph, root: int) -> None:
    if root not in settled.best:
        raise ExtractionError(no_extraction(graph, root))


def no_extraction(graph: Graph, root: int, name: str | None = None) -> str:
    """Why class `root` (called `name` in messages, if given) has no program: the
    message of the `ExtractionError`."""
    n = len(graph.classes[root])
    called = f"class {root}" if name is None else f"e-class {name!r}"
    if n == 0:
        return f"{called} has no acyclic extraction: it has no nodes"
    return (
        f"{called} has no acyclic extraction: each of its {n} nodes needs a class with "
        "no finite term (every way down leads back into a cycle or to a class with no nodes)"
    )


def negative_node(graph: Graph, root: int, costs: Sequence[float]) -> int | None:
    """A node of a class reachable from `root` whose cost is below 0, if any."""
    for c in reachable_classes(graph, root):
        for n in graph.classes[c]:
            if costs[n] < 0:
                return n
    return None


def greedy_tree_choice(graph: Graph, root: int, costs: Sequence[float]) -> dict[int, int]:
    """The tree-cost-optimal choice (every settled class). Raises `ExtractionError` when
    the root has no acyclic extraction, or when a node cost is negative and the
    reachable classes form a cycle (then no minimum is well defined)."""
    negative = negative_node(graph, root, costs)
    if negative is None:
        settled = settle(graph, root, tree_score(graph, costs))
    else:
        ordered = settle_in_order(graph, root, tree_score(graph, costs))
        if ordered is None:
            raise ExtractionError(
                f"greedy-tree: node {negative} ({graph.label(negative)}) costs "
                f"{costs[negative]} < 0 and the classes under the root form a "
                "cycle, so tree cost has no well-defined minimum (unrolling a cycle can "
                "make terms ever cheaper; the best term using each class once is NP-hard); "
                "use greedy-dag or ilp, which optimize DAG cost"
            )
        settled = ordered
    _require_root(settled, graph, root)
    return settled.best


def greedy_dag_choice(
    graph: Graph,
    root: int,
    costs: Sequence[float],
    max_work: int = 20_000_000,
    deadline: float | None = None,
    tree: Settled | None = None,
) -> tuple[dict[int, int], bool]:
    """The cheapest, as a DAG, of the greedy DAG pass and the tree pass (`tree` if
    given; and, with negative costs on an acyclic e-graph, of their children-first
    versions); and whether the work bound or `deadline` was hit. Past the deadline the
    DAG passes are abandoned; the tree pass always runs to the root."""
    tree = settle(graph, root, tree_score(graph, costs)) if tree is None else tree
    _require_root(tree, graph, root)
    dag = settle(graph, root, dag_score(graph, costs, max_work, deadline), deadline=deadline)
    passes = [tree] if dag.stopped else [tree, dag]
    if negative_node(graph, root, costs) is not None:
        for score in (dag_score(graph, costs, max_work, deadline), tree_score(graph, costs)):
            ordered = settle_in_order(graph, root, score)
            if ordered is not None and root in ordered.best:
                passes.append(ordered)
    best = min(passes, key=lambda s: choice_dag_cost(graph, root, s.best, costs))
    return best.best, dag.capped


@dataclass(frozen=True, slots=True)
class GreedyTree:
    """Bottom-up greedy, optimal for tree cost; reports the DAG cost of its pick.
    Refuses negative node costs on an e-graph with cycles (see the module notes)."""

    name: str = "greedy-tree"

    def choose(self, graph: Graph, root: int, costs: Sequence[float]) -> list[Pick]:
        choice = greedy_tree_choice(graph, root, checked_costs(graph, costs))
        return [Pick(used_choice(graph, root, choice), "heuristic")]

    def extract(self, snapshot: Snapshot, root: int, cost: Cost) -> list[Extraction]:
        return extract_picks(self, snapshot, root, cost)


@dataclass(frozen=True, slots=True)
class GreedyDag:
    """Bottom-up greedy on DAG cost (shared sub-terms once), never worse than
    `GreedyTree` on DAG cost: it also scores the tree pick and keeps the cheaper."""

    max_work: int = 20_000_000
    name: str = "greedy-dag"

    def choose(self, graph: Graph, root: int, costs: Sequence[float]) -> list[Pick]:
        choice, capped = greedy_dag_choice(graph, root, checked_costs(graph, costs), self.max_work)
        status = "work-limit" if capped else "heuristic"
        return [Pick(used_choice(graph, root, choice), status)]

    def extract(self, snapshot: Snapshot, root: int, cost: Cost) -> list[Extraction]:
        return extract_picks(self, snapshot, root, cost)
