"""The op table: the spine of the IR.

Every op is declared once here: one `OpInfo` row in `OPS` (arity, cost, float
semantics, C and CUDA spelling, symbolic meaning, positivity), beside named property
sets that each state one law. Shape inference, the interpreter, the renderers, the
symbolic semantics, the positivity analysis and the policy features all read these
tables; no other module keeps its own list of "binary ops" or "transcendentals".

Semantics are over the reals: a tensor is a function from an index assignment
(axis name -> integer in [0, size)) to a real number.

Adding an elementwise op is one row of `OPS` (plus its membership in the law sets
below where it has the law), its rewrite rules and, where the C spelling calls a
prelude function, that function in `kernelsat.codegen.c_prelude`; `tests/test_op_coverage.py`
checks that every table covers it.

>>> OPS[Op.SOFTPLUS].arity, OPS[Op.SOFTPLUS].sym
(1, '(log (add (Const 1.0) (exp ?x)))')
>>> sorted(op.value for op in UNINTERPRETED)
['cos', 'erf', 'exp', 'log', 'sin', 'sqrt', 'tanh']
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

import numpy as np


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
    SOFTPLUS = "softplus"
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
    # selection, comparisons, index values, sin/cos (issue 18, parts 2 and 3a)
    IDX = "Idx"  # the index of an axis as a value: Idx(i)[i] = i
    NEGINF = "NegInf"  # -inf: the masked score (see docs/proofs.md, "Masks")
    SIN = "sin"
    COS = "cos"
    LT = "lt"  # 1.0 where x < y, else 0.0
    LE = "le"
    EQ = "eq"
    NE = "ne"
    WHERE = "where"  # where(c, x, y): x where c != 0, else y
    # layout and materialization
    SPLIT = "Split"  # x[a = o*f + i], a -> (a/o<f>, a/i<f>)
    STORE = "Store"  # materialize in memory: a kernel boundary; identity semantics
    # affine reads (issue 18 part 1)
    READ = "Read"  # x at affine index forms of new axes, a pad value outside x's range
    # degenerate programs (issue 18 part 7)
    ZERO = "zero"  # 0 at every index of x's shape: x is a shape witness, never read
    # gathers by integer inputs (issue 18 part 3b)
    GATHER = "Gather"  # Gather(a, x, l): x with its axis a read at the integer labels l


Kind = Literal["leaf", "elementwise", "reduction", "layout"]

PositivityKind = Literal["never", "always", "const", "all", "any"]
Positivity = tuple[PositivityKind, tuple[int, ...]]
"""When an op's result is positive at every index: `never` (not provably), `always`,
`const` (a positive constant), `all` / `any` of the listed children positive."""

NEVER: Positivity = ("never", ())


@dataclass(frozen=True, slots=True)
class OpInfo:
    """Everything the compiler knows about one op.

    - `kind`, `arity`: leaf, elementwise, reduction (binds an axis) or layout; term children.
    - `flops`: rough float cost of one output (for reductions: input) element, for the
      analytic cost model and the policy features; transcendentals count as several.
    - `numpy`: elementwise only, the float semantics on arrays (the interpreter runs it
      in float64 as the reference and in float32 as the numpy backend).
    - `c`, `cuda`: elementwise only, the C expression with `{0}`, `{1}` the operands;
      `cuda` only where CUDA's spelling differs.
    - `sym`: elementwise only, the meaning over the reals for the verifier: `primitive`
      (built into the symbolic algebra), `uninterpreted` (a z3 function; what the
      verifier may assume about it is `kernelsat.proofs.axioms`, where it is partial
      `proofs.verify_sym.PRIMITIVE` records its domain), or a definition over other ops,
      an s-expression in `?x` (`?y`).
    - `positive`: the positivity analysis' rule for the op (see `Positivity`).
    - `infix`: the spec-language operator for ops written as operators (`x + y`,
      `-x`); elementwise ops without one are called by name (`tanh(x)`).
    """

    kind: Kind
    arity: int
    flops: int
    doc: str
    numpy: Callable[..., np.ndarray] | None = None
    c: str | None = None
    cuda: str | None = None
    sym: str | None = None
    positive: Positivity = NEVER
    infix: str | None = None


def _erf(x: np.ndarray) -> np.ndarray:
    try:
        from scipy.special import erf  # optional: vectorized

        return np.asarray(erf(x), dtype=x.dtype)
    except ImportError:  # pragma: no cover
        return np.vectorize(math.erf, otypes=[x.dtype])(x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    # log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow for large x in float32
    return np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


def _where(c: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.asarray(np.where(c != 0, x, y))


def _compare(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    def run(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        out = np.asarray(fn(x, y))
        return out.astype(np.result_type(x, y, np.float32))

    return run


def _unary(flops: int, doc: str, fn: Callable[..., np.ndarray], c: str, sym: str,
           cuda: str | None = None, positive: Positivity = NEVER,
           infix: str | None = None) -> OpInfo:
    return OpInfo("elementwise", 1, flops, doc, fn, c, cuda, sym, positive, infix)


def _binary(flops: int, doc: str, fn: Callable[..., np.ndarray], c: str, sym: str,
            cuda: str | None = None, positive: Positivity = NEVER,
            infix: str | None = None) -> OpInfo:
    return OpInfo("elementwise", 2, flops, doc, fn, c, cuda, sym, positive, infix)


_ALL_KIDS: Positivity = ("all", (0,))
_BOTH: Positivity = ("all", (0, 1))

OPS: dict[Op, OpInfo] = {
    Op.IN: OpInfo("leaf", 0, 0, "an input tensor"),
    Op.CONST: OpInfo("leaf", 0, 0, "a real scalar", positive=("const", ())),
    # unary elementwise ----------------------------------------------------------------
    Op.NEG: _unary(1, "-x", np.negative, "(-{0})", "primitive", infix="-"),
    Op.EXP: _unary(8, "e^x", np.exp, "ks_exp({0})", "uninterpreted", "expf({0})",
                   positive=("always", ())),
    Op.LOG: _unary(8, "natural logarithm", np.log, "ks_log({0})", "uninterpreted", "logf({0})"),
    Op.SQRT: _unary(4, "square root", np.sqrt, "sqrtf({0})", "uninterpreted",
                    positive=_ALL_KIDS),
    Op.RECIP: _unary(4, "1 / x", np.reciprocal, "(1.0f / {0})", "primitive",
                     positive=_ALL_KIDS),
    Op.TANH: _unary(10, "hyperbolic tangent", np.tanh, "ks_tanh({0})", "uninterpreted",
                    "tanhf({0})"),
    Op.ERF: _unary(12, "error function", _erf, "ks_erf({0})", "uninterpreted", "erff({0})"),
    Op.SIGMOID: _unary(10, "1 / (1 + e^-x)", _sigmoid, "ks_sigmoid({0})",
                       "(recip (add (Const 1.0) (exp (neg ?x))))",
                       "(1.0f / (1.0f + expf(-{0})))", positive=("always", ())),
    Op.SOFTPLUS: _unary(16, "log(1 + e^x), computed as max(x, 0) + log1p(e^-|x|)", _softplus,
                        "ks_softplus({0})",
                        "(log (add (Const 1.0) (exp ?x)))",
                        "(fmaxf({0}, 0.0f) + log1pf(expf(-fabsf({0}))))",
                        positive=("always", ())),
    Op.RELU: _unary(1, "max(x, 0)", _relu, "ks_max({0}, 0.0f)", "(max ?x (Const 0.0))",
                    "fmaxf({0}, 0.0f)"),
    Op.ABS: _unary(1, "|x|", np.abs, "fabsf({0})", "(max ?x (neg ?x))"),
    # binary elementwise ---------------------------------------------------------------
    Op.ADD: _binary(1, "x + y", np.add, "({0} + {1})", "primitive", positive=_BOTH, infix="+"),
    Op.SUB: _binary(1, "x - y", np.subtract, "({0} - {1})", "primitive", infix="-"),
    Op.MUL: _binary(1, "x * y", np.multiply, "({0} * {1})", "primitive", positive=_BOTH,
                    infix="*"),
    Op.DIV: _binary(4, "x / y", np.divide, "({0} / {1})", "primitive", positive=_BOTH,
                    infix="/"),
    Op.MAX: _binary(1, "elementwise maximum of two operands", np.maximum, "ks_max({0}, {1})",
                    "primitive", "fmaxf({0}, {1})", positive=("any", (0, 1))),
    Op.MIN: _binary(1, "elementwise minimum of two operands", np.minimum, "ks_min({0}, {1})",
                    "primitive", "fminf({0}, {1})", positive=_BOTH),
    # selection, comparisons, index values, sin/cos (issue 18) ------------------------
    # A comparison is a real: 1.0 where it holds, else 0.0 (usable in arithmetic and as
    # `where`'s condition, which selects where the condition is nonzero). `Idx` and
    # `NegInf` are leaves: the index of an axis as a value, and -inf.
    Op.IDX: OpInfo("leaf", 0, 0, "the index of an axis as a value"),
    Op.NEGINF: OpInfo("leaf", 0, 0, "-inf (a masked score)"),
    Op.SIN: _unary(10, "sine", np.sin, "ks_sin({0})", "uninterpreted", "sinf({0})"),
    Op.COS: _unary(10, "cosine", np.cos, "ks_cos({0})", "uninterpreted", "cosf({0})"),
    Op.LT: _binary(1, "1 where x < y, else 0", _compare(np.less),
                   "(({0}) < ({1}) ? 1.0f : 0.0f)", "primitive"),
    Op.LE: _binary(1, "1 where x <= y, else 0", _compare(np.less_equal),
                   "(({0}) <= ({1}) ? 1.0f : 0.0f)", "primitive"),
    Op.EQ: _binary(1, "1 where x == y, else 0", _compare(np.equal),
                   "(({0}) == ({1}) ? 1.0f : 0.0f)", "primitive"),
    Op.NE: _binary(1, "1 where x != y, else 0", _compare(np.not_equal),
                   "(({0}) != ({1}) ? 1.0f : 0.0f)", "primitive"),
    Op.WHERE: OpInfo("elementwise", 3, 1, "x where c != 0, else y", _where,
                     "(({0}) != 0.0f ? ({1}) : ({2}))", sym="primitive",
                     positive=("all", (1, 2))),
    # reductions -----------------------------------------------------------------------
    Op.SUM: OpInfo("reduction", 1, 1, "sum over the axis", positive=_ALL_KIDS),
    Op.RMAX: OpInfo("reduction", 1, 1, "maximum over the axis", positive=_ALL_KIDS),
    Op.LSE: OpInfo("reduction", 1, 10, "log sum exp over the axis"),
    Op.SOFTMAXAVG: OpInfo("reduction", 2, 12, "softmax(s)-weighted sum of v over the axis",
                          positive=("all", (1,))),
    Op.DOT: OpInfo("reduction", 2, 2, "sum over the axis of x * y", positive=_BOTH),
    # layout ---------------------------------------------------------------------------
    Op.SPLIT: OpInfo("layout", 1, 0, "the axis split into outer and inner", positive=_ALL_KIDS),
    Op.STORE: OpInfo("layout", 1, 0, "materialized in memory (identity)", positive=_ALL_KIDS),
    # affine reads (issue 18 part 1): not positive in general (a pad of 0) -------------
    Op.READ: OpInfo("layout", 1, 0, "x read at affine index forms (windows, strides, shifts)"),
    # degenerate programs (issue 18 part 7) ----------------------------------------------
    # `zero x` is 0 at every index of x's shape: the shape-keeping form of `x - x` and
    # `x * 0` (a bare Const has no axes). Its operand only gives the shape: codegen never
    # computes it (`SHAPE_ONLY`), so a kernel whose value is `zero` is a fill, no reads.
    Op.ZERO: _unary(0, "0 at every index of x (x gives the shape; its values are not read)",
                    np.zeros_like, "((void)({0}), 0.0f)", "(Const 0.0)"),
    # gathers by integer inputs (issue 18 part 3b) ----------------------------------------
    # `Gather a x l` is x with axis a at index l[...]: l is an integer input (an `In`
    # node), its axes free in the result beside x's other axes. Not positive in general.
    Op.GATHER: OpInfo("layout", 2, 1, "x with axis a read at the integer labels l"),  # 1: the
    # label's check and index arithmetic, per element
}
"""One row per op."""


def _ops(kind: Kind, arity: int | None = None) -> frozenset[Op]:
    return frozenset(op for op, i in OPS.items()
                     if i.kind == kind and (arity is None or i.arity == arity))


UNARY: frozenset[Op] = _ops("elementwise", 1)
"""Elementwise ops of one operand: the shape is the operand's."""

BINARY: frozenset[Op] = _ops("elementwise", 2)
"""Elementwise ops of two operands: the shape is the union (broadcast by name)."""

TERNARY: frozenset[Op] = _ops("elementwise", 3)
"""Elementwise ops of three operands (`where`): the shape is the union."""

ELEMENTWISE: frozenset[Op] = UNARY | BINARY | TERNARY
"""Ops computed independently at every index: `f(x)[i] = f(x[i])`."""

COMPARISONS: frozenset[Op] = frozenset({Op.LT, Op.LE, Op.EQ, Op.NE})
"""Comparisons: 1.0 where they hold, else 0.0 (exact, in every precision)."""

REDUCTIONS: frozenset[Op] = _ops("reduction")
"""Ops that bind an axis and remove it from the result's shape."""

LEAVES: frozenset[Op] = _ops("leaf")
"""Ops with no term children."""

COMMUTATIVE: frozenset[Op] = frozenset({Op.ADD, Op.MUL, Op.MAX, Op.MIN})
"""`f(x, y) = f(y, x)`."""

ASSOCIATIVE: frozenset[Op] = frozenset({Op.ADD, Op.MUL, Op.MAX, Op.MIN})
"""`f(f(x, y), z) = f(x, f(y, z))`."""

MONOID_REDUCTIONS: frozenset[Op] = frozenset({Op.SUM, Op.RMAX, Op.LSE})
"""Reductions of one operand by an associative, commutative monoid (split-able)."""

ONLINE: frozenset[Op] = frozenset({Op.LSE, Op.SOFTMAXAVG})
"""Reductions that lower to single-pass online updates with a running max."""

TRANSCENDENTAL: frozenset[Op] = frozenset(
    {Op.EXP, Op.LOG, Op.SQRT, Op.TANH, Op.ERF, Op.SIGMOID, Op.SOFTPLUS, Op.SIN, Op.COS}
)
"""Elementwise ops that cost a math-library call (the cost models' penalty class)."""

SHAPE_ONLY: frozenset[Op] = frozenset({Op.ZERO})
"""Elementwise ops whose value does not depend on their operands' values, only on their
shape (`zero x = 0`): lowering never computes the operand (a fill kernel reads nothing)."""

UNINTERPRETED: frozenset[Op] = frozenset(op for op, i in OPS.items() if i.sym == "uninterpreted")
"""Elementwise ops that are uninterpreted functions for the verifier; what it may
assume about them is `kernelsat.proofs.axioms`."""

POSITIVE_ALWAYS: frozenset[Op] = frozenset(op for op, i in OPS.items()
                                           if i.positive[0] == "always")
"""`f(...) > 0` whatever the operands."""

ARITY: dict[Op, int] = {op: i.arity for op, i in OPS.items()}
"""Number of term children of each op."""

FLOPS_PER_ELEMENT: dict[Op, int] = {op: i.flops for op, i in OPS.items()}
"""`OpInfo.flops` of each op."""

POSITIVITY: dict[Op, Positivity] = {op: i.positive for op, i in OPS.items()
                                    if i.positive[0] != "never"}
"""The positivity analysis as a table (ops not listed: never provably positive); read by
`rewrites.rule.is_positive` on terms and by `egraph.render` as egglog rules."""

AXIS_ATTR: frozenset[Op] = REDUCTIONS | {Op.GATHER}
"""Ops whose one attribute is an axis they remove from the shape (a reduction's axis, the
axis a `Gather` reads at the labels): printed, parsed and matched alike."""

BY_NAME: dict[str, Op] = {op.value: op for op in Op}
"""Op by its s-expression head."""

assert set(OPS) == set(Op), "every op needs a row in OPS"
assert all((i.kind == "elementwise") == (i.numpy is not None and i.c is not None
                                         and i.sym is not None) for i in OPS.values()), \
    "elementwise ops, and only they, have numpy, C and symbolic semantics"
