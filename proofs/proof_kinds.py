"""How a rule was proved, and the shipped record of it (no z3: the checker reads it).

A proof kind is one of `PROOF_KINDS`, strongest first, optionally followed by details
in parentheses (`all sizes: lemma chain (split-reindex, sum-fubini)`). A chain of
rewrite steps is as strong as its weakest rule (`weakest`). The record of the shipped
library, `rewrites/proof-kinds.json`, maps each rule name to its key and its kind; it
is written by `kernelsat.proofs.verify.write_proof_kinds` and a test keeps it equal to
what the verifier proves.

>>> weakest(["all sizes: z3 elementwise", "all sizes: lemma chain (sum-hoist)"])
'all sizes: lemma chain (sum-hoist)'
>>> kind_class("bounded: sizes<=4, split sizes<=8, all factors")
'bounded'
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from importlib import resources

KIND_ELEMENTWISE = "all sizes: z3 elementwise"
KIND_LEMMAS = "all sizes: lemma chain"
KIND_BOUNDED = "bounded"
PROOF_KINDS = (KIND_ELEMENTWISE, KIND_LEMMAS, KIND_BOUNDED)
"""The proof kinds, strongest first."""
UNKNOWN = "unknown"
"""A rule the shipped record does not hold (at its current text): the weakest of all."""

RECORD = "proof-kinds.json"
"""The shipped record, in the `kernelsat.rewrites` package beside the `.rules` files."""


def kind_class(kind: str) -> str:
    """`all sizes: lemma chain (sum-fubini)` -> `all sizes: lemma chain`;
    `bounded: sizes<=4, ...` -> `bounded`."""
    head = kind.split(" (", 1)[0]
    return KIND_BOUNDED if head.startswith(KIND_BOUNDED) else head


def strength(kind: str) -> int:
    """0 for the strongest kind; larger is weaker; an unknown kind is the weakest."""
    c = kind_class(kind)
    return PROOF_KINDS.index(c) if c in PROOF_KINDS else len(PROOF_KINDS)


def weakest(kinds: Iterable[str]) -> str | None:
    """The weakest of some proof kinds (None for none)."""
    found = sorted(set(kinds), key=lambda k: (strength(k), k))
    return found[-1] if found else None


@functools.lru_cache(maxsize=1)
def shipped_record() -> Mapping[str, tuple[str, str]]:
    """Rule name -> (rule key, proof kind), as shipped; empty when the file is missing
    or damaged (every rule is then `UNKNOWN`)."""
    try:
        text = resources.files("kernelsat.rewrites").joinpath(RECORD).read_text()
        rules = json.loads(text)["rules"]
        return {str(n): (str(e["key"]), str(e["kind"])) for n, e in rules.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def shipped_kind(name: str, key: str) -> str:
    """The recorded proof kind of the rule `name` with key `key`, or `UNKNOWN` (a rule
    not recorded, or recorded for another text)."""
    hit = shipped_record().get(name)
    return hit[1] if hit is not None and hit[0] == key else UNKNOWN
