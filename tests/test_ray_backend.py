"""The Ray backend: same answers as the local backend, every measurement cached once
under the worker's fingerprint, faults (a worker killed mid-job, a hanging job)
recovered and reported. One local Ray instance serves the whole module."""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from kernelsat.commands.backend_options import BackendOption, RayAddressOption, open_backend
from kernelsat.hardware.backends import make_backend, ray_available
from kernelsat.hardware.cache import MeasureCache
from kernelsat.hardware.jobs import Job, LocalBackend, lower_job, program_key
from kernelsat.hardware.measure import Measurement
from kernelsat.hardware.targets import get_target
from kernelsat.sexpr import to_sexpr
from kernelsat.spec import parse_spec

needs_ray = pytest.mark.skipif(
    not ray_available(),
    reason="Ray is not installed: the ray backend is the optional `distributed` extra "
           "(pip install 'kernelsat[distributed]')",
)

SOFTMAX = """kernel sm(R=16, N=64)
in x[r:R, n:N] f32
out y[r, n] = softmax(n: x[r, n])
"""

SCALE = "kernel k(R=16, N=64)\nin x[r:R, n:N] f32\nout y[r, n] = exp(x[r, n]) * {c}\n"

FAST: dict[str, Any] = {"min_runs": 3, "min_seconds": 0.005}


def scale_jobs(constants: list[int], **kw: object) -> list[Job]:
    """Small C jobs with distinct programs (one per constant)."""
    out = []
    for c in constants:
        p = parse_spec(SCALE.format(c=c), "<t>", {})
        spec = to_sexpr(p.term)
        out.append(Job(spec, spec, p.out_axes, p.inputs, "c", 2, 0, **FAST, **kw))
    return out


def cache_rows(cache_dir: Path) -> list[tuple[str, str, str, str]]:
    with sqlite3.connect(cache_dir / "measure.sqlite") as db:
        return db.execute("SELECT target, program, knobs, dtype FROM measurements").fetchall()


# -- without Ray ---------------------------------------------------------------------


def test_make_backend_rejects_bad_names_and_addresses() -> None:
    with pytest.raises(ValueError, match="unknown backend 'slurm'"):
        make_backend("slurm")
    with pytest.raises(ValueError, match="only for --backend ray"):
        make_backend("local", "head:6379")
    assert isinstance(make_backend("local"), LocalBackend)


def test_missing_ray_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import kernelsat.hardware.backends as backends

    monkeypatch.setattr(backends, "ray_available", lambda: False)
    with pytest.raises(ValueError, match=r"kernelsat\[distributed\]"):
        make_backend("ray")


def test_cli_options_exit_cleanly_on_a_bad_backend(tmp_path: Path) -> None:
    app = typer.Typer()

    @app.command()
    def go(backend: BackendOption = "local", ray_address: RayAddressOption = None) -> None:
        with open_backend(backend, ray_address, tmp_path) as b:
            typer.echo(f"backend {b.name}")

    run = CliRunner().invoke
    assert run(app, []).output.strip() == "backend local"
    bad = run(app, ["--backend", "mpi"])
    assert bad.exit_code == 1 and "unknown backend 'mpi'" in bad.output
    bad = run(app, ["--ray-address", "head:6379"])
    assert bad.exit_code == 1 and "only for --backend ray" in bad.output


def test_row_cache_serves_only_its_own_fingerprint() -> None:
    from kernelsat.hardware.ray_backend import RowCache

    m = Measurement(1.0, 1.0, 1.0, 3, 0.0, True)
    rc = RowCache("fp-here", "c:prog", {('{"k0":{"t":8}}', "float32"): m})
    assert rc.get("fp-here", "c:prog", {"k0": {"t": 8}}, "float32") == m
    assert rc.get("fp-elsewhere", "c:prog", {"k0": {"t": 8}}, "float32") is None
    assert rc.get("fp-here", "c:other", {"k0": {"t": 8}}, "float32") is None
    rc.put("fp-here", "c:prog", {"k0": {"t": 16}}, "float32", m)
    assert rc.measured == [("fp-here", "c:prog", {"k0": {"t": 16}}, "float32", m)]


# -- with one local Ray instance -----------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """A local Ray instance, started by the first backend (no address) and stopped by
    its close(); two timers on this one machine so that retries have somewhere to go."""
    if not ray_available():
        pytest.skip("Ray is not installed (the optional `distributed` extra)")
    import ray

    from kernelsat.hardware.ray_backend import RayBackend

    if ray.is_initialized():
        pytest.skip("Ray is already initialized in this process")
    backend = RayBackend(None, tmp_path_factory.mktemp("ray-cache"), workers_per_node=2)
    assert backend.owns_ray and len(backend.workers) == 2
    yield backend
    backend.close()
    assert not ray.is_initialized(), "a local Ray instance the backend started must stop"


def fresh(cluster, cache_dir: Path, **kw):
    """Another backend on the module's Ray instance (it neither starts nor stops Ray)."""
    from kernelsat.hardware.ray_backend import RayBackend

    b = RayBackend(None, cache_dir, workers_per_node=2, **kw)
    assert not b.owns_ray
    return b


class Prefilled:
    """Wraps a backend: before running, fills the cache with made-up, deterministic
    timings for every knob setting of every job, so that two runs search through the
    same figures and must choose alike (real timings differ by noise)."""

    def __init__(self, inner, cache_dir: Path) -> None:
        self.inner, self.cache_dir, self.name = inner, cache_dir, inner.name

    def run(self, jobs, progress=None):
        from kernelsat.hardware.cache import knobs_key
        from kernelsat.hardware.knobs import knob_table

        fp = get_target("cpu").fingerprint
        with MeasureCache(self.cache_dir / "measure.sqlite") as db:
            for job in jobs:
                lowered = lower_job(job)
                key = program_key(job, lowered)
                table = knob_table(lowered, get_target("cpu").backend)
                coords = [(k, n) for k, knobs in table.items() for n in knobs]
                for values in itertools.product(*(table[k][n] for k, n in coords)):
                    setting: dict = {k: {} for k in table}
                    for (k, n), v in zip(coords, values, strict=True):
                        setting[k][n] = v
                    digest = hashlib.sha256((key + knobs_key(setting)).encode()).digest()
                    t = 1e-4 * (1 + digest[0] / 64)
                    db.put(fp, key, setting, "float32", Measurement(t, t, t, 3, 0.0, True))
        return self.inner.run(jobs, progress)

    def close(self) -> None:
        self.inner.close()


OPTS: dict[str, Any] = dict(seconds=60, trials=3, knob_budget=2, samples=2, iters=4, nodes=2000,
            sat_seconds=5, seed=0, **FAST)


@needs_ray
def test_optimize_on_ray_caches_each_measurement_once(cluster, tmp_path: Path) -> None:
    from kernelsat.pipeline import optimize

    b = fresh(cluster, tmp_path)
    lines: list[str] = []
    try:
        result = optimize(parse_spec(SOFTMAX, "<t>", {}), "c", backend=b, cache_dir=tmp_path,
                          progress=lambda s, m: lines.append(m), **OPTS)
        workers = {w.name for w in b.workers}
        threads = {w.threads for w in b.workers}
    finally:
        b.close()
    # kernels time with the threads a local run has, not the one Ray gives its workers
    assert threads == {os.environ.get("OMP_NUM_THREADS") or str(os.cpu_count())}
    jobs = [c.job for c in result.candidates if c.job is not None]
    assert len(jobs) == 3 and all(r.ok and r.attempts == 1 for r in jobs)
    assert {r.worker for r in jobs} <= workers
    assert any("running" in m and "| w0" in m and "| w1" in m for m in lines)
    rows = cache_rows(tmp_path)  # each measurement once, under this machine's fingerprint
    assert len(rows) == len(set(rows)) == sum(r.measured for r in jobs) > 0
    assert {r[0] for r in rows} == {get_target("cpu").fingerprint}


@needs_ray
def test_optimize_on_ray_chooses_what_the_local_backend_chooses(cluster, tmp_path: Path) -> None:
    from kernelsat.pipeline import optimize

    program = parse_spec(SOFTMAX, "<t>", {})
    picks = []
    for name, backend in (("ray", fresh(cluster, tmp_path / "ray")),
                          ("local", LocalBackend(tmp_path / "local"))):
        runner = Prefilled(backend, tmp_path / name)
        try:
            r = optimize(program, "c", backend=runner, cache_dir=tmp_path / name, **OPTS)
        finally:
            runner.close()
        jobs = [c.job for c in r.candidates if c.job is not None]
        assert all(j.ok and j.measured == 0 for j in jobs)  # every figure from the cache
        picks.append((r.best.term.key, r.best.knobs, [(j.median, j.knobs) for j in jobs]))
    assert picks[0] == picks[1]


@needs_ray
def test_rows_are_keyed_by_the_workers_fingerprint(cluster, tmp_path: Path) -> None:
    (job,) = scale_jobs([3])
    key = program_key(job, lower_job(job))
    bogus = Measurement(1e-12, 1e-12, 1e-12, 1, 0.0, True)
    with MeasureCache(tmp_path / "measure.sqlite") as db:  # another machine's timings
        for t in (8, 16, 32, 64, 128, 256):
            for knobs in ({}, {"k0": {"tile": t}}):
                db.put("another-machine", key, knobs, "float32", bogus)
    b = fresh(cluster, tmp_path)
    try:
        (first,) = b.run([job])
        (again,) = b.run([job])
    finally:
        b.close()
    here = get_target("cpu").fingerprint
    assert first.ok and first.fingerprint == here and first.measured > 0
    assert first.median > 1e-9  # not the other machine's figure
    # the second run searched through the first run's rows (served by the driver; a
    # cached setting costs no budget) and measured new settings only
    mine = [r for r in cache_rows(tmp_path) if r[0] == here]
    assert again.measured > 0 and len(mine) == len(set(mine)) == first.measured + again.measured


@needs_ray
def test_worker_killed_mid_job_is_retried_and_nothing_is_lost(cluster, tmp_path: Path) -> None:
    from kernelsat.hardware.ray_backend import FaultPlan

    jobs = scale_jobs([2, 3, 4, 5, 6])
    victim = jobs[2]
    b = fresh(cluster, tmp_path, faults=FaultPlan(kill=frozenset({victim.key})))
    try:
        results = b.run(jobs)
        slots = [(s.name, s.state) for s in b.slots]
    finally:
        b.close()
    assert [r.job for r in results] == [j.key for j in jobs]
    assert all(r.ok and math.isfinite(r.median) for r in results)
    hit = results[2]
    assert hit.attempts == 2
    assert "worker died" in hit.history[0] and hit.history[1].endswith(": ok")
    assert hit.history[0].split()[3] != hit.worker  # retried on another worker
    assert all(r.attempts == 1 for i, r in enumerate(results) if i != 2)
    assert len(slots) == 2 and all(state != "dead" for _, state in slots)
    assert any("." in name for name, _ in slots)  # the dead worker was replaced
    assert any("worker died" in e for e in b.events)
    assert len(cache_rows(tmp_path)) == sum(r.measured for r in results)


@needs_ray
def test_hanging_job_times_out_and_the_failure_is_recorded(cluster, tmp_path: Path) -> None:
    from kernelsat.hardware.ray_backend import FaultPlan

    jobs = scale_jobs([7, 8, 9], timeout_s=30.0)
    stuck = scale_jobs([10], timeout_s=2.0)[0]
    b = fresh(cluster, tmp_path, max_attempts=2, faults=FaultPlan(hang=frozenset({stuck.key})))
    try:
        bad = replace(jobs[0], program="(exp (In x r:16 n:64)")  # does not parse
        results = b.run([jobs[0], stuck, *jobs[1:], bad])
        slots = [(s.name, s.state) for s in b.slots]
    finally:
        b.close()
    assert len(results) == 5
    # a program that fails is a result, not a fault: reported once, not retried
    assert not results[4].ok and results[4].attempts == 1 and results[4].error
    hung = results[1]
    assert not hung.ok and hung.attempts == 2 and len(hung.history) == 2
    assert "timed out after 2 s" in hung.error and "gave up after 2 attempts" in hung.error
    assert all("timed out" in h for h in hung.history)
    others = [results[0], *results[2:4]]
    assert all(r.ok and r.attempts == 1 for r in others)
    assert len(slots) == 2 and all(state != "dead" for _, state in slots)
    assert sum(name.count(".") for name, _ in slots) == 2  # each timeout replaced a worker
    assert len(cache_rows(tmp_path)) == sum(r.measured for r in others)
