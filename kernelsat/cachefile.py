"""Opening the files kernelsat caches results in, safely.

A cache only saves time, so a damaged or unwritable one must never stop a run, and
must never pass silently either:

- a cache folder is checked before any work (`check_cache_dir`): a path that is not a
  folder is refused (`CacheDirError`); one that cannot be created or written is run
  without (a warning names it);
- a damaged cache file is moved aside to `<name>.corrupt-<timestamp>` and rebuilt,
  with a warning naming both paths (`move_aside`);
- a cache file that cannot be read or written is used as far as it can be, with a
  warning (`read_json_cache`, `write_json_cache`).

Warnings go to stderr as `warning: ...`, each at most once per process. The folder
itself is `cache_dir()`, the one definition (it reads `$KERNELSAT_CACHE_DIR`).

>>> import tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> write_json_cache(folder / "c.json", {"a": 1}, "test cache")
True
>>> read_json_cache(folder / "c.json", "test cache")
{'a': 1}
>>> _ = (folder / "c.json").write_text("{not json")
>>> read_json_cache(folder / "c.json", "test cache") is None  # moved aside, with a warning
True
>>> [p.name.split("-")[0] for p in folder.iterdir()]
['c.json.corrupt']
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE_DIR_ENV = "KERNELSAT_CACHE_DIR"


def cache_dir(override: str | Path | None = None) -> Path:
    """The one cache folder every stage keeps its files under (measurements, probed
    machine figures, compiled C, verified rules): `override` when given, else
    `$KERNELSAT_CACHE_DIR`, else `~/.cache/kernelsat`."""
    if override is not None:
        return Path(override)
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "kernelsat"


_warned: set[str] = set()


def warn(message: str) -> None:
    """Print `warning: message` on stderr, once per process for each message."""
    if message in _warned:
        return
    _warned.add(message)
    print(f"warning: {message}", file=sys.stderr, flush=True)


class CacheDirError(ValueError):
    """The cache folder cannot be used at all (it is a file, or under one)."""


@dataclass(frozen=True)
class CacheDir:
    """A checked cache folder: `writable`, or why not (`reason`)."""

    path: Path
    writable: bool
    reason: str = ""


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def check_cache_dir(path: str | Path) -> CacheDir:
    """Check (creating it if needed) that `path` is a writable folder. Raises
    `CacheDirError` when it is not a folder; returns `writable=False` with the reason
    when it cannot be created or written (run without the cache then)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CacheDirError(f"cache folder {path} exists and is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except NotADirectoryError:
        raise CacheDirError(f"cache folder {path}: a part of the path is a file") from None
    except FileExistsError:
        raise CacheDirError(f"cache folder {path} exists and is not a folder") from None
    except OSError as e:
        return CacheDir(path, False, f"cannot create it: {_why(e)}")
    try:  # a real write: permission bits say nothing to root or on a read-only mount
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return CacheDir(path, False, f"cannot write in it: {_why(e)}")
    return CacheDir(path, True)


@contextlib.contextmanager
def cache_dir_for_run(path: str | Path) -> Iterator[Path]:
    """The cache folder a run uses, checked before any work: `path` when it is (or can
    be made) a writable folder; else, with a warning, a temporary folder for this run
    only, removed at the end (nothing is replayed or saved). Raises `CacheDirError`
    when `path` is not a folder (a command-line error: refuse it)."""
    checked = check_cache_dir(path)
    if checked.writable:
        yield checked.path
        return
    warn(f"cache folder {checked.path}: {checked.reason}; running without the cache "
         "(nothing is replayed or saved)")
    with tempfile.TemporaryDirectory(prefix="kernelsat-nocache-") as tmp:
        yield Path(tmp)


def corrupt_name(path: Path) -> Path:
    """Where a damaged `path` is moved: `<name>.corrupt-<timestamp>` beside it."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while os.path.lexists(candidate):
        n += 1
        candidate = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    return candidate


def move_aside(path: Path, what: str, expect: os.stat_result | None = None,
               companions: tuple[str, ...] = ()) -> Path | None:
    """Rename the damaged cache file `path` to `corrupt_name(path)` (and each
    `path + suffix` in `companions`, e.g. SQLite's `-wal`, beside it) and warn, naming
    both paths. `expect`: the file judged damaged; if `path` is another file by now
    (another process already rebuilt it), nothing is moved. Returns the new name, or
    None when nothing was moved."""
    try:
        now = path.stat()
        if expect is not None and (now.st_ino, now.st_dev) != (expect.st_ino, expect.st_dev):
            return None
        aside = corrupt_name(path)
        os.rename(path, aside)
    except FileNotFoundError:
        return None
    except OSError as e:
        warn(f"the {what} {path} is damaged and cannot be moved aside ({_why(e)}): "
             "running without it")
        return None
    for suffix in companions:
        side = Path(f"{path}{suffix}")
        with contextlib.suppress(OSError):  # absent, or gone already
            os.rename(side, Path(f"{aside}{suffix}"))
    warn(f"the {what} {path} was damaged: moved it to {aside} and started a new one")
    return aside


def read_json_cache(path: Path, what: str) -> Any:
    """The JSON in the cache file `path`, or None when there is none. A file that is not
    JSON is moved aside (with a warning); one that cannot be read is skipped (warning)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.EISDIR:
            warn(f"the {what} {path} is a folder, not a file: running without it")
        else:
            warn(f"cannot read the {what} {path} ({_why(e)}): running without it")
        return None
    try:
        return json.loads(raw)
    except ValueError:
        move_aside(path, what, st)
        return None


def write_json_cache(path: Path, data: Any, what: str) -> bool:
    """Write `data` as JSON to `path` atomically (a temporary file, then a rename).
    Returns False, with a warning, when it cannot be written."""
    path = Path(path)
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
        return True
    except OSError as e:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        warn(f"cannot save the {what} {path} ({_why(e)}): results are not cached")
        return False

