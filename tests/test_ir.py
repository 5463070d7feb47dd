"""The IR: hash-consing, shapes, s-expressions, structural keys, the interpreter."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kernelsat.interp import evaluate_as
from kernelsat.ir import (
    LSE,
    Const,
    Dot,
    In,
    Max,
    ShapeError,
    SoftmaxAvg,
    Split,
    Store,
    Sum,
    Term,
    add,
    dag_size,
    exp,
    mul,
    neg,
    postorder,
)
from kernelsat.ops import ARITY, REDUCTIONS, Op
from kernelsat.sexpr import SExprError, parse_term, to_sexpr
from kernelsat.testing import assert_equivalent, programs, random_inputs

X = In("x", (("i", 4), ("n", 8)))
Y = In("y", (("n", 8), ("e", 2)))


def test_hash_consing_makes_equal_terms_identical() -> None:
    assert add(X, exp(X)) is add(In("x", (("i", 4), ("n", 8))), exp(X))
    assert Const(-0.0) is Const(0.0)
    assert Const(1.0) is not Const(2.0)


def test_terms_are_immutable() -> None:
    with pytest.raises(AttributeError):
        X.op = Op.NEG  # type: ignore[misc]


def test_shapes_broadcast_by_name() -> None:
    assert dict(mul(X, Y).shape) == {"e": 2, "i": 4, "n": 8}
    assert dict(Sum("n", mul(X, Y)).shape) == {"e": 2, "i": 4}
    assert dict(Dot("n", X, Y).shape) == {"e": 2, "i": 4}
    assert dict(SoftmaxAvg("n", X, Y).shape) == {"e": 2, "i": 4}
    assert dict(Split("n", 4, X).shape) == {"i": 4, "n/i4": 4, "n/o4": 2}


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Sum("k", X), "not an axis of its operand"),
        (lambda: Split("n", 3, X), "does not divide"),
        (lambda: add(X, In("z", (("n", 4),))), "has size 8 and 4"),
        (lambda: SoftmaxAvg("e", X, Y), "scores lack"),
        (lambda: In("w", (("a", 2), ("a", 2))), "twice"),
        (lambda: Const(float("inf")), "finite"),
        (lambda: Term(Op.ADD, (X,)), "takes 2 children"),
    ],
)
def test_ill_formed_terms_raise_shape_error(build, message: str) -> None:
    with pytest.raises(ShapeError, match=message):
        build()


def test_shape_error_shows_the_node_and_its_children() -> None:
    with pytest.raises(ShapeError) as info:
        add(X, In("z", (("n", 4),)))
    text = str(info.value)
    assert "node: add" in text and "child 0" in text and "child 1" in text


def test_dag_printing_and_keys_are_linear() -> None:
    t = X
    for _ in range(200):  # a tree of 2**200 nodes, a DAG of 201
        t = add(t, t)
    assert dag_size(t) == 201
    text = to_sexpr(t)
    assert len(text) < 20_000
    assert parse_term(text) is t
    assert len(t.key) == 32


def test_very_deep_terms_do_not_hit_the_recursion_limit() -> None:
    t = X
    for _ in range(20_000):
        t = neg(t)
    assert parse_term(to_sexpr(t)) is t
    assert t.key


def test_grouped_input_dims_print_and_evaluate() -> None:
    packed = In("q", (("n", 4), (("h", 2), ("d", 3))))
    assert to_sexpr(packed) == "(In q n:4 (h:2 d:3))"
    assert parse_term("(In q n:4 (h:2 d:3))") is packed
    arr = np.arange(24, dtype=np.float64).reshape(4, 6)
    out = evaluate_as(packed, {"q": arr}, ("n", "h", "d"))
    assert np.array_equal(out, arr.reshape(4, 2, 3))


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("(add (In x i:2)", "1:1"),
        ("(bogus (In x i:2))", "1:2"),
        ("(Sum k (In x i:2))", "1:1"),
        ("(Split i two (In x i:4))", "1:10"),
        (")", "1:1"),
    ],
)
def test_parse_errors_have_positions(text: str, where: str) -> None:
    with pytest.raises(SExprError, match=where):
        parse_term(text)


@given(programs())
def test_print_parse_round_trip(t: Term) -> None:
    text = to_sexpr(t)
    assert parse_term(text) is t
    assert to_sexpr(parse_term(text)) == text


@given(programs())
def test_every_node_is_well_formed_and_the_op_table_is_complete(t: Term) -> None:
    for node in postorder(t):
        assert len(node.args) == ARITY[node.op]
        if node.op in REDUCTIONS:
            assert node.axis not in node.shape


def _mutations(t: Term) -> list[tuple[Term, str]]:
    """Ill-formed rebuilds of one node of `t`, each with the error it must raise."""
    out = []
    for node in postorder(t):
        if node.op in REDUCTIONS:
            out.append((node, "absent-axis"))
        if node.op is Op.SPLIT:
            out.append((node, "bad-factor"))
        if node.op is Op.IN and node.shape:  # a 0-dim input binds no axis
            out.append((node, "size-clash"))
    return out


@given(programs(), st.randoms(use_true_random=False))
def test_shape_inference_rejects_mutations(t: Term, rnd) -> None:
    muts = _mutations(t)
    if not muts:
        return
    node, kind = rnd.choice(muts)
    with pytest.raises(ShapeError):
        if kind == "absent-axis":
            Term(node.op, node.args, ("zz",))
        elif kind == "bad-factor":
            n = node.args[0].shape[node.axis]
            Term(Op.SPLIT, node.args, (node.axis, n + 1))
        else:
            axis, size = node.attrs[1][0][0]
            Term(Op.ADD, (node, In("other", ((axis, size + 1),))), ())


def test_structural_key_is_stable_across_processes() -> None:
    t = SoftmaxAvg("n", Dot("e", Y, Y), mul(X, Const(0.5)))
    code = (
        "from kernelsat.sexpr import parse_term; import sys; "
        "print(parse_term(sys.stdin.read()).key)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=to_sexpr(t), capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == t.key


@given(programs(), programs())
def test_equal_keys_iff_identical(a: Term, b: Term) -> None:
    assert (a.key == b.key) == (a is b)


def test_interpreter_online_reductions_match_definitions() -> None:
    s = In("s", (("i", 3), ("n", 8)))
    v = In("v", (("n", 8), ("e", 2)))
    env = random_inputs(s, v, seed=3)
    lse_def = Term(Op.LOG, (Sum("n", exp(s)),))
    assert_equivalent(LSE("n", s), lse_def, env)
    w = exp(add(s, neg(Max("n", s))))
    sm_def = Sum("n", mul(Term(Op.DIV, (w, Sum("n", w))), v))
    assert_equivalent(SoftmaxAvg("n", s, v), sm_def, env)
    tiled = SoftmaxAvg(
        "n/o4",
        LSE("n/i4", Split("n", 4, s)),
        SoftmaxAvg("n/i4", Split("n", 4, s), Split("n", 4, v)),
    )
    assert_equivalent(SoftmaxAvg("n", s, v), tiled, env)
    assert_equivalent(Store(Dot("n", s, v)), Sum("n", mul(s, v)), env)


def test_float32_evaluation_is_close_to_float64() -> None:
    t = Dot("n", X, Y)
    env = random_inputs(t, seed=1)
    a = evaluate_as(t, env, ("i", "e"), np.float32)
    b = evaluate_as(t, env, ("i", "e"))
    assert a.dtype == np.float32
    assert np.allclose(a, b, rtol=1e-5)
