"""Local search over extractions under a whole-program cost.

Per-node costs cannot see what code generation will do with a program (a sub-term
recomputed inside a loop nest, an online reduction fused into one pass), so this
extractor starts from a greedy choice and improves it class by class under a
whole-term cost, typically the roofline estimate of the *lowered* program
(`lowered_cost`). Without a term cost (and on foreign e-graphs, through `choose`) it
climbs on DAG cost from the greedy DAG pick, which it can only improve on. Every move
keeps the choice acyclic (checked).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kernelsat.codegen import lower
from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract.base import (
    Cost,
    Extraction,
    ExtractionError,
    Graph,
    Pick,
    checked_costs,
    choice_dag_cost,
    dag_cost,
    extract_picks,
    node_costs,
    resolve_cost,
    used_choice,
)
from kernelsat.extract.greedy import greedy_dag_choice, greedy_tree_choice
from kernelsat.hardware.cost import estimate
from kernelsat.ir import Term

TermCost = Callable[[Term], float]

ChoiceScore = Callable[[dict[int, int]], float | None]
"""A choice's score (lower is better), or None when it is not a program (cyclic)."""


@dataclass
class LocalSearch:
    """Hill-climb on the choice of each class used by the current program.

    `term_cost` scores whole programs (lower is better; None: the DAG cost under the
    per-node cost). Starting points are the greedy tree extraction (the greedy DAG one
    without a term cost); each round tries every alternative node of every class the
    current program uses (newly reached classes take the start's choice) and keeps the
    best improvement. Bounded by `max_evals` scored programs and `max_rounds` rounds."""

    term_cost: TermCost | None = None
    max_evals: int = 600
    max_rounds: int = 8
    name: str = "local"

    def choose(self, graph: Graph, root: int, costs: Sequence[float]) -> list[Pick]:
        costs = checked_costs(graph, costs)
        start, _ = greedy_dag_choice(graph, root, costs)

        def score(choice: dict[int, int]) -> float | None:
            try:
                return choice_dag_cost(graph, root, choice, costs)
            except ExtractionError:
                return None

        choice, _, evals = climb(graph, root, start, score, self.max_evals, self.max_rounds)
        return [Pick(choice, f"local optimum after {evals} evaluations")]

    def extract(self, snapshot: Snapshot, root: int, cost: Cost) -> list[Extraction]:
        search, term_cost = resolve_cost(cost)
        if self.term_cost is not None:
            term_cost = self.term_cost
        if term_cost is None:
            return extract_picks(self, snapshot, root, cost)
        scores: dict[str, float] = {}
        measure = term_cost

        def score(choice: dict[int, int]) -> float | None:
            try:
                term = snapshot.term(choice, root)
            except ValueError:
                return None
            if term.key not in scores:
                try:
                    scores[term.key] = float(measure(term))
                except Exception:  # a program the cost model cannot lower is not a move
                    scores[term.key] = float("inf")
            return scores[term.key]

        start = greedy_tree_choice(snapshot, root, node_costs(snapshot, search))
        choice, value, evals = climb(snapshot, root, start, score, self.max_evals, self.max_rounds)
        term = snapshot.term(choice, root)
        status = f"local optimum after {evals} evaluations"
        return [Extraction(term, choice, value, self.name, status)]


def climb(
    graph: Graph,
    root: int,
    start: Mapping[int, int],
    score: ChoiceScore,
    max_evals: int,
    max_rounds: int,
) -> tuple[dict[int, int], float, int]:
    """Best-improvement hill climbing from `start` (a choice that may cover more classes
    than the program uses; those fill in newly reached classes). Returns the final
    choice (the classes it uses only), its score and the number of scores computed."""
    fallback = dict(start)
    choice = used_choice(graph, root, start)
    evals = 0
    seen: dict[frozenset[tuple[int, int]], float | None] = {}

    def measure(trial: dict[int, int]) -> float | None:
        nonlocal evals
        try:
            used = used_choice(graph, root, trial)
        except ExtractionError:
            return None
        key = frozenset(used.items())
        if key not in seen:
            evals += 1
            seen[key] = score(used)
        return seen[key]

    current = measure(choice)
    if current is None:
        raise ExtractionError(f"local search: the starting choice of class {root} is no program")
    for _ in range(max_rounds):
        best_move: tuple[float, dict[int, int]] | None = None
        for c in list(choice):
            for n in graph.classes[c]:
                if n == choice[c] or evals >= max_evals:
                    continue
                trial = {**fallback, **choice, c: n}
                got = measure(trial)
                if got is not None and got < current and (best_move is None or got < best_move[0]):
                    best_move = (got, trial)
        if best_move is None:
            break
        current, choice = best_move[0], used_choice(graph, root, best_move[1])
    return choice, current, evals


def lowered_cost(out_axes: tuple[str, ...], target: object) -> TermCost:
    """The roofline estimate of the program as code generation lowers it (recomputation
    inside loop nests included), for `target` (a `kernelsat.hardware.targets.Target`)."""
    def cost(term: Term) -> float:
        return estimate(lower(term, out_axes), target)

    return cost


__all__ = ["LocalSearch", "climb", "dag_cost", "lowered_cost"]
