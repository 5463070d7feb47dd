"""Explicit SIMD in C: GCC/Clang vector extensions, emitted as source text.

Two string emitters that renderers call and deduplicate per translation unit (emit
each returned source once, `vector_typedef(w)` before any `microkernel(.., w)`):

- `vector_typedef(width)`: a float vector type of `width` lanes and its unaligned
  load/store helpers `ks_vload<w>` / `ks_vstore<w>` (memcpy: one `vmovups` at -O3, no
  alignment assumed, no strict-aliasing question);
- `microkernel(mr, nr, width)`: the register-blocked product of an `mr x kc` packed
  panel of A and a `kc x nr` packed panel of B into an `mr x nr` tile of C, the
  innermost piece of a BLIS-structured GEMM: `mr * nr / width` vector accumulators stay
  in registers for the whole `kc` loop; each step loads `nr / width` vectors of B and
  broadcasts `mr` scalars of A (gcc folds the broadcast into the FMA's memory operand).

Portable across AVX-512 (width 16), AVX2 (8) and NEON/SSE (4): the vector width is a
parameter, gcc lowers wider vectors to several narrower registers where it must.

>>> name, src = microkernel(2, 8, 4)
>>> name
'ks_ukr_2x8_v4'
>>> "c0_1" in src and "accumulate" in src
True
"""

from __future__ import annotations

WIDTHS = (1, 2, 4, 8, 16, 32)
"""Vector widths (floats) the emitters accept."""

REGISTERS = 32
"""Vector registers of the register budget (AVX-512: 32 zmm; AVX2 has 16)."""


def _check_width(width: int) -> None:
    if width not in WIDTHS:
        raise ValueError(f"vector width {width} is not one of {WIDTHS}")


def vector_typedef(width: int) -> tuple[str, str]:
    """(type name, C source) of a `width`-float vector type with unaligned helpers.

    >>> vector_typedef(16)[0]
    'ks_v16'
    """
    _check_width(width)
    name = f"ks_v{width}"
    nbytes = 4 * width
    source = "\n".join([
        f"typedef float {name} __attribute__((vector_size({nbytes})));",
        f"static inline {name} ks_vload{width}(const float* p) "
        f"{{ {name} v; memcpy(&v, p, {nbytes}); return v; }}",
        f"static inline void ks_vstore{width}(float* p, {name} v) "
        f"{{ memcpy(p, &v, {nbytes}); }}",
    ])
    return name, source


def register_cost(mr: int, nr: int, width: int) -> int:
    """Vector registers a microkernel holds: mr*nr/width accumulators, nr/width B
    vectors and one broadcast A value."""
    return mr * (nr // width) + nr // width + 1


def microkernel(mr: int, nr: int, width: int, rs: int = 1, ps: int | None = None
                ) -> tuple[str, str]:
    """(function name, C source) of

        static inline void NAME(long kc, const float* restrict ap,
                                const float* restrict bp, float* restrict c,
                                long ldc, int accumulate)

    c[r*ldc + j] = (accumulate ? c[r*ldc + j] : 0) + sum_p A(r, p) * bp[p*nr + j]
    for r < mr, j < nr, with A(r, p) = ap[r*rs + p*ps]: by default a packed panel
    (rs = 1, ps = mr); other strides read A in place (K rows or V columns of the fused
    attention), each element a broadcast load. Needs `vector_typedef(width)` (and
    <string.h>) before it. The packed form prefetches C and unrolls by 4 (measured on
    the GEMM); the in-place form does neither (not measured there).
    """
    _check_width(width)
    if mr < 1 or nr < width or nr % width:
        raise ValueError(f"microkernel {mr}x{nr}: nr must be a positive multiple of {width}")
    step = mr if ps is None else ps
    packed = rs == 1 and step == mr
    vt, _ = vector_typedef(width)
    nv = nr // width
    name = f"ks_ukr_{mr}x{nr}_v{width}" + ("" if packed else f"_a{rs}x{step}")
    accs = [[f"c{r}_{v}" for v in range(nv)] for r in range(mr)]
    lines = [
        f"static inline void {name}(long kc, const float* restrict ap, "
        f"const float* restrict bp, float* restrict c, long ldc, int accumulate) {{",
    ]
    for r in range(mr):
        lines.append("  " + vt + " " + ", ".join(f"{a} = {{0}}" for a in accs[r]) + ";")
    if packed:
        for r in range(mr):  # C's lines arrive while the kc loop runs (write intent)
            lines.append("  " + " ".join(f"__builtin_prefetch(c + {r}*ldc + {j}, 1);"
                                         for j in range(0, nr, 16)))  # one per 64-byte line
        lines.append("  #pragma GCC unroll 4")
    lines.append("  for (long p = 0; p < kc; p++) {")
    for v in range(nv):
        lines.append(f"    {vt} b{v} = ks_vload{width}(bp + {v * width});")
    for r in range(mr):
        lines.append(f"    {{ float a = ap[{r * rs}]; "
                     + " ".join(f"{accs[r][v]} += b{v} * a;" for v in range(nv)) + " }")
    lines.append(f"    ap += {step}; bp += {nr};")
    lines.append("  }")
    lines.append("  if (accumulate) {")
    for r in range(mr):
        for v in range(nv):
            at = f"c + {r}*ldc + {v * width}"
            lines.append(f"    ks_vstore{width}({at}, ks_vload{width}({at}) + {accs[r][v]});")
    lines.append("  } else {")
    for r in range(mr):
        for v in range(nv):
            lines.append(f"    ks_vstore{width}(c + {r}*ldc + {v * width}, {accs[r][v]});")
    lines.append("  }")
    lines.append("}")
    return name, "\n".join(lines)


__all__ = ["REGISTERS", "WIDTHS", "microkernel", "register_cost", "vector_typedef"]
