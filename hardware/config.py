"""The one place the hardware stage reads its settings from the environment.

- `KERNELSAT_CACHE_DIR`: the cache folder, else `~/.cache/kernelsat`. Every function
  that touches the cache also takes an explicit path, which wins over both.
- `KERNELSAT_LOAD_PROBE=off`: time without the machine-load probe (see
  `kernelsat.hardware.timing_lock`); timings are then stored unprobed and always
  replayed. For machines whose probe is too noisy to judge load, and test suites
  that must replay a warm cache whatever the load.

The timing lock is machine-wide, not per cache folder: two runs with different cache
folders still share the cores they time on.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

CACHE_DIR_ENV = "KERNELSAT_CACHE_DIR"
LOAD_PROBE_ENV = "KERNELSAT_LOAD_PROBE"
TIMING_LOCK_NAME = "kernelsat-timing.lock"


def cache_dir(override: str | Path | None = None) -> Path:
    """The folder for the measurement database and the probed machine figures."""
    if override is not None:
        return Path(override)
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "kernelsat"


def timing_lock_path() -> Path:
    """The machine-wide lock file every timing process holds while it times."""
    return Path(tempfile.gettempdir()) / TIMING_LOCK_NAME


def load_probe_enabled() -> bool:
    """Whether timings are stamped with the machine-load probe (default: yes)."""
    return os.environ.get(LOAD_PROBE_ENV, "on").strip().lower() not in ("off", "0", "no")
