"""Boltzmann sampling of diverse acyclic programs.

Top-down from the root: at each class not yet resolved, pick one of its nodes with
probability proportional to `exp(-(below(n) - below_min) / (temperature * scale))`,
where `below(n)` is the node's tree cost with the cheapest sub-terms under it (from the
greedy tree pass), `below_min` the cheapest candidate's, and `scale` the class's own
cheapest tree cost (so the temperature is relative: at 1.0 a node 100% dearer than the
best is e times less likely). Nodes that would close a cycle on the current path are
masked; a class resolved once keeps its node (the sample is a DAG, one node per class).
If every node of a class is masked the draw is abandoned and retried. Samples are
deduplicated by term key and returned cheapest first. A temperature of 0 picks the
cheapest candidate every time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract.base import (
    Cost,
    Extraction,
    ExtractionError,
    finish,
    node_costs,
    resolve_cost,
)
from kernelsat.extract.greedy import settle, tree_score

Candidates = dict[int, list[tuple[int, float]]]
"""class -> its extractable nodes with their tree cost below, cheapest first."""


@dataclass(frozen=True, slots=True)
class Sampler:
    """Up to `n` distinct programs drawn with `seed`, in at most `max_attempts` draws
    (default `20 * n`)."""

    n: int = 16
    temperature: float = 1.0
    seed: int = 0
    max_attempts: int | None = None
    name: str = "sample"

    def extract(self, snapshot: Snapshot, root: int, cost: Cost) -> list[Extraction]:
        search, term_cost = resolve_cost(cost)
        candidates, scale = _candidates(snapshot, root, node_costs(snapshot, search))
        rng = np.random.default_rng(self.seed)
        found: dict[str, Extraction] = {}
        attempts = self.max_attempts if self.max_attempts is not None else 20 * self.n
        for _ in range(attempts):
            if len(found) >= self.n:
                break
            choice = draw(snapshot, root, candidates, scale, self.temperature, rng)
            if choice is None:
                continue
            extraction = finish(snapshot, root, choice, search, term_cost, self.name, "sampled")
            found.setdefault(extraction.term.key, extraction)
        return sorted(found.values(), key=lambda e: e.cost)


def _candidates(
    snapshot: Snapshot, root: int, costs: list[float]
) -> tuple[Candidates, dict[int, float]]:
    settled = settle(snapshot, root, tree_score(snapshot, costs), full=True)
    if root not in settled.best:
        raise ExtractionError(f"class {root} has no acyclic extraction")
    fallback = settled.cost[root] if settled.cost[root] > 0 else 1.0
    candidates: Candidates = {}
    scale: dict[int, float] = {}
    for c in settled.best:
        options = []
        for n in snapshot.classes[c]:
            kids = snapshot.nodes[n].children
            if c not in kids and all(k in settled.best for k in kids):
                options.append((n, costs[n] + sum(settled.cost[k] for k in kids)))
        candidates[c] = sorted(options, key=lambda o: o[1])
        scale[c] = settled.cost[c] if settled.cost[c] > 0 else fallback
    return candidates, scale


def _pick(
    options: list[tuple[int, float]], scale: float, temperature: float, rng: np.random.Generator
) -> int:
    if temperature <= 0 or len(options) == 1:
        return options[0][0]
    low = min(b for _, b in options)
    weights = np.array([math.exp(-(b - low) / (temperature * scale)) for _, b in options])
    return options[int(rng.choice(len(options), p=weights / weights.sum()))][0]


def draw(
    snapshot: Snapshot,
    root: int,
    candidates: Candidates,
    scale: dict[int, float],
    temperature: float,
    rng: np.random.Generator,
) -> dict[int, int] | None:
    """One top-down draw: a choice for every class the program uses, or None when a
    class had every node masked by the current path."""
    choice: dict[int, int] = {}
    path: set[int] = set()
    stack: list[tuple[int, int]] = []

    def enter(c: int) -> bool:
        path.add(c)
        options = [o for o in candidates[c] if path.isdisjoint(snapshot.nodes[o[0]].children)]
        if not options:
            return False
        choice[c] = _pick(options, scale[c], temperature, rng)
        stack.append((c, 0))
        return True

    if not enter(root):
        return None
    while stack:
        c, i = stack[-1]
        children = snapshot.nodes[choice[c]].children
        if i == len(children):
            stack.pop()
            path.discard(c)
            continue
        stack[-1] = (c, i + 1)
        k = children[i]
        if k not in choice and not enter(k):
            return None
    return choice
