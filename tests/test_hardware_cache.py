"""The SQLite measurement cache: round trips, key separation, concurrent readers."""

from __future__ import annotations

import math
import threading
from pathlib import Path

from kernelsat.hardware.cache import MeasureCache, knobs_key
from kernelsat.hardware.measure import Measurement
from kernelsat.hardware.targets import get_target

M = Measurement(1.5e-3, 1.4e-3, 1.7e-3, 25, 2e-7, True)


def test_round_trip(tmp_path: Path) -> None:
    with MeasureCache(tmp_path / "m.sqlite") as db:
        db.put("fp", "prog", {"k0": {"tile": 16}}, "float32", M)
        got = db.get("fp", "prog", {"k0": {"tile": 16}}, "float32")
        assert got == M
        assert db.timestamp("fp", "prog", {"k0": {"tile": 16}}, "float32") is not None


def test_failure_round_trip(tmp_path: Path) -> None:
    bad = Measurement.failed("run 0: 3 of 8 output elements unwritten or NaN", 1)
    with MeasureCache(tmp_path / "m.sqlite") as db:
        db.put("fp", "prog", {}, "float32", bad)
        got = db.get("fp", "prog", {}, "float32")
        assert got is not None and not got.ok and got.failure == bad.failure
        assert math.isnan(got.median)


def test_keys_separate(tmp_path: Path) -> None:
    cpu, h100 = get_target("cpu"), get_target("h100")
    assert cpu.fingerprint != h100.fingerprint
    with MeasureCache(tmp_path / "m.sqlite") as db:
        db.put(cpu.fingerprint, "prog", {}, "float32", M)
        assert db.get(h100.fingerprint, "prog", {}, "float32") is None
        assert db.get(cpu.fingerprint, "other", {}, "float32") is None
        assert db.get(cpu.fingerprint, "prog", {"a": 1}, "float32") is None
        assert db.get(cpu.fingerprint, "prog", {}, "float64") is None
        s = db.stats()
        assert (s.rows, s.ok, s.failed, s.targets) == (1, 1, 0, 1)


def test_knob_order_is_irrelevant(tmp_path: Path) -> None:
    assert knobs_key({"a": 1, "b": 2}) == knobs_key({"b": 2, "a": 1})
    with MeasureCache(tmp_path / "m.sqlite") as db:
        db.put("fp", "p", {"a": 1, "b": 2}, "float32", M)
        assert db.get("fp", "p", {"b": 2, "a": 1}, "float32") == M


def test_replace_and_persist(tmp_path: Path) -> None:
    path = tmp_path / "m.sqlite"
    with MeasureCache(path) as db:
        db.put("fp", "p", {}, "float32", M)
        db.put("fp", "p", {}, "float32", Measurement(2.0, 1.0, 3.0, 5, 0.0, True))
    with MeasureCache(path) as db:
        got = db.get("fp", "p", {}, "float32")
        assert got is not None and got.median == 2.0 and db.stats().rows == 1


def test_env_var_sets_the_default_path(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("KERNELSAT_CACHE_DIR", str(tmp_path / "c"))
    with MeasureCache() as db:
        assert db.path == tmp_path / "c" / "measure.sqlite"


def test_concurrent_readers_and_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "m.sqlite"
    with MeasureCache(path) as db:
        db.put("fp", "p", {"i": -1}, "float32", M)
    errors: list[BaseException] = []

    def reader() -> None:
        try:
            with MeasureCache(path) as r:
                for _ in range(50):
                    assert r.get("fp", "p", {"i": -1}, "float32") == M
        except BaseException as exc:
            errors.append(exc)

    def writer() -> None:
        try:
            with MeasureCache(path) as w:
                for i in range(50):
                    w.put("fp", "p", {"i": i}, "float32", M)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=reader) for _ in range(3)]
    threads.append(threading.Thread(target=writer))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    with MeasureCache(path) as db:
        assert db.stats().rows == 51
