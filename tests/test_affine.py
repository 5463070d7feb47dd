"""Affine reads (issue 18 part 1): `Read` through every stage.

The float64 interpreter is checked against a direct loop over every index (the
definition: x at the affine forms, the pad outside x's range), the symbolic semantics
against the interpreter, the generated numpy and C code against the interpreter on random
programs around reads (odd sizes, windows that leave the operand on either side, strides,
dilations, reversals, splits of read axes), and the spec language's uses, windows, pads
and errors."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelsat.affine import ReadMapError, make_read_map, parse_read_map
from kernelsat.codegen import lower, run_program
from kernelsat.codegen.cuda_cpu import run_on_cpu
from kernelsat.egraph.render import render_declarations, render_term
from kernelsat.egraph.saturate import saturate
from kernelsat.interp import evaluate, evaluate_as
from kernelsat.ir import In, Read, ShapeError, Split, Store, Sum, Term, exp, read_map
from kernelsat.ops import Op
from kernelsat.proofs import verify_sym
from kernelsat.proofs.certificate import make_certificate
from kernelsat.proofs.checker import check
from kernelsat.proofs.steps import Step
from kernelsat.rewrites.library import library_rules
from kernelsat.rewrites.rule import apply_at, check_condition, match, parse_rules
from kernelsat.sexpr import parse_term, to_sexpr
from kernelsat.spec import SpecError, load_spec, parse_spec
from kernelsat.testing import affine_programs, affine_reads, random_inputs


def loop_read(x: np.ndarray, x_axes: tuple[str, ...], term: Term) -> np.ndarray:
    """The definition of a read, one index at a time."""
    m = read_map(term)
    own = [a for a, _ in m.axes]
    out = np.empty([n for _, n in m.axes])
    for idx in itertools.product(*(range(n) for _, n in m.axes)):
        at = dict(zip(own, idx, strict=True))
        src = []
        inside = True
        for a, n in zip(x_axes, x.shape, strict=True):
            terms, c0 = m.form(a)
            i = c0 + sum(c * at[b] for b, c in terms)
            inside &= 0 <= i < n
            src.append(i)
        out[idx] = x[tuple(src)] if inside else m.pad
    return out


BASES = st.sampled_from([
    In("x", (("i", 5),)),
    In("x", (("i", 3), ("j", 4))),
    In("x", (("i", 2), ("j", 1), ("k", 6))),
])


@settings(max_examples=80, deadline=None)
@given(BASES.flatmap(lambda x: st.tuples(st.just(x), affine_reads(x))), st.integers(0, 9))
def test_interpreter_is_the_loop_definition(case: tuple[Term, Term], seed: int) -> None:
    x, r = case
    if r.op is not Op.READ:
        return
    env = random_inputs(x, seed=seed)
    arr = env["x"]
    want = loop_read(arr, tuple(a for a, _ in read_map(r).forms), r)
    got = evaluate(r, env)
    assert got.axes == tuple(a for a, _ in read_map(r).axes)
    np.testing.assert_array_equal(got.array, want)


@settings(max_examples=40, deadline=None)
@given(BASES.flatmap(lambda x: st.tuples(st.just(x), affine_reads(x, pads=(None, 0.0, 2.5)))),
       st.integers(0, 9))
def test_symbolic_semantics_is_the_interpreter(case: tuple[Term, Term], seed: int) -> None:
    x, r = case
    env = random_inputs(x, seed=seed)
    sym = verify_sym.evaluate(r, verify_sym.inputs_for(r))
    names = {f"x[{','.join(map(str, idx))}]": float(env["x"][idx])
             for idx in np.ndindex(*env["x"].shape)}
    got = np.vectorize(lambda s: verify_sym.to_float(s, names), otypes=[float])(sym.array)
    want = evaluate(r, env).to(sym.axes)
    np.testing.assert_allclose(got, np.broadcast_to(want, got.shape), rtol=1e-12)


@settings(max_examples=25, deadline=None)
@given(affine_programs(), st.integers(0, 9))
def test_generated_code_equals_the_interpreter(term: Term, seed: int) -> None:
    env = random_inputs(term, seed=seed)
    axes = tuple(sorted(term.shape))
    want = evaluate_as(term, env, axes, np.float64)
    f32 = {k: v.astype(np.float32) for k, v in env.items()}
    for backend in ("numpy", "c"):
        with np.errstate(all="ignore"):
            got = run_program(term, axes, f32, backend)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=backend)


def test_generated_code_at_window_boundaries() -> None:
    """A 3-wide window at stride 2 over 7 elements with padding 1 and 2 on each side: the
    first and last windows leave the operand (odd size, both edges)."""
    x = In("x", (("i", 7),))
    for pad_lo in (1, 2):
        n_out = (7 + 2 * pad_lo - 3) // 2 + 1
        for pad in (0.0, -math.inf):
            r = Read(x, {"i": ({"o": 2, "k": 1}, -pad_lo)}, {"o": n_out, "k": 3}, pad)
            term = Sum("k", r) if pad == 0.0 else Term(Op.RMAX, (r,), ("k",))
            env = {"x": np.arange(1.0, 8.0)}
            want = evaluate_as(term, env, ("o",), np.float64)
            for backend in ("numpy", "c"):
                got = run_program(term, ("o",), {"x": env["x"].astype(np.float32)}, backend)
                np.testing.assert_array_equal(got, want.astype(np.float32))


def test_c_guards_only_the_forms_that_can_leave_the_operand() -> None:
    x = In("x", (("i", 6), ("j", 5)))
    r = Read(x, {"i": ({"a": 1}, 0), "j": ({"b": 1, "k": 1}, -1)}, {"a": 6, "b": 5, "k": 3},
             0.0)
    text = str(lower(Sum("k", r), ("a", "b")).kernels[0].nest())
    assert text.count(" in [0, ") == 1  # j's form only: i's is the identity


def test_maps_round_trip_and_normalize() -> None:
    m = parse_read_map("h=2*oh+kh-1|oh:4,kh:3|pad=0")
    assert parse_read_map(m.text) == m
    assert m.span("h") == (-1, 7)
    assert m.rename({"oh": "p"}).text == "h=kh+2*p-1|kh:3,p:4|pad=0.0"
    with pytest.raises(ReadMapError):
        parse_read_map("h=oh*kh|oh:2,kh:2|pad=none")
    with pytest.raises(ReadMapError):
        make_read_map({"h": ({"a": 1}, 0)}, {"a": 2, "b": 3}, None)  # b used nowhere
    with pytest.raises(ReadMapError):
        make_read_map({"h": ({"a": 1}, 0)}, {"a": 2}, math.nan)


def test_reads_are_checked_when_built() -> None:
    x = In("x", (("i", 4),))
    with pytest.raises(ShapeError, match="spans"):
        Read(x, {"i": ({"j": 1}, 1)}, {"j": 4})
    with pytest.raises(ShapeError, match="operand"):
        Read(x, {"k": ({"j": 1}, 0)}, {"j": 4})
    assert Read(x, {"i": ({"j": 1}, 0)}, {"j": 3}, 0.0) is Read(x, {"i": ({"j": 1}, 0)},
                                                                 {"j": 3})  # pad unreachable
    r = Read(x, {"i": ({"j": -1}, 3)}, {"j": 4})  # reversal
    assert parse_term(to_sexpr(r)) is r
    np.testing.assert_array_equal(evaluate(r, {"x": np.arange(4.0)}).array, [3, 2, 1, 0])


def test_split_of_a_read_axis_lowers_like_the_interpreter() -> None:
    x = In("x", (("i", 9),))
    r = Read(x, {"i": ({"o": 2, "k": 1}, -1)}, {"o": 4, "k": 3}, 0.0)
    term = Split("o", 2, exp(r))
    axes = ("k", "o/i2", "o/o2")
    env = {"x": np.linspace(-1, 1, 9)}
    want = evaluate_as(term, env, axes, np.float64)
    for backend in ("numpy", "c"):
        got = run_program(term, axes, {"x": env["x"].astype(np.float32)}, backend)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_egglog_encoding_declares_each_map() -> None:
    x = In("x", (("i", 5),))
    r = Read(Store(exp(x)), {"i": ({"j": 1}, 1)}, {"j": 4})
    text = render_term(r).text
    assert '(set (ReadShape "i=j+1|j:4|pad=none") (set-of "j"))' in text
    assert '(set (ReadSrc "i=j+1|j:4|pad=none") (set-of "i"))' in text
    assert "(function ReadShape (String) StrSet" in render_declarations()


# -- the spec language ------------------------------------------------------------------------


def spec(body: str, params: str = "N=8") -> Term:
    return parse_spec(f"kernel k({params})\n{body}\n").term


def test_floor_division_in_sizes_is_torchs_output_size() -> None:
    for h in (5, 6, 7, 21):
        t = spec("in X[y:N] f32\naxis h:(N + 2 - 3)//2 + 1, k:3\n"
                 "out Y[h] = max(k: X[2*h + k - 1] pad -inf)", f"N={h}")
        assert t.shape["h"] == (h + 2 - 3) // 2 + 1


def test_a_declared_window_reads_a_plain_use_as_a_prefix() -> None:
    t = spec("in X[n:N] f32\naxis i:N - 1\nout Y[i] = X[i + 1] - X[i]")
    env = {"X": np.arange(8.0) ** 2}
    np.testing.assert_array_equal(evaluate(t, env).array, np.diff(env["X"]))


def test_reversal_with_a_size_parameter_and_input_pad() -> None:
    t = spec("in X[n:N] f32\naxis i:N\nout Y[i] = X[N - 1 - i]")
    np.testing.assert_array_equal(evaluate(t, {"X": np.arange(8.0)}).array, np.arange(8.0)[::-1])
    t = spec("in X[n:N] f32 pad 0\naxis i:N\nout Y[i] = X[i + 2]")
    np.testing.assert_array_equal(evaluate(t, {"X": np.arange(8.0)}).array,
                                  [2, 3, 4, 5, 6, 7, 0, 0])
    t = spec("in X[n:N] f32 positive pad -1\naxis i:N\nout Y[i] = X[i - 1]")
    assert evaluate(t, {"X": np.arange(8.0)}).array[0] == -1


def test_affine_use_of_an_intermediate_and_dilation() -> None:
    t = spec("in X[n:N] f32\nS[n] = exp(X[n])\naxis i:4, k:2\n"
             "out Y[i] = sum(k: S[i + 2*k] pad 0)")
    x = np.linspace(0, 1, 8)
    s = np.exp(x)
    np.testing.assert_allclose(evaluate(t, {"X": x}).array, [s[i] + s[i + 2] for i in range(4)])


@pytest.mark.parametrize("body, where, what", [
    ("in X[n:N] f32\naxis i:N\nout Y[i] = X[i + 1]", (4, 14), "spans 1..8, outside 0..7"),
    ("in X[n:N] f32\naxis i:N\nout Y[i] = X[2*i] pad", (4, 22), "bad pad value"),
    ("in X[n:N] f32\naxis i:N\nout Y[i] = X[i / 2]", (4, 16), "non-affine index"),
    ("in X[n:N] f32\naxis i:N\nout Y[i] = X[i + 0.5]", (4, 18), "non-integer"),
    ("in X[n:N] f32\naxis i:N/3\nout Y[i] = X[i]", (3, 9), "not an exact division"),
    ("in X[n:N] f32\naxis i:N//0\nout Y[i] = X[i]", (3, 9), "non-positive"),
    ("in X[n:N] f32\naxis i:4\nout Y[i] = X[i + k]", (4, 18), "axis 'k' has no size"),
    ("in X[n:N] f32\naxis i:M\nout Y[i] = X[i]", (3, 8), "unknown size parameter 'M'"),
])
def test_spec_errors_name_the_position(body: str, where: tuple[int, int], what: str) -> None:
    with pytest.raises(SpecError) as e:
        spec(body)
    assert (e.value.line, e.value.col) == where, str(e.value)
    assert what in str(e.value)


# -- certificates over programs with reads -------------------------------------------------


def test_certificates_with_reads_are_checked_and_tampered_maps_are_rejected() -> None:
    rules = parse_rules("sum-swap: (Sum ?a (Sum ?b ?x)) => (Sum ?b (Sum ?a ?x)) [reduction]")
    lib = SimpleNamespace(rules=rules, by_name={r.name: r for r in rules},
                          hash=hashlib.sha256(rules[0].key.encode()).hexdigest())
    t = spec("in X[y:N] f32\nin W[j:3] f32\naxis h:N\n"
             "out Y[h] = sum(k: sum(j: X[h + k + j - 2] pad 0 * W[j] * W[k]))")
    final = apply_at(rules[0], t, (), "forward", {})
    obj = make_certificate(t, "", [Step("sum-swap", "forward", (), {})], final, lib).to_obj()
    assert check(json.dumps(obj), lib).accepted
    text = json.dumps(obj)
    assert "pad=0.0" in text
    for old, new in (("pad=0.0", "pad=none"), ("pad=0.0", "pad=1.0"), ("-2|", "-1|")):
        tampered = text.replace(old, new)
        assert tampered != text
        result = check(tampered, lib)
        assert not result.accepted, (old, new)
        assert "term" in result.reason or "spec" in result.reason, result.reason


# -- the affine rules: conditions agree in egglog and on terms ----------------------------------


@pytest.mark.parametrize("pad", [None, 0.0, -1.5, -math.inf])
def test_affine_rule_conditions_agree_in_egglog_and_on_terms(pad: float | None) -> None:
    """`read-relu` (pad-zero) and `read-exp` (unpadded) fire in the e-graph exactly where
    the one evaluator (`check_condition`, what the checker runs) admits the map."""
    rules = {r.name: r for r in library_rules(["affine"])}
    x = In("x", (("i", 5),))
    for name, op in (("read-relu", Op.RELU), ("read-exp", Op.EXP)):
        shift = -1 if pad is not None else 0  # an unpadded read stays inside
        r = Read(Term(op, (x,)), {"i": ({"j": 1}, shift)}, {"j": 5}, pad)
        rule = rules[name]
        b = match(rule.lhs, r)
        assert b is not None
        on_terms = all(check_condition(c, b, dict(r.all_sizes)) for c in rule.conditions)
        sat = saturate(r, [rule], iters=3)
        assert (sat.firings.get(name, 0) > 0) == on_terms, (name, pad)
        assert on_terms == (pad is None or (pad == 0.0 and name == "read-relu"))


@pytest.mark.parametrize("pad", [0.0, -math.inf])
@pytest.mark.parametrize("stored", [False, True])
def test_windows_that_reuse_their_operand_read_a_padded_copy(pad: float, stored: bool) -> None:
    """A 3x3 window at stride 1 with padding 1 reads each element ~9 times: lowering
    reads a zero-padded copy (a kernel of its own, `lower.pad_copies`), the same values."""
    x: Term = In("x", (("i", 5), ("j", 6)))
    if stored:
        x = Store(exp(x))
    r = Read(x, {"i": ({"h": 1, "kh": 1}, -1), "j": ({"w": 1, "kw": 1}, -1)},
             {"h": 5, "w": 6, "kh": 3, "kw": 3}, pad)
    term = Sum("kh", Sum("kw", r)) if pad == 0.0 else Term(Op.RMAX, (Term(
        Op.RMAX, (r,), ("kw",)),), ("kh",))
    lowered = lower(term, ("h", "w"))
    assert len(lowered.kernels) == 2 + stored
    env = random_inputs(term, seed=3)
    want = evaluate_as(term, env, ("h", "w"), np.float64)
    for backend in ("numpy", "c"):
        got = run_program(term, ("h", "w"), {"x": env["x"].astype(np.float32)}, backend)
        np.testing.assert_allclose(got, want, rtol=1e-5)


# -- the CUDA renderer's code, run on the CPU shim ---------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(affine_programs(), st.integers(0, 9))
def test_cuda_code_of_reads_equals_the_interpreter_on_the_cpu_shim(term: Term, seed: int) -> None:
    axes = tuple(sorted(term.shape))
    lowered = lower(term, axes)
    env = random_inputs(term, seed=seed)
    want = evaluate_as(term, env, axes, np.float64)
    with np.errstate(all="ignore"):
        got = run_on_cpu(lowered, lowered.nests(), env).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("name", ["conv2d_3x3_s2", "maxpool2d", "conv2d_grouped"])
def test_cuda_code_of_conv_and_pool_specs_on_the_cpu_shim(name: str) -> None:
    root = Path(__file__).resolve().parents[1]
    small = {"B": 1, "C": 3, "O": 2, "H": 6, "W": 4, "G": 2, "CG": 2, "OG": 2}
    prog = load_spec(str(root / "specs" / f"{name}.ks"))
    prog = load_spec(str(root / "specs" / f"{name}.ks"),
                     {k: v for k, v in small.items() if k in prog.params})
    lowered = lower(prog.term, prog.out_axes)
    env = random_inputs(prog.term, seed=0)
    want = evaluate_as(prog.term, env, prog.out_axes, np.float64)
    got = run_on_cpu(lowered, lowered.nests(), env)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
