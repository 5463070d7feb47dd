"""Attacks on constant folding: the fold rules are proved over the reals, so a fold must
compute exactly what the proof speaks of, or not happen.

Before: folds ran in float64, so a chain of library rules turned `1` into
`(1 + 1e16) - 1e16`, folded `1 + 1e16` to `1e16`, and proved `softmax(X) = softmax(X) * 0`.
Now a fold is exact (rationals) and refused when no float64 constant holds its exact
value, fold rules run forward only, and an inexact fold egglog makes has no chain.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.egraph.saturate import saturate
from kernelsat.hardware.measure import TimingProtocol
from kernelsat.ir import Const, In, Term, add, div, max_, min_, mul, neg, postorder, recip, sub
from kernelsat.ops import Op
from kernelsat.proofs.certificate import make_certificate
from kernelsat.proofs.checker import CheckResult, check, shipped_library
from kernelsat.proofs.explain import ExplainError, explain
from kernelsat.proofs.steps import Step
from kernelsat.rewrites.rule import ATTR_FUNS, RuleError, apply_at
from kernelsat.spec import parse_spec

SPECS = Path(__file__).resolve().parents[2] / "specs"
BIG = 1e16  # 1e16 + 1 is not a float64: it rounds to 1e16
MAX = sys.float_info.max
TINY = 5e-324  # the smallest subnormal


def _softmax() -> Term:
    return parse_spec((SPECS / "softmax.ks").read_text(), "softmax.ks", {"M": 2, "N": 4}).term


def _check(spec: Term, steps: list[Step], claimed: Term) -> CheckResult:
    """Check the certificate claiming that `steps` take `spec` to `claimed`."""
    lib = shipped_library()
    return check(make_certificate(spec, "", steps, claimed, lib), lib)


def _rejected(result: CheckResult, step: int, *fragments: str) -> None:
    assert not result.accepted, result.reason
    assert result.failed_step == step, result.reason
    for f in fragments:
        assert f in result.reason, (f, result.reason)


# -- the chain, through the checker -------------------------------------------------


def test_softmax_times_zero_chain_is_rejected() -> None:
    """softmax(X) -> softmax(X)*1 -> *(1+0) -> *(1+(1e16-1e16)) -> ... -> softmax(X)*0."""
    steps = [
        Step("mul-one", "backward", (), {}),
        Step("add-zero", "backward", (1,), {}),
        Step("fold-sub", "backward", (1, 1), {"c": BIG, "d": BIG}),  # 0 -> 1e16 - 1e16
        Step("sub-to-add-neg", "forward", (1, 1), {}),
        Step("add-assoc", "backward", (1,), {}),
        Step("fold-add", "forward", (1, 0), {}),  # 1 + 1e16 -> 1e16 in float64
        Step("fold-neg", "forward", (1, 1), {}),
        Step("fold-add", "forward", (1,), {}),  # 1e16 + -1e16 -> 0
    ]
    s = _softmax()
    _rejected(_check(s, steps, mul(s, Const(0.0))), 2, "fold-sub", "forward only")


def test_inexact_fold_is_rejected_even_with_only_forward_folds() -> None:
    """The spec itself holds 1 + (1e16 - 1e16) (= 1 in the reals and in float64); the only
    fold that reaches softmax(X) * 0 is the inexact 1 + 1e16."""
    s = _softmax()
    spec = mul(s, add(Const(1.0), sub(Const(BIG), Const(BIG))))
    steps = [
        Step("sub-to-add-neg", "forward", (1, 1), {}),
        Step("add-assoc", "backward", (1,), {}),
        Step("fold-add", "forward", (1, 0), {}),
        Step("fold-neg", "forward", (1, 1), {}),
        Step("fold-add", "forward", (1,), {}),
    ]
    _rejected(_check(spec, steps, mul(s, Const(0.0))), 2, "fold-add", "not exactly a float64")


def test_an_exact_fold_is_still_accepted() -> None:
    s = _softmax()
    spec = mul(s, add(Const(0.5), Const(0.5)))
    steps = [Step("fold-add", "forward", (1,), {}), Step("mul-one", "forward", (), {})]
    lib = shipped_library()
    result = check(make_certificate(spec, "", steps, s, lib), lib)
    assert result.accepted, result.reason


# -- each fold rule on the constants a float64 cannot hold ---------------------------------

INEXACT: list[tuple[str, Term]] = [
    ("fold-add", add(Const(1.0), Const(BIG))),
    ("fold-add", add(Const(0.1), Const(0.2))),
    ("fold-add", add(Const(MAX), Const(MAX))),  # overflow to inf
    ("fold-sub", sub(Const(BIG), Const(-1.0))),
    ("fold-sub", sub(Const(-MAX), Const(MAX))),
    ("fold-mul", mul(Const(0.1), Const(3.0))),
    ("fold-mul", mul(Const(1e200), Const(1e200))),  # overflow
    ("fold-mul", mul(Const(1e-200), Const(1e-200))),  # underflow to 0
    ("fold-mul", mul(Const(TINY), Const(0.5))),  # below the smallest subnormal
    ("fold-div", div(Const(1.0), Const(3.0))),
    ("fold-div", div(Const(1.0), Const(0.0))),  # inf / NaN never folds
    ("fold-div", div(Const(0.0), Const(0.0))),
    ("fold-div", div(Const(MAX), Const(0.5))),
    ("fold-recip", recip(Const(3.0))),
    ("fold-recip", recip(Const(0.0))),
    ("fold-recip", recip(Const(TINY))),  # 2^1074 overflows
]


@pytest.mark.parametrize(("rule", "term"), INEXACT, ids=lambda x: str(x)[:40])
def test_a_fold_no_float64_holds_is_refused(rule: str, term: Term) -> None:
    with pytest.raises(RuleError, match=r"float64|nonzero"):
        apply_at(shipped_library().by_name[rule], term, (), "forward")


EXACT: list[tuple[str, Term, float]] = [
    ("fold-add", add(Const(BIG), Const(2.0)), BIG + 2),
    ("fold-sub", sub(Const(0.75), Const(0.25)), 0.5),
    ("fold-mul", mul(Const(MAX), Const(0.5)), MAX / 2),
    ("fold-mul", mul(Const(TINY), Const(2.0)), 2 * TINY),
    ("fold-div", div(Const(1.0), Const(1024.0)), 2.0 ** -10),
    ("fold-recip", recip(Const(0.25)), 4.0),
    ("fold-neg", neg(Const(MAX)), -MAX),
    ("fold-max", max_(Const(0.1), Const(0.2)), 0.2),
    ("fold-min", min_(Const(-MAX), Const(TINY)), -MAX),
]


@pytest.mark.parametrize(("rule", "term", "value"), EXACT, ids=lambda x: str(x)[:40])
def test_an_exact_fold_folds(rule: str, term: Term, value: float) -> None:
    assert apply_at(shipped_library().by_name[rule], term, (), "forward") is Const(value)


finite = st.floats(allow_nan=False, allow_infinity=False)
OPS: dict[str, tuple[Callable[[Term, Term], Term], Callable[[Fraction, Fraction], Fraction]]] = {
    "fold-add": (add, lambda a, b: a + b), "fold-sub": (sub, lambda a, b: a - b),
    "fold-mul": (mul, lambda a, b: a * b), "fold-div": (div, lambda a, b: a / b),
    "fold-max": (max_, max), "fold-min": (min_, min)}
"""Each binary fold rule: the term it folds and its exact value."""


def _exact_value(q: Fraction) -> float | None:
    try:
        f = float(q)
    except OverflowError:
        return None
    return f if math.isfinite(f) and Fraction(f) == q else None


@settings(max_examples=200, deadline=None)
@given(rule=st.sampled_from(sorted(OPS)), c=finite, d=finite)
def test_a_fold_happens_exactly_when_a_float64_holds_the_exact_result(
        rule: str, c: float, d: float) -> None:
    build, exact = OPS[rule]
    term = build(Const(c), Const(d))
    a, b = Fraction(c + 0.0), Fraction(d + 0.0)
    want = None if rule == "fold-div" and b == 0 else _exact_value(exact(a, b))
    try:
        out = apply_at(shipped_library().by_name[rule], term, (), "forward")
    except RuleError:
        assert want is None
        return
    assert want is not None and out is Const(want)


@settings(max_examples=60, deadline=None)
@given(c=finite, d=finite)
def test_a_fold_never_runs_backward(c: float, d: float) -> None:
    lib = shipped_library()
    for rule in lib.rules:
        if rule.family != "constfold":
            continue
        assert rule.forward_only
        with pytest.raises(RuleError, match="forward only"):
            apply_at(rule, Const(c), (), "backward", {"c": c, "d": d})


def test_attribute_arithmetic_refuses_non_finite_operands() -> None:
    for bad in (math.inf, -math.inf, math.nan):
        for fun in ("+", "-", "*", "/", "max", "min"):
            with pytest.raises(RuleError):
                ATTR_FUNS[fun]([bad, 1.0], {})
        with pytest.raises(RuleError):
            ATTR_FUNS["neg"]([bad], {})


# -- the e-graph: egglog folds in f64, but such a firing is never explained ----------------


@pytest.mark.parametrize(("a", "b"), [(1.0, BIG), (0.1, 0.2), (MAX, MAX / 2)])
def test_an_inexact_egglog_fold_has_no_chain(a: float, b: float) -> None:
    lib = shipped_library()
    rules = list(lib.family("constfold"))
    x = In("x", (("i", 2),))
    spec = mul(x, add(Const(a), Const(b)))
    sat = saturate(spec, rules, iters=3)
    if math.isfinite(a + b):  # egglog merged the fold's f64 result into the class
        with pytest.raises(ExplainError):
            explain(sat.snapshot, rules, spec, mul(x, Const(a + b)))


def test_an_exact_egglog_fold_is_explained_and_checked() -> None:
    lib = shipped_library()
    rules = list(lib.family("constfold"))
    x = In("x", (("i", 2),))
    spec, want = mul(x, add(Const(1.0), Const(2.0))), mul(x, Const(3.0))
    steps = explain(saturate(spec, rules, iters=3).snapshot, rules, spec, want)
    assert [s.rule for s in steps] == ["fold-add"]
    assert check(make_certificate(spec, "", steps, want, lib), lib).accepted


# -- end to end: optimize never ships a program that needs an inexact fold -----------------


def _zeroish(t: Term) -> bool:
    return any((n.op is Op.CONST and n.attrs[0] == 0.0) or n.op is Op.ZERO
               for n in postorder(t))


@pytest.mark.slow
def test_optimize_never_ships_an_inexact_fold(tmp_path: Path) -> None:
    """egglog (f64) folds `1e16 + 1` to `1e16`, so for `x * ((1e16 + 1) - 1e16)` its
    e-graph holds `x * 0` (a zero over x's shape) in x's own class, while the exact rules
    put `x * 1 = x` there too; no certificate reaches the zero, and nothing zero ships."""
    from kernelsat.driver.pipeline import Options, as_program, optimize, saturate_program

    spec = "kernel k(N=16)\nin x[n:N] f32\nout y[n] = x[n] * ((1e16 + 1) - 1e16)\n"
    program = as_program(spec, None)
    lib = shipped_library()
    snap = saturate_program(program, lib, Options(iters=3)).snapshot
    zero_nodes = [i for i in snap.classes[snap.root] if snap.nodes[i].op is Op.ZERO]
    assert zero_nodes, "the e-graph no longer folds in f64: this test needs another attack"
    x = next(t for t in postorder(program.term) if t.op is Op.IN)
    claimed = Term(Op.ZERO, (x,))
    try:
        steps = explain(snap, lib, program.term, claimed)
    except ExplainError:
        pass
    else:
        assert not check(make_certificate(program.term, "", steps, claimed, lib), lib).accepted
    r = optimize(spec, "numpy", seconds=30, trials=2, knob_budget=1, iters=3, samples=4,
                 timing=TimingProtocol(min_runs=3, min_seconds=0.01), cache_dir=tmp_path)
    assert not any(c.proved for c in r.candidates if _zeroish(c.term))
    for c in r.candidates:
        if c.proof == "accepted":
            assert check(c.certificate, lib).accepted
    assert r.best.proved and not _zeroish(r.best.term)
