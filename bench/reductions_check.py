"""The reduction kernels' eager C time against numpy, ratios taken within one run.

For each reduction spec (softmax, layernorm, rmsnorm, logsumexp, cross_entropy, l2norm,
variance, batchnorm, rowsum, row_range) at its default sizes: the eager program through
the C target at its default knobs, and the numpy a user would write
(`bench/eager_vs_numpy.py`'s `NUMPY`), both by `kernelsat.hardware.measure` with the
same cache treatment (LLC flushed before every run, for both), alternated `--repeat`
times so that a noisy, shared machine hits both alike. Prints one Markdown table (median
of the repeats' medians, the numpy / C ratio of each repeat) and the machine probe
before and after; `--out` also writes it to a file.

The roofline column is `kernelsat.hardware.cost.estimate_term` on the C target (the
larger of compulsory DRAM traffic over bandwidth and work over peak).

    .venv/bin/python bench/reductions_check.py [--spec softmax ...] [--repeat 3]
        [--knobs '{"softmax": [{"keep": false}]}'] [-p N=512] [--out FILE]
        [--alt '{"softmax": [{"keep": false}]}']

`--cpu-time`: one OpenMP thread and each run's thread CPU time (`time.thread_time`) for
every side, numpy included (its call and the copy into the checked output): on a machine
that other jobs share, CPU time moves far less with their load than wall time does, so
ratios of schedule decisions stay readable (absolute times are single-thread times).

`--alt` adds a column: the same spec under other knobs, timed in the same repeats
(alternating with the default), for before/after ratios of a schedule decision within
one run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from kernelsat.codegen import build, lower
from kernelsat.hardware.bench import out_shape, reference
from kernelsat.hardware.cost import estimate_term
from kernelsat.hardware.measure import measure
from kernelsat.hardware.targets import get_target

ROOT = Path(__file__).resolve().parent.parent
SPECS = ("softmax", "layernorm", "rmsnorm", "logsumexp", "cross_entropy", "l2norm",
         "variance", "batchnorm", "rowsum", "row_range")


def run_spec(name: str, params: dict[str, int], knobs: Any, repeat: int,
             kw: dict[str, Any], alt: Any = None) -> dict[str, Any]:
    """Time one spec: C (eager program, `knobs` or defaults) and numpy, `repeat` times."""
    from eager_vs_numpy import NUMPY, time_function  # the numpy a user writes

    fn = NUMPY[name]

    from kernelsat.inputs import random_inputs
    from kernelsat.spec import load_spec

    path = ROOT / "specs" / f"{name}.ks"
    declared = load_spec(path).params
    prog = load_spec(path, {k: v for k, v in params.items() if k in declared})
    inputs = {k: v.astype(np.float32) for k, v in random_inputs(prog, seed=0).items()}
    shape = out_shape(prog.term, prog.out_axes)
    ref = reference(prog.term, prog.out_axes, inputs)
    lowered = lower(prog.term, prog.out_axes)
    exe = build(lowered, "c", knobs)
    alt_exe = build(lowered, "c", alt) if alt is not None else None
    alt_times: list[float] = []
    c_times: list[float] = []
    np_times: list[float] = []
    for _ in range(repeat):
        mc = measure(exe, inputs, shape, ref, **kw)
        if "timer" in kw:  # CPU time: numpy's call and copy, timed like the C side
            def np_exe(x: Any, out: np.ndarray) -> None:
                out[...] = np.reshape(np.asarray(fn(x, prog.params)), shape)

            mn = measure(np_exe, inputs, shape, ref, **kw)
        else:
            mn = time_function(fn, inputs, prog.params, shape, ref, dict, np.asarray, **kw)
        if not mc.ok:
            raise SystemExit(f"{name}: C run failed: {mc.failure}")
        c_times.append(mc.median)
        if alt_exe is not None:
            ma = measure(alt_exe, inputs, shape, ref, **kw)
            alt_times.append(ma.median if ma.ok else float("nan"))
        np_times.append(mn.median if mn.ok else float("nan"))
    return {"spec": name, "params": prog.params, "c": c_times, "numpy": np_times,
            "alt": alt_times, "alt_knobs": alt,
            "roofline": estimate_term(prog.term, get_target("c")),
            "knobs": [k.resolve(s) for k, s in zip(lowered.kernels, knobs or [None] * len(
                lowered.kernels), strict=True)]}


def table(rows: list[dict[str, Any]]) -> str:
    head = ["spec", "params", "C ms", "numpy ms", "numpy / C (each repeat)",
            "roofline ms", "C of roofline", "C with --alt knobs ms (alt / C)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        c, n = statistics.median(r["c"]), statistics.median(r["numpy"])
        ratios = " ".join(f"{b / a:.2f}" for a, b in zip(r["c"], r["numpy"], strict=True))
        params = " ".join(f"{k}={v}" for k, v in r["params"].items())
        lines.append(f"| {r['spec']} | {params} | {c * 1e3:.3g} | {n * 1e3:.3g} | {ratios} | "
                     f"{r['roofline'] * 1e3:.3g} | {r['roofline'] / c:.0%} | {_alt(r)} |")
    return "\n".join(lines)


def _alt(r: dict[str, Any]) -> str:
    if not r["alt"]:
        return "—"
    ratios = " ".join(f"{b / a:.2f}" for a, b in zip(r["c"], r["alt"], strict=True))
    return f"{statistics.median(r['alt']) * 1e3:.3g} ({ratios}) {r['alt_knobs']}"


def cpu_timer(thunk: Callable[[], Any]) -> float:
    """The calling thread's CPU time of one run (OpenMP must run one thread)."""
    t0 = time.thread_time()
    thunk()
    return time.thread_time() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", action="append", help="only these specs (default: all ten)")
    parser.add_argument("--repeat", type=int, default=3, help="alternations of C and numpy")
    parser.add_argument("--knobs", default="{}",
                        help="JSON: spec -> list of per-kernel knob dicts (default knobs else)")
    parser.add_argument("--alt", default="{}",
                        help="JSON: spec -> knob dicts timed beside the default (same run)")
    parser.add_argument("-p", "--param", action="append", default=[], help="K=V for every spec")
    parser.add_argument("--out", type=Path, help="also write the table here")
    parser.add_argument("--cpu-time", action="store_true",
                        help="one OpenMP thread, thread CPU time per run (see the docstring)")
    args = parser.parse_args()
    if args.cpu_time:
        os.environ["OMP_NUM_THREADS"] = "1"  # before any kernel starts OpenMP
    from kernelsat.spec import parse_params

    sys.path.insert(0, str(ROOT / "bench"))
    from machine import probe

    knobs = json.loads(args.knobs)
    params = parse_params(args.param)
    kw: dict[str, Any] = {"min_runs": 10, "min_seconds": 0.3, "warmup": 2}
    if args.cpu_time:
        kw["timer"] = cpu_timer
    before = probe()
    rows = []
    for name in args.spec or SPECS:
        print(f"{name} ...", file=sys.stderr, flush=True)
        rows.append(run_spec(name, params, knobs.get(name), args.repeat, kw,
                             json.loads(args.alt).get(name)))
    after = probe()
    text = "\n".join([
        "Produced by `python bench/reductions_check.py " + " ".join(sys.argv[1:]) + "`", "",
        *(f"Machine ({when}): {p['cpu']} x{p['cores']}, matmul {p['matmul_gflops']} GFLOP/s, "
          f"triad {p['triad_gb_s']} GB/s, load {p['load_avg_1m']:.2f}, {p['when']}"
          for when, p in (("before", before), ("after", after))), "",
        "Both sides flush the LLC before every run; C = the eager program at "
        "its default knobs unless --knobs says otherwise."
        + (" CPU time of one thread (--cpu-time); the roofline is the whole machine's "
           "(both cores), so 'C of roofline' understates a one-thread figure by up to 2x."
           if args.cpu_time else ""), "",
        table(rows), "",
        "Knobs: " + "; ".join(f"{r['spec']} {r['knobs']}" for r in rows), ""])
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
