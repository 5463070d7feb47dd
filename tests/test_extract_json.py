"""JSON e-graphs of other tools: the loader (egraph-serialize as egglog writes it, and
kernelsat's own snapshot), `extract_graph` with several roots, and `kernelsat extract`.

Properties on random e-graphs (cycles, shared sub-terms, several roots, negative
costs): every extraction is a valid program; the ILP equals brute force on small ones
and is never worse than the greedy DAG pick; greedy tree is tree-optimal. Malformed
files give one clear line naming the file and the offending member, exit 1."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import egglog
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kernelsat.cli import app
from kernelsat.extract import (
    EXTRACTORS,
    GRAPH_EXTRACTORS,
    ExtractionError,
    Sampler,
    check_extraction,
    extract,
    sample,
)
from kernelsat.extract.greedy import children_first, negative_node
from kernelsat.extract.json_egraph import (
    EGraphFormatError,
    LabeledGraph,
    extract_graph,
    load_egraph,
    parse_egraph,
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
METHODS = ["greedy-tree", "greedy-dag", "ilp", "local", "sample"]


def node(op: str, eclass: str, cost: float = 1.0, *children: str) -> dict[str, Any]:
    return {"op": op, "children": list(children), "eclass": eclass, "cost": cost}


@st.composite
def serialized(
    draw: st.DrawFn, max_classes: int = 6, max_nodes: int = 3, negative: bool = False
) -> dict[str, Any]:
    """A random e-graph in the egraph-serialize format. Class 0 has a leaf; every class
    has a node using only lower classes (so every class is extractable) plus extra nodes
    pointing anywhere (cycles, self-loops, shared children); 1 to 3 roots."""
    n = draw(st.integers(1, max_classes))
    low = -5 if negative else 0
    nodes: dict[str, dict[str, Any]] = {}
    first: list[str] = []

    def add(c: int, kids: list[int]) -> None:
        nid = f"n{len(nodes)}"
        if len(first) == c:
            first.append(nid)
        cost = draw(st.integers(low, 9))
        op = draw(st.sampled_from(["f", "g", "h", "x", "a b", "(c)"]))
        nodes[nid] = {"op": op, "children": kids, "eclass": f"c{c}", "cost": cost}

    for c in range(n):
        if c == 0:
            add(c, [])
        else:
            add(c, [draw(st.integers(0, c - 1)) for _ in range(draw(st.integers(0, 2)))])
        for _ in range(draw(st.integers(0, max_nodes - 1))):
            add(c, [draw(st.integers(0, n - 1)) for _ in range(draw(st.integers(0, 2)))])
    for data in nodes.values():  # children name the first node of the child class
        data["children"] = [first[k] for k in data["children"]]
    roots = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=3))
    return {"nodes": nodes, "root_eclasses": [f"c{r}" for r in roots]}


def brute_force(graph: LabeledGraph, roots: tuple[int, ...]) -> tuple[float, float]:
    """(min DAG cost, min tree cost) over every acyclic choice covering the roots."""
    best_dag = best_tree = math.inf
    for picks in itertools.product(*graph.classes):
        choice = dict(enumerate(picks))
        try:
            used = set().union(*(check_extraction(graph, r, choice) for r in roots))
        except ExtractionError:
            continue
        best_dag = min(best_dag, sum(graph.costs[choice[c]] for c in used))
        tree = 0.0
        for r in roots:
            total: dict[int, float] = {}
            for c in check_extraction(graph, r, choice):
                kids = graph.nodes[choice[c]].children
                total[c] = graph.costs[choice[c]] + sum(total[k] for k in kids)
            tree += total[r]
        best_tree = min(best_tree, tree)
    return best_dag, best_tree


def negative_in_a_cycle(graph: LabeledGraph, roots: tuple[int, ...]) -> bool:
    """Whether a node under the roots costs < 0 and the classes under them form a cycle
    (self-loops aside)."""
    joined, root = graph.joined(roots)
    negative = negative_node(joined, root, joined.costs) is not None
    return negative and children_first(joined, root) is None


# -- the loader ------------------------------------------------------------------------


def test_serialized_format_with_subsumed_nodes_and_integer_ids() -> None:
    graph = parse_egraph({
        "nodes": {
            "1": {"op": "x", "children": [], "eclass": 7, "cost": 2},
            "2": {"op": "y", "children": [], "eclass": 7, "subsumed": True},  # cost 1
            "3": {"op": "f", "children": [2, "1"], "eclass": "r"},
        },
        "root_eclasses": ["r"],
        "class_data": {"7": {"type": "i64"}},
    })
    assert graph.class_ids == ("7", "r") and graph.roots == (1,)
    assert graph.classes == ((0,), (2,))  # the subsumed node is never a candidate
    assert graph.nodes[2].children == (0, 0)  # but names its class as a child
    assert graph.costs == (2.0, 1.0, 1.0)
    result = extract_graph(graph, "ilp")
    assert result.program() == "(f x x)" and result.dag_cost == 3.0 and result.tree_cost == 5.0


def test_egglog_python_serialization_loads_and_extracts() -> None:
    class Num(egglog.Expr):
        def __init__(self, value: egglog.i64Like) -> None: ...

        @classmethod
        def var(cls, name: egglog.StringLike) -> Num: ...  # type: ignore[empty-body]

        def __add__(self, other: Num) -> Num: ...  # type: ignore[empty-body]

        def __mul__(self, other: Num) -> Num: ...  # type: ignore[empty-body]

    egraph = egglog.EGraph()
    x = Num.var("x")
    egraph.let("expr", x * Num(2) + x * Num(2))
    a, b = egglog.vars_("a b", Num)
    egraph.register(egglog.rewrite(a * Num(2)).to(a + a), egglog.rewrite(a + b).to(b + a))
    egraph.run(4)
    data = json.loads(egraph._serialize().to_json())
    assert data["root_eclasses"] == []  # egglog names no roots: the caller picks them
    let = [c for c, d in data["class_data"].items() if d.get("let") == "$expr"]
    graph = parse_egraph(data, "egglog")
    with pytest.raises(ExtractionError, match="no root e-class"):
        extract_graph(graph, "greedy-dag")
    roots = [graph.class_named(c) for c in let]
    results = {m: extract_graph(graph, m, roots) for m in METHODS}
    for result in results.values():
        assert result.valid, result.invalid
        assert "Num.var" in result.program()
    assert results["ilp"].status == "optimal"
    assert results["ilp"].dag_cost <= results["greedy-dag"].dag_cost


def test_kernelsat_saturate_json_loads(tmp_path: Path) -> None:
    from kernelsat.driver.commands.egraph import snapshot_json
    from kernelsat.egraph import saturate
    from kernelsat.ir import In, Sum, add, mul
    from kernelsat.rewrites.rule import parse_rules

    rules = parse_rules(
        "mul-comm: (mul ?x ?y) => (mul ?y ?x) [elementwise]\n"
        "distribute: (mul ?x (add ?y ?z)) => (add (mul ?x ?y) (mul ?x ?z)) [elementwise]\n"
    )
    x, y = In("X", (("i", 4), ("d", 3))), In("Y", (("i", 4), ("d", 3)))
    snap = saturate(Sum("d", add(mul(x, y), mul(x, x))), rules, iters=3).snapshot
    path = tmp_path / "sat.json"
    path.write_text(json.dumps({"report": {}, "egraph": snapshot_json(snap)}))
    graph = load_egraph(path)
    assert graph.roots == (snap.root,) and graph.n_nodes == snap.n_nodes
    assert all(graph.nodes[n].children == snap.nodes[n].children for n in range(snap.n_nodes))
    ilp = extract_graph(graph, "ilp")
    assert ilp.valid and ilp.status == "optimal"
    assert ilp.program() == '("Sum d" (mul "In X" (add "In Y" "In X")))'  # x factored out
    assert ilp.dag_cost == 5.0 == extract(snap, "ilp")[0].cost  # the same as on the snapshot


MALFORMED: list[tuple[str, str]] = [
    (
        "{",
        "1:2: invalid JSON",
    ),
    (
        '{"nodes": {}} x',
        "1:15: invalid JSON: Extra data",
    ),
    (
        "[]",
        "expected a JSON object, got an array",
    ),
    (
        '{"classes": {}}',
        'no "nodes" member',
    ),
    (
        '{"nodes": 3}',
        "nodes: expected an object of nodes, got the number 3",
    ),
    (
        '{"nodes": {}}',
        "the e-graph has no nodes",
    ),
    (
        '{"nodes": {"a": 1}}',
        'nodes["a"]: expected an object, got the number 1',
    ),
    (
        '{"nodes": {"a": {"eclass": "c"}}}',
        'nodes["a"]: missing "op"',
    ),
    (
        '{"nodes": {"a": {"op": "x"}}}',
        'nodes["a"]: missing "eclass"',
    ),
    (
        '{"nodes": {"a": {"op": 1, "eclass": "c"}}}',
        'nodes["a"].op: expected a string',
    ),
    (
        '{"nodes": {"a": {"op": "x", "eclass": null}}}',
        'nodes["a"].eclass: expected an id',
    ),
    (
        '{"nodes": {"a": {"op": "x", "eclass": "c", "children": "b"}}}',
        ".children: expected an array",
    ),
    (
        '{"nodes": {"a": {"op": "x", "eclass": "c", "children": ["b"]}}}',
        "children[0]: 'b' is not a node id",
    ),
    (
        '{"nodes": {"a": {"op": "x", "eclass": "c", "children": [[1]]}}}',
        "children[0]: expected an id",
    ),
    (
        '{"nodes": {"a": {"op": "x", "eclass": "c", "cost": "2"}}}',
        "cost must be a number, got a string",
    ),
    (
        '{"nodes": {"a": {"op": "x", "eclass": "c", "cost": true}}}',
        "cost must be a number, got a boolean",
    ),
    (
        '{"nodes": {"a": {"op": "x", "eclass": "c", "cost": NaN}}}',
        "cost must be finite, got nan",
    ),
    (
        '{"nodes": {"a": {"op": "x", "eclass": "c", "cost": -Infinity}}}',
        "cost must be finite",
    ),
    (
        '{"nodes": {"a": {"op": "x", "eclass": "c", "subsumed": 0}}}',
        "subsumed: expected true or false",
    ),
    (
        '{"nodes": {"a": {"op": "x", "eclass": "c"}}, "root_eclasses": "c"}',
        "root_eclasses: expected an array",
    ),
    (
        '{"nodes": {"a": {"op": "x", "eclass": "c"}}, "root_eclasses": ["d"]}',
        "root_eclasses[0]: 'd' is not the eclass of any node",
    ),
    (
        '{"nodes": {"a": {"op": "x", "eclass": "c"}}, "class_data": []}',
        "class_data: expected an object",
    ),
    (
        '{"egraph": {"nodes": [{"op": "x", "children": []}], "root": 0}}',
        'egraph.nodes[0]: missing "class"',
    ),
    (
        '{"nodes": [{"op": "x", "children": [], "class": -1}], "root": 0}',
        "nodes[0].class: expected a class number",
    ),
    (
        '{"nodes": [{"op": "x", "children": ["a"], "class": 0}], "root": 0}',
        "children: expected an array of class numbers",
    ),
    (
        '{"nodes": [{"op": "x", "children": [], "class": 0}], "root": 3}',
        "root: expected a class number below 1",
    ),
    (
        '{"nodes": {"a": {"op": "x", "eclass": "c", "cost": 1%s}}}' % ("0" * 400),
        "cost must be finite, got an integer of 401 digits",
    ),
    (
        '{"nodes": {"a": {"op": "x", "eclass": "c"}, "a": {"op": "y", "eclass": "c"}}}',
        'key "a" appears twice in one object',
    ),
    (
        '{"nodes": [{"op": "x", "children": [], "class": 1000000000000}], "root": 0}',
        "class numbers must be dense",
    ),
    (
        '{"nodes": [{"op": "x", "children": [], "class": 0}]}',
        "root: expected a class number below 1, got null",
    ),
]


@pytest.mark.parametrize(("text", "message"), MALFORMED)
def test_malformed_files_are_refused_with_the_file_and_the_member(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(EGraphFormatError) as info:
        load_egraph(path)
    assert str(info.value).startswith(f"{path}:")
    assert message in str(info.value)
    res = CliRunner().invoke(app, ["extract", str(path)])
    assert res.exit_code == 1
    assert message in res.output and "Traceback" not in res.output


def test_unreadable_files_and_bad_options_are_one_line_errors(tmp_path: Path) -> None:
    missing = tmp_path / "missing.json"
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00{")
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"nodes": {"a": node("x", "c")}, "root_eclasses": ["c"]}))
    cases = [
        ([str(missing)], "cannot read"),
        ([str(binary)], "not UTF-8"),
        ([str(good), "--extractor", "magic"], "unknown extractor 'magic'"),
        ([str(good), "--root", "nope"], "no e-class 'nope'"),
    ]
    for args, message in cases:
        res = CliRunner().invoke(app, ["extract", *args])
        assert res.exit_code == 1, (args, res.output)
        assert message in res.output and "Traceback" not in res.output, res.output
    for limit in ("0", "-1", "nan", "inf"):  # refused before anything runs: exit 2
        res = CliRunner().invoke(app, ["extract", str(good), "--time-limit", limit])
        assert res.exit_code == 2, (limit, res.output)
        message = "Invalid value for '--time-limit'"
        assert message in res.output and "Traceback" not in res.output, res.output


def test_a_root_with_no_acyclic_program_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "loop.json"
    path.write_text(json.dumps({
        "nodes": {"f": node("f", "a", 1, "g"), "g": node("g", "b", 1, "f")},
        "root_eclasses": ["a"],
    }))
    for method in ("greedy-dag", "ilp"):
        res = CliRunner().invoke(app, ["extract", str(path), "-e", method])
        assert res.exit_code == 1 and "no acyclic extraction" in res.output, res.output
    # the root's only child class has nothing but a subsumed node
    gone = dict(node("x", "b"), subsumed=True)
    path.write_text(json.dumps({
        "nodes": {"f": node("f", "a", 1, "x"), "x": gone}, "root_eclasses": ["b", "a"],
    }))
    for method in METHODS:
        res = CliRunner().invoke(app, ["extract", str(path), "-e", method])
        assert res.exit_code == 1, res.output
        assert "e-class 'b' has no acyclic extraction: it has no nodes" in res.output


# -- extraction --------------------------------------------------------------------------


def test_several_roots_share_one_choice_and_the_ilp_sees_it() -> None:
    # alone, r1 is cheapest as p (3); with r2 needing a anyway, f(a) (1 more) wins
    graph = parse_egraph({
        "nodes": {
            "x": node("x", "a", 3),
            "f": node("f", "r1", 1, "x"),
            "p": node("p", "r1", 3),
            "g": node("g", "r2", 1, "x"),
        },
        "root_eclasses": ["r1", "r2"],
    })
    ilp = extract_graph(graph, "ilp")
    greedy = extract_graph(graph, "greedy-dag")
    assert (ilp.dag_cost, ilp.tree_cost) == (5.0, 8.0)
    assert greedy.dag_cost == 7.0
    assert ilp.program(graph.class_named("r1")) == "(f x)"
    assert ilp.to_json()["chosen"] == {"a": "x", "r1": "f", "r2": "g"}
    alone = extract_graph(graph, "ilp", [graph.class_named("r1")])
    assert alone.dag_cost == 3.0 and alone.program() == "p"


def test_a_long_program_prints_as_one_class_per_line() -> None:
    nodes = {"n0": node("leaf", "c0")}
    for i in range(1, 400):  # a chain: the s-expression would be long
        nodes[f"n{i}"] = node("wrap", f"c{i}", 1, f"n{i - 1}", f"n{i - 1}")
    graph = parse_egraph({"nodes": nodes, "root_eclasses": ["c399"]})
    result = extract_graph(graph, "greedy-dag")
    text = result.program()
    lines = text.splitlines()
    assert lines[0] == "c0 = leaf" and lines[-1] == "c399 = (wrap c398 c398)"
    assert result.dag_cost == 400 and result.tree_cost == 2.0**400 - 1


@SETTINGS
@given(serialized())
def test_every_extractor_gives_a_valid_program_and_the_ilp_is_optimal(data: dict[str, Any]) -> None:
    graph = parse_egraph(data)
    best_dag, best_tree = brute_force(graph, graph.roots)
    results = {m: extract_graph(graph, m, time_limit=20) if m == "ilp" else extract_graph(graph, m)
               for m in METHODS}
    for method, result in results.items():
        assert result.valid, (method, result.invalid)
        assert result.dag_cost >= best_dag - 1e-9
    ilp, dag = results["ilp"], results["greedy-dag"]
    assert ilp.status == "optimal" and ilp.gap == 0.0
    assert ilp.dag_cost == pytest.approx(best_dag)
    assert ilp.dag_cost <= dag.dag_cost + 1e-9 <= results["greedy-tree"].dag_cost + 2e-9
    assert results["local"].dag_cost <= dag.dag_cost + 1e-9
    assert results["greedy-tree"].tree_cost == pytest.approx(best_tree)


@SETTINGS
@given(serialized(negative=True))
def test_negative_costs_ilp_exact_greedy_tree_exact_or_refused(data: dict[str, Any]) -> None:
    graph = parse_egraph(data)
    best_dag, best_tree = brute_force(graph, graph.roots)
    ilp = extract_graph(graph, "ilp", time_limit=20)
    assert ilp.valid and ilp.status == "optimal"
    assert ilp.dag_cost == pytest.approx(best_dag)
    for method in ("greedy-dag", "local", "sample"):
        result = extract_graph(graph, method)
        assert result.valid and result.dag_cost >= ilp.dag_cost - 1e-9
    if negative_in_a_cycle(graph, graph.roots):
        with pytest.raises(ExtractionError, match=r"greedy-tree: .* no well-defined minimum"):
            extract_graph(graph, "greedy-tree")
    else:
        assert extract_graph(graph, "greedy-tree").tree_cost == pytest.approx(best_tree)


# -- the sampler never comes back empty -------------------------------------------------


def traps(depth: int, leaves: int = 1, f_first: bool = False) -> LabeledGraph:
    """`depth` classes a_i = {x_i, f_i(b_i)} with b_i = {g_i(a_i)}, all under one root
    that uses every a_i and b_i: f_i and x_i tie, and picking f_i dead-ends at b_i (its
    only node leads back to a_i, on the path). A draw without backtracking survives
    with probability 2^-depth, and never at temperature 0 when f_i is listed first (the
    sampler before backtracking returned no program for either). With `leaves` > 1,
    a_i has that many leaves to pick."""
    nodes = {}
    kids = []
    for i in range(depth):
        if f_first:
            nodes[f"f{i}"] = node("f", f"a{i}", 0, f"g{i}")
        for j in range(1, leaves):
            nodes[f"y{i}.{j}"] = node(f"y{j}", f"a{i}", 1)
        nodes[f"x{i}"] = node("x", f"a{i}", 1)
        if not f_first:
            nodes[f"f{i}"] = node("f", f"a{i}", 0, f"g{i}")
        nodes[f"g{i}"] = node("g", f"b{i}", 0, f"x{i}")
        kids += [f"x{i}", f"g{i}"]
    nodes["h"] = node("h", "r", 1, *kids)
    return parse_egraph({"nodes": nodes, "root_eclasses": ["r"]})


@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.0, 10.0])
def test_the_sampler_backtracks_out_of_dead_ends(temperature: float) -> None:
    for leaves, programs, f_first in ((1, 1, False), (1, 1, True), (2, 4, True)):
        graph = traps(24, leaves, f_first)
        root = graph.roots[0]
        picks = Sampler(n=4, temperature=temperature, seed=1).choose(graph, root, graph.costs)
        assert all(p.status == "sampled" for p in picks)
        for p in picks:
            check_extraction(graph, root, p.choice)
        assert len(picks) == (1 if temperature == 0 else programs)


def test_the_sampler_falls_back_to_greedy_rather_than_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    graph = traps(24)
    monkeypatch.setattr(sample, "draw", lambda *args, **kwargs: None)  # every draw gives up
    (pick,) = Sampler(n=3).choose(graph, graph.roots[0], graph.costs)
    assert pick.status == "greedy-fallback"
    check_extraction(graph, graph.roots[0], pick.choice)


def test_the_sampler_refuses_to_sample_nothing() -> None:
    with pytest.raises(ValueError, match="n must be at least 1"):
        Sampler(n=0)
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        Sampler(temperature=-1)


@SETTINGS
@given(serialized(max_classes=8), st.floats(0, 20), st.integers(0, 5))
def test_the_sampler_always_returns_valid_programs(
    data: dict[str, Any], temperature: float, seed: int
) -> None:
    graph, root = parse_egraph(data).joined(parse_egraph(data).roots)
    picks = Sampler(n=5, temperature=temperature, seed=seed).choose(graph, root, graph.costs)
    assert 1 <= len(picks) <= 5
    assert len({frozenset(p.choice.items()) for p in picks}) == len(picks)
    for p in picks:
        assert set(check_extraction(graph, root, p.choice)) == set(p.choice)


def test_every_registered_extractor_takes_json_egraphs() -> None:
    """The graph-only extractors extract a foreign e-graph; the ones that read kernelsat
    ops (online, rl) refuse it by saying so."""
    graph = traps(3)
    for method in GRAPH_EXTRACTORS:
        assert extract_graph(graph, method).valid
    others = set(EXTRACTORS) - set(GRAPH_EXTRACTORS)
    assert others == {"online", "rl"}
    for method in others:
        with pytest.raises(ExtractionError, match="reads kernelsat ops"):
            extract_graph(graph, method)


def test_the_command_prints_costs_validity_status_and_time(tmp_path: Path) -> None:
    path = tmp_path / "shared.json"
    path.write_text(json.dumps({
        "nodes": {
            "x": node("x", "a", 3),
            "f": node("f", "r1", 1, "x"),
            "p": node("p", "r1", 3),
            "g": node("g y", "r2", 1, "x"),
        },
        "root_eclasses": ["r1", "r2"],
    }))
    res = CliRunner().invoke(app, ["extract", str(path), "--extractor", "ilp"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == f"{path}: 4 e-nodes, 3 e-classes; roots: r1, r2"
    assert lines[1:5] == ["r1: (f x)", 'r2: ("g y" x)', "tree cost: 8", "DAG cost:  5 (3 e-nodes)"]
    assert lines[5].startswith("valid:     yes") and lines[6] == "status:    ilp optimal, gap 0"
    assert lines[7].startswith("time:      ")

    def refuse(constant: str) -> Any:
        raise ValueError(f"not strict JSON: {constant}")

    res = CliRunner().invoke(app, ["extract", str(path), "-e", "greedy-dag", "--root", "r1",
                                   "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout, parse_constant=refuse)
    assert data["roots"] == ["r1"] and data["chosen"] == {"r1": "p"}
    assert (data["dag_cost"], data["tree_cost"], data["valid"]) == (3.0, 3.0, True)
    assert data["method"] == "greedy-dag" and data["status"] == "heuristic"
    assert data["seconds"] >= 0 and data["gap"] is None
