"""Non-temporal stores (knob `nt`, codegen/stream.py): the eager C program with the knob
off and on, timed interleaved in one run, ratios within the run.

For each spec (default: rmsnorm, softmax, elementwise, layernorm at their default
sizes): lower the eager program, build it twice through the C target at its default
knobs except `nt` (off, on), and time both with `measure_interleaved` (the same random
inputs, the same output buffer, every run's output checked against the float64
reference, the LLC flush rule of `measure`, the order alternating A B / B A), at least
`--runs` rounds. Prints one Markdown table: each side's median (quartiles), the
effective bandwidth (compulsory bytes: inputs read once, output written once, over the
median), the ratio of the medians, the paired verdict (`kernelsat.hardware.duel`: rounds
the streamed version won, median per-round ratio), and the load average per core and
load probe before and after (the machine is shared: quote ratios, not times).

    .venv/bin/python bench/stream_check.py [--spec rmsnorm ...] [--runs 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from kernelsat.codegen import build, lower
from kernelsat.hardware.duel import load_per_core, paired_verdict
from kernelsat.hardware.measure import TIMING, measure_interleaved
from kernelsat.hardware.triad import load_probe
from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as
from kernelsat.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent
SPECS = ("rmsnorm", "softmax", "elementwise", "layernorm")


def run_spec(name: str, runs: int) -> dict[str, Any]:
    program = load_spec(ROOT / "specs" / f"{name}.ks")
    lowered = lower(program.term, program.out_axes)
    spaces = [k.knob_space() for k in lowered.kernels]
    if not any("nt" in s for s in spaces):
        return {"spec": name, "skipped": "no kernel offers knob nt"}
    off = [{"nt": False} if "nt" in s else {} for s in spaces]
    on = [{"nt": True} if "nt" in s else {} for s in spaces]
    env64 = random_inputs(program, seed=1)  # the optimize jobs' inputs (kernelsat.inputs)
    ref = evaluate_as(program.term, env64, program.out_axes)
    inputs = {k: np.ascontiguousarray(v, np.float32) for k, v in env64.items()}
    shape = tuple(ref.shape)
    exes = [build(lowered, "c", off), build(lowered, "c", on)]
    before = (load_per_core(), load_probe())
    timing = TIMING["bench"].with_overrides({"min_runs": runs, "min_seconds": 0.5})
    m_off, m_on = measure_interleaved(exes, inputs, shape, ref, timing, alternate=True)
    after = (load_per_core(), load_probe())
    if not (m_off.ok and m_on.ok):
        return {"spec": name, "failed": f"off: {m_off.failure}; on: {m_on.failure}"}
    nbytes = 4 * (sum(int(v.size) for v in inputs.values()) + int(ref.size))
    v = paired_verdict(m_on.times, m_off.times)
    return {"spec": name, "off_ms": 1e3 * m_off.median,
            "off_iqr": [1e3 * m_off.q1, 1e3 * m_off.q3],
            "on_ms": 1e3 * m_on.median, "on_iqr": [1e3 * m_on.q1, 1e3 * m_on.q3],
            "off_gbs": nbytes / m_off.median / 1e9, "on_gbs": nbytes / m_on.median / 1e9,
            "speedup": m_off.median / m_on.median, "rounds": v.pairs, "on_won": v.faster,
            "pair_ratio": v.ratio, "verdict": v.outcome,
            "rel_err": max(m_off.rel_err, m_on.rel_err),
            "load_before": before[0], "load_after": after[0],
            "probe_ms_before": 1e3 * before[1], "probe_ms_after": 1e3 * after[1]}


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| spec | nt off ms (IQR) | nt on ms (IQR) | off GB/s | on GB/s | off / on | "
           "rounds on won | median pair on/off | verdict | load/core before, after | "
           "probe ms before, after |", "|" + "---|" * 11]
    for r in rows:
        if "off_ms" not in r:
            out.append(f"| {r['spec']} | {r.get('skipped') or r.get('failed')} |" + " |" * 9)
            continue
        out.append(
            f"| {r['spec']} | {r['off_ms']:.2f} ({r['off_iqr'][0]:.2f}-{r['off_iqr'][1]:.2f}) | "
            f"{r['on_ms']:.2f} ({r['on_iqr'][0]:.2f}-{r['on_iqr'][1]:.2f}) | "
            f"{r['off_gbs']:.1f} | {r['on_gbs']:.1f} | {r['speedup']:.2f}x | "
            f"{r['on_won']}/{r['rounds']} | {r['pair_ratio']:.2f} | {r['verdict']} | "
            f"{r['load_before']:.1f}, {r['load_after']:.1f} | "
            f"{r['probe_ms_before']:.2f}, {r['probe_ms_after']:.2f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", nargs="*", default=list(SPECS))
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    rows = [run_spec(name, args.runs) for name in args.spec]
    text = table(rows)
    print(text)
    if args.out:
        args.out.write_text(text + "\n\n" + json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
