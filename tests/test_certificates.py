"""Certificates: JSON round trip, the shared DAG table, linear size, atomic writes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.ir import Const, In, Sum, Term, add, dag_size, exp, mul
from kernelsat.proofs.certificate import Certificate, CertificateError, make_certificate
from kernelsat.proofs.checker import FORMAT, check
from kernelsat.proofs.steps import Step
from kernelsat.rewrites.rule import Rule, apply_at, parse_rules

RULES = parse_rules(
    """
    mul-one:  (mul ?x (Const 1.0)) => ?x [elementwise]
    add-comm: (add ?a ?b) => (add ?b ?a) [elementwise]
    mul-zero: (mul ?x (Const 0.0)) => (Const 0.0) [elementwise]
    """
    "sum-split: (Sum ?a ?x) => (Sum (outer ?a ?f) (Sum (inner ?a ?f) (Split ?a ?f ?x)))"
    " if (divides ?f ?a) [tiling]"
)


class Library:
    def __init__(self, rules: Sequence[Rule]) -> None:
        self.rules = list(rules)
        self.by_name = {r.name: r for r in rules}
        self.hash = hashlib.sha256("\n".join(sorted(r.key for r in rules)).encode()).hexdigest()


LIB = Library(RULES)
X = In("x", (("i", 4), ("n", 8)))


def _wrap_chain(spec: Term, n: int) -> tuple[list[Step], Term]:
    """n backward mul-one steps at the root, then n forward ones: a chain of 2n steps."""
    steps = [Step("mul-one", "backward", (), {}) for _ in range(n)]
    steps += [Step("mul-one", "forward", (), {}) for _ in range(n)]
    return steps, spec


def test_round_trip_and_fields() -> None:
    spec = Sum("n", exp(X))
    steps = [Step("sum-split", "forward", (), {"f": 4}), Step("mul-one", "backward", (0, 0), {})]
    t = spec
    for s in steps:
        t = apply_at(LIB.by_name[s.rule], t, s.path, s.direction, s.bindings)
    ks = "kernel k(N=4)\nin x[i:N, n:8] f32\nout y[i] = sum(n: exp(x[i, n]))\n"
    cert = make_certificate(spec, ks, steps, t, LIB, params={"N": 4})
    obj = json.loads(cert.to_json())
    assert obj["format"] == FORMAT
    assert obj["spec"]["key"] == spec.key and obj["final"]["key"] == t.key
    assert obj["spec"]["params"] == {"N": 4} and obj["spec"]["kind"] == "ks"
    assert [r["name"] for r in obj["library"]["rules"]] == ["mul-one", "sum-split"]
    assert all(r["text"] == LIB.by_name[r["name"]].text() for r in obj["library"]["rules"])
    assert obj["steps"][0]["bindings"] == {"f": {"int": 4}}
    back = Certificate.from_json(cert.to_json())
    assert back == cert
    assert check(cert, LIB).accepted


def test_term_bindings_are_references_into_the_table() -> None:
    # mul-zero backwards needs the left-only variable ?x as a term
    spec = mul(Const(0.0), Const(1.0))
    step = Step("mul-one", "forward", (), {})
    zero = apply_at(LIB.by_name["mul-one"], spec, (), "forward")
    e = exp(Const(2.0))
    back = Step("mul-zero", "backward", (), {"x": e})
    final = apply_at(LIB.by_name["mul-zero"], zero, (), "backward", {"x": e})
    cert = make_certificate(spec, "", [step, back], final, LIB)
    obj = cert.to_obj()
    ref = obj["steps"][1]["bindings"]["x"]["term"]
    assert obj["terms"][ref][0] == "exp"
    assert check(cert, LIB).accepted
    assert Certificate.from_json(cert.to_json()).steps[1].bindings["x"] is e


def test_dag_table_stores_each_node_once() -> None:
    shared = exp(X)
    spec = add(shared, shared)
    final = add(shared, shared)
    cert = make_certificate(spec, "", [Step("add-comm", "forward", (), {})], final, LIB)
    assert len(cert.to_obj()["terms"]) == dag_size(spec) == 3


def test_size_is_linear_in_steps() -> None:
    spec = Sum("n", exp(X))
    sizes = []
    for n in (100, 200, 400):
        steps, final = _wrap_chain(spec, n)
        sizes.append(len(make_certificate(spec, "", steps, final, LIB).to_json()))
    assert sizes[2] - sizes[1] == pytest.approx(2 * (sizes[1] - sizes[0]), rel=0.05)
    # and a chain of 800 steps checks
    steps, final = _wrap_chain(spec, 400)
    assert check(make_certificate(spec, "", steps, final, LIB), LIB).accepted


def test_atomic_write(tmp_path: Path) -> None:
    spec = Sum("n", exp(X))
    steps, final = _wrap_chain(spec, 2)
    cert = make_certificate(spec, "", steps, final, LIB)
    out = tmp_path / "proof.json"
    cert.write(out)
    assert [p.name for p in tmp_path.iterdir()] == ["proof.json"]
    assert Certificate.from_json(out.read_text()) == cert


def test_errors() -> None:
    with pytest.raises(CertificateError, match="not valid JSON"):
        Certificate.from_json("{")
    with pytest.raises(CertificateError, match="steps\\[0\\]"):
        obj = make_certificate(X, "", [Step("mul-one", "forward", (), {})], X, LIB).to_obj()
        obj["steps"][0]["direction"] = "up"
        Certificate.from_json(json.dumps(obj))
    with pytest.raises(CertificateError, match="not in the library"):
        make_certificate(X, "", [Step("no-rule", "forward", (), {})], X, LIB)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.sampled_from([(0,), (0, 0), ()]), max_size=12),
       st.sampled_from([0.5, 1.0, -2.25, 1e-300, 3.0e10]))
def test_round_trip_property(paths: list[tuple[int, ...]], c: float) -> None:
    spec = Sum("n", mul(exp(X), Const(c)))
    steps = []
    t = spec
    for p in paths:
        try:
            t = apply_at(LIB.by_name["mul-one"], t, p, "backward")
        except Exception:
            continue
        steps.append(Step("mul-one", "backward", p, {}))
    cert = make_certificate(spec, "", steps, t, LIB)
    assert Certificate.from_json(cert.to_json()) == cert
    assert check(cert.to_json(), LIB).accepted


# -- the CLI: prove and verify ----------------------------------------------------------------

SPEC = """kernel k(N=8)
in X[i:N] f32
in Y[i:N] f32
out O[i] = (X[i] + Y[i]) * X[i]
"""
CLI_RULES = """
add-comm: (add ?a ?b) => (add ?b ?a) [elementwise]
mul-comm: (mul ?a ?b) => (mul ?b ?a) [elementwise]
mul-dist: (mul ?a (add ?b ?c)) => (add (mul ?a ?b) (mul ?a ?c)) [elementwise]
"""


def test_cli_prove_and_verify(tmp_path: Path) -> None:
    pytest.importorskip("kernelsat.egraph.saturate")
    from typer.testing import CliRunner

    from kernelsat.cli import app

    (tmp_path / "k.ks").write_text(SPEC)
    (tmp_path / "r.rules").write_text(CLI_RULES)
    (tmp_path / "good.sexpr").write_text(
        "(add (mul (In X i:8) (In X i:8)) (mul (In Y i:8) (In X i:8)))")
    (tmp_path / "bad.sexpr").write_text("(mul (In X i:8) (In Y i:8))")
    cert, rules = tmp_path / "c.json", str(tmp_path / "r.rules")
    run = CliRunner().invoke
    res = run(app, ["prove", str(tmp_path / "k.ks"), str(tmp_path / "good.sexpr"),
                    "--out", str(cert), "--rules", rules])
    assert res.exit_code == 0, res.output
    res = run(app, ["verify", str(cert), "--rules", rules])
    assert res.exit_code == 0 and "ACCEPTED" in res.output
    res = run(app, ["verify", str(cert), "--rules", rules, "--program",
                    str(tmp_path / "bad.sexpr")])
    assert res.exit_code == 1 and "REJECTED" in res.output
    # tampering: flip every direction
    (tmp_path / "t.json").write_text(cert.read_text().replace('"forward"', '"backward"'))
    res = run(app, ["verify", str(tmp_path / "t.json"), "--rules", rules])
    assert res.exit_code == 1 and "REJECTED at step" in res.output
    # not provable: no certificate is written
    res = run(app, ["prove", str(tmp_path / "k.ks"), str(tmp_path / "bad.sexpr"),
                    "--out", str(tmp_path / "no.json"), "--rules", rules])
    assert res.exit_code == 1 and "no chain found" in res.output
    assert not (tmp_path / "no.json").exists()
