"""Specs at and past the documented limits: deep nesting, long sums, huge sizes, odd
encodings. Each either works in every stage or is refused with `file:line:col` (or the
`-p` option named), never a traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kernelsat.cli import app
from kernelsat.interp import evaluate_as
from kernelsat.ir import MAX_DEPTH, MAX_SIZE, In, ShapeError, add, exp, term_depth
from kernelsat.memory import (
    available_bytes,
    bench_estimate,
    optimize_estimate,
    refuse_reason,
    run_estimate,
)
from kernelsat.sexpr import SExprError, parse_term, read_program, to_sexpr
from kernelsat.spec import SpecError, load_spec, parse_spec, read_source

HEAD = "kernel k(N=4)\nin X[i:N] f32\n"
LHS = "out Y[i] = "


def nested(depth: int, fn: str = "tanh") -> str:
    return HEAD + LHS + f"{fn}(" * depth + "X[i]" + ")" * depth + "\n"


def long_sum(terms: int) -> str:
    return HEAD + LHS + " + ".join(["X[i]"] * terms) + "\n"


def invoke(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return res.exit_code, res.output


# -- depth ------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [50, 200, MAX_DEPTH - 1])
def test_nesting_within_the_limit_parses_and_evaluates(depth: int) -> None:
    p = parse_spec(nested(depth))
    assert term_depth(p.term) == depth + 1
    x = np.array([0.1, -0.2, 0.3, 0.4])
    want = x
    for _ in range(depth):
        want = np.tanh(want)
    np.testing.assert_allclose(evaluate_as(p.term, {"X": x}, ("i",)), want)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 2000, 100_000])
def test_nesting_past_the_limit_is_an_error_at_the_offending_call(depth: int) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(nested(depth, "exp"), "deep.ks")
    err = info.value
    first = len(LHS) + 1
    assert (err.line, err.col) == (3, first + 4 * MAX_DEPTH)  # the call one level too deep
    assert f"nested deeper than {MAX_DEPTH}" in str(err)
    assert str(err).startswith(f"deep.ks:3:{err.col}: ")


def test_parentheses_and_minus_signs_count_too() -> None:
    deep = HEAD + LHS + "(" * 300 + "X[i]" + ")" * 300 + "\n"
    with pytest.raises(SpecError, match="nested deeper than") as info:
        parse_spec(deep)
    assert info.value.col == len(LHS) + 1 + MAX_DEPTH
    p = parse_spec(HEAD + LHS + "(" * 100 + "X[i]" + ")" * 100 + "\n")
    assert term_depth(p.term) == 1
    negs = parse_spec(HEAD + LHS + "-" * 2001 + "3 * X[i]\n")  # folded into one constant
    np.testing.assert_allclose(evaluate_as(negs.term, {"X": np.ones(4)}, ("i",)), -3.0)
    with pytest.raises(SpecError, match="nested deeper than"):
        parse_spec(HEAD + LHS + "-" * 2001 + "X[i]\n")  # a chain of 2001 negations


@pytest.mark.parametrize("terms", [MAX_DEPTH, 500, 1000, 5000])
def test_long_sums_work_up_to_the_limit_and_name_the_operator_past_it(terms: int) -> None:
    text = long_sum(terms)
    if terms <= MAX_DEPTH:
        p = parse_spec(text)
        x = np.arange(4.0)
        np.testing.assert_allclose(evaluate_as(p.term, {"X": x}, ("i",)), terms * x)
        return
    with pytest.raises(SpecError) as info:
        parse_spec(text, "sum.ks")
    # X[i] + X[i] + ...: the '+' that makes the term MAX_DEPTH + 1 deep
    assert info.value.col == len(LHS) + 1 + len("X[i] ") + len("+ X[i] ") * (MAX_DEPTH - 1)
    assert text.splitlines()[2][info.value.col - 1] == "+"
    assert "sum(k: X[k, i])" in str(info.value)  # says how to write it instead


def test_depth_counts_across_intermediates() -> None:
    lines = [HEAD.rstrip()]
    prev = "X[i]"
    for k in range(4):
        lines.append(f"T{k}[i] = " + " + ".join([prev] * 70))
        prev = f"T{k}[i]"
    lines.append(f"out Y[i] = {prev}")
    with pytest.raises(SpecError, match="nested deeper than") as info:
        parse_spec("\n".join(lines) + "\n")
    assert info.value.line == 6  # T3: 1 + 3*70 + 3 stores ... passes the limit there


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["exp(", "(", "-", "tanh(", "sqrt(abs("]), max_size=400))
def test_any_nesting_gives_a_term_or_a_located_error(prefix: list[str]) -> None:
    opened = "".join(prefix)
    closing = ")" * opened.count("(")
    try:
        p = parse_spec(HEAD + LHS + opened + "X[i]" + closing + "\n", "f.ks")
    except SpecError as e:
        assert e.line == 3 and 1 <= e.col <= len(LHS) + len(opened) + 1
        assert "nested deeper than" in e.what
    else:
        assert term_depth(p.term) <= MAX_DEPTH


def test_program_files_have_the_same_limit(tmp_path: Path) -> None:
    x = In("X", (("i", 4),))
    t = x
    for _ in range(MAX_DEPTH + 50):
        t = exp(t)
    text = to_sexpr(t)
    assert parse_term(text) is t  # internal round trips are not limited
    f = tmp_path / "deep.sexpr"
    f.write_text(text)
    with pytest.raises(SExprError, match=f"deeper than {MAX_DEPTH}") as info:
        read_program(f)
    # the 51st '(' from the left opens the first node 257 deep
    assert (info.value.line, info.value.col) == (1, 1 + len("(exp ") * 50)
    chain = x
    for _ in range(20_000):  # far past any limit: iterative everywhere, no RecursionError
        chain = add(chain, x)
    assert term_depth(chain) == 20_001
    assert parse_term(to_sexpr(chain)) is chain
    np.testing.assert_allclose(evaluate_as(chain, {"X": np.ones(4)}), 20_001.0)


# -- the CLI: check, run, optimize ------------------------------------------------------------


@pytest.mark.parametrize("make", [lambda: nested(2000), lambda: long_sum(1000)])
def test_commands_refuse_too_deep_specs_with_a_location(tmp_path: Path, make: object) -> None:
    spec = tmp_path / "deep.ks"
    spec.write_text(make())  # type: ignore[operator]
    for cmd in (["check"], ["run"], ["optimize", "-t", "numpy", "-o", str(tmp_path / "o")]):
        code, out = invoke(*cmd, str(spec))
        assert code == 1, out
        assert f"{spec}:3:" in out and f"nested deeper than {MAX_DEPTH}" in out
        assert "Traceback" not in out


def test_a_long_sum_within_the_limit_runs_and_optimizes(tmp_path: Path) -> None:
    spec = tmp_path / "sum.ks"
    spec.write_text("kernel k(N=4)\n" + "".join(f"in X{j}[i:N] f32\n" for j in range(200))
                    + LHS + " + ".join(f"X{j}[i]" for j in range(200)) + "\n")
    code, out = invoke("run", str(spec))
    assert code == 0, out
    code, out = invoke("optimize", str(spec), "-t", "numpy", "--seconds", "10", "--trials", "1",
                       "--knob-budget", "1", "-o", str(tmp_path / "out"))
    assert code == 0, out
    assert (tmp_path / "out" / "best.sexpr").exists()


# -- encoding ----------------------------------------------------------------------------


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    text = long_sum(3)
    plain, bom = tmp_path / "plain.ks", tmp_path / "bom.ks"
    plain.write_text(text)
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert load_spec(bom).term is load_spec(plain).term
    code, out = invoke("check", str(bom))
    assert code == 0, out


@pytest.mark.parametrize(("raw", "line", "col", "offset"), [
    (HEAD.encode() + b"# caf\xe9\n" + LHS.encode() + b"X[i]\n", 3, 6, 33),
    (b"\xef\xbb\xbfkernel k(N=4) # \xff\n", 1, 17, 19),
    (b"\xe9", 1, 1, 0),
])
def test_bytes_that_are_not_utf8_are_located(tmp_path: Path, raw: bytes, line: int, col: int,
                                            offset: int) -> None:
    f = tmp_path / "latin.ks"
    f.write_bytes(raw)
    with pytest.raises(SpecError) as info:
        read_source(f)
    err = info.value
    assert (err.path, err.line, err.col) == (str(f), line, col)
    assert f"byte offset {offset}" in str(err)
    code, out = invoke("check", str(f))
    assert code == 1 and f"{f}:{line}:{col}: invalid UTF-8 byte" in out
    prog = tmp_path / "p.sexpr"
    prog.write_bytes(raw)
    with pytest.raises(SpecError, match="invalid UTF-8"):
        read_program(prog)


def test_rules_and_program_files_are_read_the_same_way(tmp_path: Path) -> None:
    spec = tmp_path / "s.ks"
    spec.write_text(long_sum(2))
    prog = tmp_path / "p.sexpr"
    prog.write_bytes(b"\xef\xbb\xbf(add (In X i:4) (In X i:4))")
    code, out = invoke("run", str(spec), "--program", str(prog))
    assert code == 0, out
    prog.write_bytes(b"(add (In X i:4) \x80)")
    code, out = invoke("run", str(spec), "--program", str(prog))
    assert code == 1 and f"{prog}:1:17: invalid UTF-8 byte 0x80" in out


# -- sizes and memory -------------------------------------------------------------------------

MM = """kernel mm(M=64, N=64, K=64)
in A[i:M, k:K] f32
in B[k:K, j:N] f32
out C[i, j] = sum(k: A[i, k] * B[k, j])
"""


@pytest.mark.parametrize("value", [2**63, 2**64 + 1, MAX_SIZE + 1, 10**30])
def test_a_size_parameter_past_the_maximum_names_the_option(value: int) -> None:
    with pytest.raises(SpecError, match=r"\(-p M=\.\.\.\) is over the largest") as info:
        parse_spec(MM, "mm.ks", {"M": value})
    assert (info.value.line, info.value.col) == (1, 1)


def test_sizes_past_the_maximum_are_located() -> None:
    with pytest.raises(SpecError, match="over the largest") as info:
        parse_spec(MM.replace("M=64", "M=281474976710657"), "mm.ks")
    assert (info.value.line, info.value.col) == (1, 11)
    with pytest.raises(SpecError, match="over the largest") as info:
        parse_spec(MM.replace("in A[i:M, k:K]", "in A[i:M*K*K*K*K*K*K*K*K, k:K]"))
    assert info.value.line == 2 and info.value.col > 10
    with pytest.raises(SpecError, match="elements in one value or loop nest") as info:
        parse_spec(MM, "mm.ks", {"M": 2**20, "N": 2**20, "K": 2**20})
    assert (info.value.line, info.value.col) == (4, 30)  # the '*': an M*N*K loop nest
    with pytest.raises(ShapeError, match="largest supported"):
        In("x", (("i", MAX_SIZE + 1),))


def test_memory_estimates_grow_with_the_sizes_and_refuse_clearly() -> None:
    small, big = parse_spec(MM), parse_spec(MM, params={"M": 4096})
    for estimate in (run_estimate, bench_estimate, optimize_estimate):
        assert estimate(big, "numpy").total > estimate(small, "numpy").total > 64 * 64 * 12
    assert refuse_reason(run_estimate(small, "reference"), available=2**30) is None
    reason = refuse_reason(run_estimate(big, "reference"), available=2**20)
    assert reason is not None and "`run` needs about" in reason and "float64 reference" in reason
    have = available_bytes()
    assert have is None or have > 0


@pytest.mark.parametrize("cmd", [["run", "--max-elements", str(2**40)], ["bench", "-t", "numpy"],
                                 ["bench", "-t", "c"], ["optimize", "-t", "numpy"]])
def test_commands_refuse_what_does_not_fit_before_allocating(tmp_path: Path,
                                                             cmd: list[str]) -> None:
    spec = tmp_path / "mm.ks"
    spec.write_text(MM)
    out_dir = ["-o", str(tmp_path / "o")] if cmd[0] == "optimize" else []
    code, out = invoke(*cmd, *out_dir, str(spec), "-p", "M=100000000", "-p", "N=1000")
    assert code == 1, out
    assert "needs about" in out and "is available" in out and "-p K=V over M, N, K" in out
    code, out = invoke(*cmd, str(spec), "-p", "M=9223372036854775808")
    assert code != 0 and "(-p M=...) is over the largest supported size" in out
    assert "Traceback" not in out


def test_other_user_files_name_the_bad_byte(tmp_path: Path) -> None:
    spec = tmp_path / "s.ks"
    spec.write_text(long_sum(2))
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"; a comment\n(In X i:4) \xc3(\n")
    for args in (["prove", str(spec), str(bad), "-o", str(tmp_path / "c.json")],
                 ["saturate", str(spec), "--rules", str(bad)],
                 ["codegen", str(bad)],
                 ["bench", str(spec), "--program", str(bad)]):
        code, out = invoke(*args)
        assert code != 0, args
        assert "2:12: invalid UTF-8 byte 0xc3 at byte offset 23" in out, (args, out)


def test_bench_of_a_reference_that_overflows_is_an_error(tmp_path: Path) -> None:
    spec = tmp_path / "over.ks"
    spec.write_text(HEAD + LHS + "exp(exp(exp(exp(X[i]))))\n")
    code, out = invoke("bench", str(spec), "-t", "numpy", "--min-runs", "1")
    assert code == 1 and "NaN or infinite" in out and str(spec) in out
