"""Pieces the benchmarks in bench/ share (suite.py, peers.py, cliff.py): which specs,
a spec at given sizes, timing kernelsat's program and numpy's by the same protocol
(kernelsat.hardware.measure), the roofline figure, and the small arithmetic of tables.

Import it with bench/ on sys.path (each script puts its own folder there).
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kernelsat.codegen import KnobList, build, lower
from kernelsat.hardware.bench import out_shape, reference
from kernelsat.hardware.cost import estimate
from kernelsat.hardware.knobs import codegen_knobs
from kernelsat.hardware.measure import Measurement, measure
from kernelsat.hardware.targets import Target, get_target
from kernelsat.inputs import random_inputs
from kernelsat.ir import Term
from kernelsat.program import Program
from kernelsat.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"


def spec_paths(only: Sequence[str] | None = None) -> list[Path]:
    """specs/*.ks sorted by name, or the ones named in `only` (file stems, in that order);
    an unknown name raises ValueError listing the known ones."""
    paths = {p.stem: p for p in sorted(SPECS.glob("*.ks"))}
    if not only:
        return list(paths.values())
    unknown = [n for n in only if n not in paths]
    if unknown:
        raise ValueError(f"unknown spec {', '.join(unknown)}; the specs are "
                         f"{', '.join(paths)}")
    return [paths[n] for n in dict.fromkeys(only)]


def load_program(path: Path, overrides: Mapping[str, int]) -> Program:
    """The spec at `path` with those of `overrides` it declares (the rest are ignored, so
    one `-p N=512` applies to every spec that has an N)."""
    declared = load_spec(str(path)).params
    return load_spec(str(path), {k: v for k, v in overrides.items() if k in declared})


def sizes(program: Program) -> str:
    """"M=4096,N=1024": the program's parameters as a table cell."""
    return ",".join(f"{k}={v}" for k, v in program.params.items())


def inputs_and_reference(program: Program, seed: int = 0
                         ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """float32 random inputs (kernelsat.inputs: never zero, one-hot where declared) and
    the float64 reference computed from exactly those float32 values."""
    inputs = {k: v.astype(np.float32) if v.dtype.kind == "f" else v  # labels stay int32
              for k, v in random_inputs(program, seed=seed).items()}
    return inputs, reference(program.term, program.out_axes, inputs)


def timed_optimize(program: Program, **options: Any) -> tuple[Any, float]:
    """`optimize(program, "c", **options)` (its defaults otherwise) and its wall seconds."""
    from kernelsat.driver.pipeline import optimize

    t0 = time.perf_counter()
    result = optimize(program, "c", **options)
    return result, time.perf_counter() - t0


def time_program(term: Term, out_axes: Sequence[str], inputs: Mapping[str, np.ndarray],
                 ref: np.ndarray, target: Target | str = "c",
                 knobs: KnobList | Mapping[str, Mapping[str, Any]] = None,
                 **measure_kw: Any) -> Measurement:
    """Lower, build (for `target`, with `knobs`: codegen's list, or a setting by kernel
    name as optimize's `Candidate.knobs`; None: codegen's defaults) and time a program by
    the protocol (`measure_kw`: its overrides, `flush_cache`)."""
    hw = get_target(target)
    lowered = lower(term, tuple(out_axes))
    if isinstance(knobs, Mapping):
        knobs = codegen_knobs(lowered, knobs)
    exe = build(lowered, hw.backend, knobs, arch=hw.arch, cflags=hw.compile_flags)
    return measure(exe, inputs, out_shape(term, tuple(out_axes)), ref, **measure_kw)


def time_numpy(program: Program, inputs: Mapping[str, np.ndarray], ref: np.ndarray,
               **measure_kw: Any) -> Measurement | None:
    """The numpy a user would write for the spec (bench/eager_vs_numpy.NUMPY), timed by
    the protocol; None when there is none for this spec."""
    from eager_vs_numpy import NUMPY, time_function

    fn = NUMPY.get(program.name)
    if fn is None:
        return None
    shape = out_shape(program.term, program.out_axes)
    return time_function(fn, inputs, program.params, shape, ref, dict, np.asarray, **measure_kw)


def roofline_seconds(term: Term, out_axes: Sequence[str]) -> float:
    """The roofline time (kernelsat.hardware.cost.estimate) of the lowered program on the
    detected CPU, its figures probed."""
    return estimate(lower(term, tuple(out_axes)), get_target("cpu", probe=True))


def geomean(values: Iterable[float]) -> float:
    """The geometric mean of the finite positive values (NaN when there are none)."""
    xs = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in xs) / len(xs)) if xs else math.nan


def ms(seconds: float) -> str:
    """Milliseconds to 3 significant digits; "—" for NaN or inf."""
    return f"{seconds * 1e3:.3g}" if math.isfinite(seconds) else "—"
