"""Attacks on the comparison helpers: `kernelsat.testing.assert_equivalent`,
`assert_arrays_equivalent`, `relative_error`, and the ship gate's float64 comparison
(`kernelsat.driver.jobs.numeric_failure`). Non-finite entries must match exactly
(positions, NaN against NaN, the sign of each infinity); the finite entries are compared
within the tolerance; NaN never makes a comparison pass."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kernelsat.driver.jobs import numeric_failure
from kernelsat.ir import Const, In, Term, abs_, add, div, log, mul, neg, sqrt, sub
from kernelsat.testing import (
    assert_arrays_equivalent,
    assert_equivalent,
    nonfinite_mismatch,
    relative_error,
)

X = In("x", (("n", 8),))
KINDS = ("finite", "nan", "inf", "-inf")


@st.composite
def arrays(draw: st.DrawFn, max_size: int = 12) -> np.ndarray:
    """float64 arrays (0 to 2 dims, empty ones included) of any magnitude, each entry
    finite or NaN or +inf or -inf at random."""
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=2)))
    size = math.prod(shape)
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=size, max_size=size))
    values = draw(st.lists(st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False),
                           min_size=size, max_size=size))
    special = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
    flat = [special.get(k, v) for k, v in zip(kinds, values, strict=True)]
    return np.array(flat, dtype=np.float64).reshape(shape)


def _finite_norm(a: np.ndarray) -> float:
    return math.hypot(*(float(v) for v in a[np.isfinite(a)]))


def _fails(actual: np.ndarray, expected: np.ndarray, rtol: float) -> bool:
    try:
        assert_arrays_equivalent(actual, expected, rtol)
    except AssertionError:
        return True
    return False


RTOLS = st.sampled_from([1e-12, 1e-9, 1e-6, 1e-3])


@settings(max_examples=60, deadline=None)
@given(arrays(), RTOLS)
def test_an_array_is_equivalent_to_itself(a: np.ndarray, rtol: float) -> None:
    assert_arrays_equivalent(a.copy(), a, rtol)
    assert relative_error(a.copy(), a) == 0.0
    assert nonfinite_mismatch(a.copy(), a) == ""


@settings(max_examples=60, deadline=None)
@given(arrays().filter(lambda a: a.size > 0), st.data())
def test_changing_a_nonfinite_position_fails(a: np.ndarray, data: st.DataObject) -> None:
    flat = a.copy().reshape(-1)
    i = data.draw(st.integers(0, flat.size - 1))
    old = "finite" if np.isfinite(flat[i]) else ("nan" if np.isnan(flat[i]) else
                                                 ("inf" if flat[i] > 0 else "-inf"))
    new = data.draw(st.sampled_from([k for k in KINDS if k != old]))
    flat[i] = {"finite": 1.0, "nan": math.nan, "inf": math.inf, "-inf": -math.inf}[new]
    b = flat.reshape(a.shape)
    for actual, expected in ((b, a), (a, b)):  # either side may be the wrong one
        assert _fails(actual, expected, rtol=1e-3)
        assert relative_error(actual, expected) == math.inf
        assert nonfinite_mismatch(actual, expected)


@settings(max_examples=60, deadline=None)
@given(arrays().filter(lambda a: bool(np.isfinite(a).any())), RTOLS, st.data())
def test_a_finite_change_beyond_tolerance_fails(a: np.ndarray, rtol: float,
                                                data: st.DataObject) -> None:
    finite = np.flatnonzero(np.isfinite(a))
    i = int(data.draw(st.sampled_from(finite.tolist())))
    norm = _finite_norm(a)
    sign = data.draw(st.sampled_from([-1.0, 1.0]))
    flat = a.copy().reshape(-1)
    flat[i] += sign * (4 * rtol * norm if norm > 0 else 1.0)
    b = flat.reshape(a.shape)
    # in the subnormal range the nudge can round away (2e-313 + 1e-324 == 2e-313): no change
    assume(abs(float(flat[i]) - float(a.reshape(-1)[i])) > 2 * rtol * norm)
    assert _fails(b, a, rtol)
    assert relative_error(b, a) > rtol


@settings(max_examples=60, deadline=None)
@given(arrays().filter(lambda a: bool(np.isfinite(a).any())), RTOLS, st.data())
def test_a_finite_change_within_tolerance_passes(a: np.ndarray, rtol: float,
                                                 data: st.DataObject) -> None:
    finite = np.flatnonzero(np.isfinite(a))
    i = int(data.draw(st.sampled_from(finite.tolist())))
    flat = a.copy().reshape(-1)
    flat[i] += rtol * _finite_norm(a) / 4
    assert_arrays_equivalent(flat.reshape(a.shape), a, rtol)


# -- the examples of the issue and their class ------------------------------------------------


@pytest.mark.parametrize(
    "a, b",
    [
        (X, div(X, Const(0.0))),  # finite against +-inf
        (add(log(X), X), add(log(X), mul(Const(7.0), X))),  # NaNs in the same places
        (div(X, Const(0.0)), div(neg(X), Const(0.0))),  # infinities of the other sign
        (log(X), sqrt(X)),  # NaN at the same places, finite values differ
        (mul(Const(1.001), X), X),  # finite, 0.1% off
        (X, sub(X, div(abs_(X), abs_(X)))),  # finite, off by one
        (log(sub(abs_(X), abs_(X))), log(X)),  # -inf everywhere against NaN/finite
    ],
)
def test_wrong_terms_fail(a: Term, b: Term) -> None:
    with pytest.raises(AssertionError, match="differ"):
        assert_equivalent(a, b)
    with pytest.raises(AssertionError, match="differ"):
        assert_equivalent(b, a)


@pytest.mark.parametrize(
    "a, b",
    [
        (div(X, Const(0.0)), mul(X, div(Const(1.0), Const(0.0)))),  # the same infinities
        (log(X), log(mul(X, Const(1.0)))),  # the same NaNs, the same finite values
        (log(neg(abs_(X))), log(neg(abs_(X)))),  # all NaN on both sides
    ],
)
def test_equal_terms_with_nonfinite_outputs_pass(a: Term, b: Term) -> None:
    assert_equivalent(a, b)


def test_relative_error_edge_cases() -> None:
    nan, inf = math.nan, math.inf
    assert relative_error(np.array([1.0, nan]), np.array([1.0, nan])) == 0.0
    assert relative_error(np.array([1.0, 2.0]), np.array([1.0, nan])) == inf  # was NaN
    assert relative_error(np.array([nan, nan]), np.array([1.0, 2.0])) == inf
    assert relative_error(np.array([inf]), np.array([-inf])) == inf
    assert relative_error(np.array([2e200]), np.array([1e200])) == 1.0  # norms overflow
    assert relative_error(np.array([1e200, 1e200]), np.array([1e200, 1e200])) == 0.0
    assert relative_error(np.array([-0.0]), np.array([0.0])) == 0.0  # -0.0 == 0.0
    assert relative_error(np.zeros((0,)), np.zeros((0,))) == 0.0  # nothing to compare
    assert relative_error(np.zeros((0,)), np.zeros((0, 2))) == inf  # shapes differ
    assert relative_error(np.array([1e-3]), np.array([0.0])) > 1.0  # absolute floor
    assert relative_error(np.array([2e-114]), np.array([1e-114])) == 1.0  # tiny: relative
    assert relative_error(np.array([1e300]), np.array([0.0])) == inf
    with pytest.raises(AssertionError, match="shape"):
        assert_arrays_equivalent(np.zeros(2), np.zeros(3))
    with pytest.raises(AssertionError, match="non-finite"):
        assert_arrays_equivalent(np.array([nan]), np.array([1.0]))


# -- the ship gate's float64 comparison ------------------------------------------------------


def _writes(values: np.ndarray) -> Callable[[object, np.ndarray], None]:
    def exe(inputs: object, out: np.ndarray) -> None:
        out[...] = values

    return exe


@pytest.mark.parametrize(
    "written, why",
    [
        (np.array([1.0, np.nan, 3.0]), "NaN"),
        (np.array([1.0, np.inf, 3.0]), "infinities"),
        (np.array([1.0, -np.inf, 3.0]), "infinities"),
        (np.array([0.0, 0.0, 0.0]), "all zeros"),
        (np.array([1.0, 2.0, 3.1]), "relative L2 error"),
        (np.array([1e38, 1e38, 1e38]), "relative L2 error"),
    ],
)
def test_the_gate_comparison_rejects(written: np.ndarray, why: str) -> None:
    reference = np.array([1.0, 2.0, 3.0])
    assert why in numeric_failure(_writes(written), {}, reference)


def test_the_gate_comparison_accepts_a_match_and_refuses_a_nonfinite_reference() -> None:
    reference = np.array([1.0, -2.0, 3.0])
    assert numeric_failure(_writes(reference.astype(np.float32)), {}, reference) == ""
    for bad in (np.nan, np.inf):
        ref = np.array([1.0, bad, 3.0])
        assert "reference" in numeric_failure(_writes(ref), {}, ref)

    def raises(inputs: object, out: np.ndarray) -> None:
        raise RuntimeError("boom")

    assert "raised RuntimeError" in numeric_failure(raises, {}, reference)

    def unwritten(inputs: object, out: np.ndarray) -> None:
        out[0] = 1.0

    assert "NaN" in numeric_failure(unwritten, {}, np.array([1.0, 2.0]))
