"""Probe how fast this machine is right now, to print beside other benchmarks.

A fixed compute workload (a 1024^3 float32 matmul through numpy's BLAS, best of 5)
and a memory-bandwidth triad (C with OpenMP when gcc is available, else numpy; best
of 5 over arrays larger than the last-level cache), printed with a timestamp and the
detected CPU. Shared or throttled machines show up as numbers below their usual
ones; run it before and after a benchmark.

    .venv/bin/python bench/machine.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time

from kernelsat.hardware.cpu import detect_cpu
from kernelsat.hardware.probe import matmul_gflops, triad
from kernelsat.hardware.targets import get_target


def probe(quick: bool = False) -> dict[str, object]:
    """The probe's figures as a dict."""
    cpu = detect_cpu()
    target = get_target("cpu")
    t0 = time.perf_counter()
    gflops = matmul_gflops(n=512 if quick else 1024, reps=3 if quick else 5)
    bw = triad(n=1 << 22 if quick else None, reps=3 if quick else 5)
    return {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpu": cpu.model,
        "cores": cpu.cores,
        "load_avg_1m": os.getloadavg()[0],
        "matmul_gflops": round(gflops, 2),
        "peak_fp32_gflops": round(target.peak_fp32 / 1e9, 1),
        "triad_gb_s": round(bw.bandwidth / 1e9, 2),
        "triad_engine": bw.engine,
        "triad_bytes_per_array": bw.n * 4,
        "quick": quick,
        "probe_seconds": round(time.perf_counter() - t0, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (in-cache triad)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    result = probe(args.quick)
    if args.json:
        print(json.dumps(result))
        return
    print(f"[machine {result['when']}] {result['cpu']} x{result['cores']}  "
          f"load {result['load_avg_1m']:.2f}  matmul {result['matmul_gflops']} GFLOP/s "
          f"(peak {result['peak_fp32_gflops']})  triad {result['triad_gb_s']} GB/s "
          f"({result['triad_engine']}{', quick: in cache' if args.quick else ''})")


if __name__ == "__main__":
    main()
