"""Evaluating the search by measurement: the regret table of `kernelsat evaluate`.

One measurement is one (program, knob setting) pair timed at exactly that setting
(`kernelsat.learning.rl_eval_pairs`: a `Job.retime` timing, no knob search). For each
held-out spec: saturate, time the eager program at its default setting (every method's
fallback, as in optimize, and the base of the two guards below; it is not counted in a
method's K), then each method takes the first K pairs of its stream that are proved and
pass optimize's screens (the estimate guard below, and the static float analysis,
`kernelsat.floatsafe`): none of the three costs a measurement, and a method draws past
the pairs they remove, so that every method spends its K where the spec has K such pairs:

- `rl`: the policy's proposals (`RLExtractor.propose`: the greedy joint rollout over
  program and schedule, then samples), drawn until K distinct pairs pass the three
  (`RL_ATTEMPTS` x K rollouts at most);
- `sample`: the Boltzmann sampler's `STREAM` x K programs, each at a random legal
  setting, then again at fresh random settings (`STREAM` rounds at most);
- `greedy`: greedy with the cost model: of the greedy program, the sampler's programs
  and the eager one, the K (program, setting) pairs the cost model puts fastest (the
  schedule model's ranked settings, re-ranked by the learned model when its file is in
  the cache folder; the roofline estimate where the backend is not modelled);
- `eager`: the eager program at the cost model's K best settings (a schedule search
  alone, as optimize's knob search on the eager program).

A method ships what optimize would ship of its pairs and the eager one
(`Measurer.ship`): the fastest by its first-pass times, except that the fastest pair of
another program, when it is faster than the eager program's best pair or within
`CONTEST_RANGE` of it, must pass optimize's final gate against that pair (`pipeline.duel`:
the two timed interleaved, the paired verdict) to ship; else the eager program's pair
ships. The gate's timing is not counted in a method's K (optimize's budget does not
count it either); the table reports the regret before the gate too.

The reference: every pair of every program when the programs' knob spaces hold at most
`reference` pairs in all (*exhaustive*), else `reference` pairs drawn widely: the
programs (all of them when the e-graph has at most `reference`, else the sampler's at
temperature 4 and the policy's at temperature 2, alternately) each at its default
setting and at the schedule model's best, then rounds of random settings; everything the
methods measured is in it too. Then the finalists, each method's choice and the
`FINALISTS` fastest pairs of all, are timed again, afresh and interleaved
(`CONFIRM_ROUNDS` rounds, `Measurer.confirm`), and those times are the table's: the
fastest of 200 noisy first-pass medians is biased low by the noise (the winner's curse),
re-timed finalists are not. Regret is `t_method / t_best - 1`; the table ends with
geometric means of `t_method / t_best` (reported minus one) and, per method, the count
of specs where it shipped the eager program although the reference holds a faster proved
program (by more than the noise, `missed_faster`). As in optimize, a program the cost
model puts beyond `PRUNE_FACTOR` times the eager program is not timed (a recomputing
program can take minutes per run; it costs no measurement from a method's budget and is
counted in the table), and a pair whose run takes over `SLOWDOWN_LIMIT` times the eager
spec's time is abandoned after that run.

Cold start: the same policy (checkpoint untouched) and cost model on targets absent
from training (`COLD_TARGETS`: numpy, and C compiled for x86-64-v2), each against its
own reference on that target (`cold_reference` pairs): `rl` and `greedy` at K, then
online adaptation, reported separately as `adapted`: from the policy's K cold
measurements, a few policy-gradient steps on a copy of the policy
(`rl_eval_pairs.adapted_policy`) and, on C, a copy of the cost model updated with them
(`adapted_order`), which orders the adapted policy's proposals and the model's settings
of their programs; `adapt` more pairs are timed; `adapted` ships the fastest of the
K + `adapt` pairs.

Finished specs are appended to a JSON-lines log as they finish, so an interrupted
evaluation resumes where it stopped (with the same settings).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from kernelsat.driver.jobs import STRESS_SCALE, LocalBackend
from kernelsat.driver.pipeline import CONTEST_RANGE, Options
from kernelsat.egraph.saturate import saturate
from kernelsat.extract import GreedyDag, Sampler, roofline_rescore
from kernelsat.extract.rl import DEFAULT_CHECKPOINT, MAX_WIDEN, RLExtractor
from kernelsat.extract.rl_env import ExtractionEnv, enumerate_programs
from kernelsat.hardware.cache import knobs_key
from kernelsat.hardware.learned import LearnedCost, load_if_present, model_path
from kernelsat.hardware.measure import TIMING
from kernelsat.hardware.targets import Target, get_target
from kernelsat.ir import Term, to_sexpr
from kernelsat.learning.rl_eval_pairs import (
    ADAPT_STEPS,
    RETIME_SLACK,
    Measurer,
    Pair,
    adaptation_pool,
    adapted_order,
    adapted_policy,
    model_pairs,
    proposals_of,
    reference_pairs,
    rl_pairs,
    sampled_pairs,
)
from kernelsat.learning.rl_train import TRAIN_OPTIONS, Prover, settings_record
from kernelsat.proofs.library import load_library
from kernelsat.spec import load_spec

METHODS = ("rl", "sample", "greedy", "eager")
"""The methods on the training target, each with K measurements."""

COLD_TARGETS = ("numpy", "c-x86-64-v2")
"""Targets absent from training: the cold start runs the policy and cost model there."""

COLD_METHODS = ("rl", "greedy")
"""The methods measured on a cold target (then `adapted`)."""

COLD_COLUMNS = (*COLD_METHODS, "adapted")
"""A cold target's methods as its table shows them."""

ADAPT = 4
"""Measurements after the online update, on a cold target."""

FINALISTS = 5
"""The fastest first-pass pairs re-timed with the methods' choices."""

CONFIRM_ROUNDS = 3
"""Interleaved re-timing rounds of the finalists (`Measurer.confirm`)."""

STREAM = 8
"""The sampler's programs drawn per spec: STREAM x K, of which it times its first K pairs
that are proved and pass the screens (the float screen alone can remove most of a
softmax's programs), going round them at fresh random settings up to STREAM times."""

RL_ATTEMPTS = 10 * STREAM
"""The policy's rollouts per spec, at most RL_ATTEMPTS x K, until K of its distinct pairs
are proved and pass the screens (on logsumexp the screens once removed all but one of
its first 64 distinct pairs)."""

MISS_MARGIN = 0.01
"""A faster program counts as missed (`SpecEval.missed_faster`) when the method's time
is more than this, or the best pair's spread if larger, above the best's."""

BEST_CHARS = 160
"""How much of the reference's best program the table's notes quote."""

EVAL_OPTIONS = replace(TRAIN_OPTIONS, nodes=3000, sat_seconds=6.0, timing=TIMING["evaluate"])
"""How the evaluation saturates and times (larger e-graphs, more runs per program than
training)."""


def small_params(path: Path, cap: int) -> dict[str, int]:
    """Every size parameter of the spec at `path`, capped at `cap`."""
    return {k: min(int(v), cap) for k, v in load_spec(path).params.items()}


@dataclass
class SpecEval:
    """One spec's re-timed seconds per method on one target (inf: nothing shipped)."""

    name: str
    target: str = ""
    n_nodes: int = 0
    times: dict[str, float] = field(default_factory=dict)
    measured: int = 0  # pairs timed in the first pass (methods and reference)
    notes: list[str] = field(default_factory=list)
    reference: str = ""  # "exhaustive (N pairs)" or "sampled (N pairs)"
    seconds: float = 0.0
    spread: float = math.nan  # (q3 - q1) / median of the best pair's runs: the noise
    screened: int = 0  # programs not timed: estimated > PRUNE_FACTOR x eager
    unsafe: int = 0  # programs not timed: the static float analysis flags them
    first_pass: dict[str, float] = field(default_factory=dict)  # before the re-timing
    spent: dict[str, int] = field(default_factory=dict)  # pairs each method timed
    shipped_eager: dict[str, bool] = field(default_factory=dict)  # its choice: eager program
    best_eager: bool = True  # the reference's fastest pair is the eager program
    adaptation: str = ""  # how the cold start's online update ordered its pool
    failed: dict[str, int] = field(default_factory=dict)  # first-pass failures by reason
    # re-timed seconds of each method's first-pass pick, before the final gate
    ungated: dict[str, float] = field(default_factory=dict)
    gates: dict[str, str] = field(default_factory=dict)  # how each method's ship was decided
    best_pair: str = ""  # the reference's fastest pair: its program (abridged) and setting

    def ungated_regret(self, method: str) -> float:
        return self.ungated.get(method, math.inf) / self.times["best"] - 1.0

    def regret(self, method: str, ref: str = "best") -> float:
        return self.times.get(method, math.inf) / self.times[ref] - 1.0

    def missed_faster(self, method: str) -> bool:
        """The method shipped the eager program although the reference holds a faster
        proved program (by more than the noise)."""
        margin = max(MISS_MARGIN, self.spread if math.isfinite(self.spread) else 0.0)
        return (self.shipped_eager.get(method, False) and not self.best_eager
                and self.regret(method) > margin)


@dataclass
class _Spec:
    """What every target's evaluation of one spec shares."""

    program: Any
    snap: Any
    prover: Prover
    everything: list[Term]
    complete: bool
    checkpoint: Path | None
    backend: Any
    learned: LearnedCost | None
    seed: int


def _terms(extractions: Sequence[Any]) -> list[Term]:
    return [e.term for e in extractions]


def _guarded(row: SpecEval, name: str, make: Callable[[], Any], default: Any) -> Any:
    try:
        return make()
    except Exception as e:  # an extractor failing is a result, not a crash
        row.notes.append(f"{name}: {type(e).__name__}: {str(e)[:80]}")
        return default


def _reference_terms(s: _Spec, target: Target, n: int, cost: Any) -> list[Term]:
    if s.complete:
        return s.everything
    wide = Sampler(n=n, temperature=4.0, seed=s.seed + 1).extract(s.snap, s.snap.root, cost)
    policy = RLExtractor(s.checkpoint, target=target, n=n, seed=s.seed + 1, temperature=2.0)
    drawn = [_terms(wide), _terms(policy.extract(s.snap, s.snap.root, cost))]
    # alternately: a reference that stops early still has programs of both
    return [t for pair in itertools.zip_longest(*drawn) for t in pair if t is not None]


def _run_target(s: _Spec, ms: Options, methods: Sequence[str], budget: int,
                n_reference: int, adapt: int, row: SpecEval) -> SpecEval:
    """Measure `methods` (and, with `adapt`, the adaptation) and the reference on
    `ms.target`; fill in and return `row`."""
    target = ms.target
    assert isinstance(target, Target)
    m = Measurer(s.program, s.prover, s.backend, ms)
    eager = m.eager()
    if eager is None:
        raise ValueError("the eager program does not lower")
    cost = roofline_rescore(target)
    snap, program = s.snap, s.program
    rl = RLExtractor(s.checkpoint, target=target, seed=s.seed,
                     max_attempts=RL_ATTEMPTS * budget)
    proposals = _guarded(row, "rl", lambda: proposals_of(rl, snap, cost, program, budget, m),
                         [])
    sampled = _guarded(row, "sample", lambda: _terms(
        Sampler(n=STREAM * budget, seed=s.seed).extract(snap, snap.root, cost)), [])
    greedy = _guarded(row, "greedy", lambda: _terms(
        GreedyDag().extract(snap, snap.root, cost)), [])
    streams: dict[str, Callable[[], Iterator[Pair | None]]] = {
        "rl": lambda: rl_pairs(m, proposals),
        "sample": lambda: sampled_pairs(m, sampled, s.seed, STREAM),
        "greedy": lambda: model_pairs(m, [*greedy, *sampled, program.term], budget, s.learned),
        "eager": lambda: model_pairs(m, [program.term], budget, s.learned),
    }
    taken: dict[str, list[str]] = {}
    for name in methods:
        got = _guarded(row, name, partial(m.take, streams[name](), budget), [])
        taken[name] = [p.key for p in got]
    if adapt and "rl" in methods:
        measured = [m.pairs[k] for k in taken["rl"]]
        policy, used = _guarded(row, "adapted", lambda: adapted_policy(
            m, s.checkpoint, measured, proposals, eager), (None, 0))
        again = (replace(rl, policy=policy, seed=s.seed + 2) if policy is not None else rl)
        fresh = _guarded(row, "adapted", lambda: proposals_of(
            again, snap, cost, program, budget, m, exclude=taken["rl"]), [])
        pool = _guarded(row, "adapted", lambda: adaptation_pool(m, [*fresh, *proposals], 2),
                        [])
        order, how = adapted_order(m, measured, pool, s.learned)
        row.adaptation = (f"policy: {ADAPT_STEPS} steps on {used} measured episodes; "
                          if policy is not None else "policy unchanged; ") + how
        more = _guarded(row, "adapted", lambda: m.take(
            (p for p in order if p.key not in taken["rl"]), adapt), [])
        taken["adapted"] = [*taken["rl"], *(p.key for p in more)]
    terms = [program.term, *_reference_terms(s, target, n_reference, cost)]  # eager's too
    stream, exhaustive = reference_pairs(m, list({t.key: t for t in terms}.values()),
                                         n_reference, s.seed + 1)
    ref = m.take(stream, n_reference)
    row.reference = f"{'exhaustive' if exhaustive else 'sampled'} ({len(ref)} pairs)"
    row.spent = {name: len(keys) for name, keys in taken.items()}
    ungated = {name: m.fastest([*keys, eager.key]) for name, keys in taken.items()}
    ungated["eager"] = m.fastest([*taken.get("eager", []), eager.key])
    choice: dict[str, str | None] = {}
    for name, keys in taken.items():  # as optimize ships: through the final gate
        choice[name], row.gates[name] = m.ship(keys, eager.key)
    choice.setdefault("eager", ungated["eager"])  # the eager program only: no gate
    ranked = sorted((k for k in m.times if math.isfinite(m.times[k])), key=m.times.__getitem__)
    first = {name: m.times.get(k, math.inf) if k else math.inf for name, k in choice.items()}
    first["best"] = min(m.times.values())
    picked = [k for k in [*choice.values(), *ungated.values()] if k]
    confirmed = m.confirm([*ranked[:FINALISTS], *picked], CONFIRM_ROUNDS)
    times = {name: confirmed.get(k, math.inf) if k else math.inf for name, k in choice.items()}
    row.ungated = {name: confirmed.get(k, math.inf) if k else math.inf
                   for name, k in ungated.items()}
    for name, k in choice.items():
        if k not in confirmed:
            why = m.retime_failures.get(k, "its first pass failed") if k else "nothing ran"
            row.notes.append(f"{name}: re-timing failed: {why[:160]}")
    times["best"] = min(confirmed.values(), default=math.inf)
    best_key = min(confirmed, key=confirmed.__getitem__, default=None)
    eager_term = program.term.key
    row.times, row.first_pass, row.measured = times, first, len(m.timed)
    row.shipped_eager = {name: k is not None and m.pairs[k].term.key == eager_term
                         for name, k in choice.items()}
    row.best_eager = best_key is None or m.pairs[best_key].term.key == eager_term
    row.spread = m.spreads.get(best_key, math.nan) if best_key else math.nan
    row.best_pair = _described(m.pairs[best_key], row.best_eager) if best_key else ""
    row.screened = len(m.screened)
    row.unsafe = len(m.unsafe)
    row.failed = dict(Counter(_reason(e) for e in m.failures.values()).most_common())
    return row


def _described(pair: Pair, eager: bool) -> str:
    """A pair in one line: which program (the eager one, or its s-expression abridged)
    and its knob setting."""
    text = to_sexpr(pair.term)
    program = ("the eager program" if eager
               else text if len(text) <= BEST_CHARS else text[:BEST_CHARS] + " ...")
    return f"{program} at {knobs_key(pair.setting)}"


def _reason(error: str) -> str:
    """A failure's kind: its message up to the first colon (no figures)."""
    return error.split(":")[0].strip()[:60] or "failed"


def evaluate_spec(path: Path, params: dict[str, int], *, budget: int, reference: int,
                  checkpoint: Path | None, library: Any, backend: Any, ms: Options,
                  cold_targets: Sequence[Target] = (), cold_reference: int = 48,
                  adapt: int = ADAPT, learned: LearnedCost | None = None,
                  seed: int = 0) -> tuple[SpecEval, dict[str, SpecEval]]:
    """The measured times of every method on one spec, and each cold target's."""
    started = time.monotonic()
    program = load_spec(path, params)
    sat = saturate(program.term, library.rules, iters=ms.iters, nodes=ms.nodes,
                   seconds=ms.sat_seconds, factors=ms.factors)
    snap = sat.snapshot
    everything, complete = enumerate_programs(ExtractionEnv(snap), reference + 1)
    s = _Spec(program, snap, Prover([program], [snap], library), everything, complete,
              checkpoint, backend, learned, seed)
    target = ms.target if isinstance(ms.target, Target) else get_target(ms.target)
    out = _run_target(s, ms, METHODS, budget, reference, 0,
                      SpecEval(path.stem, target.name, snap.n_nodes))
    out.seconds = round(time.monotonic() - started, 1)
    colds: dict[str, SpecEval] = {}
    for cold in cold_targets:
        started = time.monotonic()
        c = _run_target(s, replace(ms, target=cold), COLD_METHODS, budget, cold_reference,
                        adapt, SpecEval(path.stem, cold.name, snap.n_nodes))
        c.seconds = round(time.monotonic() - started, 1)
        colds[cold.name] = c
    return out, colds


# -- the table ---------------------------------------------------------------------


def geomean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in finite) / len(finite)) if finite else math.nan


def _regrets(rows: Sequence[SpecEval], methods: Sequence[str], head: list[str],
             cells: Callable[[SpecEval], list[str]]) -> list[str]:
    """A Markdown table: one row per spec (`cells`, then each method's regret), then the
    geometric means and the count of specs where a method shipped the eager program
    although a faster proved one exists."""
    cols = head + [f"{m} regret" for m in methods]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(cells(r) + [f"{100 * r.regret(m):.1f}%"
                                                   for m in methods]) + " |")
    blank = [""] * (len(head) - 1)
    means = [f"**{100 * (geomean([r.regret(m) + 1 for r in rows]) - 1):.1f}%**"
             for m in methods]
    missed = [str(sum(r.missed_faster(m) for r in rows)) for m in methods]
    lines.append("| " + " | ".join(["**geomean**", *blank, *means]) + " |")
    if any(r.ungated for r in rows):
        before = [f"{100 * (geomean([r.ungated_regret(m) + 1 for r in rows]) - 1):.1f}%"
                  if all(m in r.ungated for r in rows) else "" for m in methods]
        vetoed = [str(sum(r.gates.get(m) == "gate vetoed" for r in rows)) for m in methods]
        lines.append("| " + " | ".join(["geomean before the gate", *blank, *before]) + " |")
        lines.append("| " + " | ".join(["gate vetoed the pick", *blank, *vetoed]) + " |")
    lines.append("| " + " | ".join(["eager shipped, faster exists", *blank, *missed]) + " |")
    return lines


def table(rows: Sequence[SpecEval], colds: Sequence[dict[str, SpecEval]], budget: int,
          adapt: int = ADAPT) -> str:
    """The Markdown regret tables (percent): the training target, then the cold start."""
    head = ["spec", "e-nodes", "reference", "measured", "not timed", "float-unsafe", "best ms",
            "best's IQR"]

    def cells(r: SpecEval) -> list[str]:
        return [r.name, str(r.n_nodes), r.reference, str(r.measured), str(r.screened),
                str(r.unsafe), f"{r.times['best'] * 1e3:.3f}", f"{100 * r.spread:.1f}%"]

    lines = _regrets(rows, METHODS, head, cells)
    lines += ["", f"K = {budget} measurements per method, each one (program, knob setting) "
              "pair timed at that setting; the eager program at its default setting is "
              "every method's fallback, timed once. best's IQR: the interquartile range of "
              "the reference pair's runs over their median, the noise against which small "
              "regrets should be read. not timed: programs the cost model puts beyond "
              "PRUNE_FACTOR (10) times the eager program; float-unsafe: programs the static "
              "float analysis flags (as optimize, neither is timed nor costs a "
              "measurement). Times are re-timed ones: each "
              f"method's choice and the {FINALISTS} fastest pairs of the first pass, "
              f"{CONFIRM_ROUNDS} interleaved rounds, uncached; best is the fastest of those. "
              "Each method ships as optimize does: its fastest pair of another program, "
              f"when it beat the eager program's best pair in the first pass or came within "
              f"{CONTEST_RANGE}x of it, ships only if it passes optimize's final gate "
              "against that pair (the two timed interleaved, the paired verdict; not "
              "counted in K); before the gate: the regret of the first-pass pick. "
              "eager shipped, faster exists: specs where the method shipped the eager "
              f"program while the reference's best is another program faster by more than "
              f"the noise (at least {100 * MISS_MARGIN:.0f}%)."]
    targets = list(dict.fromkeys(name for c in colds for name in c))
    for name in targets:
        cold_rows = [c[name] for c in colds if name in c]
        lines += ["", f"Cold start on {name} (not in training; its own reference):", ""]
        lines += _regrets(cold_rows, COLD_COLUMNS,
                          [*head[:3], "best ms", "best's IQR", "adaptation"],
                          lambda r: [r.name, str(r.n_nodes), r.reference,
                                     f"{r.times['best'] * 1e3:.3f}", f"{100 * r.spread:.1f}%",
                                     r.adaptation])
    if targets:
        lines += ["", f"Cold: rl and greedy at K = {budget}; adapted: rl's K, then "
                  f"{ADAPT_STEPS} policy-gradient steps on a copy of the policy from their "
                  "rewards and, on C, the cost model updated with them, which orders the "
                  f"adapted policy's proposals; {adapt} more pairs timed (neither the "
                  "checkpoint nor the model file is written)."]
    every = [(r, "", METHODS) for r in rows] + [
        (c, f" ({c.target}, cold)", COLD_COLUMNS) for cs in colds for c in cs.values()]
    notes = [f"- {r.name}{where}: {n}" for r, where, _ in every for n in r.notes]
    missed = [(r, where, [m for m in methods if r.missed_faster(m)])
              for r, where, methods in every if r.best_pair]
    notes += [f"- {r.name}{where}: a faster program than eager's was missed by "
              + ", ".join(names) + f"; the reference's best pair: {r.best_pair}"
              for r, where, names in missed if names]
    notes += [f"- {r.name}{where}: {sum(r.failed.values())} of {r.measured} pairs failed "
              "their first timing (" + ", ".join(f"{k}: {v}" for k, v in r.failed.items())
              + ")" for r, where, _ in every if r.failed]
    if notes:
        lines += ["", "Notes:", *notes]
    return "\n".join(lines)


# -- the log and the loop ----------------------------------------------------------


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16] if path.exists() else ""


def _settings(budget: int, reference: int, cap: int | None, checkpoint: Path | None,
              ms: Options, main: Target, cold_targets: Sequence[Target],
              cold_reference: int, adapt: int, cache_dir: Path | None) -> dict[str, Any]:
    ckpt = Path(checkpoint) if checkpoint is not None else DEFAULT_CHECKPOINT
    learned = _digest(model_path(cache_dir)) if cache_dir is not None else ""
    return {"budget": budget, "reference": reference, "cap": cap, "checkpoint": _digest(ckpt),
            "learned": learned, "methods": list(METHODS),
            "measure": settings_record(ms), "confirm": [FINALISTS, CONFIRM_ROUNDS, RETIME_SLACK],
            "overflow_check": STRESS_SCALE, "float_screen": True,
            # the rl stream widens while it repeats, and draws until K usable pairs
            "propose": {"max_widen": MAX_WIDEN, "draw": "usable", "attempts": RL_ATTEMPTS,
                        "sample_rounds": STREAM},
            "gate": {"timing": asdict(ms.gate_timing), "contest_range": CONTEST_RANGE},
            "cold": {"targets": [t.name for t in cold_targets], "reference": cold_reference,
                     "adapt": adapt, "methods": list(COLD_METHODS)},
            # times from two machines are not one table: a log resumes on its own only
            "machine": {"fingerprint": main.fingerprint, "model": main.model}}


def _load_log(log: Path, settings: dict[str, Any]
              ) -> dict[str, tuple[SpecEval, dict[str, SpecEval]]]:
    """Specs finished by an earlier run with the same settings (raises on other settings)."""
    if not log.exists():
        return {}
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    held = lines[0].get("settings", {}) if lines else {}
    if lines and held.get("machine") != settings["machine"]:
        was = (held.get("machine") or {}).get("model", "an unrecorded machine")
        raise ValueError(f"{log} was measured on {was}, not on this machine "
                         f"({settings['machine']['model']}): its times cannot be resumed "
                         "into one table with this machine's; write elsewhere (--out)")
    if not lines or {k: held.get(k) for k in settings} != json.loads(json.dumps(settings)):
        raise ValueError(f"{log} holds an evaluation with other settings: delete it or "
                         "write elsewhere (--out)")
    done = {}
    for line in lines[1:]:
        colds = {name: SpecEval(**c) for name, c in (line.get("cold") or {}).items()}
        done[line["row"]["name"]] = (SpecEval(**line["row"]), colds)
    return done


def _cold_targets(names: Sequence[str], main: Target,
                  progress: Callable[[str], None]) -> list[Target]:
    """The cold targets this machine can run, less the training target itself."""
    out = []
    for name in dict.fromkeys(names):
        try:
            t = get_target(name)
        except KeyError as e:
            progress(f"cold start on {name} skipped: {e.args[0] if e.args else e}")
            continue
        if t.fingerprint != main.fingerprint:
            out.append(t)
    return out


def _summary(row: SpecEval, colds: dict[str, SpecEval]) -> str:
    text = (f"{row.name}: best {row.times['best'] * 1e3:.3f} ms ({row.reference}), regret "
            + ", ".join(f"{m} {100 * row.regret(m):.1f}%" for m in METHODS)
            + f" ({row.measured} pairs, {row.seconds:.0f}s)")
    for name, c in colds.items():
        text += (f"; {name} cold: " + ", ".join(f"{m} {100 * c.regret(m):.1f}%"
                                               for m in COLD_COLUMNS)
                 + f" ({c.measured} pairs, {c.seconds:.0f}s)")
    return text


def evaluate(specs: Sequence[Path], *, budget: int, reference: int, cap: int | None,
             checkpoint: Path | None, backend: Any = None,
             cold_targets: Sequence[str] = COLD_TARGETS, cold_reference: int = 48,
             adapt: int = ADAPT, cache_dir: Path | None = None, ms: Options | None = None,
             log: Path | None = None, progress: Callable[[str], None] = print
             ) -> tuple[list[SpecEval], list[dict[str, SpecEval]]]:
    """Evaluate every spec; `cap` caps every size parameter (None: the spec's sizes).
    With `log`, finished specs are appended to it and skipped when run again. The cost
    model is the learned one in `cache_dir` when its file is there (read once, never
    written), else the schedule model."""
    ms = ms or EVAL_OPTIONS
    main = get_target(ms.target)
    ms = replace(ms, target=main)  # resolved once for the whole evaluation
    colds_at = _cold_targets(cold_targets, main, progress)
    library = load_library()
    backend = backend if backend is not None else LocalBackend(cache_dir)
    learned = load_if_present(cache_dir) if cache_dir is not None else None
    settings = _settings(budget, reference, cap, checkpoint, ms, main, colds_at, cold_reference,
                         adapt, cache_dir)
    done = _load_log(log, settings) if log is not None else {}
    if log is not None and not log.exists():
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(json.dumps({"settings": settings}) + "\n")
    rows: list[SpecEval] = []
    colds: list[dict[str, SpecEval]] = []
    for path in specs:
        if path.stem in done:
            row, cold = done[path.stem]
            progress(f"{path.stem}: from {log}")
        else:
            params = small_params(path, cap) if cap else {}
            try:
                row, cold = evaluate_spec(path, params, budget=budget, reference=reference,
                                          checkpoint=checkpoint, library=library,
                                          backend=backend, ms=ms, cold_targets=colds_at,
                                          cold_reference=cold_reference, adapt=adapt,
                                          learned=learned)
            except Exception as e:
                progress(f"{path.stem}: skipped ({type(e).__name__}: {str(e)[:120]})")
                continue
            if log is not None:
                with open(log, "a") as f:
                    f.write(json.dumps({"row": asdict(row), "cold": {
                        name: asdict(c) for name, c in cold.items()}}) + "\n")
        rows.append(row)
        colds.append(cold)
        progress(_summary(row, cold))
        for note in [*row.notes, *(f"{c.target} (cold): {n}" for c in cold.values()
                                   for n in c.notes)]:
            progress(f"  {row.name}: {note}")
    return rows, colds
