"""Limits of the extractors: the ILP's time limit bounds the whole extraction (a solver
that does not come back is killed), and negative node costs are accepted where the
objective is well defined and refused with the reason where it is not."""

from __future__ import annotations

import multiprocessing
import random
import time
from typing import Any

import numpy as np
import pytest

from kernelsat.egraph.snapshot import ENode, Snapshot
from kernelsat.extract import ILP, ExtractionError, GreedyDag, GreedyTree, OpCost, Sampler
from kernelsat.extract import ilp as ilp_module
from kernelsat.extract.base import check_extraction
from kernelsat.extract.json_egraph import LabeledGraph, extract_graph, parse_egraph
from kernelsat.extract.local import LocalSearch
from kernelsat.ops import Op


def large_egraph(n_classes: int, per_class: int = 4, seed: int = 1) -> LabeledGraph:
    """A random e-graph with many cycles: class 0 a leaf, each class a few leaves and
    nodes of 1-3 children, 30% of them pointing anywhere (often up: a cycle)."""
    rng = random.Random(seed)
    nodes: dict[str, dict[str, Any]] = {}
    for c in range(n_classes):
        for j in range(per_class if c else 1):
            kids = []
            if c and not (j == 0 and rng.random() < 0.2):
                kids = [
                    f"n{rng.randrange(n_classes) if rng.random() < 0.3 else rng.randrange(c)}.0"
                    for _ in range(rng.randint(1, 3))
                ]
            op = f"op{rng.randrange(20)}"
            nodes[f"n{c}.{j}"] = {"op": op, "children": kids, "eclass": f"c{c}",
                                  "cost": rng.randint(1, 20)}
    roots = [f"c{n_classes - 1}", f"c{n_classes - 2}"]
    return parse_egraph({"nodes": nodes, "root_eclasses": roots})


def test_the_ilp_time_limit_bounds_the_whole_extraction() -> None:
    graph = large_egraph(20_000)
    before = set(multiprocessing.active_children())
    start = time.perf_counter()
    result = extract_graph(graph, "ilp", time_limit=2.0)
    wall = time.perf_counter() - start
    assert wall < 2.0 + 8.0  # a bound, with generous slack for a loaded machine
    assert result.valid
    assert result.status in {"optimal", "time-limit", "greedy-fallback"}
    # never worse than the greedy tree pick, which it always computes (the greedy DAG pass
    # may be cut short by the deadline on a loaded machine)
    assert result.dag_cost <= extract_graph(graph, "greedy-tree").dag_cost + 1e-9
    assert set(multiprocessing.active_children()) <= before  # the solver's process is gone


def test_a_solver_that_never_returns_is_killed_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def hang(*args: object) -> None:
        time.sleep(600)

    monkeypatch.setattr(ilp_module, "_solve", hang)
    graph = large_egraph(300)
    before = set(multiprocessing.active_children())
    start = time.perf_counter()
    result = extract_graph(graph, "ilp", time_limit=1.0)
    wall = time.perf_counter() - start
    assert wall < 1.0 + 5.0
    assert result.valid and result.status == "greedy-fallback" and result.gap is None
    assert result.dag_cost == extract_graph(graph, "greedy-dag").dag_cost
    assert set(multiprocessing.active_children()) <= before


def test_a_solver_that_crashes_falls_back_to_greedy(monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*args: object) -> None:
        raise MemoryError("out of memory in HiGHS")

    monkeypatch.setattr(ilp_module, "_solve", crash)
    graph = large_egraph(50)
    with pytest.warns(UserWarning, match="ILP solver failed .*out of memory in HiGHS"):
        result = extract_graph(graph, "ilp", time_limit=5.0)
    assert result.valid and result.status == "greedy-fallback"


def test_a_tiny_time_limit_still_gives_a_valid_program() -> None:
    graph = large_egraph(2_000)
    start = time.perf_counter()
    result = extract_graph(graph, "ilp", time_limit=1e-3)
    assert time.perf_counter() - start < 5.0
    assert result.valid and result.status == "greedy-fallback"


def test_the_time_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="time_limit must be > 0"):
        ILP(time_limit=0)


# -- negative costs ----------------------------------------------------------------------


def scalar_snapshot(members: list[list[tuple[Op, tuple[int, ...]]]], root: int) -> Snapshot:
    nodes: list[ENode] = []
    node_class: list[int] = []
    classes: list[list[int]] = []
    for c, entries in enumerate(members):
        classes.append([])
        for op, children in entries:
            attrs = (float(len(nodes)),) if op is Op.CONST else ()
            classes[c].append(len(nodes))
            node_class.append(c)
            nodes.append(ENode(op, attrs, children))
    return Snapshot(nodes, np.array(node_class), classes, [{} for _ in members], root)


# class 1 = {neg(0), exp(2)}, class 2 = {neg(1), c}: a cycle through neg
CYCLIC = scalar_snapshot(
    [[(Op.CONST, ())], [(Op.NEG, (0,)), (Op.EXP, (2,))], [(Op.NEG, (1,)), (Op.CONST, ())]], 2
)
# the same without the cycle: class 1 = {neg(0), exp(0)}
ACYCLIC = scalar_snapshot(
    [[(Op.CONST, ())], [(Op.NEG, (0,)), (Op.EXP, (0,))], [(Op.NEG, (1,)), (Op.CONST, ())]], 2
)
NEGATIVE = OpCost({Op.NEG: -3.0, Op.EXP: 1.0, Op.CONST: 1.0})


def test_negative_costs_on_a_cyclic_egraph_each_extractor() -> None:
    with pytest.raises(ExtractionError, match=r"greedy-tree: .*no well-defined minimum"):
        GreedyTree().extract(CYCLIC, 2, NEGATIVE)
    (ilp,) = ILP().extract(CYCLIC, 2, NEGATIVE)
    assert str(ilp.term) == "(neg (neg (Const 0.0)))" and ilp.cost == -5.0
    assert ilp.status == "optimal"
    (dag,) = GreedyDag().extract(CYCLIC, 2, NEGATIVE)
    assert dag.cost >= ilp.cost
    (local,) = LocalSearch().extract(CYCLIC, 2, NEGATIVE)
    assert local.cost == -5.0  # one move from the greedy pick
    for e in Sampler(n=4).extract(CYCLIC, 2, NEGATIVE):
        check_extraction(CYCLIC, 2, e.choice)


def test_negative_costs_on_an_acyclic_egraph_greedy_tree_is_exact() -> None:
    # settling in cost order would take the leaf of class 2 (1) before neg(neg c) (-5)
    (tree,) = GreedyTree().extract(ACYCLIC, 2, NEGATIVE)
    (ilp,) = ILP().extract(ACYCLIC, 2, NEGATIVE)
    (dag,) = GreedyDag().extract(ACYCLIC, 2, NEGATIVE)
    assert tree.cost == ilp.cost == dag.cost == -5.0


def test_non_finite_costs_are_refused() -> None:
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ExtractionError, match="must be finite"):
            ILP().extract(ACYCLIC, 2, OpCost({Op.NEG: bad}))
