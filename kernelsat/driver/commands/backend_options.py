"""The `--backend local|ray` and `--ray-address` options, shared by `optimize`, `train`
and `evaluate`, and the check of their `--cache-dir` (`usable_cache_dir`).

    from kernelsat.driver.commands.backend_options import (
        BackendOption, RayAddressOption, open_backend)

    def optimize(..., backend: BackendOption = "local", ray_address: RayAddressOption = None):
        with open_backend(backend, ray_address, cache_dir) as runner:
            result = run(program, target, backend=runner, ...)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from kernelsat.cachefile import CacheDirError, cache_dir_for_run
from kernelsat.driver.backends import make_backend
from kernelsat.driver.commands.spec import fail, refuse
from kernelsat.driver.jobs import Backend
from kernelsat.hardware.config import cache_dir

BackendOption = Annotated[
    str,
    typer.Option("--backend", metavar="local|ray",
                 help="Where measurements run: local (this machine, one at a time) or ray "
                      "(a Ray cluster: one timer per GPU or CPU node, compiling on every "
                      "core; needs the distributed extra)."),
]
"""`--backend`: the evaluation backend's name (`kernelsat.driver.backends.BACKENDS`)."""

RayAddressOption = Annotated[
    str | None,
    typer.Option("--ray-address", metavar="ADDR",
                 help="The Ray cluster to join (host:port of the head, or auto). Default "
                      "with --backend ray: start a local Ray instance and stop it at the end."),
]
"""`--ray-address`: the Ray head to join; None starts (and stops) a local instance."""


@contextmanager
def open_backend(name: str, address: str | None, cache_dir: Path | None,
                 **options: Any) -> Iterator[Backend]:
    """The named backend, closed on exit (a local Ray instance it started is stopped).
    `options` go to the backend (`fresh=True`: replay no cached timing). A bad name, a
    missing Ray or an unreachable cluster prints the error and exits 1."""
    try:
        backend = make_backend(name, address, cache_dir, **options)
    except (ValueError, RuntimeError, ConnectionError) as e:
        fail(f"error: --backend {name}: {e}")
    try:
        yield backend
    finally:
        backend.close()


@contextmanager
def usable_cache_dir(option: Path | None) -> Iterator[Path]:
    """The cache folder a run uses: `--cache-dir` (else the default), checked before
    any work (`kernelsat.cachefile.cache_dir_for_run`). Not a folder: refused, exit 2.
    Not creatable or not writable: a warning, and a temporary folder for this run."""
    with ExitStack() as stack:
        try:
            folder = stack.enter_context(cache_dir_for_run(cache_dir(option)))
        except CacheDirError as e:
            refuse(f"--cache-dir: {e}")
        yield folder
