"""What the watchdog's cancel check costs generated C: each spec's eager program (default
knobs) compiled with and without `if (ks_cancel) continue;` in its outermost loops, timed
alternately (3 rounds of the measurement protocol each, median of the medians), ratio
with / without. Writes bench/results/cancel_check.md.

    .venv/bin/python bench/cancel_check.py [SPEC ...]

Not a timed test: run it alone on a quiet machine.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
from machine import probe

from kernelsat.codegen import build, lower
from kernelsat.codegen.c import CRenderer
from kernelsat.driver.jobs import _inputs
from kernelsat.hardware.measure import measure
from kernelsat.sexpr import to_sexpr
from kernelsat.spec import load_spec

ROOT = Path(__file__).resolve().parent.parent


def main(names: list[str]) -> int:
    before = probe(quick=True)
    lines = ["| spec | without (ms) | with (ms) | with / without |", "|---|---|---|---|"]
    build_dir = Path(tempfile.mkdtemp(prefix="ks_cancel_"))
    for path in sorted((ROOT / "specs").glob("*.ks")):
        if names and path.stem not in names:
            continue
        prog = load_spec(path)
        env, ref = _inputs((to_sexpr(prog.term), tuple(prog.out_axes), tuple(prog.inputs), 0))
        low = lower(prog.term, tuple(prog.out_axes))
        exes = {}
        try:
            for flag in (False, True):
                CRenderer.cancellable = flag
                exes[flag] = build(low, "c", None, build_dir / str(int(flag)))
        finally:
            CRenderer.cancellable = True
        medians: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(3):
            for flag in (False, True):
                m = measure(exes[flag], env, tuple(ref.shape), ref, min_runs=5,
                            min_seconds=0.1, max_run_seconds=1.0)
                medians[flag].append(m.median if m.ok else np.nan)
        a, b = (float(np.median(medians[f])) for f in (False, True))
        line = f"| {path.stem} | {a * 1e3:.3f} | {b * 1e3:.3f} | {b / a:.3f} |"
        print(line, flush=True)
        lines.append(line)
    after = probe(quick=True)
    command = "python bench/cancel_check.py " + " ".join(names)
    text = (f"# The cancel check's cost\n\nCommand: `{command.strip()}`\n\n"
            + "\n".join(lines) + f"\n\nMachine before: {before}\n\nafter: {after}\n")
    out = ROOT / "bench" / "results" / "cancel_check.md"
    if not names:
        out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
