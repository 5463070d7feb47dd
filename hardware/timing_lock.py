"""One process times at a time on a machine, and every timing says how loaded it was.

Two timing processes on one machine compete for its cores and both record inflated
times (116x was seen), which a cache would replay for good. So every timing path
(`kernelsat.hardware.measure.measure`, which the local backend, the Ray timing
workers, `kernelsat bench` and the RL evaluation all go through) times inside a
`timing_session`:

- it holds an exclusive `flock` on a machine-wide lock file
  (`kernelsat.hardware.config.timing_lock_path`) while it times; a process that
  finds it taken says "waiting for another kernelsat process to finish timing
  (pid N)" on stderr and waits. Sessions nest, and threads of one process take turns.
  The kernel releases the lock when its holder dies, so a killed run never blocks
  the next one.
- background work of any kernelsat process on the machine (compiling: the knob
  search's builds, `prebuild` in a build pool or a Ray task) holds `building()`,
  and a timing waits until the builds in flight are done while new ones wait
  until it ends: a timing never shares the cores with a compiler of the same run
  (or of another), which on two cores made noise the search took for a winner.
  Three files make it fair: the timer holds the lock, then a gate (so no new
  build starts), then the work file exclusively (so the builds in flight, each
  holding it shared, have finished); a build passes the gate, takes the work file
  shared and lets the gate go.
- it takes the machine-load probe (`kernelsat.hardware.triad.load_probe`, a few ms)
  on entry and again whenever the last probe is `PROBE_EVERY_S` old; each
  measurement carries the probe taken with it (`Measurement.probe`), and the cache
  re-measures rather than replays a timing whose probe says the machine was busy.

>>> import tempfile
>>> lock = TimingLock(Path(tempfile.mkdtemp()) / "t.lock")
>>> with timing_session(lock=lock, probe=lambda: 1e-3) as session:
...     session.probe()
0.001
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kernelsat.cachefile import warn
from kernelsat.hardware.config import load_probe_enabled, timing_lock_path
from kernelsat.hardware.triad import load_probe

PROBE_EVERY_S = 2.0
"""A probe older than this is taken again before the next measurement."""

POLL_S = 0.05
"""How often a waiting process tries the lock again."""

BUILD_WAIT_S = 60.0
"""A timing waits at most this long for the builds in flight, then warns and times."""

Notify = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class TimingLock:
    """An exclusive `flock` on `path` (default: the machine-wide lock file), which
    records its holder's pid for the processes waiting on it."""

    def __init__(self, path: Path | None = None, notify: Notify = _stderr) -> None:
        self.path = Path(path) if path is not None else timing_lock_path()
        self.gate_path = self.path.with_name(self.path.name + ".gate")
        self.work_path = self.path.with_name(self.path.name + ".work")
        self.notify = notify
        self._fd: int | None = None
        self._quiet: list[int] = []  # the gate and the work file, held while timing

    def _open(self, path: Path | None = None) -> int | None:
        path = self.path if path is None else path
        flags = os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(path, os.O_RDWR | flags, 0o666)
        except PermissionError:  # another user's lock file: flock works read-only too
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as e:
                self._unusable(e, path)
                return None
        except OSError as e:  # a symbolic link planted there, a read-only /tmp ...
            self._unusable(e, path)
            return None
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)  # let other users' runs record their pid too
        return fd

    def _unusable(self, e: OSError, path: Path) -> None:
        if path == self.path:
            warn(f"cannot open the timing lock {path} ({e.strerror or e}): timing without "
                 "it; another kernelsat process timing at the same time would disturb this "
                 "one")
        else:
            warn(f"cannot open the timing lock's companion {path} ({e.strerror or e}): "
                 "timings do not wait for builds in flight")

    def holder(self) -> int | None:
        """The pid recorded by the process holding the lock (None if unknown)."""
        try:
            text = self.path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def acquire(self) -> None:
        """Take the lock, waiting (and saying for whom) while another process holds it."""
        fd = self._open()
        if fd is None:
            return
        told: int | str | None = "nobody"
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                pid = self.holder()
                if pid != told:
                    who = f"pid {pid}" if pid is not None else "pid unknown"
                    self.notify(f"waiting for another kernelsat process to finish timing ({who})")
                    told = pid
                time.sleep(POLL_S)
            except OSError as e:
                os.close(fd)
                self._unusable(e, self.path)
                return
        self._fd = fd
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._quiet = self._quiet_machine()

    def _quiet_machine(self) -> list[int]:
        """Hold the gate (no build starts) and, once the builds in flight are done (or
        after `BUILD_WAIT_S`, with a warning), the work file: the fds to release."""
        gate = self._open(self.gate_path)
        if gate is None:
            return []
        fcntl.flock(gate, fcntl.LOCK_EX)  # builds hold the gate only to pass it
        if _building.depth:  # this thread is inside building(): its own build is done
            return [gate]
        work = self._open(self.work_path)
        if work is None:
            return [gate]
        start = time.monotonic()
        while True:
            try:
                fcntl.flock(work, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return [gate, work]
            except BlockingIOError:
                if time.monotonic() - start > BUILD_WAIT_S:
                    warn(f"timing while a kernelsat build still runs (waited "
                         f"{BUILD_WAIT_S:.0f} s for it)")
                    os.close(work)
                    return [gate]
                time.sleep(POLL_S)

    def wait_gate(self, gate: int) -> None:
        """Take the gate (`gate` is its fd) for a build, saying for whom it waits while a
        timing holds it."""
        told: int | str | None = "nobody"
        while True:
            try:
                fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pid = self.holder()
                if pid != told and pid is not None:
                    self.notify(f"waiting for another kernelsat process to finish timing "
                                f"(pid {pid}) before compiling")
                    told = pid
                time.sleep(POLL_S)

    def release(self) -> None:
        for quiet in reversed(self._quiet):
            with contextlib.suppress(OSError):
                fcntl.flock(quiet, fcntl.LOCK_UN)
            os.close(quiet)
        self._quiet = []
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    @property
    def held(self) -> bool:
        return self._fd is not None


@dataclass
class Session:
    """This process's hold on the timing lock and its latest load probe."""

    lock: TimingLock
    probe_fn: Callable[[], float] | None
    depth: int = 0
    last: float = math.nan
    taken_at: float = -math.inf
    owner: threading.RLock = field(default_factory=threading.RLock)
    thread: int | None = None  # the thread holding the session (depth > 0)

    def probe(self) -> float:
        """The load probe (seconds), taken again if older than PROBE_EVERY_S; NaN when
        probing is off."""
        if self.probe_fn is None:
            return math.nan
        now = time.monotonic()
        if now - self.taken_at > PROBE_EVERY_S:
            try:
                value = float(self.probe_fn())
            except Exception as e:  # a probe that cannot run must not stop the timing
                warn(f"the machine-load probe failed ({type(e).__name__}: {e}): timings "
                     "are stored unprobed")
                value = math.nan
            self.last, self.taken_at = value, time.monotonic()
        return self.last


_session: Session | None = None
_session_guard = threading.Lock()


def _process_session() -> Session:
    global _session
    with _session_guard:
        if _session is None:
            _session = Session(TimingLock(), load_probe if load_probe_enabled() else None)
        return _session


@contextlib.contextmanager
def timing_session(*, lock: TimingLock | None = None,
                   probe: Callable[[], float] | None = None) -> Iterator[Session]:
    """Hold the timing lock for the block: this process's session (re-entrant; its
    threads take turns). `lock` or `probe` given: a private session with them instead
    of the machine-wide lock and the load probe."""
    session = _process_session() if lock is None and probe is None else Session(
        lock if lock is not None else TimingLock(), probe)
    with session.owner:
        if session.depth == 0:
            session.lock.acquire()
            session.thread = threading.get_ident()
        session.depth += 1
        try:
            yield session
        finally:
            session.depth -= 1
            if session.depth == 0:
                session.thread = None
                session.lock.release()


class _Building(threading.local):
    depth = 0


_building = _Building()


@contextlib.contextmanager
def building(lock: TimingLock | None = None) -> Iterator[None]:
    """Hold for the block of background work (a compile): it starts once no process on
    the machine times (waiting while one does) and any timing that starts meanwhile
    waits for it to end. `lock`: a private lock's files instead of the machine-wide
    one. Inside this thread's own timing session it is a no-op (the session already
    keeps the machine quiet), and it nests.

    >>> import tempfile
    >>> lock = TimingLock(Path(tempfile.mkdtemp()) / "t.lock")
    >>> with building(lock):
    ...     with timing_session(lock=lock, probe=lambda: 0.0) as s:  # no deadlock
    ...         s.lock.held
    True
    """
    session = _session if lock is None else None
    mine = session is not None and session.depth > 0 and session.thread == threading.get_ident()
    if mine or _building.depth:
        _building.depth += 1
        try:
            yield
        finally:
            _building.depth -= 1
        return
    lock = lock if lock is not None else TimingLock()
    gate, work = lock._open(lock.gate_path), lock._open(lock.work_path)
    try:
        if gate is not None and work is not None:
            lock.wait_gate(gate)
            fcntl.flock(work, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        _building.depth += 1
        try:
            yield
        finally:
            _building.depth -= 1
    finally:
        for fd in (work, gate):
            if fd is not None:
                os.close(fd)  # closing releases its flock
