"""Rule verification: every rule is machine-checked, and records how.

- Elementwise rules (only elementwise ops and constants): z3 proves `lhs = rhs` for
  all reals under the side conditions (`proofs.verify_smt`), hence for every shape.
  Method `smt`.
- Rules with reductions, splits, stores or sizes: z3 proves every entry of every
  instance up to a bound (`proofs.verify_bounded`). Method `bounded`, with the bound.
- Every rule is also run on a few random larger instances by the float64
  interpreter (`proofs.verify_numeric`): a mismatch there fails the rule even when
  z3 proved it (that would be a bug in the trusted base, so it is loud).

A failure carries a counterexample: the variable values (and the shapes, for
bounded rules) where the sides differ, or where one side is defined and the other
is not. Results are cached by rule key and verifier version in a JSON file
(`VerificationCache`), so repeated runs are fast.

>>> from kernelsat.rewrites.rule import parse_rule
>>> v = verify_rule(parse_rule("mul-one: (mul ?x (Const 1.0)) => ?x [elementwise]"))
>>> v.ok, v.method
(True, 'smt')
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

from kernelsat.proofs.verify_bounded import Bounds, verify_bounded
from kernelsat.proofs.verify_numeric import numeric_check
from kernelsat.proofs.verify_smt import is_elementwise, verify_elementwise
from kernelsat.rewrites.rule import Rule, RuleError

CACHE_FILE = "rule-verification.json"
NUMERIC_TRIALS = 4

_SOURCES = ("axioms.py", "normalize.py", "verify_sym.py", "verify_smt.py", "verify_bounded.py",
            "verify_numeric.py", "verify.py")


def verifier_version() -> str:
    """A hash of the verifier's own sources: a cached result is reused only by the same
    verifier that produced it."""
    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in _SOURCES:
        h.update((here / name).read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Verification:
    """How one rule was verified. `method`: `smt` (all reals, every shape) or `bounded`
    (every instance within `bound`); `status`: proved, refuted, unproved (z3 found a
    model the real functions do not confirm, or timed out), or error."""

    rule: str
    key: str
    ok: bool
    method: str
    status: str
    bound: str | None = None
    instances: int = 0
    seconds: float = 0.0
    counterexample: str | None = None

    def label(self) -> str:
        """`smt` or `bounded(...)`: what `Rule.verified` records."""
        return self.method if self.bound is None else f"{self.method}({self.bound})"


def verify_rule(rule: Rule, bounds: Bounds | None = None,
                numeric_trials: int = NUMERIC_TRIALS) -> Verification:
    """Verify one rule (no cache)."""
    bounds = bounds or Bounds()
    start = time.perf_counter()
    try:
        v = _verify(rule, bounds, numeric_trials)
    except (RuleError, ValueError, KeyError) as e:
        v = Verification(rule.name, rule.key, False, "none", "error", counterexample=str(e))
    return Verification(**{**asdict(v), "seconds": round(time.perf_counter() - start, 4)})


def _verify(rule: Rule, bounds: Bounds, numeric_trials: int) -> Verification:
    confirmed = True
    if is_elementwise(rule):
        out = verify_elementwise(rule)
        ok, status, why, method, bound, count = (out.ok, out.status, out.counterexample, "smt",
                                                 None, 1)
        confirmed = out.confirmed
    else:
        b = verify_bounded(rule, bounds)
        ok, status, why, method, bound, count = (b.ok, b.status, b.counterexample, "bounded",
                                                 bounds.text(), b.instances)
    numeric = numeric_check(rule, seed=0, trials=numeric_trials) if numeric_trials else None
    if ok and numeric is not None:
        status, ok, why = "inconsistent", False, (
            f"z3 proved the rule but the float64 interpreter disagrees: {numeric}")
    elif not ok and status == "refuted" and not cast(str, why).startswith("shape"):
        numeric = numeric or numeric_check(rule, seed=1, trials=4 * numeric_trials)
        if numeric is None and not confirmed:
            status = "unproved"  # z3's model leans on the uninterpreted functions
        why = f"{why}\n    confirmed numerically: {numeric}" if numeric else why
    return Verification(rule.name, rule.key, ok, method, status, bound, count, 0.0, why)


class VerificationCache:
    """Results by rule key, in `<dir>/rule-verification.json`, for one verifier version."""

    def __init__(self, directory: str | Path | None = None) -> None:
        from kernelsat.hardware.config import cache_dir

        self.path = cache_dir(directory) / CACHE_FILE
        self.version = verifier_version()
        self.entries: dict[str, dict[str, object]] = {}
        try:
            data = json.loads(self.path.read_text())
            if data.get("version") == self.version:
                self.entries = dict(data.get("rules", {}))
        except (OSError, ValueError):
            pass
        self.dirty = False

    def get(self, rule: Rule) -> Verification | None:
        hit = self.entries.get(rule.key)
        return Verification(**hit) if hit is not None else None  # type: ignore[arg-type]

    def put(self, v: Verification) -> None:
        self.entries[v.key] = asdict(v)
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"version": self.version, "rules": self.entries},
                                      indent=1, sort_keys=True))
            tmp.replace(self.path)
            self.dirty = False
        except OSError:
            pass  # a read-only cache folder only costs time


def verify_rules(rules: Iterable[Rule], cache_dir: str | Path | None = None,
                 use_cache: bool = True, cached_only: bool = False) -> list[Verification]:
    """Verify every rule, through the cache. `cached_only`: never verify, report what the
    cache knows (rules it does not know come back with status `unknown`)."""
    cache = VerificationCache(cache_dir)
    out: list[Verification] = []
    for rule in rules:
        hit = cache.get(rule) if use_cache else None
        if hit is None and cached_only:
            hit = Verification(rule.name, rule.key, False, "none", "unknown")
        if hit is None:
            hit = verify_rule(rule)
            cache.put(hit)
        out.append(hit)
    cache.save()
    return out
