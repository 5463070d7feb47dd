"""Probing the machine: memory bandwidth (a STREAM-like triad and a read-only stream),
the cores' FP32 FMA peak, and a fixed workload.

The triad `a[i] = b[i] + s * c[i]` over arrays far larger than the last-level cache
moves 3 x 4 bytes per element (STREAM's convention: write-allocate traffic is not
counted). It runs in C with OpenMP when gcc is available (compiled once into the
cache folder), else in numpy (which needs two passes, so it is reported with its
real traffic, 5 x 4 bytes per element, and reads lower). The best of several
repetitions is kept, as STREAM does. The read-only stream (`read_stream`) sums an
array four times the LLC; reads alone run faster than the triad's mix, and most
kernels read far more than they write, so the roofline's bandwidth is the better of
the two. `fma_peak` times `kernelsat.hardware.triad`'s FMA loop: the FP32 rate the
cores really reach (a VM's /proc/cpuinfo gives the TSC frequency, not the boost clock).

These figures are measured once per CPU and cached in `<cache dir>/bandwidth.json`
(`machine_figures`); a figure is a bound, so a later measurement only ever raises it.
A measurement is "quiet" when the probe's threads got the CPU time they asked for (at
least `QUIET_CPU_SHARE` of wall time x threads: nothing else ran on its cores); one that
was not quiet is taken again at the next probe, up to `PROBE_TRIES` times in all.

Each probe is a timing: it runs holding the machine-wide timing lock
(`kernelsat.hardware.timing_lock`), so another kernelsat process timing at once cannot
halve it. The C kernels are in `kernelsat.hardware.triad`.
"""

from __future__ import annotations

import ctypes
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kernelsat.cachefile import read_json_cache, write_json_cache
from kernelsat.hardware.config import cache_dir
from kernelsat.hardware.cpu import detect_cpu
from kernelsat.hardware.timing_lock import timing_session
from kernelsat.hardware.triad import compile_triad


@dataclass(frozen=True)
class TriadResult:
    """Best bandwidth (bytes/s) of `reps` triads over `n` float32 elements."""

    bandwidth: float
    n: int
    reps: int
    engine: str  # "c-openmp" or "numpy"


def triad(n: int | None = None, reps: int = 5, *, folder: str | Path | None = None) -> TriadResult:
    """Measure memory bandwidth with a triad over `n` float32 elements (default: each
    array as large as the last-level cache and at least 128 MiB, so the three together
    are at least three times the LLC)."""
    if n is None:
        n = max(1 << 25, detect_cpu().llc_bytes // 4)
    a, b, c = (np.empty(n, np.float32) for _ in range(3))
    lib = compile_triad(cache_dir(folder) / "probe")
    ptr = ctypes.POINTER(ctypes.c_float)
    if lib is not None:
        lib.triad.argtypes = [ptr, ptr, ptr, ctypes.c_float, ctypes.c_long]
        lib.touch.argtypes = [ptr, ctypes.c_long, ctypes.c_float]
        pa, pb, pc = (x.ctypes.data_as(ptr) for x in (a, b, c))
        for p, v in ((pa, 0.5), (pb, 1.0), (pc, 2.0)):  # first touch by the same threads
            lib.touch(p, n, v)

        def run() -> None:
            lib.triad(pa, pb, pc, 3.0, n)

        traffic, engine = 3 * 4 * n, "c-openmp"
    else:
        a.fill(0.5)
        b.fill(1.0)
        c.fill(2.0)

        def run() -> None:
            np.multiply(c, 3.0, out=a)
            np.add(a, b, out=a)

        traffic, engine = 5 * 4 * n, "numpy"
    best = float("inf")
    run()
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        run()
        best = min(best, (time.perf_counter_ns() - t0) / 1e9)
    return TriadResult(traffic / best, n, reps, engine)


def matmul_gflops(n: int = 1024, reps: int = 5) -> float:
    """Best GFLOP/s of an n x n float32 matmul through numpy's BLAS (a fixed compute probe)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, n), dtype=np.float32)
    y = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), np.float32)
    np.matmul(x, y, out=out)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        np.matmul(x, y, out=out)
        best = min(best, (time.perf_counter_ns() - t0) / 1e9)
    return 2 * n**3 / best / 1e9


BANDWIDTH_CACHE = "bandwidth cache"

QUIET_CPU_SHARE = 0.9
"""A probe whose threads got at least this share of wall time x threads as CPU time ran
on otherwise idle cores (its figures are final)."""

PROBE_TRIES = 3
"""Measurements of a CPU's figures before one that was never quiet is accepted."""

FMA_SECONDS = 0.05
"""Seconds of one timed FMA run (after a warm-up of the same length: cores raise their
clock within milliseconds, and the best of several runs is kept)."""


@dataclass(frozen=True)
class MachineFigures:
    """A CPU's measured figures: `bandwidth` (bytes/s, the better of the triad and the
    read-only stream), `peak_fp32` (flops/s of the FMA loop, None without gcc), whether
    the best measurement so far was `quiet`, and how many measurements were taken."""

    bandwidth: float
    peak_fp32: float | None
    quiet: bool
    tries: int
    engine: str

    @property
    def settled(self) -> bool:
        """Whether the figures stand (no further measurement is taken by `probe=True`)."""
        return self.quiet or self.tries >= PROBE_TRIES


def _lib(folder: str | Path | None) -> ctypes.CDLL | None:
    lib = compile_triad(cache_dir(folder) / "probe")
    if lib is not None:
        ptr = ctypes.POINTER(ctypes.c_float)
        lib.fma_loop.argtypes = [ctypes.c_long, ctypes.c_float]
        lib.fma_loop.restype = ctypes.c_float
        lib.read_sum.argtypes = [ptr, ctypes.c_long]
        lib.read_sum.restype = ctypes.c_float
        lib.touch.argtypes = [ptr, ctypes.c_long, ctypes.c_float]
    return lib


def fma_peak(reps: int = 5, *, folder: str | Path | None = None) -> float | None:
    """The best FP32 rate (flops/s) of `reps` runs of the FMA loop on every core
    (`kernelsat.hardware.triad.fma_loop`), each about `FMA_SECONDS`; None without gcc."""
    lib = _lib(folder)
    if lib is None:
        return None
    per_iter = 12 * 2 * lib.probe_lanes() * lib.probe_threads()  # flops, all threads
    iters = 1 << 14
    while True:  # size a run to FMA_SECONDS (this also warms the clock up)
        t0 = time.perf_counter()
        lib.fma_loop(iters, 1.0)
        took = time.perf_counter() - t0
        if took >= FMA_SECONDS / 4 or iters >= 1 << 34:
            break
        iters *= 4
    iters = max(1, int(iters * FMA_SECONDS / max(took, 1e-9)))
    lib.fma_loop(iters, 1.0)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        lib.fma_loop(iters, 1.0)
        best = min(best, time.perf_counter() - t0)
    return per_iter * iters / best


def read_stream(n: int | None = None, reps: int = 5, *,
                folder: str | Path | None = None) -> float | None:
    """The best read bandwidth (bytes/s) of `reps` sums of `n` float32 elements on every
    core (default: four times the LLC and at least 256 MiB); None without gcc."""
    lib = _lib(folder)
    if lib is None:
        return None
    if n is None:
        n = max(1 << 26, detect_cpu().llc_bytes)
    a = np.empty(n, np.float32)
    ptr = a.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    lib.touch(ptr, n, 1.0)  # first touch by the same threads
    lib.read_sum(ptr, n)
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        lib.read_sum(ptr, n)
        best = min(best, time.perf_counter() - t0)
    return 4 * n / best


def _measure_figures(folder: str | Path | None) -> MachineFigures:
    """One measurement of every figure, holding the timing lock."""
    lib = _lib(folder)
    threads = lib.probe_threads() if lib is not None else 1
    with timing_session():
        wall0, cpu0 = time.perf_counter(), time.process_time()
        tri = triad(folder=folder)
        read = read_stream(folder=folder)
        peak = fma_peak(folder=folder)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    quiet = cpu >= QUIET_CPU_SHARE * wall * threads
    bandwidth = max(tri.bandwidth, read or 0.0)
    return MachineFigures(bandwidth, peak, quiet, 1, tri.engine)


def _bandwidth_file(folder: str | Path | None) -> Path:
    return cache_dir(folder) / "bandwidth.json"


def _bandwidths(folder: str | Path | None) -> dict[str, Any]:
    data = read_json_cache(_bandwidth_file(folder), BANDWIDTH_CACHE)
    return data if isinstance(data, dict) else {}


def _positive(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def cached_figures(cpu_key: str, folder: str | Path | None = None) -> MachineFigures | None:
    """The cached figures for this CPU, or None. An entry written before the FMA probe
    existed has no peak and counts as one measurement that was not quiet."""
    entry = _bandwidths(folder).get(cpu_key)
    if not isinstance(entry, dict):
        return None
    bandwidth = _positive(entry.get("bandwidth"))
    if bandwidth is None:
        return None
    tries = entry.get("tries", 1)
    return MachineFigures(bandwidth, _positive(entry.get("peak_fp32")),
                          entry.get("quiet") is True,
                          tries if isinstance(tries, int) and tries > 0 else 1,
                          str(entry.get("engine", "")))


def cached_bandwidth(cpu_key: str, folder: str | Path | None = None) -> float | None:
    """The cached bandwidth for this CPU, or None."""
    figures = cached_figures(cpu_key, folder)
    return None if figures is None else figures.bandwidth


def measure_and_cache_figures(cpu_key: str, folder: str | Path | None = None) -> MachineFigures:
    """Measure the figures now and store, for this CPU, the best of them and of those
    already cached (a bound only rises; a cache that cannot be written only costs a
    warning)."""
    new = _measure_figures(folder)
    old = cached_figures(cpu_key, folder)
    if old is not None:
        peaks = [p for p in (old.peak_fp32, new.peak_fp32) if p is not None]
        new = MachineFigures(max(old.bandwidth, new.bandwidth), max(peaks, default=None),
                             old.quiet or new.quiet, old.tries + 1, new.engine)
    data = _bandwidths(folder)
    data[cpu_key] = {"bandwidth": new.bandwidth, "peak_fp32": new.peak_fp32,
                     "quiet": new.quiet, "tries": new.tries, "engine": new.engine,
                     "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    write_json_cache(_bandwidth_file(folder), data, BANDWIDTH_CACHE)
    return new


def machine_figures(cpu_key: str, folder: str | Path | None = None, *,
                    probe: bool = False) -> MachineFigures | None:
    """This CPU's figures: the cached ones; with `probe`, measured now unless they are
    settled (`MachineFigures.settled`)."""
    figures = cached_figures(cpu_key, folder)
    if probe and (figures is None or not figures.settled):
        figures = measure_and_cache_figures(cpu_key, folder)
    return figures
