"""`kernelsat optimize`, end to end: every spec, the library API, and bad inputs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kernelsat import optimize, verify
from kernelsat.cli import app
from kernelsat.codegen import run_program
from kernelsat.hardware.measure import TimingProtocol
from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as
from kernelsat.spec import load_spec
from kernelsat.testing import relative_error

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = "kernel sm(M=16, N=64)\nin X[i:M, n:N] f32\nout Y[i, n] = softmax(n: X[i, n])\n"
SPECS = sorted(ROOT.glob("specs/*.ks"))
SMALL = dict(seconds=60, trials=3, knob_budget=1, samples=4, ilp_seconds=5.0,
             timing=TimingProtocol(min_runs=3, min_seconds=0.01))


def _small_params(path: Path) -> dict[str, int]:
    """Every size parameter capped at 64 (the attention head dim stays 64)."""
    return {k: min(v, 64) for k, v in load_spec(str(path)).params.items()}


@pytest.mark.slow
@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_optimize_every_spec_proves_runs_and_never_loses_to_eager(path: Path, tmp_path: Path):
    program = load_spec(str(path), _small_params(path))
    result = optimize(program, "c", cache_dir=tmp_path / "cache", **SMALL)
    best = result.best
    assert best.proved and best.certificate is not None
    assert verify(best.certificate.to_json()).accepted
    assert result.eager.measurement is not None
    if best is not result.eager:  # faster than eager where the two were timed side by side
        gate = result.gate
        assert gate is not None and gate.passed and gate.winner_median < gate.eager_median
    env = random_inputs(program, seed=11)
    got = run_program(best.term, program.out_axes,
                      {k: v.astype(np.float32) for k, v in env.items()}, "c")
    want = evaluate_as(program.term, env, program.out_axes)
    assert relative_error(got, want) < 1e-4


def test_cli_optimize_writes_everything_and_verify_accepts(tmp_path: Path) -> None:
    spec = tmp_path / "sm.ks"
    spec.write_text(SOFTMAX)
    out = tmp_path / "out"
    runner = CliRunner()
    res = runner.invoke(app, ["optimize", str(spec), "--out", str(out), "--trials", "2",
                              "--knob-budget", "1", "--samples", "3",
                              "--cache-dir", str(tmp_path / "c")])
    assert res.exit_code == 0, res.output
    names = {p.name for p in out.iterdir()}
    assert {"best.sexpr", "kernel.c", "certificate.json", "report.md", "report.json",
            "speedup.png"} <= names
    report = json.loads((out / "report.json").read_text())
    assert report["candidates"] and report["best"]["proof"] in ("accepted", "eager")
    res = runner.invoke(app, ["verify", str(out / "certificate.json")])
    assert res.exit_code == 0 and "ACCEPTED" in res.output


def test_cuda_target_without_gpu_writes_source_and_says_nothing_was_timed(tmp_path: Path):
    spec = tmp_path / "sm.ks"
    spec.write_text(SOFTMAX)
    res = CliRunner().invoke(app, ["optimize", str(spec), "--target", "cuda", "--out",
                                   str(tmp_path / "o"), "--samples", "2"])
    assert res.exit_code == 0, res.output
    assert "nothing was timed" in res.output
    assert "__global__" in (tmp_path / "o" / "kernel.cu").read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["optimize", "missing.ks"], "cannot read"),
        (["optimize", "{bad}"], "expected"),
        (["optimize", "{good}", "--target", "tpu"], "unknown target"),
        (["optimize", "{good}", "--seconds", "0"], "not positive"),
        (["optimize", "{good}", "--trials", "0"], "--trials"),
        (["optimize", "{good}", "--out", "{unwritable}/x"], "cannot write"),
    ],
)
def test_bad_inputs_fail_cleanly_and_leave_no_output(tmp_path: Path, args, message) -> None:
    good = tmp_path / "good.ks"
    good.write_text("kernel k(N=8)\nin x[n:N] f32\nout y[n] = exp(x[n])\n")
    bad = tmp_path / "bad.ks"
    bad.write_text("kernel k(N=8)\nin x[n:N] f32\nout y[n] = exp(x[n]\n")
    locked = tmp_path / "locked"
    locked.mkdir()
    os.chmod(locked, 0o500)
    out = tmp_path / "out"
    subst = {"{good}": str(good), "{bad}": str(bad), "{unwritable}": str(locked)}
    argv = [subst.get(a, a).replace("{unwritable}", str(locked)) for a in args]
    if "--out" not in argv:
        argv += ["--out", str(out)]
    if os.geteuid() == 0 and "{unwritable}/x" in args:
        # root ignores permission bits: use a path under a regular file instead
        blocker = tmp_path / "file"
        blocker.write_text("")
        argv[argv.index("--out") + 1] = str(blocker / "x")
    res = CliRunner().invoke(app, argv)
    assert res.exit_code != 0
    assert message in res.output
    assert "Traceback" not in res.output
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]


def test_library_api_takes_user_rules_and_verifies_them(tmp_path: Path) -> None:
    from kernelsat.proofs.library import UnverifiedRuleError

    spec = "kernel k(N=16)\nin x[n:N] f32\nout y[n] = x[n] * 2\n"
    good = "my-double: (mul ?x (Const 2.0)) => (add ?x ?x) [user]"
    result = optimize(spec, "numpy", rules=[good], cache_dir=tmp_path, **SMALL)
    assert result.best.proved
    assert any(name.startswith("my-double") for name in result.saturation.matches)
    bad = "bad-double: (mul ?x (Const 2.0)) => (add ?x (Const 1.0)) [user]"
    with pytest.raises(UnverifiedRuleError):
        optimize(spec, "numpy", rules=[bad], cache_dir=tmp_path, **SMALL)


def test_a_gpu_target_is_chosen_once_and_reaches_codegen_cost_model_and_report(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`optimize(target=...)` means that GPU: CUDA for its arch, its roofline figures,
    its name in the result; a GPU added to the table needs nothing else; "cuda" is the
    default GPU."""
    from dataclasses import replace

    from kernelsat.driver.pipeline import lowered_estimate
    from kernelsat.hardware.targets import DEFAULT_GPU, GPU_TARGETS

    new = replace(GPU_TARGETS["h200"], name="x900", model="X900", arch="sm_120",
                  mem_bandwidth=40 * GPU_TARGETS["h200"].mem_bandwidth)
    monkeypatch.setitem(GPU_TARGETS, "x900", new)
    runs = {name: optimize(SOFTMAX, name, seconds=20, trials=2, extract="greedy",
                           cache_dir=tmp_path)
            for name in ("h200", "x900", "cuda")}
    for name, hw in (("h200", GPU_TARGETS["h200"]), ("x900", new),
                     ("cuda", GPU_TARGETS[DEFAULT_GPU])):
        r = runs[name]
        assert r.target is hw and not r.timed
        assert r.best.source.startswith(f"// kernelsat CUDA source ({hw.arch})")
        assert r.best.estimate == lowered_estimate(r.best.term, r.program, hw)
        assert f"target {hw.name}" in r.summary() and hw.model in " ".join(r.notes)
    eager = {name: runs[name].eager.estimate for name in runs}
    assert eager["x900"] < eager["h200"] < eager["cuda"]  # bandwidth: 40x, 4.8 vs 3.35 TB/s


def test_a_target_without_code_generation_is_refused_by_name() -> None:
    from kernelsat.driver.pipeline import OptimizeError

    with pytest.raises(OptimizeError, match="mi300x: kernelsat generates no hip code"):
        optimize(SOFTMAX, "mi300x")
    with pytest.raises(OptimizeError, match=r"unknown target 'tpu': expected one of .*h200"):
        optimize(SOFTMAX, "tpu")
