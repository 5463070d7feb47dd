"""Codegen: lowering structure, knobs, stats, and numpy/C outputs against the float64
interpreter on random programs and random knob settings."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelsat.codegen import (
    CodegenError,
    CRenderer,
    build,
    compile_cuda,
    lower,
    render,
    run_program,
)
from kernelsat.codegen.cuda import find_nvcc
from kernelsat.interp import evaluate_as
from kernelsat.ir import (
    LSE,
    Const,
    Dot,
    In,
    Max,
    SoftmaxAvg,
    Split,
    Store,
    Sum,
    Term,
    abs_,
    add,
    div,
    erf,
    exp,
    log,
    max_,
    min_,
    mul,
    neg,
    relu,
    sigmoid,
    sqrt,
    sub,
    tanh,
)

SIZES = {"i": 4, "n": 8, "e": 4}


def reference(term: Term, axes: tuple[str, ...], env: dict[str, np.ndarray]) -> np.ndarray:
    return evaluate_as(term, {k: v.astype(np.float64) for k, v in env.items()}, axes)


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    scale = 1.0 + float(np.max(np.abs(want))) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=3e-4 * scale)


def inputs_for(term: Term, seed: int = 0) -> dict[str, np.ndarray]:
    from kernelsat.ir import input_dims, inputs

    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(input_dims(node)).astype(np.float32)
            for name, node in inputs(term).items()}


# -- a small strategy of random well-formed programs ----------------------------------

UNARY = [tanh, sigmoid, neg, abs_, relu, erf,
         lambda x: exp(tanh(x)), lambda x: log(add(abs_(x), Const(1.0))),
         lambda x: sqrt(add(abs_(x), Const(0.5)))]
BINARY = [add, sub, mul, max_, min_, lambda x, y: div(x, add(abs_(y), Const(1.0)))]


@st.composite
def programs(draw: st.DrawFn, depth: int = 3) -> Term:
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        if draw(st.integers(0, 5)) == 0:
            return Const(draw(st.sampled_from([0.5, -1.25, 2.0])))
        axes = draw(st.lists(st.sampled_from(sorted(SIZES)), min_size=1, max_size=3, unique=True))
        return In("X" + "".join(axes), tuple((a, SIZES[a]) for a in axes))
    kind = draw(st.integers(0, 9))
    x = draw(programs(depth - 1))
    if kind <= 2:
        return draw(st.sampled_from(UNARY))(x)
    if kind <= 4:
        return draw(st.sampled_from(BINARY))(x, draw(programs(depth - 1)))
    if kind == 5 and x.shape:
        return Store(x)
    axes = sorted(a for a in x.shape if "/" not in a)
    if not axes:
        return x
    a = draw(st.sampled_from(axes))
    if kind == 6:
        return draw(st.sampled_from([Sum, Max, LSE]))(a, x)
    if kind == 7:
        y = draw(programs(depth - 1))
        if any(b in y.shape and y.shape[b] != s for b, s in x.shape.items()):
            return x
        return draw(st.sampled_from([SoftmaxAvg, Dot]))(a, x, y)
    if kind == 8:
        f = draw(st.sampled_from([f for f in (2, 4) if x.shape[a] % f == 0]))
        o, i = f"{a}/o{f}", f"{a}/i{f}"
        if o in x.shape or i in x.shape:
            return x
        sx = Split(a, f, x)
        red = draw(st.sampled_from(["none", "inner", "outer", "both"]))
        if red == "inner":
            return LSE(i, sx)
        if red == "outer":
            return Sum(o, sx)
        if red == "both":
            return Max(o, Sum(i, sx))
        return sx
    return x


def random_knobs(data: st.DataObject, lowered) -> list[dict]:
    return [{k: data.draw(st.sampled_from(v), label=f"k{kern.index}.{k}")
             for k, v in kern.knob_space().items()} for kern in lowered.kernels]


def out_order(term: Term, data: st.DataObject) -> tuple[str, ...]:
    return tuple(data.draw(st.permutations(sorted(term.shape)), label="out_axes"))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.data())
def test_numpy_matches_interpreter(term: Term, data: st.DataObject) -> None:
    axes = out_order(term, data)
    env = inputs_for(term)
    assert_close(run_program(term, axes, env, "numpy"), reference(term, axes, env))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.data())
def test_c_matches_interpreter(tmp_path_factory, term: Term, data: st.DataObject) -> None:
    axes = out_order(term, data)
    lowered = lower(term, axes)
    knobs = random_knobs(data, lowered)
    env = inputs_for(term)
    exe = build(lowered, "c", knobs, tmp_path_factory.getbasetemp() / "c")
    out = np.full(lowered.buffers["out"].shape, np.nan, np.float32)
    exe(env, out)
    assert_close(out, reference(term, axes, env))


# -- structure of the loop nests ---------------------------------------------------------

def softmax(x: Term, a: str) -> Term:
    e = exp(sub(x, Max(a, x)))
    return div(e, Sum(a, e))


def test_row_max_once_per_row() -> None:
    x = In("x", (("i", 16), ("n", 64)))
    kern = lower(softmax(x, "n"), ("i", "n")).kernels[0]
    _, read, written, trans = kern.stats
    # one exp per element: the sum pass keeps its exps (knob `keep`), the output reads them
    assert trans == 16 * 64
    assert (read, written) == (4 * 16 * 64, 4 * 16 * 64)
    # whatever the output layout, the default order puts the row axis outside
    assert lower(softmax(x, "n"), ("n", "i")).kernels[0].stats.transcendentals == 16 * 64
    # without keep: one exp in the sum, one in the output, still no max recomputation
    assert str(kern.nest({"keep": False})).count("exp") == 2
    assert str(kern.nest()).count("exp") == 1


def attention(i: int = 8, n: int = 32, d: int = 16, e: int = 16, f: int | None = None) -> Term:
    q, k = In("Q", (("i", i), ("d", d))), In("K", (("n", n), ("d", d)))
    v = In("V", (("n", n), ("e", e)))
    s = mul(Dot("d", q, k), Const(0.25))
    if f is None:
        return SoftmaxAvg("n", s, v)
    ss, vs = Split("n", f, s), Split("n", f, v)
    return SoftmaxAvg(f"n/o{f}", LSE(f"n/i{f}", ss), SoftmaxAvg(f"n/i{f}", ss, vs))


@pytest.mark.parametrize("f", [None, 8])
def test_attention_score_once_per_key(f: int | None) -> None:
    kern = lower(attention(f=f), ("i", "e")).kernels[0]
    flops = kern.stats.flops
    dot_flops = 8 * 32 * 16 * 3  # add + mul + the lane combine, once per (i, n)
    assert flops < 2 * dot_flops + 8 * 32 * 16 * 8  # not multiplied by e = 16
    # the vector accumulator over e, with the key loop outside it (the loop lowering:
    # the fused kernel, flash=True by default, is tests/test_flash.py's)
    text = str(lower(attention(f=f), ("i", "e")).kernels[0].nest({"flash": False}))
    assert "array acc" in text and "vector" in text
    env = inputs_for(attention(f=f))
    assert_close(run_program(attention(f=f), ("i", "e"), env, "c"),
                 reference(attention(f=f), ("i", "e"), env))


@pytest.mark.parametrize("stage", [False, True])
def test_split_attention_one_inner_pass_per_block(stage: bool) -> None:
    nest = str(lower(attention(f=8), ("i", "e")).kernels[0].nest({"stage": stage,
                                                                  "flash": False}))
    # LSE of the block comes from the SoftmaxAvg pass: one online pass, or the staged
    # score, max, exp+sum and weighted-sum passes
    assert nest.count("# n/i8") == (4 if stage else 1)
    assert nest.count("reduce  # d") == 1
    assert nest.count("exp") == 2  # block weights (or online update), block rescale


@pytest.mark.parametrize("f", [None, 8])
@pytest.mark.parametrize("knobs", [{"tile.i": 4, "stage": True}, {"tile.i": 2, "stage": False},
                                   {"tile.i": 4, "vec": 4}])
def test_attention_query_row_tile(f: int | None, knobs: dict) -> None:
    """Several query rows per tile: per-row running max and sum, scores staged per row."""
    t = attention(f=f)
    env = inputs_for(t)
    assert_close(run_program(t, ("i", "e"), env, "c", [knobs]), reference(t, ("i", "e"), env))


def test_dot_with_contiguous_reduction_uses_lanes_in_tile() -> None:
    """Q K^T (d at stride 1 in both): a 4x4 tile of dots, each with 16 lanes over d."""
    q, k = In("Q", (("i", 8), ("d", 64))), In("K", (("n", 32), ("d", 64)))
    t = Sum("d", mul(q, k))
    kern = lower(t, ("i", "n")).kernels[0]
    assert (kern.default_knobs()["tile.i"], kern.default_knobs()["tile.n"]) == (4, 4)
    assert "array acc0[256]" in str(kern.nest({"gemm": False}))  # default: a blocked GEMM
    env = inputs_for(t)
    assert_close(run_program(t, ("i", "n"), env, "c"), reference(t, ("i", "n"), env))


def test_grouped_input_dims() -> None:
    x = In("x", ((("h", 2), ("d", 4)), ("n", 3)))
    t = Sum("d", mul(x, x))
    env = {"x": np.arange(24, dtype=np.float32).reshape(8, 3)}
    for target in ("numpy", "c"):
        assert_close(run_program(t, ("n", "h"), env, target), reference(t, ("n", "h"), env))


def test_dot_register_tile() -> None:
    a, b = In("A", (("i", 8), ("k", 32))), In("B", (("k", 32), ("j", 32)))
    kern = lower(Dot("k", a, b), ("i", "j")).kernels[0]
    assert kern.default_knobs()["tile.i"] == 8 and kern.default_knobs()["tile.j"] == 32
    assert "array acc0[256]" in str(kern.nest({"gemm": False}))  # default: a blocked GEMM
    # out laid out (j, i): the vectorized axis is still j, stride 1 in B, last in the order
    knobs = lower(Dot("k", a, b), ("j", "i")).kernels[0].default_knobs()
    assert knobs["order"] == ("i", "j") and knobs["tile.j"] == 32


# -- knobs, identifiers, errors -------------------------------------------------------------

def test_knob_space_and_validation() -> None:
    kern = lower(softmax(In("x", (("i", 16), ("n", 64))), "n"), ("i", "n")).kernels[0]
    space = kern.knob_space()
    assert {"order", "tile.i", "tile.n", "vec", "omp", "tpb"} <= set(space)
    assert space["order"][0] == ("i", "n") and set(space["order"]) == {("i", "n"), ("n", "i")}
    with pytest.raises(CodegenError, match="vec"):
        kern.nest({"vec": 3})
    with pytest.raises(CodegenError, match="unknown knob"):
        kern.nest({"colour": 1})


def test_generated_identifiers_not_from_user_names() -> None:
    reserved = mul(In("out", (("n", 4), ("restrict", 4))), In("i", (("restrict", 4),)))
    t = add(mul(In("int", (("n", 4), ("for", 8))), In("float", (("for", 8),))),
            Sum("restrict", reserved))
    env = inputs_for(t)
    for target in ("numpy", "c"):
        assert_close(run_program(t, ("for", "n"), env, target), reference(t, ("for", "n"), env))
    src = render(lower(t, ("for", "n")), backend="c")
    assert "int*" not in src and " float[" not in src
    if find_nvcc():
        assert compile_cuda(render(lower(t, ("for", "n")), backend="cuda")).ok


def test_output_written_in_place_and_checked() -> None:
    x = In("x", (("i", 4), ("n", 8)))
    lowered = lower(softmax(x, "n"), ("i", "n"))
    exe = build(lowered, "c")
    out = np.full((4, 8), np.nan, np.float32)
    env = inputs_for(softmax(x, "n"))
    exe(env, out)
    assert np.isfinite(out).all()
    with pytest.raises(ValueError, match="out must be"):
        exe(env, np.zeros((8, 4), np.float32))


def test_renderer_without_rule_names_the_op() -> None:
    class NoTanh(CRenderer):
        code_for_op: ClassVar = {k: v for k, v in CRenderer.code_for_op.items() if k != "tanh"}

    lowered = lower(tanh(In("x", (("i", 4),))), ("i",))
    with pytest.raises(CodegenError, match="tanh"):
        NoTanh().render(lowered, lowered.nests())


def test_bad_out_axes() -> None:
    with pytest.raises(CodegenError, match="out_axes"):
        lower(In("x", (("i", 4),)), ("j",))


CUDA_TERMS = {
    "softmax": lambda: softmax(In("x", (("i", 16), ("n", 64))), "n"),
    "attention": lambda: attention(f=8),
    "matmul_eager": lambda: Dot("n", Store(mul(Dot("d", In("Q", (("i", 8), ("d", 16))),
                                                  In("K", (("n", 32), ("d", 16)))), Const(0.5))),
                                In("V", (("n", 32), ("e", 16)))),
    "scalar": lambda: LSE("i", In("x", (("i", 64),))),
    "gelu": lambda: mul(In("x", (("i", 8), ("n", 8))),
                        add(Const(1.0), erf(In("x", (("i", 8), ("n", 8)))))),
}


@pytest.mark.slow
@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not found (PATH or /usr/local/cuda/bin)")
@pytest.mark.parametrize("name", sorted(CUDA_TERMS))
def test_cuda_compiles_for_sm90(name: str) -> None:
    term = CUDA_TERMS[name]()
    report = compile_cuda(render(lower(term), backend="cuda"))
    assert report.ok, report.log
    assert report.kernels and all(k.registers > 0 for k in report.kernels.values())


@pytest.mark.parametrize("value", [-1.5, -0.0, -3e38, 2.0])
def test_negated_negative_literal_compiles_in_c(value: float) -> None:
    """`neg` of a negative constant is `-(-1.5f)`, never the decrement `--1.5f`."""
    x = In("x", (("i", 5),))
    got = run_program(add(x, neg(Const(value))), ("i",), {"x": np.arange(5.0)}, "c")
    np.testing.assert_array_equal(got, (np.arange(5.0) - value).astype(np.float32))
