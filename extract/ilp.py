"""Exact DAG-cost extraction as an integer linear program (scipy's `milp`, HiGHS).

The model, over the classes reachable from the root through nodes that can be
extracted at all (every child class has an acyclic way out; self-loops dropped):

- a binary `x[n]` per node: n is chosen. A class is active when one of its nodes is
  chosen, so its activity is `sum(x[n] for n in c)`, at most 1, exactly 1 at the root.
- a chosen node activates its child classes, written once per (class c, child class k)
  pair: `sum(x[n] for n in c if k in children(n)) <= sum(x[m] for m in k)` (one node
  per class makes this aggregated row valid, and tighter than one row per node).
- acyclicity, Miller-Tucker-Zemlin style, only inside the strongly connected components
  of the class graph (no cycle can cross components): a continuous level `t[c]` in
  `[0, |S|-1]` per class of a non-trivial component S, and per (c, k) pair in S:
  `t[k] - t[c] + |S| * sum(x[n] for n in c if k in children(n)) <= |S| - 1`,
  so a chosen node's child sits strictly below it.
- minimize `sum(cost[n] * x[n])`, the DAG cost, subject to it not exceeding the greedy
  DAG pick's cost (the incumbent, since `milp` takes no starting point).

The result is the solver's choice when it found one (status `optimal`, or
`time-limit` with the best found), else the greedy DAG pick (`greedy-fallback`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array
from scipy.sparse.csgraph import connected_components

from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract.base import (
    Cost,
    CostModel,
    Extraction,
    check_extraction,
    finish,
    node_costs,
    reachable_classes,
    resolve_cost,
)
from kernelsat.extract.greedy import greedy_dag_choice, settle, tree_score


@dataclass(frozen=True, slots=True)
class ILP:
    """Exact DAG-cost extraction within `time_limit` seconds of solver time."""

    time_limit: float = 10.0
    max_work: int = 20_000_000
    name: str = "ilp"

    def extract(self, snapshot: Snapshot, root: int, cost: Cost) -> list[Extraction]:
        search, term_cost = resolve_cost(cost)
        choice, status = ilp_choice(snapshot, root, search, self.time_limit, self.max_work)
        return [finish(snapshot, root, choice, search, term_cost, self.name, status)]


def extractable_nodes(snapshot: Snapshot, root: int, costs: list[float]) -> list[bool]:
    """Nodes all of whose child classes have an acyclic extraction, self-loops excluded."""
    done = settle(snapshot, root, tree_score(snapshot, costs), full=True).best
    ok = [False] * snapshot.n_nodes
    for c in done:
        for n in snapshot.classes[c]:
            kids = snapshot.nodes[n].children
            ok[n] = c not in kids and all(k in done for k in kids)
    return ok


@dataclass
class _Model:
    """The rows of the program, built up one constraint at a time."""

    n_vars: int
    rows: list[int]
    cols: list[int]
    vals: list[float]
    lo: list[float]
    hi: list[float]

    def add(self, terms: list[tuple[int, float]], lo: float, hi: float) -> None:
        row = len(self.lo)
        for col, val in terms:
            self.rows.append(row)
            self.cols.append(col)
            self.vals.append(val)
        self.lo.append(lo)
        self.hi.append(hi)

    def constraint(self) -> LinearConstraint:
        shape = (len(self.lo), self.n_vars)
        a = coo_array((self.vals, (self.rows, self.cols)), shape=shape).tocsr()
        return LinearConstraint(a, np.array(self.lo), np.array(self.hi))


def ilp_choice(
    snapshot: Snapshot,
    root: int,
    cost: CostModel,
    time_limit: float = 10.0,
    max_work: int = 20_000_000,
) -> tuple[dict[int, int], str]:
    """(the choice, its status). Raises `ExtractionError` if the root has no acyclic
    extraction."""
    costs = node_costs(snapshot, cost)
    greedy, _ = greedy_dag_choice(snapshot, root, cost, max_work)
    incumbent = sum(costs[greedy[c]] for c in check_extraction(snapshot, root, greedy))
    if incumbent <= 0.0:
        return greedy, "optimal"  # nothing is cheaper than free
    ok = extractable_nodes(snapshot, root, costs)
    classes = reachable_classes(snapshot, root, ok)
    nodes = [n for c in classes for n in snapshot.classes[c] if ok[n]]
    col = {n: i for i, n in enumerate(nodes)}
    members: dict[int, list[int]] = {
        c: [col[n] for n in snapshot.classes[c] if ok[n]] for c in classes
    }
    users: dict[tuple[int, int], list[int]] = defaultdict(list)  # (c, k) -> cols of c using k
    for n in nodes:
        for k in set(snapshot.nodes[n].children):
            users[int(snapshot.node_class[n]), k].append(col[n])
    level, scc_size = _levels(classes, users, len(nodes))

    model = _Model(len(nodes) + len(level), [], [], [], [], [])
    for c in classes:
        model.add([(i, 1.0) for i in members[c]], 1.0 if c == root else 0.0, 1.0)
    for (c, k), using in users.items():
        model.add([(i, 1.0) for i in using] + [(i, -1.0) for i in members[k]], -np.inf, 0.0)
        if c in level and k in level and level[c][1] == level[k][1]:
            big = float(scc_size[c])
            terms = [(level[k][0], 1.0), (level[c][0], -1.0)] + [(i, big) for i in using]
            model.add(terms, -np.inf, big - 1.0)
    objective = np.zeros(model.n_vars)
    objective[: len(nodes)] = [costs[n] / incumbent for n in nodes]
    model.add([(i, objective[i]) for i in range(len(nodes)) if objective[i]], -np.inf, 1.0 + 1e-9)

    upper = np.ones(model.n_vars)
    for c, (i, _) in level.items():
        upper[i] = scc_size[c] - 1
    integrality = np.zeros(model.n_vars)
    integrality[: len(nodes)] = 1
    result = milp(
        objective,
        integrality=integrality,
        bounds=Bounds(np.zeros(model.n_vars), upper),
        constraints=model.constraint(),
        options={"time_limit": float(time_limit), "mip_rel_gap": 1e-9},
    )
    if result.x is None:
        return greedy, "greedy-fallback"
    chosen = {
        int(snapshot.node_class[nodes[i]]): nodes[i]
        for i in np.flatnonzero(result.x[: len(nodes)] > 0.5)
    }
    value = sum(costs[chosen[c]] for c in check_extraction(snapshot, root, chosen))
    if value > incumbent:
        return greedy, "greedy-fallback"
    return chosen, "optimal" if result.status == 0 else "time-limit"


def _levels(
    classes: list[int], users: dict[tuple[int, int], list[int]], first_col: int
) -> tuple[dict[int, tuple[int, int]], dict[int, int]]:
    """A level column per class in a non-trivial strongly connected component:
    class -> (its column, its component id), and class -> component size."""
    index = {c: i for i, c in enumerate(classes)}
    edges = [(index[c], index[k]) for (c, k) in users if c != k]
    if not edges:
        return {}, {}
    src, dst = zip(*edges, strict=True)
    graph = coo_array((np.ones(len(edges)), (src, dst)), shape=(len(classes), len(classes)))
    _, labels = connected_components(graph, directed=True, connection="strong")
    sizes = np.bincount(labels)
    level: dict[int, tuple[int, int]] = {}
    scc_size: dict[int, int] = {}
    for c in classes:
        label = int(labels[index[c]])
        if sizes[label] > 1:
            level[c] = (first_col + len(level), label)
            scc_size[c] = int(sizes[label])
    return level, scc_size
