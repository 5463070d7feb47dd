"""The one place the hardware stage reads its settings from the environment.

Only the cache folder is configurable from outside: `KERNELSAT_CACHE_DIR`, else
`~/.cache/kernelsat`. Every function that touches the cache also takes an explicit
path, which wins over both.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_DIR_ENV = "KERNELSAT_CACHE_DIR"


def cache_dir(override: str | Path | None = None) -> Path:
    """The folder for the measurement database and the probed machine figures."""
    if override is not None:
        return Path(override)
    env = os.environ.get(CACHE_DIR_ENV)
    return Path(env) if env else Path.home() / ".cache" / "kernelsat"
