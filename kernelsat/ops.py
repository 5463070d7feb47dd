"""The op table: the spine of the IR.

Every op is declared once here, beside named property sets. Shape inference,
the interpreter, the renderers, the SMT encoding and the policy features all
read these tables; no other module keeps its own list of "binary ops".

Semantics are over the reals: a tensor is a function from an index assignment
(axis name -> integer in [0, size)) to a real number.
"""

from __future__ import annotations

from enum import StrEnum


class Op(StrEnum):
    """Every IR op. The value is the op's head in the s-expression syntax."""

    IN = "In"  # an input tensor, its dims bound to named axes
    CONST = "Const"  # a real scalar
    # unary elementwise
    NEG = "neg"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RECIP = "recip"
    TANH = "tanh"
    ERF = "erf"
    SIGMOID = "sigmoid"
    RELU = "relu"
    ABS = "abs"
    # binary elementwise (broadcast by axis name)
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    MAX = "max"
    MIN = "min"
    # reductions over one named axis
    SUM = "Sum"  # sum_a x
    RMAX = "Max"  # max_a x
    LSE = "LSE"  # log sum_a exp(x)
    SOFTMAXAVG = "SoftmaxAvg"  # sum_a softmax_a(s) * v
    DOT = "Dot"  # sum_a x * y
    # layout and materialization
    SPLIT = "Split"  # x[a = o*f + i], a -> (a/o<f>, a/i<f>)
    STORE = "Store"  # materialize in memory: a kernel boundary; identity semantics


UNARY: frozenset[Op] = frozenset(
    {Op.NEG, Op.EXP, Op.LOG, Op.SQRT, Op.RECIP, Op.TANH, Op.ERF, Op.SIGMOID, Op.RELU, Op.ABS}
)
"""Elementwise ops of one operand: the shape is the operand's."""

BINARY: frozenset[Op] = frozenset({Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN})
"""Elementwise ops of two operands: the shape is the union (broadcast by name)."""

ELEMENTWISE: frozenset[Op] = UNARY | BINARY
"""Ops computed independently at every index: `f(x)[i] = f(x[i])`."""

COMMUTATIVE: frozenset[Op] = frozenset({Op.ADD, Op.MUL, Op.MAX, Op.MIN})
"""`f(x, y) = f(y, x)`."""

ASSOCIATIVE: frozenset[Op] = frozenset({Op.ADD, Op.MUL, Op.MAX, Op.MIN})
"""`f(f(x, y), z) = f(x, f(y, z))`."""

REDUCTIONS: frozenset[Op] = frozenset({Op.SUM, Op.RMAX, Op.LSE, Op.SOFTMAXAVG, Op.DOT})
"""Ops that bind an axis and remove it from the result's shape."""

MONOID_REDUCTIONS: frozenset[Op] = frozenset({Op.SUM, Op.RMAX, Op.LSE})
"""Reductions of one operand by an associative, commutative monoid (split-able)."""

ONLINE: frozenset[Op] = frozenset({Op.LSE, Op.SOFTMAXAVG})
"""Reductions that lower to single-pass online updates with a running max."""

TRANSCENDENTAL: frozenset[Op] = frozenset({Op.EXP, Op.LOG, Op.SQRT, Op.TANH, Op.ERF, Op.SIGMOID})
"""Unary ops that are uninterpreted functions for the SMT encoding."""

LEAVES: frozenset[Op] = frozenset({Op.IN, Op.CONST})
"""Ops with no term children."""

ARITY: dict[Op, int] = {
    **{op: 0 for op in LEAVES},
    **{op: 1 for op in UNARY},
    **{op: 2 for op in BINARY},
    Op.SUM: 1,
    Op.RMAX: 1,
    Op.LSE: 1,
    Op.SOFTMAXAVG: 2,
    Op.DOT: 2,
    Op.SPLIT: 1,
    Op.STORE: 1,
}
"""Number of term children of each op."""

FLOPS_PER_ELEMENT: dict[Op, int] = {
    Op.IN: 0,
    Op.CONST: 0,
    Op.NEG: 1,
    Op.EXP: 8,
    Op.LOG: 8,
    Op.SQRT: 4,
    Op.RECIP: 4,
    Op.TANH: 10,
    Op.ERF: 12,
    Op.SIGMOID: 10,
    Op.RELU: 1,
    Op.ABS: 1,
    Op.ADD: 1,
    Op.SUB: 1,
    Op.MUL: 1,
    Op.DIV: 4,
    Op.MAX: 1,
    Op.MIN: 1,
    Op.SUM: 1,
    Op.RMAX: 1,
    Op.LSE: 10,
    Op.SOFTMAXAVG: 12,
    Op.DOT: 2,
    Op.SPLIT: 0,
    Op.STORE: 0,
}
"""Rough floating-point cost of one output (or, for reductions, input) element, for the
analytic cost model and policy features. Transcendentals count as several flops."""

BY_NAME: dict[str, Op] = {op.value: op for op in Op}
"""Op by its s-expression head."""

assert set(ARITY) == set(Op), "every op needs an arity"
assert set(FLOPS_PER_ELEMENT) == set(Op), "every op needs a flop estimate"
