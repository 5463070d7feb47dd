"""kernelsat.codegen: lowering to loop nests and the numpy / C / CUDA renderers.

    lowered = lower(term, out_axes)            # kernels cut at Store, loop nests
    lowered.kernels[k].knob_space()            # {"order": (...), "tile.i": (...), ...}
    lowered.kernels[k].stats                   # (flops, bytes_read, bytes_written, transc.)
    exe = build(lowered, "c", knobs)           # knobs: one dict (or None) per kernel
    exe(inputs, out)                           # writes `out` in place; exe.source
    run_program(term, out_axes, inputs, "c")   # convenience
    render(lowered, None, "cuda", arch="sm_80")  # CUDA source for an A100

Codegen speaks of backends ("numpy", "c", "cuda"), plain strings, and of the
architecture a backend compiles for (`arch`, e.g. "sm_90"); a hardware target
(`kernelsat.hardware.targets.Target`) carries both, and its users pass them here.

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
    DEFAULT_ARCH,
    CompileReport,
    CUDAExecutable,
    CUDARenderer,
    build_cuda,
    compile_cuda,
    cuda_defaults,
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

BACKENDS = ("numpy", "c", "cuda")
"""The codegen backends `build` knows."""


class Executable(Protocol):
    """What every backend builds: call it on inputs (by name) and a preallocated float32
    output, which it overwrites in place; `.source` is the generated code."""

    source: str

    def __call__(self, inputs: Mapping[str, np.ndarray], out: np.ndarray) -> None: ...


KnobList = Sequence[Mapping[str, Any] | None] | None


def render(lowered: LoweredProgram, knobs: KnobList = None, backend: str = "c", *,
           arch: str | None = None) -> str:
    """The source of `lowered` for "c" or "cuda" (one knob dict per kernel, or None);
    CUDA is written for `arch` (default `DEFAULT_ARCH`), with the GPU's defaults
    (`cuda_defaults`) where no knobs are given."""
    if backend == "cuda" and not knobs:
        knobs = cuda_defaults(lowered)
    nests = lowered.nests(list(knobs) if knobs else None)
    match backend:
        case "c":
            return CRenderer().render(lowered, nests)
        case "cuda":
            return CUDARenderer(arch or DEFAULT_ARCH).render(lowered, nests)
        case _:
            raise CodegenError(f"no source renderer for backend {backend!r} (have c, cuda)")


def build(lowered: LoweredProgram, backend: str = "c", knobs: KnobList = None,
          cache_dir: Path | str | None = None, *, arch: str | None = None,
          cflags: Sequence[str] = ()) -> Executable:
    """Build an executable with a backend ("numpy", "c" or "cuda"; CUDA for `arch`,
    default `DEFAULT_ARCH`; C for the instruction set `cflags` names, e.g.
    `("-march=x86-64-v2",)`, default this CPU's: `kernelsat.codegen.c.c_flags`). C
    libraries are cached under `cache_dir` (default `<kernelsat.cachefile.cache_dir()>/c`)
    by (source, flags). CUDA without knobs gets the GPU's defaults (`cuda_defaults`)."""
    if backend == "cuda" and not knobs:
        knobs = cuda_defaults(lowered)
    nests = lowered.nests(list(knobs) if knobs else None)
    match backend:
        case "numpy":
            return build_numpy(lowered)
        case "c":
            return build_c(lowered, nests, cache_dir, isa_flags=cflags)
        case "cuda":
            return build_cuda(lowered, nests, arch or DEFAULT_ARCH)
        case _:
            raise CodegenError(f"unknown backend {backend!r} (have {', '.join(BACKENDS)})")


def run_program(term: Term, out_axes: Sequence[str] | None, inputs: Mapping[str, np.ndarray],
                backend: str = "numpy", knobs: KnobList = None,
                cache_dir: Path | str | None = None, *,
                cflags: Sequence[str] = ()) -> np.ndarray:
    """Lower, build (C: for the instruction set `cflags`, as `build`) and run once;
    return the float32 output laid out as `out_axes`."""
    lowered = lower(term, tuple(out_axes) if out_axes is not None else None)
    exe = build(lowered, backend, knobs, cache_dir, cflags=cflags)
    out = np.empty(lowered.buffers["out"].shape, np.float32)
    exe(inputs, out)
    return out


__all__ = [
    "BACKENDS", "DEFAULT_ARCH", "BufferInfo", "CExecutable", "CRenderer", "CUDAExecutable",
    "CUDARenderer",
    "CodegenError", "CompileReport", "Executable", "Kernel", "KernelNest", "KernelStats",
    "LoweredProgram", "NumpyExecutable", "build", "compile_cuda", "lower", "render", "run_program",
]
