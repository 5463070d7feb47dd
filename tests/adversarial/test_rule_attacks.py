"""Attacks on rule verification: user rules that used to verify and must not.

- Placeholders: the verifier stood in for a rule's constant variable with a literal
  value, and for its axis variables with names like `a0`, so a rule written with that
  value or name verified. Placeholders are now fresh (`fresh_names`; constants are
  scalar inputs), on the z3 path and the numeric path.
- Bounds: a rule proved only for sizes up to a bound (a polynomial in a size that is 1
  for sizes 1..7) verified, and shipped a program 5041x off. A user rule proved only up
  to a bound is now refused unless the user allows it, and the numeric trials draw
  their own size bound at random.
- The cache: a warm verification cache hid a change to the side-condition evaluator.
  The cache key now covers every module of the verifier's import graph.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelsat.cli import app
from kernelsat.driver.pipeline import optimize
from kernelsat.ops import Op
from kernelsat.proofs import verify as verify_mod
from kernelsat.proofs.library import BoundedRuleError, UnverifiedRuleError, load_library
from kernelsat.proofs.verify import (
    ALL_SIZES,
    BOUNDED,
    Verification,
    VerificationCache,
    trusted_modules,
    verifier_version,
    verify_rule,
    verify_rules,
)
from kernelsat.proofs.verify_bounded import Bounds, Choices, instances, verify_bounded
from kernelsat.proofs.verify_numeric import NUMERIC_BOUNDS, numeric_check, wide_check
from kernelsat.rewrites.library import library_rules
from kernelsat.rewrites.rule import PNode, Rule, RuleError, Var, parse_rule

# -- 3. placeholders cannot be named by a rule ---------------------------------------------

PLACEHOLDER_CONSTANTS = [7919.0625, 7920.0625, 7921.0625, 0.5, 0.0, 1.0, 2.0, -1.0, 0.125]
"""Values the verifier used (or might use) to stand for a constant variable."""


def _refused_by_z3(rule: Rule) -> None:
    v = verify_rule(rule, numeric_trials=0)
    assert not v.ok, f"{rule.name} verified on the z3 path alone: {rule.text()}"


def _refused_numerically(rule: Rule) -> None:
    assert numeric_check(rule, seed=0, trials=8) is not None, rule.text()


@pytest.mark.parametrize("value", PLACEHOLDER_CONSTANTS)
def test_any_constant_becomes_that_value_is_refused(value: float) -> None:
    for text in (
        f"c: (Sum ?a (mul ?x (Const ?c))) => (Sum ?a (mul ?x (Const {value!r}))) [user]",
        f"c: (Store (mul ?x (Const ?c))) => (Store (mul ?x (Const {value!r}))) [user]",
        f"c: (mul ?x (Const ?c)) => (mul ?x (Const {value!r})) [user]",  # elementwise
        f"c: (Sum ?a (add (mul ?x (Const ?c)) (Const ?d))) => "
        f"(Sum ?a (add (mul ?x (Const {value!r})) (Const ?d))) [user]",
    ):
        rule = parse_rule(text)
        _refused_by_z3(rule)
        _refused_numerically(rule)


@pytest.mark.parametrize("value", PLACEHOLDER_CONSTANTS[:3])
def test_two_constants_cannot_alias_through_placeholder_values(value: float) -> None:
    # ?d stood for the second placeholder value: ?c must not become ?d's stand-in
    rule = parse_rule(f"c: (Sum ?a (mul (mul ?x (Const ?c)) (Const ?d))) => "
                      f"(Sum ?a (mul (mul ?x (Const {value + 1!r})) (Const ?d))) [user]")
    _refused_by_z3(rule)


def test_symbolic_constants_still_prove_sound_rules() -> None:
    for text in (
        "ok: (Sum ?a (mul ?x (Const ?c))) => (mul (Const ?c) (Sum ?a ?x)) [user]",
        "ok: (Sum ?a (div ?x (Const ?c))) => (div (Sum ?a ?x) (Const ?c)) if (nonzero ?c) [user]",
        "ok: (Store (mul ?x (Const ?c))) => (mul (Const ?c) ?x) [user]",
    ):
        v = verify_rule(parse_rule(text))
        assert v.ok and v.scope == ALL_SIZES, (text, v.counterexample)


PLACEHOLDER_AXES = ["a0", "a1", "a2", "k", "j", "a0_", "k_", "a0/o2", "a0/i2", "k/o2",
                    "const_c"]
"""Axis names the verifier's placeholders had, or would have after one renaming."""


@pytest.mark.parametrize("axis", PLACEHOLDER_AXES)
def test_a_sum_over_any_axis_is_not_the_sum_over_a_placeholder_axis(axis: str) -> None:
    for text in (
        f"s: (Sum ?a ?x) => (Sum {axis} ?x) [user]",
        f"s: (Sum ?a (Sum ?b ?x)) => (Sum ?a (Sum {axis} ?x)) [user]",
        f"s: (Max ?a ?x) => (Max {axis} ?x) [user]",
        f"s: (Sum ?a (mul ?x ?y)) => (Sum {axis} (mul ?x ?y)) [user]",
    ):
        rule = parse_rule(text)
        _refused_by_z3(rule)
        _refused_numerically(rule)


@pytest.mark.parametrize("axis", PLACEHOLDER_AXES[:5])
def test_an_axis_variable_ranges_over_the_literal_axes_too(axis: str) -> None:
    # a match may bind ?a to the axis the rule writes: that must be an instance
    rule = parse_rule(f"s: (mul (Sum ?a ?x) (Sum {axis} ?y)) => "
                      f"(mul (Sum {axis} ?y) (Sum ?a ?x)) [user]")
    seen = {i.bindings["a"] for i in instances(rule, Choices(None, Bounds(size=1)))}
    assert axis in seen and len(seen) == 2
    v = verify_rule(rule)
    assert v.ok, v.counterexample
    swap = parse_rule(f"s: (Sum {axis} (Sum ?a ?x)) => (Sum ?a (Sum {axis} ?x)) [user]")
    v = verify_rule(swap)
    assert v.ok, v.counterexample
    _refused_by_z3(parse_rule(f"s: (Sum ?a (Sum {axis} ?x)) => (Sum {axis} ?x) [user]"))


def test_placeholders_avoid_every_axis_the_rule_writes() -> None:
    rule = parse_rule("s: (Sum ?a (Sum ?b ?x)) => (Sum ?b (Sum ?a ?x)) [user]")
    plain = {a for i in instances(rule, Choices(None, Bounds(size=1))) for a in i.sizes}
    assert plain == {"a0", "a1", "k"}
    for axis in ("a0", "a1", "k", "a1/i4"):
        written = parse_rule(f"s: (Sum ?a (Sum ?b (Sum {axis} ?x))) => "
                             f"(Sum ?b (Sum ?a (Sum {axis} ?x))) [user]")
        for inst in instances(written, Choices(None, Bounds(size=1))):
            for name, value in inst.bindings.items():
                if name in ("a", "b") and value != axis:
                    assert not axis.startswith(str(value)), (axis, value)


@pytest.mark.parametrize("size", range(1, 9))
def test_a_size_literal_never_stands_for_every_size(size: int) -> None:
    rule = parse_rule(f"n: (mul (Sum ?a ?x) (Const (size ?a))) => "
                      f"(mul (Sum ?a ?x) (Const {float(size)!r})) [user]")
    _refused_by_z3(rule)
    assert numeric_check(rule, seed=0, trials=8, bounds=NUMERIC_BOUNDS) is not None


def test_an_input_placeholder_cannot_be_a_term_variable_of_the_rule() -> None:
    # the scalar input standing for ?c is named const_c unless the rule has ?const_c
    for text in (
        "i: (Sum ?a (mul ?const_c (Const ?c))) => (Sum ?a (mul ?const_c ?const_c)) [user]",
        "i: (Sum ?a (mul ?const_c_ (mul ?const_c (Const ?c)))) => "
        "(Sum ?a (mul ?const_c_ (mul ?const_c ?const_c))) [user]",
        "i: (Sum ?a (mul ?x (Const ?c))) => (Sum ?a (mul ?x ?x)) [user]",
    ):
        _refused_by_z3(parse_rule(text))


def test_a_rule_built_in_python_cannot_name_an_input() -> None:
    # In("x") is what the verifier makes for ?x: a rule naming it would prove itself
    lhs = parse_rule("r: (Sum ?a ?x) => ?x [user]").lhs
    x = PNode(Op.IN, ("x", ((("a0", 2),),)), ())
    with pytest.raises(RuleError, match="cannot name inputs"):
        Rule("r", lhs, PNode(Op.SUM, (Var("a"),), (x,)), (), "user")


def test_term_variables_named_like_entries_do_not_alias() -> None:
    _refused_by_z3(parse_rule("e: (add ?x ?x[0]) => (add ?x ?x) [user]"))
    _refused_by_z3(parse_rule("e: (Sum ?a (add ?x ?x[0])) => (Sum ?a (add ?x ?x)) [user]"))


@pytest.mark.parametrize("text", [
    "r: (add ?c (Const ?c)) => (mul (Const 2.0) ?c) [user]",  # term and constant
    "r: (Sum ?a ?a) => ?a [user]",  # axis and term
    "r: (Sum ?a (mul ?x (Const ?a))) => (Sum ?a ?x) [user]",  # axis and constant
    "r: (Split ?a ?a ?x) => ?x [user]",  # axis and factor
    "r: (Sum ?a ?x) => (Sum ?a ?x) if (nonzero ?x) [user]",  # term and constant (condition)
    "r: (Sum ?a ?x) => (mul (Sum ?a ?x) (Const (quot ?a ?a))) [user]",
])
def test_a_variable_has_one_role(text: str) -> None:
    with pytest.raises(RuleError, match="is used as a"):
        parse_rule(text)


def test_quot_is_exact() -> None:
    from kernelsat.rewrites.rule import ATTR_FUNS

    assert ATTR_FUNS["quot"](["n", 4], {"n": 12}) == 3.0
    with pytest.raises(RuleError, match="does not divide"):
        ATTR_FUNS["quot"](["n", 5], {"n": 12})


def test_a_factor_ranges_over_the_divisors_of_the_axis_it_splits() -> None:
    # a literal axis of size 3 beside an axis of size 4: the factor 3 must be an instance
    rule = parse_rule("s: (Sum ?a (Split i ?f ?x)) => (Sum ?a (Split i ?f ?x)) [user]")
    seen = {(i.sizes["i"], i.sizes["a0"], i.bindings["f"])
            for i in instances(rule, Choices(None, Bounds())) if "a0" in i.sizes}
    assert (3, 4, 3) in seen and (8, 2, 8) in seen


# -- 4. bounded proofs do not reach shipped programs ----------------------------------------


def _vanishing(n: int) -> str:
    """A constant that is 1 for sizes 1..n of ?a: 1 + (size-1)(size-2)...(size-n)."""
    out = f"(- (size ?a) {float(n)!r})"
    for k in range(n - 1, 0, -1):
        out = f"(* (- (size ?a) {float(k)!r}) {out})"
    return f"(+ 1.0 {out})"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "rule-cache"


POLY7 = parse_rule(f"poly-seven: (Sum ?a ?x) => (mul (Sum ?a ?x) (Const {_vanishing(7)})) [user]")
POLY40 = parse_rule(f"poly-forty: (Sum ?a ?x) => (mul (Sum ?a ?x) (Const {_vanishing(40)})) "
                    "[user]")
SOUND_BOUNDED = parse_rule("my-relu: (Sum ?a (sub (relu ?x) (relu (neg ?x)))) => (Sum ?a ?x) "
                           "[user]")
"""Sound, but the lemma chain compares the bodies of sums syntactically (relu(x) -
relu(-x) is not x after normalization): proved only up to the bound."""


def test_the_polynomial_passes_the_bounded_proof_and_the_fixed_trials() -> None:
    """Why the refusal is needed: within every fixed bound the attack is true."""
    assert verify_bounded(POLY7).ok  # sizes <= 4
    assert numeric_check(POLY7, seed=0, trials=8) is None  # sizes <= 7


@pytest.mark.parametrize("rule", [POLY7, POLY40], ids=lambda r: r.name)
def test_the_polynomial_is_refused_by_the_all_sizes_proof(rule: Rule) -> None:
    v = verify_rule(rule, numeric_trials=0)
    assert not v.ok and not v.all_sizes
    assert v.counterexample is not None and "n[a0]" in v.counterexample


def test_a_sound_rule_the_lemmas_miss_is_only_bounded() -> None:
    v = verify_rule(SOUND_BOUNDED)
    assert v.ok and v.scope == BOUNDED and not v.all_sizes
    assert v.kind.startswith("bounded") and v.limit and "not proved for all sizes" in v.limit


def test_wide_trials_have_no_fixed_bound_to_step_over() -> None:
    caught = sum(wide_check(POLY7, seed=s) is not None for s in range(20))
    assert caught >= 18
    why = wide_check(POLY7, seed=next(s for s in range(20) if wide_check(POLY7, seed=s)))
    assert why is not None and "wide trial" in why and "seed" in why


@pytest.mark.parametrize("rule", [POLY7, POLY40, SOUND_BOUNDED], ids=lambda r: r.name)
def test_a_user_rule_proved_only_up_to_a_bound_is_refused(rule: Rule, cache: Path) -> None:
    with pytest.raises(UnverifiedRuleError) as e:
        load_library(["reduction"], extra=[rule], cache_dir=cache)
    if rule is SOUND_BOUNDED:
        assert isinstance(e.value, BoundedRuleError)
        assert "only up to a bound" in str(e.value) and "allow_bounded" in str(e.value)


def test_optimize_refuses_the_polynomial_rule(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import kernelsat.rewrites.library as library_mod

    # the library's own rules are not the point here (and cost seconds to verify cold)
    real = library_mod.library_rules
    monkeypatch.setattr(library_mod, "library_rules", lambda families=None: real(["constfold"]))
    monkeypatch.setenv("KERNELSAT_CACHE_DIR", str(tmp_path))
    spec = "kernel k(N=64)\nin x[n:N] f32\nout y = sum(n: x[n])"
    with pytest.raises(UnverifiedRuleError):
        optimize(spec, target="cuda", rules=[POLY7], seconds=5, cache_dir=tmp_path)


def test_allow_bounded_loads_and_records(cache: Path) -> None:
    lib = load_library(["reduction"], extra=[SOUND_BOUNDED], cache_dir=cache,
                       allow_bounded=True)
    assert lib.bounded_user_rules == ("my-relu",)
    assert lib.by_name["my-relu"].verified == f"bounded({Bounds().text()})"
    plain = load_library(["reduction"], cache_dir=cache)
    assert plain.bounded_user_rules == ()  # library rules are reviewed, they load


def test_an_all_sizes_user_rule_loads_without_permission(tmp_path: Path) -> None:
    rule = parse_rule("my-two: (mul ?x (Const 2.0)) => (add ?x ?x) [user]")
    lib = load_library(["constfold"], extra=[rule], cache_dir=tmp_path)
    assert lib.bounded_user_rules == () and lib.by_name["my-two"].verified == "smt"


def test_each_verification_records_what_it_covers(tmp_path: Path) -> None:
    rules = [r for r in library_rules() if r.name in ("exp-add", "fold-add", "sum-hoist-div")]
    got = {v.rule: v for v in verify_rules(rules, tmp_path)}
    assert got["exp-add"].scope == ALL_SIZES and got["exp-add"].proved_for() == "all sizes"
    assert got["fold-add"].all_sizes
    assert got["sum-hoist-div"].scope == ALL_SIZES
    assert got["sum-hoist-div"].proved_for() == "all sizes"
    assert got["sum-hoist-div"].kind == "all sizes: lemma chain (sum-hoist)"
    bad = verify_rule(parse_rule("bad: (sub ?x ?y) => (sub ?y ?x) [user]"))
    assert not bad.all_sizes and bad.proved_for() == "-"


def test_cli_refuses_bounded_user_rules_unless_allowed(tmp_path: Path) -> None:
    rules = tmp_path / "mine.rules"
    rules.write_text(SOUND_BOUNDED.text() + "\nmy-two: (mul ?x (Const 2.0)) => (add ?x ?x) "
                     "[user]\n")
    base = ["rules", "--verify", "--file", str(rules), "--cache-dir", str(tmp_path)]
    out = CliRunner().invoke(app, base)
    assert out.exit_code == 1, out.output
    assert "REFUSED my-relu" in out.output and "--allow-bounded" in out.output
    assert "1 proved for all sizes, 1 only up to a bound" in out.output
    out = CliRunner().invoke(app, [*base, "--allow-bounded"])
    assert out.exit_code == 0, out.output
    assert "ACCEPTED (--allow-bounded) my-relu" in out.output


def test_cli_library_counts(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["rules", "--verify", "--family", "constfold", "--family",
                                   "online", "--cache-dir", str(tmp_path)])
    assert out.exit_code == 0, out.output
    n_smt = len(library_rules(["constfold"]))
    n_lemmas = len(library_rules(["online"]))
    assert f"{n_smt + n_lemmas} proved for all sizes, 0 only up to a bound" in out.output
    assert f"{n_smt} all sizes: z3 elementwise" in out.output
    assert f"{n_lemmas} all sizes: lemma chain" in out.output
    header = next(line for line in out.output.splitlines() if line.startswith("rule "))
    assert "proved for" in header


# -- 7. the cache is keyed on the whole trusted base ----------------------------------------

TRUSTED = ["kernelsat.rewrites.rule", "kernelsat.ir", "kernelsat.ops", "kernelsat.interp",
           "kernelsat.sexpr", "kernelsat.proofs.axioms", "kernelsat.proofs.normalize",
           "kernelsat.proofs.verify_sym", "kernelsat.proofs.verify_smt",
           "kernelsat.proofs.verify_bounded", "kernelsat.proofs.verify_numeric",
           "kernelsat.proofs.verify_lemmas",
           "kernelsat.proofs.verify"]


def test_the_trusted_base_is_found_from_the_import_graph() -> None:
    found = trusted_modules()
    assert set(TRUSTED) <= set(found)
    for name, path in found.items():
        assert path.suffix == ".py" and name.startswith("kernelsat")


def _edited(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """Make the verifier see `module`'s source with one byte more (as after an edit)."""
    target = trusted_modules()[module]
    real = verify_mod._read_source

    def read(path: Path) -> bytes:
        return real(path) + (b"#" if path == target else b"")

    monkeypatch.setattr(verify_mod, "_read_source", read)


@pytest.mark.parametrize("module", sorted(trusted_modules()))
def test_changing_any_trusted_module_invalidates_the_cache(
        module: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rule = parse_rule("fold-twice: (mul ?x (Const 2.0)) => (add ?x ?x) [user]")
    before = verifier_version()
    cache = VerificationCache(tmp_path)
    cache.put(Verification(rule.name, rule.key, True, "smt", "proved", scope=ALL_SIZES))
    cache.save()
    assert VerificationCache(tmp_path).get(rule) is not None
    _edited(monkeypatch, module)
    assert verifier_version() != before
    assert VerificationCache(tmp_path).get(rule) is None


def test_a_bug_injected_in_the_condition_evaluator_is_not_hidden_by_a_warm_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rule = parse_rule("hoist: (Sum ?a (mul ?x ?y)) => (mul ?x (Sum ?a ?y)) if (not-in ?a ?x) [u]")
    assert verify_rules([rule], tmp_path)[0].ok  # warm
    import kernelsat.proofs.verify_bounded as vb
    import kernelsat.proofs.verify_lemmas as vl

    for module in (vb, vl):  # the injected bug
        monkeypatch.setattr(module, "check_condition", lambda c, b, ctx: True)
    _edited(monkeypatch, "kernelsat.rewrites.rule")  # ... in rule.py's source
    (v,) = verify_rules([rule], tmp_path)
    assert not v.ok  # verified again, by the buggy evaluator: the bug shows


def test_a_new_z3_invalidates_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    import z3

    before = verifier_version()
    monkeypatch.setattr(z3, "get_version_string", lambda: "99.0.0")
    assert verifier_version() != before
