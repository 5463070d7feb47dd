# ruff: noqa: E501  (rule lines are one line each)
"""Saturation with egglog: rendering, conditions, stop reasons, firing log, readout,
random extraction (acyclic, class-correct, numerically equal to the spec)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.egraph import SaturationResult, Snapshot, saturate
from kernelsat.egraph.render import POSITIVITY, render_rule
from kernelsat.extract.random_extract import random_choice, random_extract
from kernelsat.ir import (
    Const,
    In,
    Max,
    Store,
    Sum,
    Term,
    div,
    exp,
    mul,
    neg,
    postorder,
    recip,
    sub,
)
from kernelsat.ops import ARITY, Op
from kernelsat.rewrites.rule import (
    Positive,
    Rule,
    check_condition,
    instantiate,
    is_positive,
    parse_rule,
    parse_rules,
)
from kernelsat.testing import assert_equivalent

RULE_TEXT = """
store-drop: (Store ?x) => ?x [materialization]
mul-comm: (mul ?x ?y) => (mul ?y ?x) [elementwise]
mul-assoc: (mul (mul ?x ?y) ?z) => (mul ?x (mul ?y ?z)) [elementwise]
add-comm: (add ?x ?y) => (add ?y ?x) [elementwise]
mul-one: (mul ?x (Const 1.0)) => ?x [elementwise]
const-mul: (mul (Const ?c) (Const ?d)) => (Const (* ?c ?d)) [constant]
div-recip: (div ?x ?y) => (mul ?x (recip ?y)) [elementwise]
sum-hoist-mul: (Sum ?a (mul ?x ?y)) => (mul ?x (Sum ?a ?y)) if (not-in ?a ?x) [reduction]
sum-hoist-div: (Sum ?a (div ?x ?y)) => (div (Sum ?a ?x) ?y) if (not-in ?a ?y) [reduction]
sum-swap: (Sum ?a (Sum ?b ?x)) => (Sum ?b (Sum ?a ?x)) [reduction]
softmaxavg-def: (div (Sum ?a (mul (exp (sub ?s (Max ?a ?s))) ?v)) (Sum ?a (exp (sub ?s (Max ?a ?s))))) => (SoftmaxAvg ?a ?s ?v) [online]
dot-def: (Sum ?a (mul ?x ?y)) => (Dot ?a ?x ?y) [contraction]
sum-split: (Sum ?a ?x) => (Sum (outer ?a ?f) (Sum (inner ?a ?f) (Split ?a ?f ?x))) if (divides ?f ?a) [tiling]
softmaxavg-split: (SoftmaxAvg ?a ?s ?v) => (SoftmaxAvg (outer ?a ?f) (LSE (inner ?a ?f) (Split ?a ?f ?s)) (SoftmaxAvg (inner ?a ?f) (Split ?a ?f ?s) (Split ?a ?f ?v))) if (divides ?f ?a) (has-axis ?a ?v) [tiling]
split-mul-both: (Split ?a ?f (mul ?x ?y)) => (mul (Split ?a ?f ?x) (Split ?a ?f ?y)) if (has-axis ?a ?x) (has-axis ?a ?y) [tiling]
split-mul-left: (Split ?a ?f (mul ?x ?y)) => (mul (Split ?a ?f ?x) ?y) if (has-axis ?a ?x) (not-in ?a ?y) [tiling]
split-exp: (Split ?a ?f (exp ?x)) => (exp (Split ?a ?f ?x)) [tiling]
"""
"""Test rules, in the library's syntax (sound identities; the library may differ)."""


@cache
def library_rules() -> list[Rule]:
    try:
        from kernelsat.proofs.library import load_library  # type: ignore[import-not-found]

        return list(load_library().rules)
    except ImportError:
        return parse_rules(RULE_TEXT)


@cache
def local_rules() -> dict[str, Rule]:
    return {r.name: r for r in parse_rules(RULE_TEXT)}


def rules(*names: str) -> list[Rule]:
    return [local_rules()[n] for n in names]


def terms_of(res: SaturationResult, cls: int, n: int = 40, seed: int = 0) -> set[Term]:
    rng = random.Random(seed)
    return {random_extract(res.snapshot, rng, cls) for _ in range(n)}


def all_terms(snap: Snapshot, cls: int, limit: int = 5000) -> set[Term]:
    """Every term of a class (small acyclic e-graphs only)."""
    memo: dict[int, set[Term]] = {}

    def go(c: int, path: frozenset[int]) -> set[Term]:
        if c in memo:
            return memo[c]
        out: set[Term] = set()
        for n in snap.classes[c]:
            node = snap.nodes[n]
            if any(k in path | {c} for k in node.children):
                continue
            kid_sets = [go(k, path | {c}) for k in node.children]
            combos: list[tuple[Term, ...]] = [()]
            for ks in kid_sets:
                combos = [(*cmb, k) for cmb in combos for k in ks][:limit]
            out |= {Term(node.op, cmb, node.attrs) for cmb in combos}
        memo[c] = out
        return out

    return go(cls, frozenset())


X = In("x", (("i", 4),))
Y = In("y", (("n", 8),))
XN = In("z", (("i", 4), ("n", 8)))


def attention(n: int = 8, d: int = 4, h: int = 2) -> Term:
    q = In("Q", (("h", h), ("i", n), ("d", d)))
    k = In("K", (("h", h), ("n", n), ("d", d)))
    v = In("V", (("h", h), ("n", n), ("e", d)))
    s = Store(div(Sum("d", mul(q, k)), Const(2.0)))
    e = exp(sub(s, Max("n", s)))
    p = Store(div(e, Sum("n", e)))
    return Store(Sum("n", mul(p, v)))


# -- conditions are enforced ---------------------------------------------------------------


def test_hoist_reaches_the_root_class() -> None:
    t = Sum("n", mul(X, Y))
    res = saturate(t, rules("sum-hoist-mul"))
    assert res.stop_reason == "saturated"
    assert mul(X, Sum("n", Y)) in all_terms(res.snapshot, res.root)


def test_hoist_blocked_when_the_factor_has_the_axis() -> None:
    t = Sum("n", mul(XN, Y))
    res = saturate(t, rules("sum-hoist-mul", "mul-comm"))
    got = all_terms(res.snapshot, res.root)
    assert Sum("n", mul(Y, XN)) in got
    assert all(u.op is Op.SUM for u in got), got


def test_class_shapes_are_the_terms_shapes() -> None:
    res = saturate(Sum("n", mul(XN, Y)), rules("sum-split", "mul-comm"), factors=(2, 4))
    snap = res.snapshot
    for c in range(snap.n_classes):
        for t in terms_of(res, c, n=5):
            assert dict(t.shape) == dict(snap.class_shape[c])


def test_split_uses_the_given_factors_that_divide() -> None:
    t = Sum("n", Y)
    res = saturate(t, rules("sum-split"), factors=(2, 3, 4, 8), iters=1)
    got = all_terms(res.snapshot, res.root)
    factors = {u.args[0].args[0].attrs[1] for u in got if u.op is Op.SUM and u.args[0].op is Op.SUM}
    assert factors == {2, 4}  # 3 does not divide 8; 8 is not a proper split


def test_backward_firings_are_recorded() -> None:
    t = mul(X, Sum("n", Y))
    res = saturate(t, rules("sum-hoist-mul"))
    assert Sum("n", mul(X, Y)) in all_terms(res.snapshot, res.root)
    assert "backward" in {f.direction for f in res.snapshot.firings}


def test_const_arithmetic_is_computed_in_egglog() -> None:
    t = mul(mul(X, Const(3.0)), Const(0.5))
    res = saturate(t, rules("mul-assoc", "const-mul"))
    assert mul(X, Const(1.5)) in all_terms(res.snapshot, res.root)


def test_bare_variable_queries_are_not_run_backward() -> None:
    res = saturate(Store(X), rules("store-drop", "mul-one"))
    assert {(n, d) for n, d, _ in res.skipped} == {("store-drop", "backward"), ("mul-one", "backward")}
    assert X in all_terms(res.snapshot, res.root)


def test_ill_formed_results_never_enter_the_egraph() -> None:
    # backward split-mul-left would build (Split n 2 (mul z (Split n 2 y))): ill-formed
    t = Sum("n", mul(XN, Y))
    res = saturate(t, rules("sum-split", "split-mul-both", "split-mul-left", "mul-comm"),
                   factors=(2,), iters=6)
    snap = res.snapshot
    for c in range(snap.n_classes):
        for n in snap.classes[c]:
            node = snap.nodes[n]
            kids = tuple(random_extract(snap, random.Random(n), k) for k in node.children)
            assert dict(Term(node.op, kids, node.attrs).shape) == dict(snap.class_shape[c])


def test_positivity_table_agrees_with_is_positive() -> None:
    pos, non = exp(X), neg(X)
    for op in Op:
        if op in (Op.IN, Op.CONST, Op.SPLIT, Op.IDX, Op.READ, Op.GATHER) or op in (  # attributes
                Op.SUM, Op.RMAX, Op.LSE, Op.SOFTMAXAVG, Op.DOT):
            continue
        for kids in _combos(ARITY[op], pos, non):
            t = Term(op, kids)
            kind, idx = POSITIVITY.get(op, ("never", ()))
            flags = [is_positive(kids[i]) for i in idx]
            table = {"always": True, "all": all(flags), "any": any(flags), "never": False}[kind]
            assert table == is_positive(t), t


def _combos(n: int, a: Term, b: Term) -> list[tuple[Term, ...]]:
    out: list[tuple[Term, ...]] = [()]
    for _ in range(n):
        out = [(*c, k) for c in out for k in (a, b)]
    return out


def test_positive_condition() -> None:
    r = parse_rule("div-to-recip-pos: (div ?x ?y) => (mul ?x (recip ?y)) if (positive ?y) [elementwise]")
    good = saturate(div(X, exp(X)), [r])
    bad = saturate(div(X, neg(X)), [r])
    assert mul(X, recip(exp(X))) in all_terms(good.snapshot, good.root)
    assert len(all_terms(bad.snapshot, bad.root)) == 1


# -- stop reasons ----------------------------------------------------------------------------


def test_node_limit() -> None:
    res = saturate(attention(), list(local_rules().values()), nodes=30)
    assert res.stop_reason == "node limit"
    assert res.iterations[-1].nodes > 30


def test_iteration_limit_and_stats() -> None:
    res = saturate(attention(), rules("mul-comm", "mul-assoc"), iters=2)
    assert res.stop_reason == "iteration limit"
    assert len(res.iterations) == 2
    assert res.iterations[0].nodes <= res.iterations[1].nodes
    assert res.firings["mul-comm"] > 0


def test_time_limit() -> None:
    res = saturate(attention(), rules("mul-comm", "mul-assoc"), seconds=0.0)
    assert res.stop_reason == "time limit"


def test_stages_run_in_order() -> None:
    res = saturate(Sum("n", mul(X, Y)), rules("sum-hoist-mul", "sum-split"),
                   schedule=[("reduction",), ("tiling",)], factors=(2,))
    assert [s.stop_reason for s in res.stages] == ["saturated", "saturated"]
    assert res.stages[0].rules == ("sum-hoist-mul",)
    assert {i.stage for i in res.iterations} == {0, 1}


# -- the firing log -----------------------------------------------------------------------------


def _check_firings(res: SaturationResult, rule_list: Sequence[Rule], sample: int = 150) -> None:
    """Every sampled firing re-instantiates, with concrete terms of its classes, to two
    terms of its root class that agree numerically, and its conditions hold (positivity
    is a class-level analysis, so it is not re-checked on a random representative)."""
    by_name = {r.name: r for r in rule_list}
    snap = res.snapshot
    rng = random.Random(1)
    firings = list(snap.firings)
    rng.shuffle(firings)
    assert firings
    for f in firings[:sample]:
        rule = by_name[f.rule]
        b = {k: random_extract(snap, rng, v) if k in f.term_vars else v for k, v in f.bindings.items()}
        ctx = dict(snap.class_shape[f.root])
        for v in b.values():
            if isinstance(v, Term):
                ctx.update(v.all_sizes)
        lhs = instantiate(rule.lhs, b, ctx)
        ctx.update(lhs.all_sizes)
        rhs = instantiate(rule.rhs, b, ctx)
        for c in rule.conditions:
            assert isinstance(c, Positive) or check_condition(c, b, ctx), (f, c)
        for side in (lhs, rhs):
            assert dict(side.shape) == dict(snap.class_shape[f.root])
        assert_equivalent(lhs, rhs)
        assert_equivalent(lhs, random_extract(snap, rng, f.root))


def test_firing_log_reinstantiates_in_its_root_class() -> None:
    rl = [r for r in local_rules().values() if r.name != "mul-one"]
    res = saturate(attention(), rl, factors=(2, 4), nodes=400)
    _check_firings(res, rl)


def test_firing_rows_name_classes_of_the_snapshot() -> None:
    res = saturate(Sum("n", mul(X, Y)), rules("sum-hoist-mul", "mul-comm"))
    for f in res.snapshot.firings:
        assert 0 <= f.root < res.n_classes
        for v in f.term_vars:
            assert 0 <= int(f.bindings[v]) < res.n_classes


# -- random extraction --------------------------------------------------------------------------


@cache
def attention_egraph() -> SaturationResult:
    return saturate(attention(), list(local_rules().values()), factors=(2, 4), nodes=2000)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_extraction_is_acyclic_and_class_correct(seed: int) -> None:
    res = attention_egraph()
    snap = res.snapshot
    choice = random_choice(snap, random.Random(seed))
    for c, n in choice.items():
        assert int(snap.node_class[n]) == c
    t = snap.term(choice)  # raises on a cycle
    assert dict(t.shape) == dict(snap.class_shape[snap.root])
    assert sum(1 for _ in postorder(t)) <= len(choice)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_extraction_equals_the_spec(seed: int) -> None:
    res = attention_egraph()
    t = random_extract(res.snapshot, random.Random(seed))
    assert_equivalent(attention(), t)


def test_flash_shape_is_reachable() -> None:
    res = saturate(attention(), list(local_rules().values()), factors=(4,), nodes=20_000,
                   schedule=[("materialization", "online", "reduction", "elementwise"),
                             ("tiling", "contraction", "constant")])
    ops = {res.snapshot.nodes[n].op for n in res.snapshot.classes[res.root]}
    assert Op.SOFTMAXAVG in ops


@pytest.mark.slow
def test_attention_with_the_rule_set_stops_quickly() -> None:
    res = saturate(attention(n=64, d=16, h=2), library_rules(), nodes=50_000)
    assert res.stop_reason in ("saturated", "node limit", "iteration limit", "time limit")
    assert res.n_classes > 0


def test_rendering_is_generated_from_rule_data() -> None:
    r = local_rules()["sum-split"]
    text = render_rule(r, "forward", "stage0").text
    assert "(Factor v_f)" in text and "(= 0 (% w1 v_f))" in text
    assert '(+ v_a "/o" (to-string v_f))' in text
    assert "(Fired_sum-split root v_a v_f v_x)" in text


# -- the command line ---------------------------------------------------------------------------


def test_saturate_command_writes_json_and_dot(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import json

    from typer.testing import CliRunner

    import kernelsat.driver.commands.egraph as command
    from kernelsat.cli import app

    spec = tmp_path / "k.ks"
    spec.write_text("kernel k(N=8, M=4)\nin X[i:M, n:N] f32\nin Y[n:N] f32\n"
                    "out O[i] = sum(n: X[i,n] * Y[n])\n")
    rules_file = tmp_path / "t.rules"
    rules_file.write_text(RULE_TEXT)
    out_json, out_dot = tmp_path / "e.json", tmp_path / "e.dot"
    result = CliRunner().invoke(app, ["saturate", str(spec), "--rules", str(rules_file),
                                      "--iters", "2", "--factors", "2",
                                      "--json", str(out_json), "--dot", str(out_dot)])
    assert result.exit_code == 0, result.output
    assert "stop reason: iteration limit" in result.output
    data = json.loads(out_json.read_text())
    assert data["egraph"]["root"] < len(data["egraph"]["classes"])
    assert out_dot.read_text().startswith("digraph")
    monkeypatch.setattr(command, "DOT_LIMIT", 3)
    refused = CliRunner().invoke(app, ["saturate", str(spec), "--rules", str(rules_file),
                                       "--iters", "2", "--dot", str(tmp_path / "no.dot")])
    assert refused.exit_code == 1 and not (tmp_path / "no.dot").exists()
