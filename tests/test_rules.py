"""The rule library: its API, its files, its CLI."""

from __future__ import annotations

import dataclasses
import hashlib
from importlib import resources
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kernelsat.cli import app
from kernelsat.proofs.library import UnverifiedRuleError, load_library
from kernelsat.rewrites.library import FAMILIES, RuleSet, library_rules
from kernelsat.rewrites.rule import PNode, Rule, RuleError, parse_rule

UNSOUND = Path(__file__).resolve().parent / "unsound" / "bounded.rules"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.getbasetemp() / "rule-cache"


@pytest.fixture(scope="module")
def library(cache: Path) -> RuleSet:
    return load_library(cache_dir=cache)


def _size(p: object) -> int:
    return 1 + sum(_size(a) for a in p.args) if isinstance(p, PNode) else 1


def test_every_family_ships_as_package_data() -> None:
    for fam in FAMILIES:
        assert resources.files("kernelsat.rewrites").joinpath(f"{fam}.rules").is_file()


def test_the_library_loads_verified(library: RuleSet) -> None:
    assert library.verified
    assert library.families == FAMILIES
    assert all(r.verified for r in library.rules)
    assert {r.family for r in library.rules} == set(FAMILIES)
    assert library.by_name["sum-split"].verified == "lemmas"  # proved for all sizes
    assert library.by_name["exp-add"].verified == "smt"


def test_rule_set_is_frozen_and_hashed(library: RuleSet) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        library.rules = ()  # type: ignore[misc]
    text = "\n".join(sorted(r.text() for r in library.rules))
    assert library.hash == hashlib.sha256(text.encode()).hexdigest()
    assert RuleSet(tuple(reversed(library.rules))).hash == library.hash


def test_rule_texts_round_trip_and_names_are_unique() -> None:
    rules = library_rules()
    assert len({r.name for r in rules}) == len(rules)
    for r in rules:
        assert parse_rule(r.text()) == r


def test_no_rule_names_a_whole_kernel() -> None:
    # general identities and op definitions are small: no side spells out a whole program
    for r in library_rules():
        assert _size(r.lhs) <= 8 and _size(r.rhs) <= 16, r.name


def test_split_rules_take_the_factor_as_a_parameter() -> None:
    rules = {r.name: r for r in library_rules(["tiling"])}
    for name in ("sum-split", "max-split", "lse-split", "softmaxavg-split"):
        assert rules[name].parameters == ("f",)


def test_families_and_extra_rules(cache: Path) -> None:
    only = load_library(["constfold"], cache_dir=cache)
    assert only.families == ("constfold",)
    extra = "my-mul-two: (mul ?x (Const 2.0)) => (add ?x ?x) [user]"
    more = load_library(["constfold"], extra=[extra], cache_dir=cache)
    assert more.by_name["my-mul-two"].verified == "smt"
    assert more.hash != only.hash


def test_an_extra_wrong_rule_is_refused(cache: Path) -> None:
    with pytest.raises(UnverifiedRuleError, match=r"does not verify"):
        load_library(["constfold"], extra=[UNSOUND], cache_dir=cache)


def test_unverified_listing_verifies_nothing(tmp_path: Path) -> None:
    lib = load_library(["constfold"], verified_only=False, cache_dir=tmp_path)
    assert not lib.verified
    assert all(r.verified is None for r in lib.rules)


def test_duplicate_names_are_refused() -> None:
    r = parse_rule("a: (neg (neg ?x)) => ?x [e]")
    with pytest.raises(RuleError):
        RuleSet((r, Rule("a", r.lhs, r.rhs, (), "e")))


# -- CLI -----------------------------------------------------------------------------------


def test_cli_lists_rules(cache: Path) -> None:
    out = CliRunner().invoke(app, ["rules", "--family", "reduction", "--cache-dir", str(cache)])
    assert out.exit_code == 0, out.output
    assert "sum-hoist-div" in out.output and "(not-in ?a ?x)" in out.output


def test_cli_verifies_the_library(cache: Path) -> None:
    out = CliRunner().invoke(app, ["rules", "--verify", "--cache-dir", str(cache)])
    assert out.exit_code == 0, out.output
    n = len(library_rules())
    assert f"{n}/{n} rules verified" in out.output


def test_cli_prints_counterexamples_and_fails(tmp_path: Path) -> None:
    out = CliRunner().invoke(app, ["rules", "--verify", "--file", str(UNSOUND),
                                   "--cache-dir", str(tmp_path)])
    assert out.exit_code == 1
    assert "FAILED max-over-sum" in out.output and "values" in out.output
