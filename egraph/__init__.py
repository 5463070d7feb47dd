"""kernelsat.egraph: rendering IR + rules to egglog, saturation, snapshots, random extraction.

Public entry points: `saturate` (-> `SaturationResult`, whose `snapshot` is the e-graph
with its firing log) and `random_extract`.
"""

from kernelsat.egraph.random_extract import random_choice, random_extract
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
    "random_choice",
    "random_extract",
    "saturate",
]
