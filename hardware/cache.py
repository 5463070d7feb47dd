"""The measurement cache: SQLite, keyed by (target fingerprint, program key, knobs, dtype).

One row per measured configuration holds the `Measurement` (median, quartiles, runs,
error, ok, failure), when it was taken, and the machine-load probe taken with it.
With it, the schedule features of the setting (`put(..., features=)`, JSON; the
schedule model's, `kernelsat.hardware.schedule_model`), read back with `samples` as
training data for a learned search.
The database lives in `<cache dir>/measure.sqlite`
(`kernelsat.hardware.config.cache_dir`), or at the path given. It runs in WAL mode,
so any number of readers proceed while one process writes; writers wait up to
`timeout` seconds for the lock.

Replay: `get` returns a cached timing only when it can be trusted: its probe is at
most `LOADED_FACTOR` times the best probe this cache has seen for that target (a
timing without a probe, from before probes were recorded, is trusted), and the cache
was not opened with `replay=False` (`optimize --fresh`). Otherwise the setting is
measured again and the new row replaces the old.

A cache that cannot serve never stops a run: a damaged file is moved aside to
`measure.sqlite.corrupt-<timestamp>` and rebuilt; an unwritable one, or one that fails
mid-run, is replaced by an in-memory database for the rest of the run; each with a
warning naming the file (`kernelsat.cachefile`). An older schema gains the new columns
in place, keeping its rows.

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
import os
import sqlite3
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelsat.cachefile import move_aside, warn
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
    probe REAL,
    features TEXT,
    PRIMARY KEY (target, program, knobs, dtype)
);
CREATE TABLE IF NOT EXISTS probes (
    target TEXT PRIMARY KEY,
    best REAL NOT NULL,
    timestamp REAL NOT NULL
);
"""

ADDED_COLUMNS: dict[str, str] = {"probe": "REAL", "features": "TEXT"}
"""Columns of `measurements` newer than the first schema: added to an older cache in
place (its rows get NULL there)."""

COLUMNS = ("median", "q1", "q3", "runs", "rel_err", "ok", "failure", "probe")

LOADED_FACTOR = 3.0
"""A timing whose load probe took more than this many times the best probe recorded
for its target was taken on a busy machine: it is measured again, not replayed.
(Probes on a quiet machine agree within ~30%; two timing processes sharing the cores
slow the probe 5x and more.)"""

SQLITE_DAMAGED = {11, 26}  # SQLITE_CORRUPT, SQLITE_NOTADB
COMPANIONS = ("-wal", "-shm")


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


def _measurement(row: tuple[Any, ...]) -> Measurement:
    median, q1, q3, runs, rel_err, ok, failure, probe = row
    return Measurement(_unreal(median), _unreal(q1), _unreal(q3), int(runs), _unreal(rel_err),
                       bool(ok), str(failure), probe=_unreal(probe))


class Damaged(sqlite3.DatabaseError):
    """SQLite's integrity check found the database damaged."""


def _code(e: sqlite3.Error) -> int:
    return int(getattr(e, "sqlite_errorcode", 0) or 0) & 0xFF


@dataclass(frozen=True)
class Sample:
    """One measured (program, knob setting) with the schedule features kept beside it."""

    fingerprint: str
    program: str
    knobs: Any  # the setting as stored (JSON)
    dtype: str
    median: float  # seconds; NaN for a failed setting
    ok: bool
    features: Any  # as given to `put`


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
    """The SQLite measurement cache. `path=None`: `<cache dir>/measure.sqlite`.
    `replay=False`: `get` serves nothing (every setting is measured afresh) while `put`
    still records. `persistent` says whether it is backed by the file (False: running
    in memory, after a warning)."""

    def __init__(self, path: str | Path | None = None, *, timeout: float = 30.0,
                 replay: bool = True) -> None:
        self.path = Path(path) if path is not None else cache_dir() / "measure.sqlite"
        self.timeout, self.replay = timeout, replay
        self._best: dict[str, float] = {}
        self._told_loaded = False
        self._conn, self.persistent = self._open()

    # -- opening -------------------------------------------------------------------------

    def _open(self) -> tuple[sqlite3.Connection, bool]:
        why = self._unwritable()
        if why:
            warn(f"measurement cache {self.path} {why}: running without it (nothing is "
                 "replayed or saved)")
            return self._memory(), False
        for attempt in range(2):
            try:
                before: os.stat_result | None = os.stat(self.path)
            except OSError:
                before = None
            try:
                return self._connect(str(self.path)), True
            except sqlite3.DatabaseError as e:
                damaged = isinstance(e, Damaged) or _code(e) in SQLITE_DAMAGED
                if damaged and attempt == 0:
                    # moved aside and rebuilt; or another process did so meanwhile
                    move_aside(self.path, "measurement cache", before, COMPANIONS)
                    continue
                warn(f"measurement cache {self.path} cannot be used ({e}): running without "
                     "it (nothing is replayed or saved)")
                break
        return self._memory(), False

    def _unwritable(self) -> str:
        """Why the cache file cannot be written ("" when it can)."""
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return f"cannot be created ({e.strerror or e})"
        if self.path.exists() and not self.path.is_file():
            return "is not a file"
        if not os.access(folder, os.W_OK | os.X_OK):
            return "is in a read-only folder"
        if self.path.exists() and not os.access(self.path, os.R_OK | os.W_OK):
            return "is read-only"
        return ""

    def _connect(self, where: str) -> sqlite3.Connection:
        conn = sqlite3.connect(where, timeout=self.timeout, isolation_level=None)
        try:
            if where != ":memory:":
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
                (verdict,) = conn.execute("PRAGMA quick_check").fetchone()
                if verdict != "ok":
                    raise Damaged(f"database disk image is malformed: {verdict}")
            self._migrate(conn)
        except sqlite3.DatabaseError:
            conn.close()
            raise
        return conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        """Create the tables, or add the columns an older schema lacks (one writer at a
        time: BEGIN IMMEDIATE)."""
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            have = {row[1] for row in conn.execute("PRAGMA table_info(measurements)")}
            for name, kind in ADDED_COLUMNS.items():
                if name not in have:
                    conn.execute(f"ALTER TABLE measurements ADD COLUMN {name} {kind}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def _memory(self) -> sqlite3.Connection:
        return self._connect(":memory:")

    def _failed(self, e: sqlite3.Error) -> None:
        """A query failed mid-run: go on in memory (moving a damaged file aside)."""
        if not self.persistent:
            raise e
        self._conn.close()
        if isinstance(e, Damaged) or _code(e) in SQLITE_DAMAGED:
            move_aside(self.path, "measurement cache", None, COMPANIONS)
        else:
            warn(f"measurement cache {self.path} failed ({e}): running without it for the "
                 "rest of this run")
        self._conn, self.persistent = self._memory(), False
        self._best.clear()

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._conn.execute(sql, args).fetchall()
        except sqlite3.DatabaseError as e:
            self._failed(e)
            return self._conn.execute(sql, args).fetchall()

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> MeasureCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- load probes ---------------------------------------------------------------------

    def best_probe(self, fingerprint: str) -> float:
        """The fastest load probe recorded for a target fingerprint (NaN when none)."""
        if fingerprint not in self._best:
            rows = self._query("SELECT best FROM probes WHERE target=?", (fingerprint,))
            self._best[fingerprint] = float(rows[0][0]) if rows else math.nan
        return self._best[fingerprint]

    def trusted(self, fingerprint: str, m: Measurement) -> bool:
        """Whether a cached timing may be replayed: not taken on a busy machine (see
        LOADED_FACTOR); a timing without a probe is trusted."""
        if not math.isfinite(m.probe):
            return True
        best = self.best_probe(fingerprint)
        return not math.isfinite(best) or m.probe <= LOADED_FACTOR * best

    def _record_probe(self, fingerprint: str, probe: float) -> None:
        if not (math.isfinite(probe) and probe > 0):
            return
        self._query("INSERT INTO probes VALUES (?,?,?) ON CONFLICT(target) DO UPDATE SET "
                    "best=min(best, excluded.best), timestamp=excluded.timestamp "
                    "WHERE excluded.best < best", (fingerprint, probe, time.time()))
        self._best.pop(fingerprint, None)

    # -- rows ----------------------------------------------------------------------------

    def row(self, fingerprint: str, program: str, knobs: Mapping[str, Any], dtype: str
            ) -> Measurement | None:
        """The stored measurement for this key, trusted or not, or None."""
        rows = self._query(
            f"SELECT {', '.join(COLUMNS)} FROM measurements "
            "WHERE target=? AND program=? AND knobs=? AND dtype=?",
            (fingerprint, program, knobs_key(knobs), dtype))
        return _measurement(rows[0]) if rows else None

    def get(self, fingerprint: str, program: str, knobs: Mapping[str, Any], dtype: str
            ) -> Measurement | None:
        """The cached measurement for this key if it may be replayed (see the module
        docstring), else None."""
        if not self.replay:
            return None
        m = self.row(fingerprint, program, knobs, dtype)
        return m if m is not None and self.trusted(fingerprint, m) else None

    def put(self, fingerprint: str, program: str, knobs: Mapping[str, Any], dtype: str,
            m: Measurement, features: Mapping[str, Any] | None = None) -> None:
        """Store (or replace) the measurement for this key, stamped with the time now and
        its load probe, with the schedule's `features` (any JSON-able mapping: the schedule
        model's, for the learned search). The first timing of a busy machine (see
        `trusted`) is reported."""
        self._record_probe(fingerprint, m.probe)
        if not self._told_loaded and not self.trusted(fingerprint, m):
            self._told_loaded = True
            warn(f"the machine looked busy while timing (load probe {m.probe * 1e3:.3g} ms, "
                 f"best on this machine {self.best_probe(fingerprint) * 1e3:.3g} ms): these "
                 "timings are kept but measured again by a later run")
        self._query(
            "INSERT OR REPLACE INTO measurements (target, program, knobs, dtype, median, q1, "
            "q3, runs, rel_err, ok, failure, timestamp, probe, features) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (fingerprint, program, knobs_key(knobs), dtype, _real(m.median), _real(m.q1),
             _real(m.q3), m.runs, _real(m.rel_err), int(m.ok), m.failure, time.time(),
             _real(m.probe), None if features is None else knobs_key(features)),
        )

    def samples(self, fingerprint: str | None = None, program: str | None = None
                ) -> list[Sample]:
        """Every stored measurement that has features (optionally of one target and one
        program), oldest first: the learned search's training data. Failed settings come
        back too (`ok` False, `median` NaN); rows from before features were kept do not."""
        where, args = ["features IS NOT NULL"], []
        if fingerprint is not None:
            where.append("target=?")
            args.append(fingerprint)
        if program is not None:
            where.append("program=?")
            args.append(program)
        rows = self._query(
            "SELECT target, program, knobs, dtype, median, ok, features FROM measurements "
            f"WHERE {' AND '.join(where)} ORDER BY timestamp", tuple(args))
        out = []
        for target, prog, knobs, dtype, median, ok, features in rows:
            try:
                setting, feats = json.loads(knobs), json.loads(features)
            except ValueError:  # a row some other writer damaged: not training data
                continue
            out.append(Sample(str(target), str(prog), setting, str(dtype), _unreal(median),
                              bool(ok), feats))
        return out

    def program_rows(self, fingerprint: str, program: str) -> dict[tuple[str, str], Measurement]:
        """Every replayable measurement of one program on one target (by its fingerprint),
        keyed by (`knobs_key(knobs)`, dtype): what a remote worker needs to search from the
        cache."""
        if not self.replay:
            return {}
        rows = self._query(
            f"SELECT knobs, dtype, {', '.join(COLUMNS)} FROM measurements "
            "WHERE target=? AND program=?", (fingerprint, program))
        found = {(str(r[0]), str(r[1])): _measurement(r[2:]) for r in rows}
        return {k: m for k, m in found.items() if self.trusted(fingerprint, m)}

    def timestamp(self, fingerprint: str, program: str, knobs: Mapping[str, Any], dtype: str
                  ) -> float | None:
        """When this key was measured (seconds since the epoch), or None."""
        rows = self._query(
            "SELECT timestamp FROM measurements WHERE target=? AND program=? AND knobs=? "
            "AND dtype=?", (fingerprint, program, knobs_key(knobs), dtype))
        return float(rows[0][0]) if rows else None

    def stats(self) -> CacheStats:
        """How many rows, how many ok, over how many targets and programs."""
        ((rows, ok, targets, programs),) = self._query(
            "SELECT COUNT(*), COALESCE(SUM(ok), 0), COUNT(DISTINCT target), "
            "COUNT(DISTINCT program) FROM measurements")
        return CacheStats(int(rows), int(ok), int(rows) - int(ok), int(targets), int(programs),
                          str(self.path))
