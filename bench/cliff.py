"""The "no cliff" check: a kernel at sizes that are not multiples of the tile or vector
width, against the same kernel at the nearest multiple above, per unit of work.

    .venv/bin/python bench/cliff.py [--only NAME ...] [--case SPEC:K=V,...] [--multiple 16]
        [--optimize] [--repeat 3] [--out FILE]

For each case (a spec at irregular sizes; the defaults cover the contractions and the
reductions: matmul 411x149x297, bmm, softmax and layernorm 4096x1000, rmsnorm,
logsumexp, attention N=1000, batchnorm with 1001 channels, matmul+bias+gelu), the sizes
are rounded up to the next multiple of `--multiple` (16: the float32 lanes of an AVX-512
vector; every size already a multiple stays), and both programs go through the public
pipeline: `lower`, `build` with the default knobs for the C target, `measure`
(kernelsat.hardware.measure's protocol: random inputs, float64 check of every run,
warm-up, the LLC flushed when the data fits). With `--optimize`, each size is
`optimize`d first (its defaults) and its shipped program (term and knobs) timed instead.
The two are timed alternately `--repeat` times.

Work is the spec's flops plus transcendentals (kernelsat.hardware.cost.stats_of_term,
from the IR, so it does not depend on how the code is tiled). The ratio is
(time / work) at the irregular sizes over the same at the multiple: 1.0 is no cliff;
the target is at most 1.5. One Markdown table goes to bench/results/cliff.md with the
command, the date and the machine probe before and after.

Sizes whose whole run is the call's fixed cost (a 17x5x3 or 1x1x1 matmul: ~20 us at
either size, the C call ~5 us of it) show a large ratio that is no tile cliff: their work
is 300 flops against 8192 at the multiple.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import (
    ROOT,
    inputs_and_reference,
    load_program,
    ms,
    spec_paths,
    time_program,
    timed_optimize,
)

CASES = (
    "matmul:M=411,N=149,K=297",
    "bmm:G=32,M=509,N=509,K=61",
    "softmax:M=4096,N=1000",
    "layernorm:M=4096,N=1000",
    "rmsnorm:M=1024,N=4091",
    "logsumexp:M=1024,N=4091",
    "attention:B=1,H=8,N=1000,D=64",
    "batchnorm:N=65536,C=1001",
    "matmul_bias_gelu:M=411,N=149,K=297",
)
"""Irregular sizes of the contraction and reduction specs (spec:K=V,...)."""
LIMIT = 1.5
"""The issue's target: irregular sizes cost at most this much more per unit of work."""


class CliffError(Exception):
    """A usage problem: one line, exit 2."""


def round_up(params: Mapping[str, int], multiple: int) -> dict[str, int]:
    """Every size rounded up to a multiple of `multiple` (the batch-like G, B, H kept:
    they are loop counts, not tiled widths)."""
    return {k: v if k in ("G", "B", "H") else -(-v // multiple) * multiple
            for k, v in params.items()}


def parse_case(text: str) -> tuple[str, dict[str, int]]:
    """"matmul:M=411,N=149" -> ("matmul", {"M": 411, "N": 149})."""
    from kernelsat.spec import parse_params

    name, colon, rest = text.partition(":")
    if not colon or not name.strip() or not rest.strip():
        raise CliffError(f"bad case {text!r}; expected SPEC:K=V[,K=V...], e.g. softmax:N=1000")
    try:
        return name.strip(), parse_params(rest.split(","))
    except ValueError as e:
        raise CliffError(f"bad case {text!r}: {e}") from None


def work(program: Any) -> float:
    """flops + transcendentals of the spec (from the IR)."""
    from kernelsat.hardware.cost import stats_of_term

    stats = stats_of_term(program.term, "float32")
    return float(sum(s.flops + s.transcendentals for s in stats))


@dataclass(frozen=True)
class Timed:
    sizes: str
    median: float  # the median over repeats of each repeat's median, seconds
    work: float
    failure: str = ""

    @property
    def per_work(self) -> float:
        return self.median / self.work if self.work > 0 else float("nan")


def cliff_ratio(irregular: Timed, multiple: Timed) -> float:
    """Per-work time at the irregular sizes over the same at the multiple."""
    a, b = irregular.per_work, multiple.per_work
    return a / b if a == a and b == b and b > 0 else float("nan")


def time_case(name: str, params: Mapping[str, int], multiple: int, repeat: int,
              use_optimize: bool, protocol: Mapping[str, Any]) -> tuple[Timed, Timed]:
    """Both sizes of one case, timed alternately `repeat` times."""
    path = spec_paths([name])[0]
    sides = []
    for p in (dict(params), round_up(params, multiple)):
        program = load_program(path, p)
        term, knobs = program.term, None
        if use_optimize:
            result, _ = timed_optimize(program)
            term, knobs = result.best.term, result.best.knobs
        inputs, ref = inputs_and_reference(program)
        sides.append((program, term, knobs, inputs, ref))
    medians: list[list[float]] = [[], []]
    failures = ["", ""]
    for _ in range(repeat):
        for i, (program, term, knobs, inputs, ref) in enumerate(sides):
            m = time_program(term, program.out_axes, inputs, ref, "c", knobs, **protocol)
            if m.ok:
                medians[i].append(m.median)
            else:
                failures[i] = m.failure
    out = []
    for i, (program, *_rest) in enumerate(sides):
        sizes = ",".join(f"{k}={v}" for k, v in program.params.items())
        med = statistics.median(medians[i]) if medians[i] else float("nan")
        out.append(Timed(sizes, med, work(program), failures[i]))
    return out[0], out[1]


Case = tuple[str, Timed, Timed]
"""(spec, at the irregular sizes, at the multiple)."""


def table(rows: Sequence[Case]) -> str:
    """The cases as a Markdown table."""
    lines = ["| spec | irregular sizes | ms | sizes at the multiple | ms | "
             "per-work ratio | within 1.5x? |", "|---|---|---|---|---|---|---|"]
    for name, a, b in rows:
        r = cliff_ratio(a, b)
        cell_a = ms(a.median) if not a.failure else f"fails: {a.failure[:40]}"
        cell_b = ms(b.median) if not b.failure else f"fails: {b.failure[:40]}"
        if r != r:
            shown, verdict = "—", "—"
        else:
            shown = f"{r:.2f}x"
            verdict = "yes" if r <= LIMIT else f"**no** ({r / LIMIT:.2f}x over)"
        lines.append(f"| {name} | {a.sizes} | {cell_a} | {b.sizes} | {cell_b} | {shown} | "
                     f"{verdict} |")
    return "\n".join(lines)


def worst(rows: Sequence[Case]) -> tuple[str, float]:
    """The case with the largest per-work ratio: ("spec sizes", ratio); ("", NaN) if none."""
    timed = [(cliff_ratio(a, b), f"{name} {a.sizes}") for name, a, b in rows
             if cliff_ratio(a, b) == cliff_ratio(a, b)]
    if not timed:
        return "", float("nan")
    r, what = max(timed)
    return what, r


def markdown(rows: Sequence[Case], command: str, setup: str, before: str, after: str) -> str:
    return "\n".join([f"Command: `{command}` ({time.strftime('%Y-%m-%d %H:%M %Z')})", "",
                      setup, "", f"Machine probe before: {before}", "",
                      f"Machine probe after: {after}", "", table(rows)]) + "\n"


def describe(what: str, multiple: int, repeat: int, protocol: Mapping[str, Any]) -> str:
    """How the cases were timed, for a table's header."""
    return (f"Program: {what}, C target; sizes rounded up to multiples of {multiple} "
            f"(G, B, H kept). Each: median of {repeat} alternated measurements "
            f"(kernelsat.hardware.measure: warm-up {protocol['warmup']}, at least "
            f"{protocol['min_runs']} runs, LLC flushed when the data fits). Work: flops + "
            "transcendentals of the spec.")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="only the cases of these specs")
    ap.add_argument("--case", action="append", default=None,
                    help=f"SPEC:K=V,... at irregular sizes (default: {' '.join(CASES)})")
    ap.add_argument("--multiple", type=int, default=16)
    ap.add_argument("--optimize", action="store_true",
                    help="time optimize's shipped program at each size, not the default one")
    ap.add_argument("--repeat", type=int, default=3, help="alternations of the two sizes")
    ap.add_argument("--quick", action="store_true", help="1 repeat, lighter protocol")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cliff.md")
    args = ap.parse_args(argv)
    try:
        if args.multiple < 1 or args.repeat < 1:
            raise CliffError("--multiple and --repeat must be at least 1")
        cases = [parse_case(c) for c in (args.case or CASES)]
        if args.only:
            cases = [c for c in cases if c[0] in args.only]
        for name, _ in cases:
            try:
                spec_paths([name])
            except ValueError as e:
                raise CliffError(str(e)) from None
    except CliffError as e:
        print(f"cliff: {e}", file=sys.stderr)
        return 2
    from machine import probe
    from peers import probe_line

    repeat = 1 if args.quick else args.repeat
    protocol = ({"warmup": 1, "min_runs": 5, "min_seconds": 0.05} if args.quick
                else {"warmup": 2, "min_runs": 10, "min_seconds": 0.2})
    before = probe_line(probe(quick=True))
    rows = []
    for name, params in cases:
        a, b = time_case(name, params, args.multiple, repeat, args.optimize, protocol)
        rows.append((name, a, b))
        print(f"{name}: {a.sizes} {ms(a.median)} ms, {b.sizes} {ms(b.median)} ms, "
              f"ratio {cliff_ratio(a, b):.2f}", file=sys.stderr, flush=True)
    after = probe_line(probe(quick=True))
    what = ("optimize's shipped program (its defaults)" if args.optimize
            else "the spec as written, lowered with the default knobs")
    setup = describe(what, args.multiple, repeat, protocol)
    command = "python bench/cliff.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = markdown(rows, command.strip(), setup, before, after)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
