"""The fused attention kernel: a register-blocked, single-pass online-softmax form.

`find_flash` recognises, from the IR's structure alone, a kernel whose value is

    out[b.., i, e] = SoftmaxAvg_n( f(C[b.., i, n], ...), V[b.., n, e] )
    C[b.., i, n]   = sum_d X[b.., i, d] * Y[b.., n, d]       (`Dot`, or `Sum` of a `mul`)

where `f` is any elementwise function of the contraction `C`, constants and buffer reads
indexed by (b.., i, n) (a scale, a bias, a mask), `X`, `Y` and `V` are buffer reads
(through `Split`s, grouped input dims: any affine layout), and the key axis `n` appears
either whole or split as the e-graph's two-level form
`SoftmaxAvg_{n/o}(LSE_{n/i} s, SoftmaxAvg_{n/i}(s, v))` (which is the same value).

`FlashAttention` is one loop-IR statement holding that kernel and its schedule. The C
renderer emits it natively (`c_lines`, `c_helpers`): per task (batch position, block
of `rows` query rows) the rows sit in the vector lanes, so

1. Q's block is packed transposed (`qt[d][rows]`, zero rows past the end);
2. per block of `keys` keys, `S^T = K_blk . Q_blk^T` comes from a `kr x rows`
   register-tile microkernel over packed K panels (`kp[d][kr]`, `kr` keys each);
3. the score epilogue `f` runs on the tile, fused with the row max (a vertical vector
   max: one lane per row), then the running state is rescaled once per block and the
   tile becomes `exp(s - m)` in place (one exp per score) with the row sums;
4. `O^T += V_blk^T . P^T` through an `er x rows` microkernel over packed V panels,
   the tile itself being P^T's packed panel;
5. at the end `out = O / l`.

Packing of K and V (`pack`): "head" packs every batch position once, in its own
parallel loop, shared by all query blocks; "block" packs each key block inside the task.
Every other renderer uses `expand()`: the same computation as plain loops (one online
update per key, as `lower` emits for an unfused `SoftmaxAvg`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kernelsat.codegen.loops import (
    Affine,
    Array,
    Assign,
    Call,
    Expr,
    IndexValue,
    Let,
    Lit,
    Load,
    Loop,
    Ref,
    Stmt,
    Write,
    expr_text,
)
from kernelsat.codegen.lower import CodegenError, Kernel, KernelNest, register_schedule
from kernelsat.codegen.simd import REGISTERS, microkernel, vector_typedef
from kernelsat.ir import Term, idx_axis, in_groups, split_axes
from kernelsat.ops import BINARY, TERNARY, UNARY, Op

NEG_BIG = -3.4028234663852886e38
"""-FLT_MAX: the running-max initializer (exp(x - m) stays 0, never NaN)."""

HEAD_PACK_CAP = 1 << 30
"""Largest up-front packed K and V (bytes) that `pack="head"` may allocate."""

PACK_ABOVE = 512 << 10
"""Default `pack`: "head" when one batch position's K and V exceed this many bytes (half
an L2 of the 2-core Xeon: read in place, K's rows are `kr` strided streams that stop
hitting L2) or are not dense rows (attention_packed's rows are H*D apart), else "none".
One core, CPU time, B=1 H=8 D=64: N=1024 (512 KiB) none 19.1 vs head 21.0 ms; N=2048
head 73-75 vs 78 ms; N=4096 head 287 vs 355 ms; attention_packed N=1024 head 21.3 vs
none 27.6 ms."""

WIDTHS = (16, 8, 4)
"""Vector widths (floats) the kernel can be written for; the search drops those above
the target's SIMD width."""


class NoFlash(Exception):
    """The kernel does not have the fused attention structure (internal to `find_flash`)."""


@dataclass(frozen=True, slots=True)
class Strided:
    """A 2-D view of a buffer per batch position: element (p, q) at
    `base + p*outer + q*inner`, `base` affine in the batch loop variables."""

    buf: str
    base: Affine
    outer: int
    inner: int


@dataclass(frozen=True, slots=True)
class FlashSchedule:
    """vw: vector width (floats); rowvec: query rows per block in vectors (rows =
    rowvec*vw, the lanes of every tile); kr / er: keys / value columns per register
    tile of the two microkernels; keys: keys per block (a multiple of kr); pack:
    "head" or "block"; omp: OpenMP threads over (batch, query block)."""

    vw: int
    rowvec: int
    kr: int
    er: int
    keys: int
    pack: str
    omp: bool

    @property
    def rows(self) -> int:
        return self.vw * self.rowvec


@dataclass(frozen=True, slots=True)
class FlashAttention:
    """out[batch, i, e] = post(avg) with avg = sum_n softmax_n(score) * v[batch, n, e],
    score = `score` (an expression of `Ref(dot)` = sum_d q[batch, i, d] * k[batch, n, d],
    reading buffers at the loop variables `batch`, `row` and `key`) and `post` an
    expression of `Ref(avg)` reading buffers at `batch`, `row` and `col`."""

    batch: tuple[tuple[str, int], ...]  # (loop variable, extent), outer first
    m: int  # query rows
    n: int  # keys
    d: int  # contraction length
    e: int  # value columns (1 when the value has no column axis)
    q: Strided  # (i, d)
    k: Strided  # (n, d)
    v: Strided  # (n, e)
    out: Strided  # (i, e)
    row: str
    key: str
    dot: str
    score: Expr
    col: str  # the value-column loop variable (of `post`'s reads)
    avg: str
    post: Expr  # the output: an expression of Ref(avg) = the softmax average
    schedule: FlashSchedule

    # -- shape of the schedule -------------------------------------------------------
    @property
    def heads(self) -> int:
        return math.prod(x for _, x in self.batch)

    @property
    def e_pad(self) -> int:
        return -(-self.e // self.schedule.er) * self.schedule.er

    @property
    def k_panels(self) -> int:
        return -(-self.n // self.schedule.kr)

    # -- printing ----------------------------------------------------------------------
    def lines(self, depth: int) -> list[str]:
        pad = "  " * depth
        s = self.schedule
        batch = ", ".join(f"{v}:{x}" for v, x in self.batch)
        return [
            f"{pad}flash_attention [{batch}] rows {self.row}:{self.m} keys {self.key}:{self.n} "
            f"d:{self.d} e:{self.e}  (vw {s.vw}, rows/block {s.rows}, keys/block {s.keys}, "
            f"kr {s.kr}, er {s.er}, pack {s.pack})",
            f"{pad}  {self.dot} = dot({_view(self.q, self.row)}, {_view(self.k, self.key)})",
            f"{pad}  score = {expr_text(self.score)}",
            f"{pad}  {self.avg} = softmax_avg({self.key}: score, {_view(self.v, self.key)})",
            f"{pad}  {_view(self.out, self.row)} = {expr_text(self.post)}",
        ]

    def exprs(self) -> list[Expr]:
        return [self.score, self.post]

    # -- plain loops -------------------------------------------------------------------
    def expand(self) -> tuple[Stmt, ...]:
        """The same computation as plain loops: per (batch, row) one online update per
        key (running max, rescaled sum and accumulator row), then out = acc / sum."""
        names = iter(f"fx{k}" for k in range(1 << 30))

        def fresh() -> str:
            return next(names)

        m, ls, acc = fresh(), fresh(), fresh()
        dv, ev = fresh(), self.col
        row, key = Affine.var(self.row), Affine.var(self.key)
        q_at = self.q.base + row.scale(self.q.outer) + Affine.var(dv).scale(self.q.inner)
        k_at = self.k.base + key.scale(self.k.outer) + Affine.var(dv).scale(self.k.inner)
        v_at = self.v.base + key.scale(self.v.outer) + Affine.var(ev).scale(self.v.inner)
        o_at = self.out.base + row.scale(self.out.outer) + Affine.var(ev).scale(self.out.inner)
        t, w, c, p = fresh(), fresh(), fresh(), fresh()
        sc = fresh()
        zero, one = Lit(0.0), Lit(1.0)
        per_key: tuple[Stmt, ...] = (
            Let(self.dot, Lit(0.0), mutable=True),
            Loop(dv, self.d, (Assign(Ref(self.dot), Call("add", (Ref(self.dot), Call(
                "mul", (Load(self.q.buf, q_at), Load(self.k.buf, k_at)))))),), "reduce"),
            Let(sc, self.score),
            Let(t, Call("sub", (Ref(sc), Ref(m)))),
            Let(w, Call("exp", (Call("neg", (Call("abs", (Ref(t),)),)),))),
            Let(c, Call("select_gt", (Ref(t), zero, Ref(w), one))),
            Let(p, Call("select_gt", (Ref(t), zero, one, Ref(w)))),
            Assign(Ref(ls), Call("add", (Call("mul", (Ref(ls), Ref(c))), Ref(p)))),
            Assign(Ref(m), Call("select_gt", (Ref(t), zero, Ref(sc), Ref(m)))),
            Loop(ev, self.e, (Assign(Ref(acc, Affine.var(ev)), Call("add", (
                Call("mul", (Ref(acc, Affine.var(ev)), Ref(c))),
                Call("mul", (Ref(p), Load(self.v.buf, v_at)))))),), "vector"),
        )
        body: tuple[Stmt, ...] = (
            Let(m, Lit(NEG_BIG), mutable=True),
            Let(ls, Lit(0.0), mutable=True),
            Array(acc, self.e, 0.0),
            Loop(self.key, self.n, per_key, "reduce"),
            Loop(ev, self.e, (
                Let(self.avg, Call("select_gt", (Ref(ls), zero, Call(
                    "div", (Ref(acc, Affine.var(ev)), Ref(ls))), zero))),
                Write(self.out.buf, o_at, self.post)), "tile"),
        )
        nest: tuple[Stmt, ...] = (Loop(self.row, self.m, body, "parallel"),)
        for var, extent in reversed(self.batch):
            nest = (Loop(var, extent, nest, "parallel"),)
        return nest

    # -- C -----------------------------------------------------------------------------
    def microkernels(self) -> tuple[Tile, Tile | None, Tile, Tile | None]:
        """(score tile, its remainder, P.V tile, its remainder) microkernels as
        (keys or columns, A's row stride, A's depth stride); a remainder is None where
        the panels cover the extent (packed panels are zero-padded)."""
        s = self.schedule
        if s.pack != "none":
            return (s.kr, 1, s.kr), None, (s.er, 1, s.er), None
        k, v = self.k, self.v
        krem, erem = self.n % s.kr, self.e % s.er
        return ((s.kr, k.outer, k.inner), (krem, k.outer, k.inner) if krem else None,
                (s.er, v.inner, v.outer), (erem, v.inner, v.outer) if erem else None)

    def c_helpers(self) -> list[str]:
        """File-scope C this statement needs (each emitted once per translation unit)."""
        s = self.schedule
        kernels = [x for x in self.microkernels() if x is not None]
        vexp = [VEXP_NONPOSITIVE] if s.vw == 16 else []
        return ["#include <stdlib.h>", *vexp, vector_typedef(s.vw)[1],
                *dict.fromkeys(microkernel(mr, s.rows, s.vw, rs, ps)[1]
                               for mr, rs, ps in kernels)]

    def weights_pass(self) -> list[str]:
        """st = exp(st - m) in place, l += the row sums: with AVX-512 (and 16-lane rows)
        explicit vectors whose 2^k is one `vscalefps` (8% faster than the
        auto-vectorized scalar exp at N=1024, one core); else the scalar loop."""
        rows, nv = self.schedule.rows, self.schedule.rowvec
        scalar = [
            "for (long fl_j = 0; fl_j < fl_nv; fl_j++) {",
            f"  float* restrict fl_sr = fl_st + fl_j * {rows};",
            f"  for (long fl_r = 0; fl_r < {rows}; fl_r++) {{",
            "    float fl_p = ks_exp_nonpos(fl_sr[fl_r] - fl_m[fl_r]);",
            "    fl_sr[fl_r] = fl_p;",
            "    fl_l[fl_r] += fl_p;",
            "  }",
            "}",
        ]
        if self.schedule.vw != 16:
            return scalar
        vs = range(nv)
        return [
            "#if defined(__AVX512F__)",
            "{",
            *(f"  __m512 fl_m{v} = _mm512_loadu_ps(fl_m + {16 * v}), "
              f"fl_s{v} = _mm512_setzero_ps();" for v in vs),
            "  for (long fl_j = 0; fl_j < fl_nv; fl_j++) {",
            f"    float* restrict fl_sr = fl_st + fl_j * {rows};",
            *(f"    {{ __m512 fl_y = ks_vexp_nonpos(_mm512_sub_ps("
              f"_mm512_loadu_ps(fl_sr + {16 * v}), fl_m{v})); "
              f"_mm512_storeu_ps(fl_sr + {16 * v}, fl_y); "
              f"fl_s{v} = _mm512_add_ps(fl_s{v}, fl_y); }}" for v in vs),
            "  }",
            *(f"  _mm512_storeu_ps(fl_l + {16 * v}, "
              f"_mm512_add_ps(_mm512_loadu_ps(fl_l + {16 * v}), fl_s{v}));" for v in vs),
            "}",
            "#else",
            *scalar,
            "#endif",
        ]

    def c_lines(self, expr: Callable[[Expr], str], lit: Callable[[float], str],
                cancel: bool, depth: int) -> list[str]:
        """The kernel as C statements (inside the kernel function; needs `c_helpers`);
        `expr` and `lit` render the score expression and literals."""
        s = self.schedule
        rows, kr, er, nb, vw = s.rows, s.kr, s.er, s.keys, s.vw
        d, e, ep, n, m = self.d, self.e, self.e_pad, self.n, self.m
        heads = self.heads
        qblocks = -(-m // rows)
        q, k, v, o = self.q, self.k, self.v, self.out
        kph = self.k_panels * kr * d  # packed K floats per head
        vph = n * ep  # packed V floats per head
        mode = s.pack
        omp = "#pragma omp" if s.omp else "// (no OpenMP)"
        (ks, ks_rem, vs, vs_rem) = (
            None if x is None else microkernel(x[0], rows, vw, x[1], x[2])[0]
            for x in self.microkernels())

        def batch_vars(h: str) -> list[str]:
            sizes = [x for _, x in self.batch]
            return [f"long {var} = ({h} / {after}) % {x}; (void){var};"
                    for (var, x), after in zip(self.batch, _suffix_products(sizes), strict=True)]

        def off(a: Affine) -> str:
            return f"({a.render()})"

        def pack_k(src: str, dst: str, count: str) -> list[str]:
            """dst[(p*d + c)*kr + j] = K[p*kr + j][c] from `src` (key 0), zero past `count`."""
            return [
                f"for (long fl_p = 0; fl_p < ({count} + {kr - 1}) / {kr}; fl_p++)",
                f"  for (long fl_j = 0; fl_j < {kr}; fl_j++) {{",
                f"    float* fl_dst = {dst} + fl_p * {kr * d} + fl_j;",
                f"    long fl_key = fl_p * {kr} + fl_j;",
                f"    if (fl_key < {count})",
                f"      for (long fl_c = 0; fl_c < {d}; fl_c++) "
                f"fl_dst[fl_c * {kr}] = {src}[fl_key * {k.outer}L + fl_c * {k.inner}L];",
                "    else",
                f"      for (long fl_c = 0; fl_c < {d}; fl_c++) fl_dst[fl_c * {kr}] = 0.0f;",
                "  }",
            ]

        def pack_v(src: str, dst: str, count: str, panel: str) -> list[str]:
            """dst[c*panel + j*er + x] = V[j][c*er + x] from `src` (key 0), zero past e."""
            return [
                f"for (long fl_c = 0; fl_c < {ep // er}; fl_c++)",
                f"  for (long fl_j = 0; fl_j < {count}; fl_j++)",
                f"    for (long fl_x = 0; fl_x < {er}; fl_x++) {{",
                f"      long fl_col = fl_c * {er} + fl_x;",
                f"      {dst}[fl_c * {panel} + fl_j * {er} + fl_x] = fl_col < {e} ? "
                f"{src}[fl_j * {v.outer}L + fl_col * {v.inner}L] : 0.0f;",
                "    }",
            ]

        def alloc(name: str, floats: int | str) -> str:
            size = f"((size_t)({floats}) * 4 + 63) / 64 * 64"
            return f"float* restrict {name} = (float*)aligned_alloc(64, {size});"

        lines: list[str] = ["{"]
        lines.append(f"  /* flash attention: {heads} x {m} rows x {n} keys, d {d}, e {e}; "
                     f"rows {rows}, keys {nb}, kr {kr}, er {er}, pack {mode} */")
        shared = ["fl_kall", "fl_vall"] if mode == "head" else []
        if mode == "head":  # every batch position's K and V panels, once
            lines.append("  " + alloc("fl_kall", f"{heads}L * {kph}"))
            lines.append("  " + alloc("fl_vall", f"{heads}L * {vph}"))
            lines.append("  if (fl_kall && fl_vall) {")
            if s.omp and heads > 1:
                lines.append(f"  {omp} parallel for schedule(static)")
            lines.append(f"  for (long fl_h = 0; fl_h < {heads}; fl_h++) {{")
            lines += ["    " + x for x in batch_vars("fl_h")]
            lines += ["    " + x for x in pack_k(f"({k.buf} + {off(k.base)})",
                                                 f"(fl_kall + fl_h * {kph}L)", str(n))]
            lines += ["    " + x for x in pack_v(f"({v.buf} + {off(v.base)})",
                                                 f"(fl_vall + fl_h * {vph}L)", str(n),
                                                 f"{n * er}L")]
            lines.append("  }")
            lines.append("  }")
        lines.append(f"  {omp} parallel")
        lines.append("  {")
        local = ["fl_qt", "fl_st", "fl_ot"] + (["fl_kb", "fl_vb"] if mode == "block" else [])
        lines.append("  " + alloc("fl_qt", d * rows))
        lines.append("  " + alloc("fl_st", nb * rows))
        lines.append("  " + alloc("fl_ot", ep * rows))
        if mode == "block":
            lines.append("  " + alloc("fl_kb", -(-nb // kr) * kr * d))
            lines.append("  " + alloc("fl_vb", nb * ep))
        ok = " && ".join(local + shared)
        lines.append(f"  float fl_m[{rows}], fl_l[{rows}], fl_mb[{rows}], fl_al[{rows}];")
        lines.append(f"  {omp} for schedule(static)")
        lines.append(f"  for (long fl_t = 0; fl_t < {heads * qblocks}L; fl_t++) {{")
        if cancel:
            lines.append("    if (ks_cancel) continue;")
        at_out = f"{o.buf}[{off(o.base)} + (fl_i0 + fl_r) * {o.outer}L + fl_c * {o.inner}L]"
        b: list[str] = [
            f"long fl_h = fl_t / {qblocks}, fl_i0 = (fl_t % {qblocks}) * {rows};",
            f"long fl_mv = {m} - fl_i0 < {rows} ? {m} - fl_i0 : {rows};",
            *batch_vars("fl_h"),
            f"if (!({ok})) {{  /* out of memory: NaN, never silent garbage */",
            f"  for (long fl_r = 0; fl_r < fl_mv; fl_r++) for (long fl_c = 0; fl_c < {e}; fl_c++)"
            f" {at_out} = __builtin_nanf(\"\");",
            "  continue;",
            "}",
            f"const float* restrict fl_q = {q.buf} + {off(q.base)} + fl_i0 * {q.outer}L;",
            "for (long fl_r = 0; fl_r < fl_mv; fl_r++)",
            f"  for (long fl_c = 0; fl_c < {d}; fl_c++)",
            f"    fl_qt[fl_c * {rows} + fl_r] = fl_q[fl_r * {q.outer}L + fl_c * {q.inner}L];",
            f"for (long fl_r = fl_mv; fl_r < {rows}; fl_r++)",
            f"  for (long fl_c = 0; fl_c < {d}; fl_c++) fl_qt[fl_c * {rows} + fl_r] = 0.0f;",
            f"for (long fl_r = 0; fl_r < {rows}; fl_r++) {{ fl_m[fl_r] = {lit(NEG_BIG)}; "
            "fl_l[fl_r] = 0.0f; }",
            f"for (long fl_c = 0; fl_c < {ep * rows}; fl_c++) fl_ot[fl_c] = 0.0f;",
        ]
        if mode == "head":
            b += [f"const float* fl_kh = fl_kall + fl_h * {kph}L;",
                  f"const float* fl_vh = fl_vall + fl_h * {vph}L;"]
        else:
            b += [f"const float* fl_kh = {k.buf} + {off(k.base)};",
                  f"const float* fl_vh = {v.buf} + {off(v.base)};"]
        b.append(f"for (long fl_j0 = 0; fl_j0 < {n}; fl_j0 += {nb}) {{")
        blk: list[str] = [f"long fl_nv = {n} - fl_j0 < {nb} ? {n} - fl_j0 : {nb};"]
        masked = block_masked(self.score, self.row, self.key, lit)
        if masked is not None:  # every score of this block is -inf: it adds nothing
            blk.append(f"if ({masked}) continue;")
        # 1. the score tile S^T[key][row] = K_blk . Q_blk^T
        if mode == "none":
            blk += [
                f"const float* fl_kp = fl_kh + fl_j0 * {k.outer}L;",
                f"long fl_nf = fl_nv / {kr};",
                "for (long fl_p = 0; fl_p < fl_nf; fl_p++)",
                f"  {ks}({d}, fl_kp + fl_p * {kr * k.outer}L, fl_qt, fl_st + fl_p * {kr * rows}, "
                f"{rows}, 0);",
            ]
            if ks_rem is not None:
                blk += [f"if (fl_nf * {kr} < fl_nv)",
                        f"  {ks_rem}({d}, fl_kp + fl_nf * {kr * k.outer}L, fl_qt, "
                        f"fl_st + fl_nf * {kr * rows}, {rows}, 0);"]
        else:
            if mode == "head":
                blk.append(f"const float* fl_kp = fl_kh + (fl_j0 / {kr}) * {kr * d}L;")
            else:
                blk += pack_k(f"(fl_kh + fl_j0 * {k.outer}L)", "fl_kb", "fl_nv")
                blk += pack_v(f"(fl_vh + fl_j0 * {v.outer}L)", "fl_vb", "fl_nv", f"{nb * er}L")
                blk.append("const float* fl_kp = fl_kb;")
            blk += [f"for (long fl_p = 0; fl_p < (fl_nv + {kr - 1}) / {kr}; fl_p++)",
                    f"  {ks}({d}, fl_kp + fl_p * {kr * d}, fl_qt, fl_st + fl_p * {kr * rows}, "
                    f"{rows}, 0);"]
        # 2. the score epilogue, fused with the block's row max (padding rows read row mv-1)
        blk += [
            f"for (long fl_r = 0; fl_r < {rows}; fl_r++) fl_mb[fl_r] = fl_m[fl_r];",
            "for (long fl_j = 0; fl_j < fl_nv; fl_j++) {",
            f"  float* restrict fl_sr = fl_st + fl_j * {rows};",
            f"  long {self.key} = fl_j0 + fl_j; (void){self.key};",
            f"  for (long fl_r = 0; fl_r < {rows}; fl_r++) {{",
            f"    long {self.row} = fl_i0 + (fl_r < fl_mv ? fl_r : fl_mv - 1); (void){self.row};",
            f"    float {self.dot} = fl_sr[fl_r];",
            f"    float fl_x = {expr(self.score)};",
            "    fl_sr[fl_r] = fl_x;",
            "    fl_mb[fl_r] = fl_x > fl_mb[fl_r] ? fl_x : fl_mb[fl_r];",
            "  }",
            "}",
            # 3. rescale the running state once per block; weights in place, one exp each
            f"for (long fl_r = 0; fl_r < {rows}; fl_r++) {{",
            "  fl_al[fl_r] = ks_exp_nonpos(fl_m[fl_r] - fl_mb[fl_r]);",
            "  fl_l[fl_r] *= fl_al[fl_r];",
            "  fl_m[fl_r] = fl_mb[fl_r];",
            "}",
            f"for (long fl_c = 0; fl_c < {ep}; fl_c++)",
            f"  for (long fl_r = 0; fl_r < {rows}; fl_r++) fl_ot[fl_c * {rows} + fl_r] "
            "*= fl_al[fl_r];",
            *self.weights_pass(),
        ]
        # 4. O^T += V_blk^T . P^T (the tile is P^T's packed panel)
        if mode == "none":
            blk += [f"const float* fl_vp = fl_vh + fl_j0 * {v.outer}L;",
                    f"for (long fl_c = 0; fl_c < {e // er}; fl_c++)",
                    f"  {vs}(fl_nv, fl_vp + fl_c * {er * v.inner}L, fl_st, "
                    f"fl_ot + fl_c * {er * rows}, {rows}, 1);"]
            if vs_rem is not None:
                blk.append(f"{vs_rem}(fl_nv, fl_vp + {e // er * er * v.inner}L, fl_st, "
                           f"fl_ot + {e // er * er * rows}, {rows}, 1);")
        else:
            vstart, panel = ((f"fl_vh + fl_j0 * {er}", f"{n * er}L") if mode == "head"
                             else ("fl_vb", f"{nb * er}L"))
            blk += [f"for (long fl_c = 0; fl_c < {ep // er}; fl_c++)",
                    f"  {vs}(fl_nv, {vstart} + fl_c * {panel}, fl_st, "
                    f"fl_ot + fl_c * {er * rows}, {rows}, 1);"]
        b += ["  " + x for x in blk]
        b += [
            "}",
            # a fully masked row has l = 0 and its average is 0 (kernelsat.interp)
            f"for (long fl_r = 0; fl_r < {rows}; fl_r++) "
            "fl_l[fl_r] = fl_l[fl_r] > 0.0f ? 1.0f / fl_l[fl_r] : 0.0f;",
            "for (long fl_r = 0; fl_r < fl_mv; fl_r++) {",
            f"  long {self.row} = fl_i0 + fl_r; (void){self.row};",
            f"  for (long fl_c = 0; fl_c < {e}; fl_c++) {{",
            f"    long {self.col} = fl_c; (void){self.col};",
            f"    float {self.avg} = fl_ot[fl_c * {rows} + fl_r] * fl_l[fl_r];",
            f"    {at_out} = {expr(self.post)};",
            "  }",
            "}",
        ]
        lines += ["    " + x for x in b]
        lines.append("  }")
        lines += [f"  free({x});" for x in local]
        lines.append("  }")
        lines += [f"  free({x});" for x in shared]
        lines.append("}")
        pad = "  " * depth
        return [pad + x for x in lines]


type Tile = tuple[int, int, int]
"""A microkernel's (rows of A, A's row stride, A's depth stride)."""

VEXP_NONPOSITIVE = r"""#if defined(__AVX512F__)
#include <immintrin.h>
/* ks_exp_nonpos on 16 lanes: the same reduction and polynomial, 2^k by vscalefps (which
   also gives 0 far below -87); x below -104 is raised to -104 (exp is 0 there, and
   -inf - (-inf*...) would be NaN), NaN propagates (max keeps its second operand). */
static inline __m512 ks_vexp_nonpos(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
  __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, k);
}
#endif"""


def _suffix_products(sizes: list[int]) -> list[int]:
    """For each position, the product of the sizes after it."""
    out, acc = [], 1
    for x in reversed(sizes):
        out.append(acc)
        acc *= x
    return out[::-1]


def _view(s: Strided, var: str) -> str:
    return f"{s.buf}[{s.base.render()} + {var}*{s.outer} + _*{s.inner}]"


# -- recognition -------------------------------------------------------------------------


@dataclass(frozen=True)
class FlashMatch:
    """The structure `find_flash` recognised in one kernel (the schedule comes later)."""

    batch: tuple[tuple[str, int], ...]
    m: int
    n: int
    d: int
    e: int
    q: Strided
    k: Strided
    v: Strided
    out: Strided
    row: str
    key: str
    dot: str
    score: Expr
    col: str
    avg: str
    post: Expr
    reads: tuple[str, ...]

    def statement(self, schedule: FlashSchedule) -> FlashAttention:
        return FlashAttention(self.batch, self.m, self.n, self.d, self.e, self.q, self.k,
                              self.v, self.out, self.row, self.key, self.dot, self.score,
                              self.col, self.avg, self.post, schedule)

    def knob_space(self) -> dict[str, tuple[Any, ...]]:
        """Legal values of the fused kernel's knobs (default first). `flash` turns it on;
        rows per block are `rowvec` vectors of `vw` lanes; `kacc` / `eacc` are the
        accumulator registers of the score and P.V microkernels (kr = kacc // rowvec keys,
        er = eacc // rowvec value columns per register tile); `keys` per block."""
        vecs = max(1, -(-self.m // 4))  # rows the smallest width needs, in vectors
        rowvec = tuple(x for x in (2, 1, 3, 4) if x == 1 or x <= vecs)
        head_bytes = 4 * self.heads * self.n * (self.d + self.e + 64)
        big = 4 * self.n * (self.d + self.e) > PACK_ABOVE  # one batch position's K and V
        dense = (self.k.inner, self.k.outer, self.v.inner, self.v.outer) == (1, self.d, 1, self.e)
        packs = ["none", "head"] if dense and not big else ["head", "none"]
        if head_bytes > HEAD_PACK_CAP:
            packs.remove("head")
        # a masked score skips whole key blocks: smaller blocks skip more (causal, B=1 H=8
        # N=1024 D=64, one core: 64 keys 10.7 ms, 256 keys 25.6 ms, unmasked 25.1 ms)
        masked = block_masked(self.score, self.row, self.key, str) is not None
        order = (64, 128, 256, 512, 1024) if masked else (
            256, 128, 64, 512, 1024)
        keys = [x for x in order if x < 2 * self.n] or [256]
        return {
            "flash": (True, False),
            "vw": WIDTHS,
            "rowvec": rowvec,
            "kacc": (24, 28, 16, 8),
            "eacc": (24, 16, 28, 8),
            "keys": tuple(keys),
            "pack": (*packs, "block"),
        }

    @property
    def heads(self) -> int:
        return math.prod(x for _, x in self.batch)

    def schedule(self, knobs: Mapping[str, Any]) -> FlashSchedule:
        """The schedule of a knob setting: register budgets turned into tile sizes."""
        vw, rowvec = int(knobs["vw"]), int(knobs["rowvec"])
        budget = REGISTERS - rowvec - 1  # accumulators left beside the B loads and a broadcast
        kr = max(1, min(int(knobs["kacc"]), budget) // rowvec)
        kr = min(kr, self.n)
        er = max(1, min(int(knobs["eacc"]), budget) // rowvec)
        er = -(-self.e // -(-self.e // er))  # as many panels, balanced (no thin last panel)
        keys = -(-int(knobs["keys"]) // kr) * kr
        return FlashSchedule(vw, rowvec, kr, er, keys, str(knobs["pack"]),
                             bool(knobs.get("omp", True)))


def flash_nest(kernel: Kernel, knobs: Mapping[str, Any]) -> KernelNest:
    """The kernel's nest under `knobs` (with `flash` on): one `FlashAttention` statement."""
    found = find_flash(kernel)
    if found is None:
        raise CodegenError(f"kernel {kernel.index}: knob flash=True, but it is no fused attention")
    names = list(kernel.program.buffers)
    params = (*sorted(found.reads, key=names.index), kernel.out)
    body: tuple[Stmt, ...] = (found.statement(found.schedule(knobs)),)
    return KernelNest(kernel.index, dict(knobs), body, params)


def find_flash(kernel: Kernel) -> FlashMatch | None:
    """The fused attention structure of `kernel`'s value, or None (see the module doc)."""
    try:
        return _Finder(kernel).find()
    except NoFlash:
        return None


def _constant_scalar(t: Term) -> bool:
    """A scalar whose leaves are all constants (1/sqrt(D) in any spelling)."""
    return not t.shape and (t.op is Op.CONST or (bool(t.args) and all(
        _constant_scalar(a) for a in t.args)))


def _hoist_once(dot: Term) -> Term | None:
    """One factor or split moved out of a dot product's operand, or None."""
    d = dot.axis
    for i, operand in enumerate(dot.args):
        other = dot.args[1 - i]

        def with_operand(x: Term, operand_index: int = i, rest: Term = other) -> Term:
            args = (x, rest) if operand_index == 0 else (rest, x)
            return Term(Op.DOT, args, dot.attrs)

        if operand.op is Op.DIV and _constant_scalar(operand.args[1]):
            return Term(Op.DIV, (with_operand(operand.args[0]), operand.args[1]))
        if operand.op is Op.MUL:
            x, c = operand.args
            if _constant_scalar(x):
                x, c = c, x
            if _constant_scalar(c):
                return Term(Op.MUL, (with_operand(x), c))
        if operand.op is Op.SPLIT:
            a = operand.axis
            if a != d and a not in other.shape and d not in split_axes(a, int(
                    operand.attrs[1])):  # type: ignore[arg-type]
                return Term(Op.SPLIT, (with_operand(operand.args[0]),), operand.attrs)
    return None


def hoist_dot_factors(score: Term) -> Term:
    """`score` with constant factors and splits moved out of its dot products:
    Dot(d, x / c, y) = Dot(d, x, y) / c (x * c likewise) and Dot(d, Split(a, f, x), y) =
    Split(a, f, Dot(d, x, y)) for an axis a that is neither d nor y's. Extraction may
    pick those forms (scaling Q costs N*D divisions where scaling the scores costs N*N);
    the fused kernel reads the dot's operands as buffers and applies the rest to the
    scores, so it matches the form with the factors outside."""
    memo: dict[int, Term] = {}

    def walk(t: Term) -> Term:
        if id(t) in memo:
            return memo[id(t)]
        args = tuple(walk(a) for a in t.args)
        out = t if all(a is b for a, b in zip(args, t.args, strict=True)) else Term(
            t.op, args, t.attrs)
        while out.op is Op.DOT:
            moved = _hoist_once(out)
            if moved is None:
                break
            out = Term(moved.op, tuple(walk(a) for a in moved.args), moved.attrs)
        memo[id(t)] = out
        return out

    return walk(score)


class _Finder:
    def __init__(self, kernel: Kernel):
        self.kernel = kernel
        self.prog = kernel.program
        self.reads: dict[str, None] = {}
        self.names = iter(f"ax{k}" for k in range(1 << 30))

    def find(self) -> FlashMatch:
        root = self.kernel.term
        t = self.softmax_avg(root)
        if set(t.shape) != set(root.shape):
            raise NoFlash
        s, v = t.args
        keysplit: tuple[str, int, str, str] | None = None
        if s.op is Op.LSE and v.op is Op.SOFTMAXAVG and s.args[0] is v.args[0] \
                and s.axis == v.axis:
            outer, inner = t.axis, s.axis
            base, _, factor = outer.rpartition("/o")
            if not factor.isdigit() or split_axes(base, int(factor)) != (outer, inner):
                raise NoFlash
            keysplit = (base, int(factor), outer, inner)
            score, value = v.args
            key_axis = base
        else:
            score, value = s, v
            key_axis = t.axis
        score = hoist_dot_factors(score)
        contraction = self.contraction(score)
        dot_axis = contraction.axis
        x, y = self.dot_operands(contraction)
        if key_axis in x.shape:
            x, y = y, x
        if key_axis not in y.shape or key_axis in x.shape:
            raise NoFlash
        row_axes = set(x.shape) - set(y.shape)
        key_axes = set(y.shape) - set(x.shape)
        if not row_axes or key_axes != {key_axis} or dot_axis not in x.shape:
            raise NoFlash
        # several query-only axes (grouped-query attention: the query heads r of one
        # key/value head g): the largest, innermost in the output, is the row the kernel
        # blocks; the others loop like batch axes (the keys and values do not vary along
        # them: stride 0)
        order = {a: k for k, a in enumerate(self.kernel.out_axes)}
        row_axis = max(row_axes, key=lambda a: (x.shape[a], order.get(a, -1)))
        batch_axes = (set(x.shape) & set(y.shape)) - {dot_axis} | (row_axes - {row_axis})
        sizes = dict(contraction.shape) | dict(x.shape) | dict(y.shape)
        out_shape = dict(t.shape)
        col_axes = set(out_shape) - batch_axes - {row_axis}
        if len(col_axes) > 1 or not batch_axes | {row_axis} <= set(out_shape):
            raise NoFlash
        out_axes = self.kernel.out_axes
        batch = [a for a in out_axes if a in batch_axes]
        if len(batch) != len(batch_axes):
            raise NoFlash
        var = {a: next(self.names) for a in [*batch, row_axis, key_axis, dot_axis, *col_axes]}
        env = {a: Affine.var(var[a]) for a in var}
        # the value: a read over (batch, key, column)
        v_env = dict(env)
        if keysplit is not None:
            value = self.unsplit_value(value, keysplit)
        if not set(value.shape) <= batch_axes | {key_axis} | col_axes \
                or key_axis not in value.shape:
            raise NoFlash
        col = next(iter(col_axes), "")
        if col and col not in value.shape:
            raise NoFlash
        v_idx = self.read_index(value, v_env)
        q_idx = self.read_index(x, env)
        k_idx = self.read_index(y, env)
        o_idx = self.kernel_index(env)
        bvars = {var[a] for a in batch}

        def strided(buf: str, idx: Affine, outer: str, inner: str | None) -> Strided:
            coefs = dict(idx.terms)
            if set(coefs) - bvars - {var[outer]} - ({var[inner]} if inner else set()):
                raise NoFlash
            base = Affine(tuple((v_, c) for v_, c in idx.terms if v_ in bvars), idx.const)
            return Strided(buf, base, coefs.get(var[outer], 0),
                           coefs.get(var[inner], 0) if inner else 0)

        qs = strided(q_idx[0], q_idx[1], row_axis, dot_axis)
        ks = strided(k_idx[0], k_idx[1], key_axis, dot_axis)
        vs = strided(v_idx[0], v_idx[1], key_axis, col or None)
        os_ = strided(self.kernel.out, o_idx, row_axis, col or None)
        dot, avg = "t0", "t1"
        col_var = var[col] if col else next(self.names)
        post_env = {a: env[a] for a in [*batch, row_axis, *col_axes]}
        post = self.score_expr(root, t, post_env, None, Affine(), avg)
        score_env = {a: env[a] for a in [*batch, row_axis]}
        if keysplit is None:
            score_env[key_axis] = env[key_axis]
        sexpr = self.score_expr(score, contraction, score_env, keysplit, env[key_axis], dot)
        return FlashMatch(
            tuple((var[a], sizes[a]) for a in batch),
            sizes[row_axis], sizes[key_axis], sizes[dot_axis],
            out_shape[col] if col else 1, qs, ks, vs, os_, var[row_axis], var[key_axis], dot,
            sexpr, col_var, avg, post, tuple(self.reads))

    # -- pieces ------------------------------------------------------------------------
    @staticmethod
    def softmax_avg(root: Term) -> Term:
        """The one `SoftmaxAvg` under an elementwise output expression (bias, residual,
        activation) whose other leaves are constants and buffer reads."""
        found: set[Term] = set()
        stack, seen = [root], set()
        while stack:
            t = stack.pop()
            if id(t) in seen:
                continue
            seen.add(id(t))
            if t.op is Op.SOFTMAXAVG:
                found.add(t)
            elif t.op in UNARY or t.op in BINARY or t.op in TERNARY:
                stack.extend(t.args)
            elif t.op not in (Op.IN, Op.STORE, Op.CONST, Op.SPLIT, Op.IDX, Op.NEGINF):
                raise NoFlash
        if len(found) != 1:
            raise NoFlash
        return found.pop()

    @staticmethod
    def contraction(score: Term) -> Term:
        """The one reduction in the elementwise score tree (it must be a dot product)."""
        found: list[Term] = []
        stack, seen = [score], set()
        while stack:
            t = stack.pop()
            if id(t) in seen:
                continue
            seen.add(id(t))
            if t.op in (Op.DOT, Op.SUM):
                found.append(t)
                continue
            if t.op in (Op.RMAX, Op.LSE, Op.SOFTMAXAVG):
                raise NoFlash
            stack.extend(t.args)
        if len(found) != 1:
            raise NoFlash
        return found[0]

    @staticmethod
    def dot_operands(c: Term) -> tuple[Term, Term]:
        if c.op is Op.DOT:
            x, y = c.args
        elif c.op is Op.SUM and c.args[0].op is Op.MUL:
            x, y = c.args[0].args
        else:
            raise NoFlash
        for t in (x, y):
            u = t
            while u.op is Op.SPLIT:
                u = u.args[0]
            if u.op not in (Op.IN, Op.STORE):
                raise NoFlash
        return x, y

    @staticmethod
    def unsplit_value(value: Term, keysplit: tuple[str, int, str, str]) -> Term:
        base, factor, _, _ = keysplit
        if value.op is Op.SPLIT and value.axis == base and int(value.attrs[1]) == factor:  # type: ignore[arg-type]
            return value.args[0]
        raise NoFlash

    def read_index(self, t: Term, env: dict[str, Affine]) -> tuple[str, Affine]:
        """(buffer, index) of a buffer read (through `Split`s) at `env`."""
        if t.op is Op.SPLIT:
            a, f = t.axis, int(t.attrs[1])  # type: ignore[arg-type]
            o, i = split_axes(a, f)
            if o not in env or i not in env:
                raise NoFlash
            inner = {k_: v_ for k_, v_ in env.items() if k_ not in (o, i)}
            inner[a] = env[o].scale(f) + env[i]
            return self.read_index(t.args[0], inner)
        if t.op is Op.IN:
            buf = self.prog.input_buffer[str(t.attrs[0])]
            pairs = [(a, s) for dim in in_groups(t) for a, s in dim]
        elif t.op is Op.STORE:
            buf = self.prog.store_buffer[t]
            info = self.prog.buffers[buf]
            pairs = list(zip(info.axes, info.shape, strict=True))
        else:
            raise NoFlash
        if any(a not in env for a, _ in pairs):
            raise NoFlash
        self.reads[buf] = None
        idx, stride = Affine(), 1
        for a, s in reversed(pairs):
            idx = idx + env[a].scale(stride)
            stride *= s
        return buf, idx

    def kernel_index(self, env: dict[str, Affine]) -> Affine:
        info = self.prog.buffers[self.kernel.out]
        idx, stride = Affine(), 1
        for a, s in reversed(list(zip(info.axes, info.shape, strict=True))):
            if a not in env:
                raise NoFlash
            idx = idx + env[a].scale(stride)
            stride *= s
        return idx

    def score_expr(self, t: Term, contraction: Term, env: dict[str, Affine],
                   keysplit: tuple[str, int, str, str] | None, key: Affine, dot: str) -> Expr:
        """The score as an expression of `Ref(dot)` and buffer reads at `env`."""
        if t is contraction:
            return Ref(dot)
        if t.op is Op.CONST:
            return Lit(float(t.attrs[0]))  # type: ignore[arg-type]
        if t.op is Op.NEGINF:
            return Lit(-math.inf)
        if t.op is Op.IDX:  # a position (a mask's i or n): the loop index
            axis = idx_axis(t)[0]
            if axis not in env:
                raise NoFlash
            return IndexValue(env[axis])
        if t.op is Op.SPLIT:
            a, f = t.axis, int(t.attrs[1])  # type: ignore[arg-type]
            o, i = split_axes(a, f)
            if keysplit is not None and (a, f, o, i) == keysplit:
                return self.score_expr(t.args[0], contraction, {**env, a: key}, None, key, dot)
            if o not in env or i not in env:
                raise NoFlash
            inner = {k_: v_ for k_, v_ in env.items() if k_ not in (o, i)}
            inner[a] = env[o].scale(f) + env[i]
            return self.score_expr(t.args[0], contraction, inner, keysplit, key, dot)
        if t.op in (Op.IN, Op.STORE):
            buf, idx = self.read_index(t, env)
            return Load(buf, idx)
        if t.op in UNARY or t.op in BINARY or t.op in TERNARY:
            return Call(t.op.value, tuple(self.score_expr(c, contraction, env, keysplit, key, dot)
                                          for c in t.args))
        raise NoFlash


# -- masks: which key blocks to skip ------------------------------------------------------

Bounds = tuple[str, str]
"""C expressions of a lower and an upper bound of a value over a block."""


def block_masked(score: Expr, row: str, key: str, lit: Callable[[float], str],
                 rows: tuple[str, str] = ("fl_i0", "(fl_i0 + fl_mv - 1)"),
                 keys: tuple[str, str] = ("fl_j0", "(fl_j0 + fl_nv - 1)")) -> str | None:
    """A C condition, true when every score of the block (the query rows and keys between
    the C bounds `rows` and `keys`, both inclusive; wider bounds are sound, they only skip
    less) is -inf: the score is `where(c, x, -inf)` and interval
    arithmetic over the block bounds `c` to exactly 0 (c a function of the row and key
    indices and constants: causal, sliding-window and banded masks). None when the score
    has no such mask (nothing is skipped). Sound: a block is skipped only when `c` is 0 at
    every index of it, so its weights are all exp(-inf) = 0."""
    if not (isinstance(score, Call) and score.op == "where"
            and isinstance(score.args[2], Lit) and score.args[2].value == -math.inf):
        return None
    ranges = {row: rows, key: keys}
    found = _bounds(score.args[0], ranges, lit)
    if found is None:
        return None
    lo, hi = found
    return f"({lo}) >= 0.0f && ({hi}) <= 0.0f"


def _bounds(e: Expr, ranges: Mapping[str, tuple[str, str]],
            lit: Callable[[float], str]) -> Bounds | None:
    """Interval bounds of `e` over the block (None: not a function of the indices alone)."""
    match e:
        case Lit(v) if math.isfinite(v):
            return lit(v), lit(v)
        case IndexValue(idx):
            if any(v not in ranges for v in idx.vars):
                return None
            lo = [str(idx.const)] + [f"{c}L * {ranges[v][0 if c > 0 else 1]}" for v, c in idx.terms]
            hi = [str(idx.const)] + [f"{c}L * {ranges[v][1 if c > 0 else 0]}" for v, c in idx.terms]
            return f"(float)({' + '.join(lo)})", f"(float)({' + '.join(hi)})"
        case Call(op, args) if op in _INTERVAL:
            parts = [_bounds(a, ranges, lit) for a in args]
            if any(p is None for p in parts):
                return None
            return _INTERVAL[op](*parts)
    return None


def _mul(x: Bounds, y: Bounds) -> Bounds:
    ps = [f"({a}) * ({b})" for a in x for b in y]
    return (f"fminf(fminf({ps[0]}, {ps[1]}), fminf({ps[2]}, {ps[3]}))",
            f"fmaxf(fmaxf({ps[0]}, {ps[1]}), fmaxf({ps[2]}, {ps[3]}))")


def _point(x: Bounds, y: Bounds) -> str:
    """Both intervals one and the same point."""
    return f"(({x[0]}) == ({x[1]}) && ({y[0]}) == ({y[1]}) && ({x[0]}) == ({y[0]}))"


def _apart(x: Bounds, y: Bounds) -> str:
    return f"(({x[1]}) < ({y[0]}) || ({y[1]}) < ({x[0]}))"


def _flag(cond: str) -> str:
    return f"({cond} ? 1.0f : 0.0f)"


_INTERVAL: dict[str, Callable[..., Bounds]] = {
    "add": lambda x, y: (f"({x[0]}) + ({y[0]})", f"({x[1]}) + ({y[1]})"),
    "sub": lambda x, y: (f"({x[0]}) - ({y[1]})", f"({x[1]}) - ({y[0]})"),
    "neg": lambda x: (f"-({x[1]})", f"-({x[0]})"),
    "mul": _mul,
    "lt": lambda x, y: (_flag(f"({x[1]}) < ({y[0]})"), _flag(f"!(({x[0]}) >= ({y[1]}))")),
    "le": lambda x, y: (_flag(f"({x[1]}) <= ({y[0]})"), _flag(f"!(({x[0]}) > ({y[1]}))")),
    "eq": lambda x, y: (_flag(_point(x, y)), _flag(f"!{_apart(x, y)}")),
    "ne": lambda x, y: (_flag(_apart(x, y)), _flag(f"!{_point(x, y)}")),
}
"""Interval arithmetic per op of a mask (comparisons give 0/1 bounds)."""


@dataclass(frozen=True)
class FusedAttentionSchedule:
    """The fused attention as a `lower.Schedule`: its knobs where `find_flash` matches,
    its nest where knob `flash` is on."""

    rank: int = 20

    def knobs(self, kernel: Kernel, space: Mapping[str, tuple[Any, ...]]
              ) -> dict[str, tuple[Any, ...]]:
        found = find_flash(kernel)
        return found.knob_space() if found is not None else {}

    def nest(self, kernel: Kernel, knobs: Mapping[str, Any]) -> KernelNest | None:
        return flash_nest(kernel, knobs) if knobs.get("flash") else None


register_schedule(FusedAttentionSchedule())
