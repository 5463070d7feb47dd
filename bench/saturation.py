"""Saturation and proof figures for every spec: e-nodes, e-classes, time, stop reason,
and the explanation length of the most fused program in the root class.

    .venv/bin/python bench/saturation.py [--out bench/results/saturation.md]

"The most fused program" is the greedy extraction under a cost that prefers online
reductions (`SoftmaxAvg`, `LSE`) and charges 1000 per `Store`; its chain from the spec
is explained from the firing log and accepted by the checker.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kernelsat.driver.pipeline import Options, prove_term, saturate_program
from kernelsat.extract import extract
from kernelsat.extract.base import OpCost
from kernelsat.extract.online import ONLINE_COST
from kernelsat.ir import postorder
from kernelsat.ops import Op
from kernelsat.proofs.library import load_library
from kernelsat.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
FUSED = OpCost(ONLINE_COST, default=2.0)  # the `online` extractor's table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/saturation.md")
    args = ap.parse_args()
    lib = load_library()
    opts = Options()
    rows = ["| spec | e-nodes | e-classes | saturation s | stop reason | fused kernels | "
            "proof steps | proof s | checker |", "|---|---|---|---|---|---|---|---|---|"]
    for path in sorted((ROOT / "specs").glob("*.ks")):
        program = load_spec(str(path))
        sat = saturate_program(program, lib, opts)
        best = extract(sat.snapshot, "greedy-tree", cost=FUSED)[0].term
        kernels = 1 + sum(1 for n in postorder(best) if n.op is Op.STORE)
        t = time.perf_counter()
        _, steps, status = prove_term(program, sat.snapshot, lib, best)
        rows.append(
            f"| {program.name} | {sat.snapshot.n_nodes} | {sat.snapshot.n_classes} | "
            f"{sat.seconds:.2f} | {sat.stop_reason} | {kernels} | {steps} | "
            f"{time.perf_counter() - t:.2f} | {status} |"
        )
        print(rows[-1], flush=True)
    text = "\n".join(rows)
    args.out.write_text(
        f"Command: `.venv/bin/python bench/saturation.py` ({time.strftime('%Y-%m-%d')}, "
        f"default sizes, default schedule: {opts.iters} iterations per stage, "
        f"{opts.nodes} e-nodes, split factors {opts.factors})\n\n{text}\n")


if __name__ == "__main__":
    main()
