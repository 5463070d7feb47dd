"""The spec language: parsing to the expected terms, macros, renaming, groups, inputs,
analysis helpers and the `check` / `show` / `run` commands."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from kernelsat import ir
from kernelsat.cli import app
from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as
from kernelsat.ir import Const, In, Max, Store, Sum, postorder
from kernelsat.ops import Op
from kernelsat.sexpr import parse_term, to_sexpr
from kernelsat.spec import (
    SpecError,
    analyze_spec,
    eager_kernels,
    load_spec,
    min_bytes,
    parse_params,
    parse_spec,
    read_statements,
    term_flops,
)

SPECS = Path(__file__).parent.parent / "specs"
ALL_SPECS = sorted(SPECS.glob("*.ks"))

ATTENTION = """kernel attention(B=1, H=8, N=1024, D=64)
in  Q[b:B, h:H, i:N, d:D] f32
in  K[b:B, h:H, n:N, d:D] f32
in  V[b:B, h:H, n:N, e:D] f32
S[b,h,i,n] = sum(d: Q[b,h,i,d] * K[b,h,n,d]) / sqrt(D)
P[b,h,i,n] = softmax(n: S[b,h,i,n])
out O[b,h,i,e] = sum(n: P[b,h,i,n] * V[b,h,n,e])
"""


def _attention_by_hand(b: int, h: int, n: int, d: int) -> ir.Term:
    q = In("Q", (("b", b), ("h", h), ("i", n), ("d", d)))
    k = In("K", (("b", b), ("h", h), ("n", n), ("d", d)))
    v = In("V", (("b", b), ("h", h), ("n", n), ("e", d)))
    s = Store(ir.div(Sum("d", ir.mul(q, k)), ir.sqrt(Const(d))))
    e = ir.exp(ir.sub(s, Max("n", s)))
    p = Store(ir.div(e, Sum("n", e)))
    return Sum("n", ir.mul(p, v))


def test_attention_parses_to_the_hand_built_term() -> None:
    program = parse_spec(ATTENTION, "attention.ks")
    assert program.term is _attention_by_hand(1, 8, 1024, 64)
    assert program.name == "attention"
    assert program.params == {"B": 1, "H": 8, "N": 1024, "D": 64}
    assert program.out_name == "O" and program.out_axes == ("b", "h", "i", "e")
    assert [d.name for d in program.inputs] == ["Q", "K", "V"]
    assert program.input("V").dim_names == ("b", "h", "n", "e")
    assert program.input("V").dims == (1, 8, 1024, 64)
    assert program.path == "attention.ks" and program.source == ATTENTION
    assert len(program.statements) == 3


def test_parameter_overrides() -> None:
    program = parse_spec(ATTENTION, params={"N": 16, "D": 4, "H": 2})
    assert program.term is _attention_by_hand(1, 2, 16, 4)
    assert program.params["N"] == 16


def test_spec_file_attention_is_the_brief_text() -> None:
    assert load_spec(SPECS / "attention.ks").term is parse_spec(ATTENTION).term


def test_out_is_not_stored_and_intermediates_are() -> None:
    parsed = analyze_spec(ATTENTION, params={"N": 8})
    assert parsed.program.term.op is Op.SUM
    assert [it.name for it in parsed.intermediates] == ["S", "P"]
    assert all(it.store.op is Op.STORE for it in parsed.intermediates)
    stores = [n for n in postorder(parsed.program.term) if n.op is Op.STORE]
    assert len(stores) == 2


def test_softmax_is_the_stable_form_with_shared_subterms() -> None:
    p = parse_spec("kernel k(N=8)\nin X[i:N] f32\nout Y[i] = softmax(i: X[i])\n")
    x = In("X", (("i", 8),))
    e = ir.exp(ir.sub(x, Max("i", x)))
    assert p.term is ir.div(e, Sum("i", e))
    assert sum(1 for n in postorder(p.term) if n.op is Op.EXP) == 1


def test_logsumexp_is_core_ops_not_lse() -> None:
    p = parse_spec("kernel k(N=8)\nin X[i:N] f32\nout Y[] = logsumexp(i: X[i])\n")
    ops = {n.op for n in postorder(p.term)}
    assert Op.LSE not in ops and {Op.RMAX, Op.SUM, Op.LOG, Op.EXP} <= ops


def test_min_reduction_is_negated_max() -> None:
    p = parse_spec("kernel k(N=8)\nin X[i:N] f32\nout Y[] = min(i: X[i])\n")
    x = In("X", (("i", 8),))
    assert p.term is ir.neg(Max("i", ir.neg(x)))


def test_binary_max_min_and_literals() -> None:
    p = parse_spec("kernel k(N=8)\nin X[i:N] f32\nout Y[i] = max(X[i], -2) - min(X[i], 0.5)\n")
    x = In("X", (("i", 8),))
    assert p.term is ir.sub(ir.max_(x, Const(-2.0)), ir.min_(x, Const(0.5)))


def test_precedence_and_unary_minus() -> None:
    p = parse_spec("kernel k(N=8)\nin X[i:N] f32\nout Y[i] = -X[i] * 2 + 1 / X[i] - 3\n")
    x = In("X", (("i", 8),))
    want = ir.sub(ir.add(ir.mul(ir.neg(x), Const(2.0)), ir.div(Const(1.0), x)), Const(3.0))
    assert p.term is want


def test_layernorm_eps_keyword() -> None:
    text = "kernel k(N=8)\nin X[i:N] f32\nout Y[i] = layernorm(i: X[i]{})\n"
    default = parse_spec(text.format(""))
    custom = parse_spec(text.format(", eps=1e-6"))
    consts = {float(n.attrs[0]) for n in postorder(custom.term) if n.op is Op.CONST}
    assert 1e-6 in consts
    assert 1e-5 in {float(n.attrs[0]) for n in postorder(default.term) if n.op is Op.CONST}


def test_bare_input_uses_declared_names() -> None:
    p = parse_spec("kernel k(N=8)\nin X[i:N, j:N] f32\nout Y[i, j] = exp(X)\n")
    assert p.term is ir.exp(In("X", (("i", 8), ("j", 8))))


def test_group_binding_builds_a_grouped_input() -> None:
    text = """kernel k(B=2, N=4, H=3, D=5)
in X[b:B, n:N, x:H*D] f32
in W[h:H] f32
out Y[b, n, h, d] = X[b, n, (h, d)] * W[h]
"""
    p = parse_spec(text)
    x = ir.In("X", ((("b", 2),), (("n", 4),), (("h", 3), ("d", 5))))
    assert p.term is ir.mul(x, In("W", (("h", 3),)))
    assert p.input("X").dims == (2, 4, 15)


def test_group_annotation_gives_the_size() -> None:
    text = "kernel k(N=4, HD=12)\nin X[i:N, x:HD] f32\nout Y[i, h, d] = X[i, (h:3, d)]\n"
    assert dict(parse_spec(text).term.shape) == {"d": 4, "h": 3, "i": 4}


def test_packed_attention_equals_unpacked_attention() -> None:
    params = {"B": 2, "H": 3, "N": 5, "D": 4}
    packed = load_spec(SPECS / "attention_packed.ks", params)
    plain = load_spec(SPECS / "attention.ks", params)
    env = random_inputs(packed, seed=3)
    got = evaluate_as(packed.term, env, packed.out_axes)  # [b, i, h, e]
    unpacked = {k: v.reshape(2, 5, 3, 4).transpose(0, 2, 1, 3) for k, v in env.items()}
    want = evaluate_as(plain.term, unpacked, plain.out_axes)  # [b, h, i, e]
    np.testing.assert_allclose(got, want.transpose(0, 2, 1, 3), rtol=1e-12)


MATMUL_TWICE = """kernel k(M=3, K=4, N=5)
in A[i:M, k:K] f32
in B[k:K, j:N] f32
in C[j:N, i:M] f32
S[i, j] = sum(k: A[i, k] * B[k, j])
out Y[k, i] = sum(j: S[k, j] * C[j, i])
"""


def test_renamed_intermediate_avoids_capturing_its_bound_axis() -> None:
    # S is used as S[k, j]: its free i becomes k, while k is bound inside S.
    text = MATMUL_TWICE.replace("M=3", "M=4")  # k and i both size 4
    p = parse_spec(text)
    env = random_inputs(p, seed=0)
    want = (env["A"] @ env["B"]) @ env["C"]  # Y[k, i] = sum_j S[k, j] C[j, i]
    np.testing.assert_allclose(evaluate_as(p.term, env, p.out_axes), want, rtol=1e-12)
    bound = {n.axis for n in postorder(p.term) if n.op is Op.SUM}
    assert "j" in bound and any(a.startswith("k.") for a in bound)


def test_renamed_intermediate_with_a_size_clash_is_an_error() -> None:
    with pytest.raises(SpecError, match="axis 'k' has size 3 here but 4"):
        parse_spec(MATMUL_TWICE)


def test_transpose_by_renaming() -> None:
    text = """kernel k(M=3, N=5)
in X[i:M, j:N] f32
S[i, j] = exp(X[i, j])
out Y[j, i] = S[i, j] + S[i, j]
"""
    p = parse_spec(text)
    x = random_inputs(p)["X"]
    np.testing.assert_allclose(evaluate_as(p.term, {"X": x}, p.out_axes), 2 * np.exp(x).T)
    swap = text.replace("S[i, j] + S[i, j]", "S[j, i]").replace("M=3", "M=5")
    p2 = parse_spec(swap)
    x2 = random_inputs(p2)["X"]
    # S[j, i] renames S's (i, j) to (j, i): Y[j, i] = S[j, i] = exp(X)[j, i]
    np.testing.assert_allclose(evaluate_as(p2.term, {"X": x2}, p2.out_axes), np.exp(x2))


def test_scalar_parameter_in_expression() -> None:
    p = parse_spec("kernel k(N=8)\nin X[i:N] f32\nout Y[] = sum(i: X[i]) / N\n")
    assert p.term is ir.div(Sum("i", In("X", (("i", 8),))), Const(8.0))


def test_roles_and_dtypes() -> None:
    text = """kernel k(B=6, C=7)
in X[b:B, c:C] f64
in T[b:B, c:C] onehot
in P[c:C] f32 positive
out Y[b] = sum(c: X[b, c] * T[b, c] * log(P[c]))
"""
    p = parse_spec(text)
    assert [(d.dtype, d.role) for d in p.inputs] == [
        ("f64", "data"), ("f32", "onehot"), ("f32", "positive")]
    env = random_inputs(p, seed=5)
    assert env["T"].shape == (6, 7)
    assert (env["T"].sum(axis=1) == 1).all() and set(np.unique(env["T"])) == {0.0, 1.0}
    assert (env["P"] >= 0.5).all() and (env["P"] <= 1.5).all()
    assert (np.abs(env["X"]) >= 0.5).all() and (env["X"] < 0).any() and (env["X"] > 0).any()
    assert min_bytes(p) == 6 * 7 * 8 + 6 * 7 * 4 + 7 * 4 + 6 * 8  # output at the widest dtype


def test_random_inputs_are_deterministic_and_typed() -> None:
    p = load_spec(SPECS / "softmax.ks", {"M": 3, "N": 4})
    a, b = random_inputs(p, seed=7), random_inputs(p, seed=7)
    np.testing.assert_array_equal(a["X"], b["X"])
    assert not np.array_equal(a["X"], random_inputs(p, seed=8)["X"])
    assert random_inputs(p, dtype=np.float32)["X"].dtype == np.float32


def test_flops_and_bytes_of_matmul() -> None:
    p = load_spec(SPECS / "matmul.ks", {"M": 8, "N": 16, "K": 32})
    assert term_flops(p.term) == 2 * 8 * 16 * 32  # one mul and one add per (i, j, k)
    assert min_bytes(p) == 4 * (8 * 32 + 32 * 16 + 8 * 16)


def test_eager_kernels_one_per_store_plus_root() -> None:
    parsed = analyze_spec(ATTENTION, params={"N": 8, "D": 4})
    names = {it.store: it.name for it in parsed.intermediates}
    kernels = eager_kernels(parsed.program.term, names, "O")
    assert [k for k, _ in kernels] == ["S", "P", "O"]
    for _, body in kernels:
        assert all(n.op is not Op.STORE for n in postorder(body))
    assert {str(n.attrs[0]) for n in postorder(kernels[2][1]) if n.op is Op.IN} == {"P", "V"}


def test_parse_params() -> None:
    assert parse_params(["N=2048", "D = 64"]) == {"N": 2048, "D": 64}
    assert parse_params(None) == {}
    for bad in ["N", "N=", "N=2.5", "=3", "N=x"]:
        with pytest.raises(ValueError, match="expected NAME=INTEGER"):
            parse_params([bad])


def test_sexpr_round_trip_of_every_spec() -> None:
    for path in ALL_SPECS:
        term = load_spec(path).term
        assert parse_term(to_sexpr(term)) is term


def test_every_spec_has_a_header_comment_and_parses() -> None:
    assert len(ALL_SPECS) >= 16
    for path in ALL_SPECS:
        assert path.read_text().startswith(f"# {path.stem}:"), path
        program = load_spec(path)
        assert set(program.term.shape) == set(program.out_axes)


# -- whitespace and comments do not change the term ---------------------------------


def _perturb(text: str, data: st.DataObject) -> str:
    out = []
    for line in text.splitlines():
        for _ in range(data.draw(st.integers(0, 2))):
            out.append(data.draw(st.sampled_from(["", "   ", "# a comment", "\t# x = y[", "#"])))
        pieces = []
        for tok in line.replace(",", " , ").replace("[", " [ ").replace("]", " ] ").split(" "):
            if not tok:
                continue
            pieces.append(tok)
        sep = [data.draw(st.sampled_from([" ", "  ", "\t", " \t "])) for _ in pieces]
        lead = data.draw(st.sampled_from(["", " ", "\t"]))
        tail = data.draw(st.sampled_from(["", " ", "  # trailing", "\t#"]))
        out.append(lead + "".join(p + s for p, s in zip(pieces, sep, strict=True)) + tail)
    return "\n".join(out) + data.draw(st.sampled_from(["", "\n", "\n\n# end\n"]))


@given(path=st.sampled_from(ALL_SPECS), data=st.data())
def test_whitespace_and_comments_do_not_change_the_term(path: Path, data: st.DataObject) -> None:
    text = path.read_text()
    assert parse_spec(_perturb(text, data)).term is parse_spec(text).term


def test_statements_are_read_per_line() -> None:
    stmts = read_statements(ATTENTION)
    assert len(stmts) == 7


# -- the CLI ---------------------------------------------------------------------------

runner = CliRunner()


def test_cli_check_all_specs() -> None:
    result = runner.invoke(app, ["check", *map(str, ALL_SPECS)])
    assert result.exit_code == 0, result.output
    assert result.output.count("kernel ") == len(ALL_SPECS)
    assert "flops:" in result.output and "min bytes:" in result.output


def test_cli_show() -> None:
    result = runner.invoke(app, ["show", str(SPECS / "attention.ks"), "-p", "N=8"])
    assert result.exit_code == 0, result.output
    assert "eager kernels: 3" in result.output
    assert "; kernel 3: O[b:1, h:8, i:8, e:64]" in result.output
    assert "(Store" in result.output


def test_cli_run() -> None:
    args = ["run", str(SPECS / "softmax.ks"), "-p", "M=8", "--param", "N=16", "--seed", "2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "relative L2 error" in result.output and "shape (8, 16)" in result.output
    err = float(result.output.split("relative L2 error ")[1].split()[0])
    assert 0 <= err < 1e-5


def test_cli_run_refuses_huge_programs() -> None:
    # the default sizes run (the M*N*K product is contracted, never materialized) ...
    args = ["run", str(SPECS / "matmul.ks"), "-p", "M=16384", "-p", "N=16384"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1
    assert "--max-elements" in result.output  # ... an output of 2^28 elements does not


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["check", "tests/malformed/unknown_input.ks"], "unknown_input.ks:4:19: unknown name"),
        (["show", "tests/malformed/wrong_arity.ks"], "wrong_arity.ks:4:12: exp takes"),
        (["run", "tests/malformed/two_outs.ks"], "two_outs.ks:5:5:"),
        (["run", "specs/softmax.ks", "-p", "Z=3"], "unknown parameter 'Z'"),
        (["check", "specs/softmax.ks", "-p", "N=x"], "expected NAME=INTEGER"),
        (["check", "no/such/file.ks"], "cannot read"),
    ],
)
def test_cli_errors_exit_one_without_traceback(args: list[str], message: str) -> None:
    root = Path(__file__).parent.parent
    result = runner.invoke(app, [a if not a.endswith(".ks") or a.startswith("no/") else
                                 str(root / a) for a in args])
    assert result.exit_code == 1
    assert message in result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_cli_help_lists_the_commands() -> None:
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in ("check", "show", "run"):
        assert name in result.output
    for name in ("check", "show", "run"):
        sub = runner.invoke(app, [name, "--help"])
        assert sub.exit_code == 0 and "--param" in sub.output


def test_flops_count_each_shared_node_once() -> None:
    p = parse_spec("kernel k(N=8)\nin X[i:N] f32\nout Y[i] = exp(X[i]) + exp(X[i])\n")
    assert term_flops(p.term) == 8 * 8 + 8 * 1
    assert math.isclose(term_flops(p.term), 72)
