"""Measurement jobs and the evaluation backend interface.

A `Job` is self-contained and picklable: the spec's term (for the float64 reference),
the candidate program, the output layout, the input declarations (inputs are drawn
on the worker from the seed), the target and the knob budget. `run_job` lowers,
builds, knob-searches and measures it through the measurement cache, keyed by the
worker's own target fingerprint. A backend runs many jobs; `LocalBackend` runs them
one at a time on this machine (parallel timing on two cores corrupts the numbers).
"""

from __future__ import annotations

import hashlib
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class Job:
    """One program to measure on one target."""

    spec: str  # s-expression of the spec term: the reference
    program: str  # s-expression of the candidate
    out_axes: tuple[str, ...]
    inputs: tuple[Any, ...]  # kernelsat.program.InputDecl
    target: str = "c"  # codegen backend: "c" or "numpy"
    knob_budget: int = 4
    seed: int = 0
    min_runs: int = 5
    min_seconds: float = 0.1
    timeout_s: float = 300.0

    @property
    def key(self) -> str:
        text = "|".join([self.spec, self.program, ",".join(self.out_axes), self.target,
                         str(self.knob_budget), str(self.seed)])
        return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass
class JobResult:
    """What came back: a measurement (or a failure), the best knobs, the source."""

    job: str
    ok: bool
    median: float = float("inf")
    q1: float = float("inf")
    q3: float = float("inf")
    rel_err: float = float("nan")
    runs: int = 0
    knobs: Any = None
    source: str = ""
    error: str = ""
    worker: str = "local"
    fingerprint: str = ""
    measured: int = 0  # settings actually timed (not from the cache)
    attempts: int = 1
    history: list[str] = field(default_factory=list)


def _inputs(job: Job) -> tuple[dict[str, np.ndarray], np.ndarray]:
    from kernelsat.inputs import random_inputs
    from kernelsat.interp import evaluate_as
    from kernelsat.program import Program
    from kernelsat.sexpr import parse_term

    spec = parse_term(job.spec)
    program = Program("job", {}, tuple(job.inputs), "out", tuple(job.out_axes), spec)
    env64 = random_inputs(program, seed=job.seed)
    reference = evaluate_as(spec, env64, tuple(job.out_axes))
    env32 = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in env64.items()}
    return env32, reference


def run_job(job: Job, cache_dir: Path | None = None, worker: str = "local") -> JobResult:
    """Lower, build, knob-search and measure one job (cached). Never raises for a bad
    program: a failure to lower, compile or match the reference is a failed result."""
    from kernelsat.codegen import build, lower
    from kernelsat.hardware.cache import MeasureCache
    from kernelsat.hardware.knobs import codegen_knobs, tune
    from kernelsat.hardware.targets import get_target

    from kernelsat.sexpr import parse_term

    target = get_target("cpu")
    build_dir = None if cache_dir is None else Path(cache_dir) / job.target
    cache_path = None if cache_dir is None else Path(cache_dir) / "measure.sqlite"
    try:
        env, reference = _inputs(job)
        lowered = lower(parse_term(job.program), job.out_axes)

        def builder(low: Any, name: str, setting: Any) -> Any:
            return build(low, job.target, codegen_knobs(low, setting), cache_dir=build_dir)

        with MeasureCache(cache_path) as cache:
            found = tune(
                lowered, target, env, tuple(reference.shape), reference,
                program_key=f"{job.target}:{lowered.key}", budget=job.knob_budget,
                seed=job.seed, cache=cache, build=builder,
                measure_kwargs={"min_runs": job.min_runs, "min_seconds": job.min_seconds},
            )
        m = found.best_measurement
        source = builder(lowered, job.target, found.best).source
        if m is None or not m.ok:
            return JobResult(job.key, False, error=m.failure if m else "nothing measured",
                             knobs=found.best, source=source, worker=worker,
                             fingerprint=target.fingerprint, measured=found.measured)
        return JobResult(job.key, True, m.median, m.q1, m.q3, m.rel_err, m.runs, found.best,
                         source, "", worker, target.fingerprint, found.measured)
    except Exception as e:  # recorded, never fatal
        detail = traceback.format_exception_only(type(e), e)[-1].strip()
        return JobResult(job.key, False, error=detail[:500], worker=worker,
                         fingerprint=target.fingerprint)


Progress = Callable[[str, str], None]


class Backend(Protocol):
    """Runs measurement jobs; results come back in the order of `jobs`."""

    name: str

    def run(self, jobs: Sequence[Job], progress: Progress | None = None) -> list[JobResult]: ...

    def close(self) -> None: ...


@dataclass
class LocalBackend:
    """Times one job at a time on this machine."""

    cache_dir: Path | None = None
    name: str = "local"

    def run(self, jobs: Sequence[Job], progress: Progress | None = None) -> list[JobResult]:
        out = []
        for i, job in enumerate(jobs):
            if progress is not None:
                progress("measure", f"job {i + 1}/{len(jobs)} queued {len(jobs) - i - 1}")
            out.append(run_job(job, self.cache_dir))
        return out

    def close(self) -> None:
        pass
