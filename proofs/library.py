"""The verified rule library: the shipped `.rules` files (`kernelsat.rewrites.library`)
plus a user's rules, each verified before it loads.

>>> import tempfile
>>> lib = load_library(["elementwise"], cache_dir=tempfile.mkdtemp())
>>> lib.by_name["mul-one"].text()
'mul-one: (mul ?x (Const 1.0)) => ?x [elementwise]'
>>> lib.by_name["mul-one"].verified
'smt'

`load_library` verifies every rule (through the verification cache) and raises
`UnverifiedRuleError` for any rule that does not verify; a `RuleSet` built with the
default `verified_only=True` holds only verified rules, each with `Rule.verified`
recording how. User rules passed in `extra` are verified the same way. Every rule must
be proved for all sizes: one proved only up to the bounded verifier's size bound (a
library rule or a user rule) raises `BoundedRuleError` unless `allow_bounded=True`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path

from kernelsat.proofs.verify import verify_rules
from kernelsat.rewrites import library as rule_files
from kernelsat.rewrites.library import RuleSet
from kernelsat.rewrites.rule import Rule, RuleError


class UnverifiedRuleError(RuleError):
    """A rule did not verify; `verification` holds the counterexample."""

    def __init__(self, rule: Rule, verification: object, message: str | None = None) -> None:
        self.rule, self.verification = rule, verification
        why = getattr(verification, "counterexample", None) or getattr(verification, "status", "")
        status = getattr(verification, "status", "?")
        super().__init__(message or
                         f"rule {rule.name} does not verify ({status}): {why}\n  {rule.text()}")


class BoundedRuleError(UnverifiedRuleError):
    """A rule proved only for sizes up to a bound, not for all sizes: refused unless the
    user allows it (`allow_bounded=True`, CLI `--allow-bounded`)."""

    def __init__(self, rule: Rule, verification: object) -> None:
        bound = getattr(verification, "bound", None)
        limit = getattr(verification, "limit", None)
        super().__init__(rule, verification, (
            f"rule {rule.name} is proved only up to a bound ({bound}), not for all sizes: a "
            "rule that holds for small sizes can fail for larger ones, so a rule must be "
            "proved for all sizes. Pass allow_bounded=True (CLI: --allow-bounded) to load it "
            f"anyway; the run then records that it did.\n  {rule.text()}"
            + (f"\n  why no all-sizes proof: {limit}" if limit else "")))


def load_library(
    families: Sequence[str] | None = None,
    verified_only: bool = True,
    extra: Iterable[Rule | str | Path] = (),
    cache_dir: str | Path | None = None,
    allow_bounded: bool = False,
) -> RuleSet:
    """The rule library (optionally only some families) plus `extra` user rules.

    With `verified_only` (the default, and what the optimizer must use) every rule is
    verified, through the cache, and any rule that fails raises `UnverifiedRuleError`.
    A rule whose proof covers sizes only up to a bound (a user rule, or a library rule
    the all-sizes method does not prove) raises `BoundedRuleError` unless
    `allow_bounded` (then the set lists it in `bounded_user_rules`, and it records its
    bound in `Rule.verified`). With `verified_only=False` nothing is verified: each rule
    records what the cache already knows (or nothing), and the set says
    `verified=False` (for listing only).
    """
    shipped = rule_files.library_rules(families)
    rules = shipped + rule_files.user_rules(extra)
    results = verify_rules(rules, cache_dir, cached_only=not verified_only)
    loaded: list[Rule] = []
    bounded: list[str] = []
    for rule, v in zip(rules, results, strict=True):
        if v.ok and not v.all_sizes and verified_only:
            if not allow_bounded:
                raise BoundedRuleError(rule, v)
            bounded.append(rule.name)
        if v.ok:
            loaded.append(replace(rule, verified=v.label()))
        elif verified_only:
            raise UnverifiedRuleError(rule, v)
        else:
            loaded.append(rule)
    return RuleSet(tuple(loaded), verified=verified_only, bounded_user_rules=tuple(bounded))
