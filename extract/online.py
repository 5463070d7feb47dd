"""The `online` extractor: `greedy-tree` under a per-node table that makes single-pass
online reductions cheap and materialization and the multi-pass expansions they replace
dear, whatever cost it is given (`OnlineGreedy`).

A heuristic that proposes candidates; measurement decides. It reads kernelsat's ops, so
it extracts snapshots, not foreign e-graphs.

>>> from kernelsat.egraph.snapshot import ENode, Snapshot
>>> from kernelsat.ops import Op
>>> import numpy as np
>>> snap = Snapshot(nodes=[ENode(Op.CONST, (0.0,), ()), ENode(Op.EXP, (), (0,))],
...                 node_class=np.array([0, 1]), classes=[[0], [1]], class_shape=[{}, {}], root=1)
>>> online_preference(snap, 1), online_preference(snap, 0)
(5.0, 2.0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract.base import Cost, Extraction, ExtractionError, Graph, Pick, node_costs
from kernelsat.extract.greedy import GreedyTree
from kernelsat.ops import ONLINE, Op

ONLINE_COST: dict[Op, float] = {
    Op.SOFTMAXAVG: 1.0, Op.LSE: 1.0, Op.STORE: 1000.0, Op.SUM: 20.0, Op.RMAX: 20.0,
    Op.DOT: 20.0, Op.EXP: 5.0, Op.DIV: 5.0,
}
"""Per-node costs of the `online` extractor: single-pass online reductions cheap,
materialization and the multi-pass expansions they replace dear."""


def online_preference(snapshot: Snapshot, node: int) -> float:
    """The `online` extractor's cost (a `CostModel`): prefer `LSE`/`SoftmaxAvg` over a
    split axis (blocked, FlashAttention-shaped), then over a whole axis, and no `Store`.
    A heuristic that proposes candidates; measurement decides."""
    n = snapshot.nodes[node]
    if n.op in ONLINE and "/" not in str(n.attrs[0]):
        return 100.0
    return ONLINE_COST.get(n.op, 2.0)


@dataclass(frozen=True)
class OnlineGreedy:
    """`greedy-tree` under `online_preference`; the cost it is given is not used (the
    pipeline ranks every candidate by its own estimate afterwards)."""

    name: str = "online"
    reads_ops: ClassVar[bool] = True  # `online_preference` reads the snapshot's ops

    def choose(self, graph: Graph, root: int, costs: Sequence[float]) -> list[Pick]:
        if not isinstance(graph, Snapshot):
            raise ExtractionError("the online extractor reads kernelsat ops: it extracts "
                                  "snapshots, not foreign e-graphs")
        return GreedyTree().choose(graph, root, node_costs(graph, online_preference))

    def extract(self, snapshot: Snapshot, root: int, cost: Cost) -> list[Extraction]:
        found = GreedyTree().extract(snapshot, root, online_preference)
        return [replace(e, method=self.name) for e in found]
