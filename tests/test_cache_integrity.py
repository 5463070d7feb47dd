"""Cache files never stop a run and never fail silently: damaged ones are moved aside and
rebuilt, unwritable ones are run without, each with a warning naming the file; older
schemas are migrated in place; timings taken under load are not replayed."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from kernelsat.cachefile import check_cache_dir, read_json_cache, write_json_cache
from kernelsat.cli import app
from kernelsat.driver.jobs import Job, run_job
from kernelsat.hardware import probe as probe_mod
from kernelsat.hardware.cache import LOADED_FACTOR, MeasureCache
from kernelsat.hardware.measure import Measurement, TimingProtocol
from kernelsat.sexpr import to_sexpr
from kernelsat.spec import parse_spec

SPEC = "kernel k(N=16)\nin x[n:N] f32\nout y[n] = exp(x[n]) * 2\n"
SMALL = ["--target", "numpy", "--trials", "2", "--knob-budget", "1", "--samples", "2",
         "--seconds", "30", "--iters", "2"]


def m(median: float = 1e-3, probe: float = math.nan, ok: bool = True) -> Measurement:
    return Measurement(median, median, median, 3, 0.0, ok, "" if ok else "failed", probe=probe)


def filled(path: Path, rows: int = 200) -> None:
    with MeasureCache(path) as db:
        for i in range(rows):
            db.put("fp", "prog", {"i": i}, "float32", m(1e-3 * (i + 1)))
    with sqlite3.connect(path) as conn:  # everything into the main file
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def aside(folder: Path, name: str = "measure.sqlite") -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith(f"{name}.corrupt-")
                  and not p.name.endswith(("-wal", "-shm")))  # SQLite's companions go along


# -- the measurement database ----------------------------------------------------------------


@pytest.mark.parametrize("damage", ["garbage", "page", "truncated-header"])
def test_a_damaged_database_is_moved_aside_and_rebuilt(
        damage: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "measure.sqlite"
    filled(path)
    data = bytearray(path.read_bytes())
    if damage == "garbage":
        data = bytearray(b"this is not a database" * 100)
    elif damage == "page":
        data[4096 * 2: 4096 * 2 + 3000] = b"\xab" * 3000
    else:
        data[:16] = b"SQLite format 2\0"
    path.write_bytes(bytes(data))
    with MeasureCache(path) as db:
        assert db.persistent
        db.put("fp", "prog", {}, "float32", m())
        assert db.get("fp", "prog", {}, "float32") == m()
    (moved,) = aside(tmp_path)
    assert moved.read_bytes() == bytes(data)  # kept as it was, for whoever wants to look
    err = capsys.readouterr().err
    assert str(path) in err and str(moved) in err and "damaged" in err
    with MeasureCache(path) as db:  # the rebuilt one is fine: nothing more moved
        assert db.stats().rows == 1
    assert len(aside(tmp_path)) == 1


def test_an_old_schema_gains_the_probe_column_and_keeps_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "measure.sqlite"
    with sqlite3.connect(path) as conn:  # the schema before load probes
        conn.execute("""CREATE TABLE measurements (target TEXT NOT NULL, program TEXT NOT NULL,
            knobs TEXT NOT NULL, dtype TEXT NOT NULL, median REAL, q1 REAL, q3 REAL,
            runs INTEGER NOT NULL, rel_err REAL, ok INTEGER NOT NULL, failure TEXT NOT NULL,
            timestamp REAL NOT NULL, PRIMARY KEY (target, program, knobs, dtype))""")
        conn.execute("INSERT INTO measurements VALUES "
                     "('fp','prog','{}','float32',0.5,0.4,0.6,7,1e-7,1,'',1.0)")
    with MeasureCache(path) as db:
        old = db.get("fp", "prog", {}, "float32")
        assert old is not None and old.median == 0.5 and old.runs == 7
        assert math.isnan(old.probe)  # unprobed: trusted, replayed
        db.put("fp", "prog", {"a": 1}, "float32", m(probe=2e-3))
        assert db.best_probe("fp") == 2e-3
    with sqlite3.connect(path) as conn:
        cols = [r[1] for r in conn.execute("PRAGMA table_info(measurements)")]
    assert cols[-2:] == ["probe", "features"]  # each added column once, in order
    with MeasureCache(path) as db:  # opening again migrates nothing twice
        assert db.stats().rows == 2


def test_an_unusable_cache_path_runs_in_memory_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    for path in (blocker / "measure.sqlite", tmp_path):  # under a file; a folder
        with MeasureCache(path) as db:
            assert not db.persistent
            db.put("fp", "p", {}, "float32", m())
            assert db.get("fp", "p", {}, "float32") == m()
        assert str(path) in capsys.readouterr().err
    assert blocker.read_text() == ""


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_a_read_only_cache_runs_in_memory(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ro" / "measure.sqlite"
    filled(path, rows=3)
    os.chmod(path.parent, 0o500)
    try:
        with MeasureCache(path) as db:
            assert not db.persistent
        assert "read-only" in capsys.readouterr().err
    finally:
        os.chmod(path.parent, 0o700)


def test_a_failure_mid_run_goes_on_in_memory(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    class Broken:
        def execute(self, *args: object) -> None:
            raise sqlite3.OperationalError("disk I/O error")

        def close(self) -> None:
            pass

    with MeasureCache(tmp_path / "measure.sqlite") as db:
        db._conn = Broken()
        db.put("fp", "p", {}, "float32", m())
        assert db.get("fp", "p", {}, "float32") == m() and not db.persistent
    assert "disk I/O error" in capsys.readouterr().err


# -- replaying timings ---------------------------------------------------------------------


def test_timings_taken_under_load_are_not_replayed(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    with MeasureCache(tmp_path / "measure.sqlite") as db:
        db.put("fp", "p", {"k": "quiet"}, "float32", m(1e-3, probe=1e-3))
        db.put("fp", "p", {"k": "busy"}, "float32", m(0.116, probe=1e-3 * 20))
        db.put("fp", "p", {"k": "unprobed"}, "float32", m(2e-3))
        db.put("other", "p", {"k": "busy"}, "float32", m(0.116, probe=1e-3 * 20))
        assert db.get("fp", "p", {"k": "quiet"}, "float32") is not None
        assert db.get("fp", "p", {"k": "busy"}, "float32") is None  # to be measured again
        assert db.row("fp", "p", {"k": "busy"}, "float32") is not None  # but kept
        assert "the machine looked busy while timing" in capsys.readouterr().err
        assert db.get("fp", "p", {"k": "unprobed"}, "float32") is not None
        assert db.get("other", "p", {"k": "busy"}, "float32") is not None  # its own best
        assert set(db.program_rows("fp", "p")) == {('{"k":"quiet"}', "float32"),
                                                   ('{"k":"unprobed"}', "float32")}
        # re-measured on a quiet machine, it replays again
        db.put("fp", "p", {"k": "busy"}, "float32", m(1e-3, probe=1.1e-3))
        assert db.get("fp", "p", {"k": "busy"}, "float32") == m(1e-3)
    with MeasureCache(tmp_path / "measure.sqlite", replay=False) as fresh:  # --fresh
        assert fresh.get("fp", "p", {"k": "quiet"}, "float32") is None
        assert fresh.program_rows("fp", "p") == {}
        fresh.put("fp", "p", {"k": "new"}, "float32", m(probe=1e-3))
    with MeasureCache(tmp_path / "measure.sqlite") as db:
        assert db.get("fp", "p", {"k": "new"}, "float32") is not None  # still recorded


@given(st.lists(st.floats(1e-6, 1.0), min_size=1, max_size=8))
def test_replayed_iff_the_probe_is_within_the_factor_of_the_best(probes: list[float]) -> None:
    with tempfile.TemporaryDirectory() as folder, MeasureCache(Path(folder) / "m.sqlite") as db:
        for i, p in enumerate(probes):
            db.put("fp", "p", {"i": i}, "float32", m(probe=p))
        best = min(probes)
        for i, p in enumerate(probes):
            got = db.get("fp", "p", {"i": i}, "float32")
            assert (got is not None) == (p <= LOADED_FACTOR * best)


def test_run_job_fresh_measures_again_and_still_records(tmp_path: Path) -> None:
    p = parse_spec("kernel k(R=8, N=32)\nin x[r:R, n:N] f32\nout y[r, n] = exp(x[r, n]) * 3\n",
                   "<t>", {})
    spec = to_sexpr(p.term)
    job = Job(spec, spec, p.out_axes, p.inputs, "c", 1, 0,
              timing=TimingProtocol(min_runs=3, min_seconds=0.001))
    first = run_job(job, tmp_path)
    again = run_job(job, tmp_path)
    fresh = run_job(job, tmp_path, fresh=True)
    assert first.ok and first.measured == 1
    assert again.ok and again.measured == 0
    assert fresh.ok and fresh.measured == 1
    with MeasureCache(tmp_path / "measure.sqlite") as db:
        assert db.stats().rows == 1


# -- JSON caches and the cache folder ------------------------------------------------------


def test_a_damaged_json_cache_is_moved_aside(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bandwidth.json").write_text('{"cpu": {"bandwidth": 1e10')
    assert probe_mod.cached_bandwidth("cpu", tmp_path) is None
    (moved,) = aside(tmp_path, "bandwidth.json")
    err = capsys.readouterr().err
    assert str(tmp_path / "bandwidth.json") in err and str(moved) in err
    # a well-formed file with nonsense values is ignored, not trusted
    for bad in ('{"cpu": {"bandwidth": "fast"}}', '{"cpu": {"bandwidth": -1}}', "[1, 2]",
                '{"cpu": {"bandwidth": NaN}}'):
        (tmp_path / "bandwidth.json").write_text(bad)
        assert probe_mod.cached_bandwidth("cpu", tmp_path) is None


def test_json_cache_writes_fail_with_a_warning(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert not write_json_cache(blocker / "c.json", {"a": 1}, "test cache")
    assert "cannot save the test cache" in capsys.readouterr().err
    assert read_json_cache(tmp_path, "test cache") is None  # a folder: skipped, warned
    assert "is a folder" in capsys.readouterr().err
    assert write_json_cache(tmp_path / "c.json", {"a": 1}, "test cache")
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_check_cache_dir(tmp_path: Path) -> None:
    from kernelsat.cachefile import CacheDirError

    assert check_cache_dir(tmp_path / "new" / "deep").writable
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CacheDirError, match="not a folder"):
        check_cache_dir(blocker)
    with pytest.raises(CacheDirError, match="is a file"):
        check_cache_dir(blocker / "sub")
    assert not check_cache_dir("/proc/kernelsat-cache-test").writable  # not creatable


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the pipeline ran although --cache-dir was refused")

    monkeypatch.setattr("kernelsat.driver.pipeline.optimize", forbidden)


def test_cli_refuses_a_cache_dir_that_is_a_file_before_any_work(tmp_path: Path, no_work) -> None:
    spec = tmp_path / "k.ks"
    spec.write_text(SPEC)
    blocker = tmp_path / "file"
    blocker.write_text("keep")
    for cache in (blocker, blocker / "sub"):
        res = CliRunner().invoke(app, ["optimize", str(spec), "--out", str(tmp_path / "o"),
                                       "--cache-dir", str(cache)])
        assert res.exit_code == 2 and "--cache-dir" in res.output, res.output
        assert "Traceback" not in res.output
    assert blocker.read_text() == "keep" and not (tmp_path / "o").exists()


def test_cli_runs_without_an_unwritable_cache_dir(tmp_path: Path) -> None:
    spec = tmp_path / "k.ks"
    spec.write_text(SPEC)
    res = CliRunner().invoke(app, ["optimize", str(spec), "--out", str(tmp_path / "o"), *SMALL,
                                   "--cache-dir", "/proc/kernelsat-cache-test"])
    assert res.exit_code == 0, res.output
    assert "warning: cache folder /proc/kernelsat-cache-test" in res.output
    assert (tmp_path / "o" / "report.json").exists()


def test_cli_with_a_damaged_cache_warns_and_succeeds(tmp_path: Path) -> None:
    spec = tmp_path / "k.ks"
    spec.write_text(SPEC)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "measure.sqlite").write_bytes(b"\x00garbage" * 500)
    res = CliRunner().invoke(app, ["optimize", str(spec), "--out", str(tmp_path / "o"), *SMALL,
                                   "--cache-dir", str(cache)])
    assert res.exit_code == 0, res.output
    (moved,) = aside(cache)
    assert str(moved) in res.output and "damaged" in res.output


def test_a_damaged_rule_verification_cache_is_moved_aside(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kernelsat.proofs.verify import CACHE_FILE, VerificationCache, verifier_version
    from kernelsat.rewrites.rule import parse_rule

    rule = parse_rule("r: (exp (add ?x ?y)) => (mul (exp ?x) (exp ?y)) [e]")
    path = tmp_path / CACHE_FILE
    path.write_text('{"version": "x", "rules": {')
    assert VerificationCache(tmp_path).entries == {}
    (moved,) = aside(tmp_path, CACHE_FILE)
    assert str(moved) in capsys.readouterr().err
    # well-formed JSON of the wrong shape: nothing trusted, nothing raised
    shapes: list[object] = [[], {rule.key: {"ok": True}}, {rule.key: 3}]
    for rules in shapes:
        path.write_text(json.dumps({"version": verifier_version(), "rules": rules}))
        assert VerificationCache(tmp_path).get(rule) is None


@pytest.mark.parametrize("command", [
    ["bench", "{spec}", "-t", "c"],
    ["rules", "--verify"],
    ["rules"],
    ["train", "--corpus", "{folder}", "--out", "{folder}/p.npz", "--episodes", "1"],
    ["evaluate", "--specs", "{folder}"],
])
def test_every_command_with_a_cache_dir_refuses_a_file_before_any_work(
    tmp_path: Path, command: list[str]
) -> None:
    spec = tmp_path / "k.ks"
    spec.write_text(SPEC)
    blocker = tmp_path / "file"
    blocker.write_text("keep")
    args = [a.replace("{spec}", str(spec)).replace("{folder}", str(tmp_path)) for a in command]
    res = CliRunner().invoke(app, [*args, "--cache-dir", str(blocker)])
    assert res.exit_code == 2 and "--cache-dir" in res.output, res.output
    assert "Traceback" not in res.output
    assert blocker.read_text() == "keep"
