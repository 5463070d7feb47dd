"""The C renderer (gcc -O3 -march=<the target's ISA> -fopenmp, loaded with ctypes).

`CRenderer` is tables: `code_for_op` (each op's C spelling, from the op table) and a few
small methods for literals, loops and kernel signatures that `CUDARenderer` overrides
where CUDA differs.
Generated identifiers only: buffers `in<k>`/`buf<k>`/`out`, loop variables `ax<k>`,
temporaries `t<k>`, accumulators `acc<k>`; user names never reach the source.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from kernelsat.cachefile import cache_dir as default_cache_dir
from kernelsat.codegen.c_prelude import PRELUDE
from kernelsat.codegen.combine import SPLIT_KINDS, Combine, parallel_sums
from kernelsat.codegen.cuda_emulate import combine_ok, initial_state
from kernelsat.codegen.flash import FlashAttention
from kernelsat.codegen.gemm import render_gemm
from kernelsat.codegen.loops import (
    Affine,
    Array,
    Assign,
    Call,
    Expr,
    Gemm,
    IndexValue,
    Label,
    Let,
    Lit,
    Load,
    Loop,
    Ref,
    Stmt,
    Write,
)
from kernelsat.codegen.lower import CodegenError, KernelNest, LoweredProgram
from kernelsat.codegen.stream import STREAM_HELPERS, c_stream_loop, streamed_write
from kernelsat.gather import GatherIndexError
from kernelsat.ops import OPS

NATIVE_ISA_FLAGS = ("-march=native", "-mprefer-vector-width=512")
"""The instruction set a build targets when its target names none (`Target.compile_flags`
empty): this CPU's own, 512-bit vectors where it has them (measured here: fused softmax
4096x1024 2.9 -> 2.0 ms, the elementwise chain 20 -> 16 ms)."""


def c_flags(isa_flags: Sequence[str] = ()) -> tuple[str, ...]:
    """gcc flags of a build for the instruction set `isa_flags` (empty: `NATIVE_ISA_FLAGS`).
    Not -ffast-math: -inf initializers and NaN must keep their meaning; -fno-math-errno
    only lets sqrtf vectorize.

    >>> c_flags()[:3]
    ('-O3', '-march=native', '-mprefer-vector-width=512')
    >>> "-march=native" in c_flags(("-march=x86-64-v2",))
    False
    """
    return ("-O3", *(tuple(isa_flags) or NATIVE_ISA_FLAGS), "-fopenmp", "-fno-math-errno",
            "-std=gnu11", "-shared", "-fPIC")


CFLAGS = c_flags()
"""gcc flags of a build for this CPU (`c_flags()`)."""

BUILD_FOLDER = "c"
"""Compiled libraries go under `<cache folder>/c` (`kernelsat.cachefile.cache_dir`)."""


def _fmt(template: str) -> Callable[..., str]:
    """The renderer of a spelling whose operands are `{0}`, `{1}`."""
    return lambda *args: template.format(*args)


def loop_levels(body: Sequence[Stmt]) -> int:
    """How many levels of plain loops nest in `body` (0: none). A GEMM or fused
    attention statement counts as none: it checks the flag in its own loops."""
    return max((1 + loop_levels(b.body) for b in body if isinstance(b, Loop)), default=0)


def _rescales(i: int, mine: str, theirs: str) -> list[str]:
    """The merged max `ks_top<i>` of an online pair's two sides and each side's rescale
    factor exp(own max - merged max) (`ks_ca<i>` mine, `ks_cb<i>` theirs; exactly 1 for
    the side holding the max, so an idle side at -inf never makes inf - inf)."""
    return [f"float ks_om{i} = {theirs};",
            f"float ks_top{i} = (ks_om{i} > {mine} ? ks_om{i} : {mine});",
            f"float ks_ca{i} = ({mine} == ks_top{i}) ? 1.0f : expf({mine} - ks_top{i});",
            f"float ks_cb{i} = (ks_om{i} == ks_top{i}) ? 1.0f : expf(ks_om{i} - ks_top{i});"]


class CRenderer:
    """Renders a lowered program's loop nests to one C translation unit."""

    code_for_op: ClassVar[dict[str, Callable[..., str]]] = {
        **{op.value: _fmt(info.c) for op, info in OPS.items() if info.c is not None},
        "select_gt": lambda a, b, c, d: f"({a} > {b} ? {c} : {d})",
        "exp_nonpos": _fmt("ks_exp_nonpos({0})"),
        "gather_check": lambda v, b, s, p: f"ks_gather_check({v}, {b}, {s}, {p})",
    }
    """C of each elementwise op (`OpInfo.c` of the op table), of the lowering's selects and
    of the cheaper variants (`loops.VARIANT_OF`)."""
    prelude: ClassVar[str] = PRELUDE
    index_type: ClassVar[str] = "long"
    restrict: ClassVar[str] = "restrict"
    kernel_prefix: ClassVar[str] = "static void"
    native_gemm: ClassVar[bool] = True
    """Render `Gemm` statements as the blocked host GEMM (False: as plain loops)."""
    simd_pragma: ClassVar[str] = "#pragma omp simd"
    """Before a loop of kind "simd" (independent lanes that gcc would otherwise unroll and
    leave scalar: a max reduction's lane loop becomes one vmaxps per step)."""
    unroll_pragma: ClassVar[str] = ""
    """Before a merge's element loop (`merge`): none in C; CUDA unrolls it."""
    cancellable: ClassVar[bool] = True
    """Loops skip their body once `ks_cancel` is set, and `ks_run` runs no further kernel:
    a watchdog thread sets it, so a run past its time limit stops soon. The check sits in
    each kernel's outermost loop (when it holds a loop) and in every loop with at least
    two loop levels beneath it (`loop_levels`), never in a "simd" loop: an outer loop of
    2 iterations over a 1448 x 1448 x 184 x 181 x 8 nest once ran for minutes between
    two checks. The innermost two levels stay check-free, so gcc's vectorizer sees the
    same loops as without checks (checks in every loop were measured to block it:
    gemv, variance 2x slower)."""

    gather_helper: ClassVar[str] = """\
long ks_gather_error[5] = {0, 0, 0, 0, 0};  /* set, input slot, flat position, value, bound */
static inline long ks_label(const int* restrict lab, long i, long bound, long slot) {
  long v = lab[i];
  if ((unsigned long)v < (unsigned long)bound) return v;
  #pragma omp critical(ks_gather)
  if (!ks_gather_error[0]) {
    ks_gather_error[1] = slot; ks_gather_error[2] = i; ks_gather_error[3] = v;
    ks_gather_error[4] = bound; ks_gather_error[0] = 1;
  }
  return 0;
}
static inline float ks_gather_check(long v, float bound, float slot, float pos) {
  if (v >= 0 && v < (long)bound) return (float)v;
  #pragma omp critical(ks_gather)
  if (!ks_gather_error[0]) {
    ks_gather_error[1] = (long)slot; ks_gather_error[2] = (long)pos; ks_gather_error[3] = v;
    ks_gather_error[4] = (long)bound; ks_gather_error[0] = 1;
  }
  return 0.0f;
}"""
    """A gather's checked label (issue 18 part 3b): an index outside [0, bound) records
    the first failure in `ks_gather_error` (the wrapper raises `GatherIndexError`) and
    reads element 0, never outside the buffer."""
    int_buffers: frozenset[str] = frozenset()
    """The integer (int32) input buffers of the program being rendered."""

    # -- expressions --------------------------------------------------------------
    def load_index(self, idx: Affine, labels: tuple[Label, ...]) -> str:
        """A load's index: its affine part plus each gather's checked label times its
        stride (issue 18 part 3b)."""
        if not labels:
            return idx.render()
        self.need(self.gather_helper)
        parts = [idx.render()] + [
            f"{lb.stride}L * ks_label({lb.buf}, {lb.index.render()}, {lb.bound}L, {lb.slot})"
            if lb.value is None else f"{lb.stride}L * (long)({self.expr(lb.value)})"
            for lb in labels]
        return " + ".join(parts)

    def lit(self, v: float) -> str:
        """A float literal; negative ones parenthesised (`neg` of -1.5 is `(-(-1.5f))`,
        never the decrement `--1.5f`)."""
        if math.isinf(v):
            return "(-INFINITY)" if v < 0 else "INFINITY"
        text = repr(float(np.float32(v)))
        text += "f" if ("." in text or "e" in text) else ".0f"
        return f"({text})" if text.startswith("-") else text

    def expr(self, e: Expr) -> str:
        match e:
            case Lit(v):
                return self.lit(v)
            case Ref(name, None):
                return name
            case Load(name, idx, guard, pad, labels) if guard:  # a padded affine read
                conds = " && ".join(self.in_range(g, n) for g, n in guard)
                return f"(({conds}) ? {name}[{self.load_index(idx, labels)}] : {self.lit(pad)})"
            case Load(name, idx, _, _, labels) if labels:  # a gather
                return f"{name}[{self.load_index(idx, labels)}]"
            case Ref(name, idx) | Load(name, idx):
                assert idx is not None
                return f"{name}[{idx.render()}]"
            case IndexValue(idx):
                return f"((float)({idx.render()}))"
            case Call(op, args):
                if op == "gather_check":  # a gather's label (issue 18 part 3b)
                    self.need(self.gather_helper)
                if op not in self.code_for_op:
                    raise CodegenError(f"{type(self).__name__} has no code for op {op!r}")
                return self.code_for_op[op](*(self.expr(a) for a in args))
        raise AssertionError(f"not an expression: {e!r}")

    def in_range(self, index: Affine, extent: int) -> str:
        """`0 <= index < extent` as one unsigned comparison (a padded read's guard)."""
        return f"(unsigned long)({index.render()}) < {extent}UL"

    # -- statements ------------------------------------------------------------------
    def loop_head(self, loop: Loop, nest: KernelNest, first_parallel: bool) -> list[str]:
        it = self.index_type
        head = f"for ({it} {loop.var} = 0; {loop.var} < {loop.extent}; {loop.var}++) {{"
        if first_parallel and nest.knobs.get("omp", True):
            return ["#pragma omp parallel for schedule(static)", head]
        if loop.kind == "simd" and self.simd_pragma:
            return [self.simd_pragma, head]
        return [head]

    def stmt(self, s: Stmt, nest: KernelNest, depth: int, state: dict[str, bool]) -> list[str]:
        pad = "  " * depth
        match s:
            case Let(name, expr, _):
                return [f"{pad}float {name} = {self.expr(expr)};"]
            case Array(name, size, init, fill):
                it = self.index_type
                return [f"{pad}float {name}[{size}];"] + (
                    [f"{pad}for ({it} k_ = 0; k_ < {size}; k_++) {name}[k_] = {self.lit(init)};"]
                    if fill else [])
            case Assign(target, expr):
                return [f"{pad}{self.expr(target)} = {self.expr(expr)};"]
            case Write(buf, idx, expr):
                return [f"{pad}{buf}[{idx.render()}] = {self.expr(expr)};"]
            case Loop() if id(s) in self.splits:
                return self.split_loop(s, self.splits[id(s)], nest, depth, state)
            case Loop(_, _, body, kind, _) if (type(self).kernel is CRenderer.kernel
                                               and streamed_write(s) is not None):
                return self.stream_loop(s, nest, depth, state)
            case Loop(_, _, body, kind, _):
                first = kind == "parallel" and s.extent > 1 and not state["parallel_done"]
                if first:
                    state["parallel_done"] = True
                lines = [pad + h for h in self.loop_head(s, nest, first)]
                if self.cancellable and kind != "simd" and (
                        ((depth <= 1 or kind == "split")  # a kernel's outermost loop
                         and any(isinstance(b, Loop) for b in body))
                        or loop_levels(body) >= 2):
                    lines.append(f"{pad}  if (ks_cancel) continue;")
                for b in body:
                    lines += self.stmt(b, nest, depth + 1, state)
                return [*lines, pad + "}"]
            case Gemm():
                return self.gemm(s, nest, depth, state)
            case FlashAttention():
                return self.flash(s, nest, depth, state)
        raise AssertionError(f"not a statement: {s!r}")

    def gemm(self, g: Gemm, nest: KernelNest, depth: int, state: dict[str, bool]) -> list[str]:
        """A `Gemm`: the blocked host GEMM (codegen/gemm.py) when `native_gemm` and this
        class keeps CRenderer's kernel model (one host function, OpenMP); otherwise its
        plain loops (`Gemm.expand()`), which any renderer can map."""
        if self.native_gemm and type(self).kernel is CRenderer.kernel:
            return render_gemm(self, g, nest, depth)
        return [line for s in g.expand() for line in self.stmt(s, nest, depth, state)]

    def flash(self, f: FlashAttention, nest: KernelNest, depth: int,
              state: dict[str, bool]) -> list[str]:
        """A fused attention (codegen/flash.py): natively where this class keeps
        CRenderer's kernel model (one host function, OpenMP), else its plain loops."""
        if type(self).kernel is CRenderer.kernel:
            for source in f.c_helpers():
                self.need(source)
            return f.c_lines(self.expr, self.lit, self.cancellable, depth)
        return [line for s in f.expand() for line in self.stmt(s, nest, depth, state)]

    def merge(self, combines: tuple[Combine, ...], other: Callable[[str, str], str],
              pad: str) -> list[str]:
        """`mine <- merge(mine, other)` for split reductions (CUDA's lanes and warps, C's
        threads; as `cuda_emulate.merge`); `other(name, "[k_]")` is the C expression of
        the other side's value of an accumulator (element). An array of online maxima
        merges element by element, each element rescaling its partners' element."""
        lines: list[str] = []
        index = {c.name: i for i, c in enumerate(combines)}
        lanes = {c.name for c in combines if c.kind == "online" and c.size}
        for i, c in enumerate(combines):
            if c.kind == "online" and not c.size:
                lines += [pad + x for x in _rescales(i, c.name, other(c.name, ""))]
        for c in combines:
            k = "[k_]" if c.size else ""
            mine, theirs = f"{c.name}{k}", other(c.name, k)
            if c.kind == "sum":
                update = f"{mine} = {mine} + {theirs};"
            elif c.kind == "max":
                update = f"{{ float ks_x = {theirs}; {mine} = (ks_x > {mine} ? ks_x : {mine}); }}"
            elif c.kind == "scaled" and c.by not in lanes:
                i = index[c.by]
                update = f"{mine} = {mine} * ks_ca{i} + {theirs} * ks_cb{i};"
            elif c.kind == "online" and c.size:
                i = index[c.name]
                scaled = [f"{p.name}[k_] = {p.name}[k_] * ks_ca{i} + "
                          f"{other(p.name, '[k_]')} * ks_cb{i};"
                          for p in combines if p.kind == "scaled" and p.by == c.name]
                update = " ".join(["{", *_rescales(i, mine, theirs), *scaled,
                                   f"{mine} = ks_top{i};", "}"])
            else:
                continue
            if c.size:
                lines += [f"{pad}{self.unroll_pragma}"] if self.unroll_pragma else []
                lines.append(f"{pad}for (int k_ = 0; k_ < {c.size}; k_++) {update}")
            else:
                lines.append(pad + update)
        for i, c in enumerate(combines):
            if c.kind == "online" and not c.size:
                lines.append(f"{pad}{c.name} = ks_top{i};")
        return lines

    def split_loop(self, loop: Loop, combines: tuple[Combine, ...], nest: KernelNest,
                   depth: int, state: dict[str, bool]) -> list[str]:
        """A reduction loop split over the threads (knob `psum`, `codegen/combine.py`):
        in a parallel region each thread reduces its static share of the iterations into
        its own copy of every accumulator, started at the merge's identity (0 for a sum,
        -inf for a maximum: `SPLIT_KINDS`; declared in the region, so the loop's body
        names the copy) and stores it in row `ks_t` of a partials array; the calling
        thread then merges the rows into the accumulators in thread order. The rows start
        at the identity, so a thread the runtime does not start changes nothing. Arrays
        written slot by slot (kind "slot") are shared: each iteration writes its own
        slots."""
        self.need("#include <omp.h>")
        pad, it = "  " * depth, self.index_type
        parts = [c for c in combines if c.kind in SPLIT_KINDS]  # "slot": shared
        lines = [f"{pad}{{", f"{pad}  const int ks_nt = omp_get_max_threads();"]
        for c in parts:
            dims = f"[ks_nt][{c.size}]" if c.size else "[ks_nt]"
            lines.append(f"{pad}  float ks_p_{c.name}{dims};")
            lines.append(f"{pad}  for ({it} k_ = 0; k_ < (sizeof ks_p_{c.name}) / 4; k_++) "
                         f"((float*)ks_p_{c.name})[k_] = {self.lit(SPLIT_KINDS[c.kind])};")
        lines += [f"{pad}  #pragma omp parallel num_threads(ks_nt)", f"{pad}  {{"]
        for c in parts:
            start = SPLIT_KINDS[c.kind]
            lines += self.stmt(Array(c.name, c.size, start) if c.size
                               else Let(c.name, Lit(start), True), nest, depth + 2, state)
        lines.append(f"{pad}    #pragma omp for schedule(static)")
        lines += self.stmt(Loop(loop.var, loop.extent, loop.body, "split", loop.axis), nest,
                           depth + 2, state)
        lines.append(f"{pad}    const int ks_t = omp_get_thread_num();")
        for c in parts:
            lines.append(f"{pad}    for ({it} k_ = 0; k_ < {c.size}; k_++) "
                         f"ks_p_{c.name}[ks_t][k_] = {c.name}[k_];" if c.size
                         else f"{pad}    ks_p_{c.name}[ks_t] = {c.name};")
        lines += [f"{pad}  }}", f"{pad}  for (int ks_t = 0; ks_t < ks_nt; ks_t++) {{"]
        lines += self.merge(tuple(parts), lambda name, k: f"ks_p_{name}[ks_t]{k}", f"{pad}    ")
        return [*lines, f"{pad}  }}", f"{pad}}}"]

    def stream_loop(self, loop: Loop, nest: KernelNest, depth: int,
                    state: dict[str, bool]) -> list[str]:
        """A loop whose store streams (knob `nt`, codegen/stream.py): head, lines stored
        non-temporally, tail, fence."""
        w = streamed_write(loop)
        assert w is not None
        self.need(STREAM_HELPERS)
        lets = [b for b in loop.body if b is not w]
        value = self.expr(w.expr)
        return c_stream_loop(
            loop, w,
            [line for b in lets for line in self.stmt(b, nest, depth + 2, state)],
            [line for b in lets for line in self.stmt(b, nest, depth + 3, state)],
            f"{'  ' * (depth + 2)}{w.buf}[{w.index.render()}] = {value};",
            f"{'  ' * (depth + 3)}ks_line[ks_l] = {value};", depth)

    def need(self, source: str) -> None:
        """Emit `source` (a vector typedef, a microkernel) once in this translation
        unit, after the prelude."""
        if not hasattr(self, "helpers"):
            self.helpers: dict[str, None] = {}
        self.helpers.setdefault(source, None)

    def ctype(self, buf: str) -> str:
        """The element type of a buffer: int for integer inputs, else float."""
        return "int" if buf in self.int_buffers else "float"

    def signature(self, nest: KernelNest) -> str:
        params = [f"const {'int' if b in self.int_buffers else 'float'}* {self.restrict} {b}"
                  for b in nest.params[:-1]]
        params.append(f"float* {self.restrict} {nest.params[-1]}")
        return f"{self.kernel_prefix} {nest.symbol}({', '.join(params)})"

    splits: Mapping[int, tuple[Combine, ...]] = MappingProxyType({})
    """The loops of the kernel being rendered that `split_loop` renders (by `id`)."""

    def kernel(self, nest: KernelNest) -> str:
        lines = [self.signature(nest) + " {"]
        state = {"parallel_done": False}
        self.splits = (checked_splits(nest.body) if type(self).kernel is CRenderer.kernel
                       and nest.knobs.get("omp", True) and nest.knobs.get("psum", True)
                       else {})
        for s in nest.body:
            lines += self.stmt(s, nest, 1, state)
        return "\n".join([*lines, "}"])

    def render(self, prog: LoweredProgram, nests: list[KernelNest]) -> str:
        """One translation unit: prelude, one function per kernel, and `ks_run(args)`
        that runs them in order on args = [inputs..., temps..., out]."""
        slots = {name: i for i, name in enumerate(buffer_order(prog))}
        self.int_buffers = int_buffers(prog)
        calls = [
            f"  if (ks_cancel) return;\n  ks_kernel{n.kernel}("
            f"{', '.join(f'({self.ctype(b)}*)args[{slots[b]}]' for b in n.params)});"
            for n in nests
        ]
        run = "void ks_run(void** args) {\n" + "\n".join(calls) + "\n}"
        flag = "volatile int ks_cancel = 0;  /* set by a watchdog: stop early, output undefined */"
        self.helpers = {}
        kernels = [self.kernel(n) for n in nests]
        return "\n\n".join([self.prelude.strip(), *self.helpers, flag, *kernels,
                            run]) + "\n"


def checked_splits(body: tuple[Stmt, ...]) -> dict[int, tuple[Combine, ...]]:
    """`parallel_sums` of a kernel body, less the loops whose online combine the
    interpreter's check refuses (`cuda_emulate.combine_ok`, as CUDA's lane split): a
    misread combine is never rendered, the loop runs on one thread."""
    decls: dict[str, Let | Array] = {}
    out = {}
    found = parallel_sums(body)
    for s in body:
        if isinstance(s, Let | Array):
            decls[s.name] = s
        combines = found.get(id(s))
        if combines is None:
            continue
        if any(c.kind == "online" for c in combines):
            assert isinstance(s, Loop)
            if not combine_ok(s, initial_state(decls, [c.name for c in combines]), combines):
                continue
        out[id(s)] = combines
    return out


def int_buffers(prog: LoweredProgram) -> frozenset[str]:
    """The program's integer (int32) input buffers: gather labels (issue 18 part 3b)."""
    return frozenset(b for b, info in prog.buffers.items() if info.dtype == "i32")


def gather_error(prog: LoweredProgram, flag: Any) -> GatherIndexError | None:
    """The error a run recorded in `ks_gather_error` (set, slot, flat position, value,
    bound), as `GatherIndexError` naming the input and its position; None when unset.
    Clears the flag."""
    if not flag[0]:
        return None
    slot, flat, value, bound = (int(flag[k]) for k in range(1, 5))
    for k in range(5):
        flag[k] = 0
    info = prog.buffers[list(prog.input_buffer.values())[slot]]
    pos = tuple(int(i) for i in np.unravel_index(flat, info.shape)) if info.shape else ()
    return GatherIndexError(info.user_name, pos, value, bound)


def buffer_order(prog: LoweredProgram) -> list[str]:
    """Argument order of every build: inputs, temporaries, then `out`."""
    roles = {"input": 0, "temp": 1, "output": 2}
    names = list(prog.buffers)
    return sorted(names, key=lambda b: (roles[prog.buffers[b].role], names.index(b)))


# -- compile + load -----------------------------------------------------------------


def compile_c(source: str, cache_dir: Path | str | None = None,
              isa_flags: Sequence[str] = ()) -> Path:
    """Compile `source` for the instruction set `isa_flags` (`c_flags`) to a shared
    library, cached by the hash of source and every flag."""
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir() / BUILD_FOLDER
    cache.mkdir(parents=True, exist_ok=True)
    flags = c_flags(isa_flags)
    digest = hashlib.sha256((source + " ".join(flags)).encode()).hexdigest()[:24]
    lib = cache / f"ks_{digest}.so"
    if lib.exists():
        return lib
    if shutil.which("gcc") is None:
        raise CodegenError("gcc not found: the C target needs gcc")
    src = cache / f"ks_{digest}.c"
    src.write_text(source)
    with tempfile.NamedTemporaryFile(dir=cache, suffix=".so", delete=False) as tmp:
        tmp_path = Path(tmp.name)
    proc = subprocess.run(["gcc", *flags, "-o", str(tmp_path), str(src), "-lm"],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        tmp_path.unlink(missing_ok=True)
        raise CodegenError(f"gcc failed on {src}:\n{proc.stderr[-4000:]}")
    os.replace(tmp_path, lib)
    return lib


@dataclass
class CExecutable:
    """A compiled program: `exe(inputs, out)` writes the output into `out` in place."""

    prog: LoweredProgram
    source: str
    library: Path

    def __post_init__(self) -> None:
        self._lib = ctypes.CDLL(str(self.library))
        self._fn = self._lib.ks_run
        self._fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self._fn.restype = None
        self._order = buffer_order(self.prog)
        self._temps = {
            b: np.empty(self.prog.buffers[b].shape, np.float32)
            for b in self._order if self.prog.buffers[b].role == "temp"
        }

        self._cancel = ctypes.c_int.in_dll(self._lib, "ks_cancel")
        self._gather = ((ctypes.c_long * 5).in_dll(self._lib, "ks_gather_error")
                        if "ks_gather_error" in self.source else None)
        # the last call's arrays and their pointer array: a call with the same arrays
        # (a timing loop) skips `ndarray.ctypes`, ~1.5 us per array (a 1x1x1 matmul
        # took 11 us a call, 5 of them building pointers). Held strongly, so that
        # their data cannot move (`ndarray.resize` refuses a referenced array).
        self._last: tuple[tuple[np.ndarray, ...], Any] | None = None

    def __call__(self, inputs: Mapping[str, np.ndarray], out: np.ndarray) -> None:
        arrays = check_args(self.prog, inputs, out)
        arrays.update(self._temps)
        order = tuple(arrays[b] for b in self._order)
        last = self._last
        if last is None or any(x is not y for x, y in zip(order, last[0], strict=True)):
            last = (order, (ctypes.c_void_p * len(order))(*(x.ctypes.data for x in order)))
            self._last = last
        self._cancel.value = 0
        self._fn(last[1])  # ctypes releases the GIL: another thread can call cancel()
        if self._gather is not None:  # a gather's label out of range (issue 18 part 3b)
            error = gather_error(self.prog, self._gather)
            if error is not None:
                raise error

    def cancel(self) -> None:
        """Ask a run in progress (in another thread) to stop soon; its output is undefined."""
        self._cancel.value = 1


def check_args(prog: LoweredProgram, inputs: Mapping[str, np.ndarray], out: np.ndarray
               ) -> dict[str, np.ndarray]:
    """Validate (and make contiguous float32) the inputs; check `out` exactly."""
    want = prog.buffers["out"].shape
    if out.dtype != np.float32 or out.shape != want or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float32 array of shape {want}, "
                         f"got {out.dtype} {out.shape}")
    arrays: dict[str, np.ndarray] = {"out": out}
    for b in prog.inputs:
        if b.user_name not in inputs:
            raise KeyError(f"no value for input {b.user_name!r}")
        arr = inputs[b.user_name]
        if b.dtype == "i32":  # gather labels (issue 18 part 3b)
            arr = int32_labels(b.user_name, arr)
        elif not (type(arr) is np.ndarray and arr.dtype == np.float32
                  and arr.flags.c_contiguous):
            arr = np.require(arr, np.float32, "C")
        if b.shape == () and arr.shape == (1,):  # np.ascontiguousarray makes 0-dim 1-dim
            arr = arr.reshape(())
        if arr.shape != b.shape:
            raise ValueError(f"input {b.user_name!r} has shape {arr.shape}, expected {b.shape}")
        arrays[b.name] = arr
    return arrays


def int32_labels(name: str, arr: Any) -> np.ndarray:
    """An integer input as a C-contiguous int32 array: integer values only (an integral
    float array is accepted), each within int32 (a wider one is never wrapped around)."""
    a = np.asarray(arr)
    if a.dtype == np.int32:
        return np.require(a, np.int32, "C")
    if a.dtype.kind not in "iub" and not (a.dtype.kind == "f" and np.all(np.isfinite(a))
                                          and np.all(a == np.floor(a))):
        raise ValueError(f"input {name!r} is an integer input (i32), got {a.dtype} values "
                         f"that are not all integers")
    if a.size and (a.min() < -(2 ** 31) or a.max() >= 2 ** 31):
        raise ValueError(f"input {name!r} is an integer input (i32): a value is outside "
                         f"int32")
    return np.require(a.astype(np.int32), np.int32, "C")


def build_c(prog: LoweredProgram, nests: list[KernelNest], cache_dir: Path | str | None = None,
            renderer: CRenderer | None = None, isa_flags: Sequence[str] = ()) -> CExecutable:
    source = (renderer or CRenderer()).render(prog, nests)
    return CExecutable(prog, source, compile_c(source, cache_dir, isa_flags))


__all__ = ["CFLAGS", "NATIVE_ISA_FLAGS", "CExecutable", "CRenderer", "buffer_order", "build_c",
           "c_flags", "compile_c"]
_ = Affine  # re-exported type used in annotations of renderers
