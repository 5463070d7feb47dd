"""kernelsat.extract: programs out of a saturated e-graph.

One protocol (`Extractor.extract(snapshot, root, cost) -> list[Extraction]`), four
extractors, and the cost models they optimize:

| name | extractor | optimizes | guarantee |
| --- | --- | --- | --- |
| `greedy-tree` | `GreedyTree` | tree cost | optimal for tree cost |
| `greedy-dag` | `GreedyDag` | DAG cost | never worse than `greedy-tree` on DAG cost |
| `ilp` | `ILP` | DAG cost | optimal within its time limit; never worse than `greedy-dag` |
| `sample` | `Sampler` | — | distinct acyclic programs, cheap ones likelier |

Every extraction is acyclic and class-correct (`check_extraction`).

>>> from kernelsat.egraph.snapshot import ENode, Snapshot
>>> from kernelsat.ops import Op
>>> import numpy as np
>>> snap = Snapshot(  # class 1 holds exp(c) and a cheaper leaf
...     nodes=[ENode(Op.CONST, (0.0,), ()), ENode(Op.EXP, (), (0,)), ENode(Op.CONST, (1.0,), ())],
...     node_class=np.array([0, 1, 1]), classes=[[0], [1, 2]], class_shape=[{}, {}], root=1)
>>> [str(e.term) for e in extract(snap, "ilp")]
['(Const 1.0)']
"""

from __future__ import annotations

from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract.base import (
    ASTSize,
    Cost,
    CostModel,
    Extraction,
    ExtractionError,
    Extractor,
    OpCost,
    Rescore,
    RooflineCost,
    TermCost,
    check_extraction,
    dag_cost,
    node_flops_bytes,
    roofline_rescore,
    tree_cost,
)
from kernelsat.extract.greedy import GreedyDag, GreedyTree
from kernelsat.extract.ilp import ILP
from kernelsat.extract.sample import Sampler

EXTRACTORS: dict[str, type[GreedyTree] | type[GreedyDag] | type[ILP] | type[Sampler]] = {
    "greedy-tree": GreedyTree,
    "greedy-dag": GreedyDag,
    "ilp": ILP,
    "sample": Sampler,
}
"""Extractor classes by name; keyword arguments of `extract` go to their constructors."""


def extract(
    snapshot: Snapshot,
    method: str = "ilp",
    cost: Cost | None = None,
    root: int | None = None,
    **options: object,
) -> list[Extraction]:
    """Extract programs of `root` (default: the snapshot's root) with the named method.

    `cost` defaults to AST size; `options` configure the extractor (`time_limit=` for
    `ilp`, `n=`, `temperature=`, `seed=` for `sample`, `max_work=` for the DAG ones)."""
    if method not in EXTRACTORS:
        raise ValueError(f"unknown extractor {method!r}; choose one of {sorted(EXTRACTORS)}")
    extractor: Extractor = EXTRACTORS[method](**options)
    start = snapshot.root if root is None else root
    return extractor.extract(snapshot, start, ASTSize() if cost is None else cost)


__all__ = [
    "EXTRACTORS",
    "ILP",
    "ASTSize",
    "Cost",
    "CostModel",
    "Extraction",
    "ExtractionError",
    "Extractor",
    "GreedyDag",
    "GreedyTree",
    "OpCost",
    "Rescore",
    "RooflineCost",
    "Sampler",
    "TermCost",
    "check_extraction",
    "dag_cost",
    "extract",
    "node_flops_bytes",
    "roofline_rescore",
    "tree_cost",
]
