"""One step of a proof: a named rule applied once, forward or backward, at a position."""

from __future__ import annotations

from dataclasses import dataclass

from kernelsat.rewrites.rule import Direction, Path, Value


@dataclass(frozen=True)
class Step:
    """Apply rule `rule` in `direction` at `path` (child indices from the root) of the
    current term, with `bindings` for its variables (those the match cannot determine,
    such as a split factor, must be present; the others are checked against the match)."""

    rule: str
    direction: Direction
    path: Path
    bindings: dict[str, Value]
