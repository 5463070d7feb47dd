"""Evaluating extractors by measurement: the regret table of `kernelsat evaluate`.

For each held-out spec: saturate, then for each method measure its programs, proved
first (no proof, no measurement), in the method's own order:

- `rl`: the policy's first K distinct proved programs (greedy rollout, then samples);
- `sample`: the Boltzmann sampler's K cheapest-by-roofline distinct proved programs;
- `greedy`, `ilp`: their one program on the analytic roofline cost (one measurement);
- `best`: the reference, the fastest of everything measured plus a large search:
  *exhaustive* when the extraction space has at most `reference` programs (all of them,
  enumerated by depth-first search over the environment's exact mask, proved and
  measured), else *sampled*: `reference` more distinct proved programs, drawn by the
  sampler at a high temperature and by the policy at temperature 2.

Every method also has the eager spec (the optimize pipeline always keeps it): it ships
the fastest of its programs by its own measurements, or the eager spec when none beat
it. Then the finalists, each method's choice and the `FINALISTS` fastest programs of
all, are timed again, afresh and interleaved (`CONFIRM_ROUNDS` rounds, `Measurer.confirm`),
and those times are the table's: the fastest of 200 noisy first-pass medians is biased
low by the noise (the winner's curse), re-timed finalists are not. Regret is
`t_method / t_best - 1`; the table ends with geometric means of `t_method / t_best`
(reported minus one). As in optimize, a program the cost model puts beyond
`PRUNE_FACTOR` times the eager program is not timed (a recomputing program can take
minutes per run; it costs no measurement from a method's budget and is counted in the
table), and one whose run takes over `SLOWDOWN_LIMIT` times the eager spec's time is
abandoned after that run (it cannot be any method's best: the eager spec is there).
The cold-start column runs the same policy, features computed for the numpy target it
was not trained on, measured on numpy against a numpy reference (the same kinds of
candidates, `cold_reference` of them, measured on numpy).

Finished specs are appended to a JSON-lines log as they finish, so an interrupted
evaluation resumes where it stopped (with the same settings).
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kernelsat.driver.jobs import STRESS_SCALE, LocalBackend
from kernelsat.driver.pipeline import PRUNE_FACTOR, Options, job_for, lowered_estimate
from kernelsat.egraph.saturate import saturate
from kernelsat.extract import ILP, GreedyDag, Sampler, roofline_rescore
from kernelsat.extract.rl import DEFAULT_CHECKPOINT, RLExtractor
from kernelsat.extract.rl_env import ExtractionEnv, enumerate_programs
from kernelsat.hardware.cache import knobs_key
from kernelsat.hardware.knobs import abandon_limit
from kernelsat.hardware.measure import TIMING
from kernelsat.hardware.targets import get_target
from kernelsat.ir import Term
from kernelsat.learning.rl_train import TRAIN_OPTIONS, Prover, settings_record
from kernelsat.proofs.library import load_library
from kernelsat.spec import load_spec

METHODS = ("rl", "sample", "greedy", "ilp", "eager")

EVAL_OPTIONS = replace(TRAIN_OPTIONS, nodes=3000, sat_seconds=6.0, timing=TIMING["evaluate"])
"""How the evaluation saturates and times (larger e-graphs, more runs per program than
training)."""


def small_params(path: Path, cap: int) -> dict[str, int]:
    """Every size parameter of the spec at `path`, capped at `cap`."""
    return {k: min(int(v), cap) for k, v in load_spec(path).params.items()}


@dataclass
class SpecEval:
    """One spec's measured times per method (seconds; inf when nothing measured)."""

    name: str
    n_nodes: int = 0
    times: dict[str, float] = field(default_factory=dict)
    measured: int = 0
    notes: list[str] = field(default_factory=list)
    reference: str = ""  # "exhaustive (N)" or "sampled"
    seconds: float = 0.0
    spread: float = math.nan  # (q3 - q1) / median of the best program's runs: the noise
    screened: int = 0  # proved-or-not programs not timed: estimated > PRUNE_FACTOR x eager
    first_pass: dict[str, float] = field(default_factory=dict)  # before the re-timing

    def regret(self, method: str, ref: str = "best") -> float:
        return self.times.get(method, math.inf) / self.times[ref] - 1.0


@dataclass
class Measurer:
    """Proves then measures programs of one spec, memoized by program key."""

    program: Any
    saturation: Any
    library: Any
    backend: Any
    ms: Options
    prover: Prover | None = None  # shared by the cold start's Measurer of the same spec
    times: dict[str, float] = field(default_factory=dict)
    spreads: dict[str, float] = field(default_factory=dict)
    knobs: dict[str, Any] = field(default_factory=dict)  # the setting each was timed with
    terms: dict[str, Term] = field(default_factory=dict)
    screened: set[str] = field(default_factory=set)
    max_run_seconds: float = math.inf
    max_estimate: float = math.inf
    retime_failures: dict[str, str] = field(default_factory=dict)
    """The first failure of each program whose re-timing failed (`confirm`)."""

    def __post_init__(self) -> None:
        if self.prover is None:
            self.prover = Prover([self.program], [self.saturation.snapshot], self.library)

    def prove(self, term: Term) -> bool:
        assert self.prover is not None
        return self.prover.status(0, term) in ("accepted", "eager")

    def timeable(self, term: Term) -> bool:
        """False for a program the cost model puts beyond `PRUNE_FACTOR` times the eager
        program (what optimize never times: one run could take minutes)."""
        if term.key in self.screened:
            return False
        if term.key in self.times or self.max_estimate == math.inf:
            return True
        if lowered_estimate(term, self.program, get_target(self.ms.target)) \
                > self.max_estimate:
            self.screened.add(term.key)
            return False
        return True

    def best_of(self, terms: Sequence[Term], budget: int) -> str | None:
        """The key of the fastest of the first `budget` proved, timeable programs of
        `terms` (measured; unproved and screened programs cost nothing from the budget;
        None when none ran)."""
        chosen: dict[str, Term] = {}
        for t in terms:
            if len(chosen) >= budget:
                break
            if t.key not in chosen and self.timeable(t) and self.prove(t):
                chosen[t.key] = t
        todo = [t for t in chosen.values() if t.key not in self.times]
        if todo:
            timing = replace(self.ms.timing, max_run_seconds=self.max_run_seconds)
            jobs = [replace(job_for(self.program, t, self.ms), timing=timing) for t in todo]
            for t, r in zip(todo, self.backend.run(jobs), strict=True):
                self.times[t.key] = r.median if r.ok else math.inf
                self.spreads[t.key] = (r.q3 - r.q1) / r.median if r.ok else math.nan
                self.knobs[t.key] = r.knobs
        self.terms.update(chosen)
        ran = [k for k in chosen if math.isfinite(self.times[k])]
        return min(ran, key=self.times.__getitem__, default=None)

    def confirm(self, keys: Sequence[str], rounds: int) -> dict[str, float]:
        """Time `keys` again, afresh (no cache, each with the knob setting it was timed
        with) and interleaved: `rounds` rounds of one job per program. Returns each
        program's median over the rounds. The fastest of 200 first-pass medians is biased
        low by the noise (the winner's curse); re-timed finalists are not selected by
        their own noise, and interleaving spreads a slow spell of the host over all."""
        keys = [k for k in dict.fromkeys(keys) if math.isfinite(self.times.get(k, math.inf))]
        samples: dict[str, list[float]] = {k: [] for k in keys}
        for _ in range(rounds):
            # each program already ran in self.times[k]: its re-timing is stopped only far
            # beyond that (a slow spell of the host must not turn it into a failure)
            jobs = [replace(job_for(self.program, self.terms[k], self.ms),
                            retime=knobs_key(self.knobs[k] or {}),
                            timing=replace(self.ms.timing, max_run_seconds=RETIME_SLACK
                                           * abandon_limit(self.times[k])))
                    for k in keys]
            for k, r in zip(keys, self.backend.run(jobs), strict=True):
                if r.ok:
                    samples[k].append(r.median)
                else:
                    self.retime_failures.setdefault(k, r.error)
        return {k: statistics.median(v) for k, v in samples.items() if v}

    def eager(self) -> float:
        """Time the eager spec; later programs are abandoned past SLOWDOWN_LIMIT x its
        time, and not timed past PRUNE_FACTOR x its estimate."""
        key = self.best_of([self.program.term], 1)
        t = self.times[key] if key is not None else math.inf
        self.max_run_seconds = abandon_limit(t)
        self.max_estimate = PRUNE_FACTOR * lowered_estimate(
            self.program.term, self.program, get_target(self.ms.target))
        return t


FINALISTS = 5
"""The fastest first-pass programs re-timed with the methods' choices."""

CONFIRM_ROUNDS = 3
"""Interleaved re-timing rounds of the finalists (`Measurer.confirm`)."""

RETIME_SLACK = 4.0
"""A finalist's re-timing is stopped past RETIME_SLACK x abandon_limit(its first-pass
time) (16x that time, at least 20 ms): the eager program of attention was once stopped
at 4x its first-pass time while the host ran at half speed."""


def _terms(extractions: Sequence[Any]) -> list[Term]:
    return [e.term for e in extractions]


def evaluate_spec(path: Path, params: dict[str, int], *, budget: int, reference: int,
                  checkpoint: Path | None, library: Any, backend: Any, ms: Options,
                  cold_backend: Any = None, cold_reference: int = 48,
                  seed: int = 0) -> tuple[SpecEval, SpecEval | None]:
    """The measured times of every method on one spec (and the numpy cold start)."""
    started = time.monotonic()
    program = load_spec(path, params)
    sat = saturate(program.term, library.rules, iters=ms.iters, nodes=ms.nodes,
                   seconds=ms.sat_seconds, factors=ms.factors)
    snap = sat.snapshot
    cost = roofline_rescore(get_target(ms.target))
    everything, exhaustive = enumerate_programs(ExtractionEnv(snap), reference + 1)

    def run(m: Measurer, rl_target: str, n_reference: int,
            row: SpecEval) -> SpecEval:
        """Measure every method and the reference with `m`; fill in and return `row`."""
        m.eager()
        eager = program.term.key
        rl = RLExtractor(checkpoint, target=rl_target, n=4 * budget, seed=seed)
        rl_terms = _terms(rl.extract(snap, snap.root, cost))
        sampled = _terms(Sampler(n=4 * budget, seed=seed).extract(snap, snap.root, cost))
        plans: dict[str, tuple[Callable[[], list[Term]], int]] = {
            "rl": (lambda: rl_terms, budget),
            "sample": (lambda: sampled, budget),
            "greedy": (lambda: _terms(GreedyDag().extract(snap, snap.root, cost)), 1),
            "ilp": (lambda: _terms(ILP(time_limit=5.0).extract(snap, snap.root, cost)), 1),
        }
        choice = {"eager": eager}
        for name, (terms, k) in plans.items():
            try:
                pick = m.best_of(terms(), k)
            except Exception as e:  # an extractor failing is a result, not a crash
                row.notes.append(f"{name}: {type(e).__name__}: {str(e)[:80]}")
                pick = None
            # the method ships its pick when its own measurement beat the eager spec's
            if pick is not None and m.times[pick] < m.times.get(eager, math.inf):
                choice[name] = pick
            else:
                choice[name] = eager
        if exhaustive:
            m.best_of(everything, len(everything))
        else:
            wide = Sampler(n=n_reference, temperature=4.0, seed=seed + 1)
            extra = RLExtractor(checkpoint, target=rl_target, n=n_reference, seed=seed + 1,
                                temperature=2.0)
            m.best_of(_terms(wide.extract(snap, snap.root, cost))
                      + _terms(extra.extract(snap, snap.root, cost)), n_reference)
        ranked = sorted((k for k in m.times if math.isfinite(m.times[k])), key=m.times.__getitem__)
        first = {name: m.times.get(k, math.inf) for name, k in choice.items()}
        first["best"] = min(m.times.values())
        confirmed = m.confirm([*ranked[:FINALISTS], *choice.values()], CONFIRM_ROUNDS)
        times = {name: confirmed.get(k, math.inf) for name, k in choice.items()}
        for name, chosen in choice.items():
            if chosen not in confirmed:
                why = m.retime_failures.get(chosen, "its first pass failed")
                row.notes.append(f"{name}: re-timing failed: {why[:160]}")
        times["best"] = min(confirmed.values(), default=math.inf)
        best_key = min(confirmed, key=confirmed.__getitem__, default=None)
        row.times, row.first_pass, row.measured = times, first, len(m.times)
        row.spread = m.spreads.get(best_key, math.nan) if best_key else math.nan
        row.screened = len(m.screened)
        return row

    kind = f"exhaustive ({len(everything)})" if exhaustive else "sampled"
    out = SpecEval(path.stem, snap.n_nodes, reference=kind)
    m = Measurer(program, sat, library, backend, ms)
    run(m, ms.target, reference, out)
    out.seconds = round(time.monotonic() - started, 1)
    cold = None
    if cold_backend is not None:
        started = time.monotonic()
        cms = replace(ms, target=get_target("numpy"))
        mc = Measurer(program, sat, library, cold_backend, cms, prover=m.prover)
        cold = run(mc, "numpy", cold_reference, SpecEval(path.stem, snap.n_nodes,
                                                          reference=kind))
        cold.seconds = round(time.monotonic() - started, 1)
    return out, cold


def _notes(row: SpecEval, cold: SpecEval | None) -> list[str]:
    """A spec's notes (extractor errors, failed re-timings), the cold start's marked."""
    return row.notes + [f"numpy (cold): {n}" for n in (cold.notes if cold else [])]


def geomean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in finite) / len(finite)) if finite else math.nan


def table(rows: Sequence[SpecEval], cold: Sequence[SpecEval | None], budget: int) -> str:
    """The Markdown regret table (percent), with geometric means."""
    head = ["spec", "e-nodes", "reference", "measured", "not timed", "best ms", "best's IQR"]
    head += [f"{m} regret" for m in METHODS] + ["rl numpy (cold) regret"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios: dict[str, list[float]] = {m: [] for m in [*METHODS, "cold"]}
    for r, c in zip(rows, cold, strict=True):
        cells = [r.name, str(r.n_nodes), r.reference or "sampled", str(r.measured),
                 str(r.screened),
                 f"{r.times['best'] * 1e3:.3f}", f"{100 * r.spread:.1f}%"]
        for m in METHODS:
            cells.append(f"{100 * r.regret(m):.1f}%")
            ratios[m].append(r.regret(m) + 1)
        if c is not None:
            cells.append(f"{100 * c.regret('rl'):.1f}%")
            ratios["cold"].append(c.regret("rl") + 1)
        else:
            cells.append("-")
        lines.append("| " + " | ".join(cells) + " |")
    means = ["**geomean**", "", "", "", "", "", ""] + [
        f"**{100 * (geomean(ratios[m]) - 1):.1f}%**" if ratios[m] else "-"
        for m in [*METHODS, "cold"]]
    lines.append("| " + " | ".join(means) + " |")
    lines.append("")
    lines.append(f"K = {budget} measurements for rl and sample, 1 for greedy and ilp. "
                 "best's IQR: the interquartile range of the reference program's runs over "
                 "their median, the noise against which small regrets should be read. "
                 "not timed: programs the cost model puts beyond PRUNE_FACTOR (10) times the "
                 "eager program (optimize never times them either; one run can take "
                 f"minutes). Times are re-timed ones: each method's choice and the {FINALISTS} "
                 f"fastest programs of the first pass, {CONFIRM_ROUNDS} interleaved rounds, "
                 "uncached; best is the fastest of those.")
    notes = [f"- {r.name}: {n}" for r, c in zip(rows, cold, strict=True)
             for n in _notes(r, c)]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines)


def _settings(budget: int, reference: int, cap: int | None, checkpoint: Path | None,
              ms: Options) -> dict[str, Any]:

    ckpt = Path(checkpoint) if checkpoint is not None else DEFAULT_CHECKPOINT
    digest = hashlib.sha256(ckpt.read_bytes()).hexdigest()[:16] if ckpt.exists() else ""
    # the cold start is per spec (a row without it shows "-"), so not part of the identity
    return {"budget": budget, "reference": reference, "cap": cap, "checkpoint": digest,
            "measure": settings_record(ms), "confirm": [FINALISTS, CONFIRM_ROUNDS, RETIME_SLACK],
            "overflow_check": STRESS_SCALE}


def _load_log(log: Path, settings: dict[str, Any]) -> dict[str, tuple[SpecEval, SpecEval | None]]:
    """Specs finished by an earlier run with the same settings (raises on other settings)."""
    if not log.exists():
        return {}
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    held = lines[0].get("settings", {}) if lines else {}
    if not lines or {k: held.get(k) for k in settings} != json.loads(json.dumps(settings)):
        raise ValueError(f"{log} holds an evaluation with other settings: delete it or "
                         "write elsewhere (--out)")
    done = {}
    for row in lines[1:]:
        cold = SpecEval(**row["cold"]) if row.get("cold") else None
        done[row["row"]["name"]] = (SpecEval(**row["row"]), cold)
    return done


def evaluate(specs: Sequence[Path], *, budget: int, reference: int, cap: int | None,
             checkpoint: Path | None, backend: Any = None, cold: bool = True,
             cold_reference: int = 48, cache_dir: Path | None = None,
             ms: Options | None = None, log: Path | None = None,
             progress: Callable[[str], None] = print) -> tuple[list[SpecEval],
                                                              list[SpecEval | None]]:
    """Evaluate every spec; `cap` caps every size parameter (None: the spec's sizes).
    With `log`, finished specs are appended to it and skipped when run again."""
    ms = ms or EVAL_OPTIONS
    ms = replace(ms, target=get_target(ms.target))  # resolved once for the whole evaluation
    library = load_library()
    backend = backend if backend is not None else LocalBackend(cache_dir)
    settings = _settings(budget, reference, cap, checkpoint, ms)
    done = _load_log(log, settings) if log is not None else {}
    if log is not None and not log.exists():
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(json.dumps({"settings": settings}) + "\n")
    rows: list[SpecEval] = []
    colds: list[SpecEval | None] = []
    for path in specs:
        if path.stem in done:
            row, c = done[path.stem]
            progress(f"{path.stem}: from {log}")
        else:
            params = small_params(path, cap) if cap else {}
            try:
                row, c = evaluate_spec(path, params, budget=budget, reference=reference,
                                       checkpoint=checkpoint, library=library,
                                       backend=backend, ms=ms,
                                       cold_backend=backend if cold else None,
                                       cold_reference=cold_reference)
            except Exception as e:
                progress(f"{path.stem}: skipped ({type(e).__name__}: {str(e)[:120]})")
                continue
            if log is not None:
                with open(log, "a") as f:
                    f.write(json.dumps({"row": asdict(row),
                                        "cold": asdict(c) if c else None}) + "\n")
        rows.append(row)
        colds.append(c)
        progress(f"{row.name}: best {row.times['best'] * 1e3:.3f} ms ({row.reference}), "
                 "regret " + ", ".join(f"{m} {100 * row.regret(m):.1f}%" for m in METHODS)
                 + (f", cold numpy rl {100 * c.regret('rl'):.1f}%" if c else "")
                 + f" ({row.measured} programs, {row.seconds:.0f}s"
                 + (f" + numpy {c.seconds:.0f}s)" if c else ")"))
        for note in _notes(row, c):
            progress(f"  {row.name}: {note}")
    return rows, colds
