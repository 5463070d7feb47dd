"""The measurement cache: SQLite, keyed by (target fingerprint, program key, knobs, dtype).

One row per measured configuration holds the `Measurement` (median, quartiles, runs,
error, ok, failure) and when it was taken. The database lives in
`<cache dir>/measure.sqlite` (`kernelsat.hardware.config.cache_dir`), or at the
path given. It runs in WAL mode, so any number of readers proceed while one
process writes; writers wait up to `timeout` seconds for the lock.

>>> import tempfile, os
>>> from kernelsat.hardware.measure import Measurement
>>> db = MeasureCache(os.path.join(tempfile.mkdtemp(), "m.sqlite"))
>>> db.put("fp", "prog", {"tile": 8}, "float32", Measurement(1.0, 0.9, 1.1, 10, 1e-6, True))
>>> db.get("fp", "prog", {"tile": 8}, "float32").median
1.0
>>> db.get("other-target", "prog", {"tile": 8}, "float32") is None
True
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelsat.hardware.config import cache_dir
from kernelsat.hardware.measure import Measurement

SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
    target TEXT NOT NULL,
    program TEXT NOT NULL,
    knobs TEXT NOT NULL,
    dtype TEXT NOT NULL,
    median REAL,
    q1 REAL,
    q3 REAL,
    runs INTEGER NOT NULL,
    rel_err REAL,
    ok INTEGER NOT NULL,
    failure TEXT NOT NULL,
    timestamp REAL NOT NULL,
    PRIMARY KEY (target, program, knobs, dtype)
)
"""


def knobs_key(knobs: Mapping[str, Any]) -> str:
    """The canonical JSON of a knob setting (sorted keys, no spaces).

    >>> knobs_key({"b": 2, "a": {"y": 1, "x": 0}})
    '{"a":{"x":0,"y":1},"b":2}'
    """
    return json.dumps(knobs, sort_keys=True, separators=(",", ":"), default=str)


def _real(x: float) -> float | None:
    return None if math.isnan(x) else x  # SQLite stores NaN as NULL anyway; say so


def _unreal(x: float | None) -> float:
    return math.nan if x is None else float(x)


@dataclass(frozen=True)
class CacheStats:
    """Counts of what the cache holds."""

    rows: int
    ok: int
    failed: int
    targets: int
    programs: int
    path: str


class MeasureCache:
    """The SQLite measurement cache. `path=None`: `<cache dir>/measure.sqlite`."""

    def __init__(self, path: str | Path | None = None, *, timeout: float = 30.0) -> None:
        self.path = Path(path) if path is not None else cache_dir() / "measure.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, timeout=timeout, isolation_level=None)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=NORMAL")
        self._conn.execute(SCHEMA)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> MeasureCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, target: str, program: str, knobs: Mapping[str, Any], dtype: str
            ) -> Measurement | None:
        """The cached measurement for this key, or None."""
        row = self._conn.execute(
            "SELECT median, q1, q3, runs, rel_err, ok, failure FROM measurements "
            "WHERE target=? AND program=? AND knobs=? AND dtype=?",
            (target, program, knobs_key(knobs), dtype),
        ).fetchone()
        if row is None:
            return None
        median, q1, q3, runs, rel_err, ok, failure = row
        return Measurement(_unreal(median), _unreal(q1), _unreal(q3), int(runs), _unreal(rel_err),
                           bool(ok), str(failure))

    def put(self, target: str, program: str, knobs: Mapping[str, Any], dtype: str,
            m: Measurement) -> None:
        """Store (or replace) the measurement for this key, stamped with the time now."""
        self._conn.execute(
            "INSERT OR REPLACE INTO measurements VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (target, program, knobs_key(knobs), dtype, _real(m.median), _real(m.q1), _real(m.q3),
             m.runs, _real(m.rel_err), int(m.ok), m.failure, time.time()),
        )

    def program_rows(self, target: str, program: str) -> dict[tuple[str, str], Measurement]:
        """Every cached measurement of one program on one target, keyed by
        (`knobs_key(knobs)`, dtype): what a remote worker needs to search from the cache."""
        rows = self._conn.execute(
            "SELECT knobs, dtype, median, q1, q3, runs, rel_err, ok, failure FROM measurements "
            "WHERE target=? AND program=?", (target, program)).fetchall()
        return {(str(k), str(d)): Measurement(_unreal(med), _unreal(q1), _unreal(q3), int(runs),
                                              _unreal(err), bool(ok), str(failure))
                for k, d, med, q1, q3, runs, err, ok, failure in rows}

    def timestamp(self, target: str, program: str, knobs: Mapping[str, Any], dtype: str
                  ) -> float | None:
        """When this key was measured (seconds since the epoch), or None."""
        row = self._conn.execute(
            "SELECT timestamp FROM measurements WHERE target=? AND program=? AND knobs=? "
            "AND dtype=?", (target, program, knobs_key(knobs), dtype)).fetchone()
        return None if row is None else float(row[0])

    def stats(self) -> CacheStats:
        """How many rows, how many ok, over how many targets and programs."""
        rows, ok, targets, programs = self._conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(ok), 0), COUNT(DISTINCT target), "
            "COUNT(DISTINCT program) FROM measurements").fetchone()
        return CacheStats(int(rows), int(ok), int(rows) - int(ok), int(targets), int(programs),
                          str(self.path))
