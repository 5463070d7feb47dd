"""The protocol with the real codegen executables, and the CLI commands."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from kernelsat.cli import app
from kernelsat.hardware.bench import bench_term, format_table
from kernelsat.hardware.cache import MeasureCache
from kernelsat.hardware.knobs import is_legal, knob_table, tune
from kernelsat.hardware.measure import random_inputs
from kernelsat.hardware.targets import get_target
from kernelsat.ir import In, Max, Store, Sum, div, exp, sub

codegen = pytest.importorskip("kernelsat.codegen")
FAST = {"min_runs": 2, "min_seconds": 0.0, "warmup": 1, "flush_cache": False}


def softmax_term():
    x = In("x", (("i", 16), ("n", 32)))
    e = Store(exp(sub(x, Max("n", x))))
    return div(e, Sum("n", e))


def test_bench_numpy_backend(tmp_path: Path) -> None:
    term = softmax_term()
    inputs = random_inputs({"x": (16, 32)})
    with MeasureCache(tmp_path / "m.sqlite") as db:
        r = bench_term(term, ("i", "n"), inputs, get_target("numpy"), cache=db, **FAST)
        assert r.measurement.ok, r.measurement.failure
        assert len(r.kernels) == 2 and db.stats().rows == 1
    assert "total" in format_table(r)


@pytest.mark.slow
def test_tune_c_backend(tmp_path: Path) -> None:
    term = softmax_term()
    lowered = codegen.lower(term, ("i", "n"))
    inputs = random_inputs({"x": (16, 32)})
    from kernelsat.hardware.bench import reference

    ref = reference(term, ("i", "n"), inputs)
    target = get_target("c")
    with MeasureCache(tmp_path / "m.sqlite") as db:
        r = tune(lowered, target, inputs, (16, 32), ref, program_key=lowered.key, budget=3,
                 n_random=1, cache=db, measure_kwargs=FAST)
    assert r.measured <= 3 and r.best_measurement is not None and r.best_measurement.ok
    assert is_legal(knob_table(lowered, "c"), r.best)


def test_cli_targets() -> None:
    result = CliRunner().invoke(app, ["targets"])
    assert result.exit_code == 0 and "h100" in result.output and "mi300x" in result.output
    result = CliRunner().invoke(app, ["targets", "--json"])
    assert result.exit_code == 0 and '"fingerprint"' in result.output


def test_cli_bench_numpy(tmp_path: Path) -> None:
    spec = tmp_path / "sm.ks"
    spec.write_text("kernel sm(M=8, N=16)\nin X[i:M, n:N] f32\n"
                    "out Y[i, n] = softmax(n: X[i, n])\n")
    result = CliRunner().invoke(app, ["bench", str(spec), "--target", "numpy", "-p", "M=4",
                                      "--min-runs", "2", "--min-seconds", "0", "--no-flush",
                                      "--cache", str(tmp_path / "m.sqlite")])
    assert result.exit_code == 0, result.output
    assert "total" in result.output and "M=4" in result.output
    bad = CliRunner().invoke(app, ["bench", str(spec), "--target", "tpu"])
    assert bad.exit_code == 2


def test_random_inputs_are_not_constant() -> None:
    x = random_inputs({"a": (3, 3)}, seed=5)["a"]
    assert len(np.unique(x)) == 9
