"""Does the knob search use its budget well? The default budget against a 10x search.

    bench/knob_search.sh [--small] [--only NAME ...] [--factor 10] [--budget N] [--out FILE]

(bench/knob_search.sh makes .venv from a fresh clone as bin/kernelsat does, then runs
this script; `.venv/bin/python bench/knob_search.py ...` in a set-up checkout.) Writes
bench/results/knob_search.md (`--small`: knob_search.small.md; `--out` elsewhere).
At the default sizes it takes about 5 minutes on a quiet 2-core machine; run it on a
quiet machine (the load average is in the table's header).

For each kernel (matmul, softmax, layernorm, fused single-kernel attention, bmm), one
run: the model-ranked search (`kernelsat.hardware.knobs.tune`) with `optimize`'s
default knob budget, the same search with `--factor` times that budget, and the search
as it was before the schedule model (default + coordinate moves, no ranking) at the
default budget; each with its own empty measurement cache and `optimize`'s timing
protocol. The winners are then timed again side by side (`measure_interleaved`: in
each of `--repeats` rounds, A B C A B C ... under the `bench` protocol; the median of
the rounds' medians), so the ratio
default/10x compares settings, not moments of a noisy machine. Target: the default
budget's winner within 10% of the 10x winner (ratio <= 1.10).

Also printed: each search's wall time, and how well the model ranked the 10x search's
measured settings (Spearman correlation of predicted and measured seconds). A machine
probe (bench/machine.py) runs before and after. `--small`: small sizes (a check that
the script works; the timings say little). Sizes and the budget are in the table.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine import probe

from kernelsat.codegen import build
from kernelsat.codegen.lower import LoweredProgram, lower
from kernelsat.driver.pipeline import Options
from kernelsat.hardware.cache import MeasureCache
from kernelsat.hardware.cost import rank_correlation
from kernelsat.hardware.knobs import SearchResult, codegen_knobs, plan, tune
from kernelsat.hardware.measure import TIMING, measure_interleaved
from kernelsat.hardware.targets import Target, get_target
from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as
from kernelsat.ir import Const as C
from kernelsat.ir import Dot, In, SoftmaxAvg, Term, mul
from kernelsat.spec import Program, load_spec

ROOT = Path(__file__).resolve().parents[1]


def fused_attention(program: Program) -> Term:
    """The single-kernel online-softmax attention of specs/attention.ks (what optimize's
    e-graph finds): SoftmaxAvg over keys of the scaled Q.K^T scores, weighting V."""
    p = program.params
    b, h, n, d = p["B"], p["H"], p["N"], p["D"]
    q = In("Q", (("b", b), ("h", h), ("i", n), ("d", d)))
    k = In("K", (("b", b), ("h", h), ("n", n), ("d", d)))
    v = In("V", (("b", b), ("h", h), ("n", n), ("e", d)))
    return SoftmaxAvg("n", mul(Dot("d", q, k), C(1.0 / math.sqrt(d))), v)


@dataclass(frozen=True)
class Case:
    name: str
    spec: str
    small: dict[str, int]
    term: Callable[[Program], Term] | None = None  # None: the spec's own (eager) term


CASES = (
    Case("matmul", "matmul", {"M": 256, "N": 256, "K": 256}),
    Case("softmax", "softmax", {"M": 512, "N": 1024}),
    Case("layernorm", "layernorm", {"M": 512, "N": 1024}),
    Case("attention_fused", "attention", {"N": 256}, fused_attention),
    Case("bmm", "bmm", {"G": 8, "M": 128, "N": 128}),
)


def run_search(lowered: LoweredProgram, target: Target, env: dict[str, np.ndarray],
               ref: np.ndarray, budget: int, use_model: bool) -> tuple[SearchResult, float]:
    with tempfile.TemporaryDirectory() as tmp, MeasureCache(Path(tmp) / "m.sqlite") as db:
        t0 = time.perf_counter()
        found = tune(lowered, target, env, tuple(ref.shape), ref, program_key="bench",
                     budget=budget, n_random=0, cache=db, timing=TIMING["optimize"],
                     use_model=use_model)
        return found, time.perf_counter() - t0


def retime(lowered: LoweredProgram, target: Target, env: dict[str, np.ndarray],
           ref: np.ndarray, settings: list[Any], repeats: int) -> list[float]:
    """Each setting's time: the median over `repeats` rounds of its median when all are
    timed interleaved (`measure_interleaved`, the `bench` protocol)."""
    exes = [build(lowered, target.backend, codegen_knobs(lowered, s)) for s in settings]
    rounds: list[list[float]] = [[] for _ in settings]
    for _ in range(repeats):
        ms = measure_interleaved(exes, env, tuple(ref.shape), ref, TIMING["bench"])
        for i, m in enumerate(ms):
            rounds[i].append(m.median if m.ok else math.inf)
    return [float(np.median(r)) for r in rounds]


def row(case: Case, small: bool, budget: int, factor: int, repeats: int,
        target: Target) -> dict[str, Any]:
    path = ROOT / "specs" / f"{case.spec}.ks"
    program = load_spec(str(path), case.small if small else None)
    term = case.term(program) if case.term else program.term
    lowered = lower(term, program.out_axes)
    env64 = random_inputs(program, seed=0)
    ref = evaluate_as(program.term, env64, program.out_axes)
    env = {k: v.astype(np.float32) for k, v in env64.items()}
    t0 = time.perf_counter()
    plan(lowered, target, budget)
    rank_s = time.perf_counter() - t0
    base, base_s = run_search(lowered, target, env, ref, budget, use_model=False)
    dflt, dflt_s = run_search(lowered, target, env, ref, budget, use_model=True)
    wide, wide_s = run_search(lowered, target, env, ref, budget * factor, use_model=True)
    t_base, t_dflt, t_wide = retime(lowered, target, env, ref,
                                    [base.best, dflt.best, wide.best], repeats)
    model = plan(lowered, target, 1).predict
    trials = [t for t in wide.trials if t.measurement.ok]
    rho = (rank_correlation([model(t.setting) for t in trials],
                            [t.measurement.median for t in trials]) if model else math.nan)
    return {
        "kernel": case.name,
        "sizes": ",".join(f"{k}={v}" for k, v in program.params.items()),
        "budget": budget,
        "no-model ms": t_base * 1e3,
        "default ms": t_dflt * 1e3,
        f"{factor}x ms": t_wide * 1e3,
        "ratio": t_dflt / t_wide,
        "ranking s": rank_s,
        "search s": f"{base_s:.1f} / {dflt_s:.1f} / {wide_s:.1f}",
        "rho": rho,
        "default best": dflt.best,
        f"{factor}x best": wide.best,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--only", nargs="*", default=None, help="kernel names")
    parser.add_argument("--budget", type=int, default=Options().knob_budget,
                        help="the default knob budget (optimize's)")
    parser.add_argument("--factor", type=int, default=10, help="the longer search's factor")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved re-timing rounds")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the markdown here (default bench/results/knob_search.md, "
                             "with --small knob_search.small.md)")
    args = parser.parse_args()
    out = args.out or ROOT / "bench" / "results" / (
        "knob_search.small.md" if args.small else "knob_search.md")
    start = time.perf_counter()
    target = get_target("cpu")
    before = probe(quick=True)
    rows = []
    for case in CASES:
        if args.only and case.name not in args.only:
            continue
        r = row(case, args.small, args.budget, args.factor, args.repeats, target)
        print(f"{r['kernel']}: default {r['default ms']:.3f} ms, {args.factor}x "
              f"{r[f'{args.factor}x ms']:.3f} ms, ratio {r['ratio']:.3f}, "
              f"no model {r['no-model ms']:.3f} ms", flush=True)
        rows.append(r)
    after = probe(quick=True)
    cols = ["kernel", "sizes", "budget", "no-model ms", "default ms", f"{args.factor}x ms",
            "ratio", "ranking s", "search s", "rho"]
    minutes = (time.perf_counter() - start) / 60
    lines = [f"Command: `{' '.join(['python', *sys.argv])}` ({time.strftime('%Y-%m-%d %H:%M')}, "
             f"{minutes:.1f} minutes)",
             "", f"Machine probe before: {before}", "", f"Machine probe after: {after}", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = [f"{r[c]:.3g}" if isinstance(r[c], float) else str(r[c]) for c in cols]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "search s: no-model / default / " + f"{args.factor}x searches' wall time; "
              "rho: Spearman correlation of the model's prediction and the measured median "
              f"over the {args.factor}x search's settings; ratio: default / {args.factor}x "
              "(target <= 1.10).", "", "Winning settings:", ""]
    for r in rows:
        lines.append(f"- {r['kernel']}: default {r['default best']}; "
                     f"{args.factor}x {r[f'{args.factor}x best']}")
    text = "\n".join(lines) + "\n"
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
