"""The measurement cache never replays a timing of code an older code generator wrote:
the program key carries the code generator's version."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelsat.driver import jobs
from kernelsat.driver.jobs import Job, codegen_version, lower_job, program_key, run_job
from kernelsat.hardware.measure import TimingProtocol
from kernelsat.hardware.targets import get_target
from kernelsat.sexpr import to_sexpr
from kernelsat.spec import parse_spec

FAST = TimingProtocol(min_runs=2, min_seconds=0.0, warmup=1)


def _job() -> Job:
    p = parse_spec("kernel k(N=32)\nin x[n:N] f32\nout y[n] = exp(x[n]) * 3\n", "<t>", {})
    spec = to_sexpr(p.term)
    return Job(spec, spec, p.out_axes, p.inputs, "numpy", 1, 0, timing=FAST)


def test_the_program_key_names_the_code_generators_version() -> None:
    job = _job()
    key = program_key(get_target(job.target), lower_job(job))
    version = codegen_version()
    assert len(version) == 12 and int(version, 16) >= 0
    assert key.split(":")[1] == version and codegen_version() == version


def test_a_changed_code_generator_measures_again(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    job = _job()
    first = run_job(job, tmp_path)
    again = run_job(job, tmp_path)
    assert first.ok and first.measured == 1 and again.ok and again.measured == 0  # replayed
    monkeypatch.setattr(jobs, "codegen_version", lambda: "0123456789ab")
    changed = run_job(job, tmp_path)
    assert changed.ok and changed.measured == 1
