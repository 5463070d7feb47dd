"""kernelsat.hardware: targets, the timing protocol, the measurement cache, the roofline
cost model and knob search.

Public entry points:

- `get_target(name)` -> `Target` ("cpu"/"c", "numpy", "cuda" (the default GPU), "h100",
  "h200", "b200", "a100", "mi300x"); `target_names()`
- `measure(exe, inputs, out_shape, reference, timing)` -> `Measurement`; `TimingProtocol`
  (the settings of a measurement) and its named presets `TIMING`
- `MeasureCache(path).get/put/stats`
- `estimate(lowered_or_stats, target)`, `estimate_term(term, target)`, `rank_correlation`
- `search(table, evaluate, ...)`, `tune(lowered, target, ...)` -> `SearchResult`
"""

from kernelsat.hardware.cache import MeasureCache, knobs_key
from kernelsat.hardware.cost import (
    KernelStats,
    estimate,
    estimate_term,
    kernel_time,
    rank_correlation,
    roofline_fraction,
    stats_of_term,
)
from kernelsat.hardware.knobs import SearchResult, Trial, knob_table, search, tune
from kernelsat.hardware.measure import (
    ERROR_BOUNDS,
    TIMING,
    CodegenRecipe,
    Measurement,
    TimingProtocol,
    check_output,
    measure,
    random_inputs,
)
from kernelsat.hardware.targets import Target, get_target, target_names

__all__ = [
    "ERROR_BOUNDS",
    "TIMING",
    "CodegenRecipe",
    "KernelStats",
    "MeasureCache",
    "Measurement",
    "SearchResult",
    "Target",
    "TimingProtocol",
    "Trial",
    "check_output",
    "estimate",
    "estimate_term",
    "get_target",
    "kernel_time",
    "knob_table",
    "knobs_key",
    "measure",
    "random_inputs",
    "rank_correlation",
    "roofline_fraction",
    "search",
    "stats_of_term",
    "target_names",
    "tune",
]
