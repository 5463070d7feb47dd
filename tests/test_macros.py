"""The language forms of issue 18 parts 4-6: reductions over a set of axes, the
activation macros and `^`/`pow`, 0-dim scalar inputs, keepdim outputs and size-1
broadcasting. Each against an independent numpy reference (PyTorch's documented
formulas, `kernelsat.testing`), at large |x| too, and through every backend."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kernelsat.codegen import lower, run_program
from kernelsat.codegen.cuda_cpu import run_on_cpu
from kernelsat.egraph import saturate
from kernelsat.egraph.saturate import DEFAULT_SCHEDULE, scheduled_rules
from kernelsat.extract import extract
from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as
from kernelsat.ir import In, Op, Term, postorder
from kernelsat.macros import ELEMENTWISE, REDUCTIONS, power
from kernelsat.rewrites.library import library_rules
from kernelsat.sexpr import parse_term, to_sexpr
from kernelsat.spec import SpecError, parse_spec
from kernelsat.testing import (
    ACTIVATIONS,
    SpecCase,
    activation_specs,
    reduction_specs,
    relative_error,
)

ROOT = Path(__file__).resolve().parents[1]
ACTIVATION_RULES = {r.name for r in library_rules(["activations"])}
TORCH_PYTHON = ROOT / ".venv-torch" / "bin" / "python"
FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def _check(case: SpecCase, seed: int = 0) -> None:
    program = parse_spec(case.text)
    env = random_inputs(program, seed=seed)
    with np.errstate(over="ignore"):
        got = evaluate_as(program.term, env, program.out_axes).reshape(program.out_shape)
    want = case.reference(env)
    assert got.shape == want.shape, case.text
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9, err_msg=case.text)


# -- reductions over a set of axes ---------------------------------------------------------


@FAST
@given(reduction_specs(), st.integers(0, 3))
def test_a_reduction_over_an_axis_set_equals_numpy_over_those_axes(case: SpecCase,
                                                                    seed: int) -> None:
    _check(case, seed)


def test_several_axes_nest_one_axis_reductions_last_innermost() -> None:
    p = parse_spec("kernel k(B=2, H=3, W=4)\nin X[b:B, h:H, w:W] f32\n"
                   "out Y[b] = mean(h, w: X)\n")
    assert to_sexpr(p.term) == "(div (Sum h (Sum w (In X b:2 h:3 w:4))) (Const 12.0))"
    p = parse_spec("kernel k(B=2, H=3, W=4)\nin X[b:B, h:H, w:W] f32\n"
                   "out Y[b, h, w] = layernorm(b, h, w: X)\n")
    sums = [n for n in _nodes(p.term) if n.op is Op.SUM]
    assert {n.axis for n in sums} == {"b", "h", "w"}
    assert all(r.build(("n",), parse_spec(
        "kernel k(N=3)\nin X[n:N] f32\nout Y[n] = X\n").term, dict(r.kwargs)) is not None
        for r in REDUCTIONS.values())


def _nodes(t: Term) -> list[Term]:
    return list(postorder(t))


# -- activations and operators --------------------------------------------------------------


@FAST
@given(activation_specs(), st.integers(0, 3))
def test_an_activation_equals_its_torch_formula_at_any_magnitude(case: SpecCase,
                                                                 seed: int) -> None:
    _check(case, seed)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(activation_specs(), reduction_specs()), st.sampled_from(["numpy", "c"]))
def test_generated_specs_run_on_the_backends(case: SpecCase, backend: str) -> None:
    program = parse_spec(case.text)
    env = random_inputs(program, seed=0)
    want = case.reference(env)
    assume(bool(np.all(np.abs(want) < 1e30)))  # representable in float32
    env32 = {k: v.astype(np.float32) for k, v in env.items()}
    got = run_program(program.term, program.out_axes, env32, backend)
    assert relative_error(got.reshape(program.out_shape), want) < 1e-5, case.text


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_every_activation_is_exact_at_large_and_special_inputs(name: str) -> None:
    call, fn = ACTIVATIONS[name]
    x = np.array([-1e4, -1000.0, -88.7, -20.0, -3.0, -1.0, -1e-8, 1e-8, 0.5, 1.0, 3.0,
                  20.0, 88.7, 1000.0])
    if "pow_base" in name:
        x = x[np.abs(x) < 1000]  # 1.5^1e4 is past float64
    p = parse_spec(f"kernel k(N={x.size})\nin X[i:N] f32\nout Y[i] = {call.format(x='X[i]')}\n")
    with np.errstate(over="ignore", divide="ignore"):
        got = evaluate_as(p.term, {"X": x}, p.out_axes)
        want = fn(x)
    assert np.all(np.isfinite(got) == np.isfinite(want)), (got, want)
    fin = np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("name", sorted(set(ACTIVATIONS) - {"pow_base", "inverse_square"}))
@pytest.mark.parametrize("backend", ["numpy", "c"])
def test_every_activation_runs_in_float32_without_overflow(name: str, backend: str) -> None:
    """The stable forms (softplus, logsigmoid, mish, elu's exp(min(x, 0))) stay finite in
    float32 at |x| = 1000, where exp overflows."""
    call, fn = ACTIVATIONS[name]
    x = np.array([-1000.0, -100.0, -30.0, -3.0, -0.5, 0.0, 0.5, 3.0, 30.0, 100.0, 1000.0])
    p = parse_spec(f"kernel k(N={x.size})\nin X[i:N] f32\nout Y[i] = {call.format(x='X[i]')}\n")
    with np.errstate(over="ignore"):
        want = fn(x)
    got = run_program(p.term, p.out_axes, {"X": x.astype(np.float32)}, backend)
    if np.all(np.isfinite(want.astype(np.float32))):
        assert np.all(np.isfinite(got)), got
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30)


def test_power_parses_like_python() -> None:
    def term(rhs: str) -> str:
        return to_sexpr(parse_spec(f"kernel k(N=2)\nin X[i:N] f32\nout Y[i] = {rhs}\n").term)

    x = "(In X i:2)"
    assert term("-X^2") == f"(neg (mul {x} {x}))"  # -(x^2)
    assert term("(-X)^2") == f"(let ((%0 (neg {x}))) (mul %0 %0))"
    assert term("X^2^3") == term("X^8")  # right associative: x^(2^3)
    assert term("2^-1 * X") == f"(mul (Const 0.5) {x})"
    assert term("-2^2 * X") == f"(mul (Const -4.0) {x})"
    assert term("X^-1") == f"(recip {x})"
    assert term("X^N") == f"(mul {x} {x})"  # a size parameter is a constant
    assert term("X^1") == x
    assert term("X * X^0") == f"(mul {x} (Const 1.0))"


@FAST
@given(st.integers(-40, 40), st.floats(-3, 3).filter(lambda v: abs(v) > 0.1))
def test_repeated_squaring_equals_the_power(k: int, v: float) -> None:

    t = power(In("x", (("i", 1),)), k)
    got = float(evaluate_as(t, {"x": np.array([v])}, ("i",) if t.shape else ())
                .reshape(-1)[0])
    assert got == pytest.approx(v**k, rel=1e-12)
    muls = sum(1 for n in _nodes(t) if n.op is Op.MUL)
    assert muls <= 2 * max(abs(k), 1).bit_length()


def test_pow_needs_a_positive_base_unless_the_exponent_is_an_integer() -> None:
    head = "kernel k(N=2)\nin X[i:N] f32\nout Y[i] = "
    assert to_sexpr(parse_spec(head + "pow(X[i], 2)\n").term) == "(mul (In X i:2) (In X i:2))"
    assert "exp" in to_sexpr(parse_spec(head + "pow(X[i], X[i])\n").term)
    half = parse_spec(head + "pow(X[i], 0.5)\n").term  # a real power: exp(0.5 log x)
    assert to_sexpr(half) == "(exp (mul (Const 0.5) (log (In X i:2))))"
    for base in ("0", "-2", "-0.5"):
        with pytest.raises(SpecError, match="non-positive base") as info:
            parse_spec(head + f"pow({base}, X[i])\n")
        assert (info.value.line, info.value.col) == (3, 16)


def test_every_macro_with_parameters_takes_them_by_position_or_name() -> None:
    head = "kernel k(N=2)\nin X[i:N] f32\nout Y[i] = "
    for name, f in ELEMENTWISE.items():
        for pname, default in f.params:
            if default is None:
                continue
            by_name = parse_spec(head + f"{name}(X[i], {pname}={default + 0.5})\n").term
            given = f.params[: [q for q, _ in f.params].index(pname) + 1]
            args = ", ".join(str(default + 0.5) if p == pname else str(d or 0.0)
                             for p, d in given)
            by_position = parse_spec(head + f"{name}(X[i], {args})\n").term
            assert by_name is by_position, name


# -- scalar inputs, keepdim outputs, size-1 broadcasting --------------------------------------

SHAPES = """kernel shapes(B=2, C=3, H=4, W=5)
in X[b:B, c:C, h:H, w:W] f32
in S[c:C, one:1, one2:1] f32
in alpha[] f32
out Y[b, c, 1, 1] = mean(h, w: X[b, c, h, w] * S[c, h, w]) * alpha
"""


def _shapes_reference(env: dict[str, np.ndarray]) -> np.ndarray:
    return np.asarray((env["X"] * env["S"]).mean(axis=(2, 3), keepdims=True) * env["alpha"])


def test_scalar_keepdim_and_broadcast_inputs_parse_to_the_declared_shapes() -> None:
    p = parse_spec(SHAPES)
    assert p.out_axes == ("b", "c") and p.out_shape == (2, 3, 1, 1)
    assert p.out_dims == (("b",), ("c",), (), ())
    assert p.input("alpha").dims == () and p.input("S").dims == (3, 1, 1)
    env = random_inputs(p, seed=0)
    assert env["alpha"].shape == ()
    got = evaluate_as(p.term, env, p.out_axes).reshape(p.out_shape)
    np.testing.assert_allclose(got, _shapes_reference(env), rtol=1e-12)
    assert parse_term(to_sexpr(p.term)) is p.term  # (In alpha) round-trips


@pytest.mark.parametrize("backend", ["numpy", "c", "cuda-cpu"])
def test_scalar_keepdim_and_broadcast_run_on_every_backend(backend: str) -> None:
    if backend == "cuda-cpu" and shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    p = parse_spec(SHAPES)
    env = random_inputs(p, seed=1)
    env32 = {k: v.astype(np.float32) for k, v in env.items()}
    if backend == "cuda-cpu":
        lowered = lower(p.term, p.out_axes)
        out = run_on_cpu(lowered, lowered.nests([{} for _ in lowered.kernels]), env32)
    else:
        out = run_program(p.term, p.out_axes, env32, backend)
    np.testing.assert_allclose(out.reshape(p.out_shape), _shapes_reference(env), rtol=1e-5)


def test_check_and_run_report_the_keepdim_shape(tmp_path: Path) -> None:
    spec = tmp_path / "s.ks"
    spec.write_text(SHAPES)
    proc = subprocess.run([sys.executable, "-m", "kernelsat", "check", str(spec), "--json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    record = out[0] if isinstance(out, list) else out
    record = record.get("specs", [record])[0] if "specs" in record else record
    assert record["output"]["shape"] == [2, 3, 1, 1]
    assert record["output"]["axes"] == ["b", "c", "1", "1"]
    assert {"name": "alpha", "axes": [], "shape": [], "dtype": "f32",
            "role": "data"} in record["inputs"]




def test_a_grouped_output_dim_is_one_dim_of_the_array() -> None:
    p = parse_spec("kernel k(B=2, G=3, C=2, N=5)\nin X[b:B, ch:G*C, n:N] f32\n"
                   "S[b, (g, c), n] = X[b, (g:G, c), n] * 2\n"
                   "out Y[(b, n), (g, c)] = S[b, g, c, n]\n")
    assert p.out_axes == ("b", "n", "g", "c") and p.out_shape == (10, 6)
    assert p.out_layout == ("(b, n)", "(g, c)")
    env = random_inputs(p, seed=0)
    want = (2 * env["X"]).transpose(0, 2, 1).reshape(10, 6)
    for backend in ("numpy", "c"):
        env32 = {k: v.astype(np.float32) for k, v in env.items()}
        got = run_program(p.term, p.out_axes, env32, backend).reshape(p.out_shape)
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_a_size_one_dim_binds_its_axis_where_nothing_else_does() -> None:
    p = parse_spec("kernel k(M=3)\nin X[i:M, j:1] f32\nout Y[i, j] = X\n")
    assert dict(p.term.shape) == {"i": 3, "j": 1}
    p = parse_spec("kernel k(M=3, N=4)\nin X[i:M, j:N] f32\nin Z[o:1, j:N] f32\n"
                   "out Y[i, j] = X + Z[i, j]\n")
    env = random_inputs(p, seed=0)
    np.testing.assert_allclose(evaluate_as(p.term, env, p.out_axes), env["X"] + env["Z"])


# -- the macros against PyTorch itself, where the torch environment exists -------------------

TORCH_SCRIPT = """
import json, sys
import numpy as np, torch
import torch.nn.functional as F
data = np.load(sys.argv[1])
x = torch.from_numpy(data["x"])
out = {
    "relu6": F.relu6(x), "hardtanh": F.hardtanh(x),
    "hardtanh_args": F.hardtanh(x, -0.5, 2.0), "clamp": torch.clamp(x, -0.75, 0.5),
    "clamp_min": torch.clamp(x, min=0.25), "clamp_max": torch.clamp(x, max=-0.25),
    "clamp_crossed": torch.clamp(x, 1.0, -1.0), "leaky_relu": F.leaky_relu(x),
    "leaky_relu_slope": F.leaky_relu(x, -0.3), "elu": F.elu(x), "elu_alpha": F.elu(x, -0.7),
    "selu": F.selu(x), "softplus": F.softplus(x),
    "softplus_beta": F.softplus(x, beta=3), "mish": F.mish(x),
    "hardsigmoid": F.hardsigmoid(x), "hardswish": F.hardswish(x),
    "softsign": F.softsign(x), "logsigmoid": F.logsigmoid(x), "silu": F.silu(x),
    "square": x ** 2, "cube_neg": -x ** 3, "inverse_square": x ** -2,
    "power_tower": x ** 2 ** 2, "pow_base": torch.pow(1.5, x), "pow_int": torch.pow(x, 5),
}
np.savez(sys.argv[2], **{k: v.numpy() for k, v in out.items()})
"""


@pytest.mark.skipif(not TORCH_PYTHON.exists(), reason="no .venv-torch")
def test_every_activation_equals_pytorch_in_float64(tmp_path: Path) -> None:
    x = np.concatenate([np.linspace(-30, 30, 241), [-1000.0, -100.0, 100.0, 400.0]])
    np.savez(tmp_path / "in.npz", x=x)
    (tmp_path / "t.py").write_text(TORCH_SCRIPT)
    proc = subprocess.run([str(TORCH_PYTHON), str(tmp_path / "t.py"), str(tmp_path / "in.npz"),
                           str(tmp_path / "out.npz")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    torch_out = np.load(tmp_path / "out.npz")
    assert set(torch_out.files) == set(ACTIVATIONS)
    for name, (call, _) in ACTIVATIONS.items():
        p = parse_spec(f"kernel k(N={x.size})\nin X[i:N] f64\n"
                       f"out Y[i] = {call.format(x='X[i]')}\n")
        with np.errstate(over="ignore"):
            got = evaluate_as(p.term, {"X": x}, p.out_axes)
        want = torch_out[name]
        fin = np.isfinite(want)
        assert np.array_equal(np.isfinite(got), fin), name
        # torch's softplus is linear past beta x > 20 (threshold): within e^-20 of it
        rtol = 1e-9 if "softplus" in name else 1e-12
        np.testing.assert_allclose(got[fin], want[fin], rtol=rtol, atol=1e-12, err_msg=name)


# -- the activation rules simplify what the macros expand to ---------------------------------


@pytest.mark.parametrize(("rhs", "simplified"), [
    ("relu(relu(X[i]))", "relu(X[i])"),
    ("hardtanh(hardtanh(X[i], -2, 3), -2, 3)", "hardtanh(X[i], -2, 3)"),
    ("clamp(clamp(X[i], 0, 1), 0, 1)", "clamp(X[i], 0, 1)"),
    ("leaky_relu(X[i], 1)", "X[i]"),
    ("1 - sigmoid(X[i])", "sigmoid(-X[i])"),
    ("abs(X[i]) * abs(X[i])", "X[i] ^ 2"),
    ("relu(X[i]) - relu(-X[i])", "X[i]"),
])
def test_activation_rules_simplify_the_expansions(rhs: str, simplified: str) -> None:
    head = "kernel k(N=4)\nin X[i:N] f32\nout Y[i] = "
    term = parse_spec(head + rhs + "\n").term
    want = parse_spec(head + simplified + "\n").term
    res = saturate(term, library_rules(["activations"]))
    best = extract(res.snapshot, "greedy-tree")[0].term
    assert best is want, (to_sexpr(best), to_sexpr(want))


def test_the_default_schedule_runs_the_activation_rules_forward_only() -> None:
    term = parse_spec("kernel k(N=4)\nin X[i:N] f32\nout Y[i] = relu(relu(X[i])) + "
                      "leaky_relu(X[i], 1)\n").term
    rules = scheduled_rules(library_rules(), DEFAULT_SCHEDULE)
    res = saturate(term, rules, schedule=DEFAULT_SCHEDULE)
    assert res.firings.get("relu-relu") and res.firings.get("relu-plus-min")
    assert not any(k.endswith("/b") and k.split("/")[0] in ACTIVATION_RULES
                   for k in res.firings)


# -- cat ------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 5), min_size=2, max_size=4), st.integers(1, 3),
       st.booleans())
def test_cat_equals_numpy_concatenate(widths: list[int], rows: int, stored: bool) -> None:
    names = [f"A{k}" for k in range(len(widths))]
    decls = "".join(f"in {n}[i:M, a{k}:{w}] f32\n" for k, (n, w) in enumerate(
        zip(names, widths, strict=True)))
    parts = [f"exp({n}[i, a{k}])" if stored and k == 0 else f"{n}[i, a{k}]"
             for k, n in enumerate(names)]
    p = parse_spec(f"kernel k(M={rows})\n{decls}out Y[i, j] = cat(j: {', '.join(parts)})\n")
    env = random_inputs(p, seed=0)
    want = np.concatenate([np.exp(env[n]) if stored and k == 0 else env[n]
                           for k, n in enumerate(names)], axis=1)
    np.testing.assert_allclose(evaluate_as(p.term, env, p.out_axes), want, rtol=1e-12)
    env32 = {k: v.astype(np.float32) for k, v in env.items()}
    np.testing.assert_allclose(run_program(p.term, p.out_axes, env32, "numpy"), want,
                               rtol=1e-6)


def test_cat_runs_on_c_and_the_cuda_shim() -> None:
    p = parse_spec("kernel k(M=3, P=4, Q=2)\nin X[i:M, a:P] f32\nin Z[i:M, c:Q] f32\n"
                   "out Y[j, i] = cat(j: X[i, a], exp(Z[i, c]), X[i, a] * 2)\n")
    env = random_inputs(p, seed=2)
    want = np.concatenate([env["X"], np.exp(env["Z"]), 2 * env["X"]], axis=1).T
    env32 = {k: v.astype(np.float32) for k, v in env.items()}
    np.testing.assert_allclose(run_program(p.term, p.out_axes, env32, "c"), want, rtol=1e-6)
    if shutil.which("g++") is not None:
        lowered = lower(p.term, p.out_axes)
        out = run_on_cpu(lowered, lowered.nests([{} for _ in lowered.kernels]), env32)
        np.testing.assert_allclose(out, want, rtol=1e-6)
