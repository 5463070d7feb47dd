"""Evaluating extractors by measurement: the regret table of `kernelsat evaluate`.

For each held-out spec: saturate, then for each method measure its programs, proved
first (no proof, no measurement), in the method's own order:

- `rl`: the policy's first K distinct proved programs (greedy rollout, then samples);
- `sample`: the Boltzmann sampler's K cheapest-by-roofline distinct proved programs;
- `greedy`, `ilp`: their one program on the analytic roofline cost (one measurement);
- `best`: the fastest of everything measured plus a larger search (`reference`
  sampler draws at a higher temperature and more RL samples): the reference.

Every method also has the eager spec (the optimize pipeline always keeps it), so a
method whose programs all fail to prove has regret `t_eager / t_best - 1`. Regret is
`t_method / t_best - 1`; the table ends with geometric means of `t_method / t_best`
(reported minus one). The cold-start column runs the same policy, features computed
for the numpy target it was not trained on, measured on numpy against a numpy
reference (the best over the same kinds of candidates measured on numpy).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kernelsat.extract.rl_train import MeasureSettings, hardware_target, job_for
from kernelsat.ir import Term

METHODS = ("rl", "sample", "greedy", "ilp", "eager")


def small_params(path: Path, cap: int) -> dict[str, int]:
    """Every size parameter of the spec at `path`, capped at `cap`."""
    from kernelsat.spec import load_spec

    return {k: min(int(v), cap) for k, v in load_spec(path).params.items()}


@dataclass
class SpecEval:
    """One spec's measured times per method (seconds; inf when nothing measured)."""

    name: str
    n_nodes: int = 0
    times: dict[str, float] = field(default_factory=dict)
    measured: int = 0
    notes: list[str] = field(default_factory=list)

    def regret(self, method: str, ref: str = "best") -> float:
        return self.times.get(method, math.inf) / self.times[ref] - 1.0


@dataclass
class Measurer:
    """Proves then measures programs of one spec, memoized by program key."""

    program: Any
    saturation: Any
    library: Any
    backend: Any
    ms: MeasureSettings
    proved: dict[str, bool] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)

    def prove(self, term: Term) -> bool:
        from kernelsat.pipeline import prove_term

        if term.key not in self.proved:
            status = prove_term(self.program, self.saturation.snapshot, self.library, term)[2]
            self.proved[term.key] = status in ("accepted", "eager")
        return self.proved[term.key]

    def best_of(self, terms: Sequence[Term], budget: int) -> float:
        """The fastest of the first `budget` proved programs of `terms` (measured)."""
        chosen: list[Term] = []
        for t in terms:
            if len(chosen) >= budget:
                break
            if t.key not in {c.key for c in chosen} and self.prove(t):
                chosen.append(t)
        todo = [t for t in chosen if t.key not in self.times]
        if todo:
            results = self.backend.run([job_for(self.program, t, self.ms) for t in todo])
            for t, r in zip(todo, results, strict=True):
                self.times[t.key] = r.median if r.ok else math.inf
        return min((self.times[t.key] for t in chosen), default=math.inf)


def _terms(extractions: Sequence[Any]) -> list[Term]:
    return [e.term for e in extractions]


def evaluate_spec(path: Path, params: dict[str, int], *, budget: int, reference: int,
                  checkpoint: Path | None, library: Any, backend: Any, ms: MeasureSettings,
                  cold_backend: Any = None, seed: int = 0) -> tuple[SpecEval, SpecEval | None]:
    """The measured times of every method on one spec (and the numpy cold start)."""
    from kernelsat.egraph.saturate import saturate
    from kernelsat.extract import ILP, GreedyDag, Sampler, roofline_rescore
    from kernelsat.extract.rl import RLExtractor
    from kernelsat.spec import load_spec

    program = load_spec(path, params)
    sat = saturate(program.term, library.rules, iters=ms.iters, nodes=ms.nodes,
                   seconds=ms.sat_seconds, factors=ms.factors)
    snap = sat.snapshot
    out = SpecEval(path.stem, snap.n_nodes)
    cost = roofline_rescore(hardware_target(ms.target))

    def run(m: Measurer, rl_target: str) -> dict[str, float]:
        times: dict[str, float] = {"eager": m.best_of([program.term], 1)}
        rl = RLExtractor(checkpoint, target=rl_target, n=4 * budget, seed=seed)
        rl_terms = _terms(rl.extract(snap, snap.root, cost))
        sampled = _terms(Sampler(n=4 * budget, seed=seed).extract(snap, snap.root, cost))
        plans: dict[str, tuple[Callable[[], list[Term]], int]] = {
            "rl": (lambda: rl_terms, budget),
            "sample": (lambda: sampled, budget),
            "greedy": (lambda: _terms(GreedyDag().extract(snap, snap.root, cost)), 1),
            "ilp": (lambda: _terms(ILP(time_limit=5.0).extract(snap, snap.root, cost)), 1),
        }
        for name, (terms, k) in plans.items():
            try:
                times[name] = min(m.best_of(terms(), k), times["eager"])
            except Exception as e:  # an extractor failing is a result, not a crash
                out.notes.append(f"{name}: {type(e).__name__}: {str(e)[:80]}")
                times[name] = times["eager"]
        wide = Sampler(n=reference, temperature=4.0, seed=seed + 1).extract(snap, snap.root, cost)
        extra = RLExtractor(checkpoint, target=rl_target, n=reference, seed=seed + 1,
                            temperature=2.0).extract(snap, snap.root, cost)
        m.best_of(_terms(wide) + _terms(extra), reference)
        times["best"] = min(m.times.values())
        return times

    m = Measurer(program, sat, library, backend, ms)
    out.times = run(m, ms.target)
    out.measured = len(m.times)
    cold = None
    if cold_backend is not None:
        cms = MeasureSettings(**{**ms.__dict__, "target": "numpy"})
        mc = Measurer(program, sat, library, cold_backend, cms, proved=m.proved)
        cold = SpecEval(path.stem, snap.n_nodes, run(mc, "numpy"), len(mc.times))
    return out, cold


def geomean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in finite) / len(finite)) if finite else math.nan


def table(rows: Sequence[SpecEval], cold: Sequence[SpecEval | None], budget: int) -> str:
    """The Markdown regret table (percent), with geometric means."""
    head = ["spec", "e-nodes", "best ms"] + [f"{m} regret" for m in METHODS]
    head += ["rl numpy (cold) regret"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios: dict[str, list[float]] = {m: [] for m in [*METHODS, "cold"]}
    for r, c in zip(rows, cold, strict=True):
        cells = [r.name, str(r.n_nodes), f"{r.times['best'] * 1e3:.3f}"]
        for m in METHODS:
            cells.append(f"{100 * r.regret(m):.1f}%")
            ratios[m].append(r.regret(m) + 1)
        if c is not None:
            cells.append(f"{100 * c.regret('rl'):.1f}%")
            ratios["cold"].append(c.regret("rl") + 1)
        else:
            cells.append("-")
        lines.append("| " + " | ".join(cells) + " |")
    means = ["**geomean**", "", ""] + [f"**{100 * (geomean(ratios[m]) - 1):.1f}%**"
                                       for m in [*METHODS, "cold"]]
    lines.append("| " + " | ".join(means) + " |")
    lines.append("")
    lines.append(f"K = {budget} measurements for rl and sample, 1 for greedy and ilp.")
    return "\n".join(lines)


def evaluate(specs: Sequence[Path], *, budget: int, reference: int, cap: int | None,
             checkpoint: Path | None, backend: Any = None, cold: bool = True,
             cache_dir: Path | None = None, ms: MeasureSettings | None = None,
             progress: Callable[[str], None] = print) -> tuple[list[SpecEval],
                                                              list[SpecEval | None]]:
    """Evaluate every spec; `cap` caps every size parameter (None: the spec's sizes)."""
    from kernelsat.hardware.jobs import LocalBackend
    from kernelsat.rewrites.library import load_library

    ms = ms or MeasureSettings(iters=6, nodes=3000, sat_seconds=6.0)
    library = load_library()
    backend = backend if backend is not None else LocalBackend(cache_dir)
    rows: list[SpecEval] = []
    colds: list[SpecEval | None] = []
    for path in specs:
        start = time.monotonic()
        params = small_params(path, cap) if cap else {}
        try:
            row, c = evaluate_spec(path, params, budget=budget, reference=reference,
                                   checkpoint=checkpoint, library=library, backend=backend,
                                   ms=ms, cold_backend=backend if cold else None)
        except Exception as e:
            progress(f"{path.stem}: skipped ({type(e).__name__}: {str(e)[:120]})")
            continue
        rows.append(row)
        colds.append(c)
        progress(f"{row.name}: best {row.times['best'] * 1e3:.3f} ms, regret "
                 + ", ".join(f"{m} {100 * row.regret(m):.1f}%" for m in METHODS)
                 + (f", cold numpy rl {100 * c.regret('rl'):.1f}%" if c else "")
                 + f" ({row.measured} programs, {time.monotonic() - start:.1f}s)")
    return rows, colds
