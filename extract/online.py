"""The `online` extractor's cost model: a per-node table that makes single-pass online
reductions cheap and materialization and the multi-pass expansions they replace dear.

A heuristic that proposes candidates (the optimize pipeline runs `greedy-tree` under
`online_preference` and labels the result `online`); measurement decides.

>>> from kernelsat.egraph.snapshot import ENode, Snapshot
>>> from kernelsat.ops import Op
>>> import numpy as np
>>> snap = Snapshot(nodes=[ENode(Op.CONST, (0.0,), ()), ENode(Op.EXP, (), (0,))],
...                 node_class=np.array([0, 1]), classes=[[0], [1]], class_shape=[{}, {}], root=1)
>>> online_preference(snap, 1), online_preference(snap, 0)
(5.0, 2.0)
"""

from __future__ import annotations

from kernelsat.egraph.snapshot import Snapshot
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
