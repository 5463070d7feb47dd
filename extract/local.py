"""Local search over extractions under a whole-program cost.

Per-node costs cannot see what code generation will do with a program (a sub-term
recomputed inside a loop nest, an online reduction fused into one pass), so this
extractor starts from a greedy choice and improves it class by class under a
whole-term cost, typically the roofline estimate of the *lowered* program
(`lowered_cost`). Every move keeps the choice acyclic (checked by `Snapshot.term`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract.base import Extraction, check_extraction, dag_cost
from kernelsat.extract.greedy import GreedyTree
from kernelsat.ir import Term

TermCost = Callable[[Term], float]


@dataclass
class LocalSearch:
    """Hill-climb on the choice of each class used by the current program.

    `term_cost` scores whole programs (lower is better). Starting points are the
    greedy tree extraction under each per-node cost in `seeds`; each round tries every
    alternative node of every class the current program uses (newly reached classes
    take the seed's choice) and keeps the best improvement. Bounded by `max_evals`."""

    term_cost: TermCost
    max_evals: int = 600
    max_rounds: int = 8
    name: str = "local"

    def extract(self, snapshot: Snapshot, root: int, cost: object) -> list[Extraction]:
        base = GreedyTree().extract(snapshot, root, cost)[0]
        choice = dict(base.choice)
        fallback = dict(base.choice)
        scores: dict[str, float] = {}
        evals = 0

        def score(ch: dict[int, int]) -> tuple[float, Term] | None:
            nonlocal evals
            try:
                term = snapshot.term(ch, root)
            except ValueError:
                return None
            if term.key not in scores:
                evals += 1
                try:
                    scores[term.key] = float(self.term_cost(term))
                except Exception:  # a program the cost model cannot lower is not a move
                    scores[term.key] = float("inf")
            return scores[term.key], term

        current = score(choice)
        assert current is not None
        for _ in range(self.max_rounds):
            best_move: tuple[float, dict[int, int]] | None = None
            used = _used_classes(snapshot, choice, root)
            for c in used:
                for n in snapshot.classes[c]:
                    if n == choice[c] or evals >= self.max_evals:
                        continue
                    trial = {**fallback, **{k: choice[k] for k in used}, c: n}
                    got = score(trial)
                    if got is not None and got[0] < current[0] and (
                        best_move is None or got[0] < best_move[0]
                    ):
                        best_move = (got[0], trial)
            if best_move is None:
                break
            choice = best_move[1]
            current = score(choice)
            assert current is not None
        term = current[1]
        final = {c: choice[c] for c in _used_classes(snapshot, choice, root)}
        check_extraction(snapshot, root, final)
        status = f"local optimum after {evals} evaluations"
        return [Extraction(term, final, current[0], self.name, status)]


def _used_classes(snapshot: Snapshot, choice: dict[int, int], root: int) -> list[int]:
    seen: list[int] = []
    stack = [root]
    mark: set[int] = set()
    while stack:
        c = stack.pop()
        if c in mark:
            continue
        mark.add(c)
        seen.append(c)
        stack.extend(snapshot.nodes[choice[c]].children)
    return seen


def lowered_cost(out_axes: tuple[str, ...], target: object) -> TermCost:
    """The roofline estimate of the program as code generation lowers it (recomputation
    inside loop nests included), for `target` (a `kernelsat.hardware.targets.Target`)."""
    from kernelsat.codegen import lower
    from kernelsat.hardware.cost import estimate

    def cost(term: Term) -> float:
        return estimate(lower(term, out_axes), target)

    return cost


__all__ = ["LocalSearch", "dag_cost", "lowered_cost"]
