"""Random extraction: a uniformly chosen acyclic node per class.

A depth-first walk from the root picks, in each class, a node chosen uniformly among
those with no child class on the current path (the classes being resolved above it);
if every child choice below it fails, it tries the class's other nodes in random
order. A class resolved once keeps its node, so the result is one node per class
(a DAG) and never cyclic: a resolved class's subterm contains no class that was on
the path when it was resolved, and those are never resolved later.
"""

from __future__ import annotations

import random
import sys

from kernelsat.egraph.snapshot import Snapshot
from kernelsat.ir import Term


class ExtractionError(RuntimeError):
    """No acyclic term exists below a class."""


def random_choice(
    snapshot: Snapshot, rng: random.Random, root: int | None = None
) -> dict[int, int]:
    """A random acyclic choice (class -> node id) covering every class reachable from `root`."""
    start = snapshot.root if root is None else root
    chosen: dict[int, int] = {}
    on_path: set[int] = set()

    def resolve(c: int) -> bool:
        on_path.add(c)
        candidates = [
            n
            for n in snapshot.classes[c]
            if not any(k in on_path for k in snapshot.nodes[n].children)
        ]
        rng.shuffle(candidates)
        for n in candidates:
            if all(
                k in chosen or (k not in on_path and resolve(k)) for k in snapshot.nodes[n].children
            ):
                chosen[c] = n
                break
        on_path.discard(c)
        return c in chosen

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * snapshot.n_classes + 1000))
    try:
        if not resolve(start):
            raise ExtractionError(f"no acyclic term in class {start}")
    finally:
        sys.setrecursionlimit(limit)
    return chosen


def random_extract(snapshot: Snapshot, rng: random.Random, root: int | None = None) -> Term:
    """A random term of class `root` (default: the snapshot's root)."""
    return snapshot.term(random_choice(snapshot, rng, root), root)
