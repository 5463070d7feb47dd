"""The independent checker: valid chains accepted, mutated and hostile certificates
rejected with a clear reason (never a traceback), and no dependency on the e-graph."""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import random
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernelsat.interp import evaluate_as
from kernelsat.ir import Const, In, Split, Sum, Term, add, exp, mul, neg, postorder
from kernelsat.proofs.certificate import make_certificate
from kernelsat.proofs.checker import Limits, check
from kernelsat.proofs.steps import Step
from kernelsat.rewrites.rule import Rule, RuleError, apply_at, parse_rules

SPLIT = (
    "sum-split: (Sum ?a ?x) => (Sum (outer ?a ?f) (Sum (inner ?a ?f) (Split ?a ?f ?x)))"
    " if (divides ?f ?a) [tiling]"
)
RULES = parse_rules(
    """
    add-comm:  (add ?a ?b) => (add ?b ?a) [elementwise]
    mul-comm:  (mul ?a ?b) => (mul ?b ?a) [elementwise]
    add-assoc: (add (add ?a ?b) ?c) => (add ?a (add ?b ?c)) [elementwise]
    mul-dist:  (mul ?a (add ?b ?c)) => (add (mul ?a ?b) (mul ?a ?c)) [elementwise]
    mul-one:   (mul ?x (Const 1.0)) => ?x [elementwise]
    add-self:  (add ?a ?a) => (mul ?a (Const 2.0)) [elementwise]
    sum-hoist: (Sum ?a (mul ?x ?y)) => (mul ?x (Sum ?a ?y)) if (not-in ?a ?x) [reduction]
    """
    + SPLIT
)
UNVERIFIED = parse_rules("mul-zero: (mul ?x (Const 0.0)) => (Const 1.0) [elementwise]")[0]


class Library:
    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)
        self.by_name = {r.name: r for r in rules}
        self.hash = hashlib.sha256("\n".join(sorted(r.key for r in rules)).encode()).hexdigest()


LIB = Library(RULES)
X, Y = In("x", (("i", 4),)), In("y", (("i", 4),))
V = In("v", (("i", 4), ("n", 8)))
SPECS = [
    mul(add(X, Y), add(Y, X)),
    Sum("n", mul(X, exp(V))),
    add(add(X, Y), add(X, Y)),
    Sum("i", mul(add(X, Const(1.0)), Y)),
]


def _paths(t: Term) -> list[tuple[int, ...]]:
    out, stack = [], [((), t)]
    while stack:
        p, u = stack.pop()
        out.append(p)
        stack.extend(((*p, i), a) for i, a in enumerate(u.args))
    return out


def random_chain(spec: Term, n: int, rng: random.Random) -> tuple[list[Step], Term]:
    """A random rewrite chain of up to n steps (forward and backward), for certificates."""
    steps: list[Step] = []
    t = spec
    for _ in range(n):
        options = []
        for path in _paths(t):
            for rule in RULES:
                for direction in ("forward", "backward"):
                    for b in ({}, {"f": 2}, {"f": 4}) if rule.parameters else ({},):
                        try:
                            u = apply_at(rule, t, path, direction, b)  # type: ignore[arg-type]
                        except RuleError:
                            continue
                        if len(list(postorder(u))) < 40:
                            options.append((Step(rule.name, direction, path, b), u))  # type: ignore[arg-type]
        if not options:
            break
        step, t = rng.choice(options)
        steps.append(step)
    return steps, t


def certificates() -> list[dict[str, Any]]:
    rng = random.Random(7)
    out = []
    for spec in SPECS:
        steps, final = random_chain(spec, 8, rng)
        out.append(make_certificate(spec, "", steps, final, LIB).to_obj())
    return out


def test_valid_chains_are_accepted() -> None:
    for obj in certificates():
        result = check(json.dumps(obj), LIB)
        assert result.accepted, result.reason
        assert result.failed_step is None


def test_goal_that_must_fail() -> None:
    # x + y is not provably x * y: a one-step claim with any rule fails
    cert = make_certificate(add(X, Y), "", [Step("add-comm", "forward", (), {})], mul(X, Y), LIB)
    result = check(cert, LIB)
    assert not result.accepted and "not at the claimed program" in result.reason


# -- mutations ---------------------------------------------------------------------------


def _numbers(t: Term) -> np.ndarray:
    rng = np.random.default_rng(0)
    env = {"x": rng.uniform(0.5, 2, 4), "y": rng.uniform(0.5, 2, 4),
           "v": rng.uniform(0.5, 2, (4, 8))}
    return evaluate_as(t, env, tuple(sorted(t.shape)))


def _term_of(obj: dict[str, Any], index: int) -> Term:
    from kernelsat.proofs.checker import _terms

    return _terms(obj["terms"], Limits())[index]


def _set_term(obj: dict[str, Any], which: str, term: Term) -> None:
    """Point spec or final at another term (appended to the table), with a matching key."""
    from kernelsat.proofs.certificate import _Table

    table = _Table()
    for i, t in enumerate(_terms_all(obj)):
        table.index[t] = i
    table.rows = obj["terms"]
    obj[which]["term"] = table.add(term)
    obj[which]["key"] = term.key


def _terms_all(obj: dict[str, Any]) -> list[Term]:
    from kernelsat.proofs.checker import _terms

    return _terms(obj["terms"], Limits())


Mutation = Callable[[dict[str, Any], random.Random], bool]


def _step(obj: dict[str, Any], rng: random.Random) -> dict[str, Any] | None:
    return rng.choice(obj["steps"]) if obj["steps"] else None


def m_rule_name(obj: dict[str, Any], rng: random.Random) -> bool:
    s = _step(obj, rng)
    names = [r["name"] for r in obj["library"]["rules"]]
    others = [n for n in names if s and n != s["rule"]] or ["no-such-rule"]
    if s is None:
        return False
    s["rule"] = rng.choice(others)
    return True


def m_direction(obj: dict[str, Any], rng: random.Random) -> bool:
    s = _step(obj, rng)
    if s is None:
        return False
    s["direction"] = {"forward": "backward", "backward": "forward"}[s["direction"]]
    return True


def m_position(obj: dict[str, Any], rng: random.Random) -> bool:
    s = _step(obj, rng)
    if s is None:
        return False
    p = s["path"]
    flipped = [1 - p[0], *p[1:]] if p else [1]
    s["path"] = rng.choice([[*p, 0], [*p, 1], p[:-1] if p else [0], flipped])
    return True


def m_binding(obj: dict[str, Any], rng: random.Random) -> bool:
    s = _step(obj, rng)
    if s is None:
        return False
    if "f" in s["bindings"]:
        s["bindings"]["f"] = {"int": {2: 4, 4: 2}[s["bindings"]["f"]["int"]]}
    else:  # bind a pattern variable to a term it does not match
        _set_term(obj, "spec", _term_of(obj, obj["spec"]["term"]))
        idx = obj["spec"]["term"]
        s["bindings"][rng.choice("abxy")] = {"term": idx}
    return True


def m_drop(obj: dict[str, Any], rng: random.Random) -> bool:
    if not obj["steps"]:
        return False
    del obj["steps"][rng.randrange(len(obj["steps"]))]
    return True


def m_swap(obj: dict[str, Any], rng: random.Random) -> bool:
    steps = obj["steps"]
    pairs = [i for i in range(len(steps) - 1) if steps[i] != steps[i + 1]]
    if not pairs:
        return False
    i = rng.choice(pairs)
    steps[i], steps[i + 1] = steps[i + 1], steps[i]
    return True


def m_final(obj: dict[str, Any], rng: random.Random) -> bool:
    final = _term_of(obj, obj["final"]["term"])
    _set_term(obj, "final", add(final, Const(1.0)) if not final.shape else add(final, Const(0.5)))
    return True


def m_final_key(obj: dict[str, Any], rng: random.Random) -> bool:
    obj["final"]["key"] = "0" * 32
    return True


def m_spec(obj: dict[str, Any], rng: random.Random) -> bool:
    spec = _term_of(obj, obj["spec"]["term"])
    _set_term(obj, "spec", neg(spec))
    return True


def m_unverified(obj: dict[str, Any], rng: random.Random) -> bool:
    s = _step(obj, rng)
    if s is None:
        return False
    obj["library"]["rules"].append({"name": UNVERIFIED.name, "text": UNVERIFIED.text()})
    s["rule"] = UNVERIFIED.name
    return True


def m_rule_text(obj: dict[str, Any], rng: random.Random) -> bool:
    r = rng.choice(obj["library"]["rules"])
    r["text"] = r["text"].replace("=>", "=> (neg", 1).replace(" [", ") [", 1)
    return True


def m_library_hash(obj: dict[str, Any], rng: random.Random) -> bool:
    obj["library"]["hash"] = "f" * 64
    return True


MUTATIONS: dict[str, Mutation] = {
    "rule name": m_rule_name, "direction": m_direction, "position": m_position,
    "binding": m_binding, "drop step": m_drop, "swap steps": m_swap, "final term": m_final,
    "final key": m_final_key, "spec": m_spec, "unverified rule": m_unverified,
    "rule text": m_rule_text, "library hash": m_library_hash,
}
# mutations after which the certificate can still be a true proof (a swap of independent
# steps, a direction flip of a symmetric rule, the same rewrite at a symmetric position)
MAY_STAY_VALID = {"direction", "swap steps", "rule name", "position", "binding", "drop step"}


def test_mutations_are_rejected(record_property: Callable[[str, object], None]) -> None:
    rng = random.Random(11)
    total = rejected = benign = 0
    per_kind: dict[str, list[int]] = {k: [0, 0] for k in MUTATIONS}
    for base in certificates():
        for kind, mutate in MUTATIONS.items():
            for _ in range(6):
                obj = copy.deepcopy(base)
                if not mutate(obj, rng) or obj == base:
                    continue
                result = check(json.dumps(obj), LIB)
                total += 1
                per_kind[kind][0] += 1
                if not result.accepted:
                    rejected += 1
                    per_kind[kind][1] += 1
                    assert result.reason
                    continue
                # accepted: only allowed when the mutant is itself a true proof of the
                # same claim (same spec and program, chain replays)
                assert kind in MAY_STAY_VALID, (kind, result)
                assert obj["spec"] == base["spec"] and obj["final"] == base["final"]
                spec = _term_of(obj, obj["spec"]["term"])
                final = _term_of(obj, obj["final"]["term"])
                np.testing.assert_allclose(_numbers(spec), _numbers(final), rtol=1e-9)
                benign += 1
    rate = rejected / total
    print(f"\nmutations: {total}, rejected: {rejected} ({rate:.1%}), still-valid proofs: {benign}")
    for kind, (n, r) in per_kind.items():
        print(f"  {kind:<16} {r}/{n}")
    record_property("mutations", total)
    record_property("rejection_rate", rate)
    assert total >= 150
    assert rejected + benign == total
    assert rate > 0.8


# -- hostile certificates ------------------------------------------------------------------


def _valid() -> dict[str, Any]:
    return certificates()[1]


def _hostile() -> dict[str, Any]:
    base = _valid()
    deep_terms: list[Any] = [["In", ["x", [[["i", 4]]]], []]]
    deep_terms += [["neg", [], [k]] for k in range(20_000)]
    long_chain = copy.deepcopy(base)
    long_chain["steps"] = [{"rule": "add-comm", "direction": "forward", "path": [],
                            "bindings": {}}] * 100_000
    bad_then_long = copy.deepcopy(base)
    bad_then_long["steps"] = [{"rule": "mul-one", "direction": "forward", "path": [0, 0, 0],
                               "bindings": {}}] * 40_000

    def patched(path: Sequence[Any], value: Any) -> dict[str, Any]:
        obj = copy.deepcopy(base)
        target = obj
        for k in path[:-1]:
            target = target[k]
        target[path[-1]] = value
        return obj

    return {
        "empty": "",
        "not json": "{\"format\": ",
        "a list": "[]",
        "null": "null",
        "bytes": b"\xff\xfe\x00",
        "nested json": "[" * 100_000 + "]" * 100_000,
        "huge int": json.dumps(base).replace('"path": []', '"path": [' + "9" * 5000 + "]", 1),
        "wrong format": patched(["format"], "kernelsat-certificate/999"),
        "format int": patched(["format"], 1),
        "terms dict": patched(["terms"], {}),
        "steps string": patched(["steps"], "all of them"),
        "unknown op": patched(["terms", 0], ["Frobnicate", [], []]),
        "bool child": patched(["terms"], [["Const", [1.0], []], ["neg", [], [True]]]),
        "cyclic ref": patched(["terms", 1], ["neg", [], [1]]),
        "forward ref": patched(["terms", 0], ["neg", [], [5]]),
        "dangling ref": patched(["final", "term"], 10**6),
        "negative ref": patched(["spec", "term"], -1),
        "nan const": json.dumps(patched(["terms"], [["Const", [float("nan")], []]])),
        "string const": patched(["terms"], [["Const", ["1.0"], []]]),
        "bad dims": patched(["terms"], [["In", ["x", [[["i", -4]]]], []]]),
        "deep term": {**copy.deepcopy(base), "terms": deep_terms},
        "unknown rule": patched(["steps", 0, "rule"], "no-such-rule"),
        "path type": patched(["steps", 0, "path"], ["0"]),
        "direction": patched(["steps", 0, "direction"], "sideways"),
        "untagged binding": patched(["steps", 0, "bindings"], {"x": 3}),
        "bad tag": patched(["steps", 0, "bindings"], {"x": {"lambda": 3}}),
        "binding ref": patched(["steps", 0, "bindings"], {"x": {"term": 10**9}}),
        "rule not text": patched(["library", "rules", 0, "text"], 42),
        "garbage rule text": patched(["library", "rules", 0, "text"], "((((("),
        "oversized rule": patched(["library", "rules", 0, "text"], "x" * 100_000),
        "duplicate rule": patched(["library", "rules"], base["library"]["rules"] * 2),
        "missing final": {k: v for k, v in base.items() if k != "final"},
        "params type": patched(["spec", "params"], {"N": "big"}),
        "100k steps": long_chain,
        "bad first of 40k": bad_then_long,
    }


@pytest.mark.parametrize("name", list(_hostile()))
def test_hostile_certificates_are_rejected(name: str) -> None:
    cert = _hostile()[name]
    result = check(cert if isinstance(cert, str | bytes) else json.dumps(cert), LIB)
    assert not result.accepted
    assert isinstance(result.reason, str) and result.reason
    assert "Traceback" not in result.reason
    if name == "bad first of 40k":
        assert result.failed_step == 0


def test_hostile_python_objects() -> None:
    class Weird:
        def to_json(self) -> Any:
            return {"format": object()}

    for cert in (None, 3, [1, 2], {"format": None}, Weird(), {1: 2}):
        result = check(cert, LIB)
        assert not result.accepted and result.reason


def test_limits_are_arguments() -> None:
    obj = _valid()
    n = len(obj["steps"])
    assert check(json.dumps(obj), LIB).accepted
    tight = check(json.dumps(obj), LIB, Limits(max_steps=n - 1))
    assert not tight.accepted and "limit" in tight.reason


# -- independence --------------------------------------------------------------------------


CHECKER = Path(__file__).resolve().parents[1] / "proofs" / "checker.py"
ALLOWED = {"kernelsat.ir", "kernelsat.ops", "kernelsat.sexpr", "kernelsat.rewrites.rule",
           "kernelsat.rewrites.library", "kernelsat.spec", "kernelsat.spec_syntax",
           "kernelsat.proofs.proof_kinds"}  # the shipped record of proof kinds (data, no z3)
# what the spec parser (part of the trusted base) brings in
SPEC_PARSER = {"kernelsat.macros", "kernelsat.program"}


def test_checker_imports_only_ir_and_rule_data() -> None:
    tree = ast.parse(CHECKER.read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    ours = {m for m in imported if m and m.startswith("kernelsat")}
    assert ours <= ALLOWED, ours - ALLOWED


def test_checker_transitive_imports_exclude_egraph() -> None:
    code = (
        "import sys, json\n"
        "import kernelsat\n"
        "base = set(sys.modules)\n"
        "import kernelsat.proofs.checker\n"
        "new = sorted(m for m in set(sys.modules) - base if m.startswith('kernelsat'))\n"
        "print(json.dumps([new, sorted(m for m in sys.modules if 'egglog' in m or 'egraph' in m)]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    new, forbidden = json.loads(out.stdout)
    assert forbidden == []
    assert set(new) <= ALLOWED | SPEC_PARSER | {"kernelsat.rewrites", "kernelsat.proofs",
                                                "kernelsat.proofs.checker"}, new


def test_checker_is_small() -> None:
    lines = [ln for ln in CHECKER.read_text().splitlines() if ln.strip()]
    assert len(lines) < 520  # the spec binding and the stand-alone CLI included


def test_split_and_condition_steps_are_checked() -> None:
    v = In("v", (("n", 8),))
    spec = Sum("n", exp(v))
    final = Sum("n/o4", Sum("n/i4", Split("n", 4, exp(v))))
    good = make_certificate(spec, "", [Step("sum-split", "forward", (), {"f": 4})], final, LIB)
    assert check(good, LIB).accepted
    # a factor that does not divide, and a missing factor
    for b in ({"f": 3}, {}, {"f": 8}):
        bad = make_certificate(spec, "", [Step("sum-split", "forward", (), b)], final, LIB)
        result = check(bad, LIB)
        assert not result.accepted and result.failed_step == 0
    # a condition that fails: n is an axis of exp(v)
    w = Sum("n", mul(exp(v), X))
    hoist = make_certificate(w, "", [Step("sum-hoist", "forward", (), {})], w, LIB)
    result = check(hoist, LIB)
    assert not result.accepted and result.failed_step == 0
