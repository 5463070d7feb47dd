"""kernelsat: a verified kernel superoptimizer.

The library API (the CLI is built on it):

- `load_spec(path, params)` / `parse_spec(text)`: a `.ks` spec as a `Program`.
- `optimize(spec, target="c", ...) -> Result`: the fastest proved program.
- `verify(certificate) -> CheckResult`: replay a certificate with the checker.
- `load_library(extra=...) -> RuleSet`: the verified rule library (user rules verified
  on entry; one that does not verify raises `UnverifiedRuleError`, one proved only up
  to a size bound its subclass `BoundedRuleError` unless `allow_bounded=True`).
- IR constructors (`In`, `Sum`, `SoftmaxAvg`, ...) in `kernelsat.ir`; hypothesis
  strategies in `kernelsat.testing`.

Every error the API raises on bad input is importable from here: `SpecError` (a spec
that does not parse, with path:line:col), `SExprError`, `ShapeError`, `RuleError` and
its `UnverifiedRuleError`, `CertificateError`, `OptimizeError`, `OutputError`. All but
`OutputError` (an `OSError`) are `ValueError`s.

Proofs are about real arithmetic; float error is measured against a float64
reference on random inputs, never assumed.

>>> import kernelsat
>>> kernelsat.__version__ != ""
True
>>> issubclass(kernelsat.UnverifiedRuleError, kernelsat.RuleError)
True
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from kernelsat.ir import ShapeError, Term
from kernelsat.program import Program
from kernelsat.proofs.certificate import CertificateError
from kernelsat.proofs.checker import CheckResult, Library, check
from kernelsat.rewrites.library import RuleSet
from kernelsat.rewrites.rule import RuleError
from kernelsat.sexpr import SExprError
from kernelsat.spec import load_spec, parse_spec
from kernelsat.spec_syntax import SpecError

if TYPE_CHECKING:
    from kernelsat.driver.outputs import OutputError
    from kernelsat.driver.pipeline import Candidate, OptimizeError, Result, optimize
    from kernelsat.proofs.library import BoundedRuleError, UnverifiedRuleError, load_library

_LAZY: dict[str, str] = {
    "Candidate": "kernelsat.driver.pipeline",
    "OptimizeError": "kernelsat.driver.pipeline",
    "Result": "kernelsat.driver.pipeline",
    "optimize": "kernelsat.driver.pipeline",
    "OutputError": "kernelsat.driver.outputs",
    "BoundedRuleError": "kernelsat.proofs.library",
    "UnverifiedRuleError": "kernelsat.proofs.library",
    "load_library": "kernelsat.proofs.library",
}
"""Names loaded on first use: importing `kernelsat` (as every `kernelsat.<module>` import
does) loads the core and the certificate checker only, not the driver, the verifiers
(z3) or the e-graph engine (egglog); `python -m kernelsat.proofs.checker` stays light."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kernelsat' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})

try:
    __version__: str = version("kernelsat")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
"""The installed distribution's version: pyproject.toml is its one source."""

__all__ = [
    "BoundedRuleError",
    "Candidate",
    "CertificateError",
    "CheckResult",
    "OptimizeError",
    "OutputError",
    "Program",
    "Result",
    "RuleError",
    "RuleSet",
    "SExprError",
    "ShapeError",
    "SpecError",
    "Term",
    "UnverifiedRuleError",
    "__version__",
    "load_library",
    "load_spec",
    "optimize",
    "parse_spec",
    "verify",
]


def verify(certificate: object, library: Library | None = None, *,
           spec: Program | Term | None = None, program: Term | None = None) -> CheckResult:
    """Check a certificate (JSON text, a parsed object or a `Certificate`) against the
    verified rule library; returns `CheckResult(accepted, failed_step, reason)`. Without
    `library`, that is the shipped rule files as they are (`shipped_library()`, what the
    stand-alone checker uses): no verifier runs here; the suite and every `load_library`
    verify exactly those files. With
    `spec` (e.g. `load_spec(path, params)`) the certificate must be about that spec; with
    `program`, it must prove that program."""
    wanted = spec.term if isinstance(spec, Program) else spec
    return check(certificate, library, spec=wanted, program=program)
