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
from kernelsat.hardware.measure import TimingProtocol, measure_interleaved, random_inputs
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
    c.measurement = JobResult("k", True, seconds, seconds, seconds)  # type: ignore[assignment]
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
