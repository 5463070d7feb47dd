"""kernelsat.extract: programs out of a saturated e-graph.

One protocol (`Extractor.extract(snapshot, root, cost) -> list[Extraction]`, and
`Extractor.choose(graph, root, costs) -> list[Pick]` on any `Graph`), seven extractors
in one registry (`EXTRACTORS`), and the cost models they optimize:

| name | extractor | optimizes | guarantee |
| --- | --- | --- | --- |
| `greedy-tree` | `GreedyTree` | tree cost | optimal for tree cost |
| `greedy-dag` | `GreedyDag` | DAG cost | never worse than `greedy-tree` on DAG cost |
| `ilp` | `ILP` | DAG cost | optimal within its time limit; never worse than `greedy-dag` (1) |
| `sample` | `Sampler` | — | distinct acyclic programs, cheap ones likelier |
| `local` | `LocalSearch` | a term cost (else DAG cost) | never worse than its greedy start |
| `online` | `OnlineGreedy` | a fixed per-op preference (online reductions) | snapshots only |
| `rl` | `RLExtractor` | the learned policy | snapshots only |

(1) than `greedy-tree` if the time limit cut the greedy DAG pass short.

Every extraction is acyclic and class-correct (`check_extraction`). Which of an
extracted program's reused values are stored (kernel boundaries) is chosen afterwards by
a whole-program cost (`kernelsat.extract.materialize`: `store_points`, `materializations`,
the partial-fusion set `partial_fusion`); `optimize` does it for every extraction. E-graphs of other
tools (egglog's JSON serialization, extraction-gym) load with
`kernelsat.extract.json_egraph.load_egraph` and extract with `extract_graph`.

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

from collections.abc import Callable

from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract.base import (
    ASTSize,
    Cost,
    CostModel,
    Extraction,
    ExtractionError,
    Extractor,
    Graph,
    OpCost,
    Pick,
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
from kernelsat.extract.local import LocalSearch
from kernelsat.extract.materialize import (
    Materialized,
    materializations,
    partial_fusion,
    store_points,
    with_stores,
)
from kernelsat.extract.online import OnlineGreedy
from kernelsat.extract.random_extract import random_choice, random_extract
from kernelsat.extract.rl import RLExtractor
from kernelsat.extract.sample import Sampler

EXTRACTORS: dict[str, Callable[..., Extractor]] = {
    "greedy-tree": GreedyTree,
    "greedy-dag": GreedyDag,
    "ilp": ILP,
    "sample": Sampler,
    "local": LocalSearch,
    "online": OnlineGreedy,
    "rl": RLExtractor,
}
"""Every extractor by name, the one registry (`optimize --extract`, `kernelsat extract` and
`extract` read it); keyword arguments of `extract` go to their constructors."""

GRAPH_EXTRACTORS: tuple[str, ...] = tuple(
    name for name, cls in EXTRACTORS.items() if not getattr(cls, "reads_ops", False))
"""The extractors whose `choose` reads only the graph and its costs: they extract foreign
e-graphs too (`kernelsat extract`). The others read kernelsat ops (`reads_ops`)."""

EXTRACTOR_GROUPS: dict[str, tuple[str, ...]] = {
    **{name: (name,) for name in EXTRACTORS},
    "greedy": ("greedy-tree", "greedy-dag"),
    "all": tuple(name for name in EXTRACTORS if name != "rl"),
}
"""The choices of `optimize --extract`: each extractor, both greedy ones, or all but the
learned policy (`rl`, chosen by name only)."""


def make_extractor(method: str, **options: object) -> Extractor:
    """The extractor named `method`, built with `options`; a clear `ValueError` for an
    unknown name or an option it does not take."""
    if method not in EXTRACTORS:
        raise ValueError(f"unknown extractor {method!r}; choose one of {sorted(EXTRACTORS)}")
    try:
        return EXTRACTORS[method](**options)
    except TypeError as e:
        raise ValueError(f"extractor {method!r}: {e}") from None


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
    extractor = make_extractor(method, **options)
    start = snapshot.root if root is None else root
    return extractor.extract(snapshot, start, ASTSize() if cost is None else cost)


__all__ = [
    "EXTRACTORS",
    "EXTRACTOR_GROUPS",
    "GRAPH_EXTRACTORS",
    "ILP",
    "ASTSize",
    "Cost",
    "CostModel",
    "Extraction",
    "ExtractionError",
    "Extractor",
    "Graph",
    "GreedyDag",
    "GreedyTree",
    "LocalSearch",
    "Materialized",
    "OnlineGreedy",
    "OpCost",
    "Pick",
    "RLExtractor",
    "Rescore",
    "RooflineCost",
    "Sampler",
    "TermCost",
    "check_extraction",
    "dag_cost",
    "extract",
    "make_extractor",
    "materializations",
    "node_flops_bytes",
    "partial_fusion",
    "random_choice",
    "random_extract",
    "roofline_rescore",
    "store_points",
    "tree_cost",
    "with_stores",
]
