"""`kernelsat run --target` runs the spec (or a program) through a code generator."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelsat.cli import app

SPEC = "kernel sm(M=8, N=32)\nin X[i:M, n:N] f32\nout Y[i, n] = softmax(n: X[i, n])\n"


@pytest.mark.parametrize("target", ["reference", "numpy", "c"])
def test_run_on_each_cpu_target_matches_float64(tmp_path: Path, target: str) -> None:
    spec = tmp_path / "sm.ks"
    spec.write_text(SPEC)
    res = CliRunner().invoke(app, ["run", str(spec), "--target", target])
    assert res.exit_code == 0, res.output
    err = float(res.output.split("relative L2 error ")[1].split()[0])
    assert err < 1e-5


def test_run_a_program_file_instead_of_the_spec(tmp_path: Path) -> None:
    spec = tmp_path / "sm.ks"
    spec.write_text(SPEC)
    prog = tmp_path / "p.sexpr"
    prog.write_text("(let ((%0 (In X i:8 n:32))) (exp (sub %0 (LSE n %0))))")
    res = CliRunner().invoke(app, ["run", str(spec), "--target", "c", "--program", str(prog)])
    assert res.exit_code == 0, res.output
    assert float(res.output.split("relative L2 error ")[1].split()[0]) < 1e-5
    prog.write_text("(In X i:8)")
    res = CliRunner().invoke(app, ["run", str(spec), "--program", str(prog)])
    assert res.exit_code == 1 and "differs from the spec" in res.output


@pytest.mark.skipif(shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
                    reason="nvcc is not installed")
def test_run_cuda_without_a_gpu_compiles_and_says_so(tmp_path: Path) -> None:
    spec = tmp_path / "sm.ks"
    spec.write_text(SPEC)
    res = CliRunner().invoke(app, ["run", str(spec), "--target", "cuda"])
    assert res.exit_code == 0, res.output
    assert "nothing was run" in res.output
