"""The benchmark suite: `optimize` on every spec for the C target, against numpy.

    .venv/bin/python bench/suite.py [--only NAME ...] [-p K=V ...] [--out FILE]

For each spec, in one run: the eager program in C, the optimized program, the speedup,
numpy as a user would write it (bench/eager_vs_numpy.NUMPY), the optimized program's
fraction of the roofline bound, and how long `optimize` took. A machine probe runs
before and after (the host's speed varies). Medians of the timing protocol
(kernelsat.hardware.measure: random inputs, poisoned and checked outputs, warm-up,
cache flushing); ratios are taken within the same run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import (
    inputs_and_reference,
    load_program,
    roofline_seconds,
    sizes,
    spec_paths,
    time_numpy,
    timed_optimize,
)
from machine import probe

from kernelsat.spec import parse_params

ROOT = Path(__file__).resolve().parents[1]


def row(path: Path, overrides: dict[str, int], cache_dir: Path | None, seconds: float
        ) -> dict[str, object]:
    program = load_program(path, overrides)
    result, opt_s = timed_optimize(program, cache_dir=cache_dir, seconds=seconds)
    inputs, ref = inputs_and_reference(program)
    npy = time_numpy(program, inputs, ref)
    best = result.best
    measured = [(c.estimate, c.median) for c in result.candidates
                if c.measurement is not None and np.isfinite(c.median)]
    return {
        "spec": program.name,
        "params": sizes(program),
        "eager": result.eager.median,
        "best": best.median,
        "speedup": result.speedup(best),
        "numpy": npy.median if npy is not None and npy.ok else float("nan"),
        "kernels": f"{result.eager.kernels}->{best.kernels}",
        "from": ",".join(best.methods),
        "roofline": roofline_seconds(best.term, program.out_axes) / best.median,
        "optimize_s": opt_s,
        "pairs": measured,
    }


def markdown(rows: list[dict[str, object]], command: str, before: str, after: str) -> str:
    head = ("| spec | sizes | eager C ms | optimized ms | speedup | numpy ms | vs numpy | "
            "kernels | chosen by | of roofline | optimize s |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|")
    lines = [head]
    for r in rows:
        vs = r["numpy"] / r["best"]  # type: ignore[operator]
        lines.append(
            f"| {r['spec']} | {r['params']} | {r['eager'] * 1e3:.3g} | {r['best'] * 1e3:.3g} | "  # type: ignore[operator]
            f"{r['speedup']:.2f}x | {r['numpy'] * 1e3:.3g} | {vs:.2f}x | {r['kernels']} | "  # type: ignore[operator]
            f"{r['from']} | {r['roofline']:.0%} | {r['optimize_s']:.0f} |"
        )
    speedups = [float(r["speedup"]) for r in rows]  # type: ignore[arg-type]
    vs_np = [float(r["numpy"]) / float(r["best"]) for r in rows  # type: ignore[arg-type]
             if np.isfinite(float(r["numpy"]))]  # type: ignore[arg-type]
    from kernelsat.hardware.cost import rank_correlation

    pairs = [p for r in rows for p in r["pairs"]]  # type: ignore[attr-defined]
    rho = rank_correlation([p[0] for p in pairs], [p[1] for p in pairs]) if len(pairs) > 2 \
        else float("nan")
    within = [rank_correlation([p[0] for p in r["pairs"]], [p[1] for p in r["pairs"]])  # type: ignore[attr-defined]
              for r in rows if len(r["pairs"]) > 2]  # type: ignore[arg-type]
    geo = float(np.exp(np.mean(np.log(speedups))))
    geo_np = float(np.exp(np.mean(np.log(vs_np)))) if vs_np else float("nan")
    return (f"Command: `{command}` ({time.strftime('%Y-%m-%d %H:%M')})\n\n"
            f"Machine probe before: {before}\n\nMachine probe after: {after}\n\n"
            + "\n".join(lines)
            + f"\n\nGeometric mean speedup over eager C: {geo:.2f}x; over numpy: {geo_np:.2f}x\n"
            + f"\nCost model vs measurement (Spearman rank correlation of the lowered roofline "
            f"estimate and the measured median): pooled over all {len(pairs)} measured "
            f"candidates {rho:.2f}; within a spec (specs with 3+ measured candidates, "
            f"n={len(within)}) mean {float(np.nanmean(within)) if within else float('nan'):.2f}\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("-p", "--param", action="append", default=[])
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/suite.md")
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--seconds", type=float, default=90.0, help="optimize's budget per spec")
    args = ap.parse_args()
    try:
        overrides = parse_params(args.param)
        paths = spec_paths(args.only)
    except ValueError as e:
        ap.error(str(e))  # one line, exit 2
    before = str(probe(quick=True))
    rows = []
    for path in paths:
        rows.append(row(path, overrides, args.cache_dir, args.seconds))
        print(rows[-1], flush=True)
    after = str(probe(quick=True))
    text = markdown(rows, "python bench/suite.py " + " ".join(sys.argv[1:]), before, after)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
