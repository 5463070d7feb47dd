"""The contraction path of the C backend: the SIMD microkernel, the `Gemm` statement
and the blocked GEMM lowering, each against numpy / the float64 interpreter."""

from __future__ import annotations

import ctypes
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.codegen import LoweredProgram, build, lower, render
from kernelsat.codegen.c import compile_c
from kernelsat.codegen.c_prelude import PRELUDE
from kernelsat.codegen.gemm import contraction_of
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
from kernelsat.interp import evaluate_as
from kernelsat.ir import Const, Dot, In, Split, Sum, Term, add, input_dims, inputs, mul
from kernelsat.macros import ELEMENTWISE
from kernelsat.spec import load_spec

SPECS = Path(__file__).resolve().parents[1] / "specs"

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


# -- the lowering: C output against the float64 interpreter ---------------------------

LAYOUTS = ["ab", "abt", "atb", "atbt", "batch", "batch_t", "split_m"]


def contraction(layout: str, m: int, n: int, k: int, epilogue: str, g: int = 3
                ) -> tuple[Term, tuple[str, ...]]:
    """A contraction in one of the operand layouts, with an epilogue over (i, j):
    A.B, A.B^T, A^T.B, A^T.B^T, batched (g), batched with a transposed output, and an
    m axis read through `Split` (two m axes: one becomes an outer loop)."""
    i, j, kk = ("i", m), ("j", n), ("k", k)
    match layout:
        case "ab" | "abt" | "atb" | "atbt":
            a = In("A", (kk, i) if layout.startswith("at") else (i, kk))
            b = In("B", (j, kk) if layout.endswith("bt") else (kk, j))
            axes: tuple[str, ...] = ("i", "j")
        case "batch" | "batch_t":
            a, b = In("A", (("g", g), i, kk)), In("B", (("g", g), kk, j))
            axes = ("g", "i", "j") if layout == "batch" else ("j", "g", "i")
        case "split_m":
            f = 2 if m % 2 == 0 else 1
            a = Split("i", f, In("A", (i, kk)))
            b = In("B", (kk, j))
            axes = (f"i/o{f}", f"i/i{f}", "j")
        case _:
            raise AssertionError(layout)
    value: Term = Dot("k", a, b) if layout != "abt" else Sum("k", mul(a, b))
    out = set(value.shape)
    bias_axes = tuple((x, value.shape[x]) for x in sorted(out) if x.startswith("j"))
    match epilogue:
        case "none":
            pass
        case "bias":
            value = add(value, In("c", bias_axes))
        case "bias_gelu":
            value = ELEMENTWISE["gelu"].build(add(value, In("c", bias_axes)))
        case "scale_silu_residual":
            res = In("R", tuple((x, value.shape[x]) for x in axes))
            value = add(ELEMENTWISE["silu"].build(mul(value, Const(0.125))), res)
        case _:
            raise AssertionError(epilogue)
    return value, axes


def random_env(term: Term, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(input_dims(node)).astype(np.float32)
            for name, node in inputs(term).items()}


def check_c(term: Term, axes: tuple[str, ...], knobs: dict[str, Any] | None,
            folder: Path, seed: int = 0) -> LoweredProgram:
    """Lower, build for C with `knobs` on the (single) kernel, run, compare to float64."""
    lowered = lower(term, axes)
    env = random_env(term, seed)
    exe = build(lowered, "c", [knobs] * len(lowered.kernels) if knobs else None, folder)
    out = np.empty(lowered.buffers["out"].shape, np.float32)
    exe(env, out)
    want = evaluate_as(term, {x: v.astype(np.float64) for x, v in env.items()}, axes)
    scale = 1.0 + float(np.max(np.abs(want)))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5 * scale * np.sqrt(
        max(term.all_sizes.get("k", 1), 1)), err_msg=f"{axes} {knobs}")
    return lowered


def test_detection_classifies_axes() -> None:
    t, axes = contraction("batch", 5, 7, 3, "bias")
    c = contraction_of(lower(t, axes).kernels[0])
    assert c is not None and (c.m, c.n, c.k) == ("i", "j", "k") and c.outer == ("g",)
    # output laid out (j, g, i): the roles swap, so vectors run along the stride-1 axis i
    t, axes = contraction("batch_t", 5, 7, 3, "bias")
    c = contraction_of(lower(t, axes).kernels[0])
    assert c is not None and (c.m, c.n, c.k) == ("j", "i", "k") and c.outer == ("g",)
    t, axes = contraction("split_m", 6, 7, 3, "none")
    c = contraction_of(lower(t, axes).kernels[0])
    assert c is not None and c.n == "j" and set(c.outer) | {c.m} == {"i/o2", "i/i2"}
    t, _ = contraction("ab", 5, 7, 3, "none")
    c = contraction_of(lower(t, ("j", "i")).kernels[0])
    assert c is not None and (c.m, c.n) == ("j", "i")
    assert "gemm" in lower(t, ("i", "j")).kernels[0].knob_space()


@pytest.mark.parametrize("term", [
    "matvec", "rowdot", "nothing_shared", "two_axes", "reduction_in_epilogue",
    "broadcast_epilogue"])
def test_not_a_gemm(term: str) -> None:
    """Contractions that are no GEMM keep the generic lowering (and its knobs only)."""
    a, b = In("A", (("i", 8), ("k", 4))), In("B", (("k", 4), ("j", 8)))
    a2, b2 = In("A2", (("i", 8), ("k", 4))), In("B2", (("k", 4), ("j", 8)))
    v = In("v", (("k", 4),))
    t = {
        "matvec": Dot("k", a, v),  # no n axis: memory bound
        "rowdot": Dot("k", a, a),  # x times itself: no m or n axis
        "nothing_shared": add(Dot("k", a, b), Dot("k", a2, b2)),  # two contractions, no A
        "two_axes": add(Dot("k", a, b), Dot("l", In("C", (("i", 8), ("l", 3))),
                                            In("D", (("l", 3), ("j", 8))))),
        "reduction_in_epilogue": add(Dot("k", a, b), Sum("k", b)),
        "broadcast_epilogue": add(Dot("k", a, b), In("z", (("z", 2),))),
    }[term]
    kern = lower(t, tuple(t.shape)).kernels[0]
    assert contraction_of(kern) is None and "gemm" not in kern.knob_space()
    assert "gemm" not in str(kern.nest())


def _zip_settings(space: dict[str, tuple[Any, ...]]) -> list[dict[str, Any]]:
    """Settings that together use every legal value of every GEMM knob at least once."""
    knobs = [k for k in ("mr", "nr", "vw", "kc", "mc", "nc", "par") if k in space]
    rounds = max(len(space[k]) for k in knobs)
    return [{k: space[k][r % len(space[k])] for k in knobs} for r in range(rounds)]


@pytest.mark.parametrize(("layout", "sizes", "epilogue"), [
    ("ab", (97, 75, 131), "bias_gelu"),          # kc, mc blocks; edge tiles everywhere
    ("abt", (20, 530, 40), "scale_silu_residual"),  # nc blocks (530 > 512)
    ("batch", (17, 33, 65), "bias"),             # par over the outer (batch) loop
])
def test_every_knob_value(tmp_path: Path, layout: str, sizes: tuple[int, int, int],
                          epilogue: str) -> None:
    t, axes = contraction(layout, *sizes, epilogue, g=5)
    kern = lower(t, axes).kernels[0]
    space = kern.knob_space()
    for setting in _zip_settings(space):
        check_c(t, axes, {"gemm": True, **setting}, tmp_path)


@settings(max_examples=12, deadline=None)
@given(layout=st.sampled_from(LAYOUTS), m=st.sampled_from([1, 3, 17, 31, 33, 50]),
       n=st.sampled_from([1, 3, 17, 31, 33, 70]), k=st.sampled_from([1, 3, 17, 31, 33, 70]),
       epilogue=st.sampled_from(["none", "bias", "bias_gelu", "scale_silu_residual"]),
       out_t=st.booleans(), data=st.data())
def test_random_contractions(layout: str, m: int, n: int, k: int, epilogue: str,
                             out_t: bool, data: st.DataObject) -> None:
    """Random layouts, odd sizes, epilogues and knob settings (any legal value of each)."""
    t, axes = contraction(layout, m, n, k, epilogue)
    if out_t:
        axes = axes[::-1]
    kern = lower(t, axes).kernels[0]
    space = kern.knob_space()
    knobs: dict[str, Any] = {}
    if "gemm" in space:  # m == 1 or n == 1 can still be a GEMM; a 1-wide axis too
        knobs = {k_: data.draw(st.sampled_from(space[k_]), label=k_)
                 for k_ in ("mr", "nr", "vw", "kc", "mc", "nc", "par")}
    with tempfile.TemporaryDirectory() as folder:
        check_c(t, axes, knobs or None, Path(folder))


@pytest.mark.parametrize(("spec", "params"), [
    ("matmul", {"M": 33, "N": 70, "K": 31}),
    ("bmm", {"G": 3, "M": 17, "N": 33, "K": 9}),
    ("mlp2", {"T": 13, "D": 17, "F": 40}),
    ("swiglu", {"T": 13, "D": 17, "F": 40}),
    ("matmul_bias_gelu", {"M": 13, "K": 70, "N": 33}),
])
def test_specs_take_the_gemm_path(tmp_path: Path, spec: str, params: dict[str, int]) -> None:
    program = load_spec(SPECS / f"{spec}.ks", params)
    lowered = check_c(program.term, program.out_axes, None, tmp_path)
    gemms = [k for k in lowered.kernels if contraction_of(k) is not None]
    assert gemms and all("gemm " in str(k.nest()) for k in gemms)


def test_cuda_renders_gemm_as_loops() -> None:
    """A renderer without a native GEMM (CUDA) gets `Gemm.expand()`."""
    t, axes = contraction("ab", 17, 33, 9, "bias_gelu")
    source = render(lower(t, axes), None, backend="cuda")
    assert "__global__" in source and "aligned_alloc" not in source and "omp" not in source


def test_stats_count_the_gemm() -> None:
    t, axes = contraction("batch", 6, 10, 4, "bias", g=2)
    stats = lower(t, axes).kernels[0].stats
    assert stats.flops == 2 * 2 * 6 * 10 * 4 + 2 * 6 * 10  # the products + the bias add
