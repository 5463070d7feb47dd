"""The optimize pipeline, as a short list of named stages.

    parse -> saturate -> extract -> prove -> lower -> measure -> gate -> pick

Each stage is timed under its name. Only programs whose certificate the independent
checker accepts are lowered and measured (no proof, no ship); the eager spec is
always a candidate (its proof is the empty chain). The measurements of a search are
taken one after another, some replayed from the cache, so a program can win by luck
(a quiet second, a slow moment of the eager program's run); the final gate
(`final_gate`) therefore times the winner and the eager program (each at its best
knob setting) again, interleaved (A B A B ..., the same inputs, the same flush rule,
`TIMING["gate"]`, the order alternating), and the winner ships only when it is faster
in a clear majority of the rounds (`kernelsat.hardware.duel`: a sign-test bound on the
median per-round ratio, stricter under load, rounds extended while undecided; a tie is
not a win unless the winner's median is lower and it does less work, `less_work`):
else the eager program ships and the report says why, with both figures and the
verdict. When the eager program won the search, the best other program is gated the
same way if it came within `CONTEST_RANGE` of it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from kernelsat.codegen import BACKENDS, KnobList, lower, render
from kernelsat.codegen.cuda import compile_cuda, find_nvcc
from kernelsat.driver.backends import make_backend
from kernelsat.driver.jobs import (
    STRESS_SCALE,
    Backend,
    Job,
    JobResult,
    LocalBackend,
    against_json,
    check_job,
    gate_backend,
)
from kernelsat.egraph.saturate import (
    DEFAULT_SCHEDULE,
    SaturationResult,
    saturate,
    scheduled_rules,
)
from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract import EXTRACTOR_GROUPS, extract
from kernelsat.extract.base import Cost, RooflineCost
from kernelsat.extract.local import lowered_cost
from kernelsat.extract.materialize import (
    class_terms,
    materializations,
    memo_cost,
    spread_kernel_counts,
    storable_in,
)
from kernelsat.floatsafe import Judge
from kernelsat.hardware.config import cache_dir as default_cache_dir
from kernelsat.hardware.cost import estimate_term
from kernelsat.hardware.duel import Load, judge, spread
from kernelsat.hardware.knobs import Setting, abandon_limit, learned_seconds, record_measured
from kernelsat.hardware.learned import load_if_present
from kernelsat.hardware.measure import TIMING, Measurement, TimingProtocol
from kernelsat.hardware.schedule_model import kernel_features
from kernelsat.hardware.targets import Target, get_target, target_names
from kernelsat.ir import Term, input_dims, inputs, postorder
from kernelsat.ops import Op
from kernelsat.program import InputDecl, Program
from kernelsat.proofs.certificate import Certificate, make_certificate
from kernelsat.proofs.checker import check
from kernelsat.proofs.explain import ExplainError, explain
from kernelsat.proofs.library import load_library
from kernelsat.proofs.steps import Step
from kernelsat.rewrites.library import RuleSet, library_rules
from kernelsat.rewrites.rule import Rule
from kernelsat.sexpr import to_sexpr
from kernelsat.spec import load_spec, parse_spec

PRUNE_FACTOR = 10.0
"""Candidates estimated slower than this many times the eager program are not timed
(a recomputing program can take minutes per run); the report says so."""


class OptimizeError(ValueError):
    """Bad arguments to `optimize` (unknown target, zero budget, ...)."""


@dataclass(frozen=True)
class Options:
    """Every knob of one optimize run. Limits are arguments, never environment reads.

    `target` is the hardware target: a `Target`, or its name for
    `kernelsat.hardware.targets.get_target` ("c", "numpy", "cuda" for the default GPU, or
    a GPU such as "h200"); `optimize` resolves it once and passes the record down.
    `timing` is how each program is timed (a preset of `kernelsat.hardware.measure.TIMING`).
    The RL commands read the same record with their own presets
    (`kernelsat.learning.rl_train.TRAIN_OPTIONS`)."""

    target: str | Target = "c"
    extract: str = "all"
    seconds: float = 90.0  # wall-clock budget for the whole run
    trials: int = 6  # programs measured (the eager spec included)
    knob_budget: int = 3  # knob settings measured per program
    iters: int = 6  # per stage (see kernelsat.egraph.saturate.DEFAULT_SCHEDULE)
    nodes: int = 20_000
    sat_seconds: float = 15.0
    samples: int = 12
    ilp_seconds: float = 5.0
    seed: int = 0
    factors: tuple[int, ...] = (64,)
    cache_dir: Path | None = None
    timing: TimingProtocol = TIMING["optimize"]
    gate_timing: TimingProtocol = TIMING["gate"]  # the final gate's interleaved rounds
    allow_bounded: bool = False  # load user rules proved only up to a size bound
    float_screen: bool = True  # drop candidates the static float analysis flags (floatsafe)

    def validate(self) -> None:
        try:
            hw = get_target(self.target)
        except KeyError:
            raise OptimizeError(f"unknown target {self.target!r}: expected one of "
                                f"{', '.join(target_names())}") from None
        if hw.backend not in BACKENDS:
            raise OptimizeError(f"target {hw.name}: kernelsat generates no {hw.backend} code "
                                f"yet (its backends: {', '.join(BACKENDS)})")
        if self.extract not in EXTRACTOR_GROUPS:
            raise OptimizeError(
                f"unknown extractor {self.extract!r}: expected {', '.join(EXTRACTOR_GROUPS)}"
            )
        for name in ("seconds", "trials", "knob_budget", "iters", "nodes", "sat_seconds",
                     "samples"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):  # nan fails both comparisons
                raise OptimizeError(
                    f"--{name.replace('_', '-')} must be positive and finite, not {value}")
        if self.seed < 0:
            raise OptimizeError(f"--seed must be >= 0, not {self.seed}")


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


@dataclass
class Candidate:
    """One program considered: where it came from, its proof, its measurement."""

    term: Term
    methods: list[str]
    estimate: float = float("nan")
    kernels: int = 0
    proof: str = "pending"  # "accepted", "eager" or why it was dropped
    steps: int = 0
    certificate: Certificate | None = None
    measurement: Measurement | None = None
    knobs: KnobList = None
    source: str = ""
    error: str = ""
    job: JobResult | None = None
    checked_on: str = ""  # the backend that ran the ship gate (float64 comparison, overflow)
    float_hazard: str = ""  # why the static float analysis dropped it (`_float_screen`)

    @property
    def proved(self) -> bool:
        return self.proof in ("accepted", "eager")

    @property
    def median(self) -> float:
        m = self.measurement
        return float(m.median) if m is not None and m.ok else float("inf")

    def __repr__(self) -> str:
        """One short line (the term, certificate and source stay attributes)."""
        text = to_sexpr(self.term)
        return (f"Candidate({'+'.join(self.methods) or '-'}, proof={_clip(self.proof, 40)!r}, "
                f"median_ms={self.median * 1e3:.4g}, kernels={self.kernels}, "
                f"term={_clip(text, 60)!r})")


@dataclass(frozen=True)
class Gate:
    """The final gate: the winner (the fastest program other than the eager one, see
    `contender`) and the eager program timed interleaved (seconds; inf where that side
    failed), and what ships."""

    winner_median: float
    winner_q1: float
    winner_q3: float
    eager_median: float
    eager_q1: float
    eager_q3: float
    runs: int  # timed runs of each
    passed: bool  # the winner ships
    reason: str
    # the paired verdict (`kernelsat.hardware.duel`): "faster", "slower", "tie", or ""
    # where the backend returned no per-round times (the quartiles decided)
    verdict: str = ""
    faster_rounds: int = 0  # rounds in which the winner was faster
    pair_ratio: float = float("nan")  # median of winner / eager per round
    loaded: str = ""  # why the machine looked loaded ("" when it did not)

    @property
    def note(self) -> str:
        """One line for the report."""
        ships = "the winner ships" if self.passed else "the eager program ships"
        return f"final gate ({ships}): {self.reason}"

    def as_dict(self) -> dict[str, object]:
        def ms(x: float) -> float | None:
            return x * 1e3 if x < float("inf") else None

        return {"winner_ms": ms(self.winner_median), "winner_q1_ms": ms(self.winner_q1),
                "winner_q3_ms": ms(self.winner_q3), "eager_ms": ms(self.eager_median),
                "eager_q1_ms": ms(self.eager_q1), "eager_q3_ms": ms(self.eager_q3),
                "runs": self.runs, "passed": self.passed, "reason": self.reason,
                "verdict": self.verdict, "faster_rounds": self.faster_rounds,
                "pair_ratio": self.pair_ratio if self.pair_ratio == self.pair_ratio else None,
                "loaded": self.loaded}


@dataclass
class Result:
    """What `optimize` returns: the best proved program and everything considered."""

    program: Program
    target: Target
    best: Candidate
    eager: Candidate
    candidates: list[Candidate]
    saturation: SaturationResult
    timings: dict[str, float] = field(default_factory=dict)
    timed: bool = True
    notes: list[str] = field(default_factory=list)
    gate: Gate | None = None  # None: the eager program won the search (or nothing timed)

    def speedup(self, c: Candidate) -> float:
        """Measured speedup of `c` over the eager spec (nan when either was not timed)."""
        if not self.timed or c.median == float("inf") or self.eager.median == float("inf"):
            return float("nan")
        return self.eager.median / c.median

    def __repr__(self) -> str:
        """A few lines at most: `summary()` has the report, the attributes the rest."""
        return (f"Result(kernel={self.program.name!r}, target={self.target.name!r}, "
                f"candidates={len(self.candidates)}, speedup={self.speedup(self.best):.3g}, "
                f"best={self.best!r})")

    @property
    def float_removed(self) -> int:
        """Candidates the static float analysis dropped before proving (`_float_screen`)."""
        return sum(bool(c.float_hazard) for c in self.candidates)

    @property
    def float_rejected(self) -> int:
        """Candidates the run-time float checks still rejected (the goal is none)."""
        return sum(float_check_failure(c.error) for c in self.candidates)

    def dropped(self, c: Candidate) -> str:
        """Why `c` was not shipped ("" for the best): its proof status when it was not
        proved, its failure (the ship gate, the build, the time budget) when it has one,
        else that the best program beat it."""
        if c is self.best:
            return ""
        if not c.proved:
            tried = not c.proof.startswith("not tried")
            return c.error or (f"not proved: {c.proof}" if tried else c.proof)
        if c.error:
            return c.error
        if c is self.eager and self.gate is not None and self.gate.passed:
            return f"final gate: {self.gate.reason}"
        if self.timed and c.median < float("inf"):
            return f"slower: {c.median * 1e3:.3f} ms vs the best {self.best.median * 1e3:.3f} ms"
        if not self.timed and c.checked_on:
            return (f"passed the checks; estimated {c.estimate * 1e3:.3f} ms vs the best "
                    f"{self.best.estimate * 1e3:.3f} ms")
        return "not measured"

    def summary(self) -> str:
        sat = self.saturation
        lines = [
            f"kernel {self.program.name} on target {self.target.name}",
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
            if self.gate is not None:
                g = self.gate
                lines.append(f"  final gate, interleaved ({g.runs} runs each): winner "
                             f"{g.winner_median * 1e3:.3f} ms vs eager "
                             f"{g.eager_median * 1e3:.3f} ms: "
                             f"{'winner ships' if g.passed else 'eager ships'}")
        else:
            lines.append(
                f"  nothing was timed (no {self.target.name} here): best by the cost model, "
                f"estimate "
                f"{self.best.estimate * 1e3:.3f} ms vs eager {self.eager.estimate * 1e3:.3f} ms"
            )
        lines.append(f"  kernels: {self.best.kernels}; proof: {self.best.steps} steps, "
                     f"{self.best.proof}")
        text = to_sexpr(self.best.term)
        lines.append(f"  program: {text if len(text) < 300 else text[:297] + '...'}")
        failed = [(i, c) for i, c in enumerate(self.candidates) if c.proved and c.error]
        lines.extend(f"  dropped #{i} ({', '.join(c.methods)}): {c.error[:200]}"
                     for i, c in failed)
        lines.append(f"  float safety: {self.float_removed} candidates removed by the static "
                     f"analysis, {self.float_rejected} rejected by the run-time float checks")
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
    if isinstance(spec, Program):
        return spec
    if isinstance(spec, Term):
        decls = tuple(
            InputDecl(n, input_dims(t)) for n, t in sorted(inputs(spec).items())
        )
        return Program("term", {}, decls, "out", tuple(spec.shape), spec)
    is_path = isinstance(spec, str) and "\n" not in spec and spec.endswith(".ks")
    if isinstance(spec, Path) or is_path:
        return load_spec(str(spec), dict(params or {}))
    return parse_spec(str(spec), "<spec>", dict(params or {}))


def _store_classes(spec: Term, snap: Snapshot) -> list[int]:
    """The e-classes the spec materialized (the operands of its Stores), found in the
    snapshot structurally."""
    classes = snap.classes_of(spec)
    return [classes[n.args[0]] for n in postorder(spec)
            if n.op is Op.STORE and n.args[0] in classes]


def extractor_options(program: Program, opts: Options, hw: Target
                      ) -> dict[str, dict[str, object]]:
    """What each extractor of `kernelsat.extract.EXTRACTORS` is built with in a run (none
    for the others): the sampler's and the policy's draws, the ILP's time limit, the
    local search's whole-program cost (the roofline of the lowered program on `hw`)."""
    return {"sample": {"n": opts.samples, "seed": opts.seed},
            "ilp": {"time_limit": opts.ilp_seconds},
            "local": {"term_cost": lowered_cost(program.out_axes, hw)},
            "rl": {"target": hw, "n": opts.samples, "seed": opts.seed}}


def _extract(program: Program, sat: SaturationResult, opts: Options, cost: Cost | None,
             progress: Progress, hw: Target) -> list[Candidate]:
    """Candidates from each extractor, each with its materializations (which reused
    values are stored, `kernelsat.extract.materialize`), deduplicated by term; the eager
    spec first."""
    snap = sat.snapshot
    found: dict[str, Candidate] = {program.term.key: Candidate(program.term, ["eager"])}
    options = extractor_options(program, opts, hw)
    extractions = []
    for method in EXTRACTOR_GROUPS[opts.extract]:
        try:
            extractions.extend(extract(snap, method, cost=cost, **options.get(method, {})))
        except Exception as e:  # an extractor failing never stops the run
            progress("extract", f"{method} failed: {type(e).__name__}: {e}")
    # materialization is searched per extraction (extract/materialize.py): the stores at
    # legal, reused classes that the lowered estimate prefers, partial fusion, the spec's
    # own stores, a random subset for the sampler's programs
    spec_classes = set(_store_classes(program.term, snap))
    term_cost = memo_cost(lowered_cost(program.out_axes, hw))
    reference = lowered_estimate(program.term, program, hw)
    for i, ex in enumerate(extractions):
        classes = class_terms(snap, snap.root, ex.choice)
        rng = np.random.default_rng(opts.seed + i) if ex.method == "sample" else None
        for m in materializations(ex.term, term_cost, storable=storable_in(snap, classes),
                                  reference=reference, rng=rng,
                                  spec_stores={t for t, c in classes.items() if c in spec_classes}):
            label = ex.method + {"none": "", "partial": "+partial"}.get(m.how, "+store")
            cand = found.setdefault(m.term.key, Candidate(m.term, []))
            if label not in cand.methods:
                cand.methods.append(label)
    progress("extract", f"{len(found)} distinct candidates")
    return list(found.values())


def prove_term(program: Program, snapshot: Snapshot, library: RuleSet, term: Term
               ) -> tuple[Certificate | None, int, str]:
    """Explain `term` from the spec through the firing log and check the certificate with
    the independent checker: `(certificate or None, steps, status)`, where status is
    "eager", "accepted" or why the program may not ship."""
    steps: list[Step] = []
    if term is not program.term:
        try:
            steps = explain(snapshot, library, program.term, term)
        except ExplainError as e:
            return None, 0, f"no chain: {type(e).__name__}: {str(e)[:200]}"
    cert = make_certificate(program.term, program.source, steps, term, library, program.params)
    verdict = check(cert, library)
    if not verdict.accepted:
        return None, len(steps), f"rejected at step {verdict.failed_step}: {verdict.reason}"
    return cert, len(steps), "eager" if term is program.term else "accepted"


def _prove(program: Program, sat: SaturationResult, library: RuleSet, cands: Sequence[Candidate],
           progress: Progress, deadline: float, wanted: int, eager_estimate: float) -> None:
    """Prove candidates in the given (estimate) order until `wanted` are proved: only
    programs that will be measured need a certificate. Candidates the cost model puts
    beyond `PRUNE_FACTOR` times the eager program are not timed, so not proved."""
    proved = 0
    for c in cands:
        if c.term is not program.term:
            if proved >= wanted:
                c.proof = "not tried: enough candidates proved"
                continue
            if c.estimate > PRUNE_FACTOR * eager_estimate:
                c.proof = "not tried"
                ratio = c.estimate / eager_estimate
                c.error = f"not timed: estimated {ratio:.0f}x the eager program"
                continue
            if time.monotonic() > deadline:
                c.proof = "not tried: out of time"
                continue
        c.certificate, c.steps, c.proof = prove_term(program, sat.snapshot, library, c.term)
        proved += c.proved
        progress("prove", f"{c.proof[:60]} ({c.steps} steps) <- {', '.join(c.methods)}")


def job_for(program: Program, term: Term, opts: Options, seed: int | None = None) -> Job:
    """The `Job` that measures `term` as `opts` says (the spec as the reference). The job
    names the target, so a worker resolves it on its own machine. The RL trainer and
    evaluator make their jobs here too."""
    name = opts.target.name if isinstance(opts.target, Target) else opts.target
    return Job(to_sexpr(program.term), to_sexpr(term), program.out_axes, program.inputs,
               name, opts.knob_budget, opts.seed if seed is None else seed, timing=opts.timing)


def _jobs(program: Program, opts: Options, cands: Sequence[Candidate]) -> list[Job]:
    """One `Job` per candidate."""
    return [job_for(program, c.term, opts) for c in cands]


def _check(program: Program, opts: Options, hw: Target, cands: Sequence[Candidate],
           progress: Progress) -> list[str]:
    """The ship gate (`kernelsat.driver.jobs.ship_failure`, the one measured programs
    pass) for a target that is not timed here: each candidate's program runs in float32
    through `gate_backend(target)` against the float64 reference and on the overflow
    check's inputs; a failure is the candidate's error."""
    for c, job in zip(cands, _jobs(program, opts, cands), strict=True):
        if c.error:
            continue
        r = check_job(job, opts.cache_dir)
        c.checked_on = r.checked_on
        if not r.ok:
            c.error = r.error
        progress("check", f"{'ok' if r.ok else r.error[:60]} ({r.checked_on}) <- "
                 f"{', '.join(c.methods)}")
    backend = gate_backend(hw)
    how = ("on the target" if backend == hw.backend else
           f"through the {backend} backend in float32 (the same lowered program; no "
           f"{hw.name} here)")
    return [f"numeric and overflow checks for target {hw.name} ran {how}"]


def _measure(program: Program, opts: Options, cands: Sequence[Candidate], backend: Backend,
             progress: Progress, deadline: float) -> None:
    """Measure the candidates through the backend (knob search included, cached), the
    eager program first. A local backend gets one job at a time, so the run stops at the
    deadline (the rest are recorded as not measured); other backends get all at once."""


    jobs = _jobs(program, opts, cands)
    batches = ([[i] for i in range(len(jobs))] if getattr(backend, "name", "") == "local"
               else [list(range(len(jobs)))])
    results: dict[int, JobResult] = {}
    best = float("inf")
    for batch in batches:
        if results and time.monotonic() > deadline:
            for i in batch:
                cands[i].error = "not measured: out of time (--seconds)"
            continue
        # a candidate far slower than the best so far is abandoned after one run
        left = max(deadline - time.monotonic(), 1.0)
        limit = replace(opts.timing, max_run_seconds=abandon_limit(best))
        todo = [replace(jobs[i], timing=limit, max_seconds=left, random_settings=0)
                for i in batch]
        for i, r in zip(batch, backend.run(todo, progress), strict=True):
            results[i] = r
            if r.ok:
                best = min(best, r.median)
            progress("measure", f"{len(results)}/{len(jobs)} measured, best so far "
                     f"{best * 1e3:.3f} ms")
    for i, r in sorted(results.items()):
        c = cands[i]
        c.job = r
        c.knobs, c.source, c.checked_on = r.knobs, r.source, r.checked_on
        if r.ok:
            c.measurement = r
        else:
            c.error = r.error
        progress("measure", f"{c.median * 1e3:.3f} ms <- {', '.join(c.methods)}"
                 + (f" ({c.error[:60]})" if c.error else ""))


CONTEST_RANGE = 1.5
"""When the eager program wins the search, the best other program is still timed
against it in the final gate if its search median is within this factor: the
search's separate runs, taken minutes apart (one on a busy moment), can rank two
close programs either way (attention_packed's fused kernel lost so, at 1.25x)."""


def contender(measured: Sequence[Candidate], eager: Candidate) -> Candidate | None:
    """The program the final gate times against the eager program: the fastest other
    measured program, when it won the search or came within `CONTEST_RANGE` of the
    eager program; None when there is none."""
    others = [c for c in measured if c is not eager and c.median < float("inf")]
    if not others:
        return None
    best = min(others, key=lambda c: (c.median, c.kernels))
    return best if best.median < CONTEST_RANGE * eager.median else None


def final_gate(program: Program, opts: Options, winner: Candidate, eager: Candidate,
               backend: Backend, progress: Progress) -> Gate:
    """Time `winner` and `eager` (each at its own best knob setting) interleaved and
    decide (`duel`); an eager program never measured leaves nothing to compare with, and
    the winner passes with that reason. A winner that loses is told what the search's
    separate runs had said."""
    inf = float("inf")
    if eager.median == inf:
        why = eager.error or "not measured"
        return Gate(winner.median, winner.measurement.q1 if winner.measurement else inf,
                    winner.measurement.q3 if winner.measurement else inf, inf, inf, inf, 0,
                    True, f"the eager program has no time to compare with ({why[:120]})")
    g = duel(program, opts, (winner.term, winner.knobs), (eager.term, eager.knobs), backend,
             progress)
    if g.passed or g.winner_median == inf or g.eager_median == inf:
        return g
    search = eager.median / winner.median
    return replace(g, reason=f"{g.reason}; the search's separate runs had said "
                             f"{search:.2f}x ({winner.median * 1e3:.3f} vs "
                             f"{eager.median * 1e3:.3f} ms)")


def duel(program: Program, opts: Options, winner: tuple[Term, KnobList | Setting],
         eager: tuple[Term, KnobList | Setting], backend: Backend, progress: Progress
         ) -> Gate:
    """The final gate's timing and verdict for two (program, knob setting) pairs: one
    job (`Job.against`, `opts.gate_timing`) times them interleaved on the backend; the
    winner passes only when the paired verdict on the rounds says faster
    (`_gate_verdict`), and not when it fails a check there; an eager program failing
    there leaves nothing to compare with, and the winner passes with that reason. The
    joint evaluation (`kernelsat.learning.rl_eval`) gates each method's choice with it,
    as optimize gates its winner."""
    (term, knobs), (eager_term, eager_knobs) = winner, eager
    job = replace(job_for(program, term, opts),
                  retime=json.dumps(knobs or {}, sort_keys=True, default=str),
                  against=against_json(to_sexpr(eager_term), eager_knobs),
                  timing=opts.gate_timing, random_settings=0)
    progress("gate", "timing the winner and the eager program interleaved")
    (r,) = backend.run([job], progress)
    g = Gate(r.median, r.q1, r.q3, r.against_median, r.against_q1, r.against_q3,
             r.runs, False, "")
    if r.median == float("inf"):
        return replace(g, reason=f"the winner failed there: {r.error[:200]}")
    if r.against_median == float("inf"):
        return replace(g, passed=True, reason=f"the eager program failed there "
                                              f"({r.error[:200]}); nothing to compare with")
    ratio = r.against_median / r.median
    versus = (f"winner {r.median * 1e3:.3f} ms ({r.q1 * 1e3:.3f}-{r.q3 * 1e3:.3f}) vs eager "
              f"{r.against_median * 1e3:.3f} ms ({r.against_q1 * 1e3:.3f}-"
              f"{r.against_q3 * 1e3:.3f}), {r.runs} interleaved runs each: {ratio:.2f}x")
    def less() -> str:  # asked only on a tie: lowering both programs costs
        hw = opts.target if isinstance(opts.target, Target) else get_target(opts.target)
        return less_work(term, eager_term, program, hw)

    passed, versus, g = _gate_verdict(r, versus, g, less)
    return replace(g, passed=passed, reason=versus)


WORK_COUNTS = ("kernels", "flops", "transcendentals", "compulsory bytes")
"""What `less_work` compares, summed over the lowered kernels at their default knobs:
counts of work the program does whatever its schedule (buffers read once and outputs
written once for the bytes)."""


def work_counts(term: Term, program: Program, target: Target) -> tuple[float, ...] | None:
    """`WORK_COUNTS` of `term` lowered for `program`'s output; None when it cannot be
    lowered."""
    try:
        kernels = lower(term, program.out_axes).kernels
        feats = [kernel_features(k, None, target) for k in kernels]
    except Exception:
        return None
    return (float(len(kernels)), sum(f.flops for f in feats),
            sum(f.transcendentals for f in feats), sum(f.compulsory_bytes for f in feats))


def less_work(a: Term, b: Term, program: Program, target: Target) -> str:
    """Where `a` does less work than `b`: the `WORK_COUNTS` in which it does less, as
    text, when it does no more in any (dominance); "" otherwise, or when either cannot
    be lowered. A gate that cannot tell two programs apart by time ships the one that
    does less (a tie between the eager program and a simplification of it that reads
    nothing goes to the simplification): the counts do not depend on the machine's
    noise, only the timing does."""
    wa, wb = work_counts(a, program, target), work_counts(b, program, target)
    if wa is None or wb is None or any(x > y for x, y in zip(wa, wb, strict=True)):
        return ""
    return ", ".join(f"{name} {x:.4g} < {y:.4g}"
                     for name, x, y in zip(WORK_COUNTS, wa, wb, strict=True) if x < y)


def _gate_verdict(r: JobResult, versus: str, g: Gate, less: Callable[[], str]
                  ) -> tuple[bool, str, Gate]:
    """Whether the winner passes, the reason extended, and the gate with the verdict:
    the paired verdict on the rounds (`kernelsat.hardware.duel.judge`: faster in a clear
    majority of rounds, with a confidence bound, a stricter one under load, and its
    median lower too; a tie ships the eager program unless the winner's median is lower
    and `less()` says where it does less work, `less_work`); where the backend returned
    no per-round times, the winner must be faster in its third quartile than eager in
    its first (the ranges apart)."""
    load = Load(r.load, r.probe, r.best_probe)
    if not (r.times and r.against_times):
        passed = r.q3 < r.against_q1
        why = "" if passed else "; their quartile ranges overlap or the eager program is faster"
        return passed, versus + why, g
    v = judge(r.times, r.against_times, load)
    seen = Load(load.per_core, load.probe, load.best_probe,
                (spread(r.times), spread(r.against_times)))
    loaded = ", ".join(seen.reasons)
    text = f"{versus}; {v.describe()}"
    if loaded:
        text += f"; machine loaded ({loaded}): {v.confidence:.1%} asked"
    fewer = less() if v.outcome == "tie" and r.median < r.against_median else ""
    if fewer:
        text += f"; a tie, and the winner does less work ({fewer}): a tie goes to it"
    elif v.outcome == "tie":
        text += "; a tie, not a win"
    elif v.outcome == "faster" and not r.median < r.against_median:
        text += "; but the medians disagree: not a win"
    g = replace(g, verdict=v.outcome, faster_rounds=v.faster, pair_ratio=v.ratio,
                loaded=loaded)
    return bool(fewer) or (v.outcome == "faster" and r.median < r.against_median), text, g


def _compile_cuda(program: Program, hw: Target, cands: Sequence[Candidate],
                  progress: Progress) -> list[str]:
    """Render CUDA for each candidate and, where nvcc exists, compile it for the
    target's architecture (`hw.arch`)."""
    have_nvcc = find_nvcc() is not None
    for c in cands:
        try:
            c.source = render(lower(c.term, program.out_axes), None, hw.backend, arch=hw.arch)
        except Exception as e:
            c.error = f"{type(e).__name__}: {str(e)[:300]}"
            continue
        if have_nvcc:
            report = compile_cuda(c.source, hw.arch)
            if not report.ok:
                c.error = f"nvcc failed: {report.log[-300:]}"
            progress("lower", f"nvcc {hw.arch} {'ok' if report.ok else 'FAILED'} <- "
                     f"{', '.join(c.methods)}")
    if not have_nvcc:
        return ["nvcc not found: the CUDA source was written but not compiled"]
    return [f"CUDA sources compiled with nvcc -cubin -arch={hw.arch}"]


def saturate_program(program: Program, library: RuleSet, opts: Options | None = None,
                     user_rules: Sequence[str] = ()) -> SaturationResult:
    """Saturate the spec's term as `optimize` does: the default schedule (plus a last
    stage of the named user rules), `opts`' limits and split factors."""
    opts = opts or Options()
    schedule = [*DEFAULT_SCHEDULE, *([tuple(user_rules)] if user_rules else [])]
    return saturate(program.term, scheduled_rules(library.rules, schedule),
                    iters=opts.iters, nodes=opts.nodes,
                    seconds=min(opts.sat_seconds, opts.seconds / 3),
                    factors=tuple(f for f in opts.factors if f > 1), schedule=schedule)


def lowered_estimate(term: Term, program: Program, hw: Target) -> float:
    """Roofline estimate of the lowered program (recomputation counted); the IR-only
    estimate when the program cannot be lowered."""
    try:
        return lowered_cost(program.out_axes, hw)(term)
    except Exception:
        return estimate_term(term, hw)


# -- the learned cost model (kernelsat.hardware.learned; helper J's block) ------------------


def _learned_order(program: Program, opts: Options, hw: Target, cands: Sequence[Candidate],
                   notes: list[str]) -> list[Candidate]:
    """The candidates in the order they are proved and measured: by the learned cost
    model when its file is in the cache folder (each at its default knob setting; the
    roofline estimate breaks ties and still prunes, `PRUNE_FACTOR`), else by the
    roofline estimate."""
    model = load_if_present(opts.cache_dir or default_cache_dir())
    if model is None:
        return sorted(cands, key=lambda c: c.estimate)
    notes.append(f"candidates ranked by the learned cost model ({model.rows} measured rows)")
    return sorted(cands, key=lambda c: (learned_seconds(c.term, program.out_axes, hw, model),
                                        c.estimate))


def _learned_update(program: Program, opts: Options, hw: Target,
                    measured: Sequence[Candidate]) -> None:
    """Add the measured candidates (each at its best knob setting) to the learned cost
    model as one group, when its file is in the cache folder."""
    record_measured(opts.cache_dir or default_cache_dir(), hw,
                    [(c.term, c.knobs if isinstance(c.knobs, dict) else None, c.median)
                     for c in measured if c.median < float("inf")], program.out_axes)


# -- float-safe proposals (issue 19 part 2) ---------------------------------------------

FLOAT_CHECK_ERRORS = ("float64 comparison (", "overflows in float32 (", "overflow check (")
"""How the ship gate's float checks begin their failures (`kernelsat.driver.jobs.
ship_failure`: the float64 comparison, the overflow check)."""


def float_check_failure(error: str) -> bool:
    """Whether a candidate's error is a run-time float check's rejection."""
    return error.startswith(FLOAT_CHECK_ERRORS)


def _float_screen(program: Program, cands: Sequence[Candidate], progress: Progress) -> None:
    """The static float analysis (`kernelsat.floatsafe.Judge`) on the candidates other
    than the eager one, on the check's inputs and on the overflow check's
    (`STRESS_SCALE`): a candidate with a hazard the spec does not have is marked
    (`float_hazard`, its error) and is not proved or measured."""
    judge = Judge(program, STRESS_SCALE)
    for c in cands:
        verdict = judge(c.term)
        if not verdict.safe:
            c.float_hazard = c.error = verdict.reason
            c.proof = "not tried: float-unsafe"
            progress("floatsafe", f"dropped {', '.join(c.methods)}: {verdict.reason[:100]}")


def optimize(
    spec: Program | Term | str | Path,
    target: str | Target = "c",
    *,
    params: Mapping[str, int] | None = None,
    rules: Sequence[Rule] = (),
    cost: Cost | None = None,
    progress: Progress = _quiet,
    backend: Backend | str | None = None,
    **options: Any,
) -> Result:
    """Optimize a kernel: the fastest program that provably equals the spec.

    `spec` is a `.ks` path, spec text, a `Program` or a bare `Term`. `target` is a
    `Target` or its name: "c" or "numpy" (this CPU, timed here), "cuda" (the default GPU)
    or a GPU such as "h200" (CUDA written and compiled for its arch, ranked by its
    roofline figures, checked here in float32). `rules` are extra
    user rules (verified before use; an unsound one raises, and so does one proved only
    up to a size bound unless `allow_bounded=True`). `cost` is a per-node cost
    model or term cost for extraction (default: the target's roofline model). Other
    keyword arguments are `Options` fields (`seconds`, `trials`, `extract`, ...).
    `backend` runs the measurements: a `Backend` (the caller closes it), or a name from
    `kernelsat.driver.backends.BACKENDS` (`"local"`, `"ray"`: made before any work and
    closed at the end; an unknown name raises `OptimizeError`). Default: `LocalBackend`,
    one job at a time here.

    >>> from kernelsat import optimize
    >>> r = optimize("kernel k(N=64)\\nin x[n:N] f32\\nout y[n] = exp(x[n]) * 2",
    ...              target="numpy", seconds=30, trials=2, knob_budget=1)
    >>> r.best.proved and r.speedup(r.best) > 0
    True
    """
    opts = Options(target=target, **options)
    opts.validate()
    with _open_backend(backend, opts.cache_dir) as runner:
        return _optimize(spec, opts, params, rules, cost, progress, runner)


@contextmanager
def _open_backend(backend: Backend | str | None, cache_dir: Path | None) -> Iterator[Backend]:
    """`backend` itself, or the backend it names (default local), closed on exit."""
    if backend is not None and not isinstance(backend, str):
        yield backend
        return

    try:
        runner = LocalBackend(cache_dir) if backend is None else make_backend(backend, None,
                                                                              cache_dir)
    except (ValueError, RuntimeError, ConnectionError) as e:
        raise OptimizeError(f"backend {backend!r}: {e}") from e
    try:
        yield runner
    finally:
        runner.close()


def _optimize(spec: Program | Term | str | Path, opts: Options,
              params: Mapping[str, int] | None, rules: Sequence[Rule], cost: Cost | None,
              progress: Progress, backend: Backend) -> Result:
    """`optimize`'s stages, with validated options and an open backend."""
    start = time.monotonic()
    timings: dict[str, float] = {}
    hw = get_target(opts.target, probe=True)  # chosen once; everything below reads it
    opts = replace(opts, target=hw)
    with _stage(timings, "parse", progress):
        program = as_program(spec, params)
        library = load_library(extra=tuple(rules), allow_bounded=opts.allow_bounded)
        # the shipped rules' names only: load_library just verified them
        user = sorted(set(library.by_name) - {r.name for r in library_rules()}) if rules else []
    with _stage(timings, "saturate", progress):
        sat = saturate_program(program, library, opts, user)
        progress("saturate", f"{sat.snapshot.n_nodes} e-nodes, stopped: {sat.stop_reason}")
    notes: list[str] = []
    with _stage(timings, "extract", progress):
        search_cost = cost if cost is not None else RooflineCost.for_target(hw)
        cands = _extract(program, sat, opts, search_cost, progress, hw)
        for c in cands:
            c.estimate = lowered_estimate(c.term, program, hw)
            c.kernels = kernel_count(c.term)
        eager = cands[0]
        rest = _learned_order(program, opts, hw, cands[1:], notes)
    if opts.float_screen:
        with _stage(timings, "floatsafe", progress):
            _float_screen(program, rest, progress)
    # one of each kernel count first, among the float-safe ones: measure different
    # materializations, not only reorderings of one program (kernelsat.extract.materialize);
    # the flagged candidates last
    kept = [c for c in rest if not c.float_hazard]
    cands = [eager, *spread_kernel_counts(kept, lambda c: c.kernels),
             *(c for c in rest if c.float_hazard)]
    with _stage(timings, "prove", progress):
        _prove(program, sat, library, [c for c in cands if not c.float_hazard], progress,
               start + opts.seconds * 0.5, opts.trials, eager.estimate)
    chosen = [c for c in cands if c.proved][: opts.trials]
    notes += [f"user rule {name} is proved only up to a size bound (loaded with "
              "allow_bounded=True)" for name in library.bounded_user_rules]
    timed = hw.kind == "cpu"  # a GPU target is compiled and checked here, not timed
    gate: Gate | None = None
    if timed:
        with _stage(timings, "measure", progress):
            _measure(program, opts, chosen, backend, progress, start + opts.seconds)
            _learned_update(program, opts, hw, chosen)
        notes.append(f"numeric and overflow checks for target {hw.name} ran on the "
                     "target, for every measured program")
        ok = [c for c in chosen if c.median < float("inf")]
        if not ok:
            raise OptimizeError(f"no candidate could be measured; eager: "
                                f"{eager.error or f'not measured (proof: {eager.proof})'}")
        best = min(ok, key=lambda c: (c.median, c.kernels))
        winner = contender(ok, eager)
        if winner is not None:
            with _stage(timings, "gate", progress):
                gate = final_gate(program, opts, winner, eager, backend, progress)
            notes.append(gate.note)
            progress("gate", gate.note[:160])
            best = winner if gate.passed else eager
            if not gate.passed:
                winner.error = f"final gate: {gate.reason}"
    else:
        with _stage(timings, "lower", progress):
            notes.extend(_compile_cuda(program, hw, chosen, progress))
        with _stage(timings, "check", progress):
            notes.extend(_check(program, opts, hw, chosen, progress))
        notes.append(f"target {hw.name}: nothing was timed on this machine; ranked by the "
                     f"cost model of the {hw.model}")
        passed = [c for c in chosen if not c.error]
        if not passed:
            raise OptimizeError(f"no candidate passed the checks; eager: "
                                f"{eager.error or f'not measured (proof: {eager.proof})'}")
        best = min(passed, key=lambda c: c.estimate)
    return Result(program, hw, best, eager, cands, sat, timings, timed, notes, gate)
