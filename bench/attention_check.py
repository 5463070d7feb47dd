"""The fused attention kernel (codegen/flash.py) against the previous schedule, the eager
program and (optionally) torch's SDPA, in one run, interleaved.

For each N: specs/attention.ks (B=1, H=8, D=64) is saturated and the single-kernel
online-softmax program extracted as `optimize` does (the `online` cost); it is built
with its default knobs (the fused kernel, `flash` on) and with `flash=False` (the loop
nest that was the default before), and the spec's eager program is built with its
default knobs. The three run alternately on the same float32 inputs, best of `--reps`,
warm caches on every side (no flush), after a check against the float64 interpreter
(N <= 1024) or against each other. Wall and process CPU time (every thread, spin-waits
included) are printed with the machine probe (bench/machine.py).

`--sdpa PYTHON` (a Python with torch, e.g. .venv-torch/bin/python) also times
torch.nn.functional.scaled_dot_product_attention: that Python loads the fused kernel's
compiled library with ctypes and alternates the two in one process, same threads
(torch.set_num_threads(OMP_NUM_THREADS or the cores)), same inputs, no flush, and
checks that the outputs agree.

On a shared machine compare one core with one core (threads wait for cores):

    OMP_NUM_THREADS=1 .venv/bin/python bench/attention_check.py --sdpa .venv-torch/bin/python

    .venv/bin/python bench/attention_check.py [--sizes 1024,2048,4096] [--reps 5]
        [--knobs '{"rowvec": 1}'] [--sdpa PYTHON] [--no-eager] [--no-probe]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernelsat.codegen import build, lower
from kernelsat.codegen.c import CExecutable, buffer_order
from kernelsat.codegen.lower import LoweredProgram
from kernelsat.driver.pipeline import saturate_program
from kernelsat.extract import extract
from kernelsat.extract.online import online_preference
from kernelsat.interp import evaluate_as
from kernelsat.proofs.library import load_library
from kernelsat.spec import load_spec
from kernelsat.testing import relative_error

ROOT = Path(__file__).resolve().parents[1]

SDPA_RUNNER = r"""
import ctypes, json, sys, time
import numpy as np, torch
cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
lib = ctypes.CDLL(cfg["library"])
fn = lib.ks_run
fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal(cfg["shape"]).astype(np.float32) for _ in range(3))
out = np.empty(cfg["shape"], np.float32)
ptrs = (ctypes.c_void_p * 4)(*(a.ctypes.data for a in (q, k, v, out)))
tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
sdpa = torch.nn.functional.scaled_dot_product_attention
fn(ptrs)
ref = sdpa(tq, tk, tv).numpy()
err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
ours, peer = [], []
for _ in range(cfg["reps"]):
    for f, acc in ((lambda: fn(ptrs), ours), (lambda: sdpa(tq, tk, tv), peer)):
        w, c = time.perf_counter(), time.process_time()
        f()
        acc.append((time.perf_counter() - w, time.process_time() - c))
print(json.dumps({"ours": [min(t[0] for t in ours), min(t[1] for t in ours)],
                  "sdpa": [min(t[0] for t in peer), min(t[1] for t in peer)],
                  "error": err, "torch": torch.__version__,
                  "threads": torch.get_num_threads()}))
"""

Timing = tuple[float, float]
"""(best wall seconds, best process CPU seconds)."""


def fused_program(n: int) -> tuple[Any, LoweredProgram, LoweredProgram]:
    """(spec program, fused lowered program, eager lowered program) at N = n."""
    program = load_spec(str(ROOT / "specs/attention.ks"), {"N": n})
    sat = saturate_program(program, load_library())
    best = extract(sat.snapshot, "greedy-tree", cost=online_preference)[0].term
    return program, lower(best, program.out_axes), lower(program.term, program.out_axes)


def runner(exe: Any, env: dict[str, np.ndarray], out: np.ndarray) -> Callable[[], None]:
    return lambda: exe(env, out)


def interleave(fns: list[Callable[[], None]], reps: int) -> list[Timing]:
    for f in fns:
        f()
    times: list[list[Timing]] = [[] for _ in fns]
    for _ in range(reps):
        for f, acc in zip(fns, times, strict=True):
            w, c = time.perf_counter(), time.process_time()
            f()
            acc.append((time.perf_counter() - w, time.process_time() - c))
    return [(min(t[0] for t in ts), min(t[1] for t in ts)) for ts in times]


def sdpa_pair(python: str, exe: CExecutable, lowered: LoweredProgram, reps: int
              ) -> dict[str, Any]:
    order = buffer_order(lowered)
    names = [lowered.buffers[b].user_name or b for b in order]
    if names != ["Q", "K", "V", "out"]:
        raise SystemExit(f"unexpected argument order {names}: the SDPA runner passes Q, K, V, out")
    threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    cfg = {"library": str(exe.library), "shape": list(lowered.buffers["out"].shape),
           "reps": reps, "threads": threads}
    proc = subprocess.run([python, "-c", SDPA_RUNNER, json.dumps(cfg)], capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"SDPA runner failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1024,2048,4096", help="N values, comma-separated")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--knobs", default="", help="JSON knobs for the fused kernel")
    ap.add_argument("--sdpa", default="", metavar="PYTHON", help="a Python with torch")
    ap.add_argument("--no-eager", action="store_true", help="skip the (slow) eager program")
    ap.add_argument("--no-probe", action="store_true")
    args = ap.parse_args()
    try:
        knobs = json.loads(args.knobs) if args.knobs else {}
    except json.JSONDecodeError as err:
        ap.error(f"--knobs is not JSON: {err}")
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
          f"cpus={os.cpu_count()}, no cache flush on any side")
    if not args.no_probe:
        from machine import probe  # bench/machine.py

        print("probe:", json.dumps(probe(quick=True)))
    print(f"{'N':>5} {'fused ms':>9} {'flash=False':>11} {'eager':>9} {'vs old':>7} "
          f"{'vs eager':>8} {'GFLOP/s':>7} | cpu ms: {'fused':>8} {'old':>8} {'eager':>8}")
    for n in (int(s) for s in args.sizes.split(",") if s):
        program, fused, eager = fused_program(n)
        rng = np.random.default_rng(n)
        env = {name: rng.standard_normal(b.shape).astype(np.float32)
               for name, b in ((b.user_name, b) for b in fused.inputs)}
        exes = [build(fused, "c", [knobs]), build(fused, "c", [{"flash": False}])]
        if not args.no_eager:
            exes.append(build(eager, "c"))
        outs = [np.empty(fused.buffers["out"].shape, np.float32) for _ in exes]
        fns = [runner(e, env, o) for e, o in zip(exes, outs, strict=True)]
        for f in fns:
            f()
        if n <= 1024:
            want = evaluate_as(program.term, {k: v.astype(np.float64) for k, v in env.items()},
                               program.out_axes)
        else:
            want = outs[1].astype(np.float64)
        errors = [relative_error(o, want) for o in outs]
        if max(errors) > 3e-4:
            raise SystemExit(f"N={n}: outputs disagree (relative errors {errors})")
        times = interleave(fns, args.reps)
        flops = 4.0 * program.term.shape["b"] * program.term.shape["h"] * n * n * 64
        eager_w, eager_c = times[2] if len(times) > 2 else (float("nan"), float("nan"))
        print(f"{n:>5} {times[0][0] * 1e3:9.2f} {times[1][0] * 1e3:11.2f} {eager_w * 1e3:9.2f} "
              f"{times[1][0] / times[0][0]:7.2f} {eager_w / times[0][0]:8.2f} "
              f"{flops / times[0][0] / 1e9:7.1f} | {times[0][1] * 1e3:16.2f} "
              f"{times[1][1] * 1e3:8.2f} {eager_c * 1e3:8.2f}")
        if args.sdpa:
            exe = exes[0]
            assert isinstance(exe, CExecutable)
            r = sdpa_pair(args.sdpa, exe, fused, args.reps)
            (ow, oc), (sw, sc) = r["ours"], r["sdpa"]
            print(f"{'':>5} SDPA (torch {r['torch']}, {r['threads']} threads, same process): "
                  f"fused {ow * 1e3:.2f} ms vs SDPA {sw * 1e3:.2f} ms, speed {sw / ow:.2f}x "
                  f"(cpu {oc * 1e3:.2f} vs {sc * 1e3:.2f}, {sc / oc:.2f}x); "
                  f"relative error vs SDPA {r['error']:.1e}")
    print("vs old / vs eager / speed: their time over the fused kernel's (> 1: fused faster)")


if __name__ == "__main__":
    main()
