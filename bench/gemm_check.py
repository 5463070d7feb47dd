"""The C backend's blocked GEMM against numpy's BLAS, in one run, interleaved.

For each size M x N x K: the matmul spec's term (C[i, j] = sum_k A[i, k] B[k, j]) lowered
with its default knobs (or `--knobs`), built with gcc, and timed against `np.dot` on the
same float32 inputs, alternating the two, best of `--reps` (warm caches for both: no
flush on either side). Prints ms, GFLOP/s and speed relative to numpy (numpy time /
ours: > 1 is faster), and the same from process CPU time; then the cliff check (the
per-element time of 411x149x297 against 416x160x304: sizes that are not multiples of
any tile against the nearest ones that are) and the machine probe (bench/machine.py).
`--sweep` times a small table of knob settings at the first size (to tune defaults).
`--swiglu T,D,F` times instead the swiglu spec (specs/swiglu.ks) at those sizes: its eager
program (4 kernels: G, U, H, Y), the program with H = silu(X Wg) * (X Wu) as one kernel
(G and U not stored: a multi-contraction GEMM, codegen/gemm.py) and Y = H Wd, and numpy's
(X @ Wg, X @ Wu, silu, @ Wd), alternating, each checked against float64 first.

On a shared machine, threads wait for cores and wall times of both sides mean little;
compare one core against one core there:

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/gemm_check.py

    .venv/bin/python bench/gemm_check.py [--sizes 1024,2048] [--reps 7] [--sweep]
        [--knobs '{"mr": 8, "kc": 384}'] [--no-probe] [--swiglu 1024,1024,2816]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernelsat.codegen import build, lower
from kernelsat.ir import In, Sum, Term, mul, postorder
from kernelsat.ops import REDUCTIONS, Op

SWEEP: list[dict[str, Any]] = [
    {}, {"mr": 8, "nr": 32}, {"mr": 14, "nr": 32}, {"mr": 12, "nr": 32}, {"mr": 4},
    {"mr": 8, "nr": 48}, {"kc": 256}, {"kc": 384}, {"mc": 96}, {"mc": 384}, {"nc": 512},
    {"par": "n"}, {"par": "none"},
]


def matmul(m: int, n: int, k: int, knobs: dict[str, Any] | None
           ) -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    term = Sum("k", mul(In("A", (("i", m), ("k", k))), In("B", (("k", k), ("j", n)))))
    exe = build(lower(term, ("i", "j")), "c", [knobs] if knobs else None)

    def run(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        exe({"A": a, "B": b}, out)

    return run


Timing = tuple[float, float]
"""(wall seconds, CPU seconds of the whole process: every thread, spin-waits included)."""


def best_pair(ours: Callable[[], object], peer: Callable[[], object], reps: int
              ) -> tuple[Timing, Timing]:
    """Best-of-`reps` (wall, cpu) of each, alternating (warm-up run first)."""
    ours(), peer()
    t_ours: list[Timing] = []
    t_peer: list[Timing] = []
    for _ in range(reps):
        for f, acc in ((ours, t_ours), (peer, t_peer)):
            w0, c0 = time.perf_counter(), time.process_time()
            f()
            acc.append((time.perf_counter() - w0, time.process_time() - c0))
    return ((min(t[0] for t in t_ours), min(t[1] for t in t_ours)),
            (min(t[0] for t in t_peer), min(t[1] for t in t_peer)))


def compare(m: int, n: int, k: int, knobs: dict[str, Any] | None, reps: int
            ) -> tuple[Timing, Timing]:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    out = np.empty((m, n), np.float32)
    run = matmul(m, n, k, knobs)
    run(a, b, out)
    err = float(np.max(np.abs(out - a.astype(np.float64) @ b.astype(np.float64))))
    if not err <= 1e-3 * np.sqrt(k):
        raise SystemExit(f"wrong result at {m}x{n}x{k}: max error {err}")
    peer_out = np.empty((m, n), np.float32)
    return best_pair(lambda: run(a, b, out), lambda: np.dot(a, b, out=peer_out), reps)


def unstore_reductions(term: Term) -> Term:
    """`term` without the `Store`s of reductions (their values fused into their readers):
    swiglu's G and U become operands of H's kernel."""
    done: dict[str, Term] = {}
    for t in postorder(term):
        args = tuple(done[a.key] for a in t.args)
        if t.op is Op.STORE and args[0].op in REDUCTIONS and t is not term:
            done[t.key] = args[0]
        else:
            done[t.key] = Term(t.op, args, t.attrs)
    return done[term.key]


def swiglu_check(sizes: tuple[int, int, int], reps: int) -> None:
    """The swiglu spec: eager, H as one multi-contraction kernel, numpy (module docstring)."""
    from kernelsat.interp import evaluate_as
    from kernelsat.spec import load_spec

    t_, d, f = sizes
    program = load_spec(Path(__file__).resolve().parents[1] / "specs" / "swiglu.ks",
                        {"T": t_, "D": d, "F": f})
    rng = np.random.default_rng(0)
    env = {x.name: (rng.standard_normal(x.dims) / np.sqrt(x.dims[0])).astype(np.float32)
           for x in program.inputs}
    ref = np.asarray(evaluate_as(program.term, {k: v.astype(np.float64) for k, v in env.items()},
                                 program.out_axes))
    out = np.empty(ref.shape, np.float32)
    runs: dict[str, Callable[[], object]] = {}
    for label, term in (("eager", program.term), ("fused H", unstore_reductions(program.term))):
        lowered = lower(term, program.out_axes)
        exe = build(lowered, "c")
        exe(env, out)
        err = float(np.max(np.abs(out - ref)))
        if not err <= 1e-3 * (1 + float(np.max(np.abs(ref)))):
            raise SystemExit(f"swiglu {label}: wrong result, max error {err}")
        kinds = [str(k.nest()).splitlines()[0].split(":")[0].strip() for k in lowered.kernels]
        print(f"{label}: {len(lowered.kernels)} kernels: {'; '.join(kinds)}")
        runs[label] = partial(exe, env, out)
    x, wg, wu, wd = env["X"], env["Wg"], env["Wu"], env["Wd"]

    def numpy_swiglu() -> object:
        g = x @ wg
        return (g / (1 + np.exp(-g)) * (x @ wu)) @ wd

    times: dict[str, list[float]] = {k: [] for k in [*runs, "numpy"]}
    for fn in [*runs.values(), numpy_swiglu]:
        fn()
    for _ in range(reps):
        for label, fn in [*runs.items(), ("numpy", numpy_swiglu)]:
            w0 = time.perf_counter()
            fn()
            times[label].append(time.perf_counter() - w0)
    best = {k: min(v) for k, v in times.items()}
    for label, sec in best.items():
        print(f"swiglu T={t_} D={d} F={f} {label:8} {sec * 1e3:8.2f} ms  "
              f"numpy / this {best['numpy'] / sec:5.2f}")


def blas_name() -> str:
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg["Build Dependencies"]["blas"]
        config = blas.get("openblas configuration", "")
        return f"{blas.get('name')} {blas.get('version')} ({config})"
    except Exception:  # numpy without dict mode: just say so
        return "unknown BLAS"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1024,2048", help="square sizes, comma-separated")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--knobs", default="", help="JSON knob dict for the GEMM kernel")
    ap.add_argument("--sweep", action="store_true", help="time a table of knob settings")
    ap.add_argument("--no-probe", action="store_true")
    ap.add_argument("--swiglu", default="", help="T,D,F: time the swiglu spec instead")
    args = ap.parse_args()
    try:
        knobs = json.loads(args.knobs) if args.knobs else None
    except json.JSONDecodeError as err:
        ap.error(f"--knobs is not JSON: {err}")
    sizes = [int(s) for s in args.sizes.split(",") if s]
    print(f"numpy {np.__version__}, BLAS: {blas_name()}, OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, cpus={os.cpu_count()}, "
          f"load {os.getloadavg()[0]:.2f}")
    if not args.no_probe:
        from machine import probe  # bench/machine.py
        print("probe:", json.dumps(probe(quick=True)))
    if args.swiglu:
        try:
            t_, d, f = (int(v) for v in args.swiglu.split(","))
        except ValueError:
            ap.error(f"--swiglu wants T,D,F (three integers), got {args.swiglu!r}")
        swiglu_check((t_, d, f), args.reps)
        return
    print(f"{'M x N x K':>16} {'ours ms':>8} {'numpy ms':>8} {'GFLOP/s':>7} {'speed':>6}"
          f" {'ours cpu':>8} {'numpy cpu':>9} {'cpu speed':>9}")
    for s in sizes:
        (ours, ours_cpu), (peer, peer_cpu) = compare(s, s, s, knobs, args.reps)
        print(f"{f'{s}x{s}x{s}':>16} {ours * 1e3:8.2f} {peer * 1e3:8.2f} "
              f"{2 * s**3 / ours / 1e9:7.1f} {peer / ours:6.2f} {ours_cpu * 1e3:8.2f} "
              f"{peer_cpu * 1e3:9.2f} {peer_cpu / ours_cpu:9.2f}")
    print("speed = numpy time / ours (> 1: ours faster); cpu: process CPU time of all threads")
    odd, even = (411, 149, 297), (416, 160, 304)
    for label, pick in (("wall", 0), ("cpu", 1)):
        t_odd = compare(*odd, knobs, args.reps)[0][pick]
        t_even = compare(*even, knobs, args.reps)[0][pick]
        per = (t_odd / np.prod(odd)) / (t_even / np.prod(even))
        print(f"cliff ({label}): 411x149x297 {t_odd * 1e3:.3f} ms, 416x160x304 "
              f"{t_even * 1e3:.3f} ms, per-element ratio {per:.2f} (target <= 1.5)")
    if args.sweep:
        s = sizes[0]
        print(f"sweep at {s}^3 (speed = numpy / ours, wall and cpu, same run):")
        for extra in SWEEP:
            setting = {**(knobs or {}), **extra}
            (ours, ours_cpu), (peer, peer_cpu) = compare(s, s, s, setting, args.reps)
            print(f"  {json.dumps(setting):40} {ours * 1e3:8.2f} ms  {peer / ours:5.2f}"
                  f"  {peer_cpu / ours_cpu:5.2f}")


if __name__ == "__main__":
    main()
