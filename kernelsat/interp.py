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


def _softmax_avg(node: Term, args: list[Tensor], dtype: np.dtype) -> Tensor:
    s, v = args
    axes = _union(s, v)
    full = {
        **dict(zip(s.axes, s.array.shape, strict=True)),
        **dict(zip(v.axes, v.array.shape, strict=True)),
    }
    k = axes.index(node.axis)
    sa = s.to(axes)
    w = np.exp(sa - np.max(sa, axis=k, keepdims=True))
    w = w / np.sum(w, axis=k, keepdims=True)
    wv = np.broadcast_to(w * v.to(axes), [full[a] for a in axes])
    out_axes = tuple(a for a in axes if a != node.axis)
    return Tensor(np.asarray(np.sum(wv, axis=k), dtype=dtype), out_axes)


def _dot(node: Term, args: list[Tensor], dtype: np.dtype) -> Tensor:
    x, y = args
    axes = _union(x, y)
    letters = {
        a: chr(ord("a") + i) if i < 26 else chr(ord("A") + i - 26) for i, a in enumerate(axes)
    }
    out_axes = tuple(a for a in axes if a != node.axis)
    if node.axis not in x.axes or node.axis not in y.axes:
        # the axis lives on one side only: sum that side first, then multiply
        prod = np.multiply(x.to(axes), y.to(axes))
        k = axes.index(node.axis)
        return Tensor(np.asarray(np.sum(prod, axis=k), dtype=dtype), out_axes)
    spec = (
        "".join(letters[a] for a in x.axes)
        + ","
        + "".join(letters[a] for a in y.axes)
        + "->"
        + "".join(letters[a] for a in out_axes)
    )
    return Tensor(
        np.asarray(np.einsum(spec, x.array, y.array, optimize=True), dtype=dtype), out_axes
    )


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


def evaluate(
    root: Term, env: Mapping[str, np.ndarray], dtype: type | np.dtype = np.float64
) -> Tensor:
    """Evaluate `root` on input arrays (by input name) in `dtype` (float64: the oracle)."""
    dt = np.dtype(dtype)
    values: dict[int, Tensor] = {}
    contracted = _contracted_products(root)
    with np.errstate(all="ignore"):
        for node in postorder(root):
            if id(node) in contracted:
                continue  # evaluated by its Sum as one contraction, never materialized
            if not node.args:
                values[id(node)] = _leaf(node, env, dt)
            elif node.op is Op.SUM and id(node.args[0]) in contracted:
                x, y = node.args[0].args
                out = _dot(node, [values[id(x)], values[id(y)]], dt)
                values[id(node)] = Tensor(np.asarray(out.array, dtype=dt), out.axes)
            else:
                out = EVAL[node.op](node, [values[id(c)] for c in node.args], dt)
                values[id(node)] = Tensor(np.asarray(out.array, dtype=dt), out.axes)
    return values[id(root)]


def _contracted_products(root: Term) -> set[int]:
    """`mul` nodes whose only use is a `Sum`: `Sum_a(x * y)` is evaluated as one einsum
    contraction (the same value, without materializing the product, which for attention's
    `sum(n: P * V)` would be a 4 GiB array)."""
    uses: dict[int, int] = {}
    for node in postorder(root):
        for child in node.args:
            uses[id(child)] = uses.get(id(child), 0) + 1
    return {
        id(node.args[0])
        for node in postorder(root)
        if node.op is Op.SUM and node.args[0].op is Op.MUL and uses[id(node.args[0])] == 1
        and node.args[0] is not root
    }


def evaluate_as(
    root: Term,
    env: Mapping[str, np.ndarray],
    axes: tuple[str, ...] | None = None,
    dtype: type | np.dtype = np.float64,
) -> np.ndarray:
    """Evaluate and return a dense array with dimensions in `axes` order (default: sorted)."""
    order = tuple(axes) if axes is not None else tuple(root.shape)
    return evaluate(root, env, dtype).dense(order, root.shape)
