"""Probing the machine: a STREAM-like triad for memory bandwidth, and a fixed workload.

The triad `a[i] = b[i] + s * c[i]` over arrays far larger than the last-level cache
moves 3 x 4 bytes per element (STREAM's convention: write-allocate traffic is not
counted). It runs in C with OpenMP when gcc is available (compiled once into the
cache folder), else in numpy (which needs two passes, so it is reported with its
real traffic, 5 x 4 bytes per element, and reads lower). The best of several
repetitions is kept, as STREAM does.

The measured bandwidth is cached per CPU in `<cache dir>/bandwidth.json`.

The triad is a timing, and its figure is cached for good: it runs holding the
machine-wide timing lock (`kernelsat.hardware.timing_lock`), so another kernelsat
process timing at once cannot halve it. The C triad itself is in
`kernelsat.hardware.triad`.
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


def _bandwidth_file(folder: str | Path | None) -> Path:
    return cache_dir(folder) / "bandwidth.json"


def _bandwidths(folder: str | Path | None) -> dict[str, Any]:
    data = read_json_cache(_bandwidth_file(folder), BANDWIDTH_CACHE)
    return data if isinstance(data, dict) else {}


def cached_bandwidth(cpu_key: str, folder: str | Path | None = None) -> float | None:
    """The cached triad bandwidth for this CPU, or None."""
    entry = _bandwidths(folder).get(cpu_key)
    try:
        value = float(entry["bandwidth"]) if isinstance(entry, dict) else None
    except (KeyError, TypeError, ValueError):
        return None
    return value if value is not None and math.isfinite(value) and value > 0 else None


def measure_and_cache_bandwidth(cpu_key: str, folder: str | Path | None = None) -> float:
    """Run the triad now (holding the timing lock) and store its result for this CPU (a
    cache that cannot be written only costs a warning)."""
    with timing_session():
        result = triad(folder=folder)
    data = _bandwidths(folder)
    data[cpu_key] = {"bandwidth": result.bandwidth, "engine": result.engine, "n": result.n,
                     "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    write_json_cache(_bandwidth_file(folder), data, BANDWIDTH_CACHE)
    return result.bandwidth
