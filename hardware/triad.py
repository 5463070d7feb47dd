"""The STREAM triad `a[i] = b[i] + s * c[i]` in C with OpenMP, compiled once, and the
machine-load probe made of it.

`load_probe` is the cheap probe taken with every batch of timings (see
`kernelsat.hardware.timing_lock`): the median time of a few small parallel triads, a
few milliseconds in all. A machine busy with other work slows it down (one thread of
the OpenMP team descheduled holds up the whole loop, as it holds up the kernels), so
a probe much slower than the best one recorded on the machine says the timings taken
with it were taken under load.

>>> load_probe(n=1 << 12, reps=3) > 0
True
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from kernelsat.hardware.config import cache_dir

TRIAD_C = r"""
#include <stddef.h>
void triad(float *restrict a, const float *restrict b, const float *restrict c,
           float s, long n) {
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}
void touch(float *restrict a, long n, float v) {
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) a[i] = v;
}
"""


def compile_triad(folder: Path) -> ctypes.CDLL | None:
    """The triad library, compiled into `folder` once (None without gcc, or when
    `folder` cannot be written)."""
    digest = hashlib.sha256(TRIAD_C.encode()).hexdigest()[:12]
    lib = folder / f"triad_{digest}.so"
    if not lib.exists():
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None  # an unwritable cache folder: the numpy triad
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "triad.c"
            src.write_text(TRIAD_C)
            out = folder / f".{lib.name}.{os.getpid()}.tmp"  # same folder: an atomic rename
            cmd = ["gcc", "-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", str(src),
                   "-o", str(out)]
            try:
                subprocess.run(cmd, check=True, capture_output=True, timeout=60)
                out.replace(lib)
            except (OSError, subprocess.SubprocessError):
                out.unlink(missing_ok=True)
                return None
    try:
        return ctypes.CDLL(str(lib))
    except OSError:
        return None


LOAD_PROBE_N = 1 << 18
"""Elements per array of the load probe's triads (3 MiB in all: cache-resident, so it
times the threads' cooperation more than the memory)."""

LOAD_PROBE_REPS = 9


@functools.lru_cache(maxsize=1)
def _probe_lib() -> ctypes.CDLL | None:
    lib = compile_triad(cache_dir() / "probe")
    if lib is None:  # an unwritable cache folder: this process's own copy
        lib = compile_triad(Path(tempfile.mkdtemp(prefix="kernelsat-probe-")))
    if lib is not None:
        ptr = ctypes.POINTER(ctypes.c_float)
        lib.triad.argtypes = [ptr, ptr, ptr, ctypes.c_float, ctypes.c_long]
    return lib


def load_probe(n: int = LOAD_PROBE_N, reps: int = LOAD_PROBE_REPS) -> float:
    """Seconds of the median of `reps` small triads over `n` float32 elements, run on
    every core with OpenMP (numpy when gcc is missing): the machine-load probe."""
    a, b, c = (np.full(n, v, np.float32) for v in (0.5, 1.0, 2.0))
    lib = _probe_lib()
    if lib is not None:
        ptr = ctypes.POINTER(ctypes.c_float)
        pa, pb, pc = (x.ctypes.data_as(ptr) for x in (a, b, c))

        def run() -> None:
            lib.triad(pa, pb, pc, 3.0, n)
    else:
        def run() -> None:
            np.multiply(c, 3.0, out=a)
            np.add(a, b, out=a)

    run()  # the thread team starts on the first call
    times = []
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        run()
        times.append((time.perf_counter_ns() - t0) / 1e9)
    return float(np.median(times))
