"""Rule verification: the library verifies; the trusted pieces agree with the interpreter."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.interp import evaluate, evaluate_as
from kernelsat.ir import LSE, Dot, In, Max, SoftmaxAvg, Split, Sum, Term, exp
from kernelsat.ops import BINARY, UNARY, Op
from kernelsat.proofs import verify as verify_mod
from kernelsat.proofs.normalize import Sym, add, const, fn, max_, mul, normalize, recip, var
from kernelsat.proofs.verify import Verification, VerificationCache, verify_rule, verify_rules
from kernelsat.proofs.verify_bounded import Bounds, Choices, instances
from kernelsat.proofs.verify_numeric import numeric_check, random_env, random_instance
from kernelsat.proofs.verify_smt import is_elementwise
from kernelsat.proofs.verify_sym import evaluate as sym_evaluate
from kernelsat.proofs.verify_sym import inputs_for, to_float
from kernelsat.rewrites.library import library_rules
from kernelsat.rewrites.rule import (
    ConstEq,
    Divides,
    HasAxis,
    NonZero,
    NotIn,
    Positive,
    Rule,
    check_condition,
    parse_rule,
)

RULES = library_rules()


def _cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "rule-cache"


def test_every_library_rule_verifies(tmp_path_factory: pytest.TempPathFactory) -> None:
    results = verify_rules(RULES, _cache(tmp_path_factory))
    failed = [f"{v.rule}: {v.status} {v.counterexample}" for v in results if not v.ok]
    assert not failed, "\n".join(failed)
    for rule, v in zip(RULES, results, strict=True):
        # every library rule is proved for all sizes: none is only bounded
        expected = "smt" if rule.family in ("elementwise", "constfold", "select") else "lemmas"
        if rule.family in ("simplify", "activations"):  # elementwise and reduction rules both
            assert v.method in ("smt", "lemmas"), rule.name
            expected = v.method
        assert v.method == expected, rule.name
        assert v.instances > 0
        assert v.all_sizes and v.bound is None and v.limit is None, rule.name
        assert v.kind.startswith(verify_mod.KIND_ELEMENTWISE if expected == "smt"
                                 else verify_mod.KIND_LEMMAS), rule.name


def test_results_are_cached_and_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rules = [r for r in RULES if r.family == "constfold"]
    first = verify_rules(rules, tmp_path)
    assert (tmp_path / "rule-verification.json").exists()

    def refuse(*args: object, **kw: object) -> Verification:
        raise AssertionError("verified again despite the cache")

    monkeypatch.setattr(verify_mod, "verify_rule", refuse)
    assert verify_rules(rules, tmp_path) == first
    monkeypatch.setattr(verify_mod, "verifier_version", lambda: "another-verifier")
    assert VerificationCache(tmp_path).get(rules[0]) is None  # a new verifier starts over


def test_cached_only_never_verifies(tmp_path: Path) -> None:
    (v,) = verify_rules(RULES[:1], tmp_path, cached_only=True)
    assert not v.ok and v.status == "unknown"


def test_elementwise_and_bounded_split() -> None:
    assert is_elementwise(parse_rule("r: (exp (add ?x ?y)) => (mul (exp ?x) (exp ?y)) [e]"))
    assert not is_elementwise(parse_rule("r: (Store ?x) => ?x [m]"))
    assert not is_elementwise(parse_rule("r: (Sum ?a ?x) => (Sum ?a ?x) [r]"))


def test_a_sound_rule_that_needs_z3_is_proved() -> None:
    v = verify_rule(parse_rule(
        "r: (mul (sqrt ?x) (sqrt ?y)) => (sqrt (mul ?x ?y)) if (positive ?x) (positive ?y) [e]"))
    assert v.ok and v.method == "smt"


def test_a_rule_that_changes_where_it_is_defined_is_refused() -> None:
    v = verify_rule(parse_rule("r: (recip (recip ?x)) => ?x [e]"))  # not at x = 0
    assert not v.ok
    assert v.counterexample and "undefined" in v.counterexample


# -- numeric property: every rule on random larger instances -----------------------------


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
@settings(max_examples=3)
@given(seed=st.integers(0, 2**31))
def test_rule_holds_on_random_larger_instances(rule: Rule, seed: int) -> None:
    assert numeric_check(rule, seed=seed, trials=2) is None


def test_numeric_instances_exist_for_every_rule() -> None:
    rng = random.Random(0)
    missing = [r.name for r in RULES if random_instance(r, rng) is None]
    assert not missing


# -- the side-condition evaluator agrees with what the instances compute -----------------


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_conditions_mean_what_the_interpreter_computes(rule: Rule) -> None:
    rng = random.Random(1)
    for _ in range(3):
        inst = random_instance(rule, rng)
        assert inst is not None
        b, env = inst.bindings, random_env([inst.lhs], np.random.default_rng(0))
        for c in rule.conditions:
            assert check_condition(c, b, inst.sizes)
            match c:
                case NotIn(a, t):
                    assert b[a] not in evaluate(b[t], env).axes  # type: ignore[arg-type]
                case HasAxis(a, t):
                    assert b[a] in evaluate(b[t], env).axes  # type: ignore[arg-type]
                case Positive(t):
                    assert np.all(evaluate(b[t], env).array > 0)  # type: ignore[arg-type]
                case Divides(f, a):
                    n = inst.sizes[str(b[a])]
                    assert 1 < int(b[f]) < n and n % int(b[f]) == 0  # type: ignore[call-overload]
                case ConstEq(v, value):
                    assert b[v] == value
                case NonZero(v):
                    assert b[v] != 0


def test_the_condition_evaluator_refuses_what_it_should() -> None:
    rule = parse_rule("r: (Sum ?a (mul ?x ?y)) => (mul ?x (Sum ?a ?y)) if (not-in ?a ?x) [r]")
    every = list(instances(rule, Choices(None, Bounds(size=2))))
    assert every and all("a0" not in i.bindings["x"].shape for i in every)  # type: ignore[union-attr]


# -- the symbolic semantics agree with the float64 interpreter ---------------------------


def _terms() -> list[Term]:
    x = In("x", (("i", 3), ("n", 4)))
    y = In("y", (("n", 4),))
    out: list[Term] = [
        Term(op, (exp(x) if op in (Op.LOG, Op.SQRT) else x,)) for op in sorted(UNARY)
    ]
    out += [Term(op, (x, exp(y) if op is Op.DIV else y)) for op in sorted(BINARY)]
    out += [Sum("n", x), Max("n", x), LSE("n", x), SoftmaxAvg("n", x, y), Dot("n", x, y),
            Split("n", 2, x)]
    return out


@pytest.mark.parametrize("term", _terms(), ids=lambda t: t.op.value)
def test_symbolic_semantics_match_the_interpreter(term: Term) -> None:
    Sym.reset()
    env = random_env([term], np.random.default_rng(3))
    sym = sym_evaluate(term, inputs_for(term))
    point = {}
    for name, arr in env.items():
        for idx in np.ndindex(*arr.shape):
            point[f"{name}[{','.join(map(str, idx))}]"] = float(arr[idx])
    order = tuple(term.shape)
    expected = evaluate_as(term, env, order)
    got = np.array([to_float(s, point) for s in sym.entries(order, term.shape)])
    np.testing.assert_allclose(got, expected.reshape(-1), rtol=1e-10, atol=1e-12)


# -- the normalizer preserves values (where defined) ---------------------------------------

# built at draw time: a Sym made before a `Sym.reset()` must not be reused
_leaves = st.one_of(st.sampled_from("pqr").map(var), st.sampled_from([2, -1, 0.5]).map(const))


def _expr(children: st.SearchStrategy[Sym]) -> st.SearchStrategy[Sym]:
    return st.one_of(
        st.tuples(children, children).map(lambda t: add(*t)),
        st.tuples(children, children).map(lambda t: mul(*t)),
        st.tuples(children, children).map(lambda t: max_(*t)),
        children.map(recip),
        children.map(lambda e: fn("exp", e)),
        children.map(lambda e: fn("log", fn("exp", e))),
        children.map(lambda e: fn("log", e)),
    )


def _finite_throughout(e: Sym, env: dict[str, float]) -> bool:
    return math.isfinite(to_float(e, env)) and all(_finite_throughout(a, env) for a in e.args)


@settings(max_examples=200)
@given(e=st.recursive(_leaves, _expr, max_leaves=8),
       point=st.tuples(*(st.floats(0.1, 3.0) for _ in range(3))))
def test_normalize_preserves_the_value(e: Sym, point: tuple[float, float, float]) -> None:
    env = dict(zip("pqr", point, strict=True))
    try:
        before = to_float(e, env)
        after = to_float(normalize(e, frozenset("pqr")), env)
        if not _finite_throughout(e, env):  # float64 overflowed on the way: no reference
            return
    except (OverflowError, ZeroDivisionError):
        return
    if math.isfinite(before) and abs(before) < 1e6:
        assert math.isclose(before, after, rel_tol=1e-9, abs_tol=1e-9)


# -- proof kinds: recorded, shipped, reported by the checker -------------------------------


def test_the_shipped_proof_record_is_what_the_verifier_proves(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    from kernelsat.proofs.proof_kinds import shipped_record

    results = verify_rules(RULES, _cache(tmp_path_factory))
    assert {v.rule: (v.key, v.kind) for v in results} == dict(shipped_record()), (
        "rewrites/proof-kinds.json is stale: run .venv/bin/python -c 'from "
        "kernelsat.proofs.verify import write_proof_kinds; write_proof_kinds()'")


def test_the_checker_reports_the_weakest_link_from_the_record_not_the_certificate() -> None:
    import json

    from kernelsat.proofs.certificate import make_certificate
    from kernelsat.proofs.checker import check, shipped_library
    from kernelsat.proofs.steps import Step

    lib = shipped_library()
    x = In("x", (("n", 8),))
    spec = Sum("n", exp(x))
    split = Sum("n/o4", Sum("n/i4", Split("n", 4, exp(x))))
    cert = make_certificate(spec, "", [Step("sum-split", "forward", (), {"f": 4})], split, lib)
    obj = cert.to_obj()
    assert obj["library"]["rules"][0]["proof"].startswith("all sizes: lemma chain")
    result = check(cert, lib)
    assert result.accepted and "weakest link: all sizes: lemma chain" in result.reason
    obj["library"]["rules"][0]["proof"] = "all sizes: z3 elementwise"  # a claim, not trusted
    again = check(json.dumps(obj), lib)
    assert again.accepted and again.reason == result.reason
    obj["library"]["rules"][0]["proof"] = 3
    assert not check(json.dumps(obj), lib).accepted
