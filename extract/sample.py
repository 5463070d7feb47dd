"""Boltzmann sampling of diverse acyclic programs.

Top-down from the root: at each class not yet resolved, pick one of its nodes with
probability proportional to `exp(-(below(n) - below_min) / (temperature * scale))`,
where `below(n)` is the node's tree cost with the cheapest sub-terms under it (from the
greedy tree pass), `below_min` the cheapest candidate's, and `scale` the class's own
cheapest tree cost (so the temperature is relative: at 1.0 a node 100% dearer than the
best is e times less likely). Nodes that would close a cycle on the current path are
masked; a class resolved once keeps its node (the sample is a DAG, one node per class).

A pick can lead into a dead end: every node of a class below it has a child on the
current path (roots reachable only through cycles, classes whose nodes all lead back
up). The draw then backtracks: the class above drops that node and picks again among
its others, and so on up (classes resolved meanwhile keep their nodes, which stay
acyclic since their sub-terms avoid the path). A draw that spends more than its step
budget is abandoned and retried. Samples are deduplicated and returned cheapest first.
If every attempt was abandoned, the greedy tree pass's choice (acyclic by construction)
is returned with status `greedy-fallback`, so the list is never empty; a root with no
acyclic program raises `ExtractionError`.

A temperature of 0 picks the cheapest candidate every time, ties going to the greedy
pass's node, which never needs a backtrack.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract.base import (
    Cost,
    Extraction,
    ExtractionError,
    Graph,
    Pick,
    checked_costs,
    extract_picks,
    used_choice,
)
from kernelsat.extract.greedy import Settled, no_extraction, settle, tree_score

Candidates = dict[int, list[tuple[int, float]]]
"""class -> its extractable nodes with their tree cost below, cheapest first."""


@dataclass(frozen=True, slots=True)
class Sampler:
    """Up to `n` distinct programs drawn with `seed`, in at most `max_attempts` draws
    (default `20 * n`); at least one whenever the root has an acyclic program."""

    n: int = 16
    temperature: float = 1.0
    seed: int = 0
    max_attempts: int | None = None
    name: str = "sample"

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"Sampler: n must be at least 1, got {self.n}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"Sampler: max_attempts must be at least 1, got {self.max_attempts}")
        if not self.temperature >= 0:
            raise ValueError(f"Sampler: temperature must be >= 0, got {self.temperature}")

    def choose(self, graph: Graph, root: int, costs: Sequence[float]) -> list[Pick]:
        settled = settle(graph, root, tree_score(graph, checked_costs(graph, costs)), full=True)
        candidates, scale = _candidates(graph, root, settled, costs)
        rng = np.random.default_rng(self.seed)
        found: dict[frozenset[tuple[int, int]], Pick] = {}
        attempts = self.max_attempts if self.max_attempts is not None else 20 * self.n
        budget = 8 * len(candidates) + 64
        for _ in range(attempts):
            if len(found) >= self.n:
                break
            choice = draw(graph, root, candidates, scale, self.temperature, rng, budget)
            if choice is not None:  # a backtrack may leave classes the program does not use
                used = used_choice(graph, root, choice)
                found.setdefault(frozenset(used.items()), Pick(used, "sampled"))
        if not found:
            return [Pick(used_choice(graph, root, settled.best), "greedy-fallback")]
        return list(found.values())

    def extract(self, snapshot: Snapshot, root: int, cost: Cost) -> list[Extraction]:
        return extract_picks(self, snapshot, root, cost)


def _candidates(
    graph: Graph, root: int, settled: Settled, costs: Sequence[float]
) -> tuple[Candidates, dict[int, float]]:
    if root not in settled.best:
        raise ExtractionError(no_extraction(graph, root))
    fallback = settled.cost[root] if settled.cost[root] > 0 else 1.0
    candidates: Candidates = {}
    scale: dict[int, float] = {}
    for c in settled.best:
        options = []
        for n in graph.classes[c]:
            kids = graph.nodes[n].children
            if c not in kids and all(k in settled.best for k in kids):
                options.append((n, costs[n] + sum(settled.cost[k] for k in kids)))
        greedy = settled.best[c]
        candidates[c] = sorted(options, key=lambda o: (o[1], o[0] != greedy))
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
    graph: Graph,
    root: int,
    candidates: Candidates,
    scale: dict[int, float],
    temperature: float,
    rng: np.random.Generator,
    budget: int | None = None,
) -> dict[int, int] | None:
    """One top-down draw with backtracking: a choice for every class the program uses,
    or None when it took more than `budget` picks (default: unbounded)."""
    choice: dict[int, int] = {}
    path: set[int] = set()
    # frames: (class, index of the next child to visit, nodes still allowed for it)
    stack: list[tuple[int, int, list[tuple[int, float]]]] = []
    picks = 0

    def choose(c: int, options: list[tuple[int, float]]) -> bool:
        nonlocal picks
        allowed = [o for o in options if path.isdisjoint(graph.nodes[o[0]].children)]
        if not allowed:
            return False
        picks += 1
        choice[c] = _pick(allowed, scale[c], temperature, rng)
        stack.append((c, 0, [o for o in allowed if o[0] != choice[c]]))
        return True

    def enter(c: int) -> bool:
        path.add(c)
        if choose(c, candidates[c]):
            return True
        path.discard(c)
        return False

    if not enter(root):
        return None
    while stack:
        if budget is not None and picks > budget:
            return None
        c, i, others = stack[-1]
        children = graph.nodes[choice[c]].children
        if i == len(children):
            stack.pop()
            path.discard(c)
            continue
        stack[-1] = (c, i + 1, others)
        k = children[i]
        if k in choice or enter(k):
            continue
        # dead end below c's node: c tries its other nodes, else gives up in turn
        while stack:
            c, _, others = stack.pop()
            del choice[c]
            if choose(c, others):
                break
            path.discard(c)
        else:
            return None
    return choice
