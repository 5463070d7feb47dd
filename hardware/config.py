"""The one place the hardware stage reads its settings from the environment.

- `KERNELSAT_CACHE_DIR`: the cache folder, else `~/.cache/kernelsat` (read by the one
  definition, `kernelsat.cachefile.cache_dir`, which every stage uses). Every function
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

from kernelsat.cachefile import CACHE_DIR_ENV, cache_dir

LOAD_PROBE_ENV = "KERNELSAT_LOAD_PROBE"
TIMING_LOCK_NAME = "kernelsat-timing.lock"

__all__ = ["CACHE_DIR_ENV", "LOAD_PROBE_ENV", "TIMING_LOCK_NAME", "cache_dir", "load_probe_enabled",
           "timing_lock_path"]


def timing_lock_path() -> Path:
    """The machine-wide lock file every timing process holds while it times."""
    return Path(tempfile.gettempdir()) / TIMING_LOCK_NAME


def load_probe_enabled() -> bool:
    """Whether timings are stamped with the machine-load probe (default: yes)."""
    return os.environ.get(LOAD_PROBE_ENV, "on").strip().lower() not in ("off", "0", "no")
