"""The function table of the spec language: core elementwise ops and macros.

Every entry builds a term from core ops only. Macros are expansions, not new ops:
`softmax` becomes the numerically stable `exp(x - max x) / sum exp(x - max x)`,
`logsumexp` the stable `max x + log(sum exp(x - max x))` (the `LSE` op is reached
later by rewrite rules, never written by the parser). Hash-consing makes repeated
subterms (the row max, the exponentials) one node each.

>>> from kernelsat.ir import In
>>> x = In("x", (("i", 2), ("n", 8)))
>>> t = REDUCTIONS["softmax"].build("n", x, {})
>>> dict(t.shape)
{'i': 2, 'n': 8}
>>> ELEMENTWISE["gelu"].build(x) is ELEMENTWISE["gelu"].build(x)
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from kernelsat import ir, ops
from kernelsat.ir import Const, Term
from kernelsat.ops import OPS, Op

# -- elementwise functions and macros -------------------------------------------


def _silu(x: Term) -> Term:
    # x * sigmoid(x)
    return ir.mul(x, ir.sigmoid(x))


def _gelu(x: Term) -> Term:
    # 0.5 * x * (1 + erf(x / sqrt 2)), PyTorch's default (approximate="none")
    scaled = ir.mul(x, Const(math.sqrt(0.5)))
    return ir.mul(ir.mul(Const(0.5), x), ir.add(Const(1.0), ir.erf(scaled)))


def _gelu_tanh(x: Term) -> Term:
    # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))), PyTorch's approximate="tanh"
    cube = ir.mul(ir.mul(x, x), x)
    inner = ir.mul(Const(math.sqrt(2.0 / math.pi)), ir.add(x, ir.mul(Const(0.044715), cube)))
    return ir.mul(ir.mul(Const(0.5), x), ir.add(Const(1.0), ir.tanh(inner)))


@dataclass(frozen=True)
class Elementwise:
    """A function applied at every index: `arity` term arguments, no axis."""

    arity: int
    build: Callable[..., Term]
    doc: str


def _core(op: Op) -> Elementwise:
    info = OPS[op]
    return Elementwise(info.arity, lambda *args: Term(op, args), info.doc)


ELEMENTWISE: dict[str, Elementwise] = {
    **{op.value: _core(op) for op in OPS if op in ops.ELEMENTWISE and OPS[op].infix is None},
    "silu": Elementwise(1, _silu, "x * sigmoid(x)"),
    "gelu": Elementwise(1, _gelu, "0.5 x (1 + erf(x / sqrt 2)), exact (PyTorch default)"),
    "gelu_tanh": Elementwise(1, _gelu_tanh, "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))"),
}
"""Functions of the form `f(x)` / `f(x, y)`, by spec name: every elementwise op of the
op table not written as an operator (under its s-expression name), then the macros."""


# -- reductions and normalizations over one axis ----------------------------------


def _size(axis: str, x: Term) -> Term:
    return Const(float(x.shape[axis]))


def _mean(axis: str, x: Term) -> Term:
    return ir.div(ir.Sum(axis, x), _size(axis, x))


def _centered(axis: str, x: Term) -> Term:
    return ir.sub(x, _mean(axis, x))


def _var(axis: str, x: Term) -> Term:
    # biased (population) variance, as layer norm uses it
    d = _centered(axis, x)
    return _mean(axis, ir.mul(d, d))


def _softmax(axis: str, x: Term, kw: Mapping[str, float]) -> Term:
    e = ir.exp(ir.sub(x, ir.Max(axis, x)))
    return ir.div(e, ir.Sum(axis, e))


def _logsumexp(axis: str, x: Term, kw: Mapping[str, float]) -> Term:
    m = ir.Max(axis, x)
    return ir.add(m, ir.log(ir.Sum(axis, ir.exp(ir.sub(x, m)))))


def _layernorm(axis: str, x: Term, kw: Mapping[str, float]) -> Term:
    return ir.div(_centered(axis, x), ir.sqrt(ir.add(_var(axis, x), Const(kw["eps"]))))


def _rmsnorm(axis: str, x: Term, kw: Mapping[str, float]) -> Term:
    return ir.div(x, ir.sqrt(ir.add(_mean(axis, ir.mul(x, x)), Const(kw["eps"]))))


def _min(axis: str, x: Term, kw: Mapping[str, float]) -> Term:
    # min_a x = -max_a(-x)
    return ir.neg(ir.Max(axis, ir.neg(x)))


@dataclass(frozen=True)
class Reduction:
    """A function of the form `f(axis: x, kw=value ...)`; `kwargs` holds the defaults."""

    build: Callable[[str, Term, Mapping[str, float]], Term]
    keeps_axis: bool
    doc: str
    kwargs: Mapping[str, float] = field(default_factory=dict)


REDUCTIONS: dict[str, Reduction] = {
    "sum": Reduction(lambda a, x, kw: ir.Sum(a, x), False, "sum over the axis"),
    "max": Reduction(lambda a, x, kw: ir.Max(a, x), False, "maximum over the axis"),
    "min": Reduction(_min, False, "minimum over the axis, as -max(-x)"),
    "mean": Reduction(lambda a, x, kw: _mean(a, x), False, "sum / size"),
    "var": Reduction(lambda a, x, kw: _var(a, x), False, "biased variance: mean((x - mean)^2)"),
    "logsumexp": Reduction(_logsumexp, False, "max + log(sum(exp(x - max))), stable"),
    "softmax": Reduction(_softmax, True, "exp(x - max) / sum(exp(x - max)), stable"),
    "layernorm": Reduction(
        _layernorm, True, "(x - mean) / sqrt(var + eps), no affine", {"eps": 1e-5}
    ),
    "rmsnorm": Reduction(_rmsnorm, True, "x / sqrt(mean(x^2) + eps), no affine", {"eps": 1e-5}),
}
"""Functions of the form `f(axis: x)`, by spec name. `keeps_axis`: the result still has it."""


FUNCTION_NAMES: frozenset[str] = frozenset(ELEMENTWISE) | frozenset(REDUCTIONS)
"""Every name callable in a spec."""
