"""Attacks on the ship gate: programs proved equal over the reals that are wrong, or
overflow, in float32 must not ship, on any target (numpy, c, cuda).

The gate is `kernelsat.driver.jobs.ship_failure`: measured programs (c, numpy) pass
it after their knob search; CUDA programs, not timed here, pass it through
`gate_backend("cuda")` (the C renderer of the same lowered program, float32, without a
GPU). Sizes are small (params), so each optimize run takes seconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kernelsat.driver import jobs
from kernelsat.driver.jobs import STRESS_SCALE, Job, JobResult, check_job, gate_backend, run_job
from kernelsat.driver.pipeline import OptimizeError, Result, as_program, optimize
from kernelsat.driver.report import report_json, report_markdown
from kernelsat.hardware.measure import TimingProtocol
from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as
from kernelsat.program import Program
from kernelsat.sexpr import to_sexpr

SPECS = Path(__file__).resolve().parents[2] / "specs"
SMALL = {"cross_entropy": {"B": 8, "C": 64}, "logsumexp": {"M": 4, "N": 64}}
TARGETS = ("numpy", "c", "cuda")


def _stress_env(program: Program) -> dict[str, np.ndarray]:
    """The overflow check's inputs, drawn here independently of the gate's code."""
    roles = {d.name: d.role for d in program.inputs}
    env = random_inputs(program, seed=0)
    return {k: v * STRESS_SCALE if roles[k] != "onehot" else v for k, v in env.items()}


def _finite_in_float32(program: Program, term_text: str) -> bool:
    from kernelsat.sexpr import parse_term

    with np.errstate(all="ignore"):
        out = evaluate_as(parse_term(term_text), _stress_env(program), program.out_axes,
                          np.float32)
    return bool(np.all(np.isfinite(out)))


def _optimize(name: str, target: str, tmp_path: Path, float_screen: bool = True) -> Result:
    # a generous budget: the run takes seconds, but waits for the machine's timing lock
    # while other processes time, and a spent budget would skip the candidates' proofs
    return optimize(SPECS / f"{name}.ks", target, params=SMALL[name], seconds=600, trials=4,
                    knob_budget=1, timing=TimingProtocol(min_runs=1, min_seconds=0.0),
                    extract="greedy", cache_dir=tmp_path, float_screen=float_screen)


# -- the specs whose optimizations overflow: nothing overflowing ships -------------------


@pytest.mark.parametrize("target", ["numpy", "cuda"])
@pytest.mark.parametrize("name", ["cross_entropy", "logsumexp"])
def test_no_overflowing_form_ships(name: str, target: str, tmp_path: Path) -> None:
    """The run-time gate alone (the static float analysis off, so the overflowing forms
    reach it) drops the overflowing forms."""
    r = _optimize(name, target, tmp_path, float_screen=False)
    program = r.program
    assert _finite_in_float32(program, to_sexpr(program.term))  # the spec is finite there
    assert _finite_in_float32(program, to_sexpr(r.best.term)), to_sexpr(r.best.term)
    # the attack happened: greedy extraction proposes log(sum(exp x)), and it was dropped
    rejected = [c for c in r.candidates if "overflows in float32" in c.error]
    assert rejected, [c.error or c.proof for c in r.candidates]
    for c in rejected:
        assert not _finite_in_float32(program, to_sexpr(c.term))
        assert c is not r.best
    want = gate_backend(target)
    for c in r.candidates:
        if c.proved and not c.error.startswith("not measured"):
            assert c.checked_on == want, (c.checked_on, c.error)


@pytest.mark.parametrize("name", ["cross_entropy", "logsumexp"])
def test_the_float_analysis_drops_the_overflowing_forms_before_the_gate(name: str,
                                                                         tmp_path: Path) -> None:
    """With the static float analysis on (the default), the same attack is stopped before
    proving: every form it drops overflows in float32, and none reaches the run-time
    gate to be rejected there (issue 19 part 2)."""
    r = _optimize(name, "numpy", tmp_path)
    program = r.program
    assert _finite_in_float32(program, to_sexpr(r.best.term))
    dropped = [c for c in r.candidates if c.float_hazard]
    assert dropped and r.float_removed == len(dropped)
    for c in dropped:
        assert not _finite_in_float32(program, to_sexpr(c.term)), c.float_hazard
        assert c.measurement is None and c.certificate is None
    assert r.float_rejected == 0, [c.error for c in r.candidates]


def test_cli_cuda_ships_the_stable_form_and_reports_the_rejected_ones(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kernelsat.cli import app

    out = tmp_path / "o"
    res = CliRunner().invoke(app, ["optimize", str(SPECS / "cross_entropy.ks"), "--target",
                                   "cuda", "-p", "B=8", "-p", "C=64", "--extract", "greedy",
                                   "--trials", "3", "--seconds", "600",
                                   "--cache-dir", str(tmp_path / "cache"),
                                   "--out", str(out)])
    assert res.exit_code == 0, res.output
    program = as_program(SPECS / "cross_entropy.ks", SMALL["cross_entropy"])
    assert _finite_in_float32(program, (out / "best.sexpr").read_text())
    report = (out / "report.md").read_text()
    # the static float analysis drops the overflowing forms before the run-time gate
    assert "float-unsafe on the overflow check's inputs" in report, report
    assert "Float safety: " in report and "rejected by the run-time float checks" in report
    assert "float safety: " in res.output and "numeric and overflow checks" in res.output


def test_the_report_says_why_each_candidate_was_dropped(tmp_path: Path) -> None:
    r = _optimize("logsumexp", "cuda", tmp_path, float_screen=False)
    data = report_json(r)
    text = report_markdown(r, data)
    for row in data["candidates"]:
        assert bool(row["dropped"]) != row["best"], row
    overflowed = [row for row in data["candidates"] if "overflows" in row["dropped"]]
    assert overflowed and all(row["checked_on"] == gate_backend("cuda") for row in overflowed)
    assert "why not shipped" in text and f"overflows in float32 ({gate_backend('cuda')})" in text
    assert any(f"through the {gate_backend('cuda')} backend" in n for n in r.notes)
    assert "dropped #" in r.summary()


# -- planted candidates, one gate on every target ---------------------------------------

LSE_SPEC = "kernel k(M=4, N=32)\nin X[i:M, n:N] f32\nout Y[i] = logsumexp(n: X[i, n])"
EXP_SPEC = "kernel k(N=32)\nin X[n:N] f32\nin Z[n:N] f32\nout Y[n] = exp(X[n] - Z[n])"
SOFTMAX_SPEC = "kernel k(M=4, N=32)\nin X[i:M, n:N] f32\nout Y[i, n] = softmax(n: X[i, n])"
DOUBLE_SPEC = "kernel k(N=32)\nin X[n:N] f32\nout Y[n] = X[n] * 2"

PLANTED: dict[str, tuple[str, str, str]] = {
    # name: (spec, planted program, what the gate must say)
    "lse without the max": (LSE_SPEC, "(log (Sum n (exp (In X i:4 n:32))))",
                            "overflows in float32"),
    "exp split into a product": (EXP_SPEC, "(mul (exp (In X n:32)) (exp (neg (In Z n:32))))",
                                 "overflows in float32"),
    "softmax without the max": (SOFTMAX_SPEC, "(div (exp (In X i:4 n:32)) "
                                "(Sum n (exp (In X i:4 n:32))))", "overflows in float32"),
    "log of exp (over- and underflow)": (DOUBLE_SPEC,
                                         "(mul (log (exp (In X n:32))) (Const 2.0))",
                                         "overflows in float32"),
    "off by 0.1%": (LSE_SPEC, "(mul (Const 1.001) (LSE n (In X i:4 n:32)))",
                    "relative L2 error"),
    "divided by zero": (EXP_SPEC, "(div (exp (sub (In X n:32) (In Z n:32))) (Const 0.0))",
                        "infinities"),
    "multiplied by zero": (EXP_SPEC, "(mul (Const 0.0) (exp (sub (In X n:32) (In Z n:32))))",
                         "all zeros"),
}


def _job(spec_text: str, program: str, target: str) -> Job:
    spec = as_program(spec_text, None)
    return Job(to_sexpr(spec.term), program, spec.out_axes, spec.inputs, target,
               knob_budget=1, timing=TimingProtocol(min_runs=1, min_seconds=0.0), random_settings=0)


def _gate(job: Job, cache_dir: Path) -> JobResult:
    """What the pipeline runs for the job's target: measured, or checked only."""
    return check_job(job, cache_dir) if job.target == "cuda" else run_job(job, cache_dir)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(PLANTED))
def test_planted_candidate_is_rejected(name: str, target: str, tmp_path: Path) -> None:
    spec, program, reason = PLANTED[name]
    r = _gate(_job(spec, program, target), tmp_path)
    assert not r.ok
    assert reason in r.error, r.error
    assert r.checked_on == gate_backend(target)
    if "overflows" in reason:
        assert f"overflows in float32 ({gate_backend(target)})" in r.error


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("spec", [LSE_SPEC, EXP_SPEC, SOFTMAX_SPEC, DOUBLE_SPEC])
def test_the_spec_itself_passes_the_gate(spec: str, target: str, tmp_path: Path) -> None:
    job = _job(spec, to_sexpr(as_program(spec, None).term), target)
    r = _gate(job, tmp_path)
    assert r.ok, r.error


@pytest.mark.parametrize("target", TARGETS)
def test_every_target_goes_through_the_one_gate(target: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def refuse(job: Job, exe: object, backend: str, cache_dir: Path | None = None) -> str:
        seen.append(backend)
        return "refused by the planted gate"

    monkeypatch.setattr(jobs, "ship_failure", refuse)
    spec = to_sexpr(as_program(LSE_SPEC, None).term)
    r = _gate(_job(LSE_SPEC, spec, target), tmp_path)
    assert not r.ok and "refused by the planted gate" in r.error
    assert seen == [gate_backend(target)]


def test_cuda_falls_back_to_numpy_without_gcc(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jobs, "_gpu_here", lambda: False)
    monkeypatch.setattr(jobs.shutil, "which", lambda name: None)
    assert gate_backend("cuda") == "numpy"
    assert gate_backend("c") == "c" and gate_backend("numpy") == "numpy"
    spec, program, _ = PLANTED["lse without the max"]
    r = check_job(_job(spec, program, "cuda"), tmp_path)
    assert not r.ok and "overflows in float32 (numpy)" in r.error


def test_a_spec_without_a_finite_reference_ships_nothing(tmp_path: Path) -> None:
    spec = "kernel k(N=16)\nin X[n:N] f32\nout Y[n] = log(X[n])"  # data inputs: negative
    with pytest.raises(OptimizeError, match="no candidate passed the checks"):
        optimize(spec, "cuda", seconds=20, trials=2, extract="greedy", cache_dir=tmp_path)
