"""Attacks on what a certificate claims: its spec must be the term its text denotes.

An attacker controls every byte of a certificate, so each forgery here is written
through the `Certificate` dataclass (a well-formed file with matching keys and a
replayable chain), not by `make_certificate`, which refuses to write them. Each must
be REJECTED with a reason that says what is wrong; the edits that do not change what
the spec denotes (comments, whitespace, names of the output) must still be ACCEPTED.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.driver.pipeline import as_program, prove_term
from kernelsat.ir import Const, In, Term, add, exp, mul
from kernelsat.proofs.certificate import Certificate, CertificateError, make_certificate
from kernelsat.proofs.checker import CheckResult, check, load_expected, shipped_library
from kernelsat.sexpr import to_sexpr
from kernelsat.spec import parse_spec
from kernelsat.testing import programs

SOFTMAX = {"M": 4, "N": 8}


def rejected(result: CheckResult, *fragments: str) -> None:
    assert not result.accepted, result.reason
    assert not result.reason.startswith("internal error"), result.reason
    for f in fragments:
        assert f in result.reason, (f, result.reason)


def accepted(result: CheckResult) -> None:
    assert result.accepted, result.reason


def forge(base: Certificate, **fields: Any) -> str:
    """The JSON of `base` with some fields replaced (the key fields follow the terms)."""
    return replace(base, **fields).to_json()


@pytest.fixture(scope="module")
def cert(certs: Any) -> Certificate:
    c: Certificate = certs.certificate("softmax")
    return c


@pytest.fixture(scope="module")
def softmax_text(certs: Any) -> str:
    text: str = certs.spec_text("softmax")
    return text


def program_at(text: str, params: dict[str, int]) -> Term:
    return parse_spec(text, "<test>", params).term


# -- the two examples ------------------------------------------------------------


def test_softmax_text_with_input_as_the_spec_term(cert: Certificate) -> None:
    x = In("X", (("i", 4), ("n", 8)))
    forged = forge(cert, spec=x, final=x, steps=(), rules=())
    rejected(check(forged), "spec.term is not the term that spec.text",
             "kernel softmax(M=4, N=8)")


def test_text_at_default_sizes_with_a_term_built_small(cert: Certificate) -> None:
    # the text says N=1024 (its kernel line) and no params: its term is 4096x1024
    rejected(check(forge(cert, spec_params={})), "kernel softmax(M=4096, N=1024)",
             "'n': 1024", "'n': 8")


# -- parameters ----------------------------------------------------------------------------


@pytest.mark.parametrize("params", [{"M": 4, "N": 16}, {"M": 8, "N": 8}, {"N": 8},
                                    {"M": 4, "N": 8, "K": 2}])
def test_changed_params_do_not_bind(cert: Certificate, params: dict[str, int]) -> None:
    result = check(forge(cert, spec_params=params))
    rejected(result)
    assert "spec.term is not" in result.reason or "unknown parameter 'K'" in result.reason


@pytest.mark.parametrize("value", [0, -1, 10**400, 2**41, "8", 8.5, True, None, [8], {"v": 8}])
def test_params_of_the_wrong_kind(certs: Any, value: Any) -> None:
    obj = certs.obj()
    obj["spec"]["params"]["N"] = value
    rejected(check(json.dumps(obj)), "spec.params.N")


def test_params_in_a_different_order_still_bind(certs: Any) -> None:
    obj = certs.obj()
    obj["spec"]["params"] = dict(reversed(list(obj["spec"]["params"].items())))
    accepted(check(json.dumps(obj)))


# -- the text ----------------------------------------------------------------------------


def test_text_of_another_spec(cert: Certificate, certs: Any) -> None:
    other = certs.spec_text("logsumexp")
    rejected(check(forge(cert, spec_text=other)), "kernel logsumexp(M=4, N=8)")
    rejected(check(forge(cert, spec_text=certs.spec_text("rmsnorm"),
                         spec_params={"M": 4, "N": 8})), "kernel rmsnorm")


@pytest.mark.parametrize("edit", [
    ("softmax(n: X[i, n])", "softmax(n: X[i, n] * 2)"),       # another value
    ("softmax(n: X[i, n])", "softmax(n: X[i, n] + 0)"),       # equal over the reals, not the term
    ("softmax(n: X[i, n])", "logsumexp(n: X[i, n])"),         # another function
    ("in X[i:M, n:N]", "in X[i:N, n:M]"),                     # transposed sizes
    ("in X[i:M, n:N] f32\nout Y[i, n] = softmax(n: X[i, n])",
     "in Z[i:M, n:N] f32\nout Y[i, n] = softmax(n: Z[i, n])"),  # the input renamed
])
def test_text_edits_that_change_the_spec(cert: Certificate, edit: tuple[str, str]) -> None:
    old, new = edit
    assert old in cert.spec_text
    result = check(forge(cert, spec_text=cert.spec_text.replace(old, new)))
    rejected(result)
    assert "spec.term is not" in result.reason or "does not parse" in result.reason


@pytest.mark.parametrize("edit", [
    ("# softmax:", "# a comment that says anything at all\n# softmax:"),
    ("out Y[i, n] =", "out   Y[i, n]   =  "),                       # spaces
    ("in X", "\n\n# the input\nin X"),                               # blank lines, comments
    ("out Y[", "out Softmaxed["),                                    # the output's name
    ("\n", "   \n"),                                                 # trailing spaces
    ("\n", "\r\n"),                                                  # CRLF line ends
    ("kernel softmax(M=4096, N=1024)", "kernel softmax(M=4096, N=1024, K=3)"),  # unused param
    ("] f32", "] f64 positive"),                                   # dtype, role: not the value
    ("out Y[i, n]", "out Y[n, i]"),                                 # the layout: not the value
])
def test_text_edits_that_keep_the_spec_still_bind(cert: Certificate,
                                                  edit: tuple[str, str]) -> None:
    old, new = edit
    text = cert.spec_text.replace(old, new)
    assert text != cert.spec_text
    accepted(check(forge(cert, spec_text=text)))


def test_text_that_does_not_parse(cert: Certificate) -> None:
    for text, why in (("", "an empty spec"), ("kernel k(N=4)\nin X[i:N] f32\n", "out"),
                      ("kernel k(N=4)\nout Y[i] = (((", "spec.text:2"),
                      ("kernel k(N=4)\n" + "in X[i:N] f32\nout Y[i] = " + "(" * 5000 + "X[i]"
                       + ")" * 5000, "does not parse")):
        result = check(forge(cert, spec_text=text, spec_params={}))
        rejected(result, "spec.text", why)


def test_oversized_text(cert: Certificate) -> None:
    big = cert.spec_text + "#" * (2 << 20)
    rejected(check(forge(cert, spec_text=big)), "limit")


# -- the kind ------------------------------------------------------------------------------


def test_spec_kind_attacks(certs: Any, cert: Certificate) -> None:
    obj = certs.obj()
    del obj["spec"]["kind"]
    rejected(check(json.dumps(obj)), "missing field 'kind'")
    for kind, why in (("python", "not one of ks, sexpr"), (3, "spec.kind"),
                      ("sexpr", "spec.params")):
        obj = certs.obj()
        obj["spec"]["kind"] = kind
        rejected(check(json.dumps(obj)), why)
    rejected(check(forge(cert, spec_kind="sexpr", spec_params={})), "as a term")
    as_term = to_sexpr(cert.spec)
    rejected(check(forge(cert, spec_kind="ks", spec_text=as_term)), "as a .ks spec")
    # the s-expression of the very term binds it
    accepted(check(forge(cert, spec_kind="sexpr", spec_text=as_term, spec_params={})))


def test_sexpr_specs() -> None:
    lib = shipped_library()
    x = In("x", (("i", 4),))
    spec = add(mul(exp(x), Const(1.0)), exp(x))
    program = as_program(spec, None)
    good, _, status = prove_term(program, None, lib, spec)  # the eager certificate
    assert status == "eager" and good is not None and good.spec_kind == "sexpr"
    accepted(check(good))
    # an unshared spelling with comments denotes the same (hash-consed) term
    spelled = ("; the same term\n(add (mul (exp (In x i:4)) (Const 1.0))\n"
               "     (exp (In x i:4)))")
    accepted(check(forge(good, spec_text=spelled)))
    for other in ("(add (mul (exp (In x i:4)) (Const 2.0)) (exp (In x i:4)))",
                  "(add (mul (exp (In x i:8)) (Const 1.0)) (exp (In x i:8)))",
                  "(In x i:4)", "(add", "(frob x)", ""):
        rejected(check(forge(good, spec_text=other)), "spec.text")


# -- a consistent forgery proves a claim about another spec: --spec catches it ---------------


def test_consistent_forgery_is_about_another_spec(cert: Certificate, certs: Any,
                                                  softmax_text: str) -> None:
    x = In("X", (("i", 4), ("n", 8)))
    trivial = forge(cert, spec_kind="sexpr", spec_text=to_sexpr(x), spec_params={}, spec=x,
                    final=x, steps=(), rules=())
    accepted(check(trivial))  # a true claim: X equals X
    mine = program_at(softmax_text, SOFTMAX)
    rejected(check(trivial, spec=mine, spec_name="softmax.ks"), "not softmax.ks",
             "the term (In X i:4 n:8)")
    lse = certs.certificate("softmax", 0).to_json().replace("x", "x")  # unchanged
    accepted(check(lse, spec=mine))
    other = certs.certificate("rmsnorm")
    accepted(check(other))
    rejected(check(other, spec=mine, spec_name="softmax.ks"),
             "about kernel rmsnorm(M=2, N=8), not softmax.ks")


def test_given_spec_differs(cert: Certificate, softmax_text: str, tmp_path: Any) -> None:
    text = cert.to_json()
    accepted(check(text, spec=program_at(softmax_text, SOFTMAX)))
    for params in ({}, {"N": 8}, {"M": 4, "N": 16}):
        rejected(check(text, spec=program_at(softmax_text, params), spec_name="mine"),
                 "not mine: at position", "the given spec has")
    edited = softmax_text.replace("softmax(n: X[i, n])", "softmax(n: 2 * X[i, n])")
    rejected(check(text, spec=program_at(edited, SOFTMAX)), "not the given spec")
    # the user's file, spaced and commented differently, is the same spec
    path = tmp_path / "mine.ks"
    path.write_text("# mine\n" + softmax_text.replace("=", " = ").replace(",", " , "))
    term, name = load_expected(path, ["M=4", "N=8"])
    accepted(check(text, spec=term, spec_name=name))
    term, name = load_expected(path, ["N=8"])
    rejected(check(text, spec=term, spec_name=name), "mine.ks (kernel softmax(M=4096, N=8))")


# -- the format and the JSON around the spec -------------------------------------------------


def test_old_format_is_rejected_with_a_reason(certs: Any) -> None:
    obj = certs.obj()
    obj["format"] = "kernelsat-certificate/1"
    del obj["spec"]["kind"]
    rejected(check(json.dumps(obj)), "kernelsat-certificate/1 does not bind", "re-create")


def test_duplicate_keys_cannot_show_one_spec_and_check_another(certs: Any) -> None:
    text = certs.text()
    fake = '"spec": {"kind": "sexpr", "text": "(In X i:4 n:8)", "params": {}, "term": 0, ' \
           '"key": "x"}, '
    for forged in (text.replace('"spec": ', fake + '"spec": ', 1),
                   text.replace('"kind": "ks"', '"kind": "ks", "kind": "sexpr"', 1),
                   text.replace('"params": {', '"params": {"N": 1024, ', 1)):
        rejected(check(forged), "appears twice")


def test_spec_key_and_term_reference(certs: Any) -> None:
    obj = certs.obj()
    obj["spec"]["key"] = "0" * 32
    rejected(check(json.dumps(obj)), "spec.key does not match")
    for ref in (-1, 10**6, "0", None, 1.0):
        obj = certs.obj()
        obj["spec"]["term"] = ref
        rejected(check(json.dumps(obj)), "spec.term")
    obj = certs.obj()
    obj["spec"]["term"] = 0  # an existing entry: the input X, not the softmax
    rejected(check(json.dumps(obj)), "spec.term is not the term that spec.text")


# -- the writers only write bound certificates -----------------------------------------------


def test_make_certificate_refuses_an_unbound_spec(cert: Certificate, softmax_text: str) -> None:
    lib = shipped_library()
    with pytest.raises(CertificateError, match="does not denote the spec term"):
        make_certificate(cert.spec, softmax_text, [], cert.spec, lib, {})
    with pytest.raises(CertificateError, match="does not parse"):
        make_certificate(cert.spec, "(spec)", [], cert.spec, lib)
    # a bare term carries its sizes: params given with it are not recorded
    bare = make_certificate(cert.spec, "", [], cert.spec, lib, {"N": 8})
    assert (bare.spec_kind, bare.spec_params) == ("sexpr", {})
    accepted(check(bare))


def test_pipeline_certificates_bind(softmax_text: str) -> None:
    lib = shipped_library()
    program = as_program(softmax_text, SOFTMAX)
    cert, _, status = prove_term(program, None, lib, program.term)
    assert status == "eager" and cert is not None
    assert (cert.spec_kind, cert.spec_params) == ("ks", SOFTMAX)
    accepted(check(cert, spec=program_at(softmax_text, SOFTMAX)))


def test_fields_the_checker_does_not_read_are_rejected(certs: Any) -> None:
    """A field the checker ignores could tell a reader something the proof does not show
    (a claimed size, a second spec): a certificate holds only its documented fields."""
    for where, key, value in (([], "comment", "proves softmax at N=1024"),
                              (["spec"], "sizes", {"N": 1024}),
                              (["spec"], "file", "specs/softmax.ks"),
                              (["final"], "text", "(In X i:4 n:8)"),
                              (["library"], "verified", True),
                              (["library", "rules", 0], "method", "smt"),
                              (["steps", 0], "note", "skip")):
        obj = certs.obj()
        target = obj
        for k in where:
            target = target[k]
        target[key] = value
        rejected(check(json.dumps(obj)), f"unknown field {key!r}")


@settings(max_examples=60, deadline=None)
@given(programs(max_depth=5), st.floats(allow_nan=False, allow_infinity=False))
def test_every_term_binds_as_its_sexpr(term: Term, c: float) -> None:
    """A bare-term spec (optimize(Term)) is written as its s-expression: for any term
    (constants of any float included) that text re-derives exactly that term."""
    spec = add(term, Const(c))
    cert = make_certificate(spec, "", [], spec, shipped_library())
    assert cert.spec_kind == "sexpr"
    accepted(check(cert))


def test_every_shipped_spec_binds_at_its_default_and_small_sizes(certs: Any) -> None:
    """The eager certificate of every spec file (what optimize always writes) binds, and
    its text denotes nothing else at other sizes."""
    lib = shipped_library()
    files = sorted(certs.SPECS.glob("*.ks"))
    assert len(files) >= 15
    for path in files:
        text = path.read_text()
        program = parse_spec(text, str(path))
        cert, _, status = prove_term(program, None, lib, program.term)
        assert status == "eager" and cert is not None, path
        accepted(check(cert))
        halved = {k: max(1, v // 2) for k, v in program.params.items()}
        if halved != program.params:
            rejected(check(forge(cert, spec_params=halved)), "spec.term is not")
