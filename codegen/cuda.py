"""The CUDA renderer: `CUDARenderer(CRenderer)` overrides only what differs.

One `__global__` per kernel. The leading parallel loops of a nest (those whose body is
only the next parallel loop) become one flat thread index over a 1-D grid; the first
parallel loop that also computes something per iteration (a row max, an accumulator)
is the last one mapped to threads, the loops inside it stay per-thread loops.
`compile_cuda` runs nvcc for an architecture (`arch`, the target's: "sm_90" for an
H100 or H200, "sm_80" for an A100; `DEFAULT_ARCH` when none is given) and parses
registers and spills; launching needs pycuda and a GPU (guarded by a clear error where
they are missing).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from kernelsat.codegen.c import CRenderer, _fmt, buffer_order, check_args
from kernelsat.codegen.loops import Loop, Stmt
from kernelsat.codegen.lower import CodegenError, KernelNest, LoweredProgram
from kernelsat.ops import OPS

DEFAULT_ARCH = "sm_90"
"""The architecture CUDA code is compiled for when the caller names none."""


class CUDARenderer(CRenderer):
    """CUDA C++: CUDA's own math functions, `__restrict__`, a thread index per output tile.
    `arch` (e.g. "sm_90") is stated in the source's first line."""

    code_for_op: ClassVar[dict[str, Callable[..., str]]] = {
        **CRenderer.code_for_op,
        **{op.value: _fmt(info.cuda) for op, info in OPS.items() if info.cuda is not None},
    }
    """`CRenderer.code_for_op` with CUDA's spelling where the op table gives one (`OpInfo.cuda`)."""
    prelude: ClassVar[str] = "// kernelsat CUDA source"
    restrict: ClassVar[str] = "__restrict__"
    kernel_prefix: ClassVar[str] = 'extern "C" __global__ void'
    cancellable: ClassVar[bool] = False  # device code cannot see a host flag

    def __init__(self, arch: str = DEFAULT_ARCH) -> None:
        self.arch = arch

    def lit(self, v: float) -> str:
        if math.isinf(v):
            return "(-__int_as_float(0x7f800000))" if v < 0 else "__int_as_float(0x7f800000)"
        return super().lit(v)

    @staticmethod
    def thread_loops(body: tuple[Stmt, ...]) -> tuple[list[Loop], tuple[Stmt, ...]]:
        """Leading parallel loops mapped to threads, and the per-thread body."""
        loops: list[Loop] = []
        while len(body) == 1 and isinstance(body[0], Loop) and body[0].kind == "parallel":
            loops.append(body[0])
            body = body[0].body
        return loops, body

    def kernel(self, nest: KernelNest) -> str:
        loops, body = self.thread_loops(nest.body)
        total = math.prod(lp.extent for lp in loops)
        lines = [self.signature(nest) + " {",
                 "  long gid = (long)blockIdx.x * blockDim.x + threadIdx.x;",
                 f"  if (gid >= {total}) return;"]
        stride = total
        for lp in loops:
            stride //= lp.extent
            lines.append(f"  long {lp.var} = (gid / {stride}) % {lp.extent};")
        state = {"parallel_done": True}  # no OpenMP in device code
        for s in body:
            lines += self.stmt(s, nest, 1, state)
        return "\n".join([*lines, "}"])

    def launches(self, nests: list[KernelNest]) -> list[tuple[str, int, int]]:
        """(kernel name, threads, threads per block) of each kernel in order."""
        out = []
        for n in nests:
            loops, _ = self.thread_loops(n.body)
            out.append((f"ks_kernel{n.kernel}", math.prod(lp.extent for lp in loops),
                        int(n.knobs.get("tpb", 128))))
        return out

    def render(self, prog: LoweredProgram, nests: list[KernelNest]) -> str:
        header = f"{self.prelude} ({self.arch})"
        return "\n\n".join([header, *(self.kernel(n) for n in nests)]) + "\n"


@dataclass(frozen=True)
class KernelResources:
    registers: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int = 0


@dataclass(frozen=True)
class CompileReport:
    """What nvcc said about a source: ok, per-kernel resources, the log."""

    ok: bool
    kernels: dict[str, KernelResources] = field(default_factory=dict)
    log: str = ""
    skipped: str = ""  # why nothing was compiled (no nvcc), else ""


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.exists() else None


def _parse_ptxas(log: str) -> dict[str, KernelResources]:
    out: dict[str, KernelResources] = {}
    current = ""
    spills = (0, 0)
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line) or re.search(
            r"Function properties for (\w+)", line)
        if m:
            current = m.group(1)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            spills = (int(m.group(1)), int(m.group(2)))
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            smem = re.search(r"(\d+) bytes smem", line)
            out[current] = KernelResources(int(m.group(1)), spills[0], spills[1],
                                           int(smem.group(1)) if smem else 0)
            spills = (0, 0)
    return out


def compile_cuda(source: str, arch: str = DEFAULT_ARCH, timeout_s: float = 300.0) -> CompileReport:
    """`nvcc -cubin -arch=<arch> -Xptxas -v`; registers and spills per kernel."""
    nvcc = find_nvcc()
    if nvcc is None:
        return CompileReport(False, skipped="nvcc not found (PATH or /usr/local/cuda/bin)")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.cu"
        src.write_text(source)
        proc = subprocess.run(
            [nvcc, "-cubin", f"-arch={arch}", "-Xptxas", "-v", "-o", str(Path(tmp) / "k.cubin"),
             str(src)], capture_output=True, text=True, timeout=timeout_s)
    log = proc.stdout + proc.stderr
    return CompileReport(proc.returncode == 0, _parse_ptxas(log), log)


@dataclass
class CUDAExecutable:
    """Runs through pycuda on a GPU; without pycuda or a GPU, calling it raises."""

    prog: LoweredProgram
    source: str
    launches: list[tuple[str, int, int]]
    nests: list[KernelNest] = field(default_factory=list, repr=False)
    arch: str = DEFAULT_ARCH
    _state: dict[str, Any] = field(default_factory=dict, repr=False)

    def _load(self) -> dict[str, Any]:
        if self._state:
            return self._state
        try:
            import pycuda.autoinit  # noqa: F401
            import pycuda.driver as drv  # optional (kernelsat[cuda]), needs a GPU
            from pycuda.compiler import SourceModule  # optional, as above
        except Exception as exc:  # ImportError or no device
            raise CodegenError(f"the CUDA target needs pycuda and an NVIDIA GPU: {exc}") from exc
        module = SourceModule(self.source, no_extern_c=True, arch=self.arch)
        self._state.update(drv=drv, fns=[module.get_function(n) for n, _, _ in self.launches])
        return self._state

    def __call__(self, inputs: Mapping[str, np.ndarray], out: np.ndarray) -> None:
        st = self._load()
        drv = st["drv"]
        arrays = check_args(self.prog, inputs, out)
        bufs = self.prog.buffers
        dev = {b: drv.mem_alloc(max(4, 4 * bufs[b].size)) for b in buffer_order(self.prog)}
        for b, arr in arrays.items():
            if b != "out":
                drv.memcpy_htod(dev[b], arr)
        for fn, (_, threads, tpb), nest in zip(st["fns"], self.launches, self.nests, strict=True):
            grid = (max(1, -(-threads // tpb)), 1)
            fn(*(dev[b] for b in nest.params), block=(tpb, 1, 1), grid=grid)
        drv.Context.synchronize()
        drv.memcpy_dtoh(out, dev["out"])


def build_cuda(prog: LoweredProgram, nests: list[KernelNest],
               arch: str = DEFAULT_ARCH) -> CUDAExecutable:
    r = CUDARenderer(arch)
    return CUDAExecutable(prog, r.render(prog, nests), r.launches(nests), nests, arch)
