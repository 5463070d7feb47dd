"""Deliberately wrong rules (tests/unsound/*.rules) are rejected, with a counterexample,
by the z3 path and by the numeric path, and cannot be loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelsat.proofs.library import UnverifiedRuleError, load_library
from kernelsat.proofs.verify import verify_rule
from kernelsat.proofs.verify_numeric import numeric_check
from kernelsat.rewrites.rule import Rule, RuleError, parse_rule, parse_rules

HERE = Path(__file__).resolve().parent / "unsound"
UNSOUND = [r for f in sorted(HERE.glob("*.rules")) for r in parse_rules(f.read_text(), f.name)]


def test_there_are_enough_wrong_rules() -> None:
    assert len(UNSOUND) >= 10
    assert {r.name for r in UNSOUND} >= {"wrong-sign", "exp-of-product", "max-over-sum",
                                          "hoist-ignoring-axis", "log-mul-no-pos"}


@pytest.mark.parametrize("rule", UNSOUND, ids=[r.name for r in UNSOUND])
def test_z3_path_rejects_with_a_counterexample(rule: Rule) -> None:
    v = verify_rule(rule, numeric_trials=0)
    assert not v.ok
    assert v.status == "refuted"
    assert v.counterexample
    if v.method == "bounded":  # shapes and values
        assert "?" in v.counterexample and "[" in v.counterexample


@pytest.mark.parametrize("rule", UNSOUND, ids=[r.name for r in UNSOUND])
def test_numeric_path_rejects_with_a_counterexample(rule: Rule) -> None:
    found = numeric_check(rule, seed=5, trials=20)
    assert found is not None
    assert found.startswith(("numeric:", "shape:"))


@pytest.mark.parametrize("rule", UNSOUND, ids=[r.name for r in UNSOUND])
def test_a_wrong_rule_cannot_be_loaded(rule: Rule, tmp_path: Path) -> None:
    with pytest.raises(UnverifiedRuleError) as err:
        load_library(["constfold"], extra=[rule], cache_dir=tmp_path)
    assert err.value.rule.name == rule.name


def test_a_split_factor_that_does_not_divide_is_ill_formed() -> None:
    # a factor bound by no (divides ...) condition is refused when the rule is built
    with pytest.raises(RuleError):
        parse_rule("r: (Sum ?a ?x) => (Sum (outer ?a ?f) (Sum (inner ?a ?f) "
                   "(Split ?a ?f ?x))) [tiling]")
