"""Simplification of degenerate programs (issue 18 part 7): the `simplify` rules are
proved and hold on random real inputs, the `zero` fill and the `unit` / `covers`
conditions mean the same to the evaluator, the egglog encoding and the verifier, and
certificates that use them are accepted while tampered ones are rejected."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat import optimize, verify
from kernelsat.codegen import run_program
from kernelsat.codegen.cuda import CUDARenderer
from kernelsat.codegen.cuda_cpu import run_on_cpu
from kernelsat.codegen.lower import lower
from kernelsat.egraph.saturate import saturate
from kernelsat.hardware.measure import TimingProtocol
from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as
from kernelsat.ir import (
    LSE,
    Const,
    In,
    Max,
    SoftmaxAvg,
    Store,
    Sum,
    Term,
    add,
    exp,
    mul,
    postorder,
    sub,
    zero,
)
from kernelsat.ops import Op
from kernelsat.proofs.certificate import make_certificate
from kernelsat.proofs.checker import check
from kernelsat.proofs.library import load_library
from kernelsat.proofs.steps import Step
from kernelsat.proofs.verify import verify_rule
from kernelsat.proofs.verify_numeric import random_env, random_instance
from kernelsat.rewrites.library import library_rules
from kernelsat.rewrites.rule import (
    Covers,
    Rule,
    RuleError,
    Unit,
    apply_at,
    check_condition,
    parse_rule,
)
from kernelsat.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]
RULES = library_rules(["simplify"])
BY_NAME = {r.name: r for r in RULES}


def test_every_simplify_rule_is_proved_for_all_sizes() -> None:
    lib = load_library(["simplify"])
    assert len(lib) == len(RULES) >= 30
    assert all(r.verified in ("smt", "lemmas") for r in lib), {r.name: r.verified for r in lib}


@pytest.mark.parametrize("text", [
    "bad: (sub ?x ?x) => (Const 0.0) [simplify]",  # a shapeless zero drops x's axes
    "bad: (Max ?a ?x) => (Sum ?a ?x) [simplify]",  # only over an axis of size 1
    "bad: (LSE ?a ?x) => (Max ?a ?x) [simplify]",
    "bad: (mul (Sum ?a ?x) (Sum ?a ?y)) => (Sum ?a (mul ?x ?y)) [simplify]",
    "bad: (LSE ?a ?x) => (Sum ?a (exp ?x)) if (unit ?a) [simplify]",
    "bad: (add ?x (zero ?y)) => ?x if (covers ?y ?x) [simplify]",
    "bad: (zero (log ?x)) => (zero ?x) [simplify]",  # log x is undefined for x <= 0
    "bad: (div ?x ?x) => (add (zero ?x) (Const 1.0)) [simplify]",  # x = 0
    "bad: (Sum ?a (add (zero ?x) (Const 1.0))) => (add (zero (Sum ?a ?x)) (Const 1.0)) [simplify]",
    "bad: (LSE ?a (zero ?x)) => (zero (LSE ?a ?x)) [simplify]",  # log |a|, not 0
])
def test_wrong_degenerate_rules_are_rejected(text: str) -> None:
    assert not verify_rule(parse_rule(text)).ok


# -- soundness on random real inputs (the float64 interpreter of both sides) -------------


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31))
def test_rule_holds_on_random_real_inputs(rule: Rule, seed: int) -> None:
    rng = random.Random(seed)
    inst = None
    while inst is None:  # a unit axis is one draw in seven: retry until one comes
        inst = random_instance(rule, rng)
    assert inst.rhs is not None
    for c in rule.conditions:  # the instance satisfies the rule's conditions
        assert check_condition(c, inst.bindings, inst.sizes)
    assert dict(inst.lhs.shape) == dict(inst.rhs.shape)
    env = random_env([inst.lhs, inst.rhs], np.random.default_rng(seed))
    order = tuple(inst.lhs.shape)
    with np.errstate(all="ignore"):
        left = evaluate_as(inst.lhs, env, order)
        right = evaluate_as(inst.rhs, env, order)
    defined = np.isfinite(left)  # log of a negative normal draw: undefined on both sides
    np.testing.assert_array_equal(np.isfinite(right), defined)
    np.testing.assert_allclose(right[defined], left[defined], rtol=1e-9, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(rows=st.integers(1, 5), cols=st.integers(1, 5), seed=st.integers(0, 2**31))
def test_unit_reductions_are_the_element(rows: int, cols: int, seed: int) -> None:
    """Over an axis of size 1 every reduction kind reads its one element."""
    x = In("x", (("i", rows), ("o", 1), ("n", cols)))
    v = In("v", (("o", 1), ("n", cols)))
    env = random_env([x, v], np.random.default_rng(seed))
    want = env["x"][:, 0, :]
    for t in (Sum("o", x), Max("o", x), LSE("o", x)):
        np.testing.assert_allclose(evaluate_as(t, env, ("i", "n")), want, rtol=1e-12)
    got = evaluate_as(SoftmaxAvg("o", x, v), env, ("i", "n"))
    np.testing.assert_allclose(got, np.broadcast_to(env["v"][0], got.shape), rtol=1e-12)


# -- the conditions: one meaning in the evaluator, egglog and the verifier ---------------


def test_unit_and_covers_conditions_evaluate_on_concrete_terms() -> None:
    x1 = In("x", (("i", 3), ("o", 1)))
    x2 = In("y", (("i", 3), ("p", 2)))
    assert check_condition(Unit("a"), {"a": "o"}, dict(x1.all_sizes))
    assert not check_condition(Unit("a"), {"a": "p"}, dict(x2.all_sizes))
    assert not check_condition(Unit("a"), {"a": "q"}, {})  # an unknown axis is not unit
    small = In("s", (("i", 3),))
    assert check_condition(Covers("x", "y"), {"x": x1, "y": small}, {})
    assert not check_condition(Covers("x", "y"), {"x": small, "y": x1}, {})
    lse_unit = BY_NAME["lse-unit"]
    assert apply_at(lse_unit, LSE("o", x1), (), "forward") is Max("o", x1)
    with pytest.raises(RuleError, match="unit"):
        apply_at(lse_unit, LSE("p", x2), (), "forward")
    with pytest.raises(RuleError, match="covers"):
        apply_at(BY_NAME["add-zero-covered"], add(small, zero(x1)), (), "forward")


@pytest.mark.parametrize("size,fires", [(1, True), (2, False)])
def test_egglog_fires_a_unit_rule_only_over_an_axis_of_size_one(size: int, fires: bool) -> None:
    x = In("x", (("i", 3), ("o", size)))
    spec = add(LSE("o", x), Const(1.0))
    sat = saturate(spec, [BY_NAME["lse-unit"]], iters=3)
    assert (sat.firings.get("lse-unit", 0) > 0) is fires


@pytest.mark.parametrize("covered,fires", [(True, True), (False, False)])
def test_egglog_fires_a_covers_rule_only_when_the_shape_is_covered(covered: bool,
                                                                  fires: bool) -> None:
    x = In("x", (("i", 3), ("n", 2)))
    s = Sum("n", x)
    spec = add(x, zero(s)) if covered else add(s, zero(x))
    sat = saturate(spec, [BY_NAME["add-zero-covered"]], iters=3)
    assert (sat.firings.get("add-zero-covered", 0) > 0) is fires


# -- certificates: the checker replays the simplification, tampering is rejected ---------

ZERO_SPEC = (ROOT / "specs" / "degenerate_zero.ks").read_text()
ZERO_PARAMS = {"M": 4, "N": 8}


def _zero_chain() -> tuple[Term, list[Step], Term]:
    spec = load_spec(str(ROOT / "specs" / "degenerate_zero.ks"), ZERO_PARAMS).term
    steps = [Step("sub-self", "forward", (0,), {}),
             Step("sub-self", "forward", (1,), {}),
             Step("zero-of-store", "forward", (0,), {}),
             Step("add-comm", "forward", (), {}),
             Step("add-zero-covered", "forward", (), {})]
    lib = load_library()
    term = spec
    for s in steps:
        term = apply_at(lib.by_name[s.rule], term, s.path, s.direction)
    return spec, steps, term


def test_the_zero_spec_simplifies_to_a_fill_the_checker_accepts() -> None:
    spec, steps, final = _zero_chain()
    x = In("X", (("i", 4), ("n", 8)))
    assert final is zero(x)
    lib = load_library()
    cert = make_certificate(spec, ZERO_SPEC, steps, final, lib, ZERO_PARAMS)
    res = check(cert.to_json())
    assert res.accepted, res.reason
    prog = lower(final, ("i", "n"))
    assert len(prog.kernels) == 1
    nest = prog.kernels[0].nest()
    assert nest.params == ("out",)  # a fill: no buffer is read
    env = {"X": np.random.default_rng(0).standard_normal((4, 8))}
    want = evaluate_as(spec, env, ("i", "n"))
    for backend in ("numpy", "c"):
        got = run_program(final, ("i", "n"), {"X": env["X"].astype(np.float32)}, backend)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("mutate", ["rule", "unit", "covers", "final"])
def test_tampered_simplification_certificates_are_rejected(mutate: str) -> None:
    spec, steps, final = _zero_chain()
    lib = load_library()
    if mutate == "rule":  # add-zero-like needs the same witness on both sides
        steps = [*steps[:-1], Step("add-zero-like", "forward", (), {})]
    elif mutate == "covers":  # drop the add-comm: the zero's witness is not covered
        steps = [*steps[:3], Step("add-zero-covered", "forward", (), {})]
    elif mutate == "final":
        final = zero(In("X", (("i", 4), ("n", 8))))
        steps = steps[:-1]
    cert_spec, text, params = spec, ZERO_SPEC, ZERO_PARAMS
    if mutate == "unit":  # lse-unit over an axis of size 2
        text = "kernel k(N=2)\nin X[i:3, o:N] f32\nout Y[i] = max(o: X[i, o])\n"
        params = {"N": 2}
        cert_spec = parse_spec(text, params=params).term
        final = LSE("o", In("X", (("i", 3), ("o", 2))))
        steps = [Step("lse-unit", "backward", (), {})]
    cert = make_certificate(cert_spec, text, steps, final, lib, params)
    assert not check(cert.to_json()).accepted


# -- the float semantics the README states -----------------------------------------------


def test_inf_and_nan_inputs_give_nan_in_the_spec_and_zero_in_the_fill() -> None:
    """Over the reals x - x = 0 * x = 0; in floats they are NaN for an inf or NaN x, and
    the fill writes 0 there. Finite inputs never make the spec NaN."""
    x = In("x", (("i", 4),))
    env = {"x": np.array([1.0, np.inf, -np.inf, np.nan])}
    with np.errstate(all="ignore"):
        spec = evaluate_as(sub(x, x), env, ("i",))
        times0 = evaluate_as(mul(x, Const(0.0)), env, ("i",))
    fill = evaluate_as(zero(x), env, ("i",))
    assert spec[0] == 0 and np.all(np.isnan(spec[1:])) and np.all(np.isnan(times0[1:]))
    assert np.all(fill == 0)
    big = {"x": np.array([3e38, -3e38, 1e-45, 0.0])}
    assert np.all(evaluate_as(sub(x, x), big, ("i",)) == 0)


def test_zero_never_reads_its_witness_in_generated_code() -> None:
    x = In("X", (("i", 4), ("n", 8)))
    witness = Store(Sum("n", exp(x)))  # would be its own kernel if it were computed
    prog = lower(add(zero(witness), Const(2.0)), ("i",))
    assert len(prog.kernels) == 1 and prog.kernels[0].nest().params == ("out",)
    nodes = list(postorder(prog.kernels[0].term))
    assert any(n.op is Op.ZERO for n in nodes)
    got = run_program(add(zero(witness), Const(2.0)), ("i",),
                      {"X": np.full((4, 8), np.inf, np.float32)}, "c")
    assert np.all(got == 2.0)


# -- end to end: optimize ships the fill and the one-kernel program -----------------------

SMALL = dict(seconds=60, trials=2, knob_budget=1, extract="ilp",
             timing=TimingProtocol(min_runs=3, min_seconds=0.01))


@pytest.mark.slow
@pytest.mark.parametrize("name,expect", [
    ("degenerate_zero", lambda t: t.op is Op.ZERO),
    ("degenerate_reductions", lambda t: not any(n.op is Op.STORE for n in postorder(t))),
])
def test_optimize_ships_the_simplified_program(name: str, expect: Callable[[Term], bool],
                                               tmp_path: Path) -> None:
    program = load_spec(str(ROOT / "specs" / f"{name}.ks"), {"M": 64, "N": 32})
    result = optimize(program, "c", cache_dir=tmp_path / "cache", **SMALL)
    best = result.best
    assert best.proved and best.certificate is not None
    assert verify(best.certificate.to_json()).accepted
    assert expect(best.term)
    prog = lower(best.term, program.out_axes)
    assert len(prog.kernels) == 1
    if name == "degenerate_zero":
        assert prog.kernels[0].nest().params == ("out",)  # a fill reads nothing
    env = random_inputs(program, seed=3)
    got = run_program(best.term, program.out_axes,
                      {k: v.astype(np.float32) for k, v in env.items()}, "c")
    want = evaluate_as(program.term, env, program.out_axes)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_fill_is_a_cuda_kernel_that_takes_only_its_output() -> None:
    x = In("X", (("i", 4), ("n", 8)))
    prog = lower(add(zero(Store(Sum("n", exp(x)))), Const(2.0)), ("i",))
    nests = prog.nests()
    src = CUDARenderer().render(prog, nests)
    assert "__global__ void ks_kernel0(float* __restrict__ out)" in src
    out = run_on_cpu(prog, nests, {"X": np.full((4, 8), np.inf, np.float32)})
    assert np.all(out == 2.0)
