"""Choosing an evaluation backend by name: `local` (this machine, one job at a time)
or `ray` (a Ray cluster; the optional `distributed` extra).

>>> make_backend("local").name
'local'
>>> make_backend("slurm")
Traceback (most recent call last):
...
ValueError: unknown backend 'slurm': expected local or ray
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelsat.driver.jobs import Backend, LocalBackend
from kernelsat.driver.ray_backend import RayBackend
from kernelsat.hardware.cpu import detect_cpu

RAY_MISSING = ("the ray backend needs Ray, which is not installed: "
               "pip install 'kernelsat[distributed]' (or pip install ray)")


def ray_available() -> bool:
    """Whether Ray can be imported here (without importing it)."""
    return importlib.util.find_spec("ray") is not None


def _local(address: str | None, cache_dir: Path | None, **options: Any) -> Backend:
    if address is not None:
        raise ValueError("--ray-address is only for --backend ray")

    # a batch is compiled on every core, then timed one job at a time
    return LocalBackend(cache_dir, build_workers=options.get("build_workers",
                                                             detect_cpu().cores),
                        fresh=bool(options.get("fresh", False)))


def _ray(address: str | None, cache_dir: Path | None, **options: Any) -> Backend:
    if not ray_available():
        raise ValueError(RAY_MISSING)

    return RayBackend(address, cache_dir, **options)


BACKENDS: dict[str, Callable[..., Backend]] = {"local": _local, "ray": _ray}
"""Backend name -> constructor (address, cache_dir, **backend options)."""


def make_backend(name: str, address: str | None = None, cache_dir: Path | None = None,
                 **options: Any) -> Backend:
    """The backend called `name`. `address` is the Ray cluster (`host:port`, `auto`);
    None with `ray` starts a local Ray instance that `close()` stops. `options` go to
    the backend (both: `fresh`, replay no cached timing; `RayBackend`: `max_attempts`,
    `workers_per_node`, ...). Raises
    ValueError with a message fit for the command line."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}: expected {' or '.join(BACKENDS)}")
    return BACKENDS[name](address, None if cache_dir is None else Path(cache_dir), **options)
