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
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
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
             kw: dict[str, Any]) -> dict[str, Any]:
    """Time one spec: C (eager program, `knobs` or defaults) and numpy, `repeat` times."""
    from eager_vs_numpy import NUMPY, time_function  # the numpy a user writes

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
    c_times: list[float] = []
    np_times: list[float] = []
    for _ in range(repeat):
        mc = measure(exe, inputs, shape, ref, **kw)
        mn = time_function(NUMPY[name], inputs, prog.params, shape, ref, dict, np.asarray, **kw)
        if not mc.ok:
            raise SystemExit(f"{name}: C run failed: {mc.failure}")
        c_times.append(mc.median)
        np_times.append(mn.median if mn.ok else float("nan"))
    return {"spec": name, "params": prog.params, "c": c_times, "numpy": np_times,
            "roofline": estimate_term(prog.term, get_target("c")),
            "knobs": [k.resolve(s) for k, s in zip(lowered.kernels, knobs or [None] * len(
                lowered.kernels), strict=True)]}


def table(rows: list[dict[str, Any]]) -> str:
    head = ["spec", "params", "C ms", "numpy ms", "numpy / C (each repeat)",
            "roofline ms", "C of roofline"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        c, n = statistics.median(r["c"]), statistics.median(r["numpy"])
        ratios = " ".join(f"{b / a:.2f}" for a, b in zip(r["c"], r["numpy"], strict=True))
        params = " ".join(f"{k}={v}" for k, v in r["params"].items())
        lines.append(f"| {r['spec']} | {params} | {c * 1e3:.3g} | {n * 1e3:.3g} | {ratios} | "
                     f"{r['roofline'] * 1e3:.3g} | {r['roofline'] / c:.0%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", action="append", help="only these specs (default: all ten)")
    parser.add_argument("--repeat", type=int, default=3, help="alternations of C and numpy")
    parser.add_argument("--knobs", default="{}",
                        help="JSON: spec -> list of per-kernel knob dicts (default knobs else)")
    parser.add_argument("-p", "--param", action="append", default=[], help="K=V for every spec")
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    from kernelsat.spec import parse_params

    sys.path.insert(0, str(ROOT / "bench"))
    from machine import probe

    knobs = json.loads(args.knobs)
    params = parse_params(args.param)
    kw: dict[str, Any] = {"min_runs": 10, "min_seconds": 0.3, "warmup": 2}
    before = probe()
    rows = []
    for name in args.spec or SPECS:
        print(f"{name} ...", file=sys.stderr, flush=True)
        rows.append(run_spec(name, params, knobs.get(name), args.repeat, kw))
    after = probe()
    text = "\n".join([
        "Produced by `python bench/reductions_check.py " + " ".join(sys.argv[1:]) + "`", "",
        *(f"Machine ({when}): {p['cpu']} x{p['cores']}, matmul {p['matmul_gflops']} GFLOP/s, "
          f"triad {p['triad_gb_s']} GB/s, load {p['load_avg_1m']:.2f}, {p['when']}"
          for when, p in (("before", before), ("after", after))), "",
        "Both sides flush the LLC before every run; C = the eager program at "
        "its default knobs unless --knobs says otherwise.", "", table(rows), "",
        "Knobs: " + "; ".join(f"{r['spec']} {r['knobs']}" for r in rows), ""])
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
