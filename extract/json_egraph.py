"""E-graphs from JSON files, and their extraction: kernelsat's extractors for other tools.

Two formats are read:

- the shared e-graph format that egglog's serializer writes and the extraction-gym
  benchmarks use (`egraph-serialize`)::

      {"nodes": {NODE_ID: {"op": str, "children": [NODE_ID, ...], "eclass": CLASS_ID,
                           "cost": number (default 1), "subsumed": bool (default false)}},
       "root_eclasses": [CLASS_ID, ...],
       "class_data": {CLASS_ID: {...}}}        # optional, not read

  A child is a node id; the edge goes to that node's class. Ops are opaque labels.
  Subsumed nodes (egglog's `subsume`) are never chosen, but still name their class as a
  child.
- kernelsat's own snapshot, as `kernelsat saturate SPEC --json-out F` writes it (the whole
  file, or its `"egraph"` member): nodes as a list with class-id children, the `root`
  class; every node costs 1 (AST size) unless a `"cost"` is given per node.

`load_egraph(path)` (or `parse_egraph(data, source)`) gives a `LabeledGraph`;
`extract_graph(graph, method)` extracts every root together (one choice shared by all
roots, so the DAG cost counts a sub-term they share once) and checks the result.
Malformed files raise `EGraphFormatError` naming the file and what is wrong.

>>> graph = parse_egraph({
...     "nodes": {"x": {"op": "x", "children": [], "eclass": "a", "cost": 1},
...               "y": {"op": "y", "children": [], "eclass": "a", "cost": 3},
...               "f": {"op": "f", "children": ["y", "x"], "eclass": "r", "cost": 2}},
...     "root_eclasses": ["r"]})
>>> result = extract_graph(graph, "ilp")
>>> result.program(), result.dag_cost, result.tree_cost, result.status
('(f x x)', 3.0, 4.0, 'optimal')
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from kernelsat.extract import make_extractor
from kernelsat.extract.base import (
    ExtractionError,
    Extractor,
    check_extraction,
    choice_dag_cost,
    choice_tree_cost,
)
from kernelsat.extract.greedy import no_extraction, settle, tree_score

JOIN = "<roots>"
"""The op (and class id) of the node that joins several roots into one."""


class EGraphFormatError(ValueError):
    """A JSON e-graph file that cannot be read: the message names the file and the
    offending member (`nodes["n3"].children[1]`)."""


@dataclass(frozen=True, slots=True)
class LabeledNode:
    """An e-node of a foreign e-graph: an opaque op label and its child classes."""

    op: str
    children: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class LabeledGraph:
    """An e-graph with opaque ops and per-node costs (a `kernelsat.extract.Graph`).

    Classes and nodes are dense integers; `class_ids[c]` and `node_ids[n]` are their
    names in the file. `classes[c]` holds the nodes that may be chosen for c (subsumed
    nodes are left out). `roots` are the file's root classes."""

    nodes: tuple[LabeledNode, ...]
    node_class: np.ndarray
    classes: tuple[tuple[int, ...], ...]
    costs: tuple[float, ...]
    node_ids: tuple[str, ...]
    class_ids: tuple[str, ...]
    roots: tuple[int, ...]
    source: str = "<e-graph>"
    _class_index: Mapping[str, int] = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    def label(self, node: int) -> str:
        """The node's op, and its id in the file when that differs: `f (node n3)`."""
        op, name = self.nodes[node].op, self.node_ids[node]
        return op if op == name else f"{op} (node {name})"

    def class_named(self, name: str) -> int:
        """The class whose id in the file is `name`."""
        index = self._class_index or {c: i for i, c in enumerate(self.class_ids)}
        if name not in index:
            sample = ", ".join(self.class_ids[:5])
            raise EGraphFormatError(
                f"{self.source}: no e-class {name!r} (it has {self.n_classes}: {sample}...)"
            )
        return index[name]

    def joined(self, roots: Sequence[int]) -> tuple[LabeledGraph, int]:
        """(a graph with one more class whose single node, of cost 0, has `roots` as
        children; that class), so that one extraction covers every root."""
        name = JOIN
        while name in self.class_ids:
            name += "'"
        c = self.n_classes
        n = self.n_nodes
        return (
            LabeledGraph(
                (*self.nodes, LabeledNode(JOIN, tuple(roots))),
                np.append(self.node_class, c),
                (*self.classes, (n,)),
                (*self.costs, 0.0),
                (*self.node_ids, name),
                (*self.class_ids, name),
                (c,),
                self.source,
            ),
            c,
        )


def load_egraph(path: str | Path) -> LabeledGraph:
    """Read a JSON e-graph file (either format of the module notes)."""
    source = str(path)
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise EGraphFormatError(f"{source}: cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise EGraphFormatError(f"{source}: not UTF-8 text ({e.reason})") from None
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys(source))
    except json.JSONDecodeError as e:
        raise EGraphFormatError(f"{source}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    except RecursionError:
        raise EGraphFormatError(f"{source}: invalid JSON: nested too deeply") from None
    return parse_egraph(data, source)


def _unique_keys(source: str) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """A JSON object hook refusing a key given twice (json keeps the last silently, which
    would drop a node)."""

    def build(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise EGraphFormatError(
                    f"{source}: key {json.dumps(key)} appears twice in one object"
                )
            out[key] = value
        return out

    return build


def parse_egraph(data: object, source: str = "<e-graph>") -> LabeledGraph:
    """The e-graph in decoded JSON `data`; `source` names it in error messages."""
    if not isinstance(data, dict):
        raise EGraphFormatError(f"{source}: expected a JSON object, got {_kind(data)}")
    if isinstance(data.get("egraph"), dict):
        return _parse_kernelsat(data["egraph"], source, "egraph.")
    if isinstance(data.get("nodes"), list):
        return _parse_kernelsat(data, source, "")
    if "nodes" not in data:
        raise EGraphFormatError(
            f'{source}: no "nodes" member: expected an e-graph in the egraph-serialize '
            'format ({"nodes": {...}, "root_eclasses": [...]}) or kernelsat\'s snapshot'
        )
    return _parse_serialized(data, source)


def _kind(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, bool | int | float) and not isinstance(value, bool):
        return f"the number {value}"
    return names.get(type(value), type(value).__name__)


def _cost(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EGraphFormatError(f"{where}: cost must be a number, got {_kind(value)}")
    try:
        cost = float(value)
    except OverflowError:  # an integer literal beyond any float
        cost = math.inf
    if not math.isfinite(cost):
        shown = value if isinstance(value, float) else f"an integer of {len(str(value))} digits"
        raise EGraphFormatError(f"{where}: cost must be finite, got {shown}")
    return cost


def _name(value: object, where: str) -> str:
    """An id: a string, or an integer taken as its decimal text."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise EGraphFormatError(f"{where}: expected an id (a string), got {_kind(value)}")


def _parse_serialized(data: dict[str, Any], source: str) -> LabeledGraph:
    raw = data["nodes"]
    if not isinstance(raw, dict):
        raise EGraphFormatError(f"{source}: nodes: expected an object of nodes, got {_kind(raw)}")
    if not raw:
        raise EGraphFormatError(f"{source}: nodes: the e-graph has no nodes")
    node_ids = tuple(raw)
    node_index = {n: i for i, n in enumerate(node_ids)}
    class_index: dict[str, int] = {}
    ops: list[str] = []
    owner: list[int] = []
    kids: list[list[str]] = []
    costs: list[float] = []
    subsumed: list[bool] = []
    for nid, node in raw.items():
        where = f"{source}: nodes[{json.dumps(nid)}]"
        if not isinstance(node, dict):
            raise EGraphFormatError(f"{where}: expected an object, got {_kind(node)}")
        for key in ("op", "eclass"):
            if key not in node:
                raise EGraphFormatError(f'{where}: missing "{key}"')
        if not isinstance(node["op"], str):
            raise EGraphFormatError(f"{where}.op: expected a string, got {_kind(node['op'])}")
        children = node.get("children", [])
        if not isinstance(children, list):
            raise EGraphFormatError(f"{where}.children: expected an array, got {_kind(children)}")
        names = [_name(k, f"{where}.children[{i}]") for i, k in enumerate(children)]
        for i, k in enumerate(names):
            if k not in node_index:
                raise EGraphFormatError(f"{where}.children[{i}]: {k!r} is not a node id")
        flag = node.get("subsumed", False)
        if not isinstance(flag, bool):
            raise EGraphFormatError(f"{where}.subsumed: expected true or false, got {_kind(flag)}")
        ops.append(node["op"])
        eclass = _name(node["eclass"], f"{where}.eclass")
        owner.append(class_index.setdefault(eclass, len(class_index)))
        kids.append(names)
        costs.append(_cost(node.get("cost", 1.0), f"{where}.cost"))
        subsumed.append(flag)
    nodes = tuple(
        LabeledNode(op, tuple(owner[node_index[k]] for k in names))
        for op, names in zip(ops, kids, strict=True)
    )
    members: list[list[int]] = [[] for _ in class_index]
    for n, c in enumerate(owner):
        if not subsumed[n]:
            members[c].append(n)
    class_data = data.get("class_data", {})
    if class_data is not None and not isinstance(class_data, dict):
        raise EGraphFormatError(
            f"{source}: class_data: expected an object, got {_kind(class_data)}"
        )
    roots_raw = data.get("root_eclasses", [])
    if not isinstance(roots_raw, list):
        raise EGraphFormatError(
            f"{source}: root_eclasses: expected an array of e-class ids, got {_kind(roots_raw)}"
        )
    roots: list[int] = []
    for i, r in enumerate(roots_raw):
        name = _name(r, f"{source}: root_eclasses[{i}]")
        if name not in class_index:
            raise EGraphFormatError(
                f"{source}: root_eclasses[{i}]: {name!r} is not the eclass of any node"
            )
        roots.append(class_index[name])
    return LabeledGraph(
        nodes,
        np.array(owner, dtype=np.int64),
        tuple(tuple(m) for m in members),
        tuple(costs),
        node_ids,
        tuple(class_index),
        tuple(dict.fromkeys(roots)),
        source,
        MappingProxyType(class_index),
    )


def _parse_kernelsat(data: dict[str, Any], source: str, prefix: str) -> LabeledGraph:
    """kernelsat's snapshot JSON (`kernelsat.driver.commands.egraph.snapshot_json`)."""
    raw = data.get("nodes")
    if not isinstance(raw, list):
        raise EGraphFormatError(f"{source}: {prefix}nodes: expected an array, got {_kind(raw)}")
    if not raw:
        raise EGraphFormatError(f"{source}: {prefix}nodes: the e-graph has no nodes")
    owner: list[int] = []
    nodes: list[LabeledNode] = []
    costs: list[float] = []
    for i, node in enumerate(raw):
        where = f"{source}: {prefix}nodes[{i}]"
        if not isinstance(node, dict):
            raise EGraphFormatError(f"{where}: expected an object, got {_kind(node)}")
        for key in ("op", "class", "children"):
            if key not in node:
                raise EGraphFormatError(f'{where}: missing "{key}"')
        c = node["class"]
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise EGraphFormatError(f"{where}.class: expected a class number, got {_kind(c)}")
        children = node["children"]
        if not isinstance(children, list) or any(
            isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in children
        ):
            raise EGraphFormatError(f"{where}.children: expected an array of class numbers")
        if not isinstance(node["op"], str):
            raise EGraphFormatError(f"{where}.op: expected a string, got {_kind(node['op'])}")
        attrs = node.get("attrs", [])
        if not isinstance(attrs, list):
            raise EGraphFormatError(f"{where}.attrs: expected an array, got {_kind(attrs)}")
        scalars = [str(a) for a in attrs if not isinstance(a, list | dict)]
        nodes.append(LabeledNode(" ".join([node["op"], *scalars]), tuple(children)))
        owner.append(c)
        costs.append(_cost(node.get("cost", 1.0), f"{where}.cost"))
    n_classes = 1 + max([*owner, *(k for n in nodes for k in n.children)])
    mentioned = len(owner) + sum(len(n.children) for n in nodes)
    if n_classes > mentioned:  # numbers with gaps beyond any dense numbering
        raise EGraphFormatError(
            f"{source}: {prefix}nodes: class {n_classes - 1} with only {mentioned} class "
            "references: class numbers must be dense (0, 1, ...)"
        )
    members: list[list[int]] = [[] for _ in range(n_classes)]
    for n, c in enumerate(owner):
        members[c].append(n)
    root = data.get("root")
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < n_classes:
        raise EGraphFormatError(
            f"{source}: {prefix}root: expected a class number below {n_classes}, got {_kind(root)}"
        )
    class_ids = tuple(str(c) for c in range(n_classes))
    return LabeledGraph(
        tuple(nodes),
        np.array(owner, dtype=np.int64),
        tuple(tuple(m) for m in members),
        tuple(costs),
        tuple(str(n) for n in range(len(nodes))),
        class_ids,
        (root,),
        source,
        MappingProxyType({c: i for i, c in enumerate(class_ids)}),
    )


# -- extraction ------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphExtraction:
    """One extraction of every root of a `LabeledGraph`.

    - `choice`: class -> node (dense ids) for exactly the classes the roots need.
    - `tree_cost`: the sum over the roots of each one's cost as a tree (a shared
      sub-term counted once per use); `dag_cost`: every chosen node counted once.
    - `valid`: None, or why the choice is not a program (it always is; the check is
      independent of the extractor).
    - `status`, `gap`: how the extractor ended (`optimal`, `time-limit`, ...), and the
      ILP's relative gap when known. `seconds`: wall time of the whole extraction.
    """

    graph: LabeledGraph
    roots: tuple[int, ...]
    choice: Mapping[int, int]
    tree_cost: float
    dag_cost: float
    method: str
    status: str
    gap: float | None
    seconds: float
    invalid: str | None = None

    @property
    def valid(self) -> bool:
        return self.invalid is None

    def program(self, root: int | None = None, limit: int = 4000) -> str:
        """The extracted term of `root` (default: the first root) as an s-expression of
        op labels; past `limit` characters, its classes one per line instead
        (`c = (op child-classes...)`), children first, which stays linear in size."""
        start = self.roots[0] if root is None else root
        text = _sexpr(self.graph, self.choice, start, limit)
        return text if text is not None else self.listing([start])

    def listing(self, roots: Sequence[int] | None = None) -> str:
        """The chosen nodes, one class per line, children first."""
        order = _children_first(self.graph, self.choice, self.roots if roots is None else roots)
        lines = []
        for c in order:
            node = self.graph.nodes[self.choice[c]]
            kids = " ".join(_atom(self.graph.class_ids[k]) for k in node.children)
            body = f"({_atom(node.op)} {kids})" if kids else _atom(node.op)
            lines.append(f"{_atom(self.graph.class_ids[c])} = {body}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready summary (strict JSON: a cost that is not finite is null): roots,
        costs, status, validity, the choice by file ids."""
        g = self.graph
        return {
            "file": g.source,
            "method": self.method,
            "status": self.status,
            "gap": self.gap,
            "seconds": self.seconds,
            "roots": [g.class_ids[r] for r in self.roots],
            "tree_cost": _strict(self.tree_cost),
            "dag_cost": _strict(self.dag_cost),
            "valid": self.valid,
            "invalid": self.invalid,
            "n_nodes": g.n_nodes,
            "n_classes": g.n_classes,
            "chosen": {g.class_ids[c]: g.node_ids[n] for c, n in sorted(self.choice.items())},
        }


def _strict(value: float) -> float | None:
    """`value`, or None where strict JSON has no number for it (nan, inf)."""
    return value if math.isfinite(value) else None


def _atom(text: str) -> str:
    """An op label or id as one s-expression atom (quoted when it needs to be)."""
    plain = text and not any(ch.isspace() or ch in '()"' for ch in text)
    return text if plain else json.dumps(text, ensure_ascii=False)


def _sexpr(graph: LabeledGraph, choice: Mapping[int, int], root: int, limit: int) -> str | None:
    parts: list[str] = []
    size = 0
    stack: list[int | str] = [root]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            parts.append(item)
            size += len(item)
        else:
            node = graph.nodes[choice[item]]
            if not node.children:
                parts.append(_atom(node.op))
                size += len(parts[-1])
            else:
                parts.append("(" + _atom(node.op))
                size += len(parts[-1])
                stack.append(")")
                for k in reversed(node.children):
                    stack.append(k)
                    stack.append(" ")
        if size > limit:
            return None
    return "".join(parts)


def _children_first(
    graph: LabeledGraph, choice: Mapping[int, int], roots: Sequence[int]
) -> list[int]:
    order: list[int] = []
    seen: set[int] = set()
    for r in roots:
        if r in seen:
            continue
        seen.add(r)
        stack: list[tuple[int, int]] = [(r, 0)]
        while stack:
            c, i = stack[-1]
            kids = graph.nodes[choice[c]].children
            if i == len(kids):
                stack.pop()
                order.append(c)
                continue
            stack[-1] = (c, i + 1)
            if kids[i] not in seen:
                seen.add(kids[i])
                stack.append((kids[i], 0))
    return order


def extract_graph(
    graph: LabeledGraph,
    method: str | Extractor = "ilp",
    roots: Sequence[int] | None = None,
    costs: Sequence[float] | None = None,
    **options: object,
) -> GraphExtraction:
    """Extract every root in `roots` (default: the graph's) with one shared choice.

    `method` is an extractor name of `kernelsat.extract.EXTRACTORS` (options go to its
    constructor: `time_limit=` for `ilp`...) or an extractor object; `costs` default to
    the file's node costs. The first pick is returned, checked."""
    wanted = tuple(dict.fromkeys(graph.roots if roots is None else roots))
    if not wanted:
        raise ExtractionError(
            f"{graph.source}: no root e-class to extract (root_eclasses is empty): "
            "name one (`--root CLASS`)"
        )
    for r in wanted:
        if not 0 <= r < graph.n_classes:
            raise ExtractionError(f"{graph.source}: class {r} does not exist")
    extractor = make_extractor(method, **options) if isinstance(method, str) else method
    node_costs = graph.costs if costs is None else tuple(float(c) for c in costs)
    if len(node_costs) != graph.n_nodes:
        raise ExtractionError(f"{len(node_costs)} node costs for {graph.n_nodes} nodes")
    start = time.perf_counter()
    target, root = (graph, wanted[0]) if len(wanted) == 1 else graph.joined(wanted)
    try:
        picks = extractor.choose(target, root, node_costs + (0.0,) * (target is not graph))
    except ExtractionError as e:
        raise ExtractionError(f"{graph.source}: {_which_root(graph, wanted) or e}") from None
    seconds = time.perf_counter() - start
    if not picks:
        raise ExtractionError(f"{extractor.name} returned no program")
    pick = picks[0]
    choice = {c: n for c, n in pick.choice.items() if c < graph.n_classes}
    invalid = _why_invalid(target, root, pick.choice)
    tree = dag = math.nan
    if invalid is None:
        tree = sum(choice_tree_cost(graph, r, choice, node_costs) for r in wanted)
        dag = choice_dag_cost(target, root, pick.choice, (*node_costs, 0.0))
    return GraphExtraction(
        graph, wanted, MappingProxyType(choice), tree, dag, extractor.name,
        pick.status, pick.gap, seconds, invalid,
    )


def _which_root(graph: LabeledGraph, roots: Sequence[int]) -> str | None:
    """Why the first root with no program has none, by its id in the file; None if every
    root has one."""
    joined, top = graph.joined(roots)
    done = settle(joined, top, tree_score(joined, [0.0] * joined.n_nodes), full=True).best
    for r in roots:
        if r not in done:
            return no_extraction(graph, r, graph.class_ids[r])
    return None


def _why_invalid(graph: LabeledGraph, root: int, choice: Mapping[int, int]) -> str | None:
    """None if `choice` is exactly the classes one acyclic program from `root` needs,
    each with a node of its own class; else what is wrong."""
    try:
        needed = check_extraction(graph, root, choice)
    except ExtractionError as e:
        return str(e)
    extra = sorted(set(choice) - set(needed))
    if extra:
        return f"nodes chosen for classes the program does not use: {extra[:10]}"
    return None
