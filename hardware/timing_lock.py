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

Notify = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class TimingLock:
    """An exclusive `flock` on `path` (default: the machine-wide lock file), which
    records its holder's pid for the processes waiting on it."""

    def __init__(self, path: Path | None = None, notify: Notify = _stderr) -> None:
        self.path = Path(path) if path is not None else timing_lock_path()
        self.notify = notify
        self._fd: int | None = None

    def _open(self) -> int | None:
        flags = os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.path, os.O_RDWR | flags, 0o666)
        except PermissionError:  # another user's lock file: flock works read-only too
            try:
                fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as e:
                self._unusable(e)
                return None
        except OSError as e:  # a symbolic link planted there, a read-only /tmp ...
            self._unusable(e)
            return None
        with contextlib.suppress(OSError):
            os.fchmod(fd, 0o666)  # let other users' runs record their pid too
        return fd

    def _unusable(self, e: OSError) -> None:
        warn(f"cannot open the timing lock {self.path} ({e.strerror or e}): timing without "
             "it; another kernelsat process timing at the same time would disturb this one")

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
                self._unusable(e)
                return
        self._fd = fd
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
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
        session.depth += 1
        try:
            yield session
        finally:
            session.depth -= 1
            if session.depth == 0:
                session.lock.release()
