"""Timing a whole program on a target: lower, build, measure, and report against the
roofline. Shared by `kernelsat bench` and the scripts in `bench/`.

The table has one row per kernel (its FLOPs, bytes and roofline time from the
kernel's stats) and a total row with the measured median, the interquartile spread,
the achieved GFLOP/s and GB/s, and the roofline fraction (roofline time / measured
time: 1.0 is at the roofline). Kernel rows carry measured times only when the
executable exposes its kernels separately; otherwise the program is timed whole.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernelsat.codegen import build, lower
from kernelsat.hardware.cache import MeasureCache
from kernelsat.hardware.cost import KernelStats, as_stats, kernel_time, stats_of_term
from kernelsat.hardware.knobs import kernel_features_of, kernel_name
from kernelsat.hardware.measure import CodegenRecipe, Measurement, measure
from kernelsat.hardware.targets import Target
from kernelsat.interp import evaluate_as
from kernelsat.ir import Term
from kernelsat.sexpr import to_sexpr


@dataclass(frozen=True)
class KernelRow:
    """One kernel's share of the program: its stats and roofline time."""

    name: str
    stats: KernelStats
    roofline: float


@dataclass(frozen=True)
class BenchResult:
    """A program timed on a target."""

    target: Target
    measurement: Measurement
    kernels: tuple[KernelRow, ...]

    @property
    def roofline(self) -> float:
        return sum(k.roofline for k in self.kernels)

    @property
    def flops(self) -> float:
        return sum(k.stats.flops for k in self.kernels)

    @property
    def bytes(self) -> float:
        return sum(k.stats.bytes for k in self.kernels)

    @property
    def roofline_fraction(self) -> float:
        m = self.measurement
        return self.roofline / m.median if m.ok and m.median > 0 else math.nan


def out_shape(term: Term, out_axes: tuple[str, ...]) -> tuple[int, ...]:
    """The output array's shape in the layout `out_axes`."""
    return tuple(term.shape[a] for a in out_axes)


def reference(term: Term, out_axes: tuple[str, ...], inputs: Mapping[str, np.ndarray]
              ) -> np.ndarray:
    """The float64 reference output in the layout `out_axes`."""
    env = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
    return np.asarray(evaluate_as(term, env, tuple(out_axes)), np.float64)


def kernel_rows(term: Term, lowered: Any, target: Target, dtype: str) -> tuple[KernelRow, ...]:
    """Per-kernel rows from codegen's stats when it has them, else from the IR estimate."""
    kernels = getattr(lowered, "kernels", None)
    if kernels:
        pairs = [(kernel_name(k, i), as_stats(k.stats)) for i, k in enumerate(kernels)]
    else:
        stats = list(reversed(stats_of_term(term, dtype)))  # producers first
        pairs = [(f"k{i}", s) for i, s in enumerate(stats)]
    return tuple(KernelRow(name, s, kernel_time(s, target)) for name, s in pairs)


def bench_term(
    term: Term,
    out_axes: tuple[str, ...],
    inputs: Mapping[str, np.ndarray],
    target: Target,
    *,
    knobs: Any = None,
    dtype: str = "float32",
    cache: MeasureCache | None = None,
    **measure_kwargs: Any,
) -> BenchResult:
    """Lower `term` with codegen, build it for `target` with `knobs` (codegen's form, None
    for its defaults), time it by the protocol and (if `cache` is given) store the
    measurement under (fingerprint, term key and layout, knobs, dtype)."""
    lowered = lower(term, tuple(out_axes))
    exe: Any
    if measure_kwargs.get("separate_process"):  # rebuilt in the timing process
        exe = CodegenRecipe(to_sexpr(term), tuple(out_axes), target.backend,
                            json.dumps(knobs), target.compile_flags)
    else:
        exe = build(lowered, target.backend, knobs, arch=target.arch,
                    cflags=target.compile_flags)
    typed = {k: np.ascontiguousarray(v, dtype=dtype) for k, v in inputs.items()}
    ref = reference(term, tuple(out_axes), inputs)
    m = measure(exe, typed, out_shape(term, tuple(out_axes)), ref, dtype=dtype, **measure_kwargs)
    if cache is not None:
        program_key = f"{term.key}|{','.join(out_axes)}"
        cache.put(target.fingerprint, program_key, {"knobs": knobs}, dtype, m,
                  features=knob_features(lowered, target, knobs))
    return BenchResult(target, m, kernel_rows(term, lowered, target, dtype))


def knob_features(lowered: Any, target: Target, knobs: Any) -> dict[str, Any] | None:
    """The schedule model's features of `knobs` (codegen's form: one dict per kernel, or
    None for the defaults), kept in the cache beside the timing; None off the C backend
    or when the model cannot read a kernel."""
    per = list(knobs) if knobs else [None] * len(lowered.kernels)
    try:
        return kernel_features_of(lowered, target, per)
    except Exception:  # features are a record for later learning, never a reason to fail
        return None


def _fmt_time(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def format_table(result: BenchResult) -> str:
    """The per-kernel / total table as aligned plain text."""
    m = result.measurement
    head = ("kernel", "GFLOP", "MB", "roofline", "median", "IQR", "GFLOP/s", "GB/s", "of roofline")
    rows = [(k.name, f"{k.stats.flops / 1e9:.3g}", f"{k.stats.bytes / 1e6:.3g}",
             _fmt_time(k.roofline), "", "", "", "", "") for k in result.kernels]
    ok = m.ok and m.median > 0
    rows.append((
        "total",
        f"{result.flops / 1e9:.3g}",
        f"{result.bytes / 1e6:.3g}",
        _fmt_time(result.roofline),
        _fmt_time(m.median) if ok else "FAILED",
        f"{_fmt_time(m.q1)}..{_fmt_time(m.q3)}" if ok else "",
        f"{result.flops / m.median / 1e9:.3g}" if ok else "",
        f"{result.bytes / m.median / 1e9:.3g}" if ok else "",
        f"{result.roofline_fraction:.1%}" if ok else "",
    ))
    widths = [max(len(str(r[i])) for r in (head, *rows)) for i in range(len(head))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in (head, *rows)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    tail = [f"target {result.target.name} ({result.target.model}), {m.runs} runs, "
            f"rel. L2 error {m.rel_err:.2g}"]
    if not m.ok:
        tail.append(f"failure: {m.failure}")
    return "\n".join(lines + tail)
