"""The timing protocol: how kernelsat measures one executable.

An executable is a callable `exe(inputs, out)` that writes its result into `out` in
place (what `kernelsat.codegen.build` returns). `measure` times it as follows:

1. The caller passes fresh random inputs (`random_inputs` makes them: standard
   normal, never zeros; constant inputs are refused) and the float64 reference.
2. The output buffer and the cache-flush buffer are allocated and first touched
   before anything is timed (a fresh 64 MiB buffer costs tens of ms in page faults).
3. Before every run, warm-up or timed, the output is poisoned with NaN; after every
   run it is checked: every element written (no NaN left), all finite, and the
   relative L2 error against the reference below the dtype's bound
   (`ERROR_BOUNDS`). One failed check fails the whole measurement: NaN never passes.
   With `check="first"` (the optimize preset) only the first run's output is poisoned
   and compared whole; later runs poison and compare a fixed random sample (`CHECKS`).
4. `warmup` untimed runs (each abandoned, failing the measurement, past
   `max_run_seconds`; an executable with a `cancel()` method, generated C, is stopped
   there by a watchdog thread instead of running to its end), then timed runs until
   both `min_runs` runs and `min_seconds` of timed work are reached (bounded by
   `max_runs`, `max_seconds`).
5. When inputs and output together fit in the last-level cache, the LLC is flushed
   before each timed run by writing a buffer 1.5x its size, so every run starts
   cold, as it would inside a larger program.
6. Each run is timed with `time.perf_counter_ns` (or the given `timer`, e.g. CUDA
   events); the result is the median and the interquartile range.

7. Only one process times at a time on a machine: `measure` holds the machine-wide
   timing lock while it times, and stamps the measurement with the machine-load
   probe taken with it (`Measurement.probe`; `kernelsat.hardware.timing_lock`).

`separate_process=True` times in a fresh process (multiprocessing, "spawn"): the
executable is rebuilt there from a picklable recipe (anything with a `build()`
method, e.g. `CodegenRecipe`, or a picklable callable). A crash (a segfault in
generated C) then fails the measurement instead of killing the caller, and timings
do not inherit the caller's heap or thread state. Spawn, not fork: forking a process
whose OpenMP runtime has started can deadlock.

>>> import numpy as np
>>> inputs = random_inputs({"x": (64,)}, seed=0)
>>> ref = inputs["x"].astype(np.float64) * 2
>>> def double(ins, out): np.multiply(ins["x"], 2, out=out)
>>> m = measure(double, inputs, (64,), ref, min_runs=3, min_seconds=0, flush_cache=False)
>>> m.ok, m.runs >= 3, m.rel_err < 1e-6
(True, True, True)
"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

import numpy as np

from kernelsat.codegen import build, lower
from kernelsat.hardware.cpu import detect_cpu
from kernelsat.hardware.timing_lock import timing_session
from kernelsat.sexpr import parse_term

Executable = Callable[[Mapping[str, np.ndarray], np.ndarray], Any]
"""`exe(inputs, out)`: computes the program and writes every element of `out`."""

Timer = Callable[[Callable[[], Any]], float]
"""Runs the thunk once and returns its duration in seconds."""

ERROR_BOUNDS: dict[str, float] = {
    # float64: unit roundoff 1.1e-16; 1e-9 leaves room for reductions of 1e6 terms.
    "float64": 1e-9,
    # float32: unit roundoff 6e-8. Measured here: a naive sequential float32 sum of
    # 2^20 positive terms has relative error 8e-5, of 2^16 terms 4e-6; a bound of 3e-4
    # is 3x the former, while a kernel that drops one term of a signed length-4096
    # reduction errs by ~1.6e-2 and a missing tile or wrong index by O(1).
    "float32": 3e-4,
    # float16: unit roundoff 4.9e-4, about 20 ulps of headroom.
    "float16": 1e-2,
    # bfloat16: unit roundoff 3.9e-3 (8 bits of mantissa).
    "bfloat16": 5e-2,
}
"""Largest accepted relative L2 error ||out - ref|| / ||ref|| per output dtype."""

FLUSH_FACTOR = 1.5
"""The flush buffer is this many times the LLC (caches are not perfectly LRU)."""


@dataclass(frozen=True)
class Measurement:
    """The outcome of timing one executable. Times in seconds; NaN when not ok."""

    median: float
    q1: float
    q3: float
    runs: int
    rel_err: float
    ok: bool
    failure: str = ""
    times: tuple[float, ...] = field(default=(), repr=False, compare=False)
    probe: float = field(default=math.nan, repr=False, compare=False)
    """The machine-load probe (seconds) taken with this timing; NaN: not probed."""

    @property
    def spread(self) -> float:
        """The interquartile range relative to the median."""
        return (self.q3 - self.q1) / self.median if self.ok and self.median > 0 else math.nan

    @staticmethod
    def failed(failure: str, runs: int = 0, rel_err: float = math.nan) -> Measurement:
        """A measurement rejected for `failure` (no time is reported)."""
        nan = math.nan
        return Measurement(nan, nan, nan, runs, rel_err, False, failure)


@runtime_checkable
class Recipe(Protocol):
    """Picklable instructions that rebuild an executable in another process."""

    def build(self) -> Executable: ...


@dataclass(frozen=True)
class CodegenRecipe:
    """Rebuild an executable through `kernelsat.codegen` from the program's s-expression."""

    sexpr: str
    out_axes: tuple[str, ...]
    backend: str
    knobs_json: str = "null"
    cflags: tuple[str, ...] = ()  # C: the target's instruction-set flags (`build`)

    def build(self) -> Executable:
        lowered = lower(parse_term(self.sexpr), self.out_axes)
        return build(lowered, self.backend, json.loads(self.knobs_json), cflags=self.cflags)


# -- inputs and checking -----------------------------------------------------------


def random_inputs(
    shapes: Mapping[str, tuple[int, ...]],
    dtype: str = "float32",
    seed: int = 0,
    *,
    positive: frozenset[str] = frozenset(),
) -> dict[str, np.ndarray]:
    """Fresh random inputs: standard normal, or uniform in [0.5, 1.5) for the names in
    `positive` (inputs of log, sqrt ...). Never zeros, never constant.

    >>> x = random_inputs({"a": (2, 3)}, seed=1)["a"]
    >>> x.dtype, x.shape, bool(np.all(x != 0))
    (dtype('float32'), (2, 3), True)
    """
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        if name in positive:
            arr = rng.uniform(0.5, 1.5, size=shape)
        else:
            arr = rng.standard_normal(size=shape)
            arr[arr == 0] = 1.0  # measure-zero, but "never zeros" is a promise
        out[name] = np.ascontiguousarray(arr.astype(dtype))
    return out


def check_inputs(inputs: Mapping[str, np.ndarray]) -> None:
    """Refuse inputs that would hide bugs: all-equal arrays (zeros included)."""
    for name, arr in inputs.items():
        if arr.size > 1 and not arr.max() > arr.min() and bool(np.all(arr == arr.flat[0])):
            raise ValueError(f"input {name!r} is constant ({arr.flat[0]!r}); use random inputs")


def check_output(out: np.ndarray, reference: np.ndarray, dtype: str, *,
                 ref_norm: float | None = None) -> tuple[float, str]:
    """(relative L2 error, failure message or "") of one run's output: every element
    written (no NaN), all finite, not all zeros where the reference is not, and the
    relative L2 error against the float64 `reference` within `ERROR_BOUNDS[dtype]`.
    `ref_norm`: the reference's L2 norm when the caller has it (`measure` computes it
    once per measurement, not once per run).

    A passing output costs one blocked pass (`_squared_error`: no full-size float64
    temporaries, 5x faster than the plain form on 16M elements); anything else takes
    the plain path, which names the failure."""
    ref = np.asarray(reference, np.float64)
    squared = _squared_error(out, ref)
    if math.isfinite(squared):
        norm = _norm(ref) if ref_norm is None else ref_norm
        rel = math.sqrt(squared) / norm if norm > 0 else math.sqrt(squared)
        if rel <= ERROR_BOUNDS[dtype]:
            return rel, ""
    return _diagnose(out, ref, dtype)


CHECK_BLOCK = 1 << 15
"""Elements per block of the blocked error sum (256 KiB of float64: in L2)."""


def _squared_error(out: np.ndarray, ref: np.ndarray) -> float:
    """sum((out - ref)^2) in float64, block by block; NaN or inf when `out` has them.
    Plain reductions, not BLAS: BLAS threads would fight the kernel's OpenMP threads."""
    o, r = np.ravel(out), np.ravel(ref)
    buf = np.empty(min(CHECK_BLOCK, o.size), np.float64)
    total = 0.0
    for i in range(0, o.size, CHECK_BLOCK):
        j = min(i + CHECK_BLOCK, o.size)
        b = buf[: j - i]
        with np.errstate(invalid="ignore", over="ignore"):
            np.subtract(o[i:j], r[i:j], out=b)
            np.multiply(b, b, out=b)
        total += float(b.sum())
    return total


def _norm(ref: np.ndarray) -> float:
    """The L2 norm of a float64 array, without a full-size temporary."""
    flat = np.ravel(ref)
    return math.sqrt(float(np.einsum("i,i->", flat, flat)))


def _diagnose(out: np.ndarray, ref: np.ndarray, dtype: str) -> tuple[float, str]:
    """`check_output` the plain way: the failure named (unwritten, infinite, zeros,
    error above the bound), or the error and "" when the output passes after all."""
    nan_count = int(np.count_nonzero(np.isnan(out)))
    if nan_count:
        return math.nan, f"{nan_count} of {out.size} output elements unwritten or NaN"
    if not bool(np.all(np.isfinite(out))):
        return math.inf, "output has infinities"
    diff = out.astype(np.float64) - ref
    ref_norm = math.sqrt(float(np.sum(ref * ref)))
    err_norm = math.sqrt(float(np.sum(diff * diff)))
    rel = err_norm / ref_norm if ref_norm > 0 else err_norm
    if ref_norm > 0 and not np.any(out):
        return rel, "output is all zeros"
    bound = ERROR_BOUNDS[dtype]
    if not rel <= bound:
        return rel, f"relative L2 error {rel:.3g} above the {dtype} bound {bound:g}"
    return rel, ""


CHECKS = ("every", "first")
"""How much of each run's output `measure` compares (`TimingProtocol.check`):
"every": the whole output after every run; "first": the whole output after the first
run, and after each later run a fixed random sample of `SAMPLE_ELEMENTS` elements
(poisoned before the run, so an unwritten sampled element still fails). A knob search
times many settings of one program: each build is still checked whole once, on the
same inputs, while a 16M-element output no longer costs 7x its kernel's time per run."""

SAMPLE_ELEMENTS = 1 << 16
"""Elements of the sampled check (`CHECKS`); outputs no larger are checked whole."""


@dataclass(frozen=True)
class OutputCheck:
    """One measurement's output check: the reference (float64), its norm computed once,
    and the sample (flat indices, None: none) that later runs compare under "first".

    >>> ref = np.arange(1.0, 5.0)
    >>> check = OutputCheck.make(ref, "float32", "first", sample=2)
    >>> out = ref.astype(np.float32)
    >>> check.check(out, whole=False), check.check(out, whole=True)[1]
    ((0.0, ''), '')
    """

    reference: np.ndarray
    dtype: str
    norm: float
    sample: np.ndarray | None
    sample_ref: np.ndarray | None
    sample_norm: float

    @staticmethod
    def make(reference: np.ndarray, dtype: str, mode: str = "every",
             sample: int = SAMPLE_ELEMENTS, seed: int = 0) -> OutputCheck:
        if mode not in CHECKS:
            raise ValueError(f"unknown output check {mode!r}; known: {', '.join(CHECKS)}")
        ref = np.ascontiguousarray(reference, np.float64)
        idx = sref = None
        if mode == "first" and ref.size > sample:
            rng = np.random.default_rng(seed)
            idx = np.sort(rng.choice(ref.size, size=sample, replace=False))
            sref = ref.reshape(-1)[idx]
        return OutputCheck(ref, dtype, _norm(ref), idx, sref,
                           _norm(sref) if sref is not None else math.nan)

    def poison(self, out: np.ndarray, whole: bool) -> None:
        """NaN into what the next check reads: all of `out`, or the sample."""
        if whole or self.sample is None:
            out.fill(np.nan)
        else:
            out.reshape(-1)[self.sample] = np.nan

    def check(self, out: np.ndarray, whole: bool) -> tuple[float, str]:
        """`check_output` of all of `out` or (not `whole`, a sample kept) of the sample."""
        if whole or self.sample is None or self.sample_ref is None:
            return check_output(out, self.reference, self.dtype, ref_norm=self.norm)
        rel, failure = check_output(out.reshape(-1)[self.sample], self.sample_ref,
                                    self.dtype, ref_norm=self.sample_norm)
        if failure:
            failure += f" (in a sample of {self.sample.size} of {out.size} elements)"
        return rel, failure


# -- timers and the cache flush -------------------------------------------------------


def perf_counter_timer(thunk: Callable[[], Any]) -> float:
    """Time one call with `time.perf_counter_ns`."""
    t0 = time.perf_counter_ns()
    thunk()
    return (time.perf_counter_ns() - t0) / 1e9


def cuda_event_timer() -> Timer:  # pragma: no cover - needs an NVIDIA GPU and pycuda
    """A timer using CUDA events on the current stream (the executable must launch
    asynchronously on it with device-resident buffers)."""
    import pycuda.driver as cuda  # optional (kernelsat[cuda]), needs a GPU

    start, end = cuda.Event(), cuda.Event()

    def timer(thunk: Callable[[], Any]) -> float:
        start.record()
        thunk()
        end.record()
        end.synchronize()
        return float(start.time_till(end)) / 1e3

    return timer


def cuda_l2_flusher(l2_bytes: int) -> Callable[[], None]:  # pragma: no cover - needs a GPU
    """Flush a GPU's L2 by writing a device buffer twice its size."""
    import pycuda.driver as cuda  # optional (kernelsat[cuda]), needs a GPU

    nbytes = 2 * l2_bytes
    buf = cuda.mem_alloc(nbytes)
    counter = [0]

    def flush() -> None:
        counter[0] = (counter[0] + 1) & 0xFF
        cuda.memset_d8(buf, counter[0], nbytes)

    return flush


_FLUSH_BUFFERS: dict[int, np.ndarray] = {}


def cpu_flusher(nbytes: int) -> Callable[[], None]:
    """Write `nbytes` of a buffer that is allocated and first-touched once per process."""
    buf = _FLUSH_BUFFERS.get(nbytes)
    if buf is None:
        buf = np.ones(nbytes, np.uint8)
        _FLUSH_BUFFERS[nbytes] = buf
    counter = [0]

    def flush() -> None:
        counter[0] = (counter[0] + 1) & 0xFF
        buf.fill(counter[0])

    return flush


def default_llc_bytes() -> int:
    """This CPU's last-level cache size."""
    return detect_cpu().llc_bytes


# -- the protocol ------------------------------------------------------------------------


@dataclass(frozen=True)
class TimingProtocol:
    """The settings of one measurement (see the module docstring). Every caller times
    with one of these: `measure` and `kernelsat bench` with `TIMING["bench"]`, the
    optimize pipeline's jobs with `TIMING["optimize"]`, RL training and evaluation with
    `TIMING["train"]` and `TIMING["evaluate"]`."""

    dtype: str = "float32"
    min_runs: int = 10
    min_seconds: float = 0.2
    warmup: int = 2
    max_runs: int = 10_000
    max_seconds: float = 30.0
    max_run_seconds: float = math.inf  # give up on a program when one run exceeds this
    check: str = "every"  # how much of each run's output is compared (see CHECKS)
    # interleaved rounds (`measure_interleaved` with `settle`): while `settle` says the
    # rounds cannot decide, go on up to this many times the rounds the minimum took
    extend: float = 1.0

    def with_overrides(self, overrides: Mapping[str, Any]) -> TimingProtocol:
        """This protocol with the named fields replaced; a name that is no field raises
        `TypeError` naming the fields."""
        unknown = sorted(set(overrides) - set(_PROTOCOL_FIELDS))
        if unknown:
            raise TypeError(f"unknown timing setting {', '.join(map(repr, unknown))}; "
                            f"the settings are {', '.join(_PROTOCOL_FIELDS)}")
        return replace(self, **overrides) if overrides else self


_PROTOCOL_FIELDS = tuple(f.name for f in fields(TimingProtocol))

TIMING: Mapping[str, TimingProtocol] = MappingProxyType({
    # `measure` and `kernelsat bench`: one program, timed carefully
    "bench": TimingProtocol(),
    # optimize: every knob setting of every candidate (the noise floor of a ranking);
    # each build's output is checked whole once, then sampled (CHECKS)
    "optimize": TimingProtocol(min_runs=5, min_seconds=0.1, check="first"),
    # optimize's final gate: the winner against the eager program, interleaved
    # (`measure_interleaved`), at least 15 runs and 0.3 s each, at most 20 s in all
    # at most 20 s in all; rounds extended up to 4x while the paired verdict is a tie
    # (`kernelsat.hardware.duel.settled`)
    "gate": TimingProtocol(min_runs=15, min_seconds=0.3, warmup=1, max_seconds=20.0,
                           check="first", extend=4.0),
    # RL training rewards: thousands of programs, a coarse ranking suffices
    "train": TimingProtocol(min_runs=3, min_seconds=0.02),
    # RL evaluation against the other extractors
    "evaluate": TimingProtocol(min_runs=5, min_seconds=0.05),
})
"""The named timing presets: the one place each caller's defaults are written."""


class Overran(Exception):
    """A run stopped by the watchdog at its time limit."""


def watchdog_timer(timer: Timer, cancel: Callable[[], None], limit: float) -> Timer:
    """`timer`, but the run goes in a thread and is cancelled once it passes `limit`
    seconds (raising `Overran`): one run of a recomputing program can take minutes."""

    def timed(thunk: Callable[[], Any]) -> float:
        box: dict[str, Any] = {}

        def work() -> None:
            try:
                box["seconds"] = timer(thunk)
            except BaseException as exc:  # re-raised in the caller's thread
                box["error"] = exc

        worker = threading.Thread(target=work, name="kernelsat-run", daemon=True)
        worker.start()
        worker.join(limit)
        if worker.is_alive():
            cancel()
            worker.join()
            raise Overran(f"stopped after {limit:.3g} s")
        if "error" in box:
            raise box["error"]
        return float(box["seconds"])

    return timed


def _run_checked(exe: Executable, inputs: Mapping[str, np.ndarray], out: np.ndarray,
                 check: OutputCheck, whole: bool, timed: Callable[[Callable[[], Any]], float],
                 before: Callable[[], None] | None) -> tuple[float, float, str]:
    """Poison, (flush), run, check (`whole`: all of the output, else the check's
    sample): (seconds, rel_err, failure)."""
    check.poison(out, whole)
    if before is not None:
        before()
    try:
        seconds = timed(lambda: exe(inputs, out))
    except Overran:
        return math.inf, math.nan, ""
    except Exception as exc:  # a failing kernel is a result, not a crash of the caller
        return math.nan, math.nan, f"raised {type(exc).__name__}: {exc}"
    rel, failure = check.check(out, whole)
    return seconds, rel, failure


def _protocol(exe: Executable, inputs: Mapping[str, np.ndarray], out_shape: tuple[int, ...],
              reference: np.ndarray, proto: TimingProtocol, timer: Timer,
              flush: Callable[[], None] | None) -> Measurement:
    out = np.empty(out_shape, proto.dtype)
    out.fill(np.nan)  # first touch outside the timed region
    check = OutputCheck.make(reference, proto.dtype, proto.check)
    worst = 0.0
    limit = proto.max_run_seconds
    warm_timer = _warm_timer(exe, timer, limit)
    for i in range(proto.warmup):
        seconds, rel, failure = _run_checked(exe, inputs, out, check,
                                             proto.check == "every" or i == 0, warm_timer, None)
        bad = _warm_failure(seconds, rel, failure, limit, f"warm-up run {i}")
        if bad is not None:
            return bad
        worst = max(worst, rel)
    times: list[float] = []
    wall0 = time.perf_counter()
    while (len(times) < proto.min_runs or sum(times) < proto.min_seconds) and (
        len(times) < proto.max_runs and time.perf_counter() - wall0 < proto.max_seconds
    ):
        whole = proto.check == "every" or (proto.warmup == 0 and not times)
        seconds, rel, failure = _run_checked(exe, inputs, out, check, whole, timer, flush)
        if failure:
            return Measurement.failed(f"run {len(times)}: {failure}", len(times), rel)
        worst = max(worst, rel)
        times.append(seconds)
    return _summary(times, worst)


def _warm_timer(exe: Executable, timer: Timer, limit: float) -> Timer:
    """The warm-up runs' timer: stopped by a watchdog past `limit` when `exe` can be
    cancelled (generated C)."""
    cancel = getattr(exe, "cancel", None)
    if cancel is not None and math.isfinite(limit):
        return watchdog_timer(timer, cancel, limit)
    return timer


def _warm_failure(seconds: float, rel: float, failure: str, limit: float,
                  label: str) -> Measurement | None:
    """The failed measurement a warm-up run makes (stopped, wrong, too slow), or None."""
    if seconds == math.inf:
        return Measurement.failed(f"too slow: a run was stopped at the limit ({limit:.3g} s)")
    if failure:
        return Measurement.failed(f"{label}: {failure}", 0, rel)
    if seconds > limit:
        return Measurement.failed(
            f"too slow: a run took {seconds:.3g} s (limit {limit:.3g} s)", 0, rel)
    return None


def _summary(times: list[float], worst: float) -> Measurement:
    if not times:
        return Measurement.failed("no timed run fitted in max_seconds", 0, worst)
    q1, median, q3 = (float(v) for v in np.percentile(times, [25, 50, 75]))
    return Measurement(median, q1, q3, len(times), worst, True, "", tuple(times))


Settle = Callable[[Sequence[Sequence[float]]], bool]
"""Whether interleaved rounds may stop, given each executable's times so far (in round
order): `kernelsat.hardware.duel.settled` for the final gate."""


def _interleave(exes: Sequence[Executable], inputs: Mapping[str, np.ndarray],
                out_shape: tuple[int, ...], reference: np.ndarray, proto: TimingProtocol,
                timer: Timer, flush: Callable[[], None] | None,
                settle: Settle | None = None, alternate: bool = False) -> list[Measurement]:
    """`measure_interleaved`'s rounds, the lock held."""
    out = np.empty(out_shape, proto.dtype)
    out.fill(np.nan)  # first touch outside the timed region
    check = OutputCheck.make(reference, proto.dtype, proto.check)
    limit = proto.max_run_seconds
    n = len(exes)
    times: list[list[float]] = [[] for _ in range(n)]
    worst = [0.0] * n
    checked = [False] * n  # whole output compared once
    failed: dict[int, Measurement] = {}
    for i in range(proto.warmup):
        for k in [k for k in range(n) if k not in failed]:
            whole = proto.check == "every" or not checked[k]
            seconds, rel, failure = _run_checked(exes[k], inputs, out, check, whole,
                                                 _warm_timer(exes[k], timer, limit), None)
            checked[k] = True
            bad = _warm_failure(seconds, rel, failure, limit, f"warm-up run {i}")
            if bad is not None:
                failed[k] = bad
            worst[k] = max(worst[k], rel) if bad is None else worst[k]

    def wanted(k: int) -> bool:
        return len(times[k]) < proto.min_runs or sum(times[k]) < proto.min_seconds

    base: list[int] = []  # the rounds the minimum took, once reached

    def more(rounds: int) -> bool:
        live = [k for k in range(n) if k not in failed]
        if any(wanted(k) for k in live):
            return True
        if settle is None or len(live) < n:
            return False
        if not base:
            base.append(rounds)
        return rounds < proto.extend * base[0] and not settle(times)

    wall0 = time.perf_counter()
    rounds = 0
    while (more(rounds) and rounds < proto.max_runs
           and time.perf_counter() - wall0 < proto.max_seconds):
        order = [k for k in range(n) if k not in failed]
        for k in order[::-1] if alternate and rounds % 2 else order:
            whole = proto.check == "every" or not checked[k]
            seconds, rel, failure = _run_checked(exes[k], inputs, out, check, whole, timer,
                                                 flush)
            checked[k] = True
            if failure:
                failed[k] = Measurement.failed(f"run {len(times[k])}: {failure}",
                                               len(times[k]), rel)
                continue
            worst[k] = max(worst[k], rel)
            times[k].append(seconds)
        rounds += 1
    return [failed[k] if k in failed else _summary(times[k], worst[k]) for k in range(n)]


def measure_interleaved(
    exes: Sequence[Executable],
    inputs: Mapping[str, np.ndarray],
    out_shape: tuple[int, ...],
    reference: np.ndarray,
    timing: TimingProtocol = TIMING["gate"],
    *,
    flush_cache: bool = True,
    llc_bytes: int | None = None,
    timer: Timer | None = None,
    flusher: Callable[[], None] | None = None,
    settle: Settle | None = None,
    alternate: bool = False,
    **overrides: Any,
) -> list[Measurement]:
    """Time executables of one program against each other: each is warmed up, then in
    rounds each runs once, in the given order (A B A B ...; `alternate`: the order
    reversed every other round, A B B A ..., so neither always runs first), on the same inputs, into
    the same output buffer, under the same flush rule and checks as `measure`, until
    each has `min_runs` runs and `min_seconds` of timed work (at most `max_runs`
    rounds and `max_seconds`). A drift of the machine's speed (another process, the
    host, the clock) then lands on all of them alike, which separate measurements
    taken minutes apart (or replayed from a cache) cannot promise. One that fails a
    check leaves the rounds with a failed measurement; the others go on. With `settle`,
    once the minimum is reached the rounds go on while `settle(times)` is False, up to
    `extend` times the rounds the minimum took (and `max_runs`, `max_seconds`). One
    measurement per executable, in order, each stamped with the load probe; its
    `times` are in round order, so round i of each forms a pair.

    >>> inputs = random_inputs({"x": (64,)}, seed=0)
    >>> ref = inputs["x"].astype(np.float64) * 2
    >>> def a(ins, out): np.multiply(ins["x"], 2, out=out)
    >>> def b(ins, out): np.add(ins["x"], ins["x"], out=out)
    >>> ms = measure_interleaved([a, b], inputs, (64,), ref, min_seconds=0, flush_cache=False)
    >>> [m.ok and m.runs == 15 for m in ms]
    [True, True]
    """
    proto = _validated(timing, overrides, inputs, out_shape, reference)
    with timing_session() as session:
        probe = session.probe()
        if flusher is None and flush_cache:
            flusher = _llc_flusher(inputs, tuple(out_shape), proto.dtype, llc_bytes)
        ms = _interleave(exes, inputs, tuple(out_shape), reference, proto,
                         timer or perf_counter_timer, flusher, settle, alternate)
    return [replace(m, probe=probe) for m in ms]


def _validated(timing: TimingProtocol, overrides: Mapping[str, Any],
               inputs: Mapping[str, np.ndarray], out_shape: tuple[int, ...],
               reference: np.ndarray) -> TimingProtocol:
    """The protocol with `overrides`, after checking it, the reference and the inputs."""
    proto = timing.with_overrides(overrides)
    if proto.dtype not in ERROR_BOUNDS:
        raise ValueError(f"unsupported dtype {proto.dtype!r}; known: {', '.join(ERROR_BOUNDS)}")
    if proto.check not in CHECKS:
        raise ValueError(f"unknown output check {proto.check!r}; known: {', '.join(CHECKS)}")
    if tuple(np.shape(reference)) != tuple(out_shape):
        raise ValueError(f"reference shape {np.shape(reference)} != out_shape {tuple(out_shape)}")
    # a finite sum means every element is finite (one pass, no temporary)
    finite = math.isfinite(float(np.sum(reference))) or bool(np.all(np.isfinite(reference)))
    if not finite:
        raise ValueError("the reference has NaN or infinite values: choose other inputs")
    check_inputs(inputs)
    return proto


def measure(
    exe: Executable | Recipe,
    inputs: Mapping[str, np.ndarray],
    out_shape: tuple[int, ...],
    reference: np.ndarray,
    timing: TimingProtocol = TIMING["bench"],
    *,
    flush_cache: bool = True,
    llc_bytes: int | None = None,
    separate_process: bool = False,
    timeout_s: float = 600.0,
    timer: Timer | None = None,
    flusher: Callable[[], None] | None = None,
    **overrides: Any,
) -> Measurement:
    """Time `exe` by the protocol in the module docstring and check every run's output.

    `timing` holds the protocol's settings (default `TIMING["bench"]`); keyword
    `overrides` replace fields of it (`min_runs=3, dtype="float64"`).
    `reference` is the float64 result in the output's layout (`out_shape`). `timer`
    defaults to `perf_counter_timer`; `flusher` overrides the CPU LLC flush (a GPU
    passes `cuda_l2_flusher`). Returns a `Measurement`; a kernel that fails a check,
    raises or crashes gives `ok=False` with the reason in `failure`.
    """
    proto = _validated(timing, overrides, inputs, out_shape, reference)
    with timing_session() as session:
        probe = session.probe()
        if separate_process:
            m = _measure_in_subprocess(exe, dict(inputs), tuple(out_shape), reference, proto,
                                       flush_cache, llc_bytes, timeout_s)
        else:
            m = _measure_here(exe, inputs, tuple(out_shape), reference, proto, flush_cache,
                              llc_bytes, timer, flusher)
    return replace(m, probe=probe)


def _measure_here(exe: Executable | Recipe, inputs: Mapping[str, np.ndarray],
                  out_shape: tuple[int, ...], reference: np.ndarray, proto: TimingProtocol,
                  flush_cache: bool, llc_bytes: int | None, timer: Timer | None,
                  flusher: Callable[[], None] | None) -> Measurement:
    """`measure` in this process, the lock already held (by this or the parent process)."""
    dtype = proto.dtype
    if isinstance(exe, Recipe):
        exe = exe.build()
    if flusher is None and flush_cache:
        flusher = _llc_flusher(inputs, out_shape, dtype, llc_bytes)
    return _protocol(exe, inputs, tuple(out_shape), reference, proto,
                     timer or perf_counter_timer, flusher)


def _llc_flusher(inputs: Mapping[str, np.ndarray], out_shape: tuple[int, ...], dtype: str,
                 llc_bytes: int | None) -> Callable[[], None] | None:
    """The LLC flush before each timed run when inputs and output fit in the LLC."""
    llc = llc_bytes if llc_bytes is not None else default_llc_bytes()
    footprint = sum(a.nbytes for a in inputs.values()) + math.prod(out_shape) * np.dtype(
        dtype).itemsize
    if footprint >= llc:
        return None
    # Writing a few times the working set evicts it from an LRU-like cache; a full pass
    # over a huge shared LLC (480 MiB reported on these VMs) would only make every
    # measurement slow.
    return cpu_flusher(int(min(FLUSH_FACTOR * llc, max(4 * footprint, 8 << 20))))


# -- in a separate process ----------------------------------------------------------------


def _child(conn: Any, exe: Any, inputs: dict[str, np.ndarray], out_shape: tuple[int, ...],
           reference: np.ndarray, proto: TimingProtocol, flush_cache: bool,
           llc_bytes: int | None) -> None:
    try:  # the parent holds the timing lock for this process
        result = _measure_here(exe, inputs, out_shape, reference, proto, flush_cache,
                               llc_bytes, None, None)
    except Exception as exc:
        result = Measurement.failed(f"in the timing process: {type(exc).__name__}: {exc}")
    conn.send(result)
    conn.close()


def _measure_in_subprocess(exe: Any, inputs: dict[str, np.ndarray], out_shape: tuple[int, ...],
                           reference: np.ndarray, proto: TimingProtocol, flush_cache: bool,
                           llc_bytes: int | None, timeout_s: float) -> Measurement:
    ctx = mp.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(sender, exe, inputs, out_shape, reference, proto,
                                            flush_cache, llc_bytes), daemon=True)
    proc.start()
    sender.close()
    result: Measurement | None = None
    try:
        if receiver.poll(timeout_s):
            result = receiver.recv()
    except (EOFError, OSError):
        result = None
    proc.join(timeout=10)
    if proc.is_alive():
        proc.kill()
        proc.join()
        if result is None:
            return Measurement.failed(f"timed out after {timeout_s:g} s in the timing process")
    if result is None:
        return Measurement.failed(f"the timing process died (exit code {proc.exitcode})")
    return result
