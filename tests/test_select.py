"""Selection, comparisons, index values, -inf and sin/cos (issue 18, parts 2 and 3a):
the spec syntax and its errors, the float64 semantics (fully masked rows), the verifier's
exact selection, the rules of rewrites/select.rules (and wrong ones that must fail), and
the generated code (numpy, C, the CUDA source on the CPU shim and through nvcc) against
the interpreter on random programs and masks, at the mask's edges."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelsat.codegen import lower, render, run_program
from kernelsat.interp import evaluate_as
from kernelsat.ir import (
    LSE,
    Const,
    Idx,
    In,
    Max,
    NegInf,
    SoftmaxAvg,
    Split,
    Sum,
    Term,
    cos,
    exp,
    le,
    lt,
    mul,
    sin,
    where,
)
from kernelsat.ops import Op
from kernelsat.proofs.verify_smt import verify_elementwise
from kernelsat.rewrites.library import library_rules
from kernelsat.rewrites.rule import parse_rule
from kernelsat.sexpr import parse_term
from kernelsat.spec import SpecError, parse_spec
from kernelsat.testing import masked_programs, programs, random_inputs, relative_error

HEAD = "kernel k(N=5, M=4)\nin X[i:N, n:N] f32\nin Y[i:N] f32\n"
SELECT_OPS = frozenset(Op) - {Op.SPLIT, Op.NEGINF}


def _spec(line: str) -> Term:
    return parse_spec(HEAD + line + "\n").term


# -- syntax ---------------------------------------------------------------------------


def test_comparisons_where_axes_and_inf_parse() -> None:
    t = _spec("out Z[i, n] = where(n <= i, X[i, n], -inf)")
    assert repr(t) == "(where (le (Idx n 5) (Idx i 5)) (In X i:5 n:5) NegInf)"
    assert repr(_spec("out Z[i] = Y[i] > 0")) == "(lt (Const 0.0) (In Y i:5))"
    assert repr(_spec("out Z[i] = Y[i] >= i")) == "(le (Idx i 5) (In Y i:5))"
    assert repr(_spec("out Z[i] = (Y[i] == 1) + (Y[i] != 2)")).startswith("(add (eq ")
    assert repr(_spec("out Z[i] = where(Y[i] < 0, inf, Y[i])")) == (
        "(where (lt (In Y i:5) (Const 0.0)) (neg NegInf) (In Y i:5))")
    assert repr(_spec("out Z[i] = sin(i * 0.5) + cos(Y[i])")).startswith("(add (sin (mul (Idx")


def test_comparisons_bind_loosest() -> None:
    t = _spec("out Z[i] = Y[i] + 1 < 2 * Y[i]")
    assert t.op is Op.LT and t.args[0].op is Op.ADD and t.args[1].op is Op.MUL


@pytest.mark.parametrize(("line", "col", "message"), [
    ("out Z[i] = Y[i] < 1 < 2", 21, "a second comparison '<' in a chain"),
    ("out Z[i] = where(Y[i], 1)", 12, "where takes 3 arguments, got 2"),
    ("out Z[i] = Y[i] <> 2", 18, "unexpected '>'"),
    ("out Z[i] = Y[i] + q", 19, "unknown name 'q'"),
    ("out Z[i] = Y[i] =< 2", 17, "unexpected '=<'|unexpected '='|expected"),
])
def test_errors_name_the_place(line: str, col: int, message: str) -> None:
    with pytest.raises(SpecError, match=message) as info:
        parse_spec(HEAD + line + "\n", "m.ks")
    assert (info.value.path, info.value.line) == ("m.ks", 4)
    if "|" not in message:
        assert info.value.col == col


def test_an_input_named_like_an_axis_is_the_input() -> None:
    t = parse_spec("kernel k(N=3)\nin n[i:N] f32\nout Z[i] = n\n").term
    assert t.op is Op.IN


def test_index_values_are_renamed_with_their_intermediate() -> None:
    t = parse_spec("kernel k(N=3)\nin X[i:N] f32\nP[i] = X[i] * i\nout Z[j] = P[j]\n").term
    assert Idx("j", 3) in {n for n in _nodes(t)}


def _nodes(t: Term) -> list[Term]:
    from kernelsat.ir import postorder

    return list(postorder(t))


def test_sexpr_round_trip() -> None:
    text = "(where (le (Idx n 3) (Idx i 4)) (sin (In x i:4)) NegInf)"
    assert repr(parse_term(text)) == text


# -- semantics ----------------------------------------------------------------------------


def test_fully_masked_rows_have_defined_values() -> None:
    """Every score -inf: LSE is -inf (log 0), Max -inf, SoftmaxAvg 0 (all weights 0), in
    the interpreter and in generated code."""
    x = In("x", (("i", 3), ("n", 4)))
    v = In("v", (("n", 4), ("e", 2)))
    masked = where(lt(Idx("n", 4), Idx("i", 3)), x, NegInf())  # row i = 0 fully masked
    env = random_inputs(x, v)
    for term, row0 in ((LSE("n", masked), -np.inf), (Max("n", masked), -np.inf),
                       (SoftmaxAvg("n", masked, v), 0.0), (Sum("n", exp(masked)), 0.0)):
        axes = tuple(sorted(term.shape))
        want = evaluate_as(term, env, axes)
        k = axes.index("i")
        assert np.all(np.take(want, 0, axis=k) == row0)
        assert np.all(np.isfinite(np.take(want, [1, 2], axis=k)))
        for backend in ("numpy", "c"):
            got = run_program(term, axes, {k: a.astype(np.float32) for k, a in env.items()},
                              backend)
            assert relative_error(got, want) < 1e-5, (backend, term)


def test_fully_masked_key_blocks_in_the_split_form() -> None:
    """SoftmaxAvg over blocks of keys: a block every score of which is masked contributes
    nothing (its LSE is -inf, its average 0), never 0 * NaN."""
    n, f = 8, 4
    s = In("s", (("i", n), ("n", n)))
    v = In("v", (("n", n), ("e", 3)))
    masked = where(le(Idx("n", n), Idx("i", n)), s, NegInf())
    whole = SoftmaxAvg("n", masked, v)
    o, inner = "n/o4", "n/i4"
    ms, vs = Split("n", f, masked), Split("n", f, v)
    split = SoftmaxAvg(o, LSE(inner, ms), SoftmaxAvg(inner, ms, vs))
    env = random_inputs(s, v)
    want = evaluate_as(whole, env, ("e", "i"))
    assert relative_error(evaluate_as(split, env, ("e", "i")), want) < 1e-12
    for backend in ("numpy", "c"):
        got = run_program(split, ("e", "i"), {k: a.astype(np.float32) for k, a in env.items()},
                          backend)
        assert relative_error(got, want) < 1e-5, backend


# -- generated code against the interpreter ------------------------------------------------


def _check_backends(term: Term, seed: int, backends: tuple[str, ...] = ("numpy", "c")) -> None:
    axes = tuple(sorted(term.shape))
    env = random_inputs(term, seed=seed)
    with np.errstate(all="ignore"):
        want = evaluate_as(term, env, axes)
        want32 = evaluate_as(term, {k: a.astype(np.float32).astype(np.float64)
                                    for k, a in env.items()}, axes)
    if relative_error(want32, want) > 1e-4:
        return  # a comparison on the edge flips with float32 inputs: not the codegen's error
    for backend in backends:
        with np.errstate(all="ignore"):
            got = run_program(term, axes, {k: a.astype(np.float32) for k, a in env.items()},
                              backend)
        assert relative_error(got, want) < 1e-4, (backend, term)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(max_depth=4, ops=SELECT_OPS), st.integers(0, 3))
def test_random_programs_with_where_comparisons_and_positions(term: Term, seed: int) -> None:
    _check_backends(term, seed)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(masked_programs(), st.integers(0, 3))
def test_random_masked_reductions(term: Term, seed: int) -> None:
    _check_backends(term, seed)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(masked_programs(sizes=(3, 8)), st.integers(0, 3))
def test_masked_reductions_in_the_cuda_source_on_the_cpu(term: Term, seed: int) -> None:
    from kernelsat.codegen.cuda_cpu import run_on_cpu

    axes = tuple(sorted(term.shape))
    lowered = lower(term, axes)
    env = random_inputs(term, seed=seed)
    with np.errstate(all="ignore"):
        out = run_on_cpu(lowered, lowered.nests(), env)
        want = evaluate_as(term, env, axes)
    assert relative_error(out, want) < 1e-4


def test_cuda_source_compiles_with_nvcc() -> None:
    from kernelsat.codegen.cuda import compile_cuda, find_nvcc

    if find_nvcc() is None:
        pytest.skip("nvcc not installed")
    x = In("x", (("i", 64), ("n", 64)))
    v = In("v", (("n", 64), ("e", 8)))
    pos = mul(Idx("i", 64), Const(0.01))
    term = SoftmaxAvg("n", where(le(Idx("n", 64), Idx("i", 64)), mul(x, cos(pos)), NegInf()),
                      mul(v, sin(Idx("e", 8))))
    source = render(lower(term, ("e", "i")), None, "cuda")
    report = compile_cuda(source, "sm_90")
    assert report.ok, report.log[-2000:]


def test_c_renders_the_select_as_a_ternary() -> None:
    """A `where` renders as a ternary (gcc makes it a blend in a vectorized loop: checked
    with -fopt-info-vec, see docs/spec.md), not a branch."""
    x = In("x", (("i", 256),))
    source = render(lower(where(lt(x, Const(0.0)), Const(0.0), x), ("i",)), None, "c")
    assert "?" in source and "!= 0.0f" in source


# -- the verifier and the rules ----------------------------------------------------------------


def test_select_rules_verify() -> None:
    for rule in library_rules(["select"]):
        assert verify_elementwise(rule).ok, rule.name


@pytest.mark.parametrize("text", [
    "bad-swap: (where ?c ?x ?y) => (where ?c ?y ?x) [select]",
    "bad-lt: (lt ?x ?y) => (lt ?y ?x) [select]",
    "bad-le: (le ?x ?y) => (lt ?x ?y) [select]",
    "bad-mask: (where ?c ?x (Const 0.0)) => (mul ?c ?x) [select]",
    "bad-sin: (sin (neg ?x)) => (sin ?x) [select]",
    "bad-ne: (ne ?x ?y) => (eq ?x ?y) [select]",
])
def test_wrong_rules_are_refuted(text: str) -> None:
    assert not verify_elementwise(parse_rule(text)).ok


def test_a_symbolic_position_is_its_integer() -> None:
    from kernelsat.proofs import verify_sym

    t = mul(Idx("i", 3), Const(2.0))
    got = verify_sym.evaluate(t, {}).array
    assert [float(str(x)) for x in got] == [0.0, 2.0, 4.0]
    neg_inf = verify_sym.evaluate(NegInf(), {}).array.item()
    assert str(neg_inf) == verify_sym.NEGINF_VAR


def test_relu6_where_spec_clamps_at_both_ends() -> None:
    """specs/relu6_where.ks on inputs that reach both clamps (the reference test's inputs
    stay inside (-1.5, 1.5)), in the interpreter and in C."""
    from pathlib import Path

    from kernelsat.spec import load_spec

    prog = load_spec(Path(__file__).parent.parent / "specs" / "relu6_where.ks", {"M": 4, "N": 9})
    x = np.linspace(-10.0, 10.0, 36).reshape(4, 9)
    want = np.clip(x, 0.0, 6.0)
    assert np.array_equal(evaluate_as(prog.term, {"X": x}, prog.out_axes), want)
    got = run_program(prog.term, prog.out_axes, {"X": x.astype(np.float32)}, "c")
    assert np.array_equal(got, want.astype(np.float32))


# -- the fused attention over masked scores (codegen/flash.py) ------------------------------


def _masked_attention(n: int, m: int, mask: str) -> Term:
    from kernelsat.ir import Dot, add, div, eq, sqrt, sub

    q = In("Q", (("h", 2), ("i", m), ("d", 8)))
    k = In("K", (("h", 2), ("n", n), ("d", 8)))
    v = In("V", (("h", 2), ("n", n), ("e", 3)))
    i, j = Idx("i", m), Idx("n", n)
    cond = {"causal": le(j, i), "window": mul(le(j, i), lt(sub(i, j), Const(5.0))),
            "shifted": le(j, add(i, Const(40.0))), "diagonal": eq(j, i),
            "first-row-empty": lt(j, i)}[mask]
    return SoftmaxAvg("n", where(cond, div(Dot("d", q, k), sqrt(Const(8.0))), NegInf()), v)


@pytest.mark.parametrize("mask", ["causal", "window", "shifted", "diagonal", "first-row-empty"])
@pytest.mark.parametrize(("n", "m"), [(70, 70), (300, 33), (129, 200)])
def test_fused_attention_over_masked_scores(mask: str, n: int, m: int) -> None:
    """The fused kernel runs on masked scores and skips fully masked key blocks (interval
    bounds of the mask over the block): equal to the interpreter for every key-block size
    and packing, fully masked rows (0) included."""
    from kernelsat.codegen import build
    from kernelsat.codegen.flash import find_flash

    term = _masked_attention(n, m, mask)
    axes = ("e", "h", "i")
    lowered = lower(term, axes)
    assert find_flash(lowered.kernels[-1]) is not None
    env = random_inputs(term, seed=1)
    want = evaluate_as(term, env, axes)
    space = lowered.kernels[-1].knob_space()
    assert space["keys"][0] == 64  # masked: small key blocks first (more of them skipped)
    for keys in space["keys"]:
        for pack in space["pack"]:
            exe = build(lowered, "c", [{"flash": True, "keys": keys, "pack": pack}])
            out = np.empty(lowered.buffers["out"].shape, np.float32)
            exe({k: a.astype(np.float32) for k, a in env.items()}, out)
            assert relative_error(out, want) < 1e-5, (keys, pack)


def test_block_skip_is_emitted_only_for_index_masks() -> None:
    from kernelsat.codegen.flash import block_masked
    from kernelsat.codegen.loops import Affine, Call, IndexValue, Lit, Ref

    i, n = IndexValue(Affine.var("r")), IndexValue(Affine.var("k"))
    causal = Call("where", (Call("le", (n, i)), Ref("t0"), Lit(-np.inf)))
    assert block_masked(causal, "r", "k", repr) is not None
    data_mask = Call("where", (Call("le", (Ref("t0"), i)), Ref("t0"), Lit(-np.inf)))
    assert block_masked(data_mask, "r", "k", repr) is None
    zero_fill = Call("where", (Call("le", (n, i)), Ref("t0"), Lit(0.0)))
    assert block_masked(zero_fill, "r", "k", repr) is None


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("mask", ["causal", "first-row-empty"])
def test_fused_masked_attention_in_the_cuda_source_on_the_cpu(mask: str) -> None:
    from kernelsat.codegen.cuda_cpu import run_on_cpu

    term = _masked_attention(70, 33, mask)
    axes = ("e", "h", "i")
    lowered = lower(term, axes)
    env = random_inputs(term, seed=2)
    out = run_on_cpu(lowered, lowered.nests([{"flash": True}]), env)
    assert relative_error(out, evaluate_as(term, env, axes)) < 1e-5


def test_fused_masked_attention_compiles_with_nvcc_and_skips_blocks() -> None:
    from kernelsat.codegen.cuda import compile_cuda, find_nvcc

    if find_nvcc() is None:
        pytest.skip("nvcc not installed")
    lowered = lower(_masked_attention(256, 256, "window"), ("e", "h", "i"))
    source = render(lowered, [{"flash": True}], "cuda")
    assert "continue;" in source and "ks_l > 0.0f" in source
    report = compile_cuda(source, "sm_90")
    assert report.ok, report.log[-2000:]
