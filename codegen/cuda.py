"""The CUDA renderer: `CUDARenderer(CRenderer)` overrides only what differs.

One `__global__` per kernel. The leading parallel loops of a nest (those whose body is
only the next parallel loop, after any loop-invariant `Let`s) are the kernel's *rows*:
one flat row index over a 1-D grid. What runs a row is the CUDA-only knob `cuda.rows`
(`cuda_knob_space`; the C and numpy backends ignore it):

- "thread": one thread per row; every loop inside the row is a per-thread loop.
- "warp": one warp (32 lanes) per row, `tpb / 32` rows per block.
- "block": one block of `tpb` threads per row.

With a warp or a block per row, each top-level statement of the row body is planned
(`row_plan`) from the loop nest alone, never from a spec's name:

- an output loop (kind parallel or tile) that assigns nothing declared outside it is
  *split*: lane `l` runs iterations l, l + G, ... (G lanes per row);
- a reduction loop whose accumulators are each recognised as a sum, a max or an online
  (max, rescaled partners) pair is split the same way and then *combined*: a butterfly
  of `__shfl_xor_sync` over the 32 lanes of a warp (every lane ends with the merged
  value), and with a block per row a second step through shared memory (lane 0 of each
  warp stores, every thread merges the warps' values in warp order). The combine is
  inferred from the update's form and then checked by running the loop's body on
  pseudo-random data (`cuda_emulate.combine_ok`): a loop that fails the check runs
  whole in every lane, which is still right;
- anything else runs in every lane (redundant, identical values); buffer writes there
  are made by lane 0 only.

A row body that is a `Gemm` (a contraction, `codegen.loops.Gemm`) is rendered as a
shared-memory tiled GEMM instead (`CUDARenderer.gemm_kernel`): each block computes a
`cuda.bm` x `cuda.bn` tile of the output, staging `cuda.bk`-deep slices of A and B in
shared memory (loads ordered so consecutive threads read consecutive addresses along
whichever operand axis has stride 1), each thread a `cuda.tm` x `cuda.tn` register tile,
edge tiles guarded, the epilogue (bias, activation, ...) applied before the store.
Float32 FMA only: no TF32 tensor-core MMA (TF32 keeps 10 mantissa bits; its product
error is about the 3e-4 relative L2 bound of the float64 check, so it would fail it).

A kernel with no rows (its body starts with statistics, say, before its parallel pass) is
launched as several kernels, one per phase (`device_nests`, `codegen/cuda_phases.py`): its
independent top-level loops each spread over the grid, the rest one row, with what crosses
phases in global scratch buffers.

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
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from kernelsat.codegen.c import (
    CRenderer,
    _fmt,
    buffer_order,
    check_args,
    gather_error,
    int_buffers,
)
from kernelsat.codegen.combine import Combine, assigned, declared, infer_combines, walk
from kernelsat.codegen.cuda_emulate import Env, Interp, _copy, combine_ok, initial_state, merge
from kernelsat.codegen.cuda_phases import buffers_of, grid_reductions, phases
from kernelsat.codegen.flash import FlashAttention, block_masked, find_flash
from kernelsat.codegen.loops import (
    VARIANT_OF,
    Array,
    Gemm,
    Let,
    Load,
    Loop,
    Stmt,
    Write,
    expand_gemms,
)
from kernelsat.codegen.lower import (
    CodegenError,
    Kernel,
    KernelNest,
    LoweredProgram,
    _kernel_nodes,
    register_schedule,
)
from kernelsat.ops import BY_NAME, OPS, REDUCTIONS

DEFAULT_ARCH = "sm_90"
"""The architecture CUDA code is compiled for when the caller names none."""

WARP = 32
FULL_MASK = "0xffffffffu"

ROW_MODES = ("thread", "warp", "block")
"""Values of `cuda.rows`: what runs one row of a kernel (the default first is the
kernel's own, `row_modes`)."""

GEMM_KNOBS: dict[str, tuple[int, ...]] = {
    "cuda.bm": (64, 32, 128),
    "cuda.bn": (64, 32, 128),
    "cuda.bk": (16, 8, 32),
    "cuda.tm": (4, 8, 2),
    "cuda.tn": (4, 8, 2),
}
"""The shared-memory GEMM's block tile (bm x bn outputs), staged depth (bk) and
per-thread register tile (tm x tn), default first. Every combination is legal: threads
per block (bm/tm)(bn/tn) lie in [16, 1024], shared memory bk(bm+bn) floats <= 32 KiB."""

FLASH_KEYS = (64, 32, 16, 128)
"""Keys per shared-memory block of the fused attention kernel (`cuda.keys`), default first;
only those whose staged K, V and Q blocks fit `SHARED_FLOATS` are legal."""

SHARED_FLOATS = 48 * 1024 // 4
"""Static shared memory one block may declare (48 KiB), in floats."""

MAX_TPB = 512
"""The largest `tpb` (threads per block) the knob space offers."""

CUDA_KNOBS: frozenset[str] = frozenset({"cuda.rows", "cuda.keys", *GEMM_KNOBS})
"""The knobs only the CUDA renderer reads (the C and numpy backends ignore them)."""


FILL_THREADS = 132 * 2048
"""Threads that fill the default GPU (an H100: 132 multiprocessors of 2048 resident
threads): a row mapping with fewer threads than this leaves the GPU partly idle."""

WARP_ROW_MAX = 1024
"""Longest reduction a warp per row is the default for, with too few rows for a thread
each: 32 elements a lane."""


def row_modes(kernel: Kernel) -> tuple[str, ...]:
    """`ROW_MODES` with the untimed default first, from the kernel's shape alone (no GPU
    measures it here; a GPU's knob search times them all): a thread per row where the rows
    alone fill the GPU, a warp per row where 32 lanes a row do or the reduction is at most
    `WARP_ROW_MAX` long, else a block per row (few long rows: a variance of 64 rows of
    262144). Rows are the output points along axes no reduction of the kernel runs over;
    the reduction's length is its largest reduced extent."""
    nodes = _kernel_nodes(kernel.term)
    reduced: set[str] = set()
    length = 1
    for n in nodes:
        if n.op in REDUCTIONS:
            axis = str(n.attrs[0])
            reduced.add(axis)
            length = max(length, int(n.args[0].shape.get(axis, 1)))
    shape = kernel.term.shape
    rows = math.prod(int(shape[a]) for a in kernel.out_axes if a in shape and a not in reduced)
    if rows >= FILL_THREADS:
        first = "thread"
    elif rows * WARP >= FILL_THREADS or length <= WARP_ROW_MAX:
        first = "warp"
    else:
        first = "block"
    return (first, *(m for m in ROW_MODES if m != first))


def cuda_defaults(lowered: LoweredProgram) -> list[dict[str, Any]]:
    """Each kernel's knobs where the GPU's untimed default differs from the kernel's own
    (its first values, chosen for a CPU), where the kernel offers them: one element a
    lane (`vec` 1), so that the lanes of a warp read consecutive addresses of a row and
    every lane has work (16-wide vector accumulators leave a warp's lanes 64 bytes apart
    and, on a row of 128, 24 of its 32 lanes idle); and no kept row of intermediate
    values (`keep` False: a row-local array that a lane-split loop cannot write, so every
    lane would compute the whole row; recomputing in the split output loop is cheaper)."""
    out: list[dict[str, Any]] = []
    for kernel in lowered.kernels:
        space = kernel.knob_space()
        out.append({k: v for k, v in GPU_DEFAULTS.items() if v in space.get(k, ())})
    return out


GPU_DEFAULTS: Mapping[str, Any] = MappingProxyType({"vec": 1, "keep": False})
"""The knob values the GPU takes first where a kernel offers them (`cuda_defaults`; the
knob table for the cuda backend lists them first, `gpu_first`)."""


def gpu_first(knob: str, values: tuple[Any, ...]) -> tuple[Any, ...]:
    """`values` of `knob` with the GPU's default (`GPU_DEFAULTS`) first, where it is one
    of them: the knob table's first value is the untimed default and the search's
    first try."""
    want = GPU_DEFAULTS.get(knob, _NONE)
    if want is _NONE or want not in values:
        return values
    return (want, *(v for v in values if v != want))


_NONE = object()


def cuda_knob_space(kernel: Kernel, space: Mapping[str, Any]) -> dict[str, tuple[Any, ...]]:
    """The CUDA-only knobs of a kernel, given its other knobs (`space`): `cuda.rows`
    where the kernel reduces (a row body with reduction loops), and the shared-memory
    GEMM's tiles where the kernel lowers to a `Gemm` (it has the `mr` knob)."""
    out: dict[str, tuple[Any, ...]] = {}
    if any(n.op in REDUCTIONS for n in _kernel_nodes(kernel.term)):
        out["cuda.rows"] = row_modes(kernel)
    if "gemm" in space or "mr" in space:  # a contraction that lowers to a `Gemm`
        out.update(GEMM_KNOBS)
    if "flash" in space:  # a fused attention (`codegen.flash.FlashAttention`)
        found = find_flash(kernel)
        if found is not None:
            rows = MAX_TPB // WARP
            keys = tuple(kb for kb in FLASH_KEYS
                         if kb * (found.d + found.e + 2) + rows * found.d <= SHARED_FLOATS)
            if keys:
                out["cuda.keys"] = keys
    return out


@dataclass(frozen=True)
class CUDAKnobs:
    """CUDA's knobs as a `lower.Schedule` (`cuda_knob_space`; the nest is never its own:
    the CUDA renderer reads the knobs)."""

    rank: int = 90

    def knobs(self, kernel: Kernel, space: Mapping[str, tuple[Any, ...]]
              ) -> dict[str, tuple[Any, ...]]:
        return cuda_knob_space(kernel, space)

    def nest(self, kernel: Kernel, knobs: Mapping[str, Any]) -> KernelNest | None:
        return None


register_schedule(CUDAKnobs())


# -- the row plan ---------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One top-level statement of a row body and how the lanes of a row run it:
    "all" (every lane), "split" (lane l runs iterations l, l + G, ...), or "reduce"
    (split, then the accumulators `combines` are merged across lanes)."""

    stmt: Stmt
    mode: str
    combines: tuple[Combine, ...] = ()


def row_plan(body: tuple[Stmt, ...]) -> tuple[Step, ...]:
    """How the lanes of one row run each top-level statement of the row body."""
    decls: dict[str, Let | Array] = {}
    steps: list[Step] = []
    for s in body:
        if isinstance(s, Let | Array):
            decls[s.name] = s
        mode, combines = "all", ()
        if isinstance(s, Loop) and s.extent > 1:
            escapes = assigned(s.body) - declared(s.body)
            if s.kind in ("parallel", "tile") and not escapes:
                mode = "split"
            elif s.kind == "reduce":
                found = infer_combines(s, decls)
                if found is not None and combine_ok(
                        s, initial_state(decls, [c.name for c in found]), found):
                    mode, combines = "reduce", found
        steps.append(Step(s, mode, combines))
    return tuple(steps)


def _ends_in_gemm(body: tuple[Stmt, ...]) -> bool:
    """A chain of single loops (after loop-invariant lets) around one `Gemm`."""
    rest = [s for s in body if not (isinstance(s, Let) and not s.mutable)]
    if len(rest) == 1 and isinstance(rest[0], Loop):
        return _ends_in_gemm(rest[0].body)
    return len(rest) == 1 and isinstance(rest[0], Gemm) and not rest[0].more


def mapped_plan(body: tuple[Stmt, ...], mode: str, lanes: int) -> tuple[Step, ...]:
    """`row_plan` for `lanes` threads per row; with a block per row, reductions whose
    per-warp partials would not fit the block's static shared memory run in every lane."""
    plan = row_plan(body)
    slots = max((sum(max(c.size, 1) for c in st.combines) for st in plan), default=0)
    if mode == "block" and lanes // WARP * slots > SHARED_FLOATS:
        plan = tuple(Step(st.stmt, "all") if st.mode == "reduce" else st for st in plan)
    return plan


def thread_loops(body: tuple[Stmt, ...]) -> tuple[list[Let], list[Loop], tuple[Stmt, ...]]:
    """(loop-invariant lets, leading parallel loops mapped to rows, the row body). Loops
    around a `Gemm` are rows whatever their kind (a contraction's outer axes are
    independent; their kind only says where OpenMP goes on a CPU)."""
    lets: list[Let] = []
    loops: list[Loop] = []
    gemm = _ends_in_gemm(body)
    while True:
        head = [s for s in body if isinstance(s, Let) and not s.mutable]
        rest = body[len(head):]
        if (len(rest) == 1 and isinstance(rest[0], Loop)
                and (rest[0].kind == "parallel" or gemm)
                and len(head) == sum(isinstance(s, Let) for s in body)):
            lets += head
            loops.append(rest[0])
            body = rest[0].body
            continue
        return lets, loops, body


def device_body(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    """`body` with every fused statement the CUDA renderer has no kernel of its own for
    (anything with `expand()` but a one-contraction `Gemm`: the CPU's fused attention,
    a multi-contraction `Gemm`) replaced, at any depth, by its plain loops, which the
    row mapping then maps (a warp per query row with the online combine)."""
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Loop):
            out.append(Loop(s.var, s.extent, device_body(s.body), s.kind, s.axis))
        elif (not isinstance(s, Gemm) or s.more) and hasattr(s, "expand"):
            out.extend(device_body(s.expand()))
        else:
            out.append(s)
    return tuple(out)


def _flash_of(nest: KernelNest) -> Any:
    """The fused attention statement a nest consists of, where `cuda.keys` is set (the
    staged CUDA kernel applies), else None."""
    if len(nest.body) != 1 or "cuda.keys" not in nest.knobs:
        return None
    return nest.body[0] if isinstance(nest.body[0], FlashAttention) else None


def _gemm_of(body: tuple[Stmt, ...]) -> Gemm | None:
    """The `Gemm` a row body consists of (after loop-invariant lets), if any."""
    rest = [s for s in body if not (isinstance(s, Let) and not s.mutable)]
    return rest[0] if len(rest) == 1 and isinstance(rest[0], Gemm) and not rest[0].more \
        else None


def device_nests(nests: list[KernelNest]) -> tuple[list[KernelNest], dict[str, int]]:
    """The nests the CUDA renderer launches, in order, and the global scratch buffers
    they share (name -> floats): each nest with no rows whose body has a loop that can
    spread over the grid replaced by its phases (`codegen.cuda_phases`), one launch each;
    every other nest as it is."""
    out: list[KernelNest] = []
    scratch: dict[str, int] = {}
    for nest in nests:
        body = device_body(nest.body)
        _, loops, rest = thread_loops(body)
        if (nest.phase is not None or loops or _flash_of(nest) is not None
                or _gemm_of(rest) is not None):
            out.append(nest)
            continue
        parts, sizes = phases(nest.kernel, grid_reductions(body))
        if len(parts) == 1:
            out.append(nest)
            continue
        scratch.update(sizes)
        out += [KernelNest(nest.kernel, nest.knobs, part, buffers_of(part), phase=p)
                for p, part in enumerate(parts)]
    return out, scratch


# -- the renderer -------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    """One kernel launch: `blocks` blocks of `threads` threads (1-D)."""

    name: str
    blocks: int
    threads: int


class CUDARenderer(CRenderer):
    """CUDA C++: CUDA's own math functions, `__restrict__`, rows mapped to threads, warps or
    blocks (`cuda.rows`), a shared-memory GEMM for contractions. `arch` (e.g. "sm_90") is
    stated in the source's first line."""

    code_for_op: ClassVar[dict[str, Callable[..., str]]] = {
        **CRenderer.code_for_op,
        **{op.value: _fmt(info.cuda) for op, info in OPS.items() if info.cuda is not None},
        **{name: _fmt(info.cuda) for name, info in
           ((v, OPS[BY_NAME[of]]) for v, of in VARIANT_OF.items()) if info.cuda is not None},
    }
    """`CRenderer.code_for_op` with CUDA's spelling where the op table gives one (`OpInfo.cuda`);
    a cheaper variant (`loops.VARIANT_OF`) is spelled as its op there."""
    prelude: ClassVar[str] = "// kernelsat CUDA source"
    restrict: ClassVar[str] = "__restrict__"
    kernel_prefix: ClassVar[str] = 'extern "C" __global__ void'
    cancellable: ClassVar[bool] = False  # device code cannot see a host flag
    simd_pragma: ClassVar[str] = ""  # C's lane-loop pragma (OpenMP); none on a GPU
    unroll_pragma: ClassVar[str] = "#pragma unroll"

    gather_helper: ClassVar[str] = """\
#ifndef __CUDACC__
#define __device__
#define __forceinline__ inline
static inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long c,
                                           unsigned long long v) {
  return __sync_val_compare_and_swap(p, c, v);
}
#endif
__device__ long long ks_gather_error[5];  /* set, input slot, flat position, value, bound */
__device__ __forceinline__ long ks_label(const int* __restrict__ lab, long i, long bound,
                                         long slot) {
  long v = lab[i];
  if ((unsigned long)v < (unsigned long)bound) return v;
  if (atomicCAS((unsigned long long*)&ks_gather_error[0], 0ULL, 1ULL) == 0ULL) {
    ks_gather_error[1] = slot; ks_gather_error[2] = i; ks_gather_error[3] = v;
    ks_gather_error[4] = bound;
  }
  return 0;
}
__device__ __forceinline__ float ks_gather_check(long v, float bound, float slot, float pos) {
  if (v >= 0 && v < (long)bound) return (float)v;
  if (atomicCAS((unsigned long long*)&ks_gather_error[0], 0ULL, 1ULL) == 0ULL) {
    ks_gather_error[1] = (long)slot; ks_gather_error[2] = (long)pos; ks_gather_error[3] = v;
    ks_gather_error[4] = (long)bound;
  }
  return 0.0f;
}"""
    """`CRenderer.gather_helper` on the device: the first failure wins by `atomicCAS`; the
    host reads the flag back after the launches (issue 18 part 3b)."""

    def __init__(self, arch: str = DEFAULT_ARCH) -> None:
        self.arch = arch

    def lit(self, v: float) -> str:
        if math.isinf(v):
            return "(-__int_as_float(0x7f800000))" if v < 0 else "__int_as_float(0x7f800000)"
        return super().lit(v)

    def signature(self, nest: KernelNest) -> str:
        """The last buffer and every other the kernel writes (a phase may write several)
        are `float*`, the rest `const`."""
        written = {nest.params[-1], *(s.buf for s in walk(nest.body) if isinstance(s, Write))}
        params = [f"{'' if b in written else 'const '}"
                  f"{'int' if b in self.int_buffers else 'float'}* {self.restrict} {b}"
                  for b in nest.params]
        return f"{self.kernel_prefix} {nest.symbol}({', '.join(params)})"

    @staticmethod
    def thread_loops(body: tuple[Stmt, ...]) -> tuple[list[Loop], tuple[Stmt, ...]]:
        """Leading parallel loops mapped to rows, and the row body (see `thread_loops`)."""
        _, loops, rest = thread_loops(body)
        return loops, rest

    # -- statements ------------------------------------------------------------------
    def stmt(self, s: Stmt, nest: KernelNest, depth: int, state: dict[str, bool]) -> list[str]:
        if isinstance(s, Write) and state.get("lane0"):
            return [f"{'  ' * depth}if (ks_lane == 0) {{",
                    *super().stmt(s, nest, depth + 1, state), f"{'  ' * depth}}}"]
        if isinstance(s, Array) and s.size <= 64:
            pad = "  " * depth
            return [f"{pad}float {s.name}[{s.size}];",
                    f"{pad}#pragma unroll",
                    f"{pad}for (int k_ = 0; k_ < {s.size}; k_++) "
                    f"{s.name}[k_] = {self.lit(s.init)};"]
        return super().stmt(s, nest, depth, state)

    @staticmethod
    def mode(nest: KernelNest) -> str:
        return str(nest.knobs.get("cuda.rows", "thread"))

    @staticmethod
    def lanes(nest: KernelNest) -> int:
        """Threads per row: 1, 32 (a warp) or `tpb` (a block)."""
        return {"thread": 1, "warp": WARP}.get(CUDARenderer.mode(nest),
                                               int(nest.knobs.get("tpb", 128)))

    def kernel(self, nest: KernelNest) -> str:
        flash = _flash_of(nest)
        if flash is not None:
            return self.flash_kernel(nest, flash)
        lets, loops, body = thread_loops(device_body(nest.body))
        if _gemm_of(body) is not None:
            return self.gemm_kernel(nest)
        total = math.prod(lp.extent for lp in loops)
        mode, g = self.mode(nest), self.lanes(nest)
        lines = [self.signature(nest) + " {"]
        if mode == "thread":
            lines += ["  long gid = (long)blockIdx.x * blockDim.x + threadIdx.x;"]
        elif mode == "warp":
            lines += ["  const int ks_lane = threadIdx.x & 31;",
                      "  long gid = ((long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;"]
        else:
            lines += ["  const int ks_lane = threadIdx.x;", "  long gid = blockIdx.x;"]
        lines.append(f"  if (gid >= {total}) return;")
        stride = total
        for lp in loops:
            stride //= lp.extent
            lines.append(f"  long {lp.var} = (gid / {stride}) % {lp.extent};")
        state = {"parallel_done": True}  # no OpenMP in device code
        for s in lets:
            lines += self.stmt(s, nest, 1, state)
        if mode == "thread":
            for s in body:
                lines += self.stmt(s, nest, 1, state)
            return "\n".join([*lines, "}"])
        plan = mapped_plan(body, mode, g)
        slots = max((sum(max(c.size, 1) for c in st.combines) for st in plan), default=0)
        if mode == "block" and slots:
            lines.append(f"  __shared__ float ks_red[{g // WARP * slots}];")
        for st in plan:
            lines += self.step(st, nest, g, mode)
        return "\n".join([*lines, "}"])

    def step(self, st: Step, nest: KernelNest, g: int, mode: str) -> list[str]:
        if st.mode == "all":
            return self.stmt(st.stmt, nest, 1, {"parallel_done": True, "lane0": True})
        loop = st.stmt
        assert isinstance(loop, Loop)
        v = loop.var
        lines = [f"  for (long {v} = ks_lane; {v} < {loop.extent}; {v} += {g}) {{"]
        for b in loop.body:
            lines += self.stmt(b, nest, 2, {"parallel_done": True})
        lines.append("  }")
        if st.mode == "reduce":
            lines += self.combine(st.combines, mode, g)
        return lines

    # -- combines ------------------------------------------------------------------------
    def combine(self, combines: tuple[Combine, ...], mode: str, g: int) -> list[str]:
        """Merge the lanes' accumulators: a shuffle butterfly within each warp, then (a
        block per row) through shared memory across warps, in warp order."""
        def shfl(name: str, k: str) -> str:
            return f"__shfl_xor_sync({FULL_MASK}, {name}{k}, ks_o)"

        lines = [f"  for (int ks_o = {WARP // 2}; ks_o > 0; ks_o >>= 1) {{",
                 *self.merge(combines, shfl, "    "), "  }"]
        if mode != "block":
            return lines
        offsets, off = {}, 0
        for c in combines:
            offsets[c.name] = off
            off += max(c.size, 1)
        slots = off

        def smem(name: str, k: str) -> str:
            idx = k[1:-1] if k else "0"
            return f"ks_red[ks_w * {slots} + {offsets[name]} + {idx}]"

        lines.append("  if ((ks_lane & 31) == 0) {")
        lines.append("    const int ks_w = ks_lane >> 5;")
        for c in combines:
            if c.size:
                lines.append(f"    for (int k_ = 0; k_ < {c.size}; k_++) "
                             f"{smem(c.name, '[k_]')} = {c.name}[k_];")
            else:
                lines.append(f"    {smem(c.name, '')} = {c.name};")
        lines += ["  }", "  __syncthreads();", "  {", "    const int ks_w = 0;"]
        for c in combines:
            if c.size:
                lines.append(f"    for (int k_ = 0; k_ < {c.size}; k_++) "
                             f"{c.name}[k_] = {smem(c.name, '[k_]')};")
            else:
                lines.append(f"    {c.name} = {smem(c.name, '')};")
        lines += ["  }", f"  for (int ks_w = 1; ks_w < {g // WARP}; ks_w++) {{",
                  *self.merge(combines, smem, "    "), "  }", "  __syncthreads();"]
        return lines

    # -- the shared-memory GEMM ---------------------------------------------------------
    @staticmethod
    def gemm_tiles(nest: KernelNest) -> tuple[int, int, int, int, int]:
        k = nest.knobs
        return tuple(int(k.get(n, v[0])) for n, v in GEMM_KNOBS.items())  # type: ignore[return-value]

    def gemm_kernel(self, nest: KernelNest) -> str:
        """A row body that is one `Gemm`: one block per (row, bm x bn output tile)."""
        lets, loops, body = thread_loops(device_body(nest.body))
        g = _gemm_of(body)
        assert g is not None
        bm, bn, bk, tm, tn = self.gemm_tiles(nest)
        cols = bn // tn
        nthr = (bm // tm) * cols
        mt, nt = -(-g.m // bm), -(-g.n // bn)
        lines = [self.signature(nest) + " {",
                 f"  __shared__ float ks_As[{bk}][{bm} + 1];",
                 f"  __shared__ float ks_Bs[{bk}][{bn} + 1];",
                 "  const int ks_tid = threadIdx.x;",
                 f"  const long ks_nb = blockIdx.x % {nt};",
                 f"  const long ks_mb = (blockIdx.x / {nt}) % {mt};",
                 f"  long gid = blockIdx.x / {nt * mt};"]
        stride = math.prod(lp.extent for lp in loops)
        for lp in loops:
            stride //= lp.extent
            lines.append(f"  long {lp.var} = (gid / {stride}) % {lp.extent};")
        state = {"parallel_done": True}
        for s in [*lets, *(s for s in body if isinstance(s, Let))]:
            lines += self.stmt(s, nest, 1, state)
        lines += [f"  const long ks_m0 = ks_mb * {bm}, ks_n0 = ks_nb * {bn};",
                  f"  const int ks_r = ks_tid / {cols}, ks_c = ks_tid % {cols};",
                  f"  float ks_acc[{tm}][{tn}];",
                  f"  #pragma unroll\n  for (int i_ = 0; i_ < {tm}; i_++)",
                  f"    #pragma unroll\n    for (int j_ = 0; j_ < {tn}; j_++) "
                  "ks_acc[i_][j_] = 0.0f;",
                  f"  for (long ks_k0 = 0; ks_k0 < {g.k}; ks_k0 += {bk}) {{"]
        lines += self.stage(g.a, g.mvar, g.kvar, g.m, g.k, "ks_As", bm, bk, nthr, "ks_m0")
        lines += self.stage(g.b, g.nvar, g.kvar, g.n, g.k, "ks_Bs", bn, bk, nthr, "ks_n0")
        lines += ["    __syncthreads();",
                  "    #pragma unroll",
                  f"    for (int kk_ = 0; kk_ < {bk}; kk_++) {{",
                  f"      float ks_ra[{tm}], ks_rb[{tn}];",
                  f"      #pragma unroll\n      for (int i_ = 0; i_ < {tm}; i_++) "
                  f"ks_ra[i_] = ks_As[kk_][ks_r * {tm} + i_];",
                  f"      #pragma unroll\n      for (int j_ = 0; j_ < {tn}; j_++) "
                  f"ks_rb[j_] = ks_Bs[kk_][ks_c * {tn} + j_];",
                  f"      #pragma unroll\n      for (int i_ = 0; i_ < {tm}; i_++)",
                  f"        #pragma unroll\n        for (int j_ = 0; j_ < {tn}; j_++) "
                  "ks_acc[i_][j_] = fmaf(ks_ra[i_], ks_rb[j_], ks_acc[i_][j_]);",
                  "    }", "    __syncthreads();", "  }",
                  f"  #pragma unroll\n  for (int i_ = 0; i_ < {tm}; i_++) {{",
                  f"    #pragma unroll\n    for (int j_ = 0; j_ < {tn}; j_++) {{",
                  f"      const long {g.mvar} = ks_m0 + ks_r * {tm} + i_;",
                  f"      const long {g.nvar} = ks_n0 + ks_c * {tn} + j_;",
                  f"      if ({g.mvar} < {g.m} && {g.nvar} < {g.n}) {{",
                  f"        float {g.acc} = ks_acc[i_][j_];"]
        for s in (*g.epilogue, g.write):
            lines += self.stmt(s, nest, 4, state)
        lines += ["      }", "    }", "  }", "}"]
        return "\n".join(lines)

    def stage(self, load: Load, ovar: str, kvar: str, extent: int, k: int, tile: str,
              width: int, bk: int, nthr: int, base: str) -> list[str]:
        """Cooperative copy of a bk x width slice of one operand into `tile[kk][o]`
        (zero outside the operand), ordered so consecutive threads read consecutive
        addresses: k fastest where the operand's k stride is 1, else the output axis."""
        coef = dict(load.index.terms)
        k_fast = coef.get(kvar, 0) == 1 and coef.get(ovar, 0) != 1
        inner, outer = (("kk_", bk), ("oo_", width)) if k_fast else (("oo_", width), ("kk_", bk))
        return [f"    for (int e_ = ks_tid; e_ < {bk * width}; e_ += {nthr}) {{",
                f"      const int {inner[0]} = e_ % {inner[1]}, {outer[0]} = e_ / {inner[1]};",
                f"      const long {ovar} = {base} + oo_, {kvar} = ks_k0 + kk_;",
                f"      {tile}[kk_][oo_] = ({ovar} < {extent} && {kvar} < {k}) ? "
                f"{self.expr(load)} : 0.0f;",
                "    }"]

    # -- the staged fused attention -----------------------------------------------------
    def flash_skip(self, f: Any, rows: int, kb: int) -> list[str]:
        """Skip a key block whose every score is masked for the block's rows (the
        condition is uniform over the thread block, so every thread skips together)."""
        masked = block_masked(f.score, f.row, f.key, self.lit, ("ks_r0", f"(ks_r0 + {rows - 1})"),
                              ("ks_k0", f"(ks_k0 + {kb - 1})"))
        return [] if masked is None else [f"    if ({masked}) continue;"]

    def flash_kernel(self, nest: KernelNest, f: Any) -> str:
        """`FlashAttention` (codegen/flash.py) with one warp per query row, `tpb / 32` rows
        of one batch position per block: the block's Q rows, then per block of
        `cuda.keys` keys K and V, are staged in shared memory (rows padded by one float:
        lanes reading different keys hit different banks); lane l takes keys l, l + 32,
        ... of each block with its own online state (running max, rescaled sum and
        output row in registers); the lanes' states merge by the online combine's
        shuffle butterfly; lane x % 32 writes output column x."""
        kb, tpb = int(nest.knobs["cuda.keys"]), int(nest.knobs.get("tpb", 128))
        rows = tpb // WARP
        blocks_m = -(-f.m // rows)
        d, e = f.d, f.e

        def at(s: Any, p: str, q: str) -> str:
            return f"{s.buf}[{s.base.render()} + ({p})*{s.outer} + ({q})*{s.inner}]"

        lines = [self.signature(nest) + " {",
                 f"  __shared__ float ks_Q[{rows}][{d}];",
                 f"  __shared__ float ks_K[{kb}][{d} + 1];",
                 f"  __shared__ float ks_V[{kb}][{e} + 1];",
                 "  const int ks_tid = threadIdx.x, ks_warp = ks_tid >> 5, ks_lane = ks_tid & 31;",
                 f"  const long ks_h = blockIdx.x / {blocks_m};",
                 f"  const long ks_r0 = (blockIdx.x % {blocks_m}) * {rows};"]
        stride = f.heads
        for var, extent in f.batch:
            stride //= extent
            lines.append(f"  const long {var} = (ks_h / {stride}) % {extent};")
        lines += [f"  const long {f.row} = ks_r0 + ks_warp;",
                  f"  for (int e_ = ks_tid; e_ < {rows * d}; e_ += {tpb}) {{",
                  f"    const int r_ = e_ / {d}, c_ = e_ % {d};",
                  f"    ks_Q[r_][c_] = ks_r0 + r_ < {f.m} ? {at(f.q, 'ks_r0 + r_', 'c_')} : 0.0f;",
                  "  }",
                  f"  float ks_m = {self.lit(-3.4028234663852886e38)}, ks_l = 0.0f;",
                  f"  float ks_acc[{e}];",
                  f"  #pragma unroll\n  for (int x_ = 0; x_ < {e}; x_++) ks_acc[x_] = 0.0f;",
                  f"  for (long ks_k0 = 0; ks_k0 < {f.n}; ks_k0 += {kb}) {{",
                  *self.flash_skip(f, rows, kb),
                  "    __syncthreads();",
                  f"    for (int e_ = ks_tid; e_ < {kb * d}; e_ += {tpb}) {{",
                  f"      const int j_ = e_ / {d}, c_ = e_ % {d};",
                  f"      ks_K[j_][c_] = ks_k0 + j_ < {f.n} ? "
                  f"{at(f.k, 'ks_k0 + j_', 'c_')} : 0.0f;",
                  "    }",
                  f"    for (int e_ = ks_tid; e_ < {kb * e}; e_ += {tpb}) {{",
                  f"      const int j_ = e_ / {e}, c_ = e_ % {e};",
                  f"      ks_V[j_][c_] = ks_k0 + j_ < {f.n} ? "
                  f"{at(f.v, 'ks_k0 + j_', 'c_')} : 0.0f;",
                  "    }",
                  "    __syncthreads();",
                  f"    if ({f.row} < {f.m}) {{",
                  f"      for (int j_ = ks_lane; j_ < {kb} && ks_k0 + j_ < {f.n}; j_ += {WARP}) {{",
                  f"        const long {f.key} = ks_k0 + j_;",
                  f"        float {f.dot} = 0.0f;",
                  f"        #pragma unroll 8\n        for (int c_ = 0; c_ < {d}; c_++) "
                  f"{f.dot} = fmaf(ks_Q[ks_warp][c_], ks_K[j_][c_], {f.dot});",
                  f"        const float ks_s = {self.expr(f.score)};",
                  "        const float ks_t = ks_s - ks_m;",
                  "        const float ks_w = expf(-fabsf(ks_t));",
                  "        const float ks_c = ks_t > 0.0f ? ks_w : 1.0f;",
                  "        const float ks_p = ks_t > 0.0f ? 1.0f : ks_w;",
                  "        ks_l = ks_l * ks_c + ks_p;",
                  "        ks_m = ks_t > 0.0f ? ks_s : ks_m;",
                  f"        #pragma unroll\n        for (int x_ = 0; x_ < {e}; x_++) "
                  "ks_acc[x_] = ks_acc[x_] * ks_c + ks_p * ks_V[j_][x_];",
                  "      }", "    }", "  }"]
        combines = (Combine("ks_m", "online"), Combine("ks_l", "scaled", 0, "ks_m"),
                    Combine("ks_acc", "scaled", e, "ks_m"))
        lines += self.combine(combines, "warp", WARP)
        lines += [f"  if ({f.row} < {f.m}) {{",
                  f"    #pragma unroll\n    for (int x_ = 0; x_ < {e}; x_++)",
                  # a fully masked row (l = 0) is 0, as the interpreter's SoftmaxAvg
                  f"      if ((x_ & 31) == ks_lane) {at(f.out, f.row, 'x_')} = "
                  "ks_l > 0.0f ? ks_acc[x_] / ks_l : 0.0f;",
                  "  }", "}"]
        return "\n".join(lines)

    # -- launches ------------------------------------------------------------------------
    def launch(self, nest: KernelNest) -> Launch:
        name = nest.symbol
        tpb = int(nest.knobs.get("tpb", 128))
        flash = _flash_of(nest)
        if flash is not None:
            return Launch(name, flash.heads * -(-flash.m // (tpb // WARP)), tpb)
        _, loops, body = thread_loops(device_body(nest.body))
        rows = math.prod(lp.extent for lp in loops)
        g = _gemm_of(body)
        if g is not None:
            bm, bn, _, tm, tn = self.gemm_tiles(nest)
            return Launch(name, rows * -(-g.m // bm) * -(-g.n // bn), (bm // tm) * (bn // tn))
        mode = self.mode(nest)
        if mode == "block":
            return Launch(name, rows, tpb)
        threads = rows * (WARP if mode == "warp" else 1)
        return Launch(name, max(1, -(-threads // tpb)), tpb)

    def launches(self, nests: list[KernelNest]) -> list[Launch]:
        """Each launch, in order (a kernel cut into phases has one per phase)."""
        return [self.launch(n) for n in device_nests(nests)[0]]

    def render(self, prog: LoweredProgram, nests: list[KernelNest]) -> str:
        """The source; where a kernel runs as several launches (phases), a comment after
        the first line lists every launch in order, with its grid, block and arguments,
        and the scratch buffers they share (floats each), which the caller allocates."""
        launched, scratch = device_nests(nests)
        header = f"{self.prelude} ({self.arch})"
        if scratch:
            calls = [f"//   {n.symbol}<<<{x.blocks}, {x.threads}>>>({', '.join(n.params)})"
                     for n, x in zip(launched, self.launches(launched), strict=True)]
            header += "\n".join(["", "// launches, in order:", *calls,
                                 "// scratch buffers (float32 elements): " + ", ".join(
                                     f"{b} {n}" for b, n in scratch.items())])
        self.helpers: dict[str, None] = {}
        self.int_buffers = int_buffers(prog)
        # gathers add their helper (issue 18 3b)
        kernels = [self.kernel(n) for n in launched]
        return "\n\n".join([header, *self.helpers, *kernels]) + "\n"


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
    launches: list[Launch]
    nests: list[KernelNest] = field(default_factory=list, repr=False)  # one per launch
    arch: str = DEFAULT_ARCH
    scratch: dict[str, int] = field(default_factory=dict)  # phases' shared floats
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
        self._state.update(drv=drv, module=module,
                           fns=[module.get_function(x.name) for x in self.launches])
        return self._state

    def __call__(self, inputs: Mapping[str, np.ndarray], out: np.ndarray) -> None:
        st = self._load()
        drv = st["drv"]
        arrays = check_args(self.prog, inputs, out)
        bufs = self.prog.buffers
        dev = {b: drv.mem_alloc(max(4, 4 * bufs[b].size)) for b in buffer_order(self.prog)}
        dev.update({b: drv.mem_alloc(4 * n) for b, n in self.scratch.items()})
        for b, arr in arrays.items():
            if b != "out":
                drv.memcpy_htod(dev[b], arr)
        for fn, launch, nest in zip(st["fns"], self.launches, self.nests, strict=True):
            fn(*(dev[b] for b in nest.params), block=(launch.threads, 1, 1),
               grid=(launch.blocks, 1))
        drv.Context.synchronize()
        drv.memcpy_dtoh(out, dev["out"])
        if "ks_gather_error" in self.source:  # a gather's label out of range (issue 18 3b)
            ptr, _ = st["module"].get_global("ks_gather_error")
            flag = np.zeros(5, np.int64)
            drv.memcpy_dtoh(flag, ptr)
            drv.memcpy_htod(ptr, np.zeros(5, np.int64))
            error = gather_error(self.prog, flag)
            if error is not None:
                raise error


def build_cuda(prog: LoweredProgram, nests: list[KernelNest],
               arch: str = DEFAULT_ARCH) -> CUDAExecutable:
    r = CUDARenderer(arch)
    launched, scratch = device_nests(nests)
    return CUDAExecutable(prog, r.render(prog, launched), r.launches(launched), launched, arch,
                          scratch)


# -- the row mapping, emulated in float64 (tests) -------------------------------------


def _state_copy(env: Env, names: list[str]) -> Env:
    return {n: (env[n].copy() if isinstance(env[n], np.ndarray) else env[n]) for n in names}


def emulate(prog: Any, nests: list[Any], inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """The output of the lowered program `prog` (nests under their knobs) as the CUDA
    renderer maps it, computed in float64 here: each row's lanes (`cuda.rows`) with their
    own variables, lane-strided loops, the xor butterfly over each warp's 32 lanes, the
    block mapping's per-warp merge in warp order, writes in "all" steps by lane 0 only.
    A row body that is a `Gemm` runs as its plain loops (the tiled GEMM's index math is
    checked on a GPU, by bench/gpu_check.py). Outputs never written stay NaN."""
    bufs: dict[str, np.ndarray] = {}
    for name, info in prog.buffers.items():
        bufs[name] = np.full(info.size, np.nan)
    for info in prog.inputs:
        bufs[info.name] = np.asarray(inputs[info.user_name], float).reshape(-1).copy()
    nests, scratch = device_nests(nests)  # a kernel with no rows: its phases
    bufs.update({b: np.full(n, np.nan) for b, n in scratch.items()})

    def load(b: str, i: int) -> float:
        if not 0 <= i < bufs[b].size:
            raise IndexError(f"{b}[{i}] out of range")
        return float(bufs[b][i])

    def store(b: str, i: int, v: float) -> None:
        if not 0 <= i < bufs[b].size:
            raise IndexError(f"{b}[{i}] out of range")
        bufs[b][i] = v

    interp = Interp(load, store)
    quiet = Interp(load, None)  # lanes other than 0 in "all" steps: writes dropped
    for nest in nests:
        lets, loops, body = thread_loops(device_body(nest.body))
        g = CUDARenderer.lanes(nest)
        rows = math.prod(lp.extent for lp in loops)
        gemm = _gemm_of(body) is not None
        plan = mapped_plan(body, CUDARenderer.mode(nest), g) if g > 1 and not gemm else ()
        for gid in range(rows):
            env: Env = {}
            stride = rows
            for lp in loops:
                stride //= lp.extent
                env[lp.var] = (gid // stride) % lp.extent
            interp.run(tuple(lets), env)
            if g == 1 or gemm:
                interp.run(expand_gemms(body), env)
                continue
            envs = [_copy(env) for _ in range(g)]
            for st in plan:
                if st.mode == "all":
                    for lane, e in enumerate(envs):
                        (interp if lane == 0 else quiet).stmt(st.stmt, e)
                    continue
                loop = st.stmt
                assert isinstance(loop, Loop)
                for lane, e in enumerate(envs):
                    interp.iterations(loop, range(lane, loop.extent, g), e)
                if st.mode != "reduce":
                    continue
                names = [c.name for c in st.combines]
                offset = WARP // 2
                while offset:
                    snap = [_state_copy(e, names) for e in envs]
                    for lane, e in enumerate(envs):
                        merge(st.combines, e, snap[lane ^ offset])
                    offset //= 2
                if g > WARP:
                    parts = [_state_copy(envs[w * WARP], names) for w in range(g // WARP)]
                    for e in envs:
                        e.update(_state_copy(parts[0], names))
                        for p in parts[1:]:
                            merge(st.combines, e, p)
    out = bufs["out"].reshape(prog.buffers["out"].shape)
    return out
