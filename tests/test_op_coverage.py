"""Every op is covered by every table that reads the op table (`kernelsat.ops.OPS`).

Adding an op is one row of `OPS`; these tests fail, naming the op and the table, when a
consumer that cannot derive its entry from that row (a rewrite family, an axiom hook)
lacks one, or when a row's semantics disagree with each other (the symbolic definition
against the numpy function, the positivity rule against the values)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat import ops
from kernelsat.codegen.c import CRenderer
from kernelsat.codegen.cuda import CUDARenderer
from kernelsat.egraph.render import CONSTRUCTOR, shape_value
from kernelsat.extract.rl_env import N_NODE, node_table, op_features
from kernelsat.interp import EVAL
from kernelsat.ir import Term
from kernelsat.macros import ELEMENTWISE as SPEC_FUNCTIONS
from kernelsat.ops import OPS, Op
from kernelsat.proofs import axioms, normalize, verify_sym
from kernelsat.rewrites.library import library_rules

ELEMENTWISE = sorted(ops.ELEMENTWISE, key=str)
NAMED = [op for op in ELEMENTWISE if OPS[op].infix is None]


def test_every_op_has_one_row_and_the_property_sets_partition_the_kinds() -> None:
    assert set(OPS) == set(Op)
    sets = {"UNARY": ops.UNARY, "BINARY": ops.BINARY, "REDUCTIONS": ops.REDUCTIONS,
            "LEAVES": ops.LEAVES, "COMMUTATIVE": ops.COMMUTATIVE,
            "ASSOCIATIVE": ops.ASSOCIATIVE, "MONOID_REDUCTIONS": ops.MONOID_REDUCTIONS,
            "ONLINE": ops.ONLINE, "TRANSCENDENTAL": ops.TRANSCENDENTAL,
            "UNINTERPRETED": ops.UNINTERPRETED}
    for name, members in sets.items():
        assert members <= set(Op), name
    assert not ops.UNARY & ops.BINARY
    assert ops.COMMUTATIVE | ops.ASSOCIATIVE <= ops.BINARY
    assert ops.MONOID_REDUCTIONS | ops.ONLINE <= ops.REDUCTIONS
    assert ops.TRANSCENDENTAL | ops.UNINTERPRETED <= ops.UNARY
    for op, info in OPS.items():
        assert ops.ARITY[op] == info.arity and ops.FLOPS_PER_ELEMENT[op] == info.flops
        assert ops.BY_NAME[op.value] is op


@pytest.mark.parametrize("op", list(Op), ids=str)
def test_every_op_is_in_the_interpreter_the_symbolic_semantics_and_egglog(op: Op) -> None:
    if op not in ops.LEAVES:
        assert op in EVAL, f"kernelsat.interp.EVAL lacks {op.value}"
        assert op in verify_sym.EVAL, f"proofs.verify_sym.EVAL lacks {op.value}"
    assert op in CONSTRUCTOR
    kids = [f"s{i}" for i in range(OPS[op].arity)]
    if op is not Op.IN:
        shape_value(op, ["a", "f"], kids)  # raises for an op it has no shape rule for
    assert op_features(op).shape == (N_NODE - 25 - 14,)


@pytest.mark.parametrize("op", ELEMENTWISE, ids=str)
def test_every_elementwise_op_renders_in_c_and_cuda(op: Op) -> None:
    args = ["a", "b", "c"][: OPS[op].arity]
    for renderer in (CRenderer, CUDARenderer):
        code = renderer.code_for_op[op.value](*args)
        assert all(a in code for a in args), (renderer.__name__, op, code)


@pytest.mark.parametrize("op", NAMED, ids=str)
def test_every_named_elementwise_op_is_callable_in_specs(op: Op) -> None:
    from kernelsat.spec import parse_spec

    assert SPEC_FUNCTIONS[op.value].arity == OPS[op].arity
    call = f"{op.value}({', '.join(['X[i]'] * OPS[op].arity)})"
    prog = parse_spec(f"kernel k(N=4)\nin X[i:N] f32\nout Y[i] = {call}\n")
    assert prog.term.op is op


@pytest.mark.parametrize("op", sorted(ops.UNARY - {Op.NEG}, key=str), ids=str)
def test_every_unary_op_has_a_tiling_rule(op: Op) -> None:
    names = {r.name for r in library_rules(["tiling"])}
    assert f"split-{op.value}" in names


def test_uninterpreted_functions_are_one_list() -> None:
    names = {op.value for op in ops.UNINTERPRETED}
    assert set(axioms.FUNCTIONS) == names == normalize.FUNCTIONS
    import z3

    ctx = z3.Context()
    x = z3.Real("x", ctx)
    for name in names:  # every one has its instance axioms (raises for a missing hook)
        f = axioms.function(name, ctx)
        assert axioms.instances(name, x, f(x))


REALS = st.floats(-30, 30).filter(lambda v: v == 0 or abs(v) > 1e-6)  # no overflow of 1/v


@settings(max_examples=60, deadline=None)
@given(REALS, REALS, st.sampled_from([0.0, 1.0, -2.5]))
def test_symbolic_meaning_equals_the_numpy_semantics(x: float, y: float, z: float) -> None:
    """Each elementwise op's symbolic meaning (primitive, uninterpreted or its definition),
    evaluated in float64, is the interpreter's value wherever the op is defined."""
    for op in ELEMENTWISE:
        fn = OPS[op].numpy
        assert fn is not None
        args = [x, y, z][: OPS[op].arity]
        with np.errstate(all="ignore"):
            want = float(fn(*(np.float64(a) for a in args)))
        if not math.isfinite(want):
            continue
        dom: list[normalize.Sym] = []
        s = verify_sym.SCALAR[op](*(normalize.var(n) for n in "xyz"[: len(args)]), dom)
        got = verify_sym.to_float(s, {"x": x, "y": y, "z": z})
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), (op, x, y)


@settings(max_examples=60, deadline=None)
@given(st.floats(-80, 80, allow_nan=False), st.floats(0.001, 80))
def test_positivity_rules_hold_on_values(x: float, pos: float) -> None:
    """An op the table calls positive (always, or given positive children) is positive."""
    for op in ELEMENTWISE:
        kind, kids = ops.POSITIVITY.get(op, ops.NEVER)
        if kind == "never":
            continue
        fn = OPS[op].numpy
        assert fn is not None
        args = [np.float64(pos if (kind != "always" and i in kids) else x)
                for i in range(OPS[op].arity)]
        if kind == "any":
            args = [np.float64(pos), np.float64(x)]
        assert float(fn(*args)) > 0 or (kind == "always" and float(fn(*args)) == 0.0), (op, args)


def test_rl_features_have_a_fixed_width_for_every_op() -> None:
    from kernelsat.egraph.snapshot import ENode, Snapshot

    nodes = [ENode(Op.IN, ("x",), ())] + [ENode(op, (), (0,) * OPS[op].arity)
                                          for op in ELEMENTWISE]
    n = len(nodes)
    snap = Snapshot(nodes, np.arange(n), [[i] for i in range(n)], [{}] * n, 1)
    rows = node_table(snap, 1, [1.0] * n)
    assert rows.shape == (n + 1, N_NODE)
    props = rows[1:n, 25 + 14:]
    assert len({tuple(r) for r in props}) > 1 and all(r.any() for r in props)


# -- every elementwise op in the generated code --------------------------------------


POINTS = np.array([-100.0, -88.8, -30.0, -3.0, -0.5, 0.0, 1e-3, 0.7, 3.0, 20.0, 88.8, 100.0])


@pytest.mark.parametrize("backend", ["numpy", "c"])
@pytest.mark.parametrize("op", ELEMENTWISE, ids=str)
def test_every_elementwise_op_runs_and_equals_the_float64_reference(op: Op,
                                                                    backend: str) -> None:
    """Each backend's float32 value of `op` equals the float64 interpreter's, relative to
    its size, wherever that is finite; on large arguments too (no intermediate overflow:
    `softplus(100)` is 100, not `log(1 + inf)`)."""
    from kernelsat.codegen import run_program
    from kernelsat.interp import evaluate_as
    from kernelsat.ir import In

    n = len(POINTS)
    x = In("x", (("i", n),))
    y = In("y", (("i", n),))
    z = In("z", (("i", n),))
    args = (x, y, z)[: OPS[op].arity]
    term = Term(op, args)
    xs = POINTS.copy()
    if op in (Op.LOG, Op.SQRT):
        xs = np.abs(xs) + 0.25
    env = {"x": xs, "y": np.linspace(-2.0, 5.0, n) + 0.1}
    env["z"] = np.tile([0.0, 1.0, -2.0], n)[:n]  # a condition: zero and nonzero
    # the reference on the float32 inputs: the op's error, not the inputs' rounding
    # (sin(88.8) moves by 2e-6 relative between 88.8 and its float32 neighbour)
    env = {k: v.astype(np.float32).astype(np.float64) for k, v in env.items()
           if k in "xyz"[: OPS[op].arity]}
    with np.errstate(all="ignore"):
        want = evaluate_as(term, env, ("i",), np.float64)
    with np.errstate(all="ignore"):
        got = run_program(term, ("i",), {k: v.astype(np.float32) for k, v in env.items()},
                          backend)
    fits = np.isfinite(want) & (np.abs(want) < np.finfo(np.float32).max)
    tiny = np.finfo(np.float32).tiny  # float32 flushes what is below it
    np.testing.assert_allclose(got[fits], want[fits], rtol=2e-6, atol=tiny)


def test_softplus_is_stable_in_float32() -> None:
    from kernelsat.codegen import run_program
    from kernelsat.ir import In

    x = In("x", (("i", 4),))
    vals = np.array([1e4, 100.0, -100.0, -1e4], np.float32)
    for backend in ("numpy", "c"):
        got = run_program(Term(Op.SOFTPLUS, (x,)), ("i",), {"x": vals}, backend)
        assert got[0] == 1e4 and got[1] == 100.0, backend
        assert 0 < got[2] < 1e-43 or got[2] == 0.0
        assert got[3] == 0.0


# -- the static float analysis (issue 19 part 2) ----------------------------------------


def _float_sample(op: Op) -> Term:
    """A small term whose root is `op` (every kind of op; a new layout or leaf op needs
    its line here and its rule in `kernelsat.floatsafe`)."""
    from kernelsat.ir import Const, Idx, In, NegInf, Read, Split, Store

    x = In("x", (("i", 4), ("n", 4)))
    samples = {Op.IN: x, Op.CONST: Const(2.0), Op.IDX: Idx("i", 4), Op.NEGINF: NegInf(),
               Op.SPLIT: Split("i", 2, x), Op.STORE: Store(x),
               Op.READ: Read(x, {"i": ({"j": 1}, -1), "n": ({"n": 1}, 0)}, {"j": 4, "n": 4},
                             pad=float("-inf")),
               Op.GATHER: Term(Op.GATHER, (x, In("l", (("b", 3),))), ("n",))}
    if op in samples:
        return samples[op]
    kind = OPS[op].kind
    assert kind in ("elementwise", "reduction"), f"no float-analysis sample for {op.value}"
    return Term(op, (x,) * OPS[op].arity, ("n",) if kind == "reduction" else ())


@pytest.mark.parametrize("op", list(Op), ids=str)
def test_every_op_has_a_float_safety_rule(op: Op) -> None:
    """`kernelsat.floatsafe.analyze` is total over the op table, and its value for the
    sample holds the float32 interpreter's values."""
    from kernelsat.floatsafe import analyze, data_range, interval
    from kernelsat.interp import evaluate

    term = _float_sample(op)
    result = analyze(term, {"x": data_range(), "l": interval(0.0, 3.0)})
    mags = np.linspace(0.5, 1.5, 16).reshape(4, 4)  # data: magnitudes 0.5-1.5, both signs
    env = {"x": mags * np.where(np.arange(16).reshape(4, 4) % 3, 1.0, -1.0),
           "l": np.array([0, 3, 1], np.int32)}
    with np.errstate(all="ignore"):
        out = np.asarray(evaluate(term, env, np.float32).array, np.float64)
    lo, hi = result.value.hull()
    finite = out[np.isfinite(out)]
    assert ((finite >= lo - 1e-5) & (finite <= hi + 1e-5)).all(), (op, result.value, out)
    if np.isneginf(out).any():
        assert result.value.ninf, (op, result.value)
