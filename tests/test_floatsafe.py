"""The static float analysis (`kernelsat.floatsafe`): sound where it says "safe", precise
enough that every bundled spec's eager program and the good rewrites (max-subtracted
softmax, online LSE, fused attention) pass, and the float32-unsafe forms the extractors
used to propose (`exp(x) / exp(max)`, a sum of `exp(x)` without the max) are flagged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelsat import floatsafe, optimize
from kernelsat.driver.jobs import STRESS_SCALE, check_job
from kernelsat.driver.pipeline import Options, float_check_failure, job_for
from kernelsat.driver.report import report_json
from kernelsat.floatsafe import GROUPS, Judge, analyze, data_range, input_ranges, interval
from kernelsat.inputs import FILLERS, random_inputs
from kernelsat.interp import evaluate
from kernelsat.ir import (
    LSE,
    Const,
    Dot,
    In,
    Max,
    NegInf,
    SoftmaxAvg,
    Store,
    Sum,
    Term,
    div,
    exp,
    le,
    log,
    mul,
    neg,
    postorder,
    sqrt,
    sub,
    where,
)
from kernelsat.ir import Idx as IdxT
from kernelsat.ops import Op
from kernelsat.program import InputDecl, Program
from kernelsat.spec import load_spec, parse_spec
from kernelsat.testing import masked_programs, programs, small_spec
from kernelsat.testing import random_inputs as term_inputs

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "specs").glob("*.ks"))
NONFINITE = GROUPS[0]

X = In("x", (("i", 4), ("n", 8)))
BIG = {"x": interval(-100.0, 100.0), "v": data_range()}  # "x up to 100"


def _kinds(term: Term, ranges: dict[str, floatsafe.Val]) -> list[str]:
    return [h.kind for h in analyze(term, ranges).hazards]


# -- precision: the specs and the good rewrites pass -----------------------------------


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_every_spec_eager_program_passes(path: Path) -> None:
    """The eager program is never dropped, and on the check's inputs it has no hazard of
    non-finite values (the numeric check's inputs are small)."""
    program = load_spec(str(path))
    assert Judge(program, STRESS_SCALE)(program.term).safe
    hazards = analyze(program.term, input_ranges(program)).hazards
    assert not [h for h in hazards if h.kind in NONFINITE], hazards


OVERFLOWING_SPECS = {"elementwise", "act_power"}
"""Specs whose own float32 program overflows on the overflow check's inputs (exp(150),
2^150): the analysis flags them there, and only them."""


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_specs_on_the_overflow_checks_inputs(path: Path) -> None:
    """On the stress inputs the analysis flags exactly the specs that overflow; where it
    says safe, the spec's float32 evaluation (at small sizes) is finite."""
    program = small_spec(str(path))
    ranges = input_ranges(program, STRESS_SCALE)
    flagged = [h for h in analyze(program.term, ranges).hazards if h.kind in NONFINITE]
    assert bool(flagged) == (path.stem in OVERFLOWING_SPECS), flagged
    if not flagged:
        env = {k: v * STRESS_SCALE if d.role != "onehot" and d.dtype.startswith("f") else v
               for (k, v), d in zip(random_inputs(program, seed=3).items(), program.inputs,
                                    strict=True)}
        out = evaluate(program.term, env, np.float32).array
        assert np.isfinite(out).all()


def test_max_subtracted_softmax_lse_and_fused_attention_are_safe() -> None:
    m = Store(Max("n", X))
    e = exp(sub(X, m))
    for term in (div(e, Sum("n", e)),  # softmax, the max stored
                 div(exp(sub(X, Max("n", X))), Sum("n", exp(sub(X, Max("n", X))))),
                 LSE("n", X),  # online LSE
                 sub(X, LSE("n", X)),  # log-softmax
                 exp(sub(X, LSE("n", X))),  # softmax through LSE
                 div(Dot("n", e, In("v", (("n", 8), ("e", 3)))), Sum("n", e))):
        assert analyze(term, BIG).hazards == [], term
    q = In("q", (("i", 16), ("d", 4)))
    k = In("k", (("n", 16), ("d", 4)))
    v = In("v", (("n", 16), ("e", 4)))
    s = where(le(IdxT("n", 16), IdxT("i", 16)), div(Dot("d", q, k), Const(2.0)), NegInf())
    ranges = {n: data_range(100.0) for n in "qkv"}
    assert analyze(SoftmaxAvg("n", s, v), ranges).hazards == []  # fused causal attention
    p = exp(sub(s, Max("n", s)))
    assert analyze(Dot("n", div(p, Sum("n", p)), v), ranges).hazards == []


# -- the unsafe forms are flagged, naming the subterm ---------------------------------


def test_softmax_without_the_max_overflows() -> None:
    hazards = analyze(div(exp(X), Sum("n", exp(X))), BIG).hazards
    assert hazards[0].kind == "overflow" and hazards[0].term.startswith("(exp (In x")
    assert "100" in hazards[0].reason


def test_exp_over_exp_of_the_max_is_flagged() -> None:
    for term in (div(exp(X), exp(Max("n", X))), mul(exp(X), exp(neg(Max("n", X)))),
                 div(exp(X), Sum("n", exp(X)))):
        assert "overflow" in _kinds(term, BIG), term


def test_log_sum_exp_without_the_max_is_flagged() -> None:
    kinds = _kinds(log(Sum("n", exp(X))), BIG)
    assert kinds[0] == "overflow"


def test_division_by_an_underflowing_value() -> None:
    # exp(x - 200) underflows to 0 for every x up to 100; the sum can be 0
    e = exp(sub(X, Const(200.0)))
    assert "divide" in _kinds(div(X, Sum("n", e)), BIG)
    # the max-subtracted sum is at least 1: its max element is exp(0)
    e = exp(sub(X, Max("n", X)))
    assert "divide" not in _kinds(div(X, Sum("n", e)), BIG)


def test_nan_forms() -> None:
    s = where(le(IdxT("n", 8), IdxT("i", 4)), X, NegInf())
    # a row of n < 4 below every i can be fully masked: the anti-causal mask i + 5 <= n
    anti = where(le(sub(IdxT("i", 4), Const(-5.0)), IdxT("n", 8)), X, NegInf())  # i+5 <= n
    assert analyze(exp(sub(s, Max("n", s))), BIG).hazards == []
    assert "nan" in _kinds(exp(sub(anti, Max("n", anti))), BIG)
    assert "nan" in _kinds(sqrt(sub(X, Const(0.0))), {"x": data_range()})
    assert "nan" in _kinds(log(X), {"x": data_range()})
    assert "log-zero" in _kinds(log(mul(X, Const(0.0))), {"x": data_range()})


def test_cancellation_of_huge_addends() -> None:
    big = exp(mul(X, Const(20.0)))  # up to e^30 on the check's inputs
    assert "cancel" in _kinds(sub(big, exp(mul(X, Const(19.0)))), {"x": data_range()})
    assert "cancel" not in _kinds(sub(X, Const(1.0)), {"x": data_range()})


def test_judge_drops_the_unsafe_softmax_candidates_with_the_reason() -> None:
    program = parse_spec("kernel k(M=4, N=8)\nin X[i:M, n:N] f32\nout Y[i, n] = "
                         "softmax(n: X[i, n])\n")
    x = In("X", (("i", 4), ("n", 8)))
    judge = Judge(program, STRESS_SCALE)
    bad = judge(div(exp(x), Sum("n", exp(x))))
    assert not bad.safe and "overflow check" in bad.reason and "(exp (In X" in bad.reason
    m = Max("n", x)
    assert judge(div(exp(sub(x, m)), Store(Sum("n", exp(sub(x, m)))))).safe


def test_a_spec_that_overflows_itself_leaves_its_candidates_to_the_run_time_check() -> None:
    program = parse_spec("kernel k(N=8)\nin X[n:N] f32\nout Y[n] = exp(X[n]) * 2\n")
    x = In("X", (("n", 8),))
    assert Judge(program, STRESS_SCALE)(mul(Const(2.0), exp(x))).safe


# -- ranges ---------------------------------------------------------------------------


def test_every_input_role_has_a_range_that_holds_its_values() -> None:
    assert set(FILLERS) <= set(floatsafe.ROLE_RANGES)
    for role in FILLERS:
        decl = InputDecl("x", (6, 5), role=role)
        prog = Program("k", {}, (decl,), "y", ("i", "n"), In("x", (("i", 6), ("n", 5))))
        for scale in (1.0, STRESS_SCALE):
            v = input_ranges(prog, scale)["x"]
            values = random_inputs(prog, seed=1)["x"] * (scale if role != "onehot" else 1.0)
            assert _contains(v, values, 0.0), (role, scale, v)


def _contains(v: floatsafe.Val, values: np.ndarray, tol: float) -> bool:
    ok = np.zeros(values.shape, bool)
    for lo, hi in v.pieces():
        ok |= (values >= lo - tol) & (values <= hi + tol)
    ok |= (values == -np.inf) & v.ninf
    ok |= (values == np.inf) & v.pinf
    ok |= np.isnan(values) & v.nan
    return bool(ok.all())


# -- soundness: "safe" means finite in float32 -----------------------------------------


def _check_sound(term: Term, scale: float, seed: int) -> None:
    names = sorted({str(n.attrs[0]) for n in _ins(term)})
    ranges = {n: data_range(scale) for n in names}
    result = analyze(term, ranges)
    if not result.safe:
        return
    env = term_inputs(term, seed=seed, low=0.5 * scale, high=1.5 * scale)
    out = evaluate(term, env, np.float32).array
    assert np.isfinite(out).all(), (term, result.value)
    tol = 1e-3 * (1 + np.abs(out).max(initial=0.0))
    assert _contains(result.value, np.asarray(out, np.float64), tol), (term, result.value)


def _ins(term: Term) -> list[Term]:
    return [n for n in postorder(term) if n.op is Op.IN]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(max_depth=5), st.sampled_from([1.0, 30.0, STRESS_SCALE]), st.integers(0, 99))
def test_safe_programs_are_finite_in_float32(term: Term, scale: float, seed: int) -> None:
    _check_sound(term, scale, seed)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(masked_programs(), st.sampled_from([1.0, STRESS_SCALE]), st.integers(0, 99))
def test_safe_masked_programs_are_finite_in_float32(term: Term, scale: float,
                                                    seed: int) -> None:
    _check_sound(term, scale, seed)


def test_the_analysis_flags_some_random_programs() -> None:
    """The soundness properties are not vacuous: exp of large inputs is flagged."""
    assert not analyze(exp(X), {"x": data_range(STRESS_SCALE)}).safe
    assert analyze(exp(X), {"x": data_range()}).safe


# -- the pipeline: flagged candidates are not proved or measured ------------------------


def test_the_run_time_float_check_rejects_what_the_analysis_removes() -> None:
    """The pipeline's count of run-time float rejections reads the ship gate's own
    messages: a candidate the analysis flags fails the overflow check with one of them."""
    program = parse_spec("kernel k(M=4, N=8)\nin X[i:M, n:N] f32\nout Y[i, n] = "
                         "softmax(n: X[i, n])\n")
    x = In("X", (("i", 4), ("n", 8)))
    unsafe = div(exp(x), Sum("n", exp(x)))
    assert not Judge(program, STRESS_SCALE)(unsafe).safe
    r = check_job(job_for(program, unsafe, Options(target="numpy")))
    assert not r.ok and float_check_failure(r.error), r.error
    assert not float_check_failure("not measured: out of time (--seconds)")


def test_optimize_drops_the_flagged_candidates_and_reports_the_counts() -> None:
    r = optimize(small_spec(str(ROOT / "specs" / "softmax.ks"), size=13), target="numpy",
                 seconds=40, trials=2, knob_budget=1)
    flagged = [c for c in r.candidates if c.float_hazard]
    assert flagged and r.float_removed == len(flagged)
    assert r.float_rejected == 0
    for c in flagged:
        assert c.measurement is None and c.certificate is None
        assert "overflow" in r.dropped(c) and c.proof == "not tried: float-unsafe"
    assert r.candidates[-len(flagged):] == flagged  # listed last
    assert not r.eager.float_hazard and r.best.proved
    data = report_json(r)
    assert data["float_safety"] == {"removed_by_analysis": len(flagged),
                                    "rejected_at_run_time": 0}
    assert "float safety: " in r.summary()
