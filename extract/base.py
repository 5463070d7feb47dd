"""The extractor protocol, cost models and the checks every extraction passes.

An extractor reads a `Snapshot` and a root class and returns `Extraction`s: a
choice of one e-node per class reachable from the root, the `Term` it spells, its
cost and how it was found. Every extraction is checked acyclic and class-correct
(`check_extraction`) before it is returned.

Costs come in two kinds:

- a per-node cost (`CostModel`): `cost(snapshot, node_id) -> float`, finite.
  Extractors optimize it directly; an extraction's `cost` is its DAG cost (every
  distinct chosen node counted once, as in a hash-consed `Term`). Negative costs are
  accepted where the extractor's objective stays well defined (see `GreedyTree`).
- a whole-term cost (`TermCost`): `cost(term) -> float`. Extractors search with a
  per-node stand-in (`Rescore.search`, AST size by default) and report and rank by
  the term cost. A plain callable of one argument is read as a term cost.

The choice-level functions read any `Graph` (a `Snapshot`, or a foreign e-graph loaded
by `kernelsat.extract.json_egraph`), with the node costs as a list.

>>> from kernelsat.egraph.snapshot import ENode, Snapshot
>>> import numpy as np
>>> from kernelsat.ops import Op
>>> snap = Snapshot(
...     nodes=[ENode(Op.CONST, (1.0,), ()), ENode(Op.NEG, (), (0,))],
...     node_class=np.array([0, 1]), classes=[[0], [1]], class_shape=[{}, {}], root=1)
>>> dag_cost(snap, 1, {0: 0, 1: 1}, ASTSize())
2.0
>>> try:
...     check_extraction(snap, 1, {1: 1})
... except ExtractionError as e:
...     print(e)
no node chosen for class 0 (reached from class 1 via node 1 neg)
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

import numpy as np

from kernelsat.egraph.snapshot import Snapshot
from kernelsat.hardware.cost import estimate_term
from kernelsat.ir import Term
from kernelsat.ops import Op
from kernelsat.work import iteration_space, op_work

Choice = Mapping[int, int]
"""class id -> the node id chosen for it."""


class ExtractionError(ValueError):
    """An extraction that is cyclic, misses a class, or picks a node of the wrong class;
    or a snapshot with no acyclic extraction at all. The message names the classes and
    nodes involved."""


class NodeLike(Protocol):
    """An e-node as extractors see it: its child classes."""

    @property
    def children(self) -> tuple[int, ...]: ...


class Graph(Protocol):
    """What the choice-level extraction functions read: dense class and node ids, each
    node's child classes and class, and a short label per node for messages.
    `Snapshot` is one; `kernelsat.extract.json_egraph.LabeledGraph` another."""

    @property
    def nodes(self) -> Sequence[NodeLike]: ...

    @property
    def node_class(self) -> np.ndarray: ...

    @property
    def classes(self) -> Sequence[Sequence[int]]: ...

    @property
    def n_classes(self) -> int: ...

    @property
    def n_nodes(self) -> int: ...

    def label(self, node: int, /) -> str: ...


@dataclass(frozen=True, slots=True)
class Pick:
    """A choice (class -> node, exactly the classes it uses) and how it was found:
    `status` as in `Extraction`; `gap` the ILP's relative optimality gap when known
    (0 when proved optimal)."""

    choice: Mapping[int, int]
    status: str
    gap: float | None = None


@dataclass(frozen=True, slots=True)
class Extraction:
    """One extracted program.

    - `term`: the program.
    - `choice`: class -> node for every class the term uses (exactly those).
    - `cost`: the DAG cost under the per-node cost model, or the term cost when the
      extractor was given one.
    - `method`: the extractor (`greedy-tree`, `greedy-dag`, `ilp`, `sample`, `local`).
    - `status`: how it ended (`heuristic`, `optimal`, `time-limit`, `greedy-fallback`,
      `work-limit`, `sampled`).
    - `gap`: the ILP's relative optimality gap when it reports one (0 when optimal).
    """

    term: Term
    choice: Mapping[int, int]
    cost: float
    method: str
    status: str
    gap: float | None = None


@runtime_checkable
class CostModel(Protocol):
    """A per-node cost: what choosing `snapshot.nodes[node]` costs, on its own, not
    counting its children. Must be finite (extractors check); negative costs are
    refused only by extractors whose objective they leave undefined."""

    def __call__(self, snapshot: Snapshot, node: int, /) -> float: ...


class TermCost(Protocol):
    """A whole-term cost, used to rank and re-score extracted programs."""

    def __call__(self, term: Term, /) -> float: ...


@dataclass(frozen=True, slots=True)
class ASTSize:
    """Every node costs 1: the DAG cost is the number of distinct nodes."""

    def __call__(self, snapshot: Snapshot, node: int, /) -> float:
        return 1.0


@dataclass(frozen=True)
class OpCost:
    """A cost per op, `default` for ops not in the table.

    >>> OpCost({Op.EXP: 8.0}).table[Op.EXP]
    8.0
    """

    table: Mapping[Op, float] = field(default_factory=dict)
    default: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "table", MappingProxyType(dict(self.table)))

    def __call__(self, snapshot: Snapshot, node: int, /) -> float:
        return float(self.table.get(snapshot.nodes[node].op, self.default))


@dataclass(frozen=True, slots=True)
class Rescore:
    """A whole-term cost with the per-node cost the extractors search with.

    Extractors optimize `search`; every extraction's `cost` is `term_cost(term)`, and
    lists are ranked by it."""

    term_cost: Callable[[Term], float]
    search: CostModel = ASTSize()


Cost = CostModel | Rescore | Callable[[Term], float]
"""What extractors accept: a per-node cost model, a `Rescore`, or a term cost."""


def resolve_cost(cost: Cost) -> tuple[CostModel, Callable[[Term], float] | None]:
    """(the per-node cost to search with, the term cost to report or None).

    A callable taking one positional argument is a term cost; two, a per-node cost."""
    if isinstance(cost, Rescore):
        return cost.search, cost.term_cost
    if isinstance(cost, ASTSize | OpCost):
        return cost, None
    if not callable(cost):
        raise TypeError(f"a cost must be callable, got {cost!r}")
    arity = _positional_arity(cost)
    if arity == 1:
        return ASTSize(), cost  # type: ignore[return-value]
    if arity == 2:
        return cost, None  # type: ignore[return-value]
    raise TypeError(
        f"cannot tell whether {cost!r} is a node cost (snapshot, node) or a term cost "
        f"(term): it takes {arity} positional arguments; wrap it in Rescore(...) instead"
    )


def _positional_arity(fn: Callable[..., object]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return 2
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


def node_costs(snapshot: Snapshot, cost: CostModel) -> list[float]:
    """The cost of every node, checked finite."""
    return checked_costs(snapshot, [float(cost(snapshot, n)) for n in range(snapshot.n_nodes)])


def checked_costs(graph: Graph, costs: Sequence[float]) -> list[float]:
    """`costs` as floats, one per node of `graph`, each finite."""
    if len(costs) != graph.n_nodes:
        raise ExtractionError(f"{len(costs)} node costs for {graph.n_nodes} nodes")
    out = [float(c) for c in costs]
    for n, c in enumerate(out):
        if not math.isfinite(c):
            raise ExtractionError(
                f"cost of node {n} ({graph.label(n)}) is {c}: node costs must be finite"
            )
    return out


class Extractor(Protocol):
    """The one extractor protocol: programs of `root`'s class, best first.

    `choose` is the same search on any `Graph` under per-node costs, returning choices
    instead of terms (it is how foreign e-graphs are extracted); `extract` runs it on a
    snapshot and spells the terms."""

    name: str

    def extract(self, snapshot: Snapshot, root: int, cost: Cost) -> list[Extraction]: ...

    def choose(self, graph: Graph, root: int, costs: Sequence[float]) -> list[Pick]: ...


# -- checks --------------------------------------------------------------------------


def check_extraction(snapshot: Graph, root: int, choice: Choice) -> list[int]:
    """Check that `choice` spells one finite term from `root`: every reached class has a
    chosen node, that node belongs to the class, and no chosen path returns to a class.

    Returns the reached classes, children before parents. Raises `ExtractionError`
    naming the offending classes and nodes otherwise."""
    order: list[int] = []
    state: dict[int, int] = {}  # 1 on the current path, 2 done
    stack: list[tuple[int, int]] = [(root, 0)]
    _check_node(snapshot, root, choice, None)
    state[root] = 1
    while stack:
        c, i = stack[-1]
        children = snapshot.nodes[choice[c]].children
        if i == len(children):
            stack.pop()
            state[c] = 2
            order.append(c)
            continue
        stack[-1] = (c, i + 1)
        k = children[i]
        match state.get(k, 0):
            case 2:
                continue
            case 1:
                path = [p for p, _ in stack]
                cycle = path[path.index(k) :]
                steps = ", ".join(
                    f"class {p} via node {choice[p]} {snapshot.label(choice[p])}"
                    for p in cycle
                )
                raise ExtractionError(f"cyclic choice: {steps} -> back to class {k}")
            case _:
                _check_node(snapshot, k, choice, c)
                state[k] = 1
                stack.append((k, 0))
    return order


def _check_node(snapshot: Graph, c: int, choice: Choice, parent: int | None) -> None:
    if not 0 <= c < snapshot.n_classes:
        raise ExtractionError(
            f"class {c} does not exist (the snapshot has {snapshot.n_classes} classes)"
        )
    if c not in choice:
        where = (
            ""
            if parent is None
            else (
                f" (reached from class {parent} via node {choice[parent]} "
                f"{snapshot.label(choice[parent])})"
            )
        )
        raise ExtractionError(f"no node chosen for class {c}{where}")
    node = choice[c]
    if not 0 <= node < snapshot.n_nodes:
        raise ExtractionError(f"node {node} does not exist (chosen for class {c})")
    if int(snapshot.node_class[node]) != c:
        owner = int(snapshot.node_class[node])
        raise ExtractionError(f"node {node} chosen for class {c} belongs to class {owner}")


def used_choice(snapshot: Graph, root: int, choice: Choice) -> dict[int, int]:
    """`choice` restricted to the classes the term from `root` uses (checked)."""
    return {c: choice[c] for c in check_extraction(snapshot, root, choice)}


def dag_cost(snapshot: Snapshot, root: int, choice: Choice, cost: CostModel) -> float:
    """Sum of the costs of the distinct chosen nodes under `root` (checked)."""
    return sum(float(cost(snapshot, choice[c])) for c in check_extraction(snapshot, root, choice))


def tree_cost(snapshot: Snapshot, root: int, choice: Choice, cost: CostModel) -> float:
    """Cost of the term as a tree: a shared sub-term counts once per use (checked)."""
    total: dict[int, float] = {}
    for c in check_extraction(snapshot, root, choice):
        node = choice[c]
        own = float(cost(snapshot, node))
        total[c] = own + sum(total[k] for k in snapshot.nodes[node].children)
    return total[root]


def choice_dag_cost(graph: Graph, root: int, choice: Choice, costs: Sequence[float]) -> float:
    """`dag_cost` with the node costs given as a list (checked)."""
    return sum(costs[choice[c]] for c in check_extraction(graph, root, choice))


def choice_tree_cost(graph: Graph, root: int, choice: Choice, costs: Sequence[float]) -> float:
    """`tree_cost` with the node costs given as a list (checked)."""
    total: dict[int, float] = {}
    for c in check_extraction(graph, root, choice):
        node = choice[c]
        total[c] = costs[node] + sum(total[k] for k in graph.nodes[node].children)
    return total[root]


def finish(
    snapshot: Snapshot,
    root: int,
    pick: Pick,
    node_cost: CostModel,
    term_cost: Callable[[Term], float] | None,
    method: str,
) -> Extraction:
    """Check a pick and package it: the term, the used classes only, the cost."""
    used = used_choice(snapshot, root, pick.choice)
    term = snapshot.term(used, root)
    if term_cost is None:
        value = sum(float(node_cost(snapshot, n)) for n in used.values())
    else:
        value = float(term_cost(term))
    return Extraction(term, MappingProxyType(used), value, method, pick.status, pick.gap)


def extract_picks(
    extractor: Extractor, snapshot: Snapshot, root: int, cost: Cost
) -> list[Extraction]:
    """Run `extractor.choose` on a snapshot under `cost` and spell the terms: one
    `Extraction` per distinct term, cheapest first."""
    search, term_cost = resolve_cost(cost)
    picks = extractor.choose(snapshot, root, node_costs(snapshot, search))
    found: dict[str, Extraction] = {}
    for pick in picks:
        extraction = finish(snapshot, root, pick, search, term_cost, extractor.name)
        found.setdefault(extraction.term.key, extraction)
    return sorted(found.values(), key=lambda e: e.cost)


# -- graph helpers shared by the extractors --------------------------------------------


def reachable_classes(
    snapshot: Graph, root: int, nodes_ok: Iterable[bool] | None = None
) -> list[int]:
    """Classes reachable from `root` through any node (or only nodes with `nodes_ok`)."""
    ok = None if nodes_ok is None else list(nodes_ok)
    seen = {root}
    stack = [root]
    while stack:
        c = stack.pop()
        for n in snapshot.classes[c]:
            if ok is not None and not ok[n]:
                continue
            for k in snapshot.nodes[n].children:
                if k not in seen:
                    seen.add(k)
                    stack.append(k)
    return sorted(seen)


# -- the roofline adapter ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RooflineCost:
    """Per-node seconds under the analytic roofline model of `kernelsat.hardware.cost`,
    made additive so that extraction can optimize it: compute time plus memory time.

    - FLOPs: `kernelsat.work.op_work` over the node's iteration space, the product of
      the sizes of every axis of its class and its child classes (so a reduction counts
      its reduced axis, as `estimate_term` does), plus `transcendental_flops` per
      transcendental evaluation; over `flops_per_s`.
    - bytes: an `In` reads its tensor once; a `Store` writes its tensor and the next
      kernel reads it back (2x); everything else is fused into registers. Over
      `bytes_per_s`, in `dtype_bytes` per element.
    - a `Store` also starts a kernel: `kernel_overhead_s`.

    `estimate_term` takes `max(compute, memory)` per kernel; this sum is an upper bound
    of it (at most 2x), the price of a per-node cost. Re-rank with `roofline_rescore`.

    >>> from kernelsat.egraph.snapshot import ENode, Snapshot
    >>> import numpy as np
    >>> snap = Snapshot(nodes=[ENode(Op.IN, ("X", ((("i", 4),),)), ()),
    ...                        ENode(Op.SUM, ("i",), (0,))],
    ...                 node_class=np.array([0, 1]), classes=[[0], [1]],
    ...                 class_shape=[{"i": 4}, {}], root=1)
    >>> m = RooflineCost(flops_per_s=1.0, bytes_per_s=1.0)
    >>> m(snap, 0), m(snap, 1)
    (16.0, 4.0)
    """

    flops_per_s: float
    bytes_per_s: float
    dtype_bytes: int = 4
    transcendental_flops: float = 0.0
    kernel_overhead_s: float = 0.0

    @classmethod
    def for_target(cls, target: object, dtype_bytes: int = 4) -> RooflineCost:
        """The model of a `kernelsat.hardware.targets.Target` (FP32 peak, memory
        bandwidth, transcendental penalty, launch overhead)."""
        try:
            return cls(
                float(target.peak_fp32),  # type: ignore[attr-defined]
                float(target.mem_bandwidth),  # type: ignore[attr-defined]
                dtype_bytes,
                float(getattr(target, "transcendental_penalty", 0.0)),
                float(getattr(target, "launch_overhead", 0.0)),
            )
        except AttributeError as e:
            raise TypeError(f"{target!r} is not a target (peak_fp32, mem_bandwidth)") from e

    def __call__(self, snapshot: Snapshot, node: int, /) -> float:
        op = snapshot.nodes[node].op
        flops, nbytes, space = node_flops_bytes(snapshot, node, self.dtype_bytes)
        flops += self.transcendental_flops * op_work(op, space)[1]
        overhead = self.kernel_overhead_s if op is Op.STORE else 0.0
        return flops / self.flops_per_s + nbytes / self.bytes_per_s + overhead


_BYTES_FACTOR: dict[Op, int] = {Op.IN: 1, Op.STORE: 2}
"""Times a node's tensor crosses memory: inputs are read, stores written and read back."""


def node_flops_bytes(
    snapshot: Snapshot, node: int, dtype_bytes: int = 4
) -> tuple[float, float, int]:
    """(FLOPs, bytes, iteration-space size) of one node, from its op and the shapes of
    its class and its child classes (`kernelsat.work`, as codegen and the cost model
    count)."""
    n = snapshot.nodes[node]
    own = snapshot.class_shape[int(snapshot.node_class[node])]
    size = iteration_space(n.op, own, (snapshot.class_shape[k] for k in n.children))
    flops = op_work(n.op, size)[0]
    nbytes = float(_BYTES_FACTOR.get(n.op, 0) * dtype_bytes * math.prod(own.values()))
    return flops, nbytes, size


def roofline_rescore(target: object) -> Rescore:
    """Search with the per-node `RooflineCost` of `target`; report and rank by the
    hardware model's whole-program estimate, `kernelsat.hardware.cost.estimate_term`."""
    def term_cost(term: Term) -> float:
        return float(estimate_term(term, target))

    return Rescore(term_cost, RooflineCost.for_target(target))
