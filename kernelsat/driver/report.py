"""Writing an optimize result: program, source, certificate, report (Markdown, JSON, PNG).

Everything is written into a fresh temporary folder beside the destination and renamed
into place at the end, so a failed run never leaves a half-written output folder; what
may be replaced is decided before the run (`kernelsat.driver.outputs.plan_output_dir`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from kernelsat.driver.outputs import (
    OutputError,
    OutputPlan,
    Writer,
    commit_output_dir,
    plan_output_dir,
)
from kernelsat.driver.pipeline import Candidate, Result
from kernelsat.sexpr import to_sexpr

SOURCE_SUFFIX = {"c": "c", "numpy": "py", "cuda": "cu"}

__all__ = ["OutputError", "OutputPlan", "plan_output_dir", "report_json", "report_markdown",
           "write_result"]


def _num(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def candidate_row(result: Result, i: int, c: Candidate) -> dict[str, Any]:
    m = c.measurement
    return {
        "index": i,
        "extractors": c.methods,
        "kernels": c.kernels,
        "estimate_ms": _num(c.estimate * 1e3),
        "median_ms": _num(m.median * 1e3) if m is not None and m.ok else None,
        "q1_ms": _num(m.q1 * 1e3) if m is not None and m.ok else None,
        "q3_ms": _num(m.q3 * 1e3) if m is not None and m.ok else None,
        "speedup": _num(result.speedup(c)),
        "proof": c.proof,
        "proof_steps": c.steps,
        "error": c.error,
        "dropped": result.dropped(c),
        "checked_on": c.checked_on,
        "best": c is result.best,
        "worker": c.job.worker if c.job is not None else None,
        "attempts": c.job.attempts if c.job is not None else 0,
        "history": c.job.history if c.job is not None else [],
        "key": c.term.key,
    }


def report_json(result: Result) -> dict[str, Any]:
    sat = result.saturation
    return {
        "kernel": result.program.name,
        "params": result.program.params,
        "target": result.target.name,
        "arch": result.target.arch,
        "timed": result.timed,
        "best": candidate_row(result, result.candidates.index(result.best), result.best),
        "candidates": [candidate_row(result, i, c) for i, c in enumerate(result.candidates)],
        "saturation": {
            "e_nodes": sat.snapshot.n_nodes,
            "e_classes": sat.snapshot.n_classes,
            "seconds": sat.seconds,
            "stop_reason": sat.stop_reason,
            "iterations": len(sat.iterations),
            "firings": dict(sat.firings),
        },
        "timings_s": result.timings,
        "notes": result.notes,
        # the winner and the eager program timed interleaved before shipping (null: the
        # eager program won the search, or nothing was timed)
        "gate": result.gate.as_dict() if result.gate is not None else None,
        # issue 19 part 2: candidates the static float analysis dropped before proving,
        # and those the run-time float checks still rejected (the goal: none)
        "float_safety": {"removed_by_analysis": result.float_removed,
                         "rejected_at_run_time": result.float_rejected},
    }


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def report_markdown(result: Result, data: dict[str, Any]) -> str:
    sat = data["saturation"]
    lines = [
        f"# kernelsat: {result.program.name} on {result.target.name}",
        "",
        f"Parameters: {result.program.params}. Saturation: {sat['e_nodes']} e-nodes, "
        f"{sat['e_classes']} e-classes, {sat['iterations']} iterations, "
        f"{sat['seconds']:.2f} s, stopped: {sat['stop_reason']}.",
        "",
        "| # | extractors | kernels | estimate ms | median ms | IQR ms | speedup | proof "
        "| why not shipped |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in data["candidates"]:
        iqr = (
            f"{row['q1_ms']:.3f}–{row['q3_ms']:.3f}" if row["q1_ms"] is not None else "—"
        )
        mark = " **best**" if row["best"] else ""
        proof = row["proof"] if len(row["proof"]) < 70 else row["proof"][:67] + "..."
        dropped = " ".join(row["dropped"].split()).replace("|", "\\|")
        dropped = dropped if len(dropped) < 160 else dropped[:157] + "..."
        lines.append(
            f"| {row['index']}{mark} | {', '.join(row['extractors'])} | {row['kernels']} | "
            f"{_fmt(row['estimate_ms'])} | {_fmt(row['median_ms'])} | {iqr} | "
            f"{_fmt(row['speedup'], '.2f')} | {proof} ({row['proof_steps']} steps) | "
            f"{dropped or 'shipped'} |"
        )
    gate = data.get("gate")
    if gate is not None:
        lines += ["", f"Final gate (the winner and the eager program timed interleaved, "
                  f"{gate['runs']} runs each): winner {_fmt(gate['winner_ms'])} ms, eager "
                  f"{_fmt(gate['eager_ms'])} ms: "
                  f"{'the winner ships' if gate['passed'] else 'the eager program ships'}."]
    fs = data["float_safety"]
    lines += ["", f"Float safety: {fs['removed_by_analysis']} candidates removed by the static "
              f"analysis (docs/floatsafe.md), {fs['rejected_at_run_time']} rejected by the "
              "run-time float checks."]
    lines += ["", "Stage times: " + ", ".join(f"{k} {v:.1f} s" for k, v in result.timings.items())]
    lines += [f"Note: {n}" for n in result.notes]
    lines += ["", "Proofs are over real arithmetic; before it may ship, every program (on every "
              "target) was run in float32 and checked against a float64 reference on random "
              "inputs, and on inputs 100x larger for overflow where the spec's own float32 "
              "program stays finite (the notes say which backend ran the checks)."]
    return "\n".join(lines) + "\n"


def _plot(result: Result, path: Path) -> None:
    import matplotlib  # slow to import (~0.5 s), and only for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    rows = [(i, c) for i, c in enumerate(result.candidates) if c.measurement is not None]
    fig, ax = plt.subplots(figsize=(max(4, 0.6 * len(rows) + 2), 3.2))
    if rows and result.timed:
        values = [result.speedup(c) for _, c in rows]
        colors = ["tab:green" if c is result.best else "tab:blue" for _, c in rows]
        ax.bar([str(i) for i, _ in rows], [0 if math.isnan(v) else v for v in values],
               color=colors)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_ylabel("speedup over eager")
    else:
        ests = [c.estimate for c in result.candidates]
        ax.bar([str(i) for i in range(len(ests))], [result.eager.estimate / e for e in ests])
        ax.set_ylabel("estimated speedup (not timed)")
    ax.set_xlabel("candidate")
    ax.set_title(f"{result.program.name} on {result.target.name}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_result(result: Result, plan: OutputPlan) -> list[Path]:
    """Write the result into the folder `plan` (from `plan_output_dir`, checked before
    the run) atomically, with the kernelsat output marker; returns the files written."""
    best = result.best
    data = report_json(result)
    suffix = SOURCE_SUFFIX.get(result.target.backend, "txt")
    files: dict[str, str | Writer] = {
        "best.sexpr": to_sexpr(best.term) + "\n",
        f"kernel.{suffix}": best.source or "",
    }
    if best.certificate is not None:
        files["certificate.json"] = best.certificate.to_json()
    files["report.json"] = json.dumps(data, indent=2) + "\n"
    files["report.md"] = report_markdown(result, data)
    files["speedup.png"] = lambda path: _plot(result, path)
    return commit_output_dir(plan, files)
