"""The optimize pipeline, as a short list of named stages.

    parse -> saturate -> extract -> prove -> lower -> measure -> pick

Each stage is timed under its name. Only programs whose certificate the independent
checker accepts are lowered and measured (no proof, no ship); the eager spec is
always a candidate (its proof is the empty chain), so the result is never slower
than the spec by more than measurement noise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np

from kernelsat.interp import evaluate_as
from kernelsat.ir import Term, postorder
from kernelsat.ops import Op
from kernelsat.program import Program
from kernelsat.rewrites.rule import Rule

EXTRACTORS = ("greedy", "ilp", "sample", "rl")
"""The extractor choices of `--extract` (`all` means every one but `rl`)."""

EXTRACT_METHODS: dict[str, tuple[str, ...]] = {
    "greedy": ("greedy-tree", "greedy-dag"),
    "ilp": ("ilp",),
    "sample": ("sample",),
    "rl": ("rl",),
    "all": ("greedy-tree", "greedy-dag", "ilp", "sample"),
}


class OptimizeError(ValueError):
    """Bad arguments to `optimize` (unknown target, zero budget, ...)."""


@dataclass
class Options:
    """Every knob of one optimize run. Limits are arguments, never environment reads."""

    target: str = "c"
    extract: str = "all"
    seconds: float = 100.0  # wall-clock budget for the whole run
    trials: int = 8  # programs measured (the eager spec included)
    knob_budget: int = 4  # knob settings measured per program
    iters: int = 12
    nodes: int = 20_000
    sat_seconds: float = 15.0
    samples: int = 12
    ilp_seconds: float = 10.0
    seed: int = 0
    factors: tuple[int, ...] = (8, 16, 32, 64, 128)
    cache_dir: Path | None = None
    min_runs: int = 5
    min_seconds: float = 0.1

    def validate(self) -> None:
        from kernelsat.hardware.targets import TARGET_NAMES

        if self.target not in ("c", "numpy", "cuda"):
            raise OptimizeError(
                f"unknown target {self.target!r}: expected one of c, numpy, cuda "
                f"(hardware descriptions: {', '.join(TARGET_NAMES)})"
            )
        if self.extract not in EXTRACT_METHODS:
            raise OptimizeError(
                f"unknown extractor {self.extract!r}: expected {', '.join(EXTRACT_METHODS)}"
            )
        for name in ("seconds", "trials", "knob_budget", "iters", "nodes", "sat_seconds"):
            if getattr(self, name) <= 0:
                raise OptimizeError(f"--{name.replace('_', '-')} must be positive")


@dataclass
class Candidate:
    """One program considered: where it came from, its proof, its measurement."""

    term: Term
    methods: list[str]
    estimate: float = float("nan")
    kernels: int = 0
    proof: str = "pending"  # "accepted", "eager" or why it was dropped
    steps: int = 0
    certificate: Any = None
    measurement: Any = None
    knobs: Any = None
    source: str = ""
    error: str = ""

    @property
    def proved(self) -> bool:
        return self.proof in ("accepted", "eager")

    @property
    def median(self) -> float:
        m = self.measurement
        return float(m.median) if m is not None and m.ok else float("inf")


@dataclass
class Result:
    """What `optimize` returns: the best proved program and everything considered."""

    program: Program
    target: str
    best: Candidate
    eager: Candidate
    candidates: list[Candidate]
    saturation: Any
    timings: dict[str, float] = field(default_factory=dict)
    timed: bool = True
    notes: list[str] = field(default_factory=list)

    def speedup(self, c: Candidate) -> float:
        """Measured speedup of `c` over the eager spec (nan when either was not timed)."""
        if not self.timed or c.median == float("inf") or self.eager.median == float("inf"):
            return float("nan")
        return self.eager.median / c.median

    def summary(self) -> str:
        from kernelsat.sexpr import to_sexpr

        sat = self.saturation
        lines = [
            f"kernel {self.program.name} on target {self.target}",
            f"  saturation: {sat.snapshot.n_nodes} e-nodes, {sat.snapshot.n_classes} e-classes,"
            f" {sat.seconds:.2f} s, stopped: {sat.stop_reason}",
            f"  candidates: {len(self.candidates)}, proved: "
            f"{sum(c.proved for c in self.candidates)}, measured: "
            f"{sum(c.measurement is not None for c in self.candidates)}",
        ]
        if self.timed:
            lines.append(
                f"  eager: {self.eager.median * 1e3:.3f} ms; best: {self.best.median * 1e3:.3f} ms"
                f" ({self.speedup(self.best):.2f}x) from {', '.join(self.best.methods)}"
            )
        else:
            lines.append(
                f"  nothing was timed (no GPU here): best by the cost model, estimate "
                f"{self.best.estimate * 1e3:.3f} ms vs eager {self.eager.estimate * 1e3:.3f} ms"
            )
        lines.append(f"  kernels: {self.best.kernels}; proof: {self.best.steps} steps, "
                     f"{self.best.proof}")
        text = to_sexpr(self.best.term)
        lines.append(f"  program: {text if len(text) < 300 else text[:297] + '...'}")
        lines.extend(f"  note: {n}" for n in self.notes)
        lines.append("  stages: " + ", ".join(f"{k} {v:.1f}s" for k, v in self.timings.items()))
        return "\n".join(lines)


Progress = Callable[[str, str], None]


def _quiet(stage: str, message: str) -> None:
    pass


@contextmanager
def _stage(timings: dict[str, float], name: str, progress: Progress) -> Iterator[None]:
    start = time.perf_counter()
    progress(name, "start")
    try:
        yield
    finally:
        timings[name] = timings.get(name, 0.0) + time.perf_counter() - start
        progress(name, f"done in {timings[name]:.1f}s")


def kernel_count(term: Term) -> int:
    """Kernels of a program: one per `Store`, plus the root."""
    return 1 + sum(1 for n in postorder(term) if n.op is Op.STORE)


def as_program(spec: Program | Term | str | Path, params: Mapping[str, int] | None) -> Program:
    """A Program from a Program, a spec path, spec text, or a bare term."""
    from kernelsat.spec import load_spec, parse_spec

    if isinstance(spec, Program):
        return spec
    if isinstance(spec, Term):
        from kernelsat.inputs import InputDecl  # noqa: F401  (re-exported names)
        from kernelsat.ir import input_dims, inputs

        decls = tuple(
            __import__("kernelsat.program", fromlist=["InputDecl"]).InputDecl(n, input_dims(t))
            for n, t in sorted(inputs(spec).items())
        )
        return Program("term", {}, decls, "out", tuple(spec.shape), spec)
    if isinstance(spec, Path) or (isinstance(spec, str) and "\n" not in spec and spec.endswith(".ks")):
        return load_spec(str(spec), dict(params or {}))
    return parse_spec(str(spec), "<spec>", dict(params or {}))


def _store_classes(spec: Term, class_ids: Mapping[str, int]) -> list[int]:
    """The e-classes the spec materialized (the operands of its Stores)."""
    out = []
    for node in postorder(spec):
        if node.op is Op.STORE and node.args[0].key in class_ids:
            out.append(class_ids[node.args[0].key])
    return out


def _extract(program: Program, sat: Any, opts: Options, cost: Any, progress: Progress
             ) -> list[Candidate]:
    """Candidates from each extractor, plus store variants at the spec's Store classes,
    deduplicated by term; the eager spec first."""
    from kernelsat.extract import extract

    snap = sat.snapshot
    found: dict[str, Candidate] = {program.term.key: Candidate(program.term, ["eager"])}
    extra: dict[str, Any] = {"sample": {"n": opts.samples, "seed": opts.seed},
                             "ilp": {"time_limit": opts.ilp_seconds}}
    extractions = []
    for method in EXTRACT_METHODS[opts.extract]:
        if method == "rl":
            from kernelsat.extract import rl_extract  # type: ignore[attr-defined]

            extractions.extend(rl_extract(snap, program, opts))
            continue
        try:
            extractions.extend(extract(snap, method, cost=cost, **extra.get(method, {})))
        except Exception as e:  # an extractor failing never stops the run
            progress("extract", f"{method} failed: {e}")
    stores = [c for c in _store_classes(program.term, getattr(sat, "class_ids", {}))
              if snap.storable(c)]
    for ex in extractions:
        variants = [ex.term]
        used = [c for c in stores if c in ex.choice]
        for k in range(1, min(len(used), 3) + 1):
            for subset in combinations(used, k):
                try:
                    variants.append(snap.term(ex.choice, stored=subset))
                except ValueError:
                    pass
        for i, t in enumerate(variants):
            label = ex.method if i == 0 else f"{ex.method}+store"
            cand = found.setdefault(t.key, Candidate(t, []))
            if label not in cand.methods:
                cand.methods.append(label)
    progress("extract", f"{len(found)} distinct candidates")
    return list(found.values())


def _prove(program: Program, sat: Any, library: Any, cands: Iterable[Candidate],
           progress: Progress, deadline: float) -> None:
    from kernelsat.egraph.explain import ExplainError, explain
    from kernelsat.proofs.certificate import make_certificate
    from kernelsat.proofs.checker import check

    for c in cands:
        steps: list[Any] = []
        if c.term is not program.term:
            if time.monotonic() > deadline:
                c.proof = "not tried: out of time"
                continue
            try:
                steps = explain(sat.snapshot, library, program.term, c.term)
            except ExplainError as e:
                c.proof = f"no chain: {str(e)[:200]}"
                continue
        cert = make_certificate(program.term, program.source, steps, c.term, library,
                                program.params)
        verdict = check(cert, library)
        c.certificate, c.steps = cert, len(steps)
        if not verdict.accepted:
            c.proof = f"rejected at step {verdict.failed_step}: {verdict.reason}"
        else:
            c.proof = "eager" if c.term is program.term else "accepted"
        progress("prove", f"{c.proof[:60]} ({len(steps)} steps) <- {', '.join(c.methods)}")


def _measure(program: Program, opts: Options, target: Any, cands: Sequence[Candidate],
             progress: Progress, deadline: float) -> None:
    from kernelsat.codegen import build, lower
    from kernelsat.hardware.cache import MeasureCache
    from kernelsat.hardware.knobs import codegen_knobs, tune
    from kernelsat.inputs import random_inputs

    env64 = random_inputs(program, seed=opts.seed)
    reference = evaluate_as(program.term, env64, program.out_axes)
    env32 = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in env64.items()}
    cache_path = None if opts.cache_dir is None else Path(opts.cache_dir) / "measure.sqlite"
    cache = MeasureCache(cache_path)
    build_dir = None if opts.cache_dir is None else Path(opts.cache_dir) / opts.target
    backend = "numpy" if opts.target == "numpy" else "c"

    def builder(lowered: Any, name: str, setting: Any) -> Any:
        return build(lowered, backend, codegen_knobs(lowered, setting), cache_dir=build_dir)

    for c in cands:
        if time.monotonic() > deadline and c.term is not program.term:
            c.error = "not measured: out of time"
            continue
        try:
            lowered = lower(c.term, program.out_axes)
            result = tune(
                lowered, target, env32, tuple(reference.shape), reference,
                program_key=lowered.key, budget=opts.knob_budget, seed=opts.seed, cache=cache,
                build=builder,
                measure_kwargs={"min_runs": opts.min_runs, "min_seconds": opts.min_seconds},
            )
        except Exception as e:  # a candidate that fails to build is recorded, not fatal
            c.error = f"{type(e).__name__}: {str(e)[:300]}"
            progress("measure", f"failed: {c.error[:80]}")
            continue
        c.measurement, c.knobs = result.best_measurement, result.best
        c.source = builder(lowered, backend, result.best).source
        if c.measurement is not None and not c.measurement.ok:
            c.error = c.measurement.failure
        progress("measure", f"{c.median * 1e3:.3f} ms <- {', '.join(c.methods)}")
    cache.close()


def _compile_cuda(program: Program, cands: Sequence[Candidate], progress: Progress) -> list[str]:
    from kernelsat.codegen import lower, render
    from kernelsat.codegen.cuda import compile_cuda, find_nvcc

    notes = []
    for c in cands:
        try:
            c.source = render(lower(c.term, program.out_axes), None, target="cuda")
        except Exception as e:
            c.error = f"{type(e).__name__}: {str(e)[:300]}"
    if find_nvcc() is None:
        notes.append("nvcc not found: the CUDA source was written but not compiled")
    return notes


def optimize(
    spec: Program | Term | str | Path,
    target: str = "c",
    *,
    params: Mapping[str, int] | None = None,
    rules: Sequence[Rule] = (),
    cost: Any = None,
    progress: Progress = _quiet,
    **options: Any,
) -> Result:
    """Optimize a kernel: the fastest program that provably equals the spec.

    `spec` is a `.ks` path, spec text, a `Program` or a bare `Term`. `rules` are extra
    user rules (verified before use; an unsound one raises). `cost` is a per-node cost
    model or term cost for extraction (default: the target's roofline model). Other
    keyword arguments are `Options` fields (`seconds`, `trials`, `extract`, ...).

    >>> from kernelsat import optimize
    >>> r = optimize("kernel k(N=64)\\nin x[n:N] f32\\nout y[n] = exp(x[n]) * 2",
    ...              target="numpy", seconds=30, trials=2, knob_budget=1)
    >>> r.best.proved and r.speedup(r.best) > 0
    True
    """
    from kernelsat.egraph.saturate import saturate
    from kernelsat.extract import Rescore
    from kernelsat.extract.base import RooflineCost
    from kernelsat.hardware.cost import estimate_term
    from kernelsat.hardware.targets import get_target
    from kernelsat.rewrites.library import load_library

    opts = Options(target=target, **options)
    opts.validate()
    start = time.monotonic()
    deadline = start + opts.seconds
    timings: dict[str, float] = {}
    hw = get_target("cpu" if opts.target in ("c", "numpy") else "h100")
    with _stage(timings, "parse", progress):
        program = as_program(spec, params)
        library = load_library(extra=tuple(rules))
    with _stage(timings, "saturate", progress):
        factors = tuple(f for f in opts.factors if f > 1)
        sat = saturate(program.term, library.rules, iters=opts.iters, nodes=opts.nodes,
                       seconds=min(opts.sat_seconds, opts.seconds / 3), factors=factors)
        progress("saturate", f"{sat.snapshot.n_nodes} e-nodes, stopped: {sat.stop_reason}")
    with _stage(timings, "extract", progress):
        search_cost = cost if cost is not None else RooflineCost.for_target(hw)
        cands = _extract(program, sat, opts, search_cost, progress)
        for c in cands:
            c.estimate = estimate_term(c.term, hw)
            c.kernels = kernel_count(c.term)
        eager = cands[0]
        rest = sorted(cands[1:], key=lambda c: c.estimate)
        cands = [eager, *rest]
    with _stage(timings, "prove", progress):
        _prove(program, sat, library, cands, progress, start + opts.seconds * 0.6)
    proved = [c for c in cands if c.proved]
    chosen = proved[: opts.trials]
    notes: list[str] = []
    timed = opts.target != "cuda"
    if timed:
        with _stage(timings, "measure", progress):
            _measure(program, opts, hw, chosen, progress, deadline)
        ok = [c for c in chosen if c.median < float("inf")]
        if not ok:
            raise OptimizeError(f"no candidate could be measured; eager: {eager.error}")
        best = min(ok, key=lambda c: (c.median, c.kernels))
    else:
        with _stage(timings, "lower", progress):
            notes.extend(_compile_cuda(program, chosen, progress))
        notes.append("target cuda: no GPU on this machine, nothing was timed; ranked by the "
                     "cost model of the H100")
        best = min((c for c in chosen if not c.error), key=lambda c: c.estimate, default=eager)
    _ = Rescore  # the rescoring cost is available to callers through kernelsat.extract
    return Result(program, opts.target, best, eager, cands, sat, timings, timed, notes)
