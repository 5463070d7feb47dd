"""Writing an optimize result: program, source, certificate, report (Markdown, JSON, PNG).

Everything is written into a fresh temporary folder beside the destination and renamed
into place at the end, so a failed run never leaves a half-written output folder.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from kernelsat.pipeline import Candidate, Result
from kernelsat.sexpr import to_sexpr

SOURCE_SUFFIX = {"c": "c", "numpy": "py", "cuda": "cu"}


class OutputError(OSError):
    """The output folder cannot be written."""


def prepare_out_dir(out_dir: Path) -> Path:
    """Check, before any work, that `out_dir` can be created or replaced. Returns its
    parent (created if needed); raises OutputError with the reason otherwise."""
    out_dir = Path(out_dir)
    parent = out_dir.resolve().parent
    if out_dir.exists() and not out_dir.is_dir():
        raise OutputError(f"{out_dir} exists and is not a folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=f".{out_dir.name}.probe-", dir=parent)
        os.rmdir(probe)
    except OSError as e:
        raise OutputError(f"cannot write the output folder {out_dir}: {e.strerror or e}") from None
    return parent


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
        "target": result.target,
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
    }


def _fmt(x: Any, spec: str = ".3f") -> str:
    return "—" if x is None else format(x, spec)


def report_markdown(result: Result, data: dict[str, Any]) -> str:
    sat = data["saturation"]
    lines = [
        f"# kernelsat: {result.program.name} on {result.target}",
        "",
        f"Parameters: {result.program.params}. Saturation: {sat['e_nodes']} e-nodes, "
        f"{sat['e_classes']} e-classes, {sat['iterations']} iterations, "
        f"{sat['seconds']:.2f} s, stopped: {sat['stop_reason']}.",
        "",
        "| # | extractors | kernels | estimate ms | median ms | IQR ms | speedup | proof |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in data["candidates"]:
        iqr = (
            f"{row['q1_ms']:.3f}–{row['q3_ms']:.3f}" if row["q1_ms"] is not None else "—"
        )
        mark = " **best**" if row["best"] else ""
        proof = row["proof"] if len(row["proof"]) < 70 else row["proof"][:67] + "..."
        lines.append(
            f"| {row['index']}{mark} | {', '.join(row['extractors'])} | {row['kernels']} | "
            f"{_fmt(row['estimate_ms'])} | {_fmt(row['median_ms'])} | {iqr} | "
            f"{_fmt(row['speedup'], '.2f')} | {proof} ({row['proof_steps']} steps) |"
        )
    lines += ["", "Stage times: " + ", ".join(f"{k} {v:.1f} s" for k, v in result.timings.items())]
    lines += [f"Note: {n}" for n in result.notes]
    lines += ["", "Proofs are over real arithmetic; the float32 error of every measured program "
              "was checked against a float64 reference on random inputs."]
    return "\n".join(lines) + "\n"


def _plot(result: Result, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    ax.set_title(f"{result.program.name} on {result.target}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_result(result: Result, out_dir: Path) -> list[Path]:
    """Write the result into `out_dir` (replacing it whole), atomically."""
    out_dir = Path(out_dir)
    parent = prepare_out_dir(out_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=parent))
    try:
        best = result.best
        data = report_json(result)
        (tmp / "best.sexpr").write_text(to_sexpr(best.term) + "\n")
        suffix = SOURCE_SUFFIX.get(result.target, "txt")
        (tmp / f"kernel.{suffix}").write_text(best.source or "")
        if best.certificate is not None:
            (tmp / "certificate.json").write_text(best.certificate.to_json())
        (tmp / "report.json").write_text(json.dumps(data, indent=2) + "\n")
        (tmp / "report.md").write_text(report_markdown(result, data))
        _plot(result, tmp / "speedup.png")
        if out_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=parent))
            os.rename(out_dir, old / "x")
            os.rename(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sorted(out_dir.iterdir())
