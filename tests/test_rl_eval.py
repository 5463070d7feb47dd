"""`kernelsat evaluate`'s machinery with fake timings (no clock): a measurement is one
(program, knob setting) pair timed at that setting; every method spends exactly K of
them, a pair is timed once however many methods chose it, the reference holds
everything measured, the cold start runs on both unseen targets with its adaptation,
finished specs are logged and a rerun resumes without measuring again."""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.learning.rl_eval import (
    ADAPT,
    COLD_METHODS,
    CONFIRM_ROUNDS,
    FINALISTS,
    METHODS,
    MISS_MARGIN,
    SpecEval,
    evaluate,
    geomean,
    table,
)
from kernelsat.learning.rl_eval_pairs import RETIME_SLACK
from kernelsat.learning.rl_train import TRAIN_OPTIONS

SPEC = "kernel k(N=8)\nin x[n:N] f32\nout y[n] = exp(x[n]) * 2\n"
BIG = "kernel s(M=4, N=8)\nin x[m:M, n:N] f32\nout y[m, n] = softmax(n: x[m, n])\n"
SAFE = ("kernel r(M=4, N=8)\nin x[m:M, n:N] f32\n"
        "out y[m, n] = x[m, n] * 2 + sum(k: x[m, k] * x[m, k]) / 8\n")

FAST = replace(TRAIN_OPTIONS, iters=3, nodes=400, sat_seconds=120.0)
K = 3


@dataclass
class PairBackend:
    """Fake timings: a program's distinct node count times a factor in [1, 1.6) drawn
    from the hash of its knob setting (settings matter, deterministically). Records
    every job as (target, program, setting)."""

    calls: list[tuple[str, str, str]] = field(default_factory=list)
    name: str = "fake"

    def seconds(self, job) -> float:
        from kernelsat.hardware.cache import knobs_key
        from kernelsat.ir import postorder
        from kernelsat.sexpr import parse_term

        size = len(list(postorder(parse_term(job.program))))
        setting = knobs_key(json.loads(job.retime))  # the gate writes it with spaces
        salt = int(hashlib.sha256(setting.encode()).hexdigest(), 16) % 7
        return float(size) * (1 + salt / 10)

    duels: list[tuple[str, str]] = field(default_factory=list)  # (winner, eager) programs

    def run(self, jobs, progress=None):
        from kernelsat.driver.jobs import JobResult

        out = []
        for j in jobs:
            assert j.retime, "every measurement is at one setting: a retime job"
            t = self.seconds(j)
            if j.against:  # the final gate: both timed interleaved, 15 rounds each
                other = json.loads(j.against)
                ta = self.seconds(replace(j, program=other["program"],
                                          retime=json.dumps(other["knobs"])))
                self.duels.append((j.program, other["program"]))
                out.append(JobResult(j.key, True, t, t, t, runs=15, knobs=json.loads(j.retime),
                                     against_median=ta, against_q1=ta, against_q3=ta,
                                     against_runs=15, times=(t,) * 15,
                                     against_times=(ta,) * 15))
                continue
            self.calls.append((j.target, j.program, j.retime))
            out.append(JobResult(j.key, True, t, t, t, knobs=json.loads(j.retime)))
        return out

    def close(self) -> None:
        pass

    def counts(self, target: str | None = None) -> Counter:
        return Counter((p, s) for t, p, s in self.calls if target is None or t == target)


@pytest.fixture
def specs(tmp_path: Path) -> list[Path]:
    paths = []
    for name, text in (("small", SPEC), ("soft", BIG), ("safe", SAFE)):
        p = tmp_path / f"{name}.ks"
        p.write_text(text)
        paths.append(p)
    return paths


def _run(paths, backend, **kw):
    args = {"budget": K, "reference": 20, "cap": None, "checkpoint": None, "backend": backend,
            "cold_targets": (), "ms": FAST, "progress": lambda _: None, **kw}
    return evaluate(paths, **args)


def test_every_method_spends_exactly_k_pairs_each_timed_once(specs) -> None:
    backend = PairBackend()
    rows, colds = _run(specs[2:], backend)
    (row,) = rows
    assert colds == [{}]
    assert row.spent == {m: K for m in METHODS}  # exactly K timings per method
    counts = backend.counts()
    # the first pass times each pair once (a pair two methods chose costs one timing);
    # the finalists are then re-timed CONFIRM_ROUNDS times each
    assert len(counts) == row.measured
    assert set(counts.values()) <= {1, 1 + CONFIRM_ROUNDS}
    finalists = [k for k, n in counts.items() if n > 1]
    assert 0 < len(finalists) <= FINALISTS + len(METHODS)
    assert row.reference.startswith("sampled") and row.measured > 20
    assert len({s for _, s in counts}) > 1  # pairs differ in their settings, not only programs


def test_the_reference_covers_what_the_methods_measured(specs) -> None:
    backend = PairBackend()
    rows, _ = _run(specs[::2], backend)
    for r in rows:
        assert all(r.regret(m) >= 0 for m in METHODS)  # nothing beats the reference
        assert r.times["best"] <= min(r.times[m] for m in METHODS)
        assert r.first_pass["best"] <= min(r.first_pass[m] for m in METHODS)
        # fake timings are exact: re-timing changes nothing
        assert r.times == {m: r.first_pass[m] for m in r.times}
    small = rows[0]
    assert small.reference.startswith("exhaustive") or small.reference.startswith("sampled")


def test_an_exhaustive_reference_times_every_pair(tmp_path: Path) -> None:
    """A tiny spec whose programs' knob spaces hold fewer pairs than the reference: all
    of them are timed, so no pair of the space can beat the reference."""
    spec = tmp_path / "tiny.ks"
    spec.write_text("kernel t(N=8)\nin x[n:N] f32\nout y[n] = x[n] * 2\n")
    backend = PairBackend()
    rows, _ = _run([spec], backend, reference=400)
    (row,) = rows
    assert row.reference.startswith("exhaustive")
    n = int(row.reference.split("(")[1].split()[0])
    assert n >= 2 and row.measured >= n


def test_cold_start_rows_for_both_unseen_targets_with_adaptation(specs) -> None:
    from kernelsat.hardware.cpu import detect_cpu
    from kernelsat.hardware.targets import ISA_LEVELS

    if not ISA_LEVELS["c-x86-64-v2"].requires <= detect_cpu().flags:
        pytest.skip("this CPU cannot run x86-64-v2 code")
    backend = PairBackend()
    rows, colds = _run(specs[2:], backend, cold_targets=("numpy", "c-x86-64-v2", "c"),
                       cold_reference=12, adapt=2)
    (cold,) = colds
    assert set(cold) == {"numpy", "c-x86-64-v2"}  # the training target is never "cold"
    for name, c in cold.items():
        assert c.target == name and c.reference
        assert c.spent["rl"] <= K and c.spent["greedy"] <= K
        assert c.spent["adapted"] == c.spent["rl"] + min(2, c.spent["adapted"] - c.spent["rl"])
        assert c.adaptation
        assert all(c.regret(m) >= 0 for m in [*COLD_METHODS, "adapted"])
        # adapted ships the best of a superset of rl's pairs (first pass)
        assert c.first_pass["adapted"] <= c.first_pass["rl"]
        timed = backend.counts(name)
        assert len(timed) == c.measured  # its own reference, on its own target
    assert "learned model updated" in cold["c-x86-64-v2"].adaptation
    assert cold["numpy"].adaptation.endswith("policy order")
    assert all(c.adaptation.startswith("policy") for c in cold.values())
    # numpy reads no knobs: one setting per program there
    assert {s for _, s in backend.counts("numpy")} == {"{}"}
    assert len({s for _, s in backend.counts("c-x86-64-v2")}) > 1
    assert rows[0].target == "c"
    text = table(rows, colds, K)
    assert "Cold start on numpy" in text and "Cold start on c-x86-64-v2" in text
    assert "adapted regret" in text


def test_the_log_resumes_and_refuses_other_settings(specs, tmp_path: Path) -> None:
    log = tmp_path / "out" / "eval.jsonl"
    backend = PairBackend()
    rows, colds = _run(specs[::2], backend, log=log, cold_targets=("numpy",), cold_reference=8)
    lines = log.read_text().splitlines()
    assert "settings" in json.loads(lines[0]) and len(lines) == 1 + len(specs[::2])
    again = PairBackend()
    rows2, colds2 = _run(specs[::2], again, log=log, cold_targets=("numpy",), cold_reference=8)
    assert again.calls == []  # nothing measured again
    assert [r.times for r in rows2] == [r.times for r in rows]
    assert [{k: c.times for k, c in cs.items()} for cs in colds2] == \
        [{k: c.times for k, c in cs.items()} for cs in colds]
    for changed in ({"budget": K + 1}, {"cold_reference": 9}, {"cold_targets": ()}):
        with pytest.raises(ValueError, match="other settings"):
            _run(specs[::2], again, log=log, **{"cold_targets": ("numpy",), "cold_reference": 8,
                                           **changed})
    # the same settings measured on another machine (or on one the log never named)
    head = json.loads(lines[0])
    for machine in ({"fingerprint": "0" * 16, "model": "Some Other CPU"}, None):
        moved = tmp_path / f"moved{machine is None}.jsonl"
        head["settings"]["machine"] = machine
        moved.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
        before = moved.read_text()
        with pytest.raises(ValueError, match="not on this machine") as e:
            _run(specs[::2], again, log=moved, cold_targets=("numpy",), cold_reference=8)
        assert ("Some Other CPU" if machine else "an unrecorded machine") in str(e.value)
        assert moved.read_text() == before and again.calls == []  # nothing run, nothing lost


@dataclass
class LuckyBackend(PairBackend):
    """The first timing of a third of the pairs is lucky (half the true time); later
    timings of the same pair are true."""

    def run(self, jobs, progress=None):
        seen = self.counts()
        results = super().run(jobs, progress)
        for j, r in zip(jobs, results, strict=True):
            key = (j.program, j.retime)
            if not seen[key] and int(hashlib.sha256(repr(key).encode()).hexdigest(), 16) % 3 == 0:
                r.median /= 2
        return results


def test_the_table_times_are_re_timed_not_the_luckiest_run(specs) -> None:
    backend = LuckyBackend()
    rows, _ = _run(specs[2:], backend)
    (row,) = rows
    assert row.first_pass["best"] < row.times["best"]  # the lucky minimum was not true
    assert all(row.regret(m) >= 0 for m in METHODS)


@dataclass
class SlowSpellBackend(PairBackend):
    """Re-timing the eager spec fails (as when the host slows down past its limit)."""

    limits: list[tuple[float, float]] = field(default_factory=list)

    def run(self, jobs, progress=None):
        seen = self.counts()
        results = super().run(jobs, progress)
        for j, r in zip(jobs, results, strict=True):
            if seen[(j.program, j.retime)]:  # a re-timing
                self.limits.append((j.timing.max_run_seconds, r.median))
                if j.program == j.spec:
                    r.ok, r.error = False, "too slow: a run was stopped at the limit"
        return results


def test_a_failed_re_timing_is_a_note_not_a_silent_inf(specs) -> None:
    from kernelsat.hardware.knobs import abandon_limit

    backend = SlowSpellBackend()
    rows, colds = _run(specs[2:], backend)
    (row,) = rows
    if row.shipped_eager["eager"]:
        assert row.times["eager"] == math.inf
        assert any("re-timing failed: too slow" in n for n in row.notes)
        assert "Notes:" in table(rows, colds, K)
    assert backend.limits and all(limit == RETIME_SLACK * abandon_limit(t)
                                  for limit, t in backend.limits)


def test_a_memoized_pair_costs_nothing_twice(specs) -> None:
    from kernelsat.driver.pipeline import Options
    from kernelsat.hardware.targets import get_target
    from kernelsat.learning.rl_eval_pairs import Measurer
    from kernelsat.learning.rl_train import Prover
    from kernelsat.proofs.library import load_library
    from kernelsat.spec import load_spec

    program = load_spec(specs[0])
    from kernelsat.egraph.saturate import saturate

    sat = saturate(program.term, load_library().rules, iters=2, nodes=200)
    backend = PairBackend()
    m = Measurer(program, Prover([program], [sat.snapshot], load_library()), backend,
                 replace(FAST, target=get_target("c")) if isinstance(FAST, Options) else FAST)
    eager = m.eager()
    assert eager is not None and len(backend.calls) == 1
    again = m.take([eager, m.pair(program.term), m.pair(program.term, {})], 3)
    assert [p.key for p in again] == [eager.key]  # one distinct pair, already timed
    assert len(backend.calls) == 1 and m.timed == [eager.key]
    # an illegal value is replaced by the default: still the same pair
    bogus = m.pair(program.term, {k: {n: "nonsense" for n in v} for k, v in
                                  m.table(program.term).items()})
    assert bogus is not None and bogus.key == eager.key


@settings(max_examples=50, deadline=None)
@given(st.floats(0.0, 0.5), st.floats(0.0, 0.2), st.booleans(), st.booleans())
def test_missed_faster_needs_eager_shipped_and_a_faster_other_program(
        regret: float, spread: float, shipped: bool, best_eager: bool) -> None:
    r = SpecEval("s", times={"best": 1.0, "rl": 1.0 + regret}, spread=spread,
                 shipped_eager={"rl": shipped}, best_eager=best_eager)
    expected = shipped and not best_eager and r.regret("rl") > max(MISS_MARGIN, spread)
    assert r.missed_faster("rl") == expected


def test_table_counts_eager_shipped_although_faster_exists() -> None:
    rows = [SpecEval("a", times={"best": 1.0, **{m: 1.5 for m in METHODS}}, spread=0.0,
                     reference="sampled (9 pairs)",
                     shipped_eager={m: m != "rl" for m in METHODS}, best_eager=False,
                     best_pair="(Exp (In X i:4)) at {}"),
            SpecEval("b", times={"best": 1.0, **{m: 1.0 for m in METHODS}}, spread=0.0,
                     reference="sampled (9 pairs)", shipped_eager={m: True for m in METHODS})]
    text = table(rows, [{}, {}], K)
    line = next(x for x in text.splitlines() if x.startswith("| eager shipped"))
    assert line.split("|")[-(len(METHODS) + 1):-1] == [" 0 ", " 1 ", " 1 ", " 1 "]
    assert f"**{50.0 * 1:.1f}%**" not in text  # geomean of 1.5 and 1.0: 22.5%
    assert "**22.5%**" in text
    # the notes say who missed the faster program, and which pair it was
    note = next(x for x in text.splitlines() if "was missed by" in x)
    assert note.startswith("- a:") and "sample, greedy, eager;" in note
    assert note.endswith("(Exp (In X i:4)) at {}") and "rl" not in note.split(":")[1]


def test_geomean_ignores_missing_values() -> None:
    assert math.isclose(geomean([1.0, 4.0, math.inf]), 2.0)
    assert math.isnan(geomean([]))


def test_adapt_constant_is_a_few_measurements() -> None:
    assert 1 <= ADAPT <= 8


@pytest.mark.parametrize("args", [["--target", "bogus"], ["--cold-target", "c-x86-64-v9"]])
def test_the_command_refuses_an_unknown_target_before_any_work(args: list[str]) -> None:
    from typer.testing import CliRunner

    from kernelsat.cli import app

    res = CliRunner().invoke(app, ["evaluate", *args, "--only", "softmax"])
    assert res.exit_code != 0 and "unknown target" in res.output
    assert "Traceback" not in res.output


def test_adaptation_steps_a_copy_of_the_policy_on_measured_rewards(specs) -> None:
    """The policy-gradient steps move a copy's parameters; the loaded checkpoint's
    policy is unchanged (nothing is written either)."""
    import numpy as np

    from kernelsat.egraph.saturate import saturate
    from kernelsat.extract import roofline_rescore
    from kernelsat.extract.rl import RLExtractor, load_policy
    from kernelsat.hardware.targets import get_target
    from kernelsat.learning.rl_eval_pairs import Measurer, adapted_policy, proposals_of, rl_pairs
    from kernelsat.learning.rl_train import Prover
    from kernelsat.proofs.library import load_library
    from kernelsat.spec import load_spec

    program = load_spec(specs[1])
    snap = saturate(program.term, load_library().rules, iters=FAST.iters, nodes=FAST.nodes,
                    seconds=FAST.sat_seconds, factors=FAST.factors).snapshot
    target = get_target("numpy")
    m = Measurer(program, Prover([program], [snap], load_library()), PairBackend(),
                 replace(FAST, target=target))
    eager = m.eager()
    assert eager is not None
    proposals = proposals_of(RLExtractor(target=target), snap, roofline_rescore(target),
                             program, 8)
    measured = m.take(rl_pairs(m, proposals), 8)
    before = {k: v.copy() for k, v in load_policy().params.items()}
    policy, used = adapted_policy(m, None, measured, proposals, eager)
    assert all(np.array_equal(before[k], v) for k, v in load_policy().params.items())
    # the proposals carry their rollouts: every measured pair is an episode
    assert len(measured) >= 2 and used == len(measured) and policy is not None
    assert any(not np.array_equal(before[k], v) for k, v in policy.params.items())


@dataclass
class FailingBackend(PairBackend):
    """A quarter of the pairs (not the eager program) fail their timing, as a program
    rejected by the overflow check does."""

    failed: set[tuple[str, str]] = field(default_factory=set)

    def run(self, jobs, progress=None):
        results = super().run(jobs, progress)
        for j, r in zip(jobs, results, strict=True):
            key = (j.program, j.retime)
            if j.program != j.spec and not j.against and int(
                    hashlib.sha256(repr(key).encode()).hexdigest(), 16) % 4 == 0:
                r.ok, r.median, r.error = False, math.inf, "overflows in float32: 3 of 8 inf"
                self.failed.add(key)
        return results


def test_failed_pairs_count_in_the_budget_and_are_summed_in_the_notes(specs) -> None:
    backend = FailingBackend()
    rows, colds = _run(specs[2:], backend)
    (row,) = rows
    assert row.spent == {m: K for m in METHODS}  # a failed timing is a spent measurement
    failed = backend.failed
    assert row.failed == {"overflows in float32": len(failed)} and failed
    assert f"{len(failed)} of {row.measured} pairs failed their first timing " \
           f"(overflows in float32: {len(failed)})" in table(rows, colds, K)
    assert all(row.regret(m) >= 0 for m in METHODS)


def test_a_float_unsafe_program_costs_no_measurement(specs) -> None:
    """As in optimize, a program the static float analysis flags is not timed: softmax
    without its max, exp(x) / sum(exp(x)), overflows on the overflow check's inputs."""
    from kernelsat.egraph.saturate import saturate
    from kernelsat.hardware.targets import get_target
    from kernelsat.learning.rl_eval_pairs import Measurer
    from kernelsat.learning.rl_train import Prover
    from kernelsat.proofs.library import load_library
    from kernelsat.spec import load_spec, parse_spec

    program = load_spec(specs[1])
    unsafe = parse_spec(BIG.replace("softmax(n: x[m, n])",
                                    "exp(x[m, n]) / sum(k: exp(x[m, k]))"), "s").term
    sat = saturate(program.term, load_library().rules, iters=2, nodes=200)
    backend = PairBackend()
    m = Measurer(program, Prover([program], [sat.snapshot], load_library()), backend,
                 replace(FAST, target=get_target("c")))
    eager = m.eager()
    p = m.pair(unsafe)
    assert eager is not None and p is not None
    assert m.take([p], 1) == [] and m.unsafe == {unsafe.key}
    assert len(backend.calls) == 1  # the eager program only


def test_a_method_spends_fewer_only_when_its_stream_runs_out(specs) -> None:
    """The small softmax's sampled programs all drop the max (float-unsafe): the sampler
    has nothing to time, and no measurement is spent on them."""
    backend = PairBackend()
    rows, _ = _run(specs[1:2], backend)
    (row,) = rows
    assert row.unsafe > 0
    assert all(n <= K for n in row.spent.values()) and row.spent["eager"] == K


def test_the_policy_draws_until_k_of_its_pairs_can_be_timed(specs) -> None:
    """When the screens remove most of the first proposals (here: every program of the
    first 2K distinct proposals but the greedy one is marked screened, as logsumexp's
    estimate and float screens once removed 63 of 64), the filtered draw goes on until
    2K pairs can be timed, all usable and distinct as pairs (their settings completed),
    none of those excluded in a second draw."""
    from kernelsat.extract import roofline_rescore
    from kernelsat.extract.rl import RLExtractor
    from kernelsat.learning.rl_eval_pairs import proposals_of, rl_pairs

    m, program, snap = _measurer(specs[1], PairBackend())
    assert m.eager() is not None
    rl = RLExtractor(target=m.target, max_attempts=400)
    cost = roofline_rescore(m.target)
    plain = [p for p in rl_pairs(m, proposals_of(rl, snap, cost, program, 2 * K))
             if p is not None]
    m.screened |= {p.term.key for p in plain[1:]} - {plain[0].term.key}
    assert len([p for p in plain if m.usable(p)]) < 2 * K
    drawn = [p for p in rl_pairs(m, proposals_of(rl, snap, cost, program, 2 * K, m))
             if p is not None]
    assert len(drawn) == 2 * K
    assert all(m.usable(p) for p in drawn) and len({p.key for p in drawn}) == 2 * K
    again = [p for p in rl_pairs(m, proposals_of(rl, snap, cost, program, K, m,
                                                  exclude=[p.key for p in drawn]))
             if p is not None]
    assert again and not {p.key for p in again} & {p.key for p in drawn}


def test_the_sampler_goes_round_its_usable_programs_at_fresh_settings(specs) -> None:
    """With rounds, the sampler's stream holds more than one setting of a usable program
    (the programs alone would run out), and none of an unusable one."""
    from kernelsat.learning.rl_eval_pairs import sampled_pairs
    from kernelsat.spec import parse_spec

    m, program, _ = _measurer(specs[1], PairBackend())
    assert m.eager() is not None
    unsafe = parse_spec(BIG.replace("softmax(n: x[m, n])",
                                    "exp(x[m, n]) / sum(k: exp(x[m, k]))"), "s").term
    once = [p for p in sampled_pairs(m, [program.term, unsafe], 0) if p is not None]
    rounds = [p for p in sampled_pairs(m, [program.term, unsafe], 0, 6) if p is not None]
    assert len(once) == 2 and rounds[:2] == once
    later = rounds[2:]
    assert len(later) == 5 and all(p.term == program.term for p in later)
    assert len({p.key for p in rounds if p.term == program.term}) > 1


@dataclass
class TruthBackend(PairBackend):
    """PairBackend, but the programs in `truth` take exactly those seconds."""

    truth: dict[str, float] = field(default_factory=dict)

    def seconds(self, job) -> float:
        return self.truth.get(job.program, super().seconds(job))


def _measurer(path: Path, backend):
    from kernelsat.egraph.saturate import saturate
    from kernelsat.hardware.targets import get_target
    from kernelsat.learning.rl_eval_pairs import Measurer
    from kernelsat.learning.rl_train import Prover
    from kernelsat.proofs.library import load_library
    from kernelsat.spec import load_spec

    program = load_spec(path)
    sat = saturate(program.term, load_library().rules, iters=3, nodes=400)
    m = Measurer(program, Prover([program], [sat.snapshot], load_library()), backend,
                 replace(FAST, target=get_target("c")))
    return m, program, sat.snapshot


@pytest.mark.parametrize("truly_faster", [True, False])
def test_a_pick_ships_only_when_the_final_gate_passes_it(specs, truly_faster: bool) -> None:
    """A first pass that read another program faster than the eager one (a lucky,
    noisy median) is not enough: as in optimize, the two are timed interleaved and the
    other ships only when the paired verdict says faster."""
    from kernelsat.extract.rl_env import ExtractionEnv, enumerate_programs
    from kernelsat.sexpr import to_sexpr

    backend = TruthBackend()
    m, program, snap = _measurer(specs[2], backend)
    others = [t for t in enumerate_programs(ExtractionEnv(snap), 50)[0]
              if t.key != program.term.key and m.pair(t) is not None and m.usable(m.pair(t))]
    assert others, "the spec has another proved program"
    backend.truth = {to_sexpr(program.term): 1.0, to_sexpr(others[0]): 0.8 if truly_faster
                     else 1.25}
    eager = m.eager()
    other = m.pair(others[0])
    assert eager is not None and other is not None
    m.time([other])
    m.times[other.key] = 0.5  # the first pass read it twice as fast as the eager program
    assert m.fastest([other.key, eager.key]) == other.key  # ungated, it would ship
    shipped, how = m.ship([other.key], eager.key)
    assert (shipped, how) == ((other.key, "gate passed") if truly_faster
                              else (eager.key, "gate vetoed"))
    assert backend.duels == [(to_sexpr(others[0]), to_sexpr(program.term))]
    assert m.ship([other.key], eager.key) == (shipped, how)
    assert len(backend.duels) == 1  # the duel is memoized
    m.times[other.key] = 1.6  # beyond CONTEST_RANGE of the eager program: no duel
    assert m.ship([other.key], eager.key) == (eager.key,
                                              "no gate (the other programs far slower)")
    assert m.ship([], eager.key) == (eager.key, "no gate (one program)")
    assert len(backend.duels) == 1


def test_every_method_ships_through_the_gate_and_reports_its_pick_before(specs) -> None:
    backend = LuckyBackend()
    rows, colds = _run(specs[1:], backend)
    for row in rows:
        assert set(row.ungated) == set(METHODS) and set(row.gates) >= set(METHODS) - {"eager"}
        assert " at {" in row.best_pair  # the reference's best: program and setting
        assert row.best_pair.startswith("the eager program") == row.best_eager
        for name in METHODS:
            if row.gates.get(name) == "gate vetoed":
                assert row.shipped_eager[name]
    text = table(rows, colds, K)
    assert "geomean before the gate" in text and "gate vetoed the pick" in text
