"""The static float analysis against the run-time float checks, per spec (issue 19 part 2).

For each spec: saturate and extract as `optimize` does (no proving, no timing), judge
every candidate with `kernelsat.floatsafe.Judge` (what the pipeline drops), then run the
ship gate's float checks (`kernelsat.driver.jobs.check_job`: the float64 comparison and
the overflow check, through the numpy backend) on every candidate, dropped or not. The
table says how many candidates the analysis removed, how many of those the run-time
check would also have rejected (the rest: removed needlessly), and how many it kept that
the run-time check still rejects (the goal: none).

    .venv/bin/python bench/floatsafe_table.py [--full] [--seconds S] [SPEC ...]

Without `--full` every spec runs at small sizes (`kernelsat.testing.small_spec`); SPEC
names select specs (default: all of specs/). Prints a Markdown table, and with `-v` the
reason of every removal and every run-time rejection.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from kernelsat.driver.jobs import STRESS_SCALE, check_job
from kernelsat.driver.pipeline import (
    Options,
    _extract,
    float_check_failure,
    job_for,
    saturate_program,
)
from kernelsat.extract.base import RooflineCost
from kernelsat.floatsafe import Judge
from kernelsat.hardware.targets import get_target
from kernelsat.proofs.library import load_library
from kernelsat.spec import load_spec
from kernelsat.testing import small_spec

ROOT = Path(__file__).resolve().parent.parent
HEADER = ("| spec | candidates | removed by analysis | removed, also rejected at run time | "
          "kept, rejected at run time (float) | kept, rejected at run time (other) | "
          "analysis s |")


def _quiet(stage: str, message: str) -> None:
    pass


def row(path: Path, full: bool, seconds: float, verbose: bool) -> str:
    program = load_spec(str(path)) if full else small_spec(str(path))
    opts = Options(target="numpy", seconds=seconds, samples=8, trials=1, knob_budget=1)
    hw = get_target("numpy")
    opts = Options(**{**opts.__dict__, "target": hw})
    sat = saturate_program(program, load_library(), opts)
    cands = _extract(program, sat, opts, RooflineCost.for_target(hw), _quiet, hw)
    others = [c for c in cands if c.term is not program.term]
    start = time.perf_counter()
    judge = Judge(program, STRESS_SCALE)
    verdicts = [judge(c.term) for c in others]
    took = time.perf_counter() - start
    removed = both = kept_float = kept_other = 0
    for c, v in zip(others, verdicts, strict=True):
        r = check_job(job_for(program, c.term, opts))
        if not v.safe:
            removed += 1
            both += not r.ok
            if verbose:
                print(f"  {path.stem} removed ({'run time also rejects' if not r.ok else 'run'
                      ' time passes'}): {v.reason[:200]}", file=sys.stderr)
        elif not r.ok:
            kept_float += float_check_failure(r.error)
            kept_other += not float_check_failure(r.error)
            if verbose:
                print(f"  {path.stem} kept, run time rejects: {r.error[:200]}", file=sys.stderr)
    return (f"| {path.stem} | {len(others)} | {removed} | {both} | {kept_float} | "
            f"{kept_other} | {took:.2f} |")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("specs", nargs="*", help="spec names (default: every spec in specs/)")
    ap.add_argument("--full", action="store_true", help="the specs' own sizes, not small ones")
    ap.add_argument("--seconds", type=float, default=30.0, help="saturation budget per spec")
    ap.add_argument("-v", "--verbose", action="store_true", help="every reason, on stderr")
    args = ap.parse_args(argv)
    paths = sorted((ROOT / "specs").glob("*.ks"))
    unknown = set(args.specs) - {p.stem for p in paths}
    if unknown:
        print(f"floatsafe_table: no spec named {', '.join(sorted(unknown))} in specs/",
              file=sys.stderr)
        return 2
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    for path in paths:
        if not args.specs or path.stem in args.specs:
            print(row(path, args.full, args.seconds, args.verbose), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
