"""The function table of the spec language: core elementwise ops and macros.

Every entry builds a term from core ops only. Macros are expansions, not new ops:
`softmax` becomes the numerically stable `exp(x - max x) / sum exp(x - max x)`,
`logsumexp` the stable `max x + log(sum exp(x - max x))` (the `LSE` op is reached
later by rewrite rules, never written by the parser). Hash-consing makes repeated
subterms (the row max, the exponentials) one node each.

>>> from kernelsat.ir import In
>>> x = In("x", (("i", 2), ("n", 8)))
>>> t = REDUCTIONS["softmax"].build(("n",), x, {})
>>> dict(t.shape)
{'i': 2, 'n': 8}
>>> ELEMENTWISE["gelu"].build(x) is ELEMENTWISE["gelu"].build(x)
True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
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


class MacroArgumentError(ValueError):
    """A call whose arguments the function does not accept (a non-positive constant base
    of `pow`, a non-integer exponent). `arg` is the offending argument: its position
    among the call's term arguments, or a keyword's name; the spec parser reports the
    error there."""

    def __init__(self, arg: int | str, what: str, expected: str):
        self.arg, self.what, self.expected = arg, what, expected
        super().__init__(f"{what}; expected {expected}")


@dataclass(frozen=True)
class Elementwise:
    """A function applied at every index: `arity` term arguments, then optional
    `params` (name, default; a `None` default means absent unless given), passed to
    `build` as keyword arguments, each a term or None. A spec gives a parameter
    positionally (any expression) or as `name=number`."""

    arity: int
    build: Callable[..., Term]
    doc: str
    params: tuple[tuple[str, float | None], ...] = ()


def _core(op: Op) -> Elementwise:
    info = OPS[op]
    return Elementwise(info.arity, lambda *args: Term(op, args), info.doc)


MAX_EXPONENT = 1 << 16
"""The largest |k| of `x ^ k` (repeated squaring: about 2 log2 k multiplications)."""


def integer_exponent(k: Term, arg: int | str = 1) -> int | None:
    """The integer an exponent term stands for (a `Const` with an integral value), None
    when it is no constant; `MacroArgumentError` for a non-integer or too large one."""
    if k.op is not Op.CONST:
        return None
    value = float(k.attrs[0])  # type: ignore[arg-type]
    if value != math.floor(value):
        raise MacroArgumentError(arg, f"exponent {value!r} is not an integer",
                                 "an integer exponent (x ^ 0.5: sqrt(x); a real power "
                                 "of a positive base: pow(a, x))")
    if abs(value) > MAX_EXPONENT:
        raise MacroArgumentError(arg, f"exponent {value:.6g} is too large",
                                 f"|k| <= {MAX_EXPONENT}")
    return int(value)


def power(x: Term, k: int) -> Term:
    """`x ^ k` for an integer k: repeated squaring into `mul` (x^13 = x^8 x^4 x, five
    multiplications), `recip` of the positive power for k < 0, the constant 1 for k = 0
    (a constant base folds to a constant).

    >>> from kernelsat.ir import In
    >>> from kernelsat.sexpr import to_sexpr
    >>> to_sexpr(power(In("x", (("i", 2),)), -3))
    '(recip (mul (In x i:2) (mul (In x i:2) (In x i:2))))'
    """
    if x.op is Op.CONST:
        base = float(x.attrs[0])  # type: ignore[arg-type]
        if base == 0.0 and k < 0:
            raise MacroArgumentError(0, f"0 ^ {k} divides by zero", "a non-zero base")
        try:
            return Const(base ** k)
        except (OverflowError, ValueError):
            raise MacroArgumentError(0, f"{base!r} ^ {k} is not a finite number",
                                     "a constant power within float range") from None
    if k == 0:
        return Const(1.0)
    result: Term | None = None
    square = x
    n = abs(k)
    while True:
        if n & 1:
            result = square if result is None else ir.mul(result, square)
        n >>= 1
        if not n:
            break
        square = ir.mul(square, square)
    assert result is not None
    return ir.recip(result) if k < 0 else result


def _pow(a: Term, x: Term) -> Term:
    # a ^ x = exp(x log a), defined for a > 0; an integer constant exponent is `a ^ k`
    if x.op is Op.CONST and float(x.attrs[0]).is_integer():  # type: ignore[arg-type]
        k = integer_exponent(x)
        assert k is not None
        return power(a, k)
    if a.op is Op.CONST:
        base = float(a.attrs[0])  # type: ignore[arg-type]
        if base <= 0.0:
            raise MacroArgumentError(0, f"pow of the non-positive base {base!r}",
                                     "a positive base (pow(a, x) = exp(x log a)); an "
                                     "integer power of any base: x ^ k")
        return ir.exp(ir.mul(x, Const(math.log(base))))
    return ir.exp(ir.mul(x, ir.log(a)))


def _clamp(x: Term, min: Term | None = None, max: Term | None = None) -> Term:
    # torch.clamp: min(max(x, lo), hi); lo > hi gives hi everywhere, as in PyTorch
    if min is None and max is None:
        raise MacroArgumentError("min", "clamp without a bound", "clamp(x, lo, hi), "
                                 "clamp(x, min=lo) or clamp(x, max=hi)")
    out = x if min is None else ir.max_(x, min)
    return out if max is None else ir.min_(out, max)


def _hardtanh(x: Term, min_val: Term, max_val: Term) -> Term:
    return ir.min_(ir.max_(x, min_val), max_val)


def _relu6(x: Term) -> Term:
    return ir.min_(ir.relu(x), Const(6.0))


def _times(c: Term, x: Term) -> Term:
    """`c * x`, just `x` for the constant 1 (a default parameter)."""
    return x if c.op is Op.CONST and float(c.attrs[0]) == 1.0 else ir.mul(c, x)  # type: ignore[arg-type]


def _leaky_relu(x: Term, negative_slope: Term) -> Term:
    # max(x, 0) + slope * min(x, 0): exact at every x, any slope (PyTorch's definition)
    return ir.add(ir.relu(x), _times(negative_slope, ir.min_(x, Const(0.0))))


def _expm1(z: Term) -> Term:
    """e^z - 1 as 2 tanh(z/2) / (1 - tanh(z/2)) (equal over the reals): accurate relative
    to the result near z = 0, where exp(z) - 1 cancels (PyTorch uses expm1); for z <= 0
    the divisor is in [1, 2) and the result in (-1, 0], exactly 0 at z = 0."""
    t = ir.tanh(ir.mul(Const(0.5), z))
    return ir.div(ir.mul(Const(2.0), t), ir.sub(Const(1.0), t))


def _elu(x: Term, alpha: Term) -> Term:
    # x for x > 0, alpha (e^x - 1) otherwise (PyTorch's definition, any alpha) equals
    # relu(x) + alpha expm1(min(x, 0)): nothing overflows, and the second term is exactly 0
    # for x >= 0
    return ir.add(ir.relu(x), _times(alpha, _expm1(ir.min_(x, Const(0.0)))))


SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
"""The constants of SELU (Klambauer et al. 2017; PyTorch's `torch.nn.SELU`)."""


def _selu(x: Term) -> Term:
    return ir.mul(Const(SELU_SCALE), _elu(x, Const(SELU_ALPHA)))


def _softplus(x: Term, beta: Term) -> Term:
    # log(1 + e^(beta x)) / beta, the op being the stable max(z, 0) + log1p(e^-|z|)
    if beta.op is Op.CONST and float(beta.attrs[0]) == 1.0:  # type: ignore[arg-type]
        return _softplus_op(x)
    return ir.div(_softplus_op(ir.mul(beta, x)), beta)


def _softplus_op(x: Term) -> Term:
    return Term(Op.SOFTPLUS, (x,))


def _mish(x: Term) -> Term:
    return ir.mul(x, ir.tanh(_softplus_op(x)))


def _hardsigmoid(x: Term) -> Term:
    # relu6(x + 3) / 6, PyTorch's formula
    return ir.div(_relu6(ir.add(x, Const(3.0))), Const(6.0))


def _hardswish(x: Term) -> Term:
    # x * relu6(x + 3) / 6
    return ir.div(ir.mul(x, _relu6(ir.add(x, Const(3.0)))), Const(6.0))


def _softsign(x: Term) -> Term:
    return ir.div(x, ir.add(Const(1.0), ir.abs_(x)))


def _logsigmoid(x: Term) -> Term:
    # log(sigmoid(x)) = -softplus(-x): no overflow, no log of an underflowed 0
    return ir.neg(_softplus_op(ir.neg(x)))


ELEMENTWISE: dict[str, Elementwise] = {
    **{op.value: _core(op) for op in OPS if op in ops.ELEMENTWISE and OPS[op].infix is None},
    "silu": Elementwise(1, _silu, "x * sigmoid(x)"),
    "gelu": Elementwise(1, _gelu, "0.5 x (1 + erf(x / sqrt 2)), exact (PyTorch default)"),
    "gelu_tanh": Elementwise(1, _gelu_tanh, "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))"),
    # -- operators and activation macros (issue 18 part 6) --
    "pow": Elementwise(2, _pow, "pow(a, x) = exp(x log a) for a > 0; x ^ k for an integer "
                       "constant k"),
    "clamp": Elementwise(1, _clamp, "min(max(x, min), max); either bound may be left out",
                         (("min", None), ("max", None))),
    "hardtanh": Elementwise(1, _hardtanh, "min(max(x, min_val), max_val)",
                            (("min_val", -1.0), ("max_val", 1.0))),
    "relu6": Elementwise(1, _relu6, "min(max(x, 0), 6)"),
    "leaky_relu": Elementwise(1, _leaky_relu, "max(x, 0) + negative_slope * min(x, 0)",
                              (("negative_slope", 0.01),)),
    "elu": Elementwise(1, _elu, "max(x, 0) + alpha expm1(min(x, 0))", (("alpha", 1.0),)),
    "selu": Elementwise(1, _selu, "scale * elu(x, alpha), PyTorch's constants"),
    "softplus": Elementwise(1, _softplus, "log(1 + e^(beta x)) / beta, stable",
                            (("beta", 1.0),)),
    "mish": Elementwise(1, _mish, "x * tanh(softplus(x))"),
    "hardsigmoid": Elementwise(1, _hardsigmoid, "relu6(x + 3) / 6"),
    "hardswish": Elementwise(1, _hardswish, "x * relu6(x + 3) / 6"),
    "softsign": Elementwise(1, _softsign, "x / (1 + |x|)"),
    "logsigmoid": Elementwise(1, _logsigmoid, "-softplus(-x), stable"),
}
"""Functions of the form `f(x)` / `f(x, y)`, by spec name: every elementwise op of the
op table not written as an operator (under its s-expression name), then the macros."""


# -- reductions and normalizations over a set of axes ---------------------------------
# `f(b, h, w: x)` nests one-axis core reductions, the last axis innermost:
# sum(b, h: x) = Sum(b, Sum(h, x)); mean divides by the product of the sizes, and var,
# layernorm and rmsnorm use that mean (batch norm over (b, h, w), group norm ...).

Axes = tuple[str, ...]


def _sum(axes: Axes, x: Term) -> Term:
    for a in reversed(axes):
        x = ir.Sum(a, x)
    return x


def _max(axes: Axes, x: Term) -> Term:
    for a in reversed(axes):
        x = ir.Max(a, x)
    return x


def _count(axes: Axes, x: Term) -> Term:
    return Const(float(math.prod(x.shape[a] for a in axes)))


def _mean(axes: Axes, x: Term) -> Term:
    return ir.div(_sum(axes, x), _count(axes, x))


def _centered(axes: Axes, x: Term) -> Term:
    return ir.sub(x, _mean(axes, x))


def _var(axes: Axes, x: Term) -> Term:
    # biased (population) variance, as layer norm uses it
    d = _centered(axes, x)
    return _mean(axes, ir.mul(d, d))


def _softmax(axes: Axes, x: Term, kw: Mapping[str, float]) -> Term:
    e = ir.exp(ir.sub(x, _max(axes, x)))
    return ir.div(e, _sum(axes, e))


def _logsumexp(axes: Axes, x: Term, kw: Mapping[str, float]) -> Term:
    m = _max(axes, x)
    return ir.add(m, ir.log(_sum(axes, ir.exp(ir.sub(x, m)))))


def _layernorm(axes: Axes, x: Term, kw: Mapping[str, float]) -> Term:
    return ir.div(_centered(axes, x), ir.sqrt(ir.add(_var(axes, x), Const(kw["eps"]))))


def _rmsnorm(axes: Axes, x: Term, kw: Mapping[str, float]) -> Term:
    return ir.div(x, ir.sqrt(ir.add(_mean(axes, ir.mul(x, x)), Const(kw["eps"]))))


def _min(axes: Axes, x: Term, kw: Mapping[str, float]) -> Term:
    # min x = -max(-x)
    return ir.neg(_max(axes, ir.neg(x)))


@dataclass(frozen=True)
class Reduction:
    """A function of the form `f(a, b: x, kw=value ...)` over one or more distinct axes
    of `x`; `kwargs` holds the defaults."""

    build: Callable[[Axes, Term, Mapping[str, float]], Term]
    keeps_axis: bool
    doc: str
    kwargs: Mapping[str, float] = field(default_factory=dict)


REDUCTIONS: dict[str, Reduction] = {
    "sum": Reduction(lambda a, x, kw: _sum(a, x), False, "sum over the axes"),
    "max": Reduction(lambda a, x, kw: _max(a, x), False, "maximum over the axes"),
    "min": Reduction(_min, False, "minimum over the axes, as -max(-x)"),
    "mean": Reduction(lambda a, x, kw: _mean(a, x), False, "sum / (product of the sizes)"),
    "var": Reduction(lambda a, x, kw: _var(a, x), False, "biased variance: mean((x - mean)^2)"),
    "logsumexp": Reduction(_logsumexp, False, "max + log(sum(exp(x - max))), stable"),
    "softmax": Reduction(_softmax, True, "exp(x - max) / sum(exp(x - max)), stable"),
    "layernorm": Reduction(
        _layernorm, True, "(x - mean) / sqrt(var + eps), no affine", {"eps": 1e-5}
    ),
    "rmsnorm": Reduction(_rmsnorm, True, "x / sqrt(mean(x^2) + eps), no affine", {"eps": 1e-5}),
}
"""Functions of the form `f(axes: x)`, by spec name. `keeps_axis`: the result still has
the axes."""


# -- concatenation along a new axis ----------------------------------------------------

CAT = "cat"
"""`cat(j: A, B, ...)`: the operands one after the other along the new axis j."""


def concat(axis: str, parts: Sequence[Term]) -> Term:
    """`cat(j: A[b, a], B[b, c])`: each operand has the same axes but one of its own (a,
    c), laid end to end along the new axis `axis` (size the sum of theirs): a `where` over
    the index of `axis` choosing between reads of the operands shifted to their offsets
    (padded with 0 where they do not reach; the where never selects it there). An operand
    that is not an input is stored first (a read takes an input or a stored value).

    >>> from kernelsat.ir import In
    >>> t = concat("j", [In("x", (("a", 2),)), In("y", (("c", 3),))])
    >>> dict(t.shape)
    {'j': 5}
    """
    if len(parts) < 2:
        raise MacroArgumentError(0, "cat of one operand", "two or more operands")
    common = set.intersection(*(set(p.shape) for p in parts))
    own: list[str] = []
    for k, p in enumerate(parts):
        rest = sorted(set(p.shape) - common)
        if len(rest) != 1:
            raise MacroArgumentError(
                k, f"cat's operand {k + 1} has {len(rest)} axes the others lack "
                f"({', '.join(rest) or 'none'})",
                "operands with the same axes but one each, the one laid along the new axis")
        if axis in p.shape:
            raise MacroArgumentError(k, f"cat's operand {k + 1} already has the axis {axis!r}",
                                     "a new axis name for the concatenation")
        own.append(rest[0])
    sizes = [p.shape[a] for p, a in zip(parts, own, strict=True)]
    total = sum(sizes)
    out_sizes = {a: parts[0].shape[a] for a in common} | {axis: total}
    offsets = [sum(sizes[:k]) for k in range(len(parts))]
    reads = []
    for p, a, off in zip(parts, own, offsets, strict=True):
        src = p if p.op in (Op.IN, Op.STORE) else ir.Store(p)
        forms = {c: ({c: 1}, 0) for c in common} | {a: ({axis: 1}, -off)}
        reads.append(ir.Read(src, forms, out_sizes, pad=0.0))
    index = ir.Idx(axis, total)
    result = reads[-1]
    for read, end in zip(reversed(reads[:-1]), reversed(offsets[1:]), strict=True):
        result = ir.where(ir.lt(index, Const(float(end))), read, result)
    return result


FUNCTION_NAMES: frozenset[str] = frozenset(ELEMENTWISE) | frozenset(REDUCTIONS) | {CAT}
"""Every name callable in a spec."""
