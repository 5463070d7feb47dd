"""A generator of training specs, so that the benchmark specs in `specs/` stay held out.

Each spec is drawn from a family of templates (elementwise chains, reductions over
either axis, normalizations, fused chains with stored intermediates, contractions,
online softmax patterns) with random ops and random draft sizes, and written as a
`.ks` file named `corpus_<k>_<family>.ks`; the same seed gives the same corpus.

With a `target`, the draft's sizes are then scaled (every size by the same factor, a
power of sqrt 2, rounded to a multiple of `ALIGN`) until the estimated time of its
eager program on the target (`eager_seconds`: the schedule model of its lowered loop
nests at the default knobs on a modelled backend, the roofline estimate elsewhere)
is nearest the geometric middle of `window` (default 1-20 ms), so that a timing is
long against the timer's noise; a draft that cannot be brought into the window (or
would need a tensor over `MAX_ELEMENTS`) is redrawn. The estimate is a model's, and
on this kind of machine the measured eager times came out several times the estimate;
with a `measure` function (the `corpus --calibrate` switch: one timing of the eager
program at its default knobs) the window is corrected by the measured/estimated ratio
and the spec rescaled, up to `CALIBRATIONS` timings, until the measured time is in the
window (else the draft is redrawn).

>>> specs = generate(3, seed=0)
>>> [name for name, _ in specs]  # doctest: +ELLIPSIS
['corpus_000_...', 'corpus_001_...', 'corpus_002_...']
>>> from kernelsat.spec import parse_spec
>>> all(parse_spec(text, name).term is not None for name, text in specs)
True
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from pathlib import Path

from kernelsat.codegen.lower import lower
from kernelsat.hardware.cost import estimate_term
from kernelsat.hardware.knobs import kernel_features_of
from kernelsat.hardware.targets import Target
from kernelsat.program import Program
from kernelsat.spec import parse_spec

UNARY = ("exp", "tanh", "sigmoid", "relu", "abs", "sqrt(abs({x}) + 1)", "silu", "gelu")
BINARY = ("+", "*", "-")
SIZES = (64, 96, 128, 192, 256, 384, 512)


def _unary(rng: random.Random, x: str) -> str:
    f = rng.choice(UNARY)
    return f.format(x=x) if "{x}" in f else f"{f}({x})"


def _chain(rng: random.Random, x: str, depth: int) -> str:
    expr = x
    for _ in range(depth):
        if rng.random() < 0.5:
            expr = _unary(rng, expr)
        else:
            expr = f"({expr} {rng.choice(BINARY)} {rng.choice(['0.5', '2', x])})"
    return expr


def _header(name: str, rng: random.Random) -> tuple[str, int, int]:
    m, n = rng.choice(SIZES), rng.choice(SIZES)
    return f"kernel {name}(M={m}, N={n})\nin X[i:M, n:N] f32\n", m, n


def elementwise(rng: random.Random, name: str) -> str:
    head, _, _ = _header(name, rng)
    return head + f"out Y[i, n] = {_chain(rng, 'X[i, n]', rng.randint(2, 4))}\n"


def reduction(rng: random.Random, name: str) -> str:
    head, _, _ = _header(name, rng)
    axis, keep = rng.choice((("n", "i"), ("i", "n")))
    red = rng.choice(("sum", "max", "mean", "logsumexp"))
    return head + f"out Y[{keep}] = {red}({axis}: {_chain(rng, 'X[i, n]', rng.randint(1, 2))})\n"


def normalization(rng: random.Random, name: str) -> str:
    head, _, _ = _header(name, rng)
    kind = rng.choice(("softmax(n: X[i, n])", "rmsnorm(n: X[i, n])", "layernorm(n: X[i, n])",
                       "X[i, n] / sum(n: X[i, n] * X[i, n])",
                       "X[i, n] - max(n: X[i, n])"))
    scale = rng.choice(("", " * W[n]", " * 0.5"))
    extra = "in W[n:N] f32\n" if "W[" in scale else ""
    return head + extra + f"out Y[i, n] = {kind}{scale}\n"


def fused(rng: random.Random, name: str) -> str:
    """Two or three statements: stored intermediates the rules may fuse away."""
    head, _, _ = _header(name, rng)
    s1 = _chain(rng, "X[i, n]", rng.randint(1, 2))
    body = f"A[i, n] = {s1}\n"
    if rng.random() < 0.5:
        body += f"R[i] = {rng.choice(('sum', 'max'))}(n: A[i, n])\n"
        body += f"out Y[i, n] = {_unary(rng, 'A[i, n]')} / (R[i] + 1)\n"
    else:
        body += f"out Y[i] = sum(n: {_unary(rng, 'A[i, n]')})\n"
    return head + body


def contraction(rng: random.Random, name: str) -> str:
    m, k = rng.choice(SIZES), rng.choice(SIZES)
    head = f"kernel {name}(M={m}, K={k})\nin A[i:M, k:K] f32\nin X[k:K] f32\n"
    inner = rng.choice(("A[i, k] * X[k]", "A[i, k] * exp(X[k])", "tanh(A[i, k]) * X[k]"))
    post = rng.choice(("{s}", "relu({s})", "{s} * 0.5", "sigmoid({s})"))
    return head + "out Y[i] = " + post.format(s=f"sum(k: {inner})") + "\n"


def attention_like(rng: random.Random, name: str) -> str:
    n, d = rng.choice((16, 32, 64, 128)), rng.choice((8, 16, 32))
    return (f"kernel {name}(N={n}, D={d})\n"
            "in Q[i:N, d:D] f32\nin K[n:N, d:D] f32\nin V[n:N, e:D] f32\n"
            "S[i, n] = sum(d: Q[i, d] * K[n, d])\n"
            "P[i, n] = softmax(n: S[i, n])\n"
            "out O[i, e] = sum(n: P[i, n] * V[n, e])\n")


FAMILIES: dict[str, Callable[[random.Random, str], str]] = {
    "elementwise": elementwise,
    "reduction": reduction,
    "normalization": normalization,
    "fused": fused,
    "contraction": contraction,
    "attention": attention_like,
}
WEIGHTS = {"elementwise": 2, "reduction": 2, "normalization": 3, "fused": 3, "contraction": 2,
           "attention": 1}


WINDOW = (1e-3, 20e-3)
"""Default seconds the eager program of a corpus spec should take on the target."""

ALIGN = 8
"""Scaled sizes are multiples of this (vector-friendly, as real shapes are)."""

MAX_ELEMENTS = 1 << 24
"""Largest tensor (elements) a scaled spec may declare: 64 MB of float32."""

SCALE_STEPS = range(-8, 25)
"""Scale factors tried: sqrt(2) ** step, every size multiplied by the same factor."""

CALIBRATIONS = 3
"""Timings per draft when calibrating against measurements."""

_HEADER = re.compile(r"^kernel (\w+)\(([^)]*)\)", re.MULTILINE)


def eager_seconds(program: Program, target: Target) -> float:
    """Estimated seconds of `program`'s eager term on `target`: the schedule model of its
    lowered loop nests at the default knobs on a modelled backend, else the roofline."""
    lowered = lower(program.term, program.out_axes)
    modelled = kernel_features_of(lowered, target, [None] * len(lowered.kernels))
    if modelled is not None and all(hasattr(k, "nest") for k in lowered.kernels):
        return float(modelled["predicted"])
    return float(estimate_term(program.term, target))


def sizes_of(text: str) -> dict[str, int]:
    """The size parameters of a spec's header (`kernel k(M=64, N=96)`)."""
    m = _HEADER.search(text)
    if m is None:
        raise ValueError("no kernel header")
    return {k.strip(): int(v) for k, v in (p.split("=") for p in m.group(2).split(",") if p)}


def with_sizes(text: str, sizes: dict[str, int]) -> str:
    """`text` with its header's sizes replaced."""
    m = _HEADER.search(text)
    assert m is not None
    params = ", ".join(f"{k}={v}" for k, v in sizes.items())
    return text[:m.start()] + f"kernel {m.group(1)}({params})" + text[m.end():]


def _largest_tensor(program: Program) -> int:
    return max([math.prod(program.term.shape.values()),
                *(math.prod(decl.dims) for decl in program.inputs)])


def scale_to_window(text: str, name: str, target: Target,
                    window: tuple[float, float] = WINDOW) -> tuple[str, float] | None:
    """`text` with its sizes scaled so the eager program's estimate on `target` is
    nearest the window's geometric middle, and that estimate; None when no scale puts it
    in the window within `MAX_ELEMENTS`."""
    lo, hi = window
    middle = math.sqrt(lo * hi)
    base = sizes_of(text)
    best: tuple[float, str, float] | None = None
    for step in SCALE_STEPS:
        factor = math.sqrt(2.0) ** step
        sizes = {k: max(ALIGN, round(v * factor / ALIGN) * ALIGN) for k, v in base.items()}
        scaled = with_sizes(text, sizes)
        try:
            program = parse_spec(scaled, name)
        except ValueError:
            continue
        if _largest_tensor(program) > MAX_ELEMENTS:
            break
        seconds = eager_seconds(program, target)
        if lo <= seconds <= hi:
            gap = abs(math.log(seconds / middle))
            if best is None or gap < best[0]:
                best = (gap, scaled, seconds)
        if seconds > hi:
            break
    return (best[1], best[2]) if best is not None else None


Measure = Callable[[Program], float]
"""Seconds of a program's eager term at its default knobs (inf: it failed)."""


def calibrated(text: str, name: str, target: Target, window: tuple[float, float],
               measure: Measure) -> tuple[str, float] | None:
    """`text` scaled so that its MEASURED eager time is in `window`: scaled on the
    estimate, timed, the window corrected by measured / estimated, again (up to
    `CALIBRATIONS` timings); (the text, its measured seconds) or None."""
    lo, hi = window
    correction = 1.0
    for _ in range(CALIBRATIONS):
        scaled = scale_to_window(text, name, target, (lo / correction, hi / correction))
        if scaled is None:
            return None
        spec, estimate = scaled
        seconds = measure(parse_spec(spec, name))
        if not (math.isfinite(seconds) and seconds > 0):
            return None
        if lo <= seconds <= hi:
            return spec, seconds
        correction = seconds / estimate
    return None


def generate(count: int, seed: int = 0, target: Target | None = None,
             window: tuple[float, float] = WINDOW, measure: Measure | None = None
             ) -> list[tuple[str, str]]:
    """`count` (name, spec text) pairs that parse; drafts that do not parse are redrawn.
    With a `target`, sizes are scaled into `window` (`scale_to_window`; with `measure`,
    `calibrated` on timings) and the header comment says the estimate or the timing."""
    rng = random.Random(seed)
    names = list(FAMILIES)
    weights = [WEIGHTS[n] for n in names]
    out: list[tuple[str, str]] = []
    while len(out) < count:
        family = rng.choices(names, weights)[0]
        name = f"corpus_{len(out):03d}_{family}"
        text = FAMILIES[family](rng, name)
        try:
            parse_spec(text, name)
        except ValueError:
            continue
        note = ""
        if target is not None:
            scaled = (calibrated(text, name, target, window, measure) if measure is not None
                      else scale_to_window(text, name, target, window))
            if scaled is None:
                continue
            text, seconds = scaled
            how = "measured" if measure is not None else "estimated"
            note = f", eager {how} {seconds * 1e3:.1f} ms on {target.name}"
        out.append((name, f"# generated by kernelsat corpus (training only{note})\n" + text))
    return out


def write_corpus(directory: Path, count: int, seed: int = 0, target: Target | None = None,
                 window: tuple[float, float] = WINDOW, measure: Measure | None = None
                 ) -> list[Path]:
    """Write `count` generated specs into `directory`; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in generate(count, seed, target, window, measure):
        path = directory / f"{name}.ks"
        path.write_text(text)
        paths.append(path)
    return paths
