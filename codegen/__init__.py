"""kernelsat.codegen: lowering to loop nests and the numpy / C / CUDA renderers.

    lowered = lower(term, out_axes)            # kernels cut at Store, loop nests
    lowered.kernels[k].knob_space()            # {"order": (...), "tile.i": (...), ...}
    lowered.kernels[k].stats                   # (flops, bytes_read, bytes_written, transc.)
    exe = build(lowered, "c", knobs)           # knobs: one dict (or None) per kernel
    exe(inputs, out)                           # writes `out` in place; exe.source
    run_program(term, out_axes, inputs, "c")   # convenience

>>> import numpy as np
>>> from kernelsat.ir import In, Sum, mul
>>> x = In("x", (("i", 2), ("n", 3)))
>>> run_program(Sum("n", mul(x, x)), ("i",), {"x": np.ones((2, 3))}, "numpy")
array([3., 3.], dtype=float32)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from kernelsat.codegen.c import CExecutable, CRenderer, build_c
from kernelsat.codegen.cuda import (
    CompileReport,
    CUDAExecutable,
    CUDARenderer,
    build_cuda,
    compile_cuda,
)
from kernelsat.codegen.lower import (
    BufferInfo,
    CodegenError,
    Kernel,
    KernelNest,
    KernelStats,
    LoweredProgram,
    lower,
)
from kernelsat.codegen.numpy_backend import NumpyExecutable, build_numpy
from kernelsat.ir import Term

TARGETS = ("numpy", "c", "cuda")


class Executable(Protocol):
    """What every target builds: call it on inputs (by name) and a preallocated float32
    output, which it overwrites in place; `.source` is the generated code."""

    source: str

    def __call__(self, inputs: Mapping[str, np.ndarray], out: np.ndarray) -> None: ...


KnobList = Sequence[Mapping[str, Any] | None] | None


def render(lowered: LoweredProgram, knobs: KnobList = None, target: str = "c") -> str:
    """The source of `lowered` for "c" or "cuda" (one knob dict per kernel, or None)."""
    nests = lowered.nests(list(knobs) if knobs else None)
    match target:
        case "c":
            return CRenderer().render(lowered, nests)
        case "cuda":
            return CUDARenderer().render(lowered, nests)
        case _:
            raise CodegenError(f"no source renderer for target {target!r} (have c, cuda)")


def build(lowered: LoweredProgram, target_name: str = "c", knobs: KnobList = None,
          cache_dir: Path | str | None = None) -> Executable:
    """Build an executable for a target ("numpy", "c" or "cuda"). C libraries are cached
    under `cache_dir` (default ~/.cache/kernelsat/c) by (source, flags)."""
    nests = lowered.nests(list(knobs) if knobs else None)
    match target_name:
        case "numpy":
            return build_numpy(lowered)
        case "c":
            return build_c(lowered, nests, cache_dir)
        case "cuda":
            return build_cuda(lowered, nests)
        case _:
            raise CodegenError(f"unknown target {target_name!r} (have {', '.join(TARGETS)})")


def run_program(term: Term, out_axes: Sequence[str] | None, inputs: Mapping[str, np.ndarray],
                target: str = "numpy", knobs: KnobList = None,
                cache_dir: Path | str | None = None) -> np.ndarray:
    """Lower, build and run once; return the float32 output laid out as `out_axes`."""
    lowered = lower(term, tuple(out_axes) if out_axes is not None else None)
    exe = build(lowered, target, knobs, cache_dir)
    out = np.empty(lowered.buffers["out"].shape, np.float32)
    exe(inputs, out)
    return out


__all__ = [
    "TARGETS", "BufferInfo", "CExecutable", "CRenderer", "CUDAExecutable", "CUDARenderer",
    "CodegenError", "CompileReport", "Executable", "Kernel", "KernelNest", "KernelStats",
    "LoweredProgram", "NumpyExecutable", "build", "compile_cuda", "lower", "render", "run_program",
]
