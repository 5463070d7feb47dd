"""The Ray backend: same answers as the local backend, every measurement cached once
under the worker's fingerprint, faults (a worker killed mid-job, a hanging job)
recovered and reported. One local Ray instance serves the whole module."""

from __future__ import annotations

import hashlib
import math
import os
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from kernelsat.driver.backends import make_backend, ray_available
from kernelsat.driver.commands.backend_options import BackendOption, RayAddressOption, open_backend
from kernelsat.driver.jobs import Job, LocalBackend, lower_job, program_key
from kernelsat.hardware.cache import MeasureCache
from kernelsat.hardware.measure import Measurement, TimingProtocol
from kernelsat.hardware.targets import get_target
from kernelsat.sexpr import to_sexpr
from kernelsat.spec import parse_spec

needs_ray = pytest.mark.skipif(
    not ray_available(),
    reason="Ray is not installed: the ray backend is the optional `distributed` extra "
           "(pip install 'kernelsat[distributed]')",
)

RMSNORM = """kernel rn(R=16, N=64)
in x[r:R, n:N] f32
out y[r, n] = rmsnorm(n: x[r, n])
"""
"""A spec whose candidates all pass the overflow check (softmax's that drop its max
would not: those failures are tested below)."""

SCALE = "kernel k(R=16, N=64)\nin x[r:R, n:N] f32\nout y[r, n] = exp(x[r, n]) * {c}\n"

FAST: dict[str, Any] = {"timing": TimingProtocol(min_runs=3, min_seconds=0.005)}


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
    import kernelsat.driver.backends as backends

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


def test_local_backend_compiles_a_batch_ahead_then_times_it(tmp_path: Path) -> None:
    """build_workers > 1: every setting the timing run will try is compiled before any
    timing starts (the timing run then finds them built); results equal a serial run."""
    jobs = scale_jobs([3, 5, 7], random_settings=1)
    ahead = LocalBackend(tmp_path / "ahead", build_workers=2)
    try:
        ahead.prebuild(jobs)
        built = set((tmp_path / "ahead" / "c").glob("ks_*.so"))
        assert len(built) == 2 * len(jobs)  # default + one random setting each
        results = ahead.run(jobs)
    finally:
        ahead.close()
    assert set((tmp_path / "ahead" / "c").glob("ks_*.so")) == built  # nothing compiled late
    serial = LocalBackend(tmp_path / "serial").run(jobs)
    assert all(r.ok for r in results + serial)
    assert [r.job for r in results] == [r.job for r in serial] == [j.key for j in jobs]


def test_dead_build_workers_cost_the_head_start_not_a_hang(tmp_path: Path) -> None:
    """Build workers killed by SIGTERM (a process-group kill, the OOM killer) neither
    hang `prebuild` nor `close` (a multiprocessing.Pool hung in both); the timing run
    compiles what was not built, and a later prebuild starts a fresh pool."""
    import os
    import signal
    import threading

    jobs = scale_jobs([3, 5, 7])
    backend = LocalBackend(tmp_path, build_workers=2)
    backend.prebuild(jobs[:2])
    for pid in list(backend._pool._processes):  # the workers, to kill them
        os.kill(pid, signal.SIGTERM)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (backend.prebuild(jobs), done.set()),
                              daemon=True)
    worker.start()
    worker.join(120)
    assert done.is_set(), "prebuild hung on a pool whose workers were killed"
    results = backend.run(jobs)
    assert all(r.ok for r in results) and [r.job for r in results] == [j.key for j in jobs]
    backend.prebuild(scale_jobs([9, 11]))  # a fresh pool
    closed = threading.Thread(target=backend.close, daemon=True)
    for pid in list(backend._pool._processes):
        os.kill(pid, signal.SIGTERM)
    closed.start()
    closed.join(60)
    assert not closed.is_alive() and backend._pool is None, "close hung on dead workers"


def test_a_retime_job_times_its_setting_afresh_outside_the_cache(tmp_path: Path) -> None:
    """Job.retime: the given knob setting only, timed again (no search); the measurement
    cache is neither read (a second opinion) nor written."""
    import json
    from dataclasses import replace

    backend = LocalBackend(tmp_path)
    first = backend.run(scale_jobs([3]))[0]
    rows = cache_rows(tmp_path)
    assert first.ok and first.knobs
    again = replace(scale_jobs([3])[0], retime=json.dumps(first.knobs))
    assert again.key != scale_jobs([3])[0].key
    results = backend.run([again, again])
    for r in results:  # the same setting, the same source, timed once each
        assert r.ok and r.measured == 1 and r.runs >= FAST["timing"].min_runs
        assert json.dumps(r.knobs) == json.dumps(first.knobs) and r.source == first.source
    assert cache_rows(tmp_path) == rows


LOGSUMEXP = """kernel lse(M=8, N=64)
in X[i:M, n:N] f32
out Y[i] = max(n: X[i, n]) + log(sum(n: exp(X[i, n] - max(n: X[i, n]))))
"""


@pytest.mark.parametrize("target", ["c", "numpy"])
def test_a_program_that_overflows_where_the_spec_does_not_fails(tmp_path: Path,
                                                                 target: str) -> None:
    """log(sum(exp(x))) equals the max-subtracted logsumexp over the reals and matches it
    on the usual inputs (magnitudes ~1), but overflows float32 on inputs 100x larger,
    where the spec does not: it fails, every time (the cached row does not hide it)."""
    p = parse_spec(LOGSUMEXP, "<t>", {})
    spec = to_sexpr(p.term)
    unstable = "(log (Sum n (exp (In X i:8 n:64))))"
    backend = LocalBackend(tmp_path)
    jobs = [Job(spec, prog, p.out_axes, p.inputs, target, 1, 0, **FAST)
            for prog in (spec, unstable)]
    for _ in range(2):
        stable, overflowing = backend.run(jobs)
        assert stable.ok, stable.error
        assert not overflowing.ok
        assert f"overflows in float32 ({target}): 8 of 8 outputs" in overflowing.error
        assert "over the reals" in overflowing.error


def test_where_the_spec_itself_overflows_nothing_more_is_asked(tmp_path: Path) -> None:
    """exp(x) * 3 overflows float32 on the stress inputs in the spec too: 3 * exp(x), its
    rewrite, is not blamed for it."""
    p = parse_spec(SCALE.format(c=3), "<t>", {})
    spec = to_sexpr(p.term)
    swapped = spec.replace("(mul (exp (In x r:16 n:64)) (Const 3.0))",
                        "(mul (Const 3.0) (exp (In x r:16 n:64)))")
    assert swapped != spec
    result = LocalBackend(tmp_path).run([Job(spec, swapped, p.out_axes, p.inputs, "c", 1, 0,
                                             **FAST)])[0]
    assert result.ok, result.error


def test_row_cache_serves_only_its_own_fingerprint() -> None:
    from kernelsat.driver.ray_backend import RowCache

    m = Measurement(1.0, 1.0, 1.0, 3, 0.0, True)
    rc = RowCache("fp-here", "c:prog", {('{"k0":{"t":8}}', "float32"): m})
    assert rc.get("fp-here", "c:prog", {"k0": {"t": 8}}, "float32") == m
    assert rc.get("fp-elsewhere", "c:prog", {"k0": {"t": 8}}, "float32") is None
    assert rc.get("fp-here", "c:other", {"k0": {"t": 8}}, "float32") is None
    rc.put("fp-here", "c:prog", {"k0": {"t": 16}}, "float32", m)
    rc.put("fp-here", "c:prog", {"k0": {"t": 32}}, "float32", m, features={"predicted": 1.0})
    assert rc.measured == [("fp-here", "c:prog", {"k0": {"t": 16}}, "float32", m, None),
                           ("fp-here", "c:prog", {"k0": {"t": 32}}, "float32", m,
                            {"predicted": 1.0})]  # the schedule features travel with the row


# -- with one local Ray instance -----------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    """A local Ray instance, started by the first backend (no address) and stopped by
    its close(); two timers on this one machine so that retries have somewhere to go."""
    if not ray_available():
        pytest.skip("Ray is not installed (the optional `distributed` extra)")
    import ray

    from kernelsat.driver.ray_backend import RayBackend

    if ray.is_initialized():
        pytest.skip("Ray is already initialized in this process")
    backend = RayBackend(None, tmp_path_factory.mktemp("ray-cache"), workers_per_node=2)
    assert backend.owns_ray and len(backend.workers) == 2
    yield backend
    backend.close()
    assert not ray.is_initialized(), "a local Ray instance the backend started must stop"


def fresh(cluster, cache_dir: Path, **kw):
    """Another backend on the module's Ray instance (it neither starts nor stops Ray)."""
    from kernelsat.driver.ray_backend import RayBackend

    b = RayBackend(None, cache_dir, workers_per_node=2, **kw)
    assert not b.owns_ray
    return b


class Recorded:
    """Wraps a backend: records every job it runs and the job's result, in order."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name
        self.seen: list[tuple[Job, Any]] = []

    def run(self, jobs, progress=None):
        results = self.inner.run(jobs, progress)
        self.seen += zip(jobs, results, strict=True)
        return results

    def close(self) -> None:
        self.inner.close()


def _never_timed(setting: dict) -> Measurement:
    raise AssertionError(f"a prefilled search timed {setting}")


class Prefilled(Recorded):
    """Wraps a backend: before running, fills the cache with made-up, deterministic
    timings for every knob setting each job's search will look at (found by running the
    same search over the made-up figures), so that two runs search through the same
    figures, time nothing and must choose alike (real timings differ by noise)."""

    def __init__(self, inner, cache_dir: Path) -> None:
        super().__init__(inner)
        self.cache_dir = cache_dir
        self.prefilled = 0  # rows written (a setting once per program)

    def run(self, jobs, progress=None):
        from kernelsat.hardware.cache import knobs_key
        from kernelsat.hardware.knobs import plan, search

        fp = get_target("cpu").fingerprint
        with MeasureCache(self.cache_dir / "measure.sqlite") as db:
            for job in jobs:
                try:
                    lowered = lower_job(job)
                except Exception:  # fails alike on every backend
                    continue
                key = program_key(get_target(job.target), lowered)

                def made_up(setting: dict, key: str = key) -> Measurement:
                    digest = hashlib.sha256((key + knobs_key(setting)).encode()).digest()
                    t = 1e-4 * (1 + digest[0] / 64)
                    return Measurement(t, t, t, 3, 0.0, True)

                looked: dict[str, dict] = {}

                def lookup(setting: dict, looked: dict = looked, made_up=made_up) -> Measurement:
                    looked[knobs_key(setting)] = setting
                    return made_up(setting)

                # the search `run_job` makes, every figure served (as the cache will)
                found = plan(lowered, get_target(job.target), job.knob_budget, job.seed)
                search(found.table, _never_timed, budget=job.knob_budget, seed=job.seed,
                       lookup=lookup, n_random=job.random_settings, ranked=found.ranked,
                       predict=found.predict)
                for setting in looked.values():
                    if db.get(fp, key, setting, "float32") is None:
                        db.put(fp, key, setting, "float32", made_up(setting))
                        self.prefilled += 1
        return super().run(jobs, progress)


OPTS: dict[str, Any] = dict(seconds=60, trials=3, knob_budget=2, samples=2, iters=4, nodes=2000,
            sat_seconds=5, seed=0, **FAST)


@needs_ray
def test_optimize_on_ray_caches_each_measurement_once(cluster, tmp_path: Path) -> None:
    from kernelsat.driver.pipeline import optimize

    b = fresh(cluster, tmp_path)
    lines: list[str] = []
    try:
        result = optimize(parse_spec(RMSNORM, "<t>", {}), "c", backend=b, cache_dir=tmp_path,
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
    from kernelsat.driver.pipeline import optimize

    program = parse_spec(RMSNORM, "<t>", {})
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


def short_train(backend, corpus: Path, out: Path, monkeypatch: pytest.MonkeyPatch,
                episodes: int = 12) -> dict[str, Any]:
    """`kernelsat train`'s loop for a few episodes, batch 4, knob budget 1: the program
    each episode chose, each episode's reward, the final parameters and reward log."""
    from kernelsat.extract.rl_policy import Policy
    from kernelsat.learning import rl_rollouts, rl_train

    picks: list[str] = []
    rewards: list[float] = []
    rollout, update = rl_rollouts.rollout, rl_train.update

    def recording_rollout(env, policy, rng, temperature=1.0):
        decisions, reward, info = rollout(env, policy, rng, temperature)
        picks.append(info["term"].key)
        return decisions, reward, info

    def recording_update(policy, adam, batch, cfg) -> None:
        rewards.extend(r for _, r in batch)
        update(policy, adam, batch, cfg)

    # saturation stops on its node and iteration limits, never on the clock
    ms = replace(rl_train.TRAIN_OPTIONS, knob_budget=1, iters=3, nodes=400, sat_seconds=120.0,
                 timing=TimingProtocol(min_runs=3, min_seconds=0.005))
    with monkeypatch.context() as m:
        m.setattr(rl_rollouts, "rollout", recording_rollout)  # train's rollouts run here
        m.setattr(rl_train, "update", recording_update)
        done = rl_train.train(corpus, out, episodes=episodes, ms=ms,
                              cfg=rl_train.TrainConfig(batch=4, hidden=8, seed=0),
                              backend=backend, progress=lambda _: None,
                              joint=False)  # programs through the cached knob search
    assert done["episodes"] == episodes and len(picks) == len(rewards) == episodes
    policy, adam = Policy.load(out)
    return {"picks": picks, "rewards": rewards, "params": policy.params, "adam": adam,
            "rng": policy.meta["rng"],
            "log": out.with_suffix(".rewards.jsonl").read_text().splitlines()}


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """Three small generated training specs (a reduction, two normalizations)."""
    from kernelsat.learning.corpus import write_corpus

    write_corpus(tmp_path / "corpus", 3, seed=4)
    return tmp_path / "corpus"


@needs_ray
def test_train_on_ray_caches_each_measurement_once(cluster, corpus: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    b = Recorded(fresh(cluster, tmp_path / "cache"))
    try:
        short_train(b, corpus, tmp_path / "policy.npz", monkeypatch, episodes=8)
    finally:
        b.close()
    results = [r for _, r in b.seen]
    assert all(r.attempts == 1 for r in results)  # a failure is a result, not a retry
    # the softmax spec's candidates that drop its max overflow on the stress inputs
    assert all(r.ok or "overflows in float32" in r.error for r in results)
    assert sum(r.ok for r in results) > 3
    assert len({j.program for j, _ in b.seen}) == len(b.seen)  # a program sent once
    rows = cache_rows(tmp_path / "cache")  # each measurement once, under this machine's
    assert len(rows) == len(set(rows)) == sum(r.measured for r in results) > 0
    assert {r[0] for r in rows} == {get_target("cpu").fingerprint}


@needs_ray
def test_train_on_ray_chooses_what_the_local_backend_chooses(
        cluster, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = {}
    for name, backend in (("ray", fresh(cluster, tmp_path / "ray")),
                          ("local", LocalBackend(tmp_path / "local"))):
        runner = Prefilled(backend, tmp_path / name)
        try:
            runs[name] = short_train(runner, corpus, tmp_path / name / "policy.npz",
                                     monkeypatch)
        finally:
            runner.close()
        results = [r for _, r in runner.seen]
        assert all(r.measured == 0 for r in results)  # every figure from the cache
        # the corpus softmax's candidates that drop its max fail the overflow check
        assert all(r.ok or "overflows in float32" in r.error for r in results)
        runs[name]["jobs"] = [(j.program, r.median, r.knobs) for j, r in runner.seen]
        rows = cache_rows(tmp_path / name)  # nothing timed, nothing written twice
        assert len(rows) == len(set(rows)) == runner.prefilled > 0
    ray, local = runs["ray"], runs["local"]
    assert len(set(local["picks"])) > 1 and len(set(local["rewards"])) > 1
    for key in ("picks", "rewards", "jobs", "log", "rng"):
        assert ray[key] == local[key], key
    for params in ("params", "adam"):
        assert ray[params].keys() == local[params].keys()
        for k in local[params]:
            np.testing.assert_array_equal(ray[params][k], local[params][k], err_msg=k)


@needs_ray
def test_rows_are_keyed_by_the_workers_fingerprint(cluster, tmp_path: Path) -> None:
    (job,) = scale_jobs([3])
    key = program_key(get_target(job.target), lower_job(job))
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
    # the second run replayed the first run's search from the rows the driver serves (a
    # cached setting counts against the knob budget like a measured one), timing nothing
    mine = [r for r in cache_rows(tmp_path) if r[0] == here]
    assert again.ok and again.measured == 0 and again.knobs == first.knobs
    assert again.median == first.median
    assert len(mine) == len(set(mine)) == first.measured


@needs_ray
def test_worker_killed_mid_job_is_retried_and_nothing_is_lost(cluster, tmp_path: Path) -> None:
    from kernelsat.driver.ray_backend import FaultPlan

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
    from kernelsat.driver.ray_backend import FaultPlan

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


def test_a_workers_rows_follow_the_jobs_target() -> None:
    """A job names its target; a worker serves and records its rows under its own
    fingerprint for that target (numpy and C timings of one CPU are different rows)."""
    from kernelsat.driver.ray_backend import WorkerInfo

    fps = {name: get_target(name).fingerprint for name in ("c", "numpy")}
    info = WorkerInfo("w", "host", 1, "node", fps["c"], fingerprints=fps)
    c_job, numpy_job = (replace(scale_jobs([2])[0], target=t) for t in ("c", "numpy"))
    assert info.fingerprint_for(c_job) == fps["c"] != fps["numpy"]
    assert info.fingerprint_for(numpy_job) == fps["numpy"]
