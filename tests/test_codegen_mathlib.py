"""Accuracy of the C prelude's float32 exp/log/tanh/erf/sigmoid against float64.

Bounds are relative errors versus the float64 function of the same float32 input
(so they include the final rounding, 2^-24 ~ 6e-8). Measured when written (2^16+
points each): exp 7.8e-8, log 7.6e-8, tanh 1.3e-7, erf 2.6e-7, sigmoid 1.4e-7."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import erf as sp_erf

from kernelsat.codegen import run_program
from kernelsat.ir import In, Term, erf, exp, log, sigmoid, tanh

RNG = np.random.default_rng(7)
N = 1 << 15

CASES = {
    "exp": (exp, np.exp, 2e-7, np.r_[RNG.uniform(-87.3, 88.7, N), RNG.uniform(-1, 1, N)]),
    "log": (log, np.log, 2e-7, np.r_[np.exp(RNG.uniform(-87, 88, N)), RNG.uniform(0.5, 2, N),
                                     RNG.uniform(1e-44, 1e-38, 256)]),
    "tanh": (tanh, np.tanh, 3e-7, np.r_[RNG.uniform(-10, 10, N), RNG.uniform(-1, 1, N),
                                        RNG.uniform(-1e-3, 1e-3, 256)]),
    "erf": (erf, sp_erf, 5e-7, np.r_[RNG.uniform(-5, 5, N), RNG.uniform(-1, 1, N),
                                     RNG.uniform(-1e-3, 1e-3, 256)]),
    "sigmoid": (sigmoid, lambda x: 1 / (1 + np.exp(-x)), 3e-7, RNG.uniform(-80, 80, N)),
}


def run_c(fn, xs: np.ndarray, cache) -> np.ndarray:
    term: Term = fn(In("x", (("i", len(xs)),)))
    return run_program(term, ("i",), {"x": xs}, "c", cache_dir=cache).astype(np.float64)


@pytest.mark.parametrize("name", sorted(CASES))
def test_relative_error_bound(name: str, tmp_path) -> None:
    fn, ref, bound, xs = CASES[name]
    xs = xs.astype(np.float32)
    got = run_c(fn, xs, tmp_path)
    want = ref(xs.astype(np.float64))
    rel = np.abs(got - want) / np.maximum(np.abs(want), 1e-300)
    assert rel.max() < bound, f"{name}: max rel error {rel.max():.3g} at x={xs[rel.argmax()]!r}"


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, 100.0, -100.0], np.float32)
EXPECTED = {
    "exp": [1, 1, np.inf, 0, np.nan, np.exp(-1), np.inf, 0],
    "log": [-np.inf, -np.inf, np.inf, np.nan, np.nan, np.nan, np.log(100), np.nan],
    "tanh": [0, 0, 1, -1, np.nan, np.tanh(-1), 1, -1],
    "erf": [0, 0, 1, -1, np.nan, sp_erf(-1), 1, -1],
    "sigmoid": [0.5, 0.5, 1, 0, np.nan, 1 / (1 + np.e), 1, 0],
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_special_values(name: str, tmp_path) -> None:
    got = run_c(CASES[name][0], SPECIAL, tmp_path)
    np.testing.assert_allclose(got, np.array(EXPECTED[name], np.float64), rtol=1e-6, atol=0)
