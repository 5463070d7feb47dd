"""The saturated e-graph as a plain Python structure, for extractors and policies.

Classes and nodes are dense integers. A node has an op, attributes (as in `Term`)
and child classes. Everything an extractor needs is here; nothing refers to egglog.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kernelsat.ir import Attr, Term, postorder
from kernelsat.ops import Op


@dataclass(frozen=True, slots=True)
class ENode:
    """One e-node: op, attributes and child e-classes."""

    op: Op
    attrs: tuple[Attr, ...]
    children: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Firing:
    """One recorded rule firing: the rule, the e-class its left side matched at, and the
    bindings of its variables (term variables -> e-class id; axis, factor and constant
    variables -> their value). `direction` says which side egglog matched ("forward":
    the left side; "backward": the right side); the bindings cover both sides either way."""

    rule: str
    root: int
    bindings: Mapping[str, int | str | float]
    term_vars: frozenset[str] = frozenset()
    direction: str = "forward"


@dataclass
class Snapshot:
    """An e-graph read out of egglog.

    - `nodes[i]`: node i; `node_class[i]`: its class.
    - `classes[c]`: the node ids of class c.
    - `class_shape[c]`: the shape (axis -> size) shared by every term of class c.
    - `root`: the class of the spec term.
    - `firings`: the firing log, canonicalized to the final class ids.
    """

    nodes: list[ENode]
    node_class: np.ndarray
    classes: list[list[int]]
    class_shape: list[Mapping[str, int]]
    root: int
    firings: Sequence[Firing] = field(default_factory=list)

    @property
    def n_classes(self) -> int:
        return len(self.classes)

    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    def label(self, node: int) -> str:
        """Node `node`'s op and scalar attributes, for messages: `Const 2.0`, `Sum i`."""
        n = self.nodes[node]
        attrs = " ".join(str(a) for a in n.attrs if not isinstance(a, tuple))
        return f"{n.op.value} {attrs}".rstrip()

    def storable(self, c: int) -> bool:
        """Whether class c holds `Store(c)` (a materialization the rules proved optional)."""
        return any(
            self.nodes[n].op is Op.STORE and self.nodes[n].children == (c,) for n in self.classes[c]
        )

    def classes_of(self, root: Term) -> dict[Term, int]:
        """The class of every node of `root` that the e-graph holds, matched bottom-up by
        (op, attributes, child classes); nodes it does not hold (and their parents) are
        left out."""
        index = {(n.op, n.attrs, n.children): int(self.node_class[i])
                 for i, n in enumerate(self.nodes)}
        found: dict[Term, int] = {}
        for t in postorder(root):
            kids = tuple(found.get(a, -1) for a in t.args)
            c = index.get((t.op, t.attrs, kids), -1) if -1 not in kids else -1
            if c >= 0:
                found[t] = c
        return found

    def term(
        self, choice: Mapping[int, int], root: int | None = None, stored: Collection[int] = ()
    ) -> Term:
        """The term that picks node `choice[c]` in every class c reachable from `root`,
        wrapped in `Store` where c is in `stored` (each such class must be `storable`: a
        `Store` node of a class whose child is the class itself can never be chosen by an
        acyclic extraction, so materialization is a separate choice).
        Raises ValueError if the choice is cyclic or misses a class."""
        for c in stored:
            if not self.storable(c):
                raise ValueError(f"class {c} has no Store(itself) node")
        start = self.root if root is None else root
        built: dict[int, Term] = {}
        on_path: set[int] = set()
        stack: list[tuple[int, bool]] = [(start, False)]
        while stack:
            c, expanded = stack.pop()
            if c in built:
                continue
            if c not in choice:
                raise ValueError(f"no node chosen for class {c}")
            node = self.nodes[choice[c]]
            if int(self.node_class[choice[c]]) != c:
                raise ValueError(f"node {choice[c]} is not in class {c}")
            if expanded:
                on_path.discard(c)
                t = Term(node.op, tuple(built[k] for k in node.children), node.attrs)
                built[c] = Term(Op.STORE, (t,)) if c in stored and t.op is not Op.STORE else t
                continue
            if c in on_path:
                raise ValueError(f"cyclic choice through class {c}")
            on_path.add(c)
            stack.append((c, True))
            for k in reversed(node.children):
                if k not in built:
                    if k in on_path:
                        raise ValueError(f"cyclic choice through class {k}")
                    stack.append((k, False))
        return built[start]
