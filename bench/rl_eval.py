"""The joint search benchmark: the regret table of rl, sample, greedy and eager at K
(program, knob setting) measurements against an exhaustive or 200-pair reference, on
the held-out specs, then the cold start on numpy and c-x86-64-v2 with its online
adaptation; written to bench/results/rl_eval.md (and, spec by spec, to rl_eval.jsonl:
rerunning the same command resumes an interrupted run; machine probes before and after
each run in rl_eval.probes.txt, the one before written at once and the one after also
when a run is stopped with SIGTERM or ^C).

    .venv/bin/python bench/rl_eval.py --budget 8 --reference 200
    .venv/bin/python bench/rl_eval.py --small 256 --only softmax rmsnorm --out /tmp/e.md

Not a timed test: run it alone on a quiet machine (timings on a busy one are noisy).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from machine import probe

from kernelsat.driver.backends import make_backend
from kernelsat.learning.rl_eval import ADAPT, COLD_TARGETS, evaluate, table

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", type=Path, default=ROOT / "specs")
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--reference", type=int, default=200)
    ap.add_argument("--cold-reference", type=int, default=48)
    ap.add_argument("--small", type=int, default=None, help="cap every size parameter")
    ap.add_argument("--only", nargs="*", default=None, help="spec names")
    ap.add_argument("--checkpoint", type=Path, default=None)
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--cold-target", nargs="*", default=list(COLD_TARGETS))
    ap.add_argument("--adapt", type=int, default=ADAPT)
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "rl_eval.md")
    args = ap.parse_args(argv)
    paths = sorted(p for p in args.specs.glob("*.ks") if not args.only or p.stem in args.only)
    command = "python bench/rl_eval.py " + " ".join(argv if argv is not None else sys.argv[1:])
    probes = args.out.with_suffix(".probes.txt")  # every run's probes, resumed runs too
    probes.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(probes, "a") as f:  # written now: a sitting that is stopped keeps it
        f.write(f"{command}\n  before: {probe(quick=True)}\n")
    # SIGTERM (how a sitting is stopped) unwinds like ^C, so the probe after is written
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    backend = make_backend("local", cache_dir=args.cache_dir)
    finished = False
    try:
        rows, colds = evaluate(paths, budget=args.budget, reference=args.reference,
                               cap=args.small, checkpoint=args.checkpoint,
                               cold_targets=() if args.no_cold else args.cold_target,
                               cold_reference=args.cold_reference, adapt=args.adapt,
                               backend=backend, cache_dir=args.cache_dir,
                               log=args.out.with_suffix(".jsonl"),
                               progress=lambda m: print(m, file=sys.stderr, flush=True))
        finished = True
    finally:
        backend.close()
        with open(probes, "a") as f:
            f.write(f"  after ({time.monotonic() - start:.0f} s"
                    f"{'' if finished else ', stopped: finished specs are in the log'}): "
                    f"{probe(quick=True)}\n")
    text = table(rows, colds, args.budget, args.adapt)
    header = (f"# Joint search: regret at K measurements against an exhaustive or large "
              f"search, and the cold start\n\n"
              f"Command: `{command}` ({len(rows)} specs; each spec's seconds in "
              f"{args.out.with_suffix('.jsonl').name}, each run's machine probes in "
              f"{probes.name})\n\n")
    args.out.write_text(header + text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
