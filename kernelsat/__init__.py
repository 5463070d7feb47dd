"""kernelsat: a verified kernel superoptimizer.

The library API (the CLI is built on it):

- `load_spec(path, params)` / `parse_spec(text)`: a `.ks` spec as a `Program`.
- `optimize(spec, target="c", ...) -> Result`: the fastest proved program.
- `verify(certificate) -> CheckResult`: replay a certificate with the checker.
- `load_library(extra=...)`: the verified rule library (user rules verified on entry).
- IR constructors (`In`, `Sum`, `SoftmaxAvg`, ...) in `kernelsat.ir`; hypothesis
  strategies in `kernelsat.testing`.

Proofs are about real arithmetic; float error is measured against a float64
reference on random inputs, never assumed.
"""

from __future__ import annotations

from typing import Any

from kernelsat.ir import Term
from kernelsat.program import Program

__all__ = ["Program", "Term", "load_library", "load_spec", "optimize", "parse_spec", "verify"]


def load_spec(path: str, params: dict[str, int] | None = None) -> Program:
    """Parse a `.ks` file (with size overrides) into a `Program`."""
    from kernelsat.spec import load_spec as _load

    return _load(path, params)


def parse_spec(text: str, path: str = "<spec>", params: dict[str, int] | None = None) -> Program:
    """Parse spec text into a `Program`."""
    from kernelsat.spec import parse_spec as _parse

    return _parse(text, path, params)


def optimize(spec: Any, target: str = "c", **kwargs: Any) -> Any:
    """See `kernelsat.pipeline.optimize`."""
    from kernelsat.pipeline import optimize as _optimize

    return _optimize(spec, target, **kwargs)


def verify(certificate: Any, library: Any = None) -> Any:
    """Check a certificate (JSON text, a path-less parsed object or a `Certificate`)
    against the verified rule library; returns `CheckResult(accepted, failed_step, reason)`."""
    from kernelsat.proofs.checker import check

    return check(certificate, library)


def load_library(**kwargs: Any) -> Any:
    """See `kernelsat.rewrites.library.load_library`."""
    from kernelsat.rewrites.library import load_library as _load

    return _load(**kwargs)
