"""Exact DAG-cost extraction as an integer linear program (scipy's `milp`, HiGHS).

The model, over the classes reachable from the root through nodes that can be
extracted at all (every child class has an acyclic way out; self-loops dropped):

- a binary `x[n]` per node: n is chosen. A class is active when one of its nodes is
  chosen, so its activity is `sum(x[n] for n in c)`, at most 1, exactly 1 at the root.
- a chosen node activates its child classes, written once per (class c, child class k)
  pair: `sum(x[n] for n in c if k in children(n)) <= sum(x[m] for m in k)` (one node
  per class makes this aggregated row valid, and tighter than one row per node).
- a class other than the root is active only if a chosen node uses it:
  `sum(x[m] for m in k) <= sum(x[n] for n using k)`. With non-negative costs the
  optimum never pays for an unused class anyway; with negative costs this row is what
  keeps the objective equal to the extracted program's DAG cost.
- acyclicity, Miller-Tucker-Zemlin style, only inside the strongly connected components
  of the class graph (no cycle can cross components): a continuous level `t[c]` in
  `[0, |S|-1]` per class of a non-trivial component S, and per (c, k) pair in S:
  `t[k] - t[c] + |S| * sum(x[n] for n in c if k in children(n)) <= |S| - 1`,
  so a chosen node's child sits strictly below it.
- minimize `sum(cost[n] * x[n])`, the DAG cost, subject to it not exceeding the greedy
  DAG pick's cost (the incumbent, since `milp` takes no starting point).

Negative node costs are fine: DAG cost over one node per class has finitely many
values, so the minimum is well defined.

`time_limit` bounds the whole extraction, not only the solver: the greedy pick (the
incumbent and the fallback) stops refining its DAG scores at the deadline, model
building checks the clock, and the solve runs in a child process that HiGHS is told to
leave a little before the deadline and that is killed at the deadline if it has not
(HiGHS's presolve does not look at its time limit; on large models it is switched off).
The child is forked where the platform can (it starts at once, shares the model's
memory, and needs no `if __name__ == "__main__"` guard in the caller's script); a fork
taken while other threads hold locks could hang, and is then killed at the deadline
like any other. Where there is no fork (Windows) it is spawned.
Only the greedy tree pass, the floor every extraction needs, is not interruptible.

The result is the solver's choice when it found one (status `optimal` with gap 0, or
`time-limit` with the best found and HiGHS's relative gap), else the greedy DAG pick
(`greedy-fallback`).
"""

from __future__ import annotations

import multiprocessing
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array
from scipy.sparse.csgraph import breadth_first_order, connected_components

from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract.base import (
    Cost,
    Extraction,
    Graph,
    Pick,
    checked_costs,
    choice_dag_cost,
    extract_picks,
    used_choice,
)
from kernelsat.extract.greedy import greedy_dag_choice, negative_node, settle, tree_score

PRESOLVE_MAX_NONZEROS = 1_000_000
"""Models with more constraint non-zeros than this are solved without HiGHS's presolve,
which does not look at the time limit: on a 400k-node e-graph (7.9M non-zeros) it was
still presolving 5 s past a 20 s limit; at 0.8M non-zeros it was a little faster with
presolve (18 s) than without (22 s)."""

SOLVER_MARGIN_S = 0.25
"""HiGHS is told to stop this much (or 10% of the time left, if more) before the
deadline, so that its best solution comes back before the child process is killed."""


@dataclass(frozen=True, slots=True)
class ILP:
    """Exact DAG-cost extraction, the whole of it within `time_limit` seconds."""

    time_limit: float = 10.0
    max_work: int = 20_000_000
    name: str = "ilp"

    def __post_init__(self) -> None:
        if not self.time_limit > 0:
            raise ValueError(f"ILP: time_limit must be > 0 seconds, got {self.time_limit}")

    def choose(self, graph: Graph, root: int, costs: Sequence[float]) -> list[Pick]:
        costs = checked_costs(graph, costs)
        return [ilp_pick(graph, root, costs, self.time_limit, self.max_work)]

    def extract(self, snapshot: Snapshot, root: int, cost: Cost) -> list[Extraction]:
        return extract_picks(self, snapshot, root, cost)


@dataclass(frozen=True, slots=True)
class Deadline:
    """A point on the `time.monotonic()` clock."""

    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def left(self) -> float:
        return self.at - time.monotonic()

    def passed(self) -> bool:
        return time.monotonic() >= self.at


@dataclass(frozen=True)
class Program:
    """The mixed-integer program, ready for `milp`; `nodes[i]` is column i's node."""

    objective: np.ndarray
    integrality: np.ndarray
    upper: np.ndarray
    constraint: LinearConstraint
    nodes: np.ndarray
    scale: float  # node costs were divided by this

    @property
    def nonzeros(self) -> int:
        return int(self.constraint.A.nnz)


@dataclass(frozen=True, slots=True)
class Solved:
    """What came back from HiGHS: scipy's status (0 optimal, 1 a limit), the solution
    (None if none was found), the relative gap and the dual bound when reported."""

    status: int
    x: np.ndarray | None
    gap: float | None
    bound: float | None
    error: str = ""  # why the solver failed, if it raised


def ilp_pick(
    graph: Graph,
    root: int,
    costs: Sequence[float],
    time_limit: float = 10.0,
    max_work: int = 20_000_000,
) -> Pick:
    """The DAG-cost-optimal choice within `time_limit` seconds (everything included),
    else the best found, else the greedy DAG pick. Raises `ExtractionError` if the root
    has no acyclic extraction."""
    deadline = Deadline.after(time_limit)
    tree = settle(graph, root, tree_score(graph, costs), full=True)
    greedy, _ = greedy_dag_choice(graph, root, costs, max_work, deadline.at, tree)
    greedy = used_choice(graph, root, greedy)
    incumbent = sum(costs[n] for n in greedy.values())
    if incumbent <= 0.0 and negative_node(graph, root, costs) is None:
        return Pick(greedy, "optimal", 0.0)  # nothing is cheaper than free
    program = build_program(graph, root, costs, incumbent, set(tree.best), deadline)
    solved = None if program is None else solve(program, deadline)
    if program is None or solved is None or solved.x is None:
        return Pick(greedy, "greedy-fallback", _fallback_gap(incumbent, program, solved))
    picked = program.nodes[solved.x[: len(program.nodes)] > 0.5]
    chosen = {int(graph.node_class[n]): int(n) for n in picked}
    used = used_choice(graph, root, chosen)
    if choice_dag_cost(graph, root, used, costs) > incumbent:
        return Pick(greedy, "greedy-fallback", _fallback_gap(incumbent, program, solved))
    if solved.status == 0:
        return Pick(used, "optimal", 0.0)
    return Pick(used, "time-limit", solved.gap)


def _fallback_gap(incumbent: float, program: Program | None, solved: Solved | None) -> float | None:
    """The greedy pick's relative gap to the solver's dual bound, when there is one."""
    if program is None or solved is None or solved.bound is None or incumbent == 0:
        return None
    bound = solved.bound * program.scale
    return max(0.0, (incumbent - bound) / abs(incumbent))


def _edges(graph: Graph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(source node, child class) of every distinct edge, and which nodes are listed as
    members of their class (a foreign graph may leave some out)."""
    src: list[int] = []
    dst: list[int] = []
    for n, node in enumerate(graph.nodes):
        kids = node.children
        for k in kids if len(kids) < 2 else dict.fromkeys(kids):
            src.append(n)
            dst.append(k)
    listed = np.zeros(graph.n_nodes, dtype=bool)
    for members in graph.classes:
        listed[list(members)] = True
    return np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), listed


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The concatenation of `arange(s, s + c)` for each start s and count c."""
    total = int(counts.sum())
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(starts, counts) + (np.arange(total) - offsets)


def build_program(
    graph: Graph,
    root: int,
    costs: Sequence[float],
    incumbent: float,
    done: set[int],
    deadline: Deadline,
) -> Program | None:
    """The model of the module notes over the classes in `done` (those with an acyclic
    extraction), or None if `deadline` passed while building it."""
    node_class = np.asarray(graph.node_class, dtype=np.int64)
    n_classes = graph.n_classes
    src, dst, listed = _edges(graph)
    if deadline.passed():
        return None
    settled = np.zeros(n_classes, dtype=bool)
    settled[list(done)] = True
    bad = ~settled[dst] | (dst == node_class[src])  # into a dead class, or a self-loop
    ok = listed & settled[node_class]
    ok[src[bad]] = False
    # classes reachable from the root through extractable nodes
    keep = ok[src]
    reach_graph = coo_array(
        (np.ones(int(keep.sum())), (node_class[src[keep]], dst[keep])), shape=(n_classes,) * 2
    ).tocsr()
    reach = np.zeros(n_classes, dtype=bool)
    reach[breadth_first_order(reach_graph, root, directed=True, return_predecessors=False)] = True
    nodes = np.flatnonzero(ok & reach[node_class])
    n_cols = len(nodes)
    col = np.full(graph.n_nodes, -1, dtype=np.int64)
    col[nodes] = np.arange(n_cols)
    classes = np.flatnonzero(reach)
    row_of = np.full(n_classes, -1, dtype=np.int64)
    row_of[classes] = np.arange(len(classes))
    n_rows = len(classes)
    in_model = col[src] >= 0
    e_src, e_dst = src[in_model], dst[in_model]
    e_cls = node_class[e_src]
    # one node per class, the root active: rows [0, R)
    rows = [row_of[node_class[nodes]]]
    cols = [np.arange(n_cols)]
    vals = [np.ones(n_cols)]
    lo = [np.where(classes == root, 1.0, 0.0)]
    hi = [np.ones(len(classes))]
    # a class is active only if a chosen node uses it: rows [R, 2R)
    rows += [n_rows + row_of[node_class[nodes]], n_rows + row_of[e_dst]]
    cols += [np.arange(n_cols), col[e_src]]
    vals += [np.ones(n_cols), -np.ones(len(e_src))]
    lo.append(np.full(len(classes), -np.inf))
    hi.append(np.where(classes == root, np.inf, 0.0))
    n_rows *= 2
    if deadline.passed():
        return None
    # a chosen node activates its child classes, one row per (class, child class) pair
    pair_keys, pair_of_edge = np.unique(e_cls * n_classes + e_dst, return_inverse=True)
    pair_cls, pair_kid = pair_keys // n_classes, pair_keys % n_classes
    by_class = np.argsort(node_class[nodes], kind="stable")  # columns grouped by class
    member_count = np.bincount(node_class[nodes], minlength=n_classes)
    member_start = np.cumsum(member_count) - member_count
    counts = member_count[pair_kid]
    rows += [n_rows + pair_of_edge, n_rows + np.repeat(np.arange(len(pair_keys)), counts)]
    cols += [col[e_src], by_class[_ranges(member_start[pair_kid], counts)]]
    vals += [np.ones(len(e_src)), -np.ones(int(counts.sum()))]
    lo.append(np.full(len(pair_keys), -np.inf))
    hi.append(np.zeros(len(pair_keys)))
    n_rows += len(pair_keys)
    if deadline.passed():
        return None
    # acyclicity inside strongly connected components of the class graph
    level, size, label = _levels(pair_cls, pair_kid, n_classes, n_cols)
    mtz = np.flatnonzero((size[pair_cls] > 1) & (label[pair_cls] == label[pair_kid]))
    mtz_row = np.full(len(pair_keys), -1, dtype=np.int64)
    mtz_row[mtz] = n_rows + np.arange(len(mtz))
    big = size[pair_cls].astype(float)
    edge_mtz = mtz_row[pair_of_edge] >= 0
    rows += [mtz_row[mtz], mtz_row[mtz], mtz_row[pair_of_edge[edge_mtz]]]
    cols += [level[pair_kid[mtz]], level[pair_cls[mtz]], col[e_src[edge_mtz]]]
    vals += [np.ones(len(mtz)), -np.ones(len(mtz)), big[pair_of_edge[edge_mtz]]]
    lo.append(np.full(len(mtz), -np.inf))
    hi.append(big[mtz] - 1.0)
    n_rows += len(mtz)
    # the DAG cost, scaled, no worse than the incumbent's
    cost = np.asarray(costs, dtype=float)[nodes]
    scale = float(max(abs(incumbent), float(np.abs(cost).max(initial=0.0)))) or 1.0
    n_vars = n_cols + int((level >= 0).sum())
    objective = np.zeros(n_vars)
    objective[:n_cols] = cost / scale
    bound = incumbent / scale
    priced = np.flatnonzero(objective[:n_cols])
    rows.append(np.full(len(priced), n_rows))
    cols.append(priced)
    vals.append(objective[priced])
    lo.append(np.array([-np.inf]))
    hi.append(np.array([bound + 1e-9 * max(1.0, abs(bound))]))
    n_rows += 1
    if deadline.passed():
        return None
    matrix = coo_array(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n_rows, n_vars)
    ).tocsr()
    upper = np.ones(n_vars)
    leveled = np.flatnonzero(level >= 0)
    upper[level[leveled]] = size[leveled] - 1
    integrality = np.zeros(n_vars)
    integrality[:n_cols] = 1
    constraint = LinearConstraint(matrix, np.concatenate(lo), np.concatenate(hi))
    return Program(objective, integrality, upper, constraint, nodes, scale)


def solve(program: Program, deadline: Deadline) -> Solved | None:
    """Solve `program` in a child process, back by `deadline` or killed; None if no
    answer came back in time (or the child failed)."""
    left = deadline.left()
    highs_seconds = left - max(SOLVER_MARGIN_S, 0.1 * left)
    if highs_seconds <= 0:
        return None
    presolve = program.nonzeros <= PRESOLVE_MAX_NONZEROS
    if multiprocessing.current_process().daemon:  # a daemon may not start children
        try:
            return _solve(program, highs_seconds, presolve)
        except Exception as e:
            warnings.warn(f"ILP solver failed ({type(e).__name__}: {e}); using the greedy pick",
                          stacklevel=2)
            return None
    fork = "fork" in multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork") if fork else multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_solve_in_child, args=(program, highs_seconds, presolve, send))
    child.daemon = True
    with warnings.catch_warnings():  # fork with threads: a hung child is killed at the deadline
        warnings.simplefilter("ignore", DeprecationWarning)
        child.start()
    send.close()
    try:
        if not receive.poll(max(0.0, deadline.left())):
            return None
        answer: Solved = receive.recv()
        if answer.error:
            warnings.warn(f"ILP solver failed ({answer.error}); using the greedy pick",
                          stacklevel=2)
        return answer
    except (EOFError, OSError):
        return None
    finally:
        receive.close()
        if child.is_alive():
            child.kill()
        child.join()


def _solve_in_child(program: Program, seconds: float, presolve: bool, send: Connection) -> None:
    try:
        send.send(_solve(program, seconds, presolve))
    except Exception as e:  # reported by the parent, which falls back to the greedy pick
        send.send(Solved(-1, None, None, None, f"{type(e).__name__}: {e}"))
    finally:
        send.close()


def _solve(program: Program, seconds: float, presolve: bool) -> Solved:
    result = milp(
        program.objective,
        integrality=program.integrality,
        bounds=Bounds(np.zeros(len(program.upper)), program.upper),
        constraints=program.constraint,
        options={"time_limit": float(seconds), "mip_rel_gap": 1e-9, "presolve": presolve},
    )
    gap = getattr(result, "mip_gap", None)
    bound = getattr(result, "mip_dual_bound", None)
    return Solved(
        int(result.status),
        None if result.x is None else np.asarray(result.x),
        None if gap is None or not np.isfinite(gap) else float(gap),
        None if bound is None or not np.isfinite(bound) else float(bound),
    )


def _levels(
    pair_cls: np.ndarray, pair_kid: np.ndarray, n_classes: int, first_col: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Over the class graph of the (class, child class) pairs: a level column per class
    in a non-trivial strongly connected component (-1 for the others), the size of every
    class's component, and the component labels."""
    graph = coo_array(
        (np.ones(len(pair_cls)), (pair_cls, pair_kid)), shape=(n_classes, n_classes)
    ).tocsr()
    _, labels = connected_components(graph, directed=True, connection="strong")
    sizes = np.bincount(labels, minlength=n_classes)[labels]
    level = np.full(n_classes, -1, dtype=np.int64)
    cyclic = np.flatnonzero(sizes > 1)
    level[cyclic] = first_col + np.arange(len(cyclic))
    return level, sizes, labels
