"""Equality saturation with egglog, bounded, iteration by iteration.

`saturate(term, rules)` renders the term and every rule direction to egglog, then runs
one iteration at a time from Python (the analyses saturated after each one), so it can
stop for a stated reason: `"saturated"`, `"iteration limit"`, `"node limit"` or
`"time limit"`. Rules can run in stages (`schedule`): stage k runs the rules of stages
0..k together, so a later stage (tiling, say) starts from the e-graph the earlier
stages built and still lets every earlier rule fire.

>>> from kernelsat.ir import In, Sum, mul
>>> from kernelsat.rewrites.rule import parse_rule
>>> r = parse_rule("sum-hoist-mul: (Sum ?a (mul ?x ?y)) => (mul ?x (Sum ?a ?y))"
...                " if (not-in ?a ?x) [reduction]")
>>> x, y = In("x", (("i", 2),)), In("y", (("n", 4),))
>>> res = saturate(Sum("n", mul(x, y)), [r])
>>> res.stop_reason, res.snapshot.n_classes
('saturated', 5)
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from egglog import bindings

from kernelsat.egraph.readout import Readout, read_egraph
from kernelsat.egraph.render import (
    CONSTRUCTOR,
    DEFAULT_FACTORS,
    RenderedRule,
    render_declarations,
    render_rules,
    render_term,
)
from kernelsat.egraph.snapshot import Snapshot
from kernelsat.ir import Term
from kernelsat.rewrites.rule import Rule

StopReason = Literal["saturated", "iteration limit", "node limit", "time limit"]

DEFAULT_ITERS = 30
DEFAULT_NODES = 20_000
DEFAULT_SECONDS = 10.0


@dataclass(frozen=True)
class IterationStats:
    """One iteration: the stage it belongs to, e-graph size after it, its rule matches."""

    stage: int
    iteration: int
    nodes: int
    classes: int
    seconds: float
    matches: Mapping[str, int]


@dataclass(frozen=True)
class StageReport:
    """One stage: the families (or rule names) it added and why it stopped."""

    index: int
    families: tuple[str, ...]
    rules: tuple[str, ...]
    iterations: int
    stop_reason: StopReason


@dataclass(frozen=True)
class SaturationResult:
    """What saturation did and the e-graph it left.

    - `stop_reason`: why the last stage stopped (a node or time limit ends every stage).
    - `iterations`: per-iteration e-node / e-class counts and matches.
    - `matches`: egglog's match count per rule direction (`name`, `name/b`), summed.
    - `firings`: rows of the firing log per rule direction (distinct recorded firings).
    - `snapshot`: the e-graph read out (`snapshot.root` is the spec's class);
      `class_ids` maps egglog's e-class ids to the snapshot's.
    - `skipped`: (rule, direction, reason) for rule directions that cannot run in egglog.
    """

    stop_reason: StopReason
    iterations: tuple[IterationStats, ...]
    stages: tuple[StageReport, ...]
    matches: Mapping[str, int]
    firings: Mapping[str, int]
    seconds: float
    snapshot: Snapshot
    class_ids: Mapping[str, int]
    rendered: tuple[RenderedRule, ...]
    skipped: tuple[tuple[str, str, str], ...]
    program: str = field(repr=False, default="")
    limits: Mapping[str, float] = field(default_factory=dict)

    @property
    def root(self) -> int:
        return self.snapshot.root

    @property
    def n_nodes(self) -> int:
        return self.snapshot.n_nodes

    @property
    def n_classes(self) -> int:
        return self.snapshot.n_classes

    def summary(self) -> str:
        """A short human-readable report."""
        lines = [
            f"stop reason: {self.stop_reason} after {len(self.iterations)} iteration(s), "
            f"{self.seconds:.2f} s",
            f"e-graph: {self.n_nodes} e-nodes, {self.n_classes} e-classes, root class {self.root}, "
            f"{len(self.snapshot.firings)} recorded firings",
        ]
        for s in self.stages:
            lines.append(
                f"stage {s.index} [{', '.join(s.families) or 'all'}]: {len(s.rules)} rules, "
                f"{s.iterations} iteration(s), {s.stop_reason}"
            )
        lines.append("iter  stage  e-nodes  e-classes  seconds")
        for it in self.iterations:
            row = (it.iteration, it.stage, it.nodes, it.classes)
            lines.append("{:4d}  {:5d}  {:7d}  {:9d}".format(*row) + f"  {it.seconds:7.3f}")
        if self.firings:
            lines.append("firings per rule direction:")
            width = max(map(len, self.firings))
            for name, n in sorted(self.firings.items(), key=lambda kv: (-kv[1], kv[0])):
                lines.append(f"  {name:<{width}}  {n}")
        for name, direction, why in self.skipped:
            lines.append(f"not run in the e-graph: {name} ({direction}): {why}")
        return "\n".join(lines)


DEFAULT_SCHEDULE: tuple[tuple[str, ...], ...] = (
    (
        "materialization", "online", "reduction", "contraction", "constfold",
        "sub-sub", "mul-div-comm", "exp-sub", "exp-log", "simplify", "add-zero", "sub-zero",
        "mul-one", "div-one", "activations", "gather",
    ),
    ("tiling",),
)
"""The stages `optimize` runs: fusion, the online reductions and the simplification of
degenerate programs first (with the few elementwise identities their chains need), then
tiling. Commutativity, associativity and
distributivity (the rest of the elementwise family) grow the e-graph by ~1.6x per
iteration on softmax-like terms without reaching new kernels, so they run only when
asked for (`saturate --stage elementwise`, or `schedule=` with the family named)."""

DEFAULT_STAGE_ITERS = 6
"""Iterations per stage in `optimize` (the attention chain needs 5)."""


def scheduled_rules(rules: Sequence[Rule], schedule: Sequence[Sequence[str]]) -> list[Rule]:
    """The rules some stage of `schedule` names (by family or by name)."""
    return [r for r in rules if any(r.family in s or r.name in s for s in schedule)]


def stage_of_rules(
    rules: Sequence[Rule], schedule: Sequence[Sequence[str]] | None
) -> list[list[Rule]]:
    """Rules grouped by stage: a rule joins the first stage naming its family or its
    name; rules no stage names join stage 0."""
    if not schedule:
        return [list(rules)]
    stages: list[list[Rule]] = [[] for _ in schedule]
    for rule in rules:
        k = next((i for i, s in enumerate(schedule) if rule.family in s or rule.name in s), 0)
        stages[k].append(rule)
    return stages


def _run(eg: bindings.EGraph, text: str) -> list[object]:
    return list(eg.parse_and_run_program(text))


def _sizes(eg: bindings.EGraph) -> tuple[int, int]:
    """(e-nodes, e-classes): rows of the `Term` constructors, and rows of `Shape` (one per
    class once the analyses are saturated)."""
    out = _run(eg, "(print-size)")
    sizes = dict(out[0].sizes)  # type: ignore[attr-defined]
    constructors = set(CONSTRUCTOR.values())
    return sum(n for f, n in sizes.items() if f in constructors), sizes.get("Shape", 0)


def _matches(report: object) -> Counter[str]:
    counts: Counter[str] = Counter()
    for name, n in report.num_matches_per_rule.items():  # type: ignore[attr-defined]
        counts[name] += n
    return counts


def build_program(
    term: Term, rules: Sequence[Rule], stages: Sequence[Sequence[Rule]], factors: Iterable[int]
) -> tuple[str, list[RenderedRule], list[tuple[str, str, str]], Mapping[str, Term]]:
    """The egglog program: declarations, one ruleset per stage, the rules, the term."""
    ruleset_of = {r.name: f"stage{k}" for k, stage in enumerate(stages) for r in stage}
    rendered, skipped = render_rules(rules, ruleset_of)
    parts = [render_declarations()]
    parts += [f"(ruleset stage{k})" for k in range(len(stages))]
    parts += [
        f"(unstable-combined-ruleset upto{k} {' '.join(f'stage{j}' for j in range(k + 1))})"
        for k in range(len(stages))
    ]
    parts += [r.declaration for r in rendered]
    parts += [r.text for r in rendered]
    term_text = render_term(term, factors)
    parts.append(term_text.text)
    return "\n".join(parts) + "\n", rendered, [tuple(s) for s in skipped], term_text.inputs


def saturate(
    term: Term,
    rules: Sequence[Rule],
    *,
    iters: int = DEFAULT_ITERS,
    nodes: int = DEFAULT_NODES,
    seconds: float = DEFAULT_SECONDS,
    factors: Iterable[int] = DEFAULT_FACTORS,
    schedule: Sequence[Sequence[str]] | None = None,
) -> SaturationResult:
    """Saturate `term` under `rules` within the limits and read the e-graph out.

    `iters` bounds the iterations of each stage; `nodes` (e-nodes) and `seconds` bound
    the whole run and are checked after every iteration (an iteration is never cut
    short). `factors` are the candidate split factors of rules with a `divides`
    parameter. `schedule` lists stages as families (or rule names), e.g.
    `[("materialization", "online", "reduction"), ("tiling",)]`."""
    start = time.perf_counter()
    stages = stage_of_rules(rules, schedule)
    program, rendered, skipped, inputs = build_program(term, rules, stages, factors)
    eg = bindings.EGraph()
    _run(eg, program)
    _run(eg, "(run-schedule (saturate (run analysis)))")
    iterations: list[IterationStats] = []
    stage_reports: list[StageReport] = []
    matches: Counter[str] = Counter()
    reason: StopReason = "saturated"
    for k, stage_rules in enumerate(stages):
        reason, count = _run_stage(eg, k, iters, nodes, seconds, start, iterations, matches)
        families = tuple(schedule[k]) if schedule else ()
        stage_reports.append(
            StageReport(k, families, tuple(r.name for r in stage_rules), count, reason)
        )
        if reason in ("node limit", "time limit"):
            break
    readout: Readout = read_egraph(eg, inputs, rendered)
    firings: Counter[str] = Counter(
        f.rule + ("/b" if f.direction == "backward" else "") for f in readout.snapshot.firings
    )
    return SaturationResult(
        stop_reason=reason,
        iterations=tuple(iterations),
        stages=tuple(stage_reports),
        matches=dict(matches),
        firings=dict(firings),
        seconds=time.perf_counter() - start,
        snapshot=readout.snapshot,
        class_ids=readout.class_ids,
        rendered=tuple(rendered),
        skipped=tuple(skipped),
        program=program,
        limits={"iters": iters, "nodes": nodes, "seconds": seconds},
    )


def _run_stage(
    eg: bindings.EGraph,
    k: int,
    iters: int,
    node_limit: int,
    seconds: float,
    start: float,
    log: list[IterationStats],
    matches: Counter[str],
) -> tuple[StopReason, int]:
    """Iterations of stage k until it stops; returns (reason, iterations run)."""
    for i in range(iters):
        if time.perf_counter() - start > seconds:
            return "time limit", i
        t0 = time.perf_counter()
        report = _run(eg, f"(run upto{k} 1)")[0].report  # type: ignore[attr-defined]
        _run(eg, "(run-schedule (saturate (run analysis)))")
        n_nodes, n_classes = _sizes(eg)
        got = _matches(report)
        matches.update(got)
        log.append(
            IterationStats(k, len(log) + 1, n_nodes, n_classes, time.perf_counter() - t0, dict(got))
        )
        if not report.updated:
            return "saturated", i + 1
        if n_nodes > node_limit:
            return "node limit", i + 1
        if time.perf_counter() - start > seconds:
            return "time limit", i + 1
    return "iteration limit", iters
