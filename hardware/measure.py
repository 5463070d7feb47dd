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
from collections.abc import Callable, Mapping
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

    def build(self) -> Executable:
        lowered = lower(parse_term(self.sexpr), self.out_axes)
        return build(lowered, self.backend, json.loads(self.knobs_json))


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
        if arr.size > 1 and bool(np.all(arr == arr.flat[0])):
            raise ValueError(f"input {name!r} is constant ({arr.flat[0]!r}); use random inputs")


def check_output(out: np.ndarray, reference: np.ndarray, dtype: str) -> tuple[float, str]:
    """(relative L2 error, failure message or "") of one run's output."""
    nan_count = int(np.count_nonzero(np.isnan(out)))
    if nan_count:
        return math.nan, f"{nan_count} of {out.size} output elements unwritten or NaN"
    if not bool(np.all(np.isfinite(out))):
        return math.inf, "output has infinities"
    ref = np.asarray(reference, np.float64)
    # plain reductions, not BLAS: BLAS threads would fight the kernel's OpenMP threads
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
    # optimize: every knob setting of every candidate (the noise floor of a ranking)
    "optimize": TimingProtocol(min_runs=5, min_seconds=0.1),
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


def _poison(out: np.ndarray) -> None:
    out.fill(np.nan)


def _run_checked(exe: Executable, inputs: Mapping[str, np.ndarray], out: np.ndarray,
                 reference: np.ndarray, dtype: str, timed: Callable[[Callable[[], Any]], float],
                 before: Callable[[], None] | None) -> tuple[float, float, str]:
    """Poison, (flush), run, check: (seconds, rel_err, failure)."""
    _poison(out)
    if before is not None:
        before()
    try:
        seconds = timed(lambda: exe(inputs, out))
    except Overran:
        return math.inf, math.nan, ""
    except Exception as exc:  # a failing kernel is a result, not a crash of the caller
        return math.nan, math.nan, f"raised {type(exc).__name__}: {exc}"
    rel, failure = check_output(out, reference, dtype)
    return seconds, rel, failure


def _protocol(exe: Executable, inputs: Mapping[str, np.ndarray], out_shape: tuple[int, ...],
              reference: np.ndarray, proto: TimingProtocol, timer: Timer,
              flush: Callable[[], None] | None) -> Measurement:
    out = np.empty(out_shape, proto.dtype)
    _poison(out)  # first touch outside the timed region
    worst = 0.0
    limit = proto.max_run_seconds
    cancel = getattr(exe, "cancel", None)
    warm_timer = timer
    if cancel is not None and math.isfinite(limit):
        warm_timer = watchdog_timer(timer, cancel, limit)
    for i in range(proto.warmup):
        seconds, rel, failure = _run_checked(exe, inputs, out, reference, proto.dtype,
                                             warm_timer, None)
        if seconds == math.inf:
            return Measurement.failed(f"too slow: a run was stopped at the limit ({limit:.3g} s)")
        if failure:
            return Measurement.failed(f"warm-up run {i}: {failure}", 0, rel)
        if seconds > limit:
            return Measurement.failed(
                f"too slow: a run took {seconds:.3g} s (limit {limit:.3g} s)", 0, rel)
        worst = max(worst, rel)
    times: list[float] = []
    wall0 = time.perf_counter()
    while (len(times) < proto.min_runs or sum(times) < proto.min_seconds) and (
        len(times) < proto.max_runs and time.perf_counter() - wall0 < proto.max_seconds
    ):
        seconds, rel, failure = _run_checked(exe, inputs, out, reference, proto.dtype, timer, flush)
        if failure:
            return Measurement.failed(f"run {len(times)}: {failure}", len(times), rel)
        worst = max(worst, rel)
        times.append(seconds)
    if not times:
        return Measurement.failed("no timed run fitted in max_seconds", 0, worst)
    q1, median, q3 = (float(v) for v in np.percentile(times, [25, 50, 75]))
    return Measurement(median, q1, q3, len(times), worst, True, "", tuple(times))


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
    proto = timing.with_overrides(overrides)
    if proto.dtype not in ERROR_BOUNDS:
        raise ValueError(f"unsupported dtype {proto.dtype!r}; known: {', '.join(ERROR_BOUNDS)}")
    if tuple(np.shape(reference)) != tuple(out_shape):
        raise ValueError(f"reference shape {np.shape(reference)} != out_shape {tuple(out_shape)}")
    if not bool(np.all(np.isfinite(reference))):
        raise ValueError("the reference has NaN or infinite values: choose other inputs")
    check_inputs(inputs)
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
        llc = llc_bytes if llc_bytes is not None else default_llc_bytes()
        footprint = sum(a.nbytes for a in inputs.values()) + math.prod(out_shape) * np.dtype(
            dtype).itemsize
        if footprint < llc:
            # Writing a few times the working set evicts it from an LRU-like cache; a full
            # pass over a huge shared LLC (480 MiB reported on these VMs) would only make
            # every measurement slow.
            flusher = cpu_flusher(int(min(FLUSH_FACTOR * llc, max(4 * footprint, 8 << 20))))
    return _protocol(exe, inputs, tuple(out_shape), reference, proto,
                     timer or perf_counter_timer, flusher)


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
