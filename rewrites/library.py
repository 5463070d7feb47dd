"""The rule library: the `.rules` files of this package, verified before they load.

>>> import tempfile
>>> lib = load_library(["elementwise"], cache_dir=tempfile.mkdtemp())
>>> lib.by_name["mul-one"].text()
'mul-one: (mul ?x (Const 1.0)) => ?x [elementwise]'
>>> lib.by_name["mul-one"].verified
'smt'

`load_library` verifies every rule (through the verification cache) and raises
`UnverifiedRuleError` for any rule that does not verify; a `RuleSet` built with the
default `verified_only=True` holds only verified rules, each with `Rule.verified`
recording how. User rules passed in `extra` are verified the same way, and must be
proved for all sizes: one proved only up to the bounded verifier's size bound raises
`BoundedRuleError` unless `allow_bounded=True`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from kernelsat.rewrites.rule import Rule, RuleError, parse_rules

FAMILIES: tuple[str, ...] = (
    "elementwise",
    "constfold",
    "reduction",
    "online",
    "tiling",
    "contraction",
    "materialization",
)
"""Every family shipped, one `<family>.rules` file each."""


class UnverifiedRuleError(RuleError):
    """A rule did not verify; `verification` holds the counterexample."""

    def __init__(self, rule: Rule, verification: object, message: str | None = None) -> None:
        self.rule, self.verification = rule, verification
        why = getattr(verification, "counterexample", None) or getattr(verification, "status", "")
        status = getattr(verification, "status", "?")
        super().__init__(message or
                         f"rule {rule.name} does not verify ({status}): {why}\n  {rule.text()}")


class BoundedRuleError(UnverifiedRuleError):
    """A user rule proved only for sizes up to a bound, not for all sizes: refused unless
    the user allows it (`allow_bounded=True`, CLI `--allow-bounded`)."""

    def __init__(self, rule: Rule, verification: object) -> None:
        bound = getattr(verification, "bound", None)
        super().__init__(rule, verification, (
            f"rule {rule.name} is proved only up to a bound ({bound}), not for all sizes: a "
            "rule that holds for small sizes can fail for larger ones, so a user rule must be "
            "proved for all sizes. Pass allow_bounded=True (CLI: --allow-bounded) to load it "
            f"anyway; the run then records that it did.\n  {rule.text()}"))


@dataclass(frozen=True)
class RuleSet:
    """An immutable set of rules. `hash` is a sha256 over the sorted rule texts (what a
    certificate records); `verified` is True when every rule was verified on loading."""

    rules: tuple[Rule, ...]
    verified: bool = True
    bounded_user_rules: tuple[str, ...] = ()
    """User rules proved only up to a bound, loaded because the user allowed it."""
    by_name: Mapping[str, Rule] = field(init=False, repr=False, compare=False)
    hash: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        names: dict[str, Rule] = {}
        for r in self.rules:
            if r.name in names:
                raise RuleError(f"two rules named {r.name!r}")
            names[r.name] = r
        object.__setattr__(self, "by_name", names)
        text = "\n".join(sorted(r.text() for r in self.rules))
        object.__setattr__(self, "hash", hashlib.sha256(text.encode()).hexdigest())

    @property
    def families(self) -> tuple[str, ...]:
        """The families present, in first-seen order."""
        return tuple(dict.fromkeys(r.family for r in self.rules))

    def family(self, name: str) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.family == name)

    def __len__(self) -> int:
        return len(self.rules)

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)


def family_text(family: str) -> str:
    """The text of a shipped `.rules` file."""
    if family not in FAMILIES:
        raise RuleError(f"unknown rule family {family!r}; expected one of {', '.join(FAMILIES)}")
    return resources.files("kernelsat.rewrites").joinpath(f"{family}.rules").read_text()


def library_rules(families: Sequence[str] | None = None) -> list[Rule]:
    """The shipped rules of `families` (default: all), unverified, in file order."""
    out: list[Rule] = []
    for fam in families or FAMILIES:
        for rule in parse_rules(family_text(fam), f"{fam}.rules"):
            if rule.family != fam:
                raise RuleError(f"{fam}.rules: rule {rule.name} is tagged [{rule.family}]")
            out.append(rule)
    return out


def user_rules(extra: Iterable[Rule | str | Path]) -> list[Rule]:
    """Rules given by a user: Rule objects, rule text, or paths of `.rules` files."""
    out: list[Rule] = []
    for item in extra:
        if isinstance(item, Rule):
            out.append(item)
        elif isinstance(item, Path):
            out.extend(parse_rules(item.read_text(), str(item)))
        else:
            out.extend(parse_rules(item, "<extra>"))
    return out


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
    A user rule whose proof covers sizes only up to a bound raises `BoundedRuleError`
    unless `allow_bounded` (then the set lists it in `bounded_user_rules`). Library
    rules proved up to the bound load: they are reviewed, and each records its bound
    in `Rule.verified`. With `verified_only=False` nothing is verified: each rule
    records what the cache already knows (or nothing), and the set says
    `verified=False` (for listing only).
    """
    from kernelsat.proofs.verify import verify_rules

    shipped = library_rules(families)
    rules = shipped + user_rules(extra)
    results = verify_rules(rules, cache_dir, cached_only=not verified_only)
    loaded: list[Rule] = []
    bounded: list[str] = []
    for i, (rule, v) in enumerate(zip(rules, results, strict=True)):
        if v.ok and not v.all_sizes and i >= len(shipped) and verified_only:
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
