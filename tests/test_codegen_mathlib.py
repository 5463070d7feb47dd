"""Accuracy of the C prelude's float32 transcendentals against float64, and that each
one vectorizes (a scalar libm call or a branch gcc cannot if-convert keeps a whole
elementwise loop scalar: softplus/mish/logsigmoid ran 10x slower, issue 18).

Bounds are relative errors versus the float64 function of the same float32 input
(so they include the final rounding, 2^-24 ~ 6e-8); sin and cos, whose values pass
through 0, are bounded in absolute error. Measured when written (2^15+ points each):
exp 7.8e-8, log 7.6e-8, tanh 1.3e-7, erf 2.6e-7, sigmoid 1.4e-7, log1p 1.2e-7,
softplus 9.5e-8, sin/cos 7.5e-8 absolute up to |x| = 2^40."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import erf as sp_erf

from kernelsat.codegen import render, run_program
from kernelsat.codegen.c import CFLAGS
from kernelsat.codegen.c_prelude import PRELUDE
from kernelsat.codegen.lower import lower
from kernelsat.ir import In, Term, erf, exp, log, sigmoid, tanh
from kernelsat.ops import OPS, Op

RNG = np.random.default_rng(7)
N = 1 << 15


def unary(op: Op):
    return lambda x: Term(op, (x,))


def np_softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


SIN_XS = np.r_[RNG.uniform(-10, 10, N), RNG.uniform(-1e4, 1e4, N), RNG.uniform(-1e6, 1e6, 4096),
               RNG.uniform(-2.0**40, 2.0**40, 4096), RNG.uniform(-1e-3, 1e-3, 256)]

# name: (term builder, float64 reference, bound, inputs, bound is absolute)
CASES = {
    "exp": (exp, np.exp, 2e-7, np.r_[RNG.uniform(-87.3, 88.7, N), RNG.uniform(-1, 1, N)], False),
    "log": (log, np.log, 2e-7, np.r_[np.exp(RNG.uniform(-87, 88, N)), RNG.uniform(0.5, 2, N),
                                     RNG.uniform(1e-44, 1e-38, 256)], False),
    "tanh": (tanh, np.tanh, 3e-7, np.r_[RNG.uniform(-10, 10, N), RNG.uniform(-1, 1, N),
                                        RNG.uniform(-1e-3, 1e-3, 256)], False),
    "erf": (erf, sp_erf, 5e-7, np.r_[RNG.uniform(-5, 5, N), RNG.uniform(-1, 1, N),
                                     RNG.uniform(-1e-3, 1e-3, 256)], False),
    "sigmoid": (sigmoid, lambda x: 1 / (1 + np.exp(-x)), 3e-7, RNG.uniform(-80, 80, N), False),
    # softplus: from where e^x underflows (-87) to far past where it is x itself
    "softplus": (unary(Op.SOFTPLUS), np_softplus, 2e-7,
                 np.r_[RNG.uniform(-87, 100, N), RNG.uniform(-5, 5, N),
                       RNG.uniform(-1e-3, 1e-3, 256), RNG.uniform(1e4, 3e38, 256)], False),
    "sin": (unary(Op.SIN), np.sin, 1.5e-7, SIN_XS, True),
    "cos": (unary(Op.COS), np.cos, 1.5e-7, SIN_XS, True),
}


def run_c(fn, xs: np.ndarray, cache) -> np.ndarray:
    term: Term = fn(In("x", (("i", len(xs)),)))
    return run_program(term, ("i",), {"x": xs}, "c", cache_dir=cache).astype(np.float64)


def error(got: np.ndarray, want: np.ndarray, absolute: bool) -> np.ndarray:
    scale = np.ones_like(want) if absolute else np.maximum(np.abs(want), 1e-300)
    return np.abs(got - want) / scale


@pytest.mark.parametrize("name", sorted(CASES))
def test_error_bound(name: str, tmp_path) -> None:
    fn, ref, bound, xs, absolute = CASES[name]
    xs = xs.astype(np.float32)
    got = run_c(fn, xs, tmp_path)
    err = error(got, ref(xs.astype(np.float64)), absolute)
    assert err.max() < bound, f"{name}: max error {err.max():.3g} at x={xs[err.argmax()]!r}"


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 100.0, -100.0, 1e-45, -1e-45],
                   np.float32)
EXPECTED = {
    "exp": [1, 1, np.inf, 0, np.nan, np.exp(-1), np.inf, 0, 1, 1],
    "log": [-np.inf, -np.inf, np.inf, np.nan, np.nan, np.nan, np.log(100), np.nan,
            np.log(1.401298464324817e-45), np.nan],
    "tanh": [0, 0, 1, -1, np.nan, np.tanh(-1), 1, -1, 1.401298464324817e-45,
             -1.401298464324817e-45],
    "erf": [0, 0, 1, -1, np.nan, sp_erf(-1), 1, -1, 1.401298464324817e-45,
            -1.401298464324817e-45],
    "sigmoid": [0.5, 0.5, 1, 0, np.nan, 1 / (1 + np.e), 1, 0, 0.5, 0.5],
    # softplus(-100) = e^-100 underflows float32's normal range: flushed to 0
    "softplus": [np.log(2), np.log(2), np.inf, 0, np.nan, float(np.logaddexp(0.0, -1.0)), 100, 0,
                 np.log(2), np.log(2)],
    "sin": [0, 0, np.nan, np.nan, np.nan, np.sin(-1), np.sin(np.float32(100)),
            np.sin(np.float32(-100)), 1.401298464324817e-45, -1.401298464324817e-45],
    "cos": [1, 1, np.nan, np.nan, np.nan, np.cos(-1), np.cos(np.float32(100)),
            np.cos(np.float32(-100)), 1, 1],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_special_values(name: str, tmp_path) -> None:
    got = run_c(CASES[name][0], SPECIAL, tmp_path)
    want = np.array(EXPECTED[name], np.float64)
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=0)
    if name == "sin":  # sin(-0) = -0
        assert np.signbit(got[1]) and not np.signbit(got[0])


def test_sin_cos_stay_in_range_for_huge_arguments(tmp_path) -> None:
    """Past 2^40 the reduction is not exact, but every finite input gives a value in [-1, 1]."""
    xs = np.r_[np.float32(3.4e38), -np.float32(3.4e38),
               RNG.uniform(2.0**40, 3e38, 2048) * RNG.choice([-1, 1], 2048)].astype(np.float32)
    for name in ("sin", "cos"):
        got = run_c(CASES[name][0], xs, tmp_path)
        assert np.all(np.abs(got) <= 1.0), name


# The C prelude as the only maths: C build of each op that runs through it
LOG1P_C = """
void t_log1p(const float* restrict a, float* restrict b, long n) {
  for (long i = 0; i < n; i++) b[i] = ks_log1p(a[i]);
}
"""


@pytest.fixture(scope="module")
def log1p_lib(tmp_path_factory):
    """ks_log1p alone (no op spells it: softplus inlines its [0, 1] case), as a library."""
    import ctypes

    d = tmp_path_factory.mktemp("log1p")
    (d / "l.c").write_text(PRELUDE + LOG1P_C)
    subprocess.run(["gcc", *CFLAGS, "-o", str(d / "l.so"), str(d / "l.c"), "-lm"], check=True)
    lib = ctypes.CDLL(str(d / "l.so"))

    def run(xs: np.ndarray) -> np.ndarray:
        xs = np.ascontiguousarray(xs, np.float32)
        out = np.empty_like(xs)
        lib.t_log1p(xs.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p),
                    ctypes.c_long(len(xs)))
        return out.astype(np.float64)

    return run


def test_log1p_error_bound(log1p_lib) -> None:
    xs = np.r_[RNG.uniform(-1, 1, N), RNG.uniform(-1e-4, 1e-4, N), np.exp(RNG.uniform(-80, 80, N)),
               -np.exp(RNG.uniform(-80, -1e-6, N)), RNG.uniform(-1e-38, 1e-38, 256)]
    xs = xs.astype(np.float32)
    xs = xs[xs > -1]
    err = error(log1p_lib(xs), np.log1p(xs.astype(np.float64)), False)
    assert err.max() < 2e-7, f"max rel error {err.max():.3g} at x={xs[err.argmax()]!r}"


def test_log1p_special_values(log1p_lib) -> None:
    xs = np.array([0.0, -0.0, -1.0, -2.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 3e38],
                  np.float32)
    got = log1p_lib(xs)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.log1p(xs.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=2e-7, atol=0)
    assert np.signbit(got[1]) and not np.signbit(got[0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1.0, 3.0000000054977558e+38, width=32, allow_nan=False),
                min_size=1, max_size=64))
def test_log1p_matches_float64_everywhere(log1p_lib, xs: list[float]) -> None:
    """log1p over its whole domain (hypothesis draws edges: -1, denormals, huge)."""
    a = np.array(xs, np.float32)
    got, want = log1p_lib(a), np.log1p(a.astype(np.float64))
    exact = np.isinf(want)
    assert np.array_equal(got[exact], want[exact])
    assert np.all(error(got[~exact], want[~exact], False) < 2e-7)


# -- vectorization: every op the C renderer spells through a function ----------------------

LIBM = re.compile(r"\b(log1pf|expf|logf|tanhf|erff|sinf|cosf|powf|tanf|atanf|expm1f)\(")


def test_no_op_calls_scalar_libm() -> None:
    """No op's C spelling calls a libm function gcc cannot vectorize (sqrtf and fabsf
    are single instructions with -fno-math-errno)."""
    calls = {op.value: info.c for op, info in OPS.items() if info.c and LIBM.search(info.c)}
    assert not calls, f"C spellings calling scalar libm: {calls}"


VECTOR_OPS = [op for op, info in OPS.items()
              if info.kind == "elementwise" and info.arity == 1 and info.c and "ks_" in info.c]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")
@pytest.mark.parametrize("op", VECTOR_OPS, ids=lambda o: o.value)
def test_elementwise_loop_vectorizes(op: Op, tmp_path) -> None:
    """The rendered elementwise kernel of each prelude-backed op vectorizes: gcc's own
    report (-fopt-info-vec) says the inner loop was vectorized."""
    term = Term(op, (In("x", (("i", 4), ("j", 1024))),))
    src = tmp_path / "k.c"
    src.write_text(render(lower(term, ("i", "j"))))
    flags = [f for f in CFLAGS if f not in ("-shared", "-fPIC")]
    res = subprocess.run(["gcc", *flags, "-c", str(src), "-o", str(tmp_path / "k.o"),
                          "-fopt-info-vec-optimized"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    kernel_line = next(n for n, line in enumerate(src.read_text().splitlines(), 1)
                       if "static void ks_kernel0" in line)
    vectorized = [int(m) for m in re.findall(r"k\.c:(\d+):\d+: optimized: loop vectorized",
                                             res.stderr)]
    assert any(n > kernel_line for n in vectorized), f"{op.value}: kernel loop not vectorized"
