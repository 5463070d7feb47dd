"""The probes' C library, compiled once: the STREAM triad `a[i] = b[i] + s * c[i]`, a
read-only stream (`read_sum`) and an FMA-throughput loop (`fma_loop`), all with OpenMP,
and the machine-load probe made of the triad.

`fma_loop` keeps twelve independent vector accumulators per thread (more than FMA
latency x FMA pipes on any current core), at the widest vector width the compiler
targets (`-march=native`), so its rate is the cores' achieved FP32 FMA peak at the
clock they really run at: on a VM /proc/cpuinfo reports the TSC's frequency, not the
boost clock, and a peak computed from it can be far below what a GEMM reaches.

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
#include <omp.h>
#if defined(__AVX512F__)
#define KS_PROBE_BYTES 64
#elif defined(__AVX__)
#define KS_PROBE_BYTES 32
#else
#define KS_PROBE_BYTES 16
#endif
#define KS_PL (KS_PROBE_BYTES / 4)
typedef float ks_pv __attribute__((vector_size(KS_PROBE_BYTES)));
typedef float ks_pvu __attribute__((vector_size(KS_PROBE_BYTES), aligned(4)));
int probe_lanes(void) { return KS_PL; }
int probe_threads(void) { return omp_get_max_threads(); }
/* iters x 12 FMAs of KS_PL lanes per thread; the sum keeps the loop alive */
float fma_loop(long iters, float seed) {
    float total = 0.0f;
    #pragma omp parallel reduction(+:total)
    {
        ks_pv b, c, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11;
        for (int k = 0; k < KS_PL; k++) {
            b[k] = 1.0f - 1e-7f * seed; c[k] = 1e-7f * seed;
            a0[k] = seed + k; a1[k] = a0[k] + 1; a2[k] = a0[k] + 2; a3[k] = a0[k] + 3;
            a4[k] = a0[k] + 4; a5[k] = a0[k] + 5; a6[k] = a0[k] + 6; a7[k] = a0[k] + 7;
            a8[k] = a0[k] + 8; a9[k] = a0[k] + 9; a10[k] = a0[k] + 10; a11[k] = a0[k] + 11;
        }
        for (long i = 0; i < iters; i++) {
            a0 = a0 * b + c; a1 = a1 * b + c; a2 = a2 * b + c; a3 = a3 * b + c;
            a4 = a4 * b + c; a5 = a5 * b + c; a6 = a6 * b + c; a7 = a7 * b + c;
            a8 = a8 * b + c; a9 = a9 * b + c; a10 = a10 * b + c; a11 = a11 * b + c;
        }
        ks_pv s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
        for (int k = 0; k < KS_PL; k++) total += s[k];
    }
    return total;
}
/* the sum of a[0 .. n / (4 KS_PL) * 4 KS_PL): a read-only stream, four vector sums */
float read_sum(const float *restrict a, long n) {
    float total = 0.0f;
    #pragma omp parallel reduction(+:total)
    {
        ks_pv s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
        #pragma omp for schedule(static)
        for (long i = 0; i < n / (4 * KS_PL); i++) {
            const float *p = a + i * 4 * KS_PL;
            s0 += *(const ks_pvu *)p; s1 += *(const ks_pvu *)(p + KS_PL);
            s2 += *(const ks_pvu *)(p + 2 * KS_PL); s3 += *(const ks_pvu *)(p + 3 * KS_PL);
        }
        ks_pv s = s0 + s1 + s2 + s3;
        for (int k = 0; k < KS_PL; k++) total += s[k];
    }
    return total;
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
