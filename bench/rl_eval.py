"""The RL extraction benchmark: the regret table of rl, sample, greedy and ilp against
a larger search, on the held-out specs, written to bench/results/rl_eval.md.

    .venv/bin/python bench/rl_eval.py --small 128 --budget 8 --reference 16

Not a timed test: run it alone on a quiet machine (timings on a busy one are noisy).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kernelsat.extract.rl_eval import evaluate, table

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--specs", type=Path, default=ROOT / "specs")
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--reference", type=int, default=200)
    ap.add_argument("--small", type=int, default=None, help="cap every size parameter")
    ap.add_argument("--only", nargs="*", default=None, help="spec names")
    ap.add_argument("--checkpoint", type=Path, default=None)
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--cache-dir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "rl_eval.md")
    args = ap.parse_args(argv)
    paths = sorted(p for p in args.specs.glob("*.ks") if not args.only or p.stem in args.only)
    start = time.monotonic()
    rows, colds = evaluate(paths, budget=args.budget, reference=args.reference,
                           cap=args.small, checkpoint=args.checkpoint, cold=not args.no_cold,
                           cache_dir=args.cache_dir,
                           progress=lambda m: print(m, file=sys.stderr, flush=True))
    text = table(rows, colds, args.budget)
    command = "python bench/rl_eval.py " + " ".join(argv if argv is not None else sys.argv[1:])
    header = (f"# RL extraction: regret against a larger search\n\nCommand: `{command}` "
              f"({time.monotonic() - start:.0f} s, {len(rows)} specs)\n\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(header + text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
