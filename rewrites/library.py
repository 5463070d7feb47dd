"""The rule library's files: the `.rules` files of this package, parsed but not verified.

`library_rules(families)` reads the shipped families, `user_rules(extra)` a user's rules,
and a `RuleSet` holds rules under a hash (what a certificate records). Verifying them is
the proofs stage's work: `kernelsat.proofs.library.load_library` verifies every rule
before it loads, and the stand-alone checker (`kernelsat.proofs.checker`) replays
certificates against the shipped files as they are.

>>> lib = RuleSet(tuple(library_rules(["elementwise"])), verified=False)
>>> lib.by_name["mul-one"].text()
'mul-one: (mul ?x (Const 1.0)) => ?x [elementwise]'
>>> lib.by_name["mul-one"].verified is None
True
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
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
    "simplify",
    "select",
    "activations",
    "affine",
    "gather",
)
"""Every family shipped, one `<family>.rules` file each."""

FORWARD_ONLY_FAMILIES: frozenset[str] = frozenset({"simplify", "activations", "gather"})
"""Families the e-graph runs forward only: they shrink programs, and their backward
directions only grow it (`zero x => x - x`, `zero x => zero (exp x)` at every zero, each
iteration; a gather pulled back over every op above it computes the op on the whole
operand). Both directions are still proved, and a certificate may use either."""


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
