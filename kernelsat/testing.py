"""Hypothesis strategies and assertions for property tests, here and in other compilers.

- `programs()`: random well-formed terms (elementwise ops, reductions, `LSE`,
  `SoftmaxAvg`, `Dot`, splits, stores, broadcasting over named axes, bounded sizes;
  comparisons, `where` and index values `Idx` where `ops` allows them).
- `masked_programs()`: reductions over scores masked to -inf by index comparisons
  (causal, sliding-window and banded masks; fully masked rows and blocks included).
- `gather_programs()`: gathers by integer inputs (issue 18 part 3b): rows of a matrix at
  class labels, embedding rows at token ids (1-D and 2-D ids), cross-entropy's
  `LSE - gather`, gathers of stored values, with elementwise ops and reductions around.
- `inputs_for(term)`: random input arrays for a term (never zeros; gather labels are
  int32 in range).
- `reduction_specs()`, `activation_specs()`: spec texts (`SpecCase`) with an independent
  numpy reference: reductions over random axis sets with keepdim outputs; every
  activation macro, `^` and `pow` (`ACTIVATIONS`, PyTorch's formulas) at |x| up to 1e3,
  with 0-dim inputs, size-1 broadcasting and grouped or keepdim output dims.
  `programs()` draws 0-dim inputs too (`scalar_inputs=False` to leave them out).
- `slice_specs()`, `reshape_specs()`: spec texts (`SpecCase`) with slices along dims
  (`X[i, 1:6:2]`, named `X[i, j=0:3]`, of inputs and intermediates, two slices of equal
  size combined: a GLU in general) and reshapes at the boundary (a packed dim read as a
  group of axes: grouped uses of intermediates and inputs, grouped input declarations),
  each with a numpy reference.
- `assert_equivalent(a, b)`: two terms agree in float64 on random inputs: non-finite
  outputs exactly (positions, NaN against NaN, signs of infinity), finite ones within a
  relative L2 tolerance (`assert_arrays_equivalent`, `relative_error` for arrays).

>>> from hypothesis import given, settings
>>> @settings(max_examples=5, deadline=None)
... @given(programs(max_depth=3))
... def check(t):
...     assert_equivalent(t, t)
>>> check()
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

from kernelsat.gather import label_bounds
from kernelsat.interp import evaluate_as
from kernelsat.ir import (
    LSE,
    Const,
    Dot,
    Gather,
    Idx,
    In,
    Max,
    NegInf,
    Read,
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
    mul,
    recip,
    split_axes,
    sqrt,
    where,
)
from kernelsat.ops import BINARY, COMPARISONS, UNARY, Op
from kernelsat.program import Program
from kernelsat.spec import SpecError, load_spec
from kernelsat.work import term_flops

DEFAULT_AXES: tuple[str, ...] = ("i", "j", "k", "n")
DEFAULT_SIZES: tuple[int, ...] = (1, 2, 3, 4, 6, 8)

_SAFE_UNARY = sorted(UNARY - {Op.LOG, Op.SQRT, Op.RECIP}, key=str)
_BINARY = sorted(BINARY, key=str)
_COMPARISONS = sorted(COMPARISONS, key=str)


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
    scalar_inputs: bool = True,
) -> Term:
    """Random well-formed terms over named axes (one size per axis name); with
    `scalar_inputs`, some inputs are 0-dim (`in alpha[] f32`)."""
    allowed = frozenset(Op) if ops is None else ops
    size_of = {a: draw(st.sampled_from(list(sizes))) for a in axes}
    names = [f"x{i}" for i in range(n_inputs)]
    declared: dict[str, tuple[str, ...]] = {}

    def leaf() -> Term:
        if Op.CONST in allowed and draw(st.integers(0, 5)) == 0:
            value = draw(st.sampled_from([0.5, 2.0, -1.5, 3.0, 0.25]))
            return Const(value)
        if Op.IDX in allowed and draw(st.integers(0, 5)) == 0:
            a = draw(st.sampled_from(list(axes)))
            return Idx(a, size_of[a])
        name = draw(st.sampled_from(names))
        if name not in declared:
            chosen = draw(
                st.lists(st.sampled_from(list(axes)), max_size=3, unique=True,
                         min_size=0 if scalar_inputs and draw(st.integers(0, 5)) == 0 else 1)
            )
            declared[name] = tuple(chosen)
        return In(name, tuple((a, size_of[a]) for a in declared[name]))

    def gen(depth: int) -> Term:
        if depth <= 0:
            return leaf()
        kinds = ["leaf", "unary", "binary", "binary", "reduce", "split", "store", "dot", "smavg",
                 "where"]
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
        if kind == "where" and Op.WHERE in allowed:
            cmp = [o for o in _COMPARISONS if o in allowed]
            if cmp and Op.IDX in allowed and draw(st.booleans()):
                a, b = draw(st.sampled_from(list(axes))), draw(st.sampled_from(list(axes)))
                cond = Term(draw(st.sampled_from(cmp)), (Idx(a, size_of[a]), Idx(b, size_of[b])))
            elif cmp:
                cond = Term(draw(st.sampled_from(cmp)), (gen(depth - 1), gen(depth - 1)))
            else:
                cond = gen(depth - 1)
            return where(cond, gen(depth - 1), gen(depth - 1))
        return gen(depth - 1)

    return gen(draw(st.integers(1, max_depth)))


@st.composite
def masked_programs(draw: st.DrawFn, sizes: Sequence[int] = (1, 2, 3, 5, 8, 16),
                    max_depth: int = 2) -> Term:
    """A reduction (`LSE`, `Max`, `SoftmaxAvg`, or `Sum` of `exp`) over the key axis `n` of
    scores `where(mask, s, -inf)`, whose mask compares the query index `i` with the key
    index `n` (`n <= i + k` causal, `i - w < n <= i` a sliding window, `n == i`,
    `i + k <= n`): fully masked rows included, and the mask's edges (first and last row,
    `n = i`). The scores `s` are random programs over `i`, `n`, `d`.

    >>> from hypothesis import given, settings
    >>> @settings(max_examples=5, deadline=None)
    ... @given(masked_programs())
    ... def check(t):
    ...     assert "n" not in t.shape
    >>> check()
    """
    body = draw(programs(max_depth=max_depth, axes=("i", "n", "d"), sizes=sizes,
                         ops=frozenset(Op) - {Op.SPLIT, Op.STORE, Op.IDX, Op.WHERE}))
    ni = body.all_sizes.get("i") or draw(st.sampled_from(list(sizes)))
    nn = body.all_sizes.get("n") or draw(st.sampled_from(list(sizes)))
    i, n = Idx("i", ni), Idx("n", nn)
    k = Const(float(draw(st.integers(-2, 2))))
    kind = draw(st.sampled_from(["causal", "window", "diagonal", "anti"]))
    if kind == "causal":
        mask = Term(Op.LE, (n, add(i, k)))
    elif kind == "window":
        w = Const(float(draw(st.integers(1, 4))))
        mask = Term(Op.MUL, (Term(Op.LE, (n, i)), Term(Op.LT, (Term(Op.SUB, (i, w)), n))))
    elif kind == "diagonal":
        mask = Term(Op.EQ, (n, i))
    else:
        mask = Term(Op.LE, (add(i, k), n))
    masked = where(mask, body, NegInf())
    red = draw(st.sampled_from(["lse", "max", "smavg", "sumexp"]))
    if red == "lse":
        return LSE("n", masked)
    if red == "max":
        return Max("n", masked)
    if red == "sumexp":
        return Sum("n", Term(Op.EXP, (masked,)))
    v = In("v", (("n", nn), ("e", draw(st.sampled_from([1, 3])))))
    return SoftmaxAvg("n", masked, v)


def random_inputs(
    *terms: Term, seed: int = 0, low: float = 0.25, high: float = 1.0
) -> dict[str, np.ndarray]:
    """Random float64 inputs for every `In` of the terms: magnitudes in [low, high],
    random signs, never zero. Gather labels (issue 18 part 3b) are int32, uniform over
    the range of every axis they index."""
    rng = np.random.default_rng(seed)
    found: dict[str, Term] = {}
    bounds: dict[str, int] = {}
    for t in terms:
        for name, node in inputs(t).items():
            found.setdefault(name, node)
        for name, n in label_bounds(t).items():
            bounds[name] = min(bounds.get(name, n), n)
    out: dict[str, np.ndarray] = {}
    for name, node in sorted(found.items()):
        dims = input_dims(node)
        if name in bounds:
            out[name] = rng.integers(0, bounds[name], size=dims, dtype=np.int32)
            continue
        mag = rng.uniform(low, high, size=dims)
        out[name] = mag * rng.choice([-1.0, 1.0], size=dims)
    return out


def inputs_for(term: Term) -> st.SearchStrategy[dict[str, np.ndarray]]:
    """A strategy of input dicts for `term` (seeded numpy draws; never zeros)."""
    return st.integers(0, 2**32 - 1).map(lambda seed: random_inputs(term, seed=seed))


def nonfinite_mismatch(actual: np.ndarray, expected: np.ndarray) -> str:
    """Where the non-finite entries of two arrays of one shape differ ("" when they match
    exactly: NaN at the same positions, infinities at the same positions with the same
    signs). The finite entries are not compared here.

    >>> nonfinite_mismatch(np.array([1.0, np.inf]), np.array([2.0, np.inf]))
    ''
    >>> nonfinite_mismatch(np.array([1.0, np.inf]), np.array([1.0, -np.inf]))
    'at index (1,): actual inf, expected -inf'
    """
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    same = (np.isnan(a) == np.isnan(e)) & np.where(np.isinf(a) | np.isinf(e), a == e, True)
    if bool(np.all(same)):
        return ""
    where = tuple(int(i) for i in np.argwhere(~same)[0])
    count = int(np.count_nonzero(~same))
    more = f" (and {count - 1} more)" if count > 1 else ""
    return f"at index {where}: actual {float(a[where])}, expected {float(e[where])}{more}"


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    """Relative L2 error `|a - e| / |e|` over the finite entries (`|a - e| / 1e-30` when
    they are all zero); inf when the shapes differ or the non-finite entries do not
    match exactly (`nonfinite_mismatch`).
    Never NaN, never fooled by overflow: the norms are taken after scaling by the
    largest magnitude. Empty arrays, and arrays whose entries are all non-finite and
    match, give 0.0; the sign of a zero is not compared (-0.0 == 0.0).

    >>> relative_error(np.array([1.0, np.nan]), np.array([1.0, np.nan]))
    0.0
    >>> relative_error(np.array([1.0, 2.0]), np.array([1.0, np.nan]))
    inf
    >>> relative_error(np.array([2e200]), np.array([1e200]))
    1.0
    """
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape or nonfinite_mismatch(a, e):
        return float("inf")
    finite = np.isfinite(e)
    fa, fe = a[finite], e[finite]
    scale = max(float(np.max(np.abs(fa), initial=0.0)), float(np.max(np.abs(fe), initial=0.0)))
    if scale == 0.0:
        return 0.0
    diff = float(np.linalg.norm(fa / scale - fe / scale))
    ref = float(np.linalg.norm(fe / scale))
    return diff / ref if ref > 0 else diff * scale / 1e-30  # expected all zeros: absolute


def assert_arrays_equivalent(actual: np.ndarray, expected: np.ndarray, rtol: float = 1e-9,
                             what: str = "arrays") -> None:
    """Assert one shape, exactly the same non-finite entries (positions, NaN vs NaN,
    signs of infinity) and a relative L2 error of the finite entries at most `rtol`.

    >>> assert_arrays_equivalent(np.array([1.0, np.inf]), np.array([1.0, np.inf]))
    >>> assert_arrays_equivalent(np.array([1.0, 2.0]), np.array([1.0, np.inf]))
    Traceback (most recent call last):
    ...
    AssertionError: arrays differ in their non-finite entries: at index (1,): actual 2.0, ...
    """
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        raise AssertionError(f"{what} differ in shape: {a.shape} vs {e.shape}")
    mismatch = nonfinite_mismatch(a, e)
    if mismatch:
        raise AssertionError(f"{what} differ in their non-finite entries: {mismatch}")
    err = relative_error(a, e)
    if not err <= rtol:
        raise AssertionError(f"{what} differ: relative L2 error {err:.3g} > {rtol:.3g}")


def assert_equivalent(
    a: Term,
    b: Term,
    env: Mapping[str, np.ndarray] | None = None,
    rtol: float = 1e-9,
    seeds: Sequence[int] = (0, 1),
) -> None:
    """Assert that two terms have the same shape and agree in float64 on `env`, or on
    random inputs for each seed in `seeds`: the non-finite outputs exactly (the same
    positions, NaN against NaN, infinities of the same sign) and the finite ones within
    relative L2 error `rtol` (`assert_arrays_equivalent`, `b` against `a`).

    >>> from kernelsat.ir import In, div, Const
    >>> x = In("x", (("n", 4),))
    >>> assert_equivalent(x, div(x, Const(1.0)))
    >>> assert_equivalent(x, div(x, Const(0.0)))
    Traceback (most recent call last):
    ...
    AssertionError: terms differ in their non-finite entries: at index (0,): ...
    """
    if dict(a.shape) != dict(b.shape):
        raise AssertionError(f"shapes differ: {dict(a.shape)} vs {dict(b.shape)}")
    axes = tuple(a.shape)
    envs = [env] if env is not None else [random_inputs(a, b, seed=s) for s in seeds]
    for e in envs:
        with np.errstate(all="ignore"):
            ra = evaluate_as(a, e, axes)
            rb = evaluate_as(b, e, axes)
        try:
            assert_arrays_equivalent(rb, ra, rtol, "terms")
        except AssertionError as err:
            raise AssertionError(f"{err}\n  a = {a!r}\n  b = {b!r}") from None


# -- affine reads (issue 18 part 1) ----------------------------------------------------------

PADS: tuple[float | None, ...] = (None, 0.0, -1.5, float("-inf"))
"""Pad values `affine_reads` draws (None: the forms are shifted into range)."""


@st.composite
def affine_reads(draw: st.DrawFn, x: Term, max_new_axes: int = 3,
                 sizes: Sequence[int] = (1, 2, 3, 5), max_coef: int = 2,
                 pads: Sequence[float | None] = PADS) -> Term:
    """A random `Read` of `x`: each of its axes at a form `sum c*b + c0` over fresh axes
    `b` (coefficients in [-max_coef, max_coef], strides, dilations, reversals, shifts),
    padded (including windows that leave the operand on both sides) or, with pad None,
    shifted so that every index is in range."""
    taken = set(x.all_sizes)
    fresh = [f"r{k}" for k in range(16) if f"r{k}" not in taken][:max_new_axes]
    n_new = draw(st.integers(1, len(fresh)))
    new = {a: draw(st.sampled_from(list(sizes))) for a in fresh[:n_new]}
    forms: dict[str, tuple[dict[str, int], int]] = {}
    unused = set(new)
    srcs = sorted(x.shape)
    for k, src in enumerate(srcs):
        pool = sorted(new)
        chosen = draw(st.lists(st.sampled_from(pool), min_size=0, max_size=2, unique=True))
        if k == len(srcs) - 1:
            chosen = sorted(set(chosen) | unused)  # every fresh axis used somewhere
        coefs = {b: draw(st.sampled_from([c for c in range(-max_coef, max_coef + 1) if c]))
                 for b in chosen}
        unused -= set(chosen)
        forms[src] = (coefs, draw(st.integers(-3, 3)))
    if unused:  # an operand without axes: the fresh axes broadcast through a 0-d read
        new = {a: n for a, n in new.items() if a not in unused}
        if not new:
            return x
    pad = draw(st.sampled_from(list(pads)))
    if pad is None:  # shift each form into range where it fits, else pad with 0
        for src, (coefs, _) in forms.items():
            lo = sum(c * (new[b] - 1) for b, c in coefs.items() if c < 0)
            hi = sum(c * (new[b] - 1) for b, c in coefs.items() if c > 0)
            if hi - lo >= x.shape[src]:
                pad = 0.0
                continue
            forms[src] = (coefs, draw(st.integers(-lo, x.shape[src] - 1 - hi)))
    return Read(x, forms, new, pad)


@st.composite
def affine_programs(draw: st.DrawFn, sizes: Sequence[int] = (1, 2, 3, 4, 7)) -> Term:
    """Random programs around an affine read: a read of an input or of an elementwise
    value (stored, or computed in the read's kernel), then optionally an elementwise op,
    a reduction over one of its axes, or a split (the shapes codegen meets in
    convolutions and pooling)."""
    axes = draw(st.lists(st.sampled_from(["i", "j", "k"]), min_size=1, max_size=3,
                         unique=True))
    x = In("x", tuple((a, draw(st.sampled_from(list(sizes)))) for a in axes))
    if draw(st.booleans()):  # a computed operand, stored or not (fused into the read)
        x = Term(draw(st.sampled_from([Op.EXP, Op.NEG, Op.TANH])), (x,))
        x = Store(x) if draw(st.booleans()) else x
    pads = [None, 0.0, -1.5] + ([float("-inf")] if draw(st.booleans()) else [])
    r = draw(affine_reads(x, pads=pads))
    kind = draw(st.sampled_from(["read", "unary", "reduce", "binary", "split"]))
    if kind == "unary":
        return Term(Op.TANH, (r,))
    if kind == "reduce" and r.shape:
        axis = draw(st.sampled_from(sorted(r.shape)))
        return (Max if draw(st.booleans()) else Sum)(axis, r)
    if kind == "binary":
        y = In("y", tuple(sorted(r.shape.items())))
        return mul(r, y)
    if kind == "split":
        options = [(a, f) for a, n in sorted(r.shape.items()) for f in (2, 3)
                   if n % f == 0 and n > f]
        if options:
            a, f = draw(st.sampled_from(options))
            return Split(a, f, r)
    return r


@st.composite
def gather_programs(draw: st.DrawFn, sizes: Sequence[int] = (1, 2, 3, 5, 7, 8)) -> Term:
    """Random programs around a gather by an integer input (issue 18 part 3b): rows of
    `x[b, c]` at labels `y[b]`, or rows of a table `e[v, d]` at ids `ids[t]` (or
    `ids[t, s]`), of the input or of an elementwise value (stored or not); then optionally an
    elementwise op, a product with another input, a reduction over a result axis, or
    cross-entropy's `LSE_c x - x[b, y[b]]` (the shapes of losses and embeddings)."""
    n = lambda: draw(st.sampled_from(list(sizes)))  # noqa: E731
    kind = draw(st.sampled_from(["rows", "table", "table2", "ce"]))
    if kind in ("rows", "ce"):
        nb, nc = n(), n()
        x, axis = In("x", (("b", nb), ("x.c", nc))), "x.c"
        labels = In("y", (("b", nb),))
    else:
        nv, nd, nt = n(), n(), n()
        x, axis = In("e", (("e.v", nv), ("d", nd))), "e.v"
        ids = (("t", nt),) if kind == "table" else (("t", nt), ("s", n()))
        labels = In("ids", ids)
    if draw(st.booleans()):  # a computed operand, stored or not (lowering stores it)
        x = Term(draw(st.sampled_from([Op.EXP, Op.NEG, Op.TANH])), (x,))
        x = Store(x) if draw(st.booleans()) else x
    g = Gather(axis, x, labels)
    if kind == "ce":
        rows = In("x", (("b", x.shape["b"]), ("c", x.shape["x.c"])))
        return Sum("b", Term(Op.SUB, (LSE("c", rows), g))) if draw(st.booleans()) else \
            Term(Op.SUB, (LSE("c", rows), g))
    wrap = draw(st.sampled_from(["gather", "unary", "binary", "reduce"]))
    if wrap == "unary":
        return Term(Op.TANH, (g,))
    if wrap == "binary":
        return mul(g, In("w", tuple(sorted(g.shape.items()))))
    if wrap == "reduce":
        a = draw(st.sampled_from(sorted(g.shape)))
        return (Max if draw(st.booleans()) else Sum)(a, g)
    return g


# -- spec texts in the language of issue 18 parts 4-6 (reductions over axis sets, the
# -- activation macros and ^, scalar inputs, keepdim outputs), each with an independent
# -- numpy reference written from PyTorch's documented formulas


@dataclass(frozen=True)
class SpecCase:
    """A spec text and what it must compute: `reference(env)` on the inputs by name (in
    float64), shaped like the output array (`Program.out_shape`)."""

    text: str
    reference: Callable[[dict[str, np.ndarray]], np.ndarray]


REDUCTION_NAMES: tuple[str, ...] = (
    "sum", "max", "min", "mean", "var", "logsumexp", "softmax", "layernorm", "rmsnorm")
"""The reductions and normalizations a spec writes as `f(a, b: x)`."""


def numpy_reduction(name: str, x: np.ndarray, axes: tuple[int, ...],
                    eps: float = 1e-5) -> np.ndarray:
    """`name` over the dims `axes` of `x` in numpy, keepdims=True (softmax, layernorm and
    rmsnorm keep the shape anyway)."""
    def total(v: np.ndarray) -> np.ndarray:
        return np.asarray(np.sum(v, axis=axes, keepdims=True))

    def mean(v: np.ndarray) -> np.ndarray:
        return np.asarray(np.mean(v, axis=axes, keepdims=True))

    def var(v: np.ndarray) -> np.ndarray:
        return np.asarray(np.var(v, axis=axes, keepdims=True))

    def top(v: np.ndarray) -> np.ndarray:
        return np.asarray(np.max(v, axis=axes, keepdims=True))

    match name:
        case "sum":
            return total(x)
        case "max":
            return top(x)
        case "min":
            return np.asarray(np.min(x, axis=axes, keepdims=True))
        case "mean":
            return mean(x)
        case "var":
            return var(x)
        case "logsumexp":
            return top(x) + np.log(total(np.exp(x - top(x))))
        case "softmax":
            e = np.exp(x - top(x))
            return np.asarray(e / total(e))
        case "layernorm":
            return np.asarray((x - mean(x)) / np.sqrt(var(x) + eps))
        case "rmsnorm":
            return np.asarray(x / np.sqrt(mean(x * x) + eps))
    raise ValueError(f"unknown reduction {name!r}")


@st.composite
def reduction_specs(draw: st.DrawFn, sizes: Sequence[int] = (1, 2, 3, 5)) -> SpecCase:
    """`out Y[...] = f(a, c: X[...])`: a reduction of `REDUCTION_NAMES` over a random
    non-empty set of a 1-4 dim input's axes (listed in any order), the output keeping a
    size-1 dim where an axis was reduced at random (`out Y[i, 1] = ...`), sometimes an
    eps= argument."""
    rank = draw(st.integers(1, 4))
    names = ["i", "j", "k", "n"][:rank]
    dims = [draw(st.sampled_from(list(sizes))) for _ in names]
    reduced = draw(st.lists(st.sampled_from(names), min_size=1, max_size=rank, unique=True))
    name = draw(st.sampled_from(REDUCTION_NAMES))
    keeps = name in ("softmax", "layernorm", "rmsnorm")
    eps = draw(st.sampled_from([1e-5, 1e-3, 0.5])) if name in ("layernorm", "rmsnorm") else None
    kw = "" if eps is None or eps == 1e-5 else f", eps={eps!r}"
    keepdim = {a: not keeps and draw(st.booleans()) for a in names}
    out = [a if keeps or a not in reduced else "1" for a in names]
    out = [d for a, d in zip(names, out, strict=True) if d != "1" or keepdim[a]]
    params = ", ".join(f"S{a}={n}" for a, n in zip(names, dims, strict=True))
    text = (f"kernel red({params})\n"
            f"in X[{', '.join(f'{a}:S{a}' for a in names)}] f32\n"
            f"out Y[{', '.join(out)}] = {name}({', '.join(reduced)}: X[{', '.join(names)}]{kw})\n")
    axes = tuple(names.index(a) for a in reduced)
    shape = tuple(n if keeps or a not in reduced else 1 for a, n in zip(names, dims, strict=True)
                  if keeps or a not in reduced or keepdim[a])

    def reference(env: dict[str, np.ndarray]) -> np.ndarray:
        got = numpy_reduction(name, env["X"], axes, 1e-5 if eps is None else eps)
        return got.reshape(shape)

    return SpecCase(text, reference)


_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


def _np_softplus(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def _np_elu(x: np.ndarray, alpha: float) -> np.ndarray:
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


ACTIVATIONS: dict[str, tuple[str, Callable[[np.ndarray], np.ndarray]]] = {
    "relu6": ("relu6({x})", lambda x: np.clip(x, 0, 6)),
    "hardtanh": ("hardtanh({x})", lambda x: np.clip(x, -1, 1)),
    "hardtanh_args": ("hardtanh({x}, min_val=-0.5, max_val=2)", lambda x: np.clip(x, -0.5, 2)),
    "clamp": ("clamp({x}, -0.75, 0.5)", lambda x: np.minimum(np.maximum(x, -0.75), 0.5)),
    "clamp_min": ("clamp({x}, min=0.25)", lambda x: np.maximum(x, 0.25)),
    "clamp_max": ("clamp({x}, max=-0.25)", lambda x: np.minimum(x, -0.25)),
    "clamp_crossed": ("clamp({x}, 1, -1)", lambda x: np.full_like(x, -1.0)),  # torch: hi
    "leaky_relu": ("leaky_relu({x})", lambda x: np.where(x >= 0, x, 0.01 * x)),
    "leaky_relu_slope": ("leaky_relu({x}, negative_slope=-0.3)",
                         lambda x: np.where(x >= 0, x, -0.3 * x)),
    "elu": ("elu({x})", lambda x: _np_elu(x, 1.0)),
    "elu_alpha": ("elu({x}, alpha=-0.7)", lambda x: _np_elu(x, -0.7)),
    "selu": ("selu({x})", lambda x: _SELU_SCALE * _np_elu(x, _SELU_ALPHA)),
    "softplus": ("softplus({x})", _np_softplus),
    "softplus_beta": ("softplus({x}, beta=3)", lambda x: _np_softplus(3 * x) / 3),
    "mish": ("mish({x})", lambda x: x * np.tanh(_np_softplus(x))),
    "hardsigmoid": ("hardsigmoid({x})",
                    lambda x: np.where(x <= -3, 0.0, np.where(x >= 3, 1.0, x / 6 + 0.5))),
    "hardswish": ("hardswish({x})",
                  lambda x: np.where(x <= -3, 0.0, np.where(x >= 3, x, x * (x + 3) / 6))),
    "softsign": ("softsign({x})", lambda x: x / (1 + np.abs(x))),
    "logsigmoid": ("logsigmoid({x})", lambda x: -_np_softplus(-x)),
    "silu": ("silu({x})", lambda x: x / (1 + np.exp(-x))),
    "square": ("{x} ^ 2", lambda x: x * x),
    "cube_neg": ("-{x} ^ 3", lambda x: -(x**3)),
    "inverse_square": ("{x} ^ -2", lambda x: 1.0 / (x * x)),
    "power_tower": ("{x} ^ 2 ^ 2", lambda x: x**4),
    "pow_base": ("pow(1.5, {x})", lambda x: 1.5**x),
    "pow_int": ("pow({x}, 5)", lambda x: x**5),
}
"""Activation and operator forms: name -> (the call in a spec, `{x}` the operand; the
numpy reference from PyTorch's documented definition, piecewise where torch's is)."""


@st.composite
def activation_specs(draw: st.DrawFn, sizes: Sequence[int] = (1, 2, 3, 7)) -> SpecCase:
    """`out Y[i, j] = act(X[i, j] * scale) * alpha + Z[j]`: one form of `ACTIVATIONS`,
    its operand scaled by a random power of ten (up to 1e3: overflow safety), sometimes
    times a 0-dim input `alpha` and plus a row `Z[j]` broadcast over i (or a `Z[o:1, j]`
    with a size-1 dim broadcast); the output declared as `Y[i, j]`, `Y[(i, j)]`,
    `Y[i, 1, j]` or `Y[1, (j, i)]` (keepdim and grouped dims)."""
    name = draw(st.sampled_from(sorted(ACTIVATIONS)))
    call, fn = ACTIVATIONS[name]
    m, n = draw(st.sampled_from(list(sizes))), draw(st.sampled_from(list(sizes)))
    scale = draw(st.sampled_from([1.0, 10.0, 100.0, 1000.0]))
    scalar = draw(st.booleans())
    row = draw(st.sampled_from(["none", "row", "size1"]))
    operand = "X[i, j]" if scale == 1.0 else f"(X[i, j] * {scale!r})"
    lines = [f"kernel act(M={m}, N={n})", "in X[i:M, j:N] f32"]
    rhs = call.format(x=operand)
    if scalar:
        lines.append("in alpha[] f32")
        rhs = f"({rhs}) * alpha"
    if row == "row":
        lines.append("in Z[j:N] f32")
        rhs = f"{rhs} + Z[j]"
    elif row == "size1":
        lines.append("in Z[o:1, j:N] f32")
        rhs = f"{rhs} + Z[i, j]"
    layout = draw(st.sampled_from(["i, j", "(i, j)", "i, 1, j", "1, (j, i)"]))
    lines.append(f"out Y[{layout}] = {rhs}")

    def reference(env: dict[str, np.ndarray]) -> np.ndarray:
        with np.errstate(over="ignore"):
            y = fn(env["X"] * scale)
        if scalar:
            y = y * env["alpha"]
        if row != "none":
            y = y + env["Z"].reshape(1, n)
        y = np.asarray(y, np.float64).reshape(m, n)
        return {"i, j": y, "(i, j)": y.reshape(m * n), "i, 1, j": y.reshape(m, 1, n),
                "1, (j, i)": y.T.reshape(1, n * m)}[layout]

    return SpecCase("\n".join(lines) + "\n", reference)


def small_spec(path: str, size: int = 37, max_flops: int = 300_000) -> Program:
    """A spec file at small sizes for tests that run it slowly (an emulator, a CPU stand-in
    for CUDA): parameters of at most 8 become 2, the others `size` (not a multiple of a
    warp or a tile), shrunk until the program's analytic FLOPs are at most `max_flops`
    (a convolution's window sizes multiply). Sizes the spec refuses (a window larger than
    its input) are skipped; the smallest accepted program is returned when none fits."""
    params = load_spec(path).params
    best: Program | None = None
    for s in sorted({size, *(n for n in (23, 13, 7, 5, 3) if n < size)}, reverse=True):
        try:
            prog = load_spec(path, {k: (2 if int(v) <= 8 else s) for k, v in params.items()})
        except ValueError:  # SpecError, or a shape the sizes make impossible
            continue
        best = prog
        if term_flops(prog.term) <= max_flops:
            break
    if best is None:
        raise SpecError(path, 1, 1, "no small size is accepted", "a spec that runs at size 3")
    return best


# -- slices and reshapes (issue 18 part 5) -----------------------------------------------------


def _slice_text(start: int, stop: int, step: int, n: int, name: str | None) -> str:
    """A slice spelled the ways a user may: bounds left out where they are the default."""
    lo = "" if start == 0 else str(start)
    hi = "" if stop == n else str(stop)
    body = f"{lo}:{hi}" if step == 1 else f"{lo}:{hi}:{step}"
    return body if name is None else f"{name}={body}"


@st.composite
def slice_specs(draw: st.DrawFn, sizes: Sequence[int] = (1, 2, 3, 5, 7, 8)) -> SpecCase:
    """A spec that slices a 1-3 dim input along some of its dims (`X[i, 1:6:2]`, named
    `X[i, j=0:3]` or not, bounds left out, steps, a slice of a computed intermediate)
    and combines two slices of equal size elementwise (a split-halves GLU in general),
    sometimes summed over one axis, with a numpy reference (`X[:, 1:6:2]`)."""
    rank = draw(st.integers(1, 3))
    names = ["i", "j", "k"][:rank]
    dims = [draw(st.sampled_from(list(sizes))) for _ in names]
    sliced = draw(st.lists(st.sampled_from(names), min_size=1, max_size=rank, unique=True))
    second = draw(st.booleans())  # two slices per sliced dim, multiplied
    through = draw(st.booleans())  # slice a stored tanh(X), not X
    first_items: list[str] = []
    second_items: list[str] = []
    first_np: list[slice] = []
    second_np: list[slice] = []
    out: list[str] = []
    for a, n in zip(names, dims, strict=True):
        if a not in sliced:
            first_items.append(a)
            second_items.append(a)
            first_np.append(slice(None))
            second_np.append(slice(None))
            out.append(a)
            continue
        step = draw(st.integers(1, 3))
        start = draw(st.integers(0, n - 1))
        length = draw(st.integers(1, len(range(start, n, step))))
        stop = draw(st.integers(start + (length - 1) * step + 1, min(n, start + length * step)))
        start2 = draw(st.integers(0, n - 1 - (length - 1) * step))
        stop2 = start2 + (length - 1) * step + 1
        name = f"{a}s" if through else draw(st.sampled_from([None, f"{a}s"]))
        first_items.append(_slice_text(start, stop, step, n, name))
        second_items.append(_slice_text(start2, stop2, step, n, name))
        first_np.append(slice(start, stop, step))
        second_np.append(slice(start2, stop2, step))
        out.append(name or a)
    params = ", ".join(f"S{a}={n}" for a, n in zip(names, dims, strict=True))
    lines = [f"kernel sliced({params})",
             f"in X[{', '.join(f'{a}:S{a}' for a in names)}] f32"]
    src = "X"
    if through:
        lines.append(f"T[{', '.join(names)}] = tanh(X[{', '.join(names)}])")
        src = "T"
    use = f"{src}[{', '.join(first_items)}]"
    if second:
        use += f" * sigmoid({src}[{', '.join(second_items)}])"
    reduced = draw(st.sampled_from([None, *range(rank)]))  # a sum over one axis, or none
    if reduced is not None:
        use = f"sum({out[reduced]}: {use})"
    lines.append(f"out Y[{', '.join(a for k, a in enumerate(out) if k != reduced)}] = {use}")

    def reference(env: dict[str, np.ndarray]) -> np.ndarray:
        x = np.tanh(env["X"]) if through else env["X"]
        y = x[tuple(first_np)]
        if second:
            y = y / (1 + np.exp(-x[tuple(second_np)]))
        if reduced is not None:
            y = y.sum(axis=reduced)
        return np.asarray(y, np.float64)

    return SpecCase("\n".join(lines) + "\n", reference)


@st.composite
def reshape_specs(draw: st.DrawFn, sizes: Sequence[int] = (1, 2, 3, 5)) -> SpecCase:
    """A spec that views a dim of size A*C as two axes (a, c), outer first: a grouped
    use of a computed intermediate `T[i, (a, c:C)]` (or of an input, declared packed) or
    a grouped input declaration `in X[i:M, (a:A, c:C)]`, the output in a random axis
    order; reference: numpy's reshape and transpose."""
    m, a_, c_ = (draw(st.sampled_from(list(sizes))) for _ in range(3))
    how = draw(st.sampled_from(["intermediate", "input", "declared"]))
    group = draw(st.sampled_from(["(a, c:SC)", "(a:SA, c)", "(a:SA, c:SC)"]))
    order = draw(st.permutations(["i", "a", "c"]))
    lines = [f"kernel reshaped(SM={m}, SA={a_}, SC={c_})"]
    if how == "declared":
        lines.append("in X[i:SM, (a:SA, c:SC)] f32")
        body = "exp(X) * 0.5"
    elif how == "input":
        lines.append("in X[i:SM, j:SA*SC] f32")
        body = f"exp(X[i, {group}]) * 0.5"
    else:
        lines += ["in X[i:SM, j:SA*SC] f32", "T[i, j] = exp(X[i, j])"]
        body = f"T[i, {group}] * 0.5"
    lines.append(f"out Y[{', '.join(order)}] = {body}")

    def reference(env: dict[str, np.ndarray]) -> np.ndarray:
        y = np.exp(env["X"]).reshape(m, a_, c_) * 0.5
        return np.asarray(y.transpose(["iac".index(x) for x in order]), np.float64)

    return SpecCase("\n".join(lines) + "\n", reference)
