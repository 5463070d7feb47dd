"""Reading a saturated egglog e-graph back into a `Snapshot` with its firing log.

egglog serializes the e-graph as JSON: every row of every table is a node with an op
(the function's name, or a primitive's printed value), child node ids and an e-class
id (`"Term-17"`). Only `Term` rows become `ENode`s; the analysis tables give the class
shapes, `Root` gives the root class and the `Fired_*` relations give the firing log.

Class ids: the `Term` e-classes, sorted by egglog's numeric id, are numbered 0, 1, ...
(`Readout.class_ids` holds this mapping explicitly).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from egglog import bindings

from kernelsat.egraph.render import ATTR_SORTS, OP_OF_CONSTRUCTOR, RenderedRule, Sort
from kernelsat.egraph.snapshot import ENode, Firing, Snapshot
from kernelsat.ir import Attr, Term
from kernelsat.ops import Op


class ReadoutError(RuntimeError):
    """The serialized e-graph is not what the renderer produced."""


@dataclass(frozen=True)
class Readout:
    """A snapshot and the explicit map from egglog e-class ids to its dense class ids."""

    snapshot: Snapshot
    class_ids: Mapping[str, int]


def _eclass_number(eclass: str) -> int:
    return int(eclass.rsplit("-", 1)[1])


def _primitive(text: str, sort: Sort) -> str | int | float:
    match sort:
        case "String":
            if len(text) >= 2 and text[0] == text[-1] == '"' and "\\" not in text:
                return text[1:-1]
            return str(json.loads(text))
        case "i64":
            return int(text)
        case "f64":
            return float(text) + 0.0
        case "Term":
            raise ReadoutError(f"{text!r} is a term, not a primitive")
    raise AssertionError(sort)


class _Graph:
    """The serialized JSON with lookups by node id and by e-class."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self.nodes: Mapping[str, Mapping[str, Any]] = data["nodes"]
        self._values: dict[tuple[str, Sort], str | int | float] = {}
        self.value_of_class: dict[str, str] = {}
        for n in self.nodes.values():
            if not n["children"] or n["op"] == "set-of":
                self.value_of_class.setdefault(n["eclass"], n["op"])
        self.set_members: dict[str, list[str]] = {
            n["eclass"]: [self.nodes[k]["op"] for k in n["children"]]
            for n in self.nodes.values()
            if n["op"] == "set-of"
        }

    def eclass(self, node_id: str) -> str:
        return str(self.nodes[node_id]["eclass"])

    def value(self, node_id: str, sort: Sort) -> str | int | float:
        key = (node_id, sort)
        hit = self._values.get(key)
        if hit is None:
            hit = self._values[key] = _primitive(str(self.nodes[node_id]["op"]), sort)
        return hit

    def rows(self, op: str) -> list[Mapping[str, Any]]:
        return [n for n in self.nodes.values() if n["op"] == op]


def read_egraph(
    egraph: bindings.EGraph,
    inputs: Mapping[str, Term],
    rules: Sequence[RenderedRule],
) -> Readout:
    """Serialize `egraph` and read it into a `Snapshot` (see the module docstring)."""
    serialized = egraph.serialize([])
    if serialized.truncated_functions or serialized.discarded_functions:
        raise ReadoutError(
            f"egglog truncated {serialized.truncated_functions} / discarded "
            f"{serialized.discarded_functions} while serializing"
        )
    return read_json(json.loads(serialized.to_json()), inputs, rules)


def read_json(
    data: Mapping[str, Any], inputs: Mapping[str, Term], rules: Sequence[RenderedRule]
) -> Readout:
    """`read_egraph` on already parsed serialization JSON."""
    g = _Graph(data)
    term_nodes = {
        nid: n
        for nid, n in g.nodes.items()
        if n["op"] in OP_OF_CONSTRUCTOR and str(n["eclass"]).startswith("Term-")
    }
    eclasses = sorted({str(n["eclass"]) for n in term_nodes.values()}, key=_eclass_number)
    class_ids = {e: i for i, e in enumerate(eclasses)}

    def cls(node_id: str) -> int:
        return class_ids[g.eclass(node_id)]

    nodes: list[ENode] = []
    node_class: list[int] = []
    seen: set[tuple[Any, ...]] = set()
    for nid in sorted(term_nodes, key=lambda k: (_eclass_number(g.eclass(k)), k)):
        node = _read_node(g, term_nodes[nid], inputs, cls)
        key = (node.op, node.attrs, node.children)
        if key in seen:
            continue
        seen.add(key)
        nodes.append(node)
        node_class.append(cls(nid))
    classes: list[list[int]] = [[] for _ in eclasses]
    for i, c in enumerate(node_class):
        classes[c].append(i)
    snapshot = Snapshot(
        nodes=nodes,
        node_class=np.asarray(node_class, dtype=np.int64),
        classes=classes,
        class_shape=_class_shapes(g, class_ids),
        root=_root(g, cls),
        firings=_firings(g, rules, cls),
    )
    return Readout(snapshot, class_ids)


def _read_node(g: _Graph, n: Mapping[str, Any], inputs: Mapping[str, Term], cls: Any) -> ENode:
    op = OP_OF_CONSTRUCTOR[n["op"]]
    sorts = ATTR_SORTS.get(op, ())
    kids: list[str] = list(n["children"])
    raw = [g.value(k, s) for k, s in zip(kids[: len(sorts)], sorts, strict=True)]
    children = tuple(cls(k) for k in kids[len(sorts) :])
    attrs: tuple[Attr, ...]
    if op is Op.IN:
        key = str(raw[0])
        if key not in inputs:
            raise ReadoutError(f"unknown input {key!r}")
        attrs = inputs[key].attrs
    else:
        attrs = tuple(raw)
    return ENode(op, attrs, children)


def _class_shapes(g: _Graph, class_ids: Mapping[str, int]) -> list[Mapping[str, int]]:
    sizes: dict[str, int] = {}
    for row in g.rows("AxSize"):
        axis = str(g.value(row["children"][0], "String"))
        sizes[axis] = int(g.value_of_class[row["eclass"]])
    shapes: list[Mapping[str, int] | None] = [None] * len(class_ids)
    for row in g.rows("Shape"):
        c = class_ids[g.eclass(row["children"][0])]
        axes = [str(_primitive(t, "String")) for t in g.set_members.get(row["eclass"], [])]
        shapes[c] = {a: sizes[a] for a in sorted(axes)}
    missing = [c for c, s in enumerate(shapes) if s is None]
    if missing:
        raise ReadoutError(f"no shape for classes {missing[:10]} (analysis not saturated?)")
    return shapes  # type: ignore[return-value]


def _root(g: _Graph, cls: Any) -> int:
    roots = {cls(row["children"][0]) for row in g.rows("Root")}
    if len(roots) != 1:
        raise ReadoutError(f"expected one root class, found {sorted(roots)}")
    return roots.pop()


def _firings(g: _Graph, rules: Sequence[RenderedRule], cls: Any) -> list[Firing]:
    by_relation = {r.relation: (r, r.term_vars) for r in rules}
    out: dict[tuple[Any, ...], Firing] = {}
    for n in g.nodes.values():
        hit = by_relation.get(n["op"])
        if hit is None:
            continue
        r, term_vars = hit
        root, *values = n["children"]
        decoded = tuple(
            cls(v) if sort == "Term" else g.value(v, sort)
            for sort, v in zip(r.var_sorts, values, strict=True)
        )
        # rows that canonicalization made equal are one firing
        key = (r.rule, r.direction, cls(root), decoded)
        if key not in out:
            out[key] = Firing(
                r.rule, key[2], dict(zip(r.var_names, decoded, strict=True)), term_vars, r.direction
            )
    return [out[k] for k in sorted(out, key=lambda k: (k[0], k[1], k[2], repr(k[3])))]
