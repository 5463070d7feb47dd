"""Hypothesis strategies and assertions for property tests, here and in other compilers.

- `programs()`: random well-formed terms (elementwise ops, reductions, `LSE`,
  `SoftmaxAvg`, `Dot`, splits, stores, broadcasting over named axes, bounded sizes).
- `inputs_for(term)`: random input arrays for a term (never zeros).
- `assert_equivalent(a, b)`: two terms agree in float64 on random inputs.

>>> from hypothesis import given, settings
>>> @settings(max_examples=5, deadline=None)
... @given(programs(max_depth=3))
... def check(t):
...     assert_equivalent(t, t)
>>> check()
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from hypothesis import strategies as st

from kernelsat.interp import evaluate_as
from kernelsat.ir import (
    LSE,
    Const,
    Dot,
    In,
    Max,
    SoftmaxAvg,
    Split,
    Store,
    Sum,
    Term,
    abs_,
    add,
    div,
    input_dims,
    inputs,
    log,
    recip,
    split_axes,
    sqrt,
)
from kernelsat.ops import BINARY, UNARY, Op

DEFAULT_AXES: tuple[str, ...] = ("i", "j", "k", "n")
DEFAULT_SIZES: tuple[int, ...] = (1, 2, 3, 4, 6, 8)

_SAFE_UNARY = sorted(UNARY - {Op.LOG, Op.SQRT, Op.RECIP}, key=str)
_BINARY = sorted(BINARY, key=str)


def _positive(x: Term) -> Term:
    return add(abs_(x), Const(0.5))


def _unary(op: Op, x: Term) -> Term:
    # log, sqrt and recip get an operand bounded away from zero: programs stay finite
    if op is Op.LOG:
        return log(_positive(x))
    if op is Op.SQRT:
        return sqrt(_positive(x))
    if op is Op.RECIP:
        return recip(_positive(x))
    return Term(op, (x,))


def _binary(op: Op, x: Term, y: Term) -> Term:
    if op is Op.DIV:
        return div(x, _positive(y))
    return Term(op, (x, y))


@st.composite
def programs(
    draw: st.DrawFn,
    max_depth: int = 4,
    axes: Sequence[str] = DEFAULT_AXES,
    sizes: Sequence[int] = DEFAULT_SIZES,
    n_inputs: int = 3,
    ops: frozenset[Op] | None = None,
) -> Term:
    """Random well-formed terms over named axes (one size per axis name)."""
    allowed = frozenset(Op) if ops is None else ops
    size_of = {a: draw(st.sampled_from(list(sizes))) for a in axes}
    names = [f"x{i}" for i in range(n_inputs)]
    declared: dict[str, tuple[str, ...]] = {}

    def leaf() -> Term:
        if Op.CONST in allowed and draw(st.integers(0, 5)) == 0:
            value = draw(st.sampled_from([0.5, 2.0, -1.5, 3.0, 0.25]))
            return Const(value)
        name = draw(st.sampled_from(names))
        if name not in declared:
            chosen = draw(
                st.lists(st.sampled_from(list(axes)), min_size=1, max_size=3, unique=True)
            )
            declared[name] = tuple(chosen)
        return In(name, tuple((a, size_of[a]) for a in declared[name]))

    def gen(depth: int) -> Term:
        if depth <= 0:
            return leaf()
        kinds = ["leaf", "unary", "binary", "binary", "reduce", "split", "store", "dot", "smavg"]
        kind = draw(st.sampled_from(kinds))
        if kind == "leaf":
            return leaf()
        if kind == "unary":
            op = draw(
                st.sampled_from(
                    [o for o in [*_SAFE_UNARY, Op.LOG, Op.SQRT, Op.RECIP] if o in allowed]
                    or [Op.NEG]
                )
            )
            return _unary(op, gen(depth - 1)) if op in allowed else gen(depth - 1)
        if kind == "binary":
            ops_ok = [o for o in _BINARY if o in allowed]
            if not ops_ok:
                return gen(depth - 1)
            return _binary(draw(st.sampled_from(ops_ok)), gen(depth - 1), gen(depth - 1))
        if kind == "reduce":
            x = gen(depth - 1)
            red = [o for o in (Op.SUM, Op.RMAX, Op.LSE) if o in allowed]
            if not x.shape or not red:
                return x
            axis = draw(st.sampled_from(sorted(x.shape)))
            op = draw(st.sampled_from(red))
            return {Op.SUM: Sum, Op.RMAX: Max, Op.LSE: LSE}[op](axis, x)
        if kind == "dot" and Op.DOT in allowed:
            x, y = gen(depth - 1), gen(depth - 1)
            union = sorted(set(x.shape) | set(y.shape))
            if not union:
                return add(x, y)
            return Dot(draw(st.sampled_from(union)), x, y)
        if kind == "smavg" and Op.SOFTMAXAVG in allowed:
            s, v = gen(depth - 1), gen(depth - 1)
            if not s.shape:
                return add(s, v)
            return SoftmaxAvg(draw(st.sampled_from(sorted(s.shape))), s, v)
        if kind == "split" and Op.SPLIT in allowed:
            x = gen(depth - 1)
            options = [
                (a, f)
                for a, n in sorted(x.shape.items())
                if "/" not in a
                for f in range(2, n)
                if n % f == 0 and not set(split_axes(a, f)) & set(x.shape)
            ]
            if not options:
                return x
            a, f = draw(st.sampled_from(options))
            return Split(a, f, x)
        if kind == "store" and Op.STORE in allowed:
            return Store(gen(depth - 1))
        return gen(depth - 1)

    return gen(draw(st.integers(1, max_depth)))


def random_inputs(
    *terms: Term, seed: int = 0, low: float = 0.25, high: float = 1.0
) -> dict[str, np.ndarray]:
    """Random float64 inputs for every `In` of the terms: magnitudes in [low, high],
    random signs, never zero."""
    rng = np.random.default_rng(seed)
    found: dict[str, Term] = {}
    for t in terms:
        for name, node in inputs(t).items():
            found.setdefault(name, node)
    out: dict[str, np.ndarray] = {}
    for name, node in sorted(found.items()):
        dims = input_dims(node)
        mag = rng.uniform(low, high, size=dims)
        out[name] = mag * rng.choice([-1.0, 1.0], size=dims)
    return out


def inputs_for(term: Term) -> st.SearchStrategy[dict[str, np.ndarray]]:
    """A strategy of input dicts for `term` (seeded numpy draws; never zeros)."""
    return st.integers(0, 2**32 - 1).map(lambda seed: random_inputs(term, seed=seed))


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """Relative L2 error `|a - e| / max(|e|, tiny)`; NaN or inf anywhere gives inf."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape or not np.all(np.isfinite(a)):
        return float("inf")
    denom = max(float(np.linalg.norm(e)), 1e-30)
    return float(np.linalg.norm(a - e)) / denom


def assert_equivalent(
    a: Term,
    b: Term,
    env: Mapping[str, np.ndarray] | None = None,
    rtol: float = 1e-9,
    seeds: Sequence[int] = (0, 1),
) -> None:
    """Assert that two terms have the same shape and agree in float64 (relative L2 error
    at most `rtol`) on `env`, or on random inputs for each seed in `seeds`."""
    if dict(a.shape) != dict(b.shape):
        raise AssertionError(f"shapes differ: {dict(a.shape)} vs {dict(b.shape)}")
    axes = tuple(a.shape)
    envs = [env] if env is not None else [random_inputs(a, b, seed=s) for s in seeds]
    for e in envs:
        ra = evaluate_as(a, e, axes)
        rb = evaluate_as(b, e, axes)
        if not (np.all(np.isfinite(ra)) and np.all(np.isfinite(rb))):
            if not np.array_equal(np.isnan(ra), np.isnan(rb)):
                raise AssertionError("the terms differ in where they are not finite")
            continue
        err = relative_error(rb, ra)
        if err > rtol:
            raise AssertionError(
                f"terms differ: relative L2 error {err:.3g} > {rtol:.3g}\n  a = {a!r}\n  b = {b!r}"
            )
