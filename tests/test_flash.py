"""The fused attention kernel (codegen/flash.py) against the float64 interpreter.

Recognition is structural: both forms of `SoftmaxAvg` (whole key axis, and the
e-graph's split `SoftmaxAvg_o(LSE_i s, SoftmaxAvg_i(s, v))`), any elementwise score
epilogue over the contraction (scale, bias reads, soft-capping), any layout of the reads
(the packed-head layout of attention_packed included), batch axes or none. The C output
equals `kernelsat.interp` for every value of every flash knob, at sizes that are no
multiple of any tile or of the vector width (1, 3, 17, 33, 100), with scores large
enough that only a running max keeps exp finite.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.codegen import build, lower, render
from kernelsat.codegen.c import build_c
from kernelsat.codegen.flash import FlashAttention, find_flash
from kernelsat.codegen.loops import expand_gemms
from kernelsat.codegen.lower import KernelNest, LoweredProgram
from kernelsat.interp import evaluate_as
from kernelsat.ir import (
    LSE,
    Const,
    Dot,
    In,
    SoftmaxAvg,
    Split,
    Sum,
    Term,
    add,
    div,
    mul,
    sqrt,
    tanh,
)
from kernelsat.testing import relative_error

ROOT = Path(__file__).resolve().parents[1]
TOL = 2e-5


def attention(m: int, n: int, d: int, e: int, *, heads: int = 2, split: int = 0,
              epilogue: str = "scale", dot: str = "Dot", post: str = ""
              ) -> tuple[Term, tuple[str, ...]]:
    """softmax_n(f(Q.K)) V over (h, i, e); `split` > 0: the e-graph's two-level form."""
    q = In("Q", (("h", heads), ("i", m), ("d", d)))
    k = In("K", (("h", heads), ("n", n), ("d", d)))
    v = In("V", (("h", heads), ("n", n), ("e", e)))
    c = Dot("d", q, k) if dot == "Dot" else Sum("d", mul(q, k))
    score = div(c, sqrt(Const(float(d))))
    if epilogue == "bias":
        score = add(score, In("Bias", (("i", m), ("n", n))))
    elif epilogue == "softcap":
        score = mul(Const(5.0), tanh(div(c, Const(5.0))))
    if not split:
        avg = SoftmaxAvg("n", score, v)
    else:
        s, vs = Split("n", split, score), Split("n", split, v)
        o, i = f"n/o{split}", f"n/i{split}"
        avg = SoftmaxAvg(o, LSE(i, s), SoftmaxAvg(i, s, vs))
    if post == "residual":  # out = x + gate[e] * tanh(attention)
        gate, x = In("Gate", (("e", e),)), In("X", (("h", heads), ("i", m), ("e", e)))
        avg = add(x, mul(gate, tanh(avg)))
    return avg, ("h", "i", "e")


def inputs(term: Term, seed: int, scale: float = 1.0) -> dict[str, np.ndarray]:
    from kernelsat.ir import input_dims
    from kernelsat.ir import inputs as term_inputs

    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(input_dims(t)) * scale).astype(np.float32)
            for name, t in sorted(term_inputs(term).items())}


def run(lowered: LoweredProgram, env: dict[str, np.ndarray], knobs: dict | None) -> np.ndarray:
    exe = build(lowered, "c", [knobs])
    out = np.empty(lowered.buffers["out"].shape, np.float32)
    exe(env, out)
    return out


def check(term: Term, axes: tuple[str, ...], knobs: dict | None = None, seed: int = 0,
          scale: float = 1.0) -> LoweredProgram:
    lowered = lower(term, axes)
    assert find_flash(lowered.kernels[-1]) is not None
    env = inputs(term, seed, scale)
    want = evaluate_as(term, {k: v.astype(np.float64) for k, v in env.items()}, axes)
    got = run(lowered, env, {"flash": True, **(knobs or {})})
    assert np.isfinite(got).all()
    assert relative_error(got, want) < TOL, (knobs, relative_error(got, want))
    return lowered


def flash_space(lowered: LoweredProgram) -> dict[str, tuple]:
    space = lowered.kernels[-1].knob_space()
    return {k: space[k] for k in ("vw", "rowvec", "kacc", "eacc", "keys", "pack", "omp")}


# -- recognition ---------------------------------------------------------------------


@pytest.mark.parametrize("split", [0, 4])
@pytest.mark.parametrize("epilogue", ["scale", "bias", "softcap"])
@pytest.mark.parametrize("dot", ["Dot", "Sum"])
def test_both_forms_and_any_elementwise_epilogue_are_recognised_and_match(split, epilogue, dot):
    term, axes = attention(5, 12, 7, 9, split=split, epilogue=epilogue, dot=dot)
    lowered = check(term, axes)
    nest = lowered.kernels[0].nest()
    assert isinstance(nest.body[0], FlashAttention)  # the default schedule is the fused one
    assert "flash_attention" in str(lowered)


@pytest.mark.parametrize("split", [0, 3])
def test_an_elementwise_output_expression_is_fused_into_the_store(split):
    term, axes = attention(7, 9, 5, 17, split=split, epilogue="bias", post="residual")
    lowered = check(term, axes)
    check(term, axes, {"pack": "head", "rowvec": 1, "vw": 4})
    assert "add(" in str(lowered)  # the residual, in the fused statement
    plain = lower(term, axes).kernels[0].nest({"flash": False})
    assert not any(isinstance(s, FlashAttention) for s in plain.body)


def test_kernels_without_the_structure_get_no_flash_knob():
    x = In("X", (("i", 8), ("n", 16)))
    y = In("Y", (("n", 16), ("e", 4)))
    softmax_avg_of_a_read = SoftmaxAvg("n", x, y)  # score is no contraction
    assert "flash" not in lower(softmax_avg_of_a_read, ("i", "e")).kernels[0].knob_space()
    k = In("K", (("n", 16), ("d", 4)))
    q = In("Q", (("i", 8), ("d", 4)))
    two_keys = SoftmaxAvg("n", Dot("d", q, In("K2", (("n", 16), ("m", 2), ("d", 4)))), y)
    assert "flash" not in lower(two_keys, ("i", "m", "e")).kernels[0].knob_space()
    # two query axes the keys lack (grouped-query attention's query heads r of a KV head):
    # the larger is the row blocked, the other loops like a batch axis (keys: stride 0)
    q2 = In("Q", (("i", 8), ("j", 2), ("d", 4)))
    check(SoftmaxAvg("n", Dot("d", q2, k), y), ("i", "j", "e"))
    check(SoftmaxAvg("n", Dot("d", q2, k), y), ("j", "i", "e"))


@pytest.mark.parametrize("name", ["attention", "attention_packed"])
def test_the_specs_extracted_fused_programs_run_fused(name):
    from kernelsat.driver.pipeline import saturate_program
    from kernelsat.extract import extract
    from kernelsat.extract.online import online_preference
    from kernelsat.proofs.library import load_library
    from kernelsat.spec import load_spec

    program = load_spec(str(ROOT / f"specs/{name}.ks"), {"N": 128, "H": 2, "D": 16})
    sat = saturate_program(program, load_library())
    best = extract(sat.snapshot, "greedy-tree", cost=online_preference)[0].term
    lowered = lower(best, program.out_axes)
    found = find_flash(lowered.kernels[-1])
    assert found is not None
    if name == "attention_packed":  # the packed-head layout: row strides H*D
        assert found.q.outer == found.k.outer == found.v.outer == 2 * 16
    env = inputs(program.term, 1)
    want = evaluate_as(program.term, {k: v.astype(np.float64) for k, v in env.items()},
                       program.out_axes)
    for knobs in ({}, {"pack": "head"}, {"pack": "block", "vw": 8}):
        assert relative_error(run(lowered, env, knobs), want) < TOL


# -- every knob value, odd sizes -------------------------------------------------------


SIZES = [(1, 1, 1, 1), (3, 17, 3, 33), (17, 33, 17, 3), (33, 100, 33, 17), (100, 3, 100, 100)]


@pytest.mark.parametrize("m,n,d,e", SIZES)
def test_every_value_of_every_flash_knob_at_odd_sizes(m, n, d, e):
    term, axes = attention(m, n, d, e)
    lowered = lower(term, axes)
    space = flash_space(lowered)
    for name, values in space.items():
        for value in values:
            check(term, axes, {name: value}, seed=m + n)


@settings(max_examples=12, deadline=None)
@given(m=st.sampled_from([1, 3, 17, 33, 100]), n=st.sampled_from([1, 3, 17, 33, 100]),
       d=st.sampled_from([1, 3, 17, 64]), e=st.sampled_from([1, 3, 17, 33]),
       heads=st.sampled_from([1, 3]), epilogue=st.sampled_from(["scale", "bias", "softcap"]),
       post=st.sampled_from(["", "residual"]), data=st.data())
def test_random_knob_combinations_match_the_reference(m, n, d, e, heads, epilogue, post, data):
    term, axes = attention(m, n, d, e, heads=heads, epilogue=epilogue, post=post)
    space = flash_space(lower(term, axes))
    knobs = {k: data.draw(st.sampled_from(v), label=k) for k, v in space.items()}
    check(term, axes, knobs, seed=3)


@pytest.mark.parametrize("knobs", [{}, {"pack": "head"}, {"pack": "block"}, {"keys": 64}])
def test_large_scores_stay_finite_through_the_running_max(knobs):
    # |scores| up to ~1e3: exp overflows without the max, and a block's max moves a lot
    term, axes = attention(17, 100, 33, 17, split=4)
    check(term, axes, knobs, seed=7, scale=12.0)


def test_the_plain_loop_expansion_matches_too():
    term, axes = attention(3, 17, 5, 4, heads=2, epilogue="bias")
    lowered = lower(term, axes)
    nest = lowered.kernels[0].nest()
    plain = KernelNest(nest.kernel, nest.knobs, expand_gemms(nest.body), nest.params)
    assert not any(isinstance(s, FlashAttention) for s in plain.body)
    exe = build_c(lowered, [plain])
    env = inputs(term, 2)
    out = np.empty(lowered.buffers["out"].shape, np.float32)
    exe(env, out)
    want = evaluate_as(term, {k: v.astype(np.float64) for k, v in env.items()}, axes)
    assert relative_error(out, want) < TOL
    assert "aligned_alloc" not in render(lowered, None, "cuda")  # CUDA gets the loops
    assert lowered.kernels[0].stats.flops >= 4 * 2 * 3 * 17 * (5 + 4)


def test_strided_microkernel_equals_numpy():
    import ctypes

    from kernelsat.codegen.c import compile_c
    from kernelsat.codegen.simd import microkernel, vector_typedef

    mr, nr, w, rs, ps, kc = 5, 32, 16, 7, 1, 9
    name, src = microkernel(mr, nr, w, rs, ps)
    code = "\n".join(["#include <string.h>", vector_typedef(w)[1], src,
                      f"void run(const float* a, const float* b, float* c) "
                      f"{{ {name}({kc}, a, b, c, {nr}, 1); }}"])
    lib = ctypes.CDLL(str(compile_c(code.replace("-shared", ""))))
    rng = np.random.default_rng(0)
    a = rng.standard_normal(mr * rs + kc * ps).astype(np.float32)
    b = rng.standard_normal(kc * nr).astype(np.float32)
    c = rng.standard_normal(mr * nr).astype(np.float32)
    want = c.reshape(mr, nr).astype(np.float64) + np.array(
        [[sum(float(a[r * rs + p * ps]) * float(b[p * nr + j]) for p in range(kc))
          for j in range(nr)] for r in range(mr)])
    ptr = ctypes.POINTER(ctypes.c_float)
    lib.run(a.ctypes.data_as(ptr), b.ctypes.data_as(ptr), c.ctypes.data_as(ptr))
    assert np.abs(c.reshape(mr, nr) - want).max() < 1e-4
    assert math.isfinite(float(c.sum()))


def test_a_nan_query_row_gives_a_nan_output_row_and_leaves_the_others():
    term, axes = attention(33, 17, 5, 3, heads=1, split=0)
    lowered = lower(term, axes)
    env = inputs(term, 4)
    env["Q"][0, 20, 2] = np.nan
    want = evaluate_as(term, {k: v.astype(np.float64) for k, v in env.items()}, axes)
    for knobs in ({}, {"pack": "head", "rowvec": 1}):
        got = run(lowered, env, knobs)
        assert np.isnan(got[0, 20]).all() and np.isnan(want[0, 20]).all()
        assert relative_error(got, want) < TOL  # non-finite entries match exactly


@pytest.mark.parametrize("knobs", [{}, {"vw": 8}, {"pack": "head", "rowvec": 3}, {"keys": 64}])
def test_a_causal_mask_of_minus_infinity_gives_zero_weights(knobs):
    m = n = 100
    term, axes = attention(m, n, 17, 9, heads=2, epilogue="bias")
    lowered = lower(term, axes)
    env = inputs(term, 5, scale=3.0)
    env["Bias"] = np.where(np.arange(n)[None, :] > np.arange(m)[:, None], -np.inf, 0.0
                           ).astype(np.float32)
    want = evaluate_as(term, {k: v.astype(np.float64) for k, v in env.items()}, axes)
    got = run(lowered, env, knobs)
    assert np.isfinite(got).all() and relative_error(got, want) < TOL
    np.testing.assert_allclose(got[:, 0], env["V"][:, 0], rtol=1e-6)  # row 0 sees key 0 only
