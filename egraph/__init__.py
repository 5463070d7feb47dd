"""kernelsat.egraph: rendering IR + rules to egglog, saturation, snapshots.

Public entry point: `saturate` (-> `SaturationResult`, whose `snapshot` is the e-graph
with its firing log). Extractors, `random_extract` among them, are in `kernelsat.extract`;
explanations (proof steps from the firing log) in `kernelsat.proofs.explain`.
"""

from kernelsat.egraph.readout import Readout, ReadoutError
from kernelsat.egraph.saturate import (
    IterationStats,
    SaturationResult,
    StageReport,
    StopReason,
    saturate,
)
from kernelsat.egraph.snapshot import ENode, Firing, Snapshot

__all__ = [
    "ENode",
    "Firing",
    "IterationStats",
    "Readout",
    "ReadoutError",
    "SaturationResult",
    "Snapshot",
    "StageReport",
    "StopReason",
    "saturate",
]
