"""The reference interpreter: the living semantics of the IR.

One table maps each op to its numpy semantics. A value is a `Tensor`: an array
and the axis name of each of its dimensions. Evaluated in float64 it is the oracle
every rewrite and every renderer is tested against.

>>> import numpy as np
>>> from kernelsat.ir import In, Sum, mul
>>> x = In("x", (("i", 3),))
>>> evaluate(Sum("i", mul(x, x)), {"x": np.array([1.0, 2.0, 3.0])}).array
array(14.)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from kernelsat.ir import Term, in_groups, input_dims, postorder
from kernelsat.ops import Op


@dataclass(frozen=True, slots=True)
class Tensor:
    """An array whose dimensions carry axis names."""

    array: np.ndarray
    axes: tuple[str, ...]

    def to(self, axes: tuple[str, ...]) -> np.ndarray:
        """The array with its dimensions in the order `axes` (size-1 for absent ones)."""
        return align_axes(self.array, self.axes, axes)

    def dense(self, axes: tuple[str, ...], shape: Mapping[str, int]) -> np.ndarray:
        """The array in the order `axes`, broadcast to full sizes (a copy)."""
        # np.array, not np.ascontiguousarray: the latter turns a 0-d result into shape (1,)
        return np.array(np.broadcast_to(self.to(axes), [shape[a] for a in axes]), order="C")


def align_axes(array: np.ndarray, have: tuple[str, ...], want: tuple[str, ...]) -> np.ndarray:
    """`array`, whose dimensions are the axes `have`, with its dimensions in the order
    `want` (size 1 for the axes it lacks): broadcasting by name."""
    missing = [a for a in want if a not in have]
    arr = array.reshape(array.shape + (1,) * len(missing))
    order = (*have, *missing)
    return np.transpose(arr, [order.index(a) for a in want])


def _union(*ts: Tensor) -> tuple[str, ...]:
    out: list[str] = []
    for t in ts:
        out.extend(a for a in t.axes if a not in out)
    return tuple(out)


def _reduce_axis(t: Tensor, axis: str) -> tuple[tuple[str, ...], int]:
    return tuple(a for a in t.axes if a != axis), t.axes.index(axis)


def _lse(arr: np.ndarray, k: int) -> np.ndarray:
    m = np.max(arr, axis=k, keepdims=True)
    return np.squeeze(m, k) + np.log(np.sum(np.exp(arr - m), axis=k))


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf

        return np.asarray(erf(x), dtype=x.dtype)
    except ImportError:  # pragma: no cover
        return np.vectorize(math.erf, otypes=[x.dtype])(x)


UNARY_FN: dict[Op, Callable[[np.ndarray], np.ndarray]] = {
    Op.NEG: np.negative,
    Op.EXP: np.exp,
    Op.LOG: np.log,
    Op.SQRT: np.sqrt,
    Op.RECIP: np.reciprocal,
    Op.TANH: np.tanh,
    Op.ERF: _erf,
    Op.SIGMOID: lambda x: 1.0 / (1.0 + np.exp(-x)),
    Op.RELU: lambda x: np.maximum(x, 0),
    Op.ABS: np.abs,
}
"""Numpy semantics of each unary elementwise op."""

BINARY_FN: dict[Op, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    Op.ADD: np.add,
    Op.SUB: np.subtract,
    Op.MUL: np.multiply,
    Op.DIV: np.divide,
    Op.MAX: np.maximum,
    Op.MIN: np.minimum,
}
"""Numpy semantics of each binary elementwise op."""


def _unary(node: Term, args: list[Tensor], dtype: np.dtype) -> Tensor:
    return Tensor(UNARY_FN[node.op](args[0].array), args[0].axes)


def _binary(node: Term, args: list[Tensor], dtype: np.dtype) -> Tensor:
    axes = _union(*args)
    return Tensor(BINARY_FN[node.op](args[0].to(axes), args[1].to(axes)), axes)


def _reduction(fn: Callable[..., np.ndarray]) -> Callable[[Term, list[Tensor], np.dtype], Tensor]:
    def run(node: Term, args: list[Tensor], dtype: np.dtype) -> Tensor:
        axes, k = _reduce_axis(args[0], node.axis)
        return Tensor(np.asarray(fn(args[0].array, k), dtype=dtype), axes)

    return run


def _einsum_letters(axes: tuple[str, ...]) -> dict[str, str] | None:
    """One einsum subscript letter per axis (None past the 52 letters einsum has)."""
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return None if len(axes) > len(letters) else dict(zip(axes, letters, strict=False))


def contract(axis: str, factors: list[Tensor], dtype: np.dtype) -> Tensor:
    """`Sum_axis(f1 * f2 * ...)` by one einsum (pairwise, in the order numpy finds best),
    never materializing the product over every axis: the same value as multiplying then
    summing, within float rounding."""
    axes = _union(*factors)
    out_axes = tuple(a for a in axes if a != axis)
    letters = _einsum_letters(axes)
    if letters is None:  # beyond einsum's alphabet: multiply, then sum
        prod = factors[0].to(axes)
        for f in factors[1:]:
            prod = np.multiply(prod, f.to(axes))
        prod = np.broadcast_to(prod, [_sizes(factors)[a] for a in axes])
        return Tensor(np.asarray(np.sum(prod, axis=axes.index(axis)), dtype=dtype), out_axes)
    spec = ",".join("".join(letters[a] for a in f.axes) for f in factors)
    spec += "->" + "".join(letters[a] for a in out_axes)
    out = np.einsum(spec, *(f.array for f in factors), optimize=True)
    return Tensor(np.asarray(out, dtype=dtype), out_axes)


def _sizes(ts: list[Tensor]) -> dict[str, int]:
    return {a: n for t in ts for a, n in zip(t.axes, t.array.shape, strict=True)}


def _softmax_avg(node: Term, args: list[Tensor], dtype: np.dtype) -> Tensor:
    # sum_n softmax_n(s) * v: normalize the weights over n, then contract them with v
    s, v = args
    k = s.axes.index(node.axis)
    w = np.exp(s.array - np.max(s.array, axis=k, keepdims=True))
    w /= np.sum(w, axis=k, keepdims=True)
    return contract(node.axis, [Tensor(w, s.axes), v], dtype)


def _dot(node: Term, args: list[Tensor], dtype: np.dtype) -> Tensor:
    return contract(node.axis, list(args), dtype)


def _split(node: Term, args: list[Tensor], dtype: np.dtype) -> Tensor:
    from kernelsat.ir import split_axes

    (x,) = args
    axis, factor = node.axis, int(node.attrs[1])  # type: ignore[arg-type]
    k = x.axes.index(axis)
    shape = list(x.array.shape)
    new_shape = [*shape[:k], shape[k] // factor, factor, *shape[k + 1 :]]
    outer, inner = split_axes(axis, factor)
    return Tensor(x.array.reshape(new_shape), (*x.axes[:k], outer, inner, *x.axes[k + 1 :]))


EVAL: dict[Op, Callable[[Term, list[Tensor], np.dtype], Tensor]] = {
    **{op: _unary for op in UNARY_FN},
    **{op: _binary for op in BINARY_FN},
    Op.SUM: _reduction(np.sum),
    Op.RMAX: _reduction(np.max),
    Op.LSE: _reduction(_lse),
    Op.SOFTMAXAVG: _softmax_avg,
    Op.DOT: _dot,
    Op.SPLIT: _split,
    Op.STORE: lambda node, args, dtype: args[0],
}
"""The semantics of every op with children (`In` and `Const` are read from the environment)."""


def _leaf(node: Term, env: Mapping[str, np.ndarray], dtype: np.dtype) -> Tensor:
    if node.op is Op.CONST:
        return Tensor(np.asarray(node.attrs[0], dtype=dtype), ())
    name = str(node.attrs[0])
    if name not in env:
        raise KeyError(f"no value for input {name!r}")
    arr = np.asarray(env[name], dtype=dtype)
    dims = input_dims(node)
    if arr.shape != dims:
        raise ValueError(f"input {name!r} has shape {arr.shape}, expected {dims}")
    groups = in_groups(node)
    axes = tuple(a for dim in groups for a, _ in dim)
    sizes = tuple(s for dim in groups for _, s in dim)
    return Tensor(arr.reshape(sizes), axes)


@dataclass(frozen=True)
class Plan:
    """How `evaluate` computes a term: the nodes it materializes, in order, and for each
    contraction (a `Sum` of a product, `Dot`, `SoftmaxAvg`) the factors it reads; single-use
    `mul` nodes under a `Sum` are never built. `uses` counts, per materialized node, the
    reads still to come, so each value is dropped after its last use."""

    order: tuple[Term, ...]
    inputs: dict[Term, tuple[Term, ...]]
    uses: dict[Term, int]


def _factors(node: Term, users: Mapping[Term, int], root: Term) -> tuple[Term, ...]:
    """The factors of the product tree under a `Sum`: single-use `mul` nodes are opened."""
    out: list[Term] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if n.op is Op.MUL and users[n] == 1 and n is not root:
            stack.extend(reversed(n.args))
        else:
            out.append(n)
    return tuple(out)


def plan(root: Term) -> Plan:
    """The evaluation plan of `root` (see `Plan`)."""
    users: dict[Term, int] = {}
    for node in postorder(root):
        for child in node.args:
            users[child] = users.get(child, 0) + 1
    inputs: dict[Term, tuple[Term, ...]] = {}
    needed = {root}
    for node in reversed(list(postorder(root))):  # parents first: find what is built
        if node not in needed:
            continue
        if node.op is Op.SUM and node.args[0].op is Op.MUL and users[node.args[0]] == 1:
            inputs[node] = _factors(node.args[0], users, root)
        else:
            inputs[node] = node.args
        needed.update(inputs[node])
    order = tuple(n for n in postorder(root) if n in needed)
    uses: dict[Term, int] = {n: 0 for n in order}
    for n in order:
        for c in inputs[n]:
            uses[c] += 1
    return Plan(order, inputs, uses)


def evaluate(
    root: Term, env: Mapping[str, np.ndarray], dtype: type | np.dtype = np.float64
) -> Tensor:
    """Evaluate `root` on input arrays (by input name) in `dtype` (float64: the oracle).
    Products under a `Sum` are contracted (`contract`), and each value is dropped after
    its last use, so memory stays near `peak_elements(root)`."""
    dt = np.dtype(dtype)
    p = plan(root)
    values: dict[Term, Tensor] = {}
    left = dict(p.uses)
    with np.errstate(all="ignore"):
        for node in p.order:
            args = [values[c] for c in p.inputs[node]]
            if not node.args:
                out = _leaf(node, env, dt)
            elif node.op is Op.SUM and p.inputs[node] != node.args:
                out = contract(node.axis, args, dt)
            else:
                out = EVAL[node.op](node, args, dt)
            values[node] = Tensor(np.asarray(out.array, dtype=dt), out.axes)
            for c in p.inputs[node]:
                left[c] -= 1
                if left[c] == 0 and c is not root:
                    del values[c]
    return values[root]


def _extra_elements(node: Term, inputs: tuple[Term, ...]) -> int:
    """Temporaries beyond the result while evaluating `node` (an upper estimate)."""
    if node.op is Op.LSE or node.op is Op.SOFTMAXAVG:
        return 2 * inputs[0].size() + sum(c.size() for c in inputs[1:])
    if node.op in (Op.SUM, Op.DOT) and len(inputs) > 1:
        return sum(c.size() for c in inputs)  # einsum may copy its operands once
    return 0


def peak_elements(root: Term) -> int:
    """An upper estimate of the elements `evaluate(root, ...)` holds at once, besides the
    input arrays themselves: results still to be read, plus each step's temporaries.

    >>> from kernelsat.ir import In, Sum, mul
    >>> a, b = In("a", (("i", 100), ("k", 100))), In("b", (("k", 100), ("j", 100)))
    >>> peak_elements(Sum("k", mul(a, b))) < 100 * 100 * 100
    True
    """
    p = plan(root)
    left = dict(p.uses)
    live = peak = 0
    for node in p.order:
        own = 0 if node.op in (Op.IN, Op.CONST) else node.size()
        peak = max(peak, live + own + _extra_elements(node, p.inputs[node]))
        live += own
        for c in p.inputs[node]:
            left[c] -= 1
            if left[c] == 0 and c is not root and c.op not in (Op.IN, Op.CONST):
                live -= c.size()
    return peak


def evaluate_as(
    root: Term,
    env: Mapping[str, np.ndarray],
    axes: tuple[str, ...] | None = None,
    dtype: type | np.dtype = np.float64,
) -> np.ndarray:
    """Evaluate and return a dense array with dimensions in `axes` order (default: sorted)."""
    order = tuple(axes) if axes is not None else tuple(root.shape)
    return evaluate(root, env, dtype).dense(order, root.shape)
