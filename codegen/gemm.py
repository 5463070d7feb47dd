"""The contraction path: a kernel whose value is a contraction of two buffer reads with an
elementwise epilogue lowers to a BLIS-structured blocked GEMM.

Recognised from the IR (`contraction_of`): the kernel holds exactly one reduction, a
`Dot k x y` or `Sum k (mul x y)` of two loads (inputs or stored buffers, possibly read
through `Split`), whose free axes are the kernel's output axes; everything else is
elementwise over the output axes (bias add, gelu, scaling, loads indexed by output
axes). Axes are classified: batch (in x and y), m (only in x), n (only in y), k (the
reduction). One m axis and one n axis are blocked by the GEMM; batch axes and any other
m/n axes become outer loops. x and y swap roles when the output's stride-1 axis is an m
axis, so that the microkernel's vectors always run along the output's contiguous axis.

The C rendering (`render_gemm`) is the five loops around a microkernel (BLIS):

    for jc in n by nc:
      for pc in k by kc:                    B block kc x nc -> nr-wide packed panels
        for ic in m by mc:                  A block mc x kc -> mr-tall packed panels
          for jr in nc by nr:
            for ir in mc by mr:
              microkernel mr x nr over kc   (codegen/simd.py)

OpenMP threads (knob `par`) each own a contiguous range of m (or n) rows and pack their
own panels: no barrier inside the GEMM. Packed panels are zero-padded past the edges, so
every microkernel call is a full tile; a partial tile (at sizes that are not multiples
of mr or nr) goes through a local tile buffer and a partial store. Partial sums between
kc blocks live in the output buffer; after the last kc block each element gets the
epilogue (compiled by the ordinary lowering, `_Builder.compile`) on its way out, while
the tile is in L1. A plain product with a stride-1 output is stored by the microkernel
itself.

Knobs (`gemm_space`): `gemm` (False: the generic loop-nest lowering), `mr`, `nr`, `vw`
(register tile and vector width; mr*(nr/vw) + nr/vw + 1 <= 32 vector registers, a
combination past the budget is clamped by `register_tile`), `kc`, `mc`, `nc` (cache
blocks; mc rounded up to a multiple of mr, nc of nr; a value >= the extent means one
block), `par` ("m" / "n": the GEMM's threads split its m / n range, "outer": OpenMP
over the first outer loop, "none").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kernelsat.codegen.loops import Affine, Gemm, Load, Loop, Ref, Stmt, Write
from kernelsat.codegen.lower import (
    CodegenError,
    Env,
    Kernel,
    KernelNest,
    _Builder,
    _dot_operands,
    _kernel_nodes,
    _Scope,
    register_schedule,
)
from kernelsat.codegen.simd import REGISTERS, microkernel, vector_typedef
from kernelsat.ir import Term, split_axes
from kernelsat.ops import BINARY, REDUCTIONS, UNARY, Op

if TYPE_CHECKING:
    from kernelsat.codegen.c import CRenderer

MR = (6, 1, 2, 4, 8, 12, 14)
NR = (64, 16, 32, 48)
VW = (16, 8, 4)
KC = (512, 64, 128, 256, 384)
MC = (192, 48, 96, 384)
NC = (1024, 512, 2048, 4096)
PAR = ("m", "n", "outer", "none")
MULTI_NR = (32, 16, 48, 64)
"""Candidate values, the default first (measured on the 2-core AVX-512 Xeon: see
bench/gemm_check.py and docs/codegen.md). MULTI_NR: `nr` of a multi-contraction (two
6x32 accumulator tiles fill the registers that one 6x64 tile does)."""

SERIAL_MACS = 1 << 22
"""Below this many multiply-adds a GEMM runs on one thread by default (about 40 us on one
core here): waking a second thread, and its own packing, cost more than they save, and on
a shared machine the wait for a busy core costs milliseconds (192x160x96 under load: 2 ms
threaded against 0.07 ms on one thread)."""


@dataclass(frozen=True)
class Contraction:
    """A kernel's contraction: `node` = sum over `k` of `a * b` (a, b loads), with the
    GEMM's m axis (`m`, in a only) and n axis (`n`, in b only); `outer`: the other
    output axes (batch axes, further m/n axes), outermost first. `more`: further
    contractions (node_i, x_i) over the same axes that share one operand with the first
    (a multi-contraction: the shared operand is packed once, one accumulator tile per
    contraction, the epilogue combines them): `shared` "a", node_i = a * x_i; "b",
    node_i = x_i * b."""

    node: Term
    a: Term
    b: Term
    k: str
    m: str
    n: str
    outer: tuple[str, ...]
    more: tuple[tuple[Term, Term], ...] = ()
    shared: str = "a"

    @property
    def count(self) -> int:
        """Contractions computed together."""
        return 1 + len(self.more)


def _load_base(t: Term) -> Term:
    while t.op is Op.SPLIT:
        t = t.args[0]
    return t


def contraction_of(kernel: Kernel) -> Contraction | None:
    """The kernel's contraction if it lowers to a GEMM (see the module docstring), else None.

    >>> from kernelsat.codegen.lower import lower
    >>> from kernelsat.ir import Dot, In, add, mul
    >>> a, b = In("A", (("i", 8), ("k", 4))), In("B", (("k", 4), ("j", 8)))
    >>> c = contraction_of(lower(add(Dot("k", a, b), In("c", (("j", 8),))), ("i", "j")).kernels[0])
    >>> (c.m, c.n, c.k, c.outer, c.count)
    ('i', 'j', 'k', (), 1)
    >>> b2 = In("B2", (("k", 4), ("j", 8)))
    >>> c = contraction_of(lower(mul(Dot("k", a, b), Dot("k", a, b2)), ("i", "j")).kernels[0])
    >>> (c.m, c.n, c.count)
    ('i', 'j', 2)
    """
    nodes = _kernel_nodes(kernel.term)
    reductions = [t for t in nodes if t.op in REDUCTIONS]
    if not reductions:
        return None
    pairs = [_dot_operands(r) for r in reductions]
    out_axes = set(kernel.term.shape)
    axis = reductions[0].axis
    if any(p is None for p in pairs) or any(set(r.shape) != out_axes or r.axis != axis
                                            for r in reductions):
        return None
    inside = {id(t) for r in reductions for t in _kernel_nodes(r)}
    for t in nodes:
        if t.op in REDUCTIONS or id(t) in inside or t.op in (Op.IN, Op.STORE, Op.CONST,
                                                             Op.SPLIT):
            continue
        if t.op not in UNARY and t.op not in BINARY:
            return None
    operands = [p for p in pairs if p is not None]
    if len(reductions) > 1:
        return _multi(kernel, reductions, operands)
    x, y = operands[0]
    xs, ys = set(x.shape) - {axis}, set(y.shape) - {axis}
    if not xs - ys or not ys - xs:
        return None  # a matrix-vector product or a row dot: memory bound, no GEMM
    last = kernel.out_axes[-1]
    if last in xs - ys:  # the vectors run along the output's stride-1 axis: swap roles
        x, y, xs, ys = y, x, ys, xs
    m, n = _mn(kernel, xs, ys)
    outer = tuple(a for a in kernel.out_axes if a not in (m, n))
    return Contraction(reductions[0], x, y, axis, m, n, outer)


def _mn(kernel: Kernel, xs: set[str], ys: set[str]) -> tuple[str, str]:
    """The blocked m axis (of x only) and n axis (of y only): the largest, n preferring
    the output's stride-1 axis."""
    pos, last = kernel.out_axes.index, kernel.out_axes[-1]
    ms = sorted(xs - ys, key=lambda a: (kernel.term.shape[a], pos(a)))
    ns = sorted(ys - xs, key=lambda a: (a == last, kernel.term.shape[a], pos(a)))
    return ms[-1], ns[-1]


def _multi(kernel: Kernel, reductions: list[Term], operands: list[tuple[Term, Term]]
           ) -> Contraction | None:
    """Several contractions over the same axis and output axes that share one operand
    (the same term in each, as GLU variants share X between Wg and Wu) as one
    multi-contraction. The other operands must all have the same axes. The vectors run
    along the output's stride-1 axis: where it is an axis of the other operands, they are
    B panels packed side by side (`shared` "a"); where it is the shared operand's, that
    is B and the others are A panels stacked (`shared` "b")."""
    axis = reductions[0].axis
    common = [t for t in operands[0] if all(t in p for p in operands)]
    if not common:
        return None
    one = common[0]
    others = [p[1] if p[0] == one else p[0] for p in operands]
    xs = set(one.shape) - {axis}
    ys = set(others[0].shape) - {axis}
    if any(set(o.shape) - {axis} != ys for o in others) or not xs - ys or not ys - xs:
        return None
    more = tuple(zip(reductions[1:], others[1:], strict=True))
    last = kernel.out_axes[-1]
    if last in xs - ys:  # the shared operand holds the stride-1 axis: it is B
        m, n = _mn(kernel, ys, xs)
        outer = tuple(x for x in kernel.out_axes if x not in (m, n))
        return Contraction(reductions[0], others[0], one, axis, m, n, outer, more, "b")
    m, n = _mn(kernel, xs, ys)
    outer = tuple(x for x in kernel.out_axes if x not in (m, n))
    return Contraction(reductions[0], one, others[0], axis, m, n, outer, more)


def _blocks(cands: tuple[int, ...], extent: int) -> tuple[int, ...]:
    """Block sizes below `extent` (default first when it is), then `extent` (one block)."""
    return tuple(dict.fromkeys([*(c for c in cands if c < extent), extent]))


def _fitting(cands: tuple[int, ...], extent: int) -> tuple[int, ...]:
    """Tile sizes <= extent; the default (first) replaced by the largest that fits."""
    fit = [c for c in cands if c <= extent] or [min(cands)]
    return tuple(dict.fromkeys([cands[0] if cands[0] <= extent else max(fit), *fit]))


def gemm_space(kernel: Kernel, c: Contraction) -> dict[str, tuple[Any, ...]]:
    """The GEMM knobs of a contraction kernel, legal values from its sizes, default first."""
    shape = kernel.term.shape
    m, n, k = shape[c.m], shape[c.n], kernel.term.all_sizes[c.k]
    mrs = _fitting(MR, m)
    nrs = _fitting(MULTI_NR if c.shared == "a" and c.count > 1 else NR, -(-n // 16) * 16)
    outer = math.prod(shape[a] for a in c.outer)
    inner = ("m", "n") if m >= n else ("n", "m")
    pars: tuple[str, ...] = ("outer", *inner, "none") if outer >= 4 else \
        (*inner, "outer", "none") if outer > 1 else (*inner, "none")
    if m * n * k * outer * c.count < SERIAL_MACS:
        pars = ("none", *pars[:-1])
    return {"gemm": (True, False), "mr": mrs, "nr": nrs, "vw": VW, "kc": _blocks(KC, k),
            "mc": _blocks(MC, m), "nc": _blocks(NC, n), "par": pars}


def register_tile(mr: int, nr: int, vw: int, count: int = 1, shared: str = "a"
                  ) -> tuple[int, int]:
    """(mr, nr) within the register budget: the microkernel's nr/vw vectors of B, one
    broadcast of A and mr*nr/vw accumulators in at most REGISTERS vector registers (mr
    shrinks first). A multi-contraction of `count` runs one microkernel of mr x count*nr
    (`shared` "a": B panels side by side) or count*mr x nr ("b": A panels stacked)."""
    if shared == "a":
        nv = max(1, min(nr // vw, (REGISTERS - 1) // (2 * count)))
        return max(1, min(mr, (REGISTERS - 1 - count * nv) // (count * nv))), nv * vw
    nv = max(1, min(nr // vw, (REGISTERS - 1) // (count + 1)))
    return max(1, min(mr, (REGISTERS - 1 - nv) // (count * nv))), nv * vw


def gemm_nest(kernel: Kernel, c: Contraction, knobs: dict[str, Any]) -> KernelNest:
    """The kernel's loop nest under `knobs`: outer loops over `c.outer`, then one `Gemm`
    whose epilogue is the rest of the kernel's term, compiled by `_Builder`."""
    b = _Builder(kernel, knobs)
    shape = kernel.term.shape
    env: Env = {}
    loops: list[tuple[str, int, str, str]] = []
    par = knobs["par"] if knobs.get("omp", True) else "none"
    for a in c.outer:
        v = b.loop_var(shape[a])
        kind = "parallel" if par == "outer" and not loops else "serial"
        loops.append((v, shape[a], kind, a))
        env[a] = Affine.var(v)
    mv, nv, kv = b.loop_var(shape[c.m]), b.loop_var(shape[c.n]), b.loop_var(0)
    env[c.m], env[c.n] = Affine.var(mv), Affine.var(nv)
    a_load = _load(b, c.a, {**env, c.k: Affine.var(kv)})
    b_load = _load(b, c.b, {**env, c.k: Affine.var(kv)})
    acc = b.fresh("acc")
    scope = _Scope(frozenset(v for v, *_ in loops) | {mv, nv}, [])
    scope.memo[(c.node, tuple(env[x] for x in c.node.shape))] = Ref(acc)
    more: list[tuple[Load, str]] = []
    for node, operand in c.more:
        name = b.fresh("acc")
        more.append((_load(b, operand, {**env, c.k: Affine.var(kv)}), name))
        scope.memo[(node, tuple(env[x] for x in node.shape))] = Ref(name)
    value = b.compile(kernel.term, env, [scope])
    out = kernel.program.buffers[kernel.out]
    write = Write(kernel.out, b.index_of(list(out.axes), list(out.shape), env), value)
    mr, nr = register_tile(int(knobs["mr"]), int(knobs["nr"]), int(knobs["vw"]), c.count,
                           c.shared)
    k = kernel.term.all_sizes[c.k]
    gemm = Gemm(shape[c.m], shape[c.n], k, mv, nv, kv, a_load, b_load, acc,
                tuple(scope.stmts), write, mr=mr, nr=nr, kc=int(knobs["kc"]),
                mc=int(knobs["mc"]), nc=int(knobs["nc"]), vw=int(knobs["vw"]),
                par=par if par in ("m", "n") else "", axes=(c.m, c.n, c.k), more=tuple(more),
                shared=c.shared)
    body: tuple[Stmt, ...] = (gemm,)
    for v, extent, kind, axis in reversed(loops):
        body = (Loop(v, extent, body, kind, axis),)
    names = list(kernel.program.buffers)
    params = (*sorted(b.reads, key=names.index), kernel.out)
    return KernelNest(kernel.index, dict(knobs), body, params)


def _load(b: _Builder, t: Term, env: Env) -> Load:
    """The element of load `t` (an `In` or `Store`, through `Split`s) at `env`."""
    while t.op is Op.SPLIT:
        a, f = t.axis, int(t.attrs[1])  # type: ignore[arg-type]
        o, i = split_axes(a, f)
        env = {**{x: v for x, v in env.items() if x not in (o, i)}, a: env[o].scale(f) + env[i]}
        t = t.args[0]
    expr = b.leaf_or_op(t, env, [])
    if not isinstance(expr, Load):  # pragma: no cover - _dot_operands admits loads only
        raise CodegenError(f"contraction operand is not a buffer read: {t!r}")
    return expr


# -- C rendering -----------------------------------------------------------------------


def _split(idx: Affine, *vars_: str) -> tuple[list[int], Affine]:
    """(coefficients of `vars_`, the rest of the index)."""
    coefs = dict(idx.terms)
    rest = Affine(tuple((v, x) for v, x in idx.terms if v not in vars_), idx.const)
    return [coefs.get(v, 0) for v in vars_], rest


def _pack(dst: str, src: str, rows: str, depth: str, s_row: int, s_depth: int,
          width: int, stride: int = 0) -> list[str]:
    """Pack `rows` (<= width) rows of `depth` elements, element (r, p) at
    src[r*s_row + p*s_depth], into dst[p*stride + r] (stride: `width` by default; a
    multi-contraction interleaves its B panels), zero rows past `rows`. The loop order
    follows the source's stride-1 direction."""
    ld = stride or width
    if s_depth == 1 and s_row != 1:
        body = [f"for (long g_r = 0; g_r < {rows}; g_r++)",
                f"  for (long g_p = 0; g_p < {depth}; g_p++)",
                f"    {dst}[g_p*{ld} + g_r] = {src}[g_r*{s_row} + g_p];"]
    else:
        body = [f"for (long g_p = 0; g_p < {depth}; g_p++)",
                f"  for (long g_r = 0; g_r < {rows}; g_r++)",
                f"    {dst}[g_p*{ld} + g_r] = {src}[g_r*{s_row} + g_p*{s_depth}];"]
    pad = [f"if ({rows} < {width})",
           f"  for (long g_p = 0; g_p < {depth}; g_p++)",
           f"    for (long g_r = {rows}; g_r < {width}; g_r++) {dst}[g_p*{ld} + g_r] = 0.0f;"]
    return body + pad


def _thread_range(g: Gemm) -> list[str]:
    """C that narrows [g_m0, g_m1) x [g_n0, g_n1) to thread g_t's share of `g.par`'s axis
    (contiguous, a multiple of the tile): threads never share a packed panel, so the
    GEMM has no barrier but the region's end (each thread packs its own panels of
    the other operand: extra traffic k*n (or m*k) per thread, small against m*n*k)."""
    if g.par not in ("m", "n"):
        return []
    lo, hi, ext, tile = ("g_m0", "g_m1", g.m, g.mr) if g.par == "m" else \
        ("g_n0", "g_n1", g.n, g.nr)
    return [f"long g_per = (({ext} + g_nt - 1) / g_nt + {tile - 1}) / {tile} * {tile};",
            f"{lo} = g_t * g_per < {ext} ? g_t * g_per : {ext};",
            f"{hi} = {lo} + g_per < {ext} ? {lo} + g_per : {ext};"]


def _tile_loop(g: Gemm, body: list[str]) -> list[str]:
    """`body` at every element (g_r, g_j) of the g_mrb x g_nrb tile, with the Gemm's
    index variables bound (a branch-free inner loop that gcc vectorizes)."""
    pad = " " * 16
    return [f"{pad}for (long g_r = 0; g_r < g_mrb; g_r++) {{",
            f"{pad}  long {g.mvar} = g_ic + g_ir + g_r;",
            f"{pad}  for (long g_j = 0; g_j < g_nrb; g_j++) {{",
            f"{pad}    long {g.nvar} = g_jc + g_jr + g_j;",
            *(f"{pad}    {line}" for line in body),
            f"{pad}  }}",
            f"{pad}}}"]


def render_gemm(r: CRenderer, g: Gemm, nest: KernelNest, depth: int) -> list[str]:
    """C for one `Gemm` (see the module docstring); `r` renders the epilogue. A
    multi-contraction of `count` packs its B operands side by side (`shared` "a": a
    count*nr-wide panel) or its A operands stacked ("b": count*mr rows), so that one
    ordinary microkernel computes every accumulator tile from one pass over the shared
    panel; the tiles meet in the epilogue."""
    for w in (g.vw,):
        r.need(vector_typedef(w)[1])
    count = 1 + len(g.more)
    side_a = count > 1 and g.shared == "b"  # several A operands (stacked)
    side_b = count > 1 and g.shared == "a"  # several B operands (side by side)
    mr, nr = g.mr, g.nr
    ukr, ukr_src = microkernel(mr * count if side_a else mr, nr * count if side_b else nr, g.vw)
    r.need("#include <stdlib.h>\n#include <omp.h>")
    r.need(ukr_src)
    a_ops = [g.a, *(x for x, _ in g.more)] if side_a else [g.a]
    b_ops = [g.b, *(x for x, _ in g.more)] if side_b else [g.b]
    a_split = [_split(x.index, g.mvar, g.kvar) for x in a_ops]
    b_split = [_split(x.index, g.kvar, g.nvar) for x in b_ops]
    (som, son), _ = _split(g.write.index, g.mvar, g.nvar)
    kcb = min(g.kc, g.k)
    mcb = -(-min(g.mc, g.m) // mr) * mr
    nc_step = -(-g.nc // nr) * nr
    ncb = -(-min(nc_step, g.n) // nr) * nr
    plain = count == 1 and not g.epilogue and g.write.expr == Ref(g.acc)
    mv, nv = g.mvar, g.nvar  # the epilogue's names of the output position
    epi = [line for s in g.epilogue for line in r.stmt(s, nest, 0, {"parallel_done": True})]
    write = r.stmt(g.write, nest, 0, {"parallel_done": True})
    at = f"{g.write.buf}[{g.write.index.render()}]"
    ct = f"g_ct[g_r*{g.nr} + g_j]"
    cancel = ["if (ks_cancel) break;"] if r.cancellable else []
    # several contractions over more than one kc block: partial sums in a scratch array
    # (count tiles of the thread's rows x the nc block), not in the output
    scratch = count > 1 and kcb < g.k
    ca, cb = len(a_ops), len(b_ops)

    def ptr(name: str, ops: list[Load], split: list[tuple[list[int], Affine]]) -> list[str]:
        return [f"  const float* restrict {name}{t or ''} = {x.buf} + {base.render()};"
                for t, (x, (_, base)) in enumerate(zip(ops, split, strict=True))]

    def packs(name: str, split: list[tuple[list[int], Affine]], origin: str, width: int,
              cnt: int, row: bool) -> list[str]:
        """Pack every operand's panel into g_dst (side by side / stacked: the same)."""
        out: list[str] = []
        for t, ((s0, s1), _) in enumerate(split):
            s_row, s_depth = (s0, s1) if row else (s1, s0)
            src = f"{name}{t or ''} + {origin.format(s_row=s_row)} + g_pc*{s_depth}"
            if cnt == 1:
                out += [f"const float* restrict g_src = {src};",
                        *_pack("g_dst", "g_src", "g_n", "g_kc", s_row, s_depth, width)]
            else:
                out += ["{", f"  const float* restrict g_src = {src};",
                        *("  " + x for x in _pack(f"(g_dst + {t * width})", "g_src", "g_n",
                                                  "g_kc", s_row, s_depth, width, cnt * width)),
                        "}"]
        return out

    scratch_alloc = ([f"    long g_cs = (g_m1 - g_m0 + {mr}) * {count * ncb};",
                      "    float* restrict g_cc = aligned_alloc(64, (g_cs * 4 + 63) / 64 * 64);"]
                     if scratch else [])
    ok = "g_ap && g_bp" + (" && g_cc" if scratch else "")
    c: list[str] = [
        "{",
        *ptr("g_A", a_ops, a_split),
        *ptr("g_B", b_ops, b_split),
        "  #pragma omp parallel" + ("" if g.par else " if(0)"),
        "  {",
        "    long g_nt = omp_get_num_threads(), g_t = omp_get_thread_num();",
        f"    long g_m0 = 0, g_m1 = {g.m}, g_n0 = 0, g_n1 = {g.n};",
        *(f"    {line}" for line in _thread_range(g)),
        f"    float* restrict g_ap = aligned_alloc(64, {-(-kcb * mcb * ca * 4 // 64) * 64});",
        f"    float* restrict g_bp = aligned_alloc(64, {-(-kcb * ncb * cb * 4 // 64) * 64});",
        *scratch_alloc,
        f"    float g_ct[{mr * nr * count}] __attribute__((aligned(64)));",
        f"    if ({ok})",
        f"    for (long g_jc = g_n0; g_jc < g_n1; g_jc += {nc_step}) {{",
        f"      long g_ncb = g_n1 - g_jc < {nc_step} ? g_n1 - g_jc : {nc_step};",
        f"      for (long g_pc = 0; g_pc < {g.k}; g_pc += {kcb}) {{",
        *(f"        {line}" for line in cancel),
        f"        long g_kc = {g.k} - g_pc < {kcb} ? {g.k} - g_pc : {kcb};",
        f"        int g_first = g_pc == 0, g_last = g_pc + {kcb} >= {g.k};",
        f"        for (long g_jp = 0; g_jp < (g_ncb + {nr - 1}) / {nr}; g_jp++) {{",
        f"          long g_n = g_ncb - g_jp*{nr} < {nr} ? g_ncb - g_jp*{nr} : {nr};",
        f"          float* restrict g_dst = g_bp + g_jp*{nr * cb}*g_kc;",
        *("          " + x for x in packs("g_B", b_split, "(g_jc + g_jp*" + str(nr) + ")*{s_row}",
                                         nr, cb, row=False)),
        "        }",
        f"        for (long g_ic = g_m0; g_ic < g_m1; g_ic += {mcb}) {{",
        *(f"          {line}" for line in cancel),
        f"          long g_mcb = g_m1 - g_ic < {mcb} ? g_m1 - g_ic : {mcb};",
        f"          for (long g_ip = 0; g_ip < (g_mcb + {mr - 1}) / {mr}; g_ip++) {{",
        f"            long g_n = g_mcb - g_ip*{mr} < {mr} ? g_mcb - g_ip*{mr} : {mr};",
        f"            float* restrict g_dst = g_ap + g_ip*{mr * ca}*g_kc;",
        *("            " + x for x in packs("g_A", a_split, "(g_ic + g_ip*" + str(mr) + ")*{s_row}",
                                           mr, ca, row=True)),
        "          }",
        f"          for (long g_jr = 0; g_jr < g_ncb; g_jr += {nr}) {{",
        f"            long g_nrb = g_ncb - g_jr < {nr} ? g_ncb - g_jr : {nr};",
        "            const float* g_b = g_bp + g_jr*" + (f"{cb}*" if cb > 1 else "") + "g_kc;",
        f"            for (long g_ir = 0; g_ir < g_mcb; g_ir += {mr}) {{",
        f"              long g_mrb = g_mcb - g_ir < {mr} ? g_mcb - g_ir : {mr};",
        "              const float* g_a = g_ap + g_ir*" + (f"{ca}*" if ca > 1 else "") + "g_kc;",
    ]
    full = f"g_mrb == {mr} && g_nrb == {nr}"
    if count > 1:
        # tile t's element (r, j) in the microkernel's (count*mr) x nr or mr x (count*nr)
        # output: row t*mr + r or column t*nr + j
        accs = [g.acc, *(acc for _, acc in g.more)]

        def element(t: int, ld: str | int) -> str:
            row = f"({t * mr} + g_r)" if side_a else "g_r"
            return f"{row}*{ld} + {t * nr if side_b else 0} + g_j"

        if scratch:  # rows of count*ncb floats per mr-row group of the thread's rows
            ld = ncb if side_a else count * ncb
            base = (f"g_cc + (g_ic + g_ir - g_m0)*{count * ncb} + g_jr"
                    + (f"*{count}" if side_b else ""))
            reads = [f"float {acc} = g_tile[{element(t, ld)}];" for t, acc in enumerate(accs)]
            c += [f"              float* g_tile = {base};",
                  f"              {ukr}(g_kc, g_a, g_b, g_tile, {ld}, !g_first);",
                  "              if (g_last) {",
                  *_tile_loop(g, [*reads, *epi, *write]),
                  "              }"]
        else:  # one kc block: the tiles in g_ct, combined on the way out
            ld = nr * (count if side_b else 1)
            reads = [f"float {acc} = g_ct[{element(t, ld)}];" for t, acc in enumerate(accs)]
            c += [f"              {ukr}(g_kc, g_a, g_b, g_ct, {ld}, 0);",
                  "              {",
                  *_tile_loop(g, [*reads, *epi, *write]),
                  "              }"]
    else:
        if son == 1:  # the output's rows are contiguous: the microkernel stores full tiles
            cond = full if plain else f"{full} && !g_last"
            c += [
                f"              if ({cond}) {{",
                f"                long {mv} = g_ic + g_ir, {nv} = g_jc + g_jr;",
                f"                {ukr}(g_kc, g_a, g_b, &{at}, {som}, !g_first);",
                "                continue;",
                "              }",
            ]
        c += [
            f"              {ukr}(g_kc, g_a, g_b, g_ct, {nr}, 0);",
            "              if (g_last && g_first) {",
            *_tile_loop(g, [f"float {g.acc} = {ct};", *epi, *write]),
            "              } else if (g_last) {",
            *_tile_loop(g, [f"float {g.acc} = {ct} + {at};", *epi, *write]),
            "              } else if (g_first) {",
            *_tile_loop(g, [f"{at} = {ct};"]),
            "              } else {",
            *_tile_loop(g, [f"{at} += {ct};"]),
            "              }",
        ]
    c += [
        "            }",
        "          }",
        "        }",
        "      }",
        "    }",
        "    else  /* out of memory for the panels: NaN, never stale data */",
        f"      for (long {mv} = g_m0; {mv} < g_m1; {mv}++)",
        f"        for (long {nv} = g_n0; {nv} < g_n1; {nv}++) {at} = __builtin_nanf(\"\");",
        "    free(g_ap);",
        "    free(g_bp);",
        *(["    free(g_cc);"] if scratch else []),
        "  }",
        "}",
    ]
    pad = "  " * depth
    return [pad + line for line in c]


__all__ = ["Contraction", "contraction_of", "gemm_nest", "gemm_space", "register_tile",
           "render_gemm"]


@dataclass(frozen=True)
class GemmSchedule:
    """The blocked GEMM as a `lower.Schedule`: its knobs where the kernel is a
    contraction (`contraction_of`), its nest where knob `gemm` is on."""

    rank: int = 10

    def knobs(self, kernel: Kernel, space: Mapping[str, tuple[Any, ...]]
              ) -> dict[str, tuple[Any, ...]]:
        c = contraction_of(kernel)
        return gemm_space(kernel, c) if c is not None else {}

    def nest(self, kernel: Kernel, knobs: Mapping[str, Any]) -> KernelNest | None:
        if not knobs.get("gemm"):
            return None
        c = contraction_of(kernel)
        assert c is not None  # the knob exists only for contractions
        return gemm_nest(kernel, c, dict(knobs))


register_schedule(GemmSchedule())
