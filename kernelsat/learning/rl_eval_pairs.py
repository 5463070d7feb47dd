"""What the joint evaluation measures: (program, knob setting) pairs, one timing each.

A `Pair` is a program of the spec's e-graph and a complete, legal knob setting of its
lowering on the target (`knob_table`'s form; `{}` where the backend reads no knobs). A
measurement is one timing of one pair at exactly that setting (a `Job.retime` job: no
knob search, the measurement cache neither read nor written), so "K measurements" means
K pairs timed. `Measurer` proves, screens and times pairs of one spec on one target,
memoized by pair: a pair two methods both chose is timed once (each method still counts
it in its K). The candidate streams of the methods (`rl_pairs`, `sampled_pairs`,
`model_pairs`, `reference_pairs`) are lazy: a method takes pairs from its stream until
K of them passed the proof and the screen (`Measurer.take`).
"""

from __future__ import annotations

import copy
import itertools
import math
import random
import statistics
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kernelsat.codegen import LoweredProgram, lower
from kernelsat.driver.jobs import STRESS_SCALE
from kernelsat.driver.pipeline import (
    CONTEST_RANGE,
    PRUNE_FACTOR,
    Gate,
    Options,
    duel,
    job_for,
    lowered_estimate,
)
from kernelsat.extract.rl import Proposal, RLExtractor, load_policy
from kernelsat.extract.rl_policy import Adam, Policy
from kernelsat.floatsafe import Judge
from kernelsat.hardware.cache import knobs_key
from kernelsat.hardware.knobs import (
    MODELLED_BACKENDS,
    KnobTable,
    Setting,
    abandon_limit,
    default_setting,
    knob_table,
    plan,
    program_vector,
    random_setting,
    space_size,
)
from kernelsat.hardware.learned import LearnedCost
from kernelsat.hardware.targets import Target
from kernelsat.ir import Term
from kernelsat.learning.rl_train import Prover

KNOBLESS_BACKENDS = frozenset({"numpy"})
"""Backends whose code reads no knob (codegen/numpy_backend.py builds one program per
lowering): their only setting is `{}`, so settings are not searched there."""

RETIME_SLACK = 4.0
"""A finalist's re-timing is stopped past RETIME_SLACK x abandon_limit(its first-pass
time) (16x that time, at least 20 ms): the eager program of attention was once stopped
at 4x its first-pass time while the host ran at half speed."""


@dataclass(frozen=True)
class Pair:
    """A program and the complete knob setting it is timed at."""

    term: Term
    setting: Setting

    @property
    def key(self) -> str:
        return f"{self.term.key}|{knobs_key(self.setting)}"


@dataclass
class Measurer:
    """Proves, screens, then times pairs of one spec on one target, memoized by pair."""

    program: Any
    prover: Prover
    backend: Any
    ms: Options  # its target a resolved `Target`
    times: dict[str, float] = field(default_factory=dict)  # first-pass medians by pair key
    spreads: dict[str, float] = field(default_factory=dict)
    pairs: dict[str, Pair] = field(default_factory=dict)
    timed: list[str] = field(default_factory=list)  # every first-pass timing, in order
    screened: set[str] = field(default_factory=set)  # term keys not timed (estimate)
    unsafe: set[str] = field(default_factory=set)  # term keys not timed (float analysis)
    unlowered: set[str] = field(default_factory=set)  # term keys that did not lower
    max_run_seconds: float = math.inf
    max_estimate: float = math.inf
    retime_failures: dict[str, str] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)  # first-pass failures by pair
    gates: dict[tuple[str, str], Gate] = field(default_factory=dict)  # (winner, eager) keys
    _tables: dict[str, KnobTable] = field(default_factory=dict, repr=False)
    _lowered: dict[str, LoweredProgram] = field(default_factory=dict, repr=False)
    _estimates: dict[str, float] = field(default_factory=dict, repr=False)
    _judge: Judge | None = field(default=None, repr=False)

    @property
    def target(self) -> Target:
        assert isinstance(self.ms.target, Target)
        return self.ms.target

    def lowered(self, term: Term) -> LoweredProgram:
        if term.key not in self._lowered:
            self._lowered[term.key] = lower(term, self.program.out_axes)
        return self._lowered[term.key]

    def table(self, term: Term) -> KnobTable:
        """The knob table of `term` on the target (`{}` on a backend that reads none)."""
        if term.key not in self._tables:
            self._tables[term.key] = ({} if self.target.backend in KNOBLESS_BACKENDS else
                                      knob_table(self.lowered(term), self.target.backend,
                                                 self.target))
        return self._tables[term.key]

    def pair(self, term: Term, setting: Setting | None = None) -> Pair | None:
        """`term` at `setting` completed to a legal setting: the table's defaults, with the
        given values the table allows (None: the defaults). None when `term` does not
        lower (it cannot be timed)."""
        try:
            table = self.table(term)
        except Exception:
            self.unlowered.add(term.key)
            return None
        full = default_setting(table)
        for kernel, knobs in (setting or {}).items():
            for knob, value in dict(knobs).items():
                if kernel in table and value in table[kernel].get(knob, ()):
                    full[kernel][knob] = value
        return Pair(term, full)

    def usable(self, p: Pair) -> bool:
        """Whether `p` may be timed: its program is proved and passes optimize's two
        screens: the cost model does not put it beyond `PRUNE_FACTOR` times the eager
        program (one run could take minutes), and the static float analysis finds no
        hazard the spec does not have (`kernelsat.floatsafe.Judge`: the run-time checks
        would reject it). None of the three costs a measurement."""
        key = p.term.key
        if key in self.screened or key in self.unlowered or key in self.unsafe:
            return False
        if p.key in self.times:
            return True
        if self.estimate(p.term) > self.max_estimate:
            self.screened.add(key)
            return False
        if key != self.program.term.key:
            if self._judge is None:
                self._judge = Judge(self.program, STRESS_SCALE)
            if not self._judge(p.term).safe:
                self.unsafe.add(key)
                return False
        return self.prover.status(0, p.term) in ("accepted", "eager")

    def estimate(self, term: Term) -> float:
        """The roofline estimate of the lowered program (memoized)."""
        if term.key not in self._estimates:
            self._estimates[term.key] = lowered_estimate(term, self.program, self.target)
        return self._estimates[term.key]

    def take(self, candidates: Iterable[Pair | None], k: int) -> list[Pair]:
        """The first `k` distinct usable pairs of `candidates`, timed (those already timed
        are not timed again)."""
        chosen: dict[str, Pair] = {}
        for p in candidates:
            if len(chosen) >= k:
                break
            if p is not None and p.key not in chosen and self.usable(p):
                chosen[p.key] = p
        self.time(list(chosen.values()))
        return list(chosen.values())

    def time(self, pairs: Sequence[Pair]) -> None:
        """One timing each of the pairs not timed yet, at exactly their settings."""
        todo = [p for p in dict((p.key, p) for p in pairs).values() if p.key not in self.times]
        if not todo:
            return
        timing = replace(self.ms.timing, max_run_seconds=self.max_run_seconds)
        jobs = [replace(job_for(self.program, p.term, self.ms), retime=knobs_key(p.setting),
                        timing=timing) for p in todo]
        for p, r in zip(todo, self.backend.run(jobs), strict=True):
            self.times[p.key] = r.median if r.ok else math.inf
            self.spreads[p.key] = (r.q3 - r.q1) / r.median if r.ok else math.nan
            self.pairs[p.key] = p
            if not r.ok:
                self.failures[p.key] = r.error or "failed"
            self.timed.append(p.key)

    def eager(self) -> Pair | None:
        """Time the eager program at its default setting (every method's fallback, as in
        optimize); later pairs are abandoned past SLOWDOWN_LIMIT x its time and not timed
        past PRUNE_FACTOR x its estimate."""
        eager = self.pair(self.program.term)
        if eager is None:
            return None
        self.time([eager])
        self.max_run_seconds = abandon_limit(self.times[eager.key])
        self.max_estimate = PRUNE_FACTOR * self.estimate(self.program.term)
        return eager

    def fastest(self, keys: Iterable[str]) -> str | None:
        ran = [k for k in keys if math.isfinite(self.times.get(k, math.inf))]
        return min(ran, key=self.times.__getitem__, default=None)

    def ship(self, keys: Iterable[str], eager: str) -> tuple[str | None, str]:
        """What optimize ships of these timed pairs and the eager one (`eager`, its
        fallback), and how it was decided: the fastest pair of another program, when it
        is faster than the fastest pair of the eager program by the first pass or within
        `CONTEST_RANGE` of it (`pipeline.contender`), is timed against that pair in the
        final gate (`gate`) and ships only when the gate passes it; else the eager
        program's pair ships. First-pass timings are single noisy medians taken minutes
        apart (an l2norm pair once read 2.6 ms there and 0.38 ms re-timed): optimize
        does not ship on them alone, and neither does a method here."""
        ran = [k for k in dict.fromkeys([*keys, eager])
               if math.isfinite(self.times.get(k, math.inf))]
        own = self.program.term.key
        mine = [k for k in ran if self.pairs[k].term.key == own]
        others = [k for k in ran if self.pairs[k].term.key != own]
        e = min(mine, key=self.times.__getitem__, default=None)
        w = min(others, key=self.times.__getitem__, default=None)
        if w is None or e is None:
            return (e if w is None else w), "no gate (one program)"
        if self.times[w] >= CONTEST_RANGE * self.times[e]:
            return e, "no gate (the other programs far slower)"
        passed = self.gate(w, e)
        return (w, "gate passed") if passed else (e, "gate vetoed")

    def gate(self, winner: str, eager: str) -> bool:
        """Whether optimize's final gate passes pair `winner` against pair `eager`
        (`pipeline.duel`: one interleaved job at the gate's timing, the paired
        verdict); memoized, so methods choosing the same pairs share one duel."""
        if (winner, eager) not in self.gates:
            w, e = self.pairs[winner], self.pairs[eager]
            self.gates[winner, eager] = duel(self.program, self.ms, (w.term, w.setting),
                                             (e.term, e.setting), self.backend, _quiet)
        return self.gates[winner, eager].passed

    def confirm(self, keys: Sequence[str], rounds: int) -> dict[str, float]:
        """Time `keys` again, afresh and interleaved: `rounds` rounds of one job per pair,
        each at its setting. Returns each pair's median over the rounds. The fastest of
        200 first-pass medians is biased low by the noise (the winner's curse); re-timed
        finalists are not selected by their own noise, and interleaving spreads a slow
        spell of the host over all."""
        keys = [k for k in dict.fromkeys(keys) if math.isfinite(self.times.get(k, math.inf))]
        samples: dict[str, list[float]] = {k: [] for k in keys}
        for _ in range(rounds):
            # each pair already ran in self.times[k]: its re-timing is stopped only far
            # beyond that (a slow spell of the host must not turn it into a failure)
            jobs = [replace(job_for(self.program, self.pairs[k].term, self.ms),
                            retime=knobs_key(self.pairs[k].setting),
                            timing=replace(self.ms.timing, max_run_seconds=RETIME_SLACK
                                           * abandon_limit(self.times[k])))
                    for k in keys]
            for k, r in zip(keys, self.backend.run(jobs), strict=True):
                if r.ok:
                    samples[k].append(r.median)
                else:
                    self.retime_failures.setdefault(k, r.error)
        return {k: statistics.median(v) for k, v in samples.items() if v}


def _quiet(stage: str, message: str) -> None:
    pass


# -- the methods' candidate streams ---------------------------------------------------


def rl_pairs(m: Measurer, proposals: Sequence[Proposal]) -> Iterator[Pair | None]:
    """The policy's proposals, each completed to a legal setting of its program on the
    measured target."""
    for prop in proposals:
        yield m.pair(prop.term, prop.setting)


def sampled_pairs(m: Measurer, terms: Sequence[Term], seed: int, rounds: int = 1
                  ) -> Iterator[Pair | None]:
    """Each program at a random legal setting of its knob table, then (`rounds` > 1)
    each usable one again at a fresh random setting, for `rounds` rounds in all."""
    live = list(terms)
    for r in range(rounds):
        for term in live:
            p = m.pair(term)
            if p is None:
                yield None
                continue
            rng = random.Random(f"{seed}|{term.key}" if r == 0 else f"{seed}|{r}|{term.key}")
            yield m.pair(term, random_setting(m.table(term), rng))
        live = [t for t in live if (p := m.pair(t)) is not None and m.usable(p)]
        if not live or all(not m.table(t) for t in live):
            return  # nothing left to vary


def ranked_settings(m: Measurer, term: Term, k: int, learned: LearnedCost | None
                    ) -> list[tuple[float, Setting]]:
    """Up to `k` settings of `term` ranked by the cost model with its predicted seconds:
    the schedule model (or the learned model re-ranking it) on a modelled backend, else
    the program's roofline estimate at its only setting."""
    p = m.pair(term)
    if p is None:
        return []
    if m.target.backend not in MODELLED_BACKENDS or not m.table(term):
        return [(m.estimate(term), p.setting)]
    found = plan(m.lowered(term), m.target, k, learned=learned)
    if found.ranked is None or found.predict is None:
        return [(m.estimate(term), p.setting)]
    return [(float(found.predict(s)), s) for s in found.ranked[:k]]


def model_pairs(m: Measurer, terms: Sequence[Term], k: int, learned: LearnedCost | None
                ) -> Iterator[Pair | None]:
    """Greedy with the cost model: the (program, setting) pairs of `terms` with the
    cost model's best `k` settings each, cheapest predicted first. Programs screened or
    unproved are skipped before the model prices their settings."""
    priced: list[tuple[float, int, Pair]] = []
    for term in dict((t.key, t) for t in terms).values():
        base = m.pair(term)
        if base is None or not m.usable(base):
            continue
        for seconds, setting in ranked_settings(m, term, k, learned):
            p = m.pair(term, setting)
            if p is not None:
                priced.append((seconds, len(priced), p))
    for _, _, p in sorted(priced, key=lambda x: (x[0], x[1])):
        yield p


def reference_pairs(m: Measurer, terms: Sequence[Term], n: int, seed: int
                    ) -> tuple[Iterator[Pair | None], bool]:
    """The reference's pairs and whether they are every pair of `terms`: all of them
    when the programs' settings number at most `n` (exhaustive), else drawn widely:
    each program at its default setting and at the schedule model's best, then rounds
    of random settings over all of them."""
    sizes = []
    for t in terms:
        try:
            sizes.append(space_size(m.table(t)))
        except Exception:
            m.unlowered.add(t.key)
            sizes.append(0)
    if sum(sizes) <= n:
        return _every_pair(m, terms), True
    return _rounds(m, terms, seed), False


def _every_pair(m: Measurer, terms: Sequence[Term]) -> Iterator[Pair | None]:
    for t in terms:
        if t.key in m.unlowered:
            continue
        table = m.table(t)
        coords = [(k, n) for k, knobs in table.items() for n in knobs]
        for values in itertools.product(*(table[k][n] for k, n in coords)):
            setting: Setting = {k: {} for k in table}
            for (k, n), v in zip(coords, values, strict=True):
                setting[k][n] = v
            yield Pair(t, setting)


def _rounds(m: Measurer, terms: Sequence[Term], seed: int) -> Iterator[Pair | None]:
    live = [t for t in terms if t.key not in m.unlowered]
    for t in live:  # each program at its default and at the model's best setting
        yield m.pair(t)
        ranked = ranked_settings(m, t, 1, None)
        yield m.pair(t, ranked[0][1]) if ranked else None
    rng = random.Random(seed)
    for _ in range(64):  # rounds of random settings (the caller stops at its count)
        for t in live:
            if m.table(t):
                yield m.pair(t, random_setting(m.table(t), rng))


# -- online adaptation ----------------------------------------------------------------

ADAPT_STEPS = 4
"""Policy-gradient steps of the cold start's adaptation (on a copy of the policy)."""

ADAPT_LR = 0.01
"""Adam's learning rate in the adaptation (the training default)."""


def adapted_policy(m: Measurer, checkpoint: Any, measured: Sequence[Pair],
                   proposals: Sequence[Proposal], eager: Pair) -> tuple[Policy | None, int]:
    """A copy of the policy after `ADAPT_STEPS` REINFORCE steps on this spec's measured
    rewards (the checkpoint is not touched), and how many episodes the steps used.

    The episodes are the policy's own rollouts that produced the measured pairs (each
    proposal carries its decisions); each carries the training reward, log(t_eager / t)
    clipped to +-1. None when fewer than two measured pairs have an episode."""
    t_eager = m.times.get(eager.key, math.inf)
    if not math.isfinite(t_eager):
        return None, 0
    rewards = {p.key: max(-1.0, min(1.0, math.log(t_eager / m.times[p.key])))
               for p in measured if math.isfinite(m.times.get(p.key, math.inf))
               and m.times[p.key] > 0}
    recorded: dict[str, Sequence[Any]] = {}
    for prop in proposals:
        p = m.pair(prop.term, prop.setting)
        if p is not None and p.key in rewards and prop.decisions:
            recorded.setdefault(p.key, prop.decisions)
    if len(recorded) < 2:
        return None, len(recorded)
    policy = copy.deepcopy(load_policy(checkpoint))
    batch = [(list(d), rewards[k]) for k, d in recorded.items()]
    adam = Adam(lr=ADAPT_LR)
    for _ in range(ADAPT_STEPS):
        adam.step(policy.params, policy.gradients(batch, 0.01, 0.5))
    return policy, len(batch)


def adapted_order(m: Measurer, measured: Sequence[Pair], pool: Sequence[Pair],
                  learned: LearnedCost | None) -> tuple[list[Pair], str]:
    """`pool` ordered by a cost model updated from `measured` (pairs timed on this
    target), and how. On a modelled backend: the learned model (a copy: the file is not
    written), or the analytic prior it starts from, updated with the measured pairs as
    one group, then ranking every pair of the pool. Elsewhere (no model of the code's
    schedule): the pool as given, the (adapted) policy's order."""
    timed = [(p, m.times[p.key]) for p in measured
             if math.isfinite(m.times.get(p.key, math.inf)) and m.times[p.key] > 0]
    if m.target.backend not in MODELLED_BACKENDS:
        return list(pool), "policy order"
    if len(timed) < 2:
        return list(pool), "policy order (fewer than 2 timed pairs)"
    model = LearnedCost.from_json(learned.as_json()) if learned else LearnedCost()
    rows = [_features(m, p) for p, _ in timed]
    keep = [i for i, r in enumerate(rows) if r is not None]
    if len(keep) < 2:
        return list(pool), "policy order (no features)"
    x = np.array([rows[i] for i in keep])
    y = np.log([timed[i][1] for i in keep])
    model.update([(x, y)], m.target.fingerprint)
    scored = [(float(model.score(f)) if (f := _features(m, p)) is not None else math.inf, i, p)
              for i, p in enumerate(pool)]
    return ([p for _, _, p in sorted(scored, key=lambda s: (s[0], s[1]))],
            f"learned model updated with {len(keep)} pairs")


def _features(m: Measurer, p: Pair) -> np.ndarray | None:
    """The learned model's feature row of a pair (None when its features fail)."""
    if m.target.backend not in MODELLED_BACKENDS:
        return None
    try:
        return program_vector(m.lowered(p.term), (), m.target, p.setting)
    except Exception:
        return None


def adaptation_pool(m: Measurer, proposals: Sequence[Any], k: int) -> list[Pair]:
    """What adaptation chooses from: the policy's proposals and, for each of their
    programs, the schedule model's best `k` settings."""
    pool = [p for p in rl_pairs(m, proposals) if p is not None]
    for term in dict((p.term.key, p.term) for p in pool).values():
        for _, setting in ranked_settings(m, term, k, None):
            p = m.pair(term, setting)
            if p is not None:
                pool.append(p)
    return list(dict((p.key, p) for p in pool).values())


def proposals_of(extractor: RLExtractor, snap: Any, cost: Any, program: Any, k: int,
                 m: Measurer | None = None, exclude: Iterable[str] = ()) -> list[Proposal]:
    """The policy's first `k` proposals (`RLExtractor.propose`); with `m`, its first `k`
    that `m` may time (`Measurer.usable`: proved, not screened, float-safe), distinct as
    pairs (`Measurer.pair` completes their settings) and not in `exclude` (pair keys):
    the draw goes on past the others, so that `k` proposals are `k` measurements."""
    if m is None:
        return list(extractor.propose(snap, snap.root, cost, program, k))
    taken = set(exclude)

    def timeable(prop: Proposal) -> bool:
        p = m.pair(prop.term, prop.setting)
        if p is None or p.key in taken or not m.usable(p):
            return False
        taken.add(p.key)
        return True

    return list(extractor.propose(snap, snap.root, cost, program, k, timeable))
