"""Size-dependent attacks: rules true for every size the bounded method tries (axes up to
4, split axes up to 8, every factor) and false beyond. The bounded method accepted each
of them; the all-sizes proof (`proofs.verify_lemmas`) refutes each, by proof, with a
size where it fails, confirmed by the float64 interpreter at that size, and none loads.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.proofs.library import UnverifiedRuleError, load_library
from kernelsat.proofs.verify import ALL_SIZES, verify_rule
from kernelsat.proofs.verify_bounded import verify_bounded
from kernelsat.proofs.verify_lemmas import verify_all_sizes
from kernelsat.rewrites.rule import Rule, parse_rule


def _vanishing(roots: list[int], size: str = "(size ?a)") -> str:
    """A constant that is 1 exactly when `size` is one of `roots`: 1 + prod (size - r)."""
    out = f"(- {size} {float(roots[-1])!r})"
    for r in reversed(roots[:-1]):
        out = f"(* (- {size} {float(r)!r}) {out})"
    return f"(+ 1.0 {out})"


def _power(k: int) -> str:
    out = "?x"
    for _ in range(k - 1):
        out = f"(mul ?x {out})"
    return out


def _product(*xs: str) -> str:
    out = xs[-1]
    for x in reversed(xs[:-1]):
        out = f"(mul {x} {out})"
    return out


def _newton_five() -> str:
    """24 p5 in terms of p1..p4 (p_k = sum x^k), which holds exactly when the fifth
    elementary symmetric polynomial is 0: for every size up to 4, never at 5. No size
    is written: the size enters only through the sums."""
    p = [""] + [f"(Sum ?a {_power(k)})" for k in range(1, 6)]

    def c(v: float) -> str:
        return f"(Const {v!r})"

    rhs = (f"(add (neg {_product(p[1], p[1], p[1], p[1], p[1])}) "
           f"(add {_product(c(10.0), p[1], p[1], p[1], p[2])} "
           f"(add (neg {_product(c(15.0), p[1], p[2], p[2])}) "
           f"(add (neg {_product(c(20.0), p[1], p[1], p[3])}) "
           f"(add {_product(c(20.0), p[2], p[3])} {_product(c(30.0), p[1], p[4])})))))")
    return f"newton-five: (mul (Const 24.0) {p[5]}) => {rhs} [user]"


SPLIT = "(Sum (outer ?a ?f) (Sum (inner ?a ?f) (Split ?a ?f ?x)))"

PLANTED = [
    # 1 for sizes 1..7, 5041x at 8 (the rule that shipped a wrong program)
    parse_rule(f"poly-seven: (Sum ?a ?x) => "
               f"(mul (Sum ?a ?x) (Const {_vanishing(list(range(1, 8)))})) [user]"),
    # true while the size is at most 4 (no size written anywhere)
    parse_rule(_newton_five()),
    # true for 4, 6 and 8: every size the bounded method splits is even; false at 9 (f = 3)
    parse_rule(f"even-only: (Sum ?a ?x) => (mul {SPLIT} (Const {_vanishing([4, 6, 8])})) "
               "if (divides ?f ?a) [user]"),
    # true when the split leaves 2, 3 or 4 parts (all the bound reaches); false at 5
    parse_rule(f"few-parts: (Sum ?a ?x) => (mul {SPLIT} "
               f"(Const {_vanishing([2, 3, 4], '(quot ?a ?f)')})) if (divides ?f ?a) [user]"),
    # true when the factor is 2, 3 or 4 (all proper factors of sizes up to 8); false at 5
    parse_rule(f"small-factor: (Sum ?a ?x) => (mul {SPLIT} "
               f"(Const {_vanishing([2, 3, 4], '(/ (size ?a) (quot ?a ?f))')})) "
               "if (divides ?f ?a) [user]"),
]


@pytest.mark.parametrize("rule", PLANTED, ids=lambda r: r.name)
def test_the_bounded_method_accepted_it(rule: Rule) -> None:
    assert verify_bounded(rule).ok


@pytest.mark.parametrize("rule", PLANTED, ids=lambda r: r.name)
def test_the_all_sizes_proof_refutes_it_beyond_the_bound(rule: Rule) -> None:
    out = verify_all_sizes(rule)
    assert not out.ok and out.status == "refuted", out.counterexample
    assert out.counterexample is not None and "confirmed numerically" in out.counterexample
    v = verify_rule(rule, numeric_trials=0)  # no numeric trial: the proof decides
    assert not v.ok and v.status == "refuted" and v.method == "lemmas"


@pytest.mark.parametrize("rule", PLANTED, ids=lambda r: r.name)
def test_it_does_not_load(rule: Rule, tmp_path: Path) -> None:
    with pytest.raises(UnverifiedRuleError):
        load_library(["constfold"], extra=[rule], cache_dir=tmp_path, allow_bounded=True)


@settings(max_examples=8, deadline=None)
@given(roots=st.lists(st.integers(1, 12), min_size=1, max_size=5, unique=True))
def test_any_vanishing_polynomial_in_a_size_is_refuted(roots: list[int]) -> None:
    rule = parse_rule(f"p: (Sum ?a ?x) => (mul (Sum ?a ?x) (Const {_vanishing(sorted(roots))})) "
                      "[user]")
    out = verify_all_sizes(rule)
    assert not out.ok and out.status == "refuted", (roots, out.counterexample)


# -- size-dependent side conditions are proved, not assumed ----------------------------------

SOUND = [
    # a size as a value: the free term summed n times
    "(Sum ?a (add ?x ?y)) => (add (Sum ?a ?x) (mul (Const (- (* (size ?a) 2.0) (size ?a))) ?y)) "
    "if (has-axis ?a ?x) (not-in ?a ?y)",
    # the outer count of a split as a value: n / f parts, each adding y once
    "(Sum (outer ?a ?f) (Max (inner ?a ?f) (Split ?a ?f (add ?x ?y)))) => "
    "(add (Sum (outer ?a ?f) (Max (inner ?a ?f) (Split ?a ?f ?x))) (mul (Const (quot ?a ?f)) ?y)) "
    "if (has-axis ?a ?x) (not-in ?a ?y) (divides ?f ?a)",
    # a mean over a split axis: n = (n / f) * f
    "(div (Sum ?a ?x) (Const (size ?a))) => "
    f"(div {SPLIT} (mul (Const (quot ?a ?f)) (Const (/ (size ?a) (quot ?a ?f))))) "
    "if (divides ?f ?a)",
]

WRONG = [
    # the count of the split's parts is n / f, not n
    "(Sum (outer ?a ?f) (Max (inner ?a ?f) (Split ?a ?f (add ?x ?y)))) => "
    "(add (Sum (outer ?a ?f) (Max (inner ?a ?f) (Split ?a ?f ?x))) (mul (Const (size ?a)) ?y)) "
    "if (has-axis ?a ?x) (not-in ?a ?y) (divides ?f ?a)",
    # a mean over the inner part only: right for one part (n = f), which divides forbids
    f"(div (Sum ?a ?x) (Const (size ?a))) => (div {SPLIT} (Const (/ (size ?a) (quot ?a ?f)))) "
    "if (divides ?f ?a)",
    # true for size 1 only
    "(Max ?a ?x) => (Sum ?a ?x)",
    # undefined for size 1 (a division by n - 1), where the left side is defined
    "(Sum ?a ?x) => (div (mul (Sum ?a ?x) (Const (- (size ?a) 1.0))) (Const (- (size ?a) 1.0)))",
]


@pytest.mark.parametrize("text", SOUND)
def test_a_sound_size_dependent_rule_is_proved_for_all_sizes(text: str) -> None:
    v = verify_rule(parse_rule(f"ok: {text} [user]"))
    assert v.ok and v.scope == ALL_SIZES, v.counterexample


@pytest.mark.parametrize("text", WRONG)
def test_a_wrong_size_dependent_rule_is_refuted_at_a_size(text: str) -> None:
    v = verify_rule(parse_rule(f"bad: {text} [user]"), numeric_trials=0)
    assert not v.ok and v.status == "refuted", v.counterexample
    assert v.counterexample is not None and "confirmed numerically" in v.counterexample


def test_every_lemma_a_proof_uses_is_documented() -> None:
    from kernelsat.proofs.verify_lemmas import LEMMAS
    from kernelsat.rewrites.library import library_rules

    used: set[str] = set()
    for rule in library_rules():
        try:
            out = verify_all_sizes(rule)
        except ValueError:  # an elementwise rule with constant arithmetic
            continue
        used |= out.lemmas
    assert used and used <= set(LEMMAS), used - set(LEMMAS)
    assert {"split-reindex", "sum-fubini", "max-fubini", "sum-const"} <= used
