"""The final gate: the search's winner ships only when, timed interleaved with the eager
program (each at its own best knobs), it is faster; else the eager program ships and the
report says why with both figures. Also the interleaved timing itself, with a fake timer."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.driver.jobs import Job, JobResult, against_json, run_job
from kernelsat.driver.pipeline import Candidate, Options, as_program, final_gate, optimize
from kernelsat.driver.report import report_json, report_markdown
from kernelsat.hardware import duel
from kernelsat.hardware.duel import Load, judge, order_index, paired_verdict
from kernelsat.hardware.measure import TimingProtocol, measure_interleaved, random_inputs
from kernelsat.ir import postorder, zero
from kernelsat.ops import Op
from kernelsat.sexpr import to_sexpr

SOFTMAX = "kernel sm(M=16, N=64)\nin X[i:M, n:N] f32\nout Y[i, n] = softmax(n: X[i, n])\n"
MS = 1e-3


class ScriptedBackend:
    """A backend whose figures are scripted: in the search, the eager program takes
    `eager_s` and every other program `lucky_s`; in the gate's interleaved job, the
    winner takes `gate_winner_s` and the eager program `gate_eager_s`."""

    name = "scripted"

    def __init__(self, eager_s: float, lucky_s: float, gate_winner_s: float,
                 gate_eager_s: float) -> None:
        self.eager_s, self.lucky_s = eager_s, lucky_s
        self.gate = (gate_winner_s, gate_eager_s)
        self.jobs: list[Job] = []

    def run(self, jobs: Sequence[Job], progress: Any = None) -> list[JobResult]:
        out = []
        for job in jobs:
            self.jobs.append(job)
            if job.against:
                w, e = self.gate
                out.append(JobResult(job.key, math.isfinite(w) and math.isfinite(e), w, w, w,
                                     0.0, 15, json.loads(job.retime), "",
                                     "" if math.isfinite(w) else "program: wrong values",
                                     against_median=e, against_q1=e, against_q3=e,
                                     against_runs=15))
                continue
            t = self.eager_s if job.program == job.spec else self.lucky_s
            knobs = {"k0": {"vw": 8 if job.program == job.spec else 16}}
            out.append(JobResult(job.key, True, t, t, t, 0.0, 5, knobs, "src",
                                 checked_on="c"))
        return out

    def close(self) -> None:
        pass


def _optimize(backend: ScriptedBackend) -> Any:
    return optimize(SOFTMAX, "c", backend=backend, trials=3, knob_budget=1, samples=3,
                    seconds=60)


def test_a_lucky_winner_that_loses_the_interleaved_retiming_does_not_ship() -> None:
    """The search saw the candidate at 5 ms against eager's 10 ms (a lucky run); timed
    interleaved it takes 12 ms against 10: the eager program ships, and the result, the
    report and its JSON say why with both figures."""
    backend = ScriptedBackend(10 * MS, 5 * MS, 12 * MS, 10 * MS)
    r = _optimize(backend)
    assert len([c for c in r.candidates if c.measurement is not None]) >= 2
    assert r.best is r.eager
    assert r.gate is not None and not r.gate.passed
    assert (r.gate.winner_median, r.gate.eager_median) == (12 * MS, 10 * MS)
    loser = next(c for c in r.candidates if c.error.startswith("final gate"))
    assert "12.000 ms" in loser.error and "10.000 ms" in loser.error
    assert r.dropped(loser).startswith("final gate")
    assert any("eager program ships" in n for n in r.notes)
    data = report_json(r)
    assert data["gate"]["winner_ms"] == pytest.approx(12.0)
    assert data["gate"]["eager_ms"] == pytest.approx(10.0)
    assert data["gate"]["passed"] is False and data["best"]["extractors"][0] == "eager"
    assert "the eager program ships" in report_markdown(r, data)
    assert "eager ships" in r.summary()
    # the gate job timed the winner at its own knobs against the eager at its own
    gate_job = next(j for j in backend.jobs if j.against)
    assert json.loads(gate_job.retime) == loser.knobs
    against = json.loads(gate_job.against)
    assert against["program"] == to_sexpr(r.eager.term) and against["knobs"] == r.eager.knobs


def test_a_winner_confirmed_by_the_interleaved_retiming_ships() -> None:
    r = _optimize(ScriptedBackend(10 * MS, 5 * MS, 6 * MS, 10 * MS))
    assert r.best is not r.eager and r.gate is not None and r.gate.passed
    assert report_json(r)["gate"]["passed"] is True


def test_a_winner_that_fails_a_check_in_the_gate_does_not_ship() -> None:
    r = _optimize(ScriptedBackend(10 * MS, 5 * MS, math.inf, 10 * MS))
    assert r.best is r.eager and r.gate is not None and not r.gate.passed
    assert "failed there" in r.gate.reason


def test_no_gate_when_the_eager_program_wins_the_search() -> None:
    backend = ScriptedBackend(5 * MS, 10 * MS, 1 * MS, 10 * MS)
    r = _optimize(backend)
    assert r.best is r.eager and r.gate is None and not any(j.against for j in backend.jobs)
    assert report_json(r)["gate"] is None


def test_a_close_loser_of_the_search_gets_the_interleaved_retiming_too() -> None:
    """Eager won the search narrowly (10 ms against 12: one run taken on a busy
    moment); interleaved, the other program takes 6 ms against 10: it ships. When the
    interleaved figures confirm the search, eager ships."""
    r = _optimize(ScriptedBackend(10 * MS, 12 * MS, 6 * MS, 10 * MS))
    assert r.best is not r.eager and r.gate is not None and r.gate.passed
    assert r.dropped(r.eager).startswith("final gate: winner 6.000 ms")
    r = _optimize(ScriptedBackend(10 * MS, 12 * MS, 13 * MS, 10 * MS))
    assert r.best is r.eager and r.gate is not None and not r.gate.passed


def _measured(term: Any, seconds: float, knobs: Any = None) -> Candidate:
    c = Candidate(term, ["x"], knobs=knobs)
    c.measurement = JobResult("k", True, seconds, seconds, seconds)
    return c


@settings(max_examples=60, deadline=None)
@given(st.floats(1e-5, 1.0), st.floats(1e-5, 1.0), st.floats(1e-5, 1.0), st.floats(1e-5, 1.0))
def test_the_gate_passes_exactly_when_the_interleaved_winner_is_faster(
        search_w: float, search_e: float, gate_w: float, gate_e: float) -> None:
    """Whatever the search said, only the interleaved figures decide."""
    program = as_program(SOFTMAX, None)
    winner, eager = _measured(program.term, search_w), _measured(program.term, search_e)
    g = final_gate(program, Options(), winner, eager,
                   ScriptedBackend(search_e, search_w, gate_w, gate_e), lambda s, m: None)
    assert g.passed == (gate_w < gate_e)
    assert (g.winner_median, g.eager_median) == (gate_w, gate_e)


def test_the_gate_passes_when_the_eager_program_has_no_time() -> None:
    program = as_program(SOFTMAX, None)
    eager = Candidate(program.term, ["eager"], error="raised RuntimeError: boom")
    g = final_gate(program, Options(), _measured(program.term, MS), eager,
                   ScriptedBackend(1, 1, 1, 1), lambda s, m: None)
    assert g.passed and "no time to compare" in g.reason and "boom" in g.reason


def test_run_job_times_two_programs_interleaved(tmp_path: Path) -> None:
    """A job with `against`, run for real: both programs built at their knobs, timed in
    the same rounds, each figure in its own field; a wrong `against` program fails it."""
    program = as_program(SOFTMAX, None)
    spec = to_sexpr(program.term)
    fast = TimingProtocol(min_runs=3, min_seconds=0.0, warmup=1)
    job = Job(spec, spec, program.out_axes, program.inputs, "numpy", 1, 0, timing=fast,
              retime="{}", against=against_json(spec, None))
    r = run_job(job, tmp_path)
    assert r.ok, r.error
    assert r.runs == r.against_runs == 3
    assert math.isfinite(r.median) and math.isfinite(r.against_median)
    wrong = "(mul (In X i:16 n:64) (Const 2.0))"
    bad = run_job(Job(spec, spec, program.out_axes, program.inputs, "numpy", 1, 0,
                      timing=fast, retime="{}", against=against_json(wrong, None)), tmp_path)
    assert not bad.ok and bad.error.startswith("against:")
    assert math.isfinite(bad.median) and bad.against_median == math.inf


# -- measure_interleaved with a fake timer ----------------------------------------------


class Program:
    """An executable that records its calls and writes `value(call)` (default right)."""

    def __init__(self, name: str, log: list[str], wrong_after: int | None = None) -> None:
        self.name, self.log, self.wrong_after = name, log, wrong_after
        self.calls = 0

    def __call__(self, inputs: Any, out: np.ndarray) -> None:
        self.log.append(self.name)
        self.calls += 1
        np.multiply(inputs["x"], 2, out=out)
        if self.wrong_after is not None and self.calls > self.wrong_after:
            out.fill(np.nan)


def test_interleaved_rounds_alternate_and_keep_each_programs_times() -> None:
    inputs = random_inputs({"x": (256,)}, seed=0)
    ref = inputs["x"].astype(np.float64) * 2
    log: list[str] = []
    seconds = {"A": 3e-3, "B": 2e-3}

    def timer(thunk: Any) -> float:
        thunk()
        return seconds[log[-1]]

    a, b = Program("A", log), Program("B", log)
    ma, mb = measure_interleaved([a, b], inputs, (256,), ref, timer=timer, min_runs=5,
                                 min_seconds=0.0, warmup=2, flush_cache=False)
    assert log == ["A", "B"] * 7  # two warm-up rounds, then five timed rounds
    assert (ma.median, mb.median, ma.runs, mb.runs) == (3e-3, 2e-3, 5, 5)


def test_one_failing_program_leaves_the_rounds_and_the_other_goes_on() -> None:
    """B turns wrong on its 4th run: a later (sampled) check catches it, A completes."""
    inputs = random_inputs({"x": (1 << 17,)}, seed=0)  # larger than the check's sample
    ref = inputs["x"].astype(np.float64) * 2
    log: list[str] = []
    ma, mb = measure_interleaved([Program("A", log), Program("B", log, wrong_after=3)],
                                 inputs, (1 << 17,), ref, min_runs=6, min_seconds=0.0,
                                 warmup=1, flush_cache=False, check="first")
    assert ma.ok and ma.runs == 6
    assert not mb.ok and "unwritten or NaN" in mb.failure and "sample" in mb.failure


# -- the paired verdict (kernelsat.hardware.duel): a noisy tie is not a win -------------


class PairedBackend(ScriptedBackend):
    """`ScriptedBackend`, but the gate's job returns per-round times (winner, eager) and
    the load it saw, as `_duel` does."""

    def __init__(self, winner_times: Sequence[float], eager_times: Sequence[float],
                 load: float = 0.2, probe: float = 1e-3, best_probe: float = 1e-3) -> None:
        super().__init__(10 * MS, 5 * MS, float(np.median(winner_times)),
                         float(np.median(eager_times)))
        self.times = (tuple(winner_times), tuple(eager_times))
        self.load, self.probe, self.best_probe = load, probe, best_probe

    def run(self, jobs: Sequence[Job], progress: Any = None) -> list[JobResult]:
        out = super().run(jobs, progress)
        for job, r in zip(jobs, out, strict=True):
            if job.against:
                w, e = self.times
                r.q1, r.q3 = (float(x) for x in np.percentile(w, [25, 75]))
                r.against_q1, r.against_q3 = (float(x) for x in np.percentile(e, [25, 75]))
                r.times, r.against_times = w, e
                r.load, r.probe, r.best_probe = self.load, self.probe, self.best_probe
        return out


def _gate(backend: ScriptedBackend) -> Any:
    program = as_program(SOFTMAX, None)
    return final_gate(program, Options(), _measured(program.term, 5 * MS),
                      _measured(program.term, 10 * MS), backend, lambda s, m: None)


def test_medians_that_differ_by_noise_alone_are_a_tie_and_the_eager_program_ships() -> None:
    """The winner's median is lower (10 ms against 10.5), but round by round it is faster
    in only half of them (eager alternates 9 and 12 ms: noise): the old rule (medians)
    shipped it, the paired verdict calls a tie, and the report line says so."""
    g = _gate(PairedBackend([10 * MS] * 30, [9 * MS, 12 * MS] * 15))
    assert g.winner_median < g.eager_median
    assert not g.passed and g.verdict == "tie"
    assert "a tie, not a win" in g.note and "faster in 15 of 30 rounds" in g.note
    assert g.note.startswith("final gate (the eager program ships): winner 10.000 ms")


ZERO = ("kernel z(M=16, N=64)\nin X[i:M, n:N] f32\nS[i] = sum(n: X[i, n])\n"
        "out Y[i, n] = (S[i] - S[i]) + (X[i, n] - X[i, n])\n")


def test_a_tie_goes_to_the_program_that_does_less_work() -> None:
    """The zero spec and its simplification, a fill: timed alike round by round (a
    tie, the fill's median lower), the fill ships because it does no more work in any
    count and less in some (kernels, flops, bytes), and the note says which; the same
    tie with the sides swapped, a tie of a program with itself, and a tie where the
    fill's median is the higher, ship the eager program."""
    program = as_program(ZERO, None)
    fill = zero(next(t for t in postorder(program.term) if t.op is Op.IN))
    tie = ([10 * MS] * 30, [9 * MS, 12 * MS] * 15)

    def gate(winner: Any, eager: Any) -> Any:
        return final_gate(program, Options(), _measured(winner, 5 * MS),
                          _measured(eager, 10 * MS), PairedBackend(*tie), lambda s, m: None)

    g = gate(fill, program.term)
    assert g.passed and g.verdict == "tie"
    assert "a tie, and the winner does less work (kernels 1 < 2, flops 0 <" in g.note
    assert "compulsory bytes" in g.note and "a tie goes to it" in g.note
    for winner, eager in ((program.term, fill), (program.term, program.term)):
        g = gate(winner, eager)
        assert not g.passed and "a tie, not a win" in g.note
    # nor when the winner's median is the higher one: the report never ships a program
    # whose own figure says it lost
    g = final_gate(program, Options(), _measured(fill, 5 * MS), _measured(program.term, 10 * MS),
                   PairedBackend([9 * MS, 12 * MS] * 15, [10 * MS] * 30), lambda s, m: None)
    assert g.verdict == "tie" and g.winner_median > g.eager_median and not g.passed
    # a clear loss is not rescued by doing less
    g = final_gate(program, Options(), _measured(fill, 5 * MS), _measured(program.term, 10 * MS),
                   PairedBackend([12 * MS, 13 * MS] * 10, [10 * MS, 11 * MS] * 10),
                   lambda s, m: None)
    assert not g.passed and g.verdict == "slower"


def test_a_clear_win_still_ships_even_with_a_few_load_bursts() -> None:
    """The winner is 0.7x the eager program in most rounds; three rounds of thirty hit a
    burst of load on the winner's run (3x): it still ships."""
    w = [7 * MS] * 27 + [30 * MS] * 3
    g = _gate(PairedBackend(w, [10 * MS] * 30))
    assert g.passed and g.verdict == "faster" and g.faster_rounds == 27
    assert g.pair_ratio == pytest.approx(0.7) and "faster in 27 of 30 rounds" in g.note


def test_the_eager_program_faster_round_by_round_is_slower() -> None:
    g = _gate(PairedBackend([12 * MS, 13 * MS] * 10, [10 * MS, 11 * MS] * 10))
    assert not g.passed and g.verdict == "slower"


def test_a_loaded_machine_asks_more_and_says_so() -> None:
    """13 of 15 rounds faster passes the quiet bound (99%), not the loaded one (99.9%):
    with a load probe 5x the quietest, or a load average of 3 per core, or sides whose
    runs spread by half their median, the eager program ships and the line says why."""
    w, e = [8 * MS] * 13 + [12 * MS] * 2, [10 * MS] * 15
    assert _gate(PairedBackend(w, e)).passed
    for backend, why in ((PairedBackend(w, e, probe=5e-3), "load probe 5.0x"),
                         (PairedBackend(w, e, load=3.0), "load average 3.0 per core")):
        g = _gate(backend)
        assert not g.passed and g.verdict == "tie" and why in g.loaded
        assert "machine loaded" in g.note and "99.9% asked" in g.note
    # 14 of 16 rounds faster, each side's runs spread over 5-20 ms: noisy, so 99.9%
    noisy_e = [5 * MS, 10 * MS, 10 * MS, 20 * MS] * 4
    noisy_w = [0.8 * x for x in noisy_e[:14]] + [1.2 * x for x in noisy_e[14:]]
    assert paired_verdict(noisy_w, noisy_e).outcome == "faster"  # the quiet bound
    g = _gate(PairedBackend(noisy_w, noisy_e))
    assert not g.passed and g.verdict == "tie" and "runs spread" in g.loaded


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.5, 2.0), min_size=1, max_size=60), st.floats(1e-4, 1.0))
def test_pairs_balanced_around_one_are_never_a_win(ratios: list[float], base: float) -> None:
    """Whatever the noise, when every round's ratio r is matched by a round with 1/r (no
    program is faster), the verdict is never "faster"."""
    w = [base * r for r in ratios] + [base for _ in ratios]
    e = [base for _ in ratios] + [base * r for r in ratios]
    v = paired_verdict(w, e)
    assert v.outcome != "faster"
    assert judge(w, e, Load(per_core=5.0)).outcome != "faster"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.3, 0.95), min_size=20, max_size=80), st.integers(0, 10))
def test_a_consistent_win_is_faster_whatever_its_size(ratios: list[float], bursts: int) -> None:
    """Every round at least 5% faster, up to a tenth of the rounds a load burst against
    the winner (4x): "faster" from 20 rounds on, and never "slower"."""
    bursts = min(bursts, len(ratios) // 10)
    w = [r if i >= bursts else 4.0 for i, r in enumerate(ratios)]
    v = paired_verdict(w, [1.0] * len(ratios))
    assert v.outcome == "faster" and v.high < 1


def test_the_confidence_bound_is_the_sign_tests_order_statistic() -> None:
    """j-th smallest of n as the 99% upper bound: P(Binomial(n, 1/2) <= j - 1) >= 0.99
    and not for j - 1 (checked against exact integer arithmetic)."""
    for n in (1, 5, 7, 15, 40, 101):
        j = order_index(n, 0.99)

        def cdf(k: int, n: int = n) -> float:
            return sum(math.comb(n, i) for i in range(k + 1)) / 2**n

        if j <= n:
            assert cdf(j - 1) >= 0.99 and (j == 1 or cdf(j - 2) < 0.99)
        else:
            assert cdf(n - 1) < 0.99


def test_settled_asks_more_rounds_of_a_loaded_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    w, e = [8.0] * 13 + [12.0] * 2, [10.0] * 15
    monkeypatch.setattr(duel, "load_per_core", lambda: 0.3)
    assert duel.settled([w, e])
    monkeypatch.setattr(duel, "load_per_core", lambda: 3.0)
    assert not duel.settled([w, e])


def test_interleaved_rounds_extend_while_unsettled_and_alternate_the_order() -> None:
    """With `settle`, rounds go on past the minimum while it says no, up to `extend` x
    the rounds the minimum took; `alternate` runs A B, B A, A B ..."""
    inputs = random_inputs({"x": (256,)}, seed=0)
    ref = inputs["x"].astype(np.float64) * 2
    log: list[str] = []

    def timer(thunk: Any) -> float:
        thunk()
        return 1e-3

    asked: list[int] = []

    def never(times: Sequence[Sequence[float]]) -> bool:
        asked.append(len(times[0]))
        return False

    ma, mb = measure_interleaved([Program("A", log), Program("B", log)], inputs, (256,), ref,
                                 timer=timer, min_runs=5, min_seconds=0.0, warmup=0,
                                 flush_cache=False, settle=never, alternate=True, extend=3.0)
    assert ma.runs == mb.runs == 15 and asked == list(range(5, 15))
    assert log[:6] == ["A", "B", "B", "A", "A", "B"]
    log.clear()
    ma, _ = measure_interleaved([Program("A", log), Program("B", log)], inputs, (256,), ref,
                                timer=timer, min_runs=5, min_seconds=0.0, warmup=0,
                                flush_cache=False, settle=lambda t: True, extend=3.0)
    assert ma.runs == 5 and log == ["A", "B"] * 5


def test_a_paired_win_whose_median_is_not_lower_does_not_ship() -> None:
    """Faster in 28 of 30 rounds (20 vs 21 ms, then 9 vs 10), but the eager program's
    two slow rounds fall where the winner is slow too: the winner's median (20 ms) is
    above the eager program's (10): the two summaries disagree, so no win is called."""
    g = _gate(PairedBackend([20 * MS] * 16 + [9 * MS] * 14, [21 * MS] * 14 + [10 * MS] * 16))
    assert g.verdict == "faster" and g.faster_rounds == 28
    assert g.winner_median > g.eager_median
    assert not g.passed and "medians disagree" in g.note
