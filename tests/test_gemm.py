"""The contraction path of the C backend: the SIMD microkernel, the `Gemm` statement
and the blocked GEMM lowering, each against numpy / the float64 interpreter."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from kernelsat.codegen.c import compile_c
from kernelsat.codegen.c_prelude import PRELUDE
from kernelsat.codegen.loops import (
    Affine,
    Call,
    Gemm,
    Let,
    Lit,
    Load,
    Loop,
    Ref,
    Write,
    expand_gemms,
    stmt_lines,
)
from kernelsat.codegen.simd import microkernel, register_cost, vector_typedef

# -- the microkernel ------------------------------------------------------------------

UKR_CASES = [(1, 4, 4, 1), (2, 8, 4, 3), (3, 16, 8, 17), (6, 32, 16, 5), (8, 32, 16, 64),
             (4, 64, 16, 2), (12, 32, 16, 33), (5, 2, 1, 7), (1, 16, 16, 0)]


def _ukr_library(cases: list[tuple[int, int, int, int]], folder: Path) -> ctypes.CDLL:
    parts, seen = [PRELUDE], set()
    for _, _, w, _ in cases:
        if w not in seen:
            seen.add(w)
            parts.append(vector_typedef(w)[1])
    for mr, nr, w, _ in cases:
        name, src = microkernel(mr, nr, w)
        if src not in parts:
            parts.append(src)
            parts.append(f"void call_{name}(long kc, const float* ap, const float* bp, "
                         f"float* c, long ldc, int acc) {{ {name}(kc, ap, bp, c, ldc, acc); }}")
    return ctypes.CDLL(str(compile_c("\n\n".join(parts) + "\n", folder)))


@pytest.mark.parametrize("accumulate", [0, 1])
def test_microkernel_equals_numpy(tmp_path: Path, accumulate: int) -> None:
    lib = _ukr_library(UKR_CASES, tmp_path)
    rng = np.random.default_rng(0)
    for mr, nr, w, kc in UKR_CASES:
        name, _ = microkernel(mr, nr, w)
        a = rng.standard_normal((kc, mr)).astype(np.float32)  # packed: ap[p*mr + r]
        b = rng.standard_normal((kc, nr)).astype(np.float32)  # packed: bp[p*nr + j]
        ldc = nr + 5  # a tile inside a wider matrix: the columns past nr stay untouched
        c = rng.standard_normal((mr, ldc)).astype(np.float32)
        want = c.astype(np.float64)
        prod = a.T.astype(np.float64) @ b.astype(np.float64)
        want[:, :nr] = prod + (want[:, :nr] if accumulate else 0.0)
        ptr = ctypes.c_void_p
        getattr(lib, f"call_{name}")(ctypes.c_long(kc), ptr(a.ctypes.data), ptr(b.ctypes.data),
                                     ptr(c.ctypes.data), ctypes.c_long(ldc),
                                     ctypes.c_int(accumulate))
        np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5 * max(1, kc),
                                   err_msg=f"{name} kc={kc} accumulate={accumulate}")


def test_microkernel_rejects_bad_tiles() -> None:
    with pytest.raises(ValueError, match="multiple"):
        microkernel(4, 24, 16)
    with pytest.raises(ValueError, match="width"):
        vector_typedef(3)
    assert register_cost(12, 32, 16) == 27


# -- the Gemm statement -----------------------------------------------------------------


def _small_gemm() -> Gemm:
    a = Load("in0", Affine((("m0", 3), ("k0", 1))))
    b = Load("in1", Affine((("k0", 5), ("n0", 1))))
    epi = (Let("t0", Call("add", (Ref("acc0"), Load("in2", Affine.var("n0"))))),)
    write = Write("out", Affine((("m0", 5), ("n0", 1))), Ref("t0"))
    return Gemm(2, 5, 3, "m0", "n0", "k0", a, b, "acc0", epi, write, axes=("i", "j", "k"))


def test_gemm_expand_is_the_plain_loop_nest() -> None:
    g = _small_gemm()
    (outer,) = g.expand()
    assert isinstance(outer, Loop) and (outer.var, outer.extent) == ("m0", 2)
    (inner,) = outer.body
    assert isinstance(inner, Loop) and (inner.var, inner.extent) == ("n0", 5)
    init, red, epi, write = inner.body
    assert init == Let("acc0", Lit(0.0), mutable=True)
    assert isinstance(red, Loop) and red.kind == "reduce" and red.extent == 3
    assert (epi, write) == (g.epilogue[0], g.write)
    assert expand_gemms((Loop("b0", 2, (g,), "parallel"),)) == (
        Loop("b0", 2, g.expand(), "parallel"),)
    text = "\n".join(stmt_lines(g, 0))
    assert text.startswith("gemm m0 in 0..2, n0 in 0..5: acc0 = sum k0 in 0..3 of")
    assert "out[m0*5 + n0] = t0" in text
