"""`kernelsat evaluate`'s machinery with fake timings (no clock): every method is
measured through the backend, the reference is exhaustive when the space is small,
finished specs are logged and a rerun resumes without measuring again."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from kernelsat.learning.rl_eval import (
    CONFIRM_ROUNDS,
    FINALISTS,
    METHODS,
    RETIME_SLACK,
    evaluate,
    geomean,
    table,
)
from kernelsat.learning.rl_train import TRAIN_OPTIONS
from tests.test_rl_extractor import CountingBackend

SPEC = "kernel k(N=8)\nin x[n:N] f32\nout y[n] = exp(x[n]) * 2\n"
BIG = "kernel s(M=4, N=8)\nin x[m:M, n:N] f32\nout y[m, n] = softmax(n: x[m, n])\n"

FAST = replace(TRAIN_OPTIONS, iters=3, nodes=400, sat_seconds=120.0)


@pytest.fixture
def specs(tmp_path: Path) -> list[Path]:
    paths = []
    for name, text in (("small", SPEC), ("soft", BIG)):
        p = tmp_path / f"{name}.ks"
        p.write_text(text)
        paths.append(p)
    return paths


def test_regrets_against_an_exhaustive_or_sampled_reference(specs, tmp_path: Path) -> None:
    backend = CountingBackend()
    log = tmp_path / "out" / "eval.jsonl"
    rows, colds = evaluate(specs, budget=2, reference=20, cap=None, checkpoint=None,
                           backend=backend, cold=False, ms=FAST, log=log,
                           progress=lambda _: None)
    assert [r.name for r in rows] == ["small", "soft"] and colds == [None, None]
    small, soft = rows
    assert small.reference.startswith("exhaustive")  # a handful of programs: all measured
    assert soft.reference == "sampled"  # many programs: 20 more beyond the methods'
    assert soft.measured > 20
    for r in rows:
        assert all(r.regret(m) >= 0 for m in METHODS)
        assert r.times["best"] <= r.times["eager"]
    assert sum(r.measured for r in rows) == len(backend.jobs)  # each measured once
    assert len(backend.jobs) == len(set(backend.jobs))
    # then the finalists are re-timed: CONFIRM_ROUNDS rounds, each program once a round
    finalists = set(backend.retimed)
    assert set(backend.jobs) >= finalists
    assert len(backend.retimed) == CONFIRM_ROUNDS * len(finalists)
    for r in rows:  # fake timings are exact: re-timing changes nothing
        assert r.times == {m: r.first_pass[m] for m in r.times}
    text = table(rows, colds, 2)
    assert "| small |" in text and "**geomean**" in text
    # the log: a settings line, then one line per spec; a rerun measures nothing
    lines = log.read_text().splitlines()
    assert "settings" in json.loads(lines[0]) and len(lines) == 3
    again = CountingBackend()
    rows2, _ = evaluate(specs, budget=2, reference=20, cap=None, checkpoint=None,
                        backend=again, cold=False, ms=FAST, log=log, progress=lambda _: None)
    assert again.jobs == [] and [r.times for r in rows2] == [r.times for r in rows]
    with pytest.raises(ValueError, match="other settings"):
        evaluate(specs, budget=3, reference=20, cap=None, checkpoint=None, backend=again,
                 cold=False, ms=FAST, log=log, progress=lambda _: None)


def test_exhaustive_reference_holds_the_true_optimum(specs) -> None:
    """With every program measured, no method can beat the reference."""
    from kernelsat.egraph.saturate import saturate
    from kernelsat.extract.rl_env import ExtractionEnv, enumerate_programs
    from kernelsat.ir import postorder
    from kernelsat.proofs.library import load_library
    from kernelsat.spec import load_spec

    backend = CountingBackend()
    rows, _ = evaluate(specs[:1], budget=2, reference=50, cap=None, checkpoint=None,
                       backend=backend, cold=False, ms=FAST, progress=lambda _: None)
    program = load_spec(specs[0])
    sat = saturate(program.term, load_library().rules, iters=FAST.iters, nodes=FAST.nodes,
                   seconds=FAST.sat_seconds, factors=FAST.factors)
    everything, complete = enumerate_programs(ExtractionEnv(sat.snapshot), 51)
    assert complete
    sizes = [len(list(postorder(t))) for t in everything]
    # the best proved program is at most the smallest program of all (some may not prove)
    assert rows[0].times["best"] >= min(sizes)
    assert rows[0].measured <= len(everything) + 1


@dataclass
class LuckyBackend(CountingBackend):
    """First-pass times with lucky noise (a third of the programs timed at half their
    size); re-timing gives the true time (the size)."""

    def run(self, jobs, progress=None):
        results = super().run(jobs, progress)
        for j, r in zip(jobs, results, strict=True):
            if not j.retime and int(j.key, 16) % 3 == 0:
                r.median /= 2
        return results


def test_the_reference_and_methods_are_re_timed_not_their_luckiest_run(specs) -> None:
    """The winner's curse: the fastest first-pass time is biased low by the noise. The
    table's times are the re-timed ones: the true times of the programs chosen."""
    backend = LuckyBackend()
    rows, _ = evaluate(specs[1:], budget=2, reference=20, cap=None, checkpoint=None,
                       backend=backend, cold=False, ms=FAST, progress=lambda _: None)
    (row,) = rows
    assert row.first_pass["best"] < row.times["best"]  # the lucky minimum was not true
    assert float(row.times["best"]).is_integer()  # every table time is a true size
    assert all(float(row.times[m]).is_integer() for m in METHODS)
    assert all(row.regret(m) >= 0 for m in METHODS)
    assert len(backend.retimed) == CONFIRM_ROUNDS * len(set(backend.retimed))
    assert len(set(backend.retimed)) <= FINALISTS + len(METHODS)


@dataclass
class SlowSpellBackend(CountingBackend):
    """Re-timing the eager spec fails (as when the host slows down past its limit)."""

    limits: list[tuple[float, float]] = field(default_factory=list)  # (limit, first pass)

    def run(self, jobs, progress=None):
        results = super().run(jobs, progress)
        for j, r in zip(jobs, results, strict=True):
            if j.retime:
                self.limits.append((j.timing.max_run_seconds, r.median))
                if j.program == j.spec:
                    r.ok, r.error = False, "too slow: a run was stopped at the limit"
        return results


def test_a_failed_re_timing_is_a_note_in_the_table_not_a_silent_inf(specs) -> None:
    from kernelsat.hardware.knobs import abandon_limit

    backend = SlowSpellBackend()
    rows, colds = evaluate(specs[1:], budget=2, reference=20, cap=None, checkpoint=None,
                           backend=backend, cold=False, ms=FAST, progress=lambda _: None)
    (row,) = rows
    assert row.times["eager"] == math.inf
    assert any(n.startswith("eager: re-timing failed: too slow") for n in row.notes)
    assert "Notes:" in table(rows, colds, 2) and "- soft: eager: re-timing" in table(rows, colds, 2)
    # a re-timed program is stopped only far beyond the time it already ran in
    assert backend.limits and all(limit == RETIME_SLACK * abandon_limit(t)
                                  for limit, t in backend.limits)


def test_geomean_ignores_missing_values() -> None:
    assert math.isclose(geomean([1.0, 4.0, math.inf]), 2.0)
    assert math.isnan(geomean([]))
