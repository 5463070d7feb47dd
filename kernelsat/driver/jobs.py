"""Measurement jobs and the evaluation backend interface.

A `Job` is self-contained and picklable: the spec's term (for the float64 reference),
the candidate program, the output layout, the input declarations (inputs are drawn
on the worker from the seed), the target's name, the knob budget and the timing
settings. `run_job` resolves the target where it runs (a CPU target is the worker's own
CPU), then lowers, builds with the target's backend and arch, knob-searches and measures
it through the measurement cache, keyed by that target's fingerprint. A backend runs
many jobs; `LocalBackend` runs them one at a time on this machine (parallel timing on two
cores corrupts the numbers).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import itertools
import json
import multiprocessing
import shutil
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import nullcontext, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kernelsat.codegen import Executable, KnobList, build, lower
from kernelsat.codegen.lower import LoweredProgram
from kernelsat.hardware.cache import MeasureCache
from kernelsat.hardware.duel import load_per_core, settled
from kernelsat.hardware.knobs import Setting, codegen_knobs, plan, search, tune
from kernelsat.hardware.measure import (
    TIMING,
    Measurement,
    TimingProtocol,
    check_output,
    measure,
    measure_interleaved,
)
from kernelsat.hardware.targets import Target, get_target
from kernelsat.hardware.timing_lock import building
from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as
from kernelsat.program import Program
from kernelsat.sexpr import parse_term


@dataclass(frozen=True)
class Job:
    """One program to measure on one target."""

    spec: str  # s-expression of the spec term: the reference
    program: str  # s-expression of the candidate
    out_axes: tuple[str, ...]
    inputs: tuple[Any, ...]  # kernelsat.program.InputDecl
    target: str = "c"  # a target name (`get_target`), resolved where the job runs
    knob_budget: int = 4
    seed: int = 0
    timing: TimingProtocol = TIMING["optimize"]  # its max_run_seconds abandons a slow program
    timeout_s: float = 300.0
    max_seconds: float = float("inf")  # start no knob setting past this (after the first)
    random_settings: int = 8  # random knob settings tried before coordinate moves
    retime: str = ""  # a knob setting (JSON): time it afresh, no search, no cache
    against: str = ""  # with retime: `against_json(program, knobs)`, timed interleaved

    @property
    def key(self) -> str:
        text = "|".join(
            [
                self.spec,
                self.program,
                ",".join(self.out_axes),
                self.target,
                str(self.knob_budget),
                str(self.seed),
                *([self.retime] if self.retime else []),
                *([self.against] if self.against else []),
            ]
        )
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
    checked_on: str = ""  # the backend that ran the ship gate (`gate_backend`)
    # a job with `against`: the other program's figures from the same interleaved rounds
    against_median: float = float("inf")
    against_q1: float = float("inf")
    against_q3: float = float("inf")
    against_runs: int = 0
    # ... and what the final gate's paired verdict reads (`kernelsat.hardware.duel`): each
    # side's runs in round order, the load average per core and the load probes
    times: tuple[float, ...] = ()
    against_times: tuple[float, ...] = ()
    load: float = float("nan")
    probe: float = float("nan")
    best_probe: float = float("nan")


@functools.lru_cache(maxsize=4)
def _inputs(
    job_inputs: tuple[str, tuple[str, ...], tuple[Any, ...], int],
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Inputs and the float64 reference for (spec, out_axes, input declarations, seed):
    computed once per process, since every candidate of a spec shares them."""
    spec_text, out_axes, decls, seed = job_inputs

    spec = parse_term(spec_text)
    program = Program("job", {}, decls, "out", out_axes, spec)
    env64 = random_inputs(program, seed=seed)
    reference = evaluate_as(spec, env64, out_axes)
    env32 = {k: np.ascontiguousarray(v, dtype=np.float32 if v.dtype.kind == "f" else v.dtype)
             for k, v in env64.items()}  # integer inputs (gather labels) stay int32
    return env32, reference


STRESS_SCALE = 100.0
"""The overflow check's inputs: `data` and `positive` inputs times this (magnitudes
50-150: exp overflows float32 past 88.7; a product of eight inputs does not)."""


@functools.lru_cache(maxsize=4)
def _stress(
    job_inputs: tuple[str, tuple[str, ...], tuple[Any, ...], int], backend: str,
    cache_dir: Path | None, cflags: tuple[str, ...] = (),
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The stress inputs and where the spec's own float32 program (built by `backend`
    at its default knobs; C for the instruction set `cflags`, as the candidate is) gives
    finite outputs on them: once per process, spec and build."""
    spec_text, out_axes, decls, _seed = job_inputs
    env, reference = _inputs(job_inputs)
    roles = {d.name: d.role for d in decls}
    stress = {k: np.ascontiguousarray(v * np.float32(STRESS_SCALE)  # labels: never scaled
                                      if roles.get(k) != "onehot" and v.dtype.kind == "f"
                                      else v)
              for k, v in env.items()}

    out = np.full(reference.shape, np.nan, np.float32)
    try:
        spec = lower(parse_term(spec_text), out_axes)
        with np.errstate(all="ignore"):
            target_builder(backend, cache_dir, cflags=cflags)(spec, backend, None)(stress, out)
    except Exception:  # the spec cannot run on them: nothing to compare against
        out.fill(np.nan)
    return stress, np.isfinite(out)


def against_json(program: str, knobs: Setting | None) -> str:
    """`Job.against` for a program (s-expression) at a knob setting (a `Setting`, or
    None for codegen's defaults)."""
    return json.dumps({"program": program, "knobs": knobs or {}}, sort_keys=True,
                      default=str)


def _job_inputs(job: Job) -> tuple[str, tuple[str, ...], tuple[Any, ...], int]:
    return job.spec, tuple(job.out_axes), tuple(job.inputs), job.seed


def overflow_failure(job: Job, exe: Executable, cache_dir: Path | None = None,
                     backend: str | None = None) -> str:
    """Why `exe` (the job's program, built by `backend`, default the target's) may not
    ship although it matched the reference: on inputs STRESS_SCALE times larger, outputs
    that the spec's own float32 program (built by the same backend) computes finitely
    come out infinite or NaN (a rewrite exact over the reals, such as dropping the max
    subtracted before exp, can overflow in float32). "" when none do."""
    target = get_target(job.target)
    cflags = target.compile_flags if backend in (None, target.backend) else ()
    backend = backend or target.backend
    stress, finite = _stress(_job_inputs(job), backend, cache_dir, cflags)
    out, raised = _run_float32(exe, stress, finite.shape)
    if raised:
        return f"overflow check ({backend}): {raised}"[:300]
    bad = int(np.count_nonzero(finite & ~np.isfinite(out)))
    if not bad:
        return ""
    return (f"overflows in float32 ({backend}): {bad} of {out.size} outputs are inf or NaN "
            f"on inputs scaled by {STRESS_SCALE:g} where the spec's own float32 program is "
            "finite (the proof is over the reals)")


def numeric_failure(exe: Executable, env: Mapping[str, np.ndarray], reference: np.ndarray) -> str:
    """Why one float32 run of `exe` on `env` does not match the float64 `reference` (the
    measurement's check: every element written, all finite, not all zeros, relative L2
    error under the float32 bound); "" when it matches. A reference that is not finite
    everywhere fails: there is nothing to compare against."""
    if not bool(np.all(np.isfinite(reference))):
        return "the float64 reference has NaN or infinite values on the check's inputs"
    out, raised = _run_float32(exe, env, reference.shape)
    if raised:
        return raised[:300]
    return check_output(out, reference, "float32")[1]


def _run_float32(exe: Any, inputs: Mapping[str, np.ndarray],
                 shape: tuple[int, ...]) -> tuple[np.ndarray, str]:
    """One float32 run of `exe` into a NaN-filled output: (the output, "" or what it
    raised); floating-point warnings are the checks' business, not the run's."""
    out = np.full(shape, np.nan, np.float32)
    try:
        with np.errstate(all="ignore"):
            exe(inputs, out)
    except Exception as e:
        return out, f"raised {type(e).__name__}: {e}"
    return out, ""


def ship_failure(job: Job, exe: Executable, backend: str, cache_dir: Path | None = None) -> str:
    """The gate every program passes before it may ship, on every target: "" when `exe`
    (the job's program built by `backend`) matches the float64 reference on the job's
    inputs (`numeric_failure`) and does not overflow where the spec does not
    (`overflow_failure`); otherwise why it may not ship, naming the backend."""
    env, reference = _inputs(_job_inputs(job))
    numeric = numeric_failure(exe, env, reference)
    if numeric:
        return f"float64 comparison ({backend}, float32): {numeric}"
    return overflow_failure(job, exe, cache_dir, backend)


@functools.cache
def _gpu_here() -> bool:
    try:
        import pycuda.driver as drv  # optional (the cuda extra)

        drv.init()
        return bool(drv.Device.count() > 0)
    except Exception:  # no pycuda, no driver or no device
        return False


def gate_backend(target: Target | str) -> str:
    """The backend that runs `target`'s programs (a `Target` or its name) through the
    ship gate on this machine: the target's own where it runs here (a CPU backend; CUDA
    with pycuda and a GPU); else the C renderer of the same lowered program in float32
    (numpy where gcc is missing)."""
    target = get_target(target)
    if target.kind == "cpu" or (target.backend == "cuda" and _gpu_here()):
        return target.backend
    return "c" if shutil.which("gcc") is not None else "numpy"


def check_job(job: Job, cache_dir: Path | None = None, worker: str = "local") -> JobResult:
    """Run the ship gate, nothing timed, on a job whose target cannot be timed here: its
    program at the default knobs, built by `gate_backend` of the job's target. `ok` says whether
    it may ship; `median` stays inf. Never raises for a bad program."""
    target = get_target(job.target)
    backend = gate_backend(target)
    own = backend == target.backend
    arch, cflags = (target.arch, target.compile_flags) if own else (None, ())
    try:
        exe = target_builder(backend, cache_dir, arch, cflags)(lower_job(job), backend, None)
        failure = ship_failure(job, exe, backend, cache_dir)
    except Exception as e:  # recorded, never fatal
        detail = traceback.format_exception_only(type(e), e)[-1].strip()
        failure = f"{backend} build for the checks failed: {detail}"[:500]
    return JobResult(job.key, not failure, error=failure, worker=worker, checked_on=backend)


def lower_job(job: Job) -> LoweredProgram:
    """The job's candidate program, lowered (what the knob search and the cache key use)."""
    return lower(parse_term(job.program), job.out_axes)


def program_key(target: Target, lowered: LoweredProgram) -> str:
    """The measurement cache's program key of a lowered program: its backend, the code
    generator's version (`codegen_version`) and the lowered program's key."""
    return f"{target.backend}:{codegen_version()}:{lowered.key}"


@functools.cache
def codegen_version() -> str:
    """A hash of the code generator's sources (every .py, .h and .c file of
    `kernelsat.codegen`). The cache keys a timing by program and knobs, not by the code
    they became: without this, a warm cache replays the timing (or the failure) of code
    an older code generator wrote for the same program, e.g. a fused kernel's slow or
    failed first version, after the code generator has changed."""
    spec = importlib.util.find_spec("kernelsat.codegen")
    root = Path(str(spec.origin if spec is not None else __file__)).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in (".py", ".h", ".c") and path.is_file():
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


Builder = Callable[[LoweredProgram, str, KnobList], Executable]
"""What the knob search builds with: (lowered program, kernel name, knobs) -> executable."""


def job_builder(target: Target, cache_dir: Path | None) -> Builder:
    """The build function the knob search calls for `target`: its backend and arch,
    compiling into `<cache_dir>/<backend>` (keyed there by source hash), or codegen's
    default folder when `cache_dir` is None."""
    return target_builder(target.backend, cache_dir, target.arch, target.compile_flags)


def target_builder(backend: str, cache_dir: Path | None,
                   arch: str | None = None, cflags: Sequence[str] = ()) -> Builder:
    """A build function for one codegen backend (and arch; C: instruction-set flags)."""
    build_dir = None if cache_dir is None else Path(cache_dir) / backend

    def builder(low: LoweredProgram, name: str, knobs: KnobList) -> Executable:
        with building():  # no process on this machine times while this compiles
            return build(low, backend, knobs, cache_dir=build_dir, arch=arch, cflags=cflags)

    return builder


def prebuild(job: Job, cache_dir: Path | None = None) -> str:
    """Compile, into the build cache, the knob settings the search tries first when
    nothing is cached (the default, then the random draws, within the job's budget),
    and return the job's program key. Timing nothing, it can run on any core while a
    timing worker measures something else; a setting it could not build is left for
    the timing worker to report. Raises when the program does not lower."""
    lowered = lower_job(job)
    target = get_target(job.target)
    builder = job_builder(target, cache_dir)
    backend = target.backend

    def compile_only(setting: Any) -> Measurement:
        try:
            builder(lowered, backend, codegen_knobs(lowered, setting))
        except Exception as e:  # the timing worker reports it
            return Measurement.failed(f"build failed: {type(e).__name__}: {str(e)[:300]}")
        return Measurement(1.0, 1.0, 1.0, 1, 0.0, True)  # equal scores: the search's order

    if job.retime:
        compile_only(json.loads(job.retime))
    else:
        found = plan(lowered, target, job.knob_budget, job.seed)  # the order tune measures in
        search(found.table, compile_only, budget=job.knob_budget,
               n_random=job.random_settings, seed=job.seed, ranked=found.ranked,
               predict=found.predict)
    return program_key(target, lowered)


def run_job(
    job: Job, cache_dir: Path | None = None, worker: str = "local",
    cache: MeasureCache | None = None,
    fresh: bool = False,
) -> JobResult:
    """Lower, build, knob-search and measure one job (cached). Never raises for a bad
    program: a failure to lower, compile or match the reference is a failed result.

    `cache` (anything with MeasureCache's `get`/`put`) replaces the SQLite cache under
    `cache_dir`: a distributed worker passes one that serves the driver's rows and
    records what it measured, for the driver to write. `fresh`: replay no cached timing
    from `cache_dir`'s cache (new ones are still written)."""
    cache_path = None if cache_dir is None else Path(cache_dir) / "measure.sqlite"
    fingerprint = ""
    try:
        target = get_target(job.target)  # here: a CPU target is this worker's own CPU
        fingerprint = target.fingerprint
        env, reference = _inputs((job.spec, tuple(job.out_axes), tuple(job.inputs), job.seed))
        lowered = lower_job(job)
        builder = job_builder(target, cache_dir)
        if job.against:
            return _duel(job, target, lowered, builder, env, reference, worker, cache_path)
        if job.retime:
            return _retime(job, target, lowered, builder, env, reference, worker, cache_dir)
        opened = (MeasureCache(cache_path, replay=not fresh) if cache is None
                  else nullcontext(cache))
        with opened as measure_cache:
            found = tune(
                lowered,
                target,
                env,
                tuple(reference.shape),
                reference,
                program_key=program_key(target, lowered),
                budget=job.knob_budget,
                seed=job.seed,
                cache=measure_cache,
                build=builder,
                max_seconds=job.max_seconds,
                n_random=job.random_settings,
                timing=job.timing,
            )
        m = found.best_measurement
        exe = builder(lowered, target.backend, codegen_knobs(lowered, found.best))
        source = exe.source
        if m is not None and m.ok:
            failure = ship_failure(job, exe, target.backend, cache_dir)
            if failure:
                m = replace(m, ok=False, failure=failure)
        if m is None or not m.ok:
            return JobResult(
                job.key,
                False,
                error=m.failure if m else "nothing measured",
                knobs=found.best,
                source=source,
                worker=worker,
                fingerprint=fingerprint,
                measured=found.measured,
                checked_on=target.backend,
            )
        return JobResult(
            job.key,
            True,
            m.median,
            m.q1,
            m.q3,
            m.rel_err,
            m.runs,
            found.best,
            source,
            "",
            worker,
            fingerprint,
            found.measured,
            checked_on=target.backend,
        )
    except Exception as e:  # recorded, never fatal
        detail = traceback.format_exception_only(type(e), e)[-1].strip()
        return JobResult(
            job.key, False, error=detail[:500], worker=worker, fingerprint=fingerprint
        )


def _retime(job: Job, target: Target, lowered: Any, builder: Callable[[Any, str, Any], Any],
            env: dict[str, np.ndarray], reference: np.ndarray, worker: str,
            cache_dir: Path | None) -> JobResult:
    """Time `job.retime`'s knob setting afresh: no search, and the measurement cache is
    neither read nor written (a second opinion on a program already measured); the
    ship gate runs as for any measured program."""
    knobs = json.loads(job.retime)
    backend, fingerprint = target.backend, target.fingerprint
    exe = builder(lowered, backend, codegen_knobs(lowered, knobs))
    m = measure(exe, env, tuple(reference.shape), reference, job.timing)
    if m.ok:
        failure = ship_failure(job, exe, backend, cache_dir)
        if failure:
            m = replace(m, ok=False, failure=failure)
    source = getattr(exe, "source", "")
    if not m.ok:
        return JobResult(job.key, False, error=m.failure, knobs=knobs, source=source,
                         worker=worker, fingerprint=fingerprint, measured=1,
                         checked_on=backend)
    return JobResult(job.key, True, m.median, m.q1, m.q3, m.rel_err, m.runs, knobs, source,
                     "", worker, fingerprint, 1, checked_on=backend)


def _duel(job: Job, target: Target, lowered: LoweredProgram, builder: Builder,
          env: dict[str, np.ndarray], reference: np.ndarray, worker: str,
          cache_path: Path | None = None) -> JobResult:
    """Time the job's program at `job.retime`'s setting and `job.against`'s program at
    its setting interleaved (`measure_interleaved`: A B A B ..., the same inputs, the
    same flush rule, each output checked whole on its first run): the program's figures
    in `median`..., the other's in `against_median`...; `ok` only when both passed.
    Neither cache is read or written: the point is two figures taken side by side.
    The rounds alternate the order and go on while their paired verdict is a tie
    (`kernelsat.hardware.duel.settled`); each side's runs, the load average and the
    probes come back for the final gate's verdict."""
    other = json.loads(job.against)
    other_lowered = lower(parse_term(other["program"]), job.out_axes)
    knobs = json.loads(job.retime or "{}")
    backend, fingerprint = target.backend, target.fingerprint
    exe = builder(lowered, backend, codegen_knobs(lowered, knobs))
    base = builder(other_lowered, backend, codegen_knobs(other_lowered, other["knobs"]))
    load0 = load_per_core()
    m, b = measure_interleaved([exe, base], env, tuple(reference.shape), reference,
                               job.timing, settle=settled, alternate=True)
    load = max(load0, load_per_core())
    best_probe = float("nan")
    if cache_path is not None and cache_path.exists():
        with MeasureCache(cache_path) as cache:
            best_probe = cache.best_probe(fingerprint)
    failure = "; ".join(f"{who}: {x.failure}" for who, x in (("program", m), ("against", b))
                        if not x.ok)
    return JobResult(job.key, m.ok and b.ok, m.median if m.ok else float("inf"),
                     m.q1 if m.ok else float("inf"), m.q3 if m.ok else float("inf"),
                     m.rel_err, m.runs, knobs, getattr(exe, "source", ""), failure, worker,
                     fingerprint, 2, checked_on=backend,
                     against_median=b.median if b.ok else float("inf"),
                     against_q1=b.q1 if b.ok else float("inf"),
                     against_q3=b.q3 if b.ok else float("inf"), against_runs=b.runs,
                     times=m.times, against_times=b.times, load=load, probe=m.probe,
                     best_probe=best_probe)


Progress = Callable[[str, str], None]


class Backend(Protocol):
    """Runs measurement jobs; results come back in the order of `jobs`."""

    name: str

    def run(self, jobs: Sequence[Job], progress: Progress | None = None) -> list[JobResult]: ...

    def close(self) -> None: ...


def _prebuild_quietly(job: Job, cache_dir: Path | None) -> None:
    with suppress(Exception):  # a program that does not lower: the timing run reports it
        prebuild(job, cache_dir)


@dataclass
class LocalBackend:
    """Times one job at a time on this machine.

    With `build_workers` > 1, a batch of jobs is first compiled in that many worker
    processes (`prebuild`: compiling times nothing), then timed one at a time with the
    build workers idle: parallel timing on two cores corrupts the numbers, parallel
    compiling does not."""

    cache_dir: Path | None = None
    name: str = "local"
    build_workers: int = 1
    fresh: bool = False  # replay no cached timing (`optimize --fresh`); still record new ones
    _pool: Any = field(default=None, repr=False, compare=False)

    def prebuild(self, jobs: Sequence[Job]) -> None:
        """Compile `jobs` into the build cache, in parallel (returns when all are built).

        A build worker that dies (killed, out of memory) costs only the head start:
        the pool is dropped and `run` compiles what is not built. (A
        `multiprocessing.Pool` would wait for the lost task forever, and its
        `terminate` hangs on the queue lock of a worker killed while waiting.)"""
        if self.build_workers < 2 or len(jobs) < 2:
            return
        if self._pool is None:
            # forkserver: workers start from a clean process, not a fork of this one
            self._pool = ProcessPoolExecutor(
                self.build_workers, mp_context=multiprocessing.get_context("forkserver"))
        try:
            list(self._pool.map(_prebuild_quietly, jobs, itertools.repeat(self.cache_dir)))
        except BrokenProcessPool:
            self.close()

    def run(self, jobs: Sequence[Job], progress: Progress | None = None) -> list[JobResult]:
        self.prebuild(jobs)
        out = []
        for i, job in enumerate(jobs):
            if progress is not None:
                progress("measure", f"job {i + 1}/{len(jobs)} queued {len(jobs) - i - 1}")
            out.append(run_job(job, self.cache_dir, fresh=self.fresh))
        return out

    def close(self) -> None:
        """Stop the build workers (also when some have died)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
