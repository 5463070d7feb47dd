"""Float safety of a program, decided before it is run: where can float32 overflow,
produce NaN, divide by a value that can underflow to 0, or cancel catastrophically?

A program equal to the spec over the reals can still fail in float32 (`exp(x) /
exp(max x)` overflows where `exp(x - max x)` does not). `analyze` interprets a term over
an abstract value per node (`Val`: the set of reals it can take, as a negative and a
positive magnitude interval and whether 0 is possible, plus whether -inf, +inf or NaN
are possible) from ranges of the inputs (`input_ranges`: the run-time checks' own
distributions, `kernelsat.inputs`, scaled as the overflow check scales them), and
returns the `Hazard`s it finds, each naming its subterm. Reductions are abstracted over
their extents (a sum of N terms, a max, the online LSE and softmax-average forms).

"Safe" (no hazard) is meant soundly: on any inputs inside the ranges, the float32 value
of every node is finite (the bounds are widened by float rounding at every op, and a
value that can fall below the smallest normal float counts as possibly 0). Where the
analysis cannot prove a fact it reports a hazard, so it errs towards "unsafe". Three
relational facts keep the max-subtracted forms precise: `x - m` is at most 0 (plus
rounding) when `m` provably dominates `x` (`m` is a max, an LSE or an elementwise max
over `x`); a sum over `a` of `exp(x - Max_a x)` is at least about 1 (the max element
contributes `exp(0)`); and `t * t` is never negative. Masks are decided concretely: an
input-free subterm (a condition on `Idx` values, a `NegInf`) is evaluated in float32,
so a max over a causal row knows that some element is finite.

`judge` compares a candidate with the spec: it is unsafe when it has a hazard on the
check's inputs or on the overflow check's (scaled) inputs where the spec has none there
(the run-time check compares only where the spec's own program is finite). The pipeline
drops such candidates before they are proved or measured (`kernelsat.driver.pipeline`).

>>> from kernelsat.ir import In, Max, Sum, div, exp, sub
>>> x = In("x", (("i", 4), ("n", 8)))
>>> safe = div(exp(sub(x, Max("n", x))), Sum("n", exp(sub(x, Max("n", x)))))
>>> naive = div(exp(x), Sum("n", exp(x)))
>>> ranges = {"x": data_range(100.0)}
>>> analyze(safe, ranges).hazards
[]
>>> [h.kind for h in analyze(naive, ranges).hazards][:1]
['overflow']
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from kernelsat.affine import ReadMap
from kernelsat.interp import EVAL, Tensor, align_axes, read_indices
from kernelsat.ir import Term, idx_axis, postorder, read_map, to_sexpr
from kernelsat.ops import COMPARISONS, Op
from kernelsat.program import Program

F32_MAX = float(np.finfo(np.float32).max)
F32_TINY = float(np.finfo(np.float32).tiny)
LIMIT = F32_MAX / 2
"""A magnitude the analysis calls an overflow: half the largest float32, so that the
float32 value of a node whose real bound is below it is finite whatever its rounding."""
EXP_LIMIT = math.log(LIMIT)
REL = 2.0 ** -20
"""Relative widening of every computed bound (float32 rounds each op by 2^-24; a few
ulps of a math-library call are inside this)."""
CANCEL = 2.0 ** 24
"""An addend this large (float32 keeps no fraction past 2^24) in a sum whose signs can
mix is a cancellation hazard on the check's inputs."""
MASK_CAP = 1 << 22
"""The most elements a concrete mask (an input-free subterm's value) may have."""

HazardKind = Literal["overflow", "nan", "divide", "log-zero", "cancel", "infinite-output"]


@dataclass(frozen=True)
class Hazard:
    """One float hazard: its kind, the subterm (clipped s-expression) and why."""

    kind: HazardKind
    term: str
    reason: str

    def __str__(self) -> str:
        return f"{self.kind} at {self.term}: {self.reason}"


Mag = tuple[float, float]
"""A magnitude interval `[lo, hi]`, `0 <= lo <= hi < inf`; lo 0 means arbitrarily near 0."""


@dataclass(frozen=True)
class Val:
    """The abstract value of a node: the reals it can take, `-neg ∪ {0} ∪ pos` (each part
    optional), and whether it can be -inf, +inf or NaN. `fin` is where the value is surely
    finite (a concrete boolean tensor over some of its axes) when it can be infinite."""

    neg: Mag | None
    zero: bool
    pos: Mag | None
    ninf: bool = False
    pinf: bool = False
    nan: bool = False
    fin: Tensor | None = field(default=None, compare=False)

    @property
    def infinite(self) -> bool:
        return self.ninf or self.pinf or self.nan

    @property
    def empty(self) -> bool:
        return self.neg is None and self.pos is None and not self.zero

    def pieces(self) -> list[tuple[float, float]]:
        """The finite part as real intervals."""
        out = []
        if self.neg is not None:
            out.append((-self.neg[1], -self.neg[0]))
        if self.zero:
            out.append((0.0, 0.0))
        if self.pos is not None:
            out.append(self.pos)
        return out

    def hull(self) -> tuple[float, float]:
        """The smallest real interval holding the finite part ((0, 0) when it is empty)."""
        ps = self.pieces() or [(0.0, 0.0)]
        return min(p[0] for p in ps), max(p[1] for p in ps)

    def magnitude(self) -> float:
        lo, hi = self.hull()
        return max(abs(lo), abs(hi))

    def __str__(self) -> str:
        parts = [f"[{a:.3g}, {b:.3g}]" for a, b in self.pieces()]
        parts += [n for n, f in (("-inf", self.ninf), ("+inf", self.pinf), ("NaN", self.nan))
                  if f]
        return " ∪ ".join(parts) or "{}"


def interval(lo: float, hi: float) -> Val:
    """The finite reals `[lo, hi]`."""
    return Val((max(0.0, -hi), -lo) if lo < 0 else None, lo <= 0 <= hi,
               (max(0.0, lo), hi) if hi > 0 else None)


def _join_mag(a: Mag | None, b: Mag | None) -> Mag | None:
    if a is None or b is None:
        return a or b
    return min(a[0], b[0]), max(a[1], b[1])


def join(*vals: Val) -> Val:
    """The union of abstract values (their `fin` masks dropped)."""
    out = Val(None, False, None)
    for v in vals:
        out = Val(_join_mag(out.neg, v.neg), out.zero or v.zero, _join_mag(out.pos, v.pos),
                  out.ninf or v.ninf, out.pinf or v.pinf, out.nan or v.nan)
    return out


def union_of(intervals: Sequence[tuple[float, float]]) -> Val:
    return join(*(interval(a, b) for a, b in intervals)) if intervals else Val(None, False, None)


def data_range(scale: float = 1.0) -> Val:
    """A `data` input: magnitudes in [0.5, 1.5] times `scale`, either sign, never 0."""
    return Val((0.5 * scale, 1.5 * scale), False, (0.5 * scale, 1.5 * scale))


ROLE_RANGES: dict[str, Callable[[float], Val]] = {
    "data": data_range,
    "positive": lambda scale: Val(None, False, (0.5 * scale, 1.5 * scale)),
    "onehot": lambda scale: Val(None, True, (1.0, 1.0)),  # never scaled by the stress check
}
"""The values each input role takes (`kernelsat.inputs.FILLERS`), the overflow check's
scale applied; a test checks the fillers stay inside them."""


def input_ranges(program: Program, scale: float = 1.0) -> dict[str, Val]:
    """The range of each input of `program`: by role for float inputs (an unknown role
    can be any finite float32), integer inputs their index range (below the largest
    declared dim: they index a dim of the program)."""
    out: dict[str, Val] = {}
    biggest = max((d for decl in program.inputs for d in decl.dims), default=1)
    for d in program.inputs:
        if not d.dtype.startswith("f"):
            out[d.name] = interval(0.0, float(biggest))
        elif d.role in ROLE_RANGES:
            out[d.name] = ROLE_RANGES[d.role](scale)
        else:
            out[d.name] = interval(-LIMIT, LIMIT)
    return out


@dataclass
class Analysis:
    """The result of `analyze`: the root's value, every node's, and the hazards found."""

    value: Val
    values: dict[Term, Val]
    hazards: list[Hazard]

    @property
    def safe(self) -> bool:
        return not self.hazards


# -- the transfer functions -----------------------------------------------------------


def _widen(v: Val, rel: float = REL) -> Val:
    """`v` widened by float rounding (relative `rel`); a magnitude that can fall below the
    smallest normal float32 may flush to 0."""

    def mag(m: Mag | None) -> tuple[Mag | None, bool]:
        if m is None:
            return None, False
        lo, hi = m[0] * (1 - rel), m[1] * (1 + rel) + F32_TINY
        return (0.0 if lo < F32_TINY else lo, hi), lo < F32_TINY

    neg, z1 = mag(v.neg)
    pos, z2 = mag(v.pos)
    return replace(v, neg=neg, pos=pos, zero=v.zero or z1 or z2)


def _clamp(v: Val, lo: float, hi: float) -> Val:
    """`v` intersected with [lo, hi] (for functions whose float32 values stay in it)."""
    def cut(a: float, b: float) -> tuple[float, float] | None:
        a, b = max(a, lo), min(b, hi)
        return (a, b) if a <= b else None

    kept = [p for p in (cut(a, b) for a, b in v.pieces()) if p is not None]
    return replace(union_of(kept), ninf=v.ninf, pinf=v.pinf, nan=v.nan, fin=v.fin)


class _Run:
    """One analysis: the values so far, the hazards, and concrete values of input-free
    subterms."""

    def __init__(self, ranges: Mapping[str, Val],
                 concrete: dict[Term, Tensor | None] | None = None) -> None:
        self.ranges = ranges
        self.values: dict[Term, Val] = {}
        self.concrete: dict[Term, Tensor | None] = {} if concrete is None else concrete
        self.hazards: list[Hazard] = []

    def flag(self, kind: HazardKind, node: Term, reason: str) -> None:
        text = to_sexpr(node)
        self.hazards.append(Hazard(kind, text if len(text) <= 100 else text[:97] + "...",
                                   reason))

    def overflowed(self, node: Term, v: Val, what: str, *operands: Val) -> Val:
        """`v` with magnitudes past `LIMIT` turned into infinities, and a hazard unless an
        operand can already be infinite (the hazard upstream is the cause)."""
        ninf = v.neg is not None and v.neg[1] > LIMIT
        pinf = v.pos is not None and v.pos[1] > LIMIT
        if not (ninf or pinf):
            return v
        if not any(o.ninf or o.pinf for o in operands):
            self.flag("overflow", node, f"{what} can reach {v.magnitude():.3g}, past "
                                        f"float32's {F32_MAX:.3g}")
        cap = (lambda m: (min(m[0], LIMIT), LIMIT) if m else None)  # noqa: E731
        return Val(cap(v.neg), v.zero, cap(v.pos), v.ninf or ninf, v.pinf or pinf, v.nan)


def _pairwise(a: Val, b: Val, fn: Callable[[tuple[float, float], tuple[float, float]],
                                           tuple[float, float]]) -> Val:
    return union_of([fn(p, q) for p in a.pieces() for q in b.pieces()])


def _add_iv(p: tuple[float, float], q: tuple[float, float]) -> tuple[float, float]:
    return p[0] + q[0], p[1] + q[1]


def _mul_iv(p: tuple[float, float], q: tuple[float, float]) -> tuple[float, float]:
    prods = [x * y for x in p for y in q]
    return min(prods), max(prods)


def _neg(v: Val) -> Val:
    return replace(v, neg=v.pos, pos=v.neg, ninf=v.pinf, pinf=v.ninf)


def _finite_mask(v: Val) -> Tensor:
    """Where `v` is surely finite: everywhere when it cannot be infinite, else its `fin`
    mask, else nowhere."""
    if not v.infinite:
        return Tensor(np.array(True), ())
    return v.fin if v.fin is not None else Tensor(np.array(False), ())


def _and(*masks: Tensor) -> Tensor | None:
    axes: list[str] = []
    for m in masks:
        axes.extend(a for a in m.axes if a not in axes)
    arrays = [align_axes(m.array, m.axes, tuple(axes)) for m in masks]
    shape = np.broadcast_shapes(*(a.shape for a in arrays))
    if math.prod(shape) > MASK_CAP:
        return None
    out = np.ones(shape, bool)
    for a in arrays:
        out &= a
    return Tensor(out, tuple(axes))


def _reduce_mask(mask: Tensor, axis: str, how: Literal["any", "all"]) -> Tensor:
    if axis not in mask.axes:
        return mask
    k = mask.axes.index(axis)
    arr = mask.array.any(axis=k) if how == "any" else mask.array.all(axis=k)
    return Tensor(arr, tuple(a for a in mask.axes if a != axis))


def _strip(t: Term) -> Term:
    while t.op is Op.STORE:
        t = t.args[0]
    return t


def _dominates(m: Term, x: Term) -> bool:
    """`m >= x` at every index (x broadcast over m's axes and m over x's), provably:
    `m` is `x`, or a max / LSE over something that dominates `x`, or an elementwise max
    with such an operand."""
    m, x = _strip(m), _strip(x)
    if m is x:
        return True
    if m.op in (Op.RMAX, Op.LSE):
        return _dominates(m.args[0], x)
    if m.op is Op.MAX:
        return any(_dominates(a, x) for a in m.args)
    return False


def _rounding_slack(x: Term, v: Val) -> float:
    """How far a recomputation of `x` can drift from another one (float rounding of the
    sums under it, in a different order): a bound for `x - Max x` above 0."""
    extent = sum(t.all_sizes.get(t.axis, 1) for t in _nodes(x) if t.op in _SUMS) + 8
    return v.magnitude() * extent * 2.0 ** -23


_SUMS = frozenset({Op.SUM, Op.DOT, Op.SOFTMAXAVG, Op.LSE})


def _nodes(root: Term) -> list[Term]:
    return list(postorder(root))


def _peak(run: _Run, t: Term, axis: str) -> tuple[float, float] | None:
    """`(c, slack)` when the max over `axis` of `t` is `c` within `slack`, known by the
    form of `t`: `x - Max_axis(x)` (its max is 0: some element is the max), plus or minus
    constants. None when the form says nothing, or the max can be -inf (a fully masked
    row)."""
    t = _strip(t)
    if t.op in (Op.ADD, Op.SUB):
        x, y = t.args
        sy = _strip(y)
        if sy.op is Op.RMAX and sy.axis == axis and _strip(sy.args[0]) is _strip(x):
            if t.op is Op.ADD or run.values[sy].infinite:
                return None
            return 0.0, _rounding_slack(x, run.values[x])
        for u, c in ((x, y), (y, x)):
            if c.op is Op.CONST and (t.op is Op.ADD or u is x):
                inner = _peak(run, u, axis)
                if inner is not None:
                    k = float(c.attrs[0])  # type: ignore[arg-type]
                    return inner[0] + (k if t.op is Op.ADD else -k), inner[1] + abs(k) * REL
    return None


def _concrete(run: _Run, node: Term, kids: list[Tensor | None]) -> Tensor | None:
    """The float32 value of an input-free node (None past `MASK_CAP` or with an input)."""
    if node.op is Op.IN or any(k is None for k in kids) or node.size() > MASK_CAP:
        return None
    if node.op is Op.CONST:
        return Tensor(np.asarray(node.attrs[0], np.float32), ())
    if node.op is Op.NEGINF:
        return Tensor(np.asarray(-np.inf, np.float32), ())
    if node.op is Op.IDX:
        axis, size = idx_axis(node)
        return Tensor(np.arange(size, dtype=np.float32), (axis,))
    if node.op not in EVAL:
        return None
    with np.errstate(all="ignore"):
        out = EVAL[node.op](node, [k for k in kids if k is not None], np.dtype(np.float32))
    return Tensor(np.asarray(out.array, np.float32), out.axes)


def _from_concrete(t: Tensor) -> Val:
    a = t.array
    fin = a[np.isfinite(a)]
    neg, pos = fin[fin < 0], fin[fin > 0]
    return Val((float(-neg.max()), float(-neg.min())) if neg.size else None,
               bool((fin == 0).any()),
               (float(pos.min()), float(pos.max())) if pos.size else None,
               bool((a == -np.inf).any()), bool((a == np.inf).any()), bool(np.isnan(a).any()),
               Tensor(np.isfinite(a), t.axes))


def _exp(run: _Run, node: Term, x: Val) -> Val:
    lo, hi = x.hull()
    out = _widen(interval(math.exp(min(lo, 700.0)), math.exp(min(hi, 700.0))))
    if x.empty:
        out = Val(None, False, None)
    if x.ninf:
        out = join(out, Val(None, True, None))
    out = replace(out, pinf=x.pinf, nan=x.nan)
    if hi > EXP_LIMIT:
        run.flag("overflow", node, f"exp of a value that can reach {hi:.3g} (float32 exp "
                                   f"overflows past {math.log(F32_MAX):.1f})")
        out = Val(None, out.zero, (out.pos[0] if out.pos else 0.0, LIMIT), False, True, x.nan)
    return replace(out, fin=x.fin if out.infinite else None)


def _log(run: _Run, node: Term, x: Val) -> Val:
    if x.neg is not None or x.ninf:
        run.flag("nan", node, f"log of a value that can be negative ({x})")
    if x.zero:
        run.flag("log-zero", node, f"log of a value that can be 0 or underflow to 0 ({x})")
    out = Val(None, False, None)
    if x.pos is not None:
        lo, hi = x.pos
        out = _widen(interval(math.log(max(lo, F32_TINY / 2)), math.log(hi)))
    return replace(out, ninf=x.zero or x.ninf, pinf=x.pinf, nan=x.nan or x.neg is not None
                   or x.ninf, fin=x.fin)


def _sqrt(run: _Run, node: Term, x: Val) -> Val:
    if x.neg is not None or x.ninf:
        run.flag("nan", node, f"sqrt of a value that can be negative ({x})")
    out = Val(None, x.zero, None)
    if x.pos is not None:
        out = _widen(join(out, Val(None, False, (math.sqrt(x.pos[0]), math.sqrt(x.pos[1])))))
    return replace(out, pinf=x.pinf, nan=x.nan or x.neg is not None or x.ninf, fin=x.fin)


def _recip(run: _Run, node: Term, x: Val, what: str = "1 / x") -> Val:
    """1 / x: a divisor that can be 0 (or flush to 0) gives an infinity of either sign (0
    has a sign in float), one that can be tiny an overflow."""
    if x.zero:
        run.flag("divide", node, f"{what}: the divisor can be 0 or underflow to 0 ({x})")

    def inv(m: Mag | None) -> Mag | None:
        return None if m is None else (1.0 / m[1], 1.0 / m[0] if m[0] > 0 else math.inf)

    v = _widen(Val(inv(x.neg), x.ninf or x.pinf, inv(x.pos), nan=x.nan))
    ninf = x.zero or (v.neg is not None and v.neg[1] > LIMIT)
    pinf = x.zero or (v.pos is not None and v.pos[1] > LIMIT)
    if (ninf or pinf) and not x.zero:
        small = min(m[0] for m in (x.neg, x.pos) if m is not None)
        run.flag("divide", node, f"{what}: the divisor can be as small as {small:.3g} (the "
                                 "quotient overflows)")

    def cap(m: Mag | None) -> Mag | None:
        return None if m is None else (min(m[0], LIMIT), min(m[1], LIMIT))

    return Val(cap(v.neg), v.zero, cap(v.pos), ninf, pinf, v.nan)


def _mul(run: _Run, node: Term, a: Val, b: Val, what: str = "a product") -> Val:
    out = _widen(_pairwise(a, b, _mul_iv))
    (base_a, sign_a), (base_b, sign_b) = (_signed_base(run, t) for t in node.args)
    if base_a is base_b:  # p*u times q*u (p, q of known signs): the sign of p*q*u^2
        out = _clamp(out, 0.0, math.inf) if sign_a == sign_b else _clamp(out, -math.inf, 0.0)
    inf_a, inf_b = a.ninf or a.pinf, b.ninf or b.pinf
    if (inf_a and b.zero) or (inf_b and a.zero):
        run.flag("nan", node, f"{what}: 0 times an infinite value ({a} by {b})")
    ninf = pinf = False
    for x, y in ((a, b), (b, a)):
        if x.ninf or x.pinf:
            ypos = y.pos is not None or y.pinf
            yneg = y.neg is not None or y.ninf
            ninf |= (x.ninf and ypos) or (x.pinf and yneg)
            pinf |= (x.pinf and ypos) or (x.ninf and yneg)
    out = replace(out, ninf=out.ninf or ninf, pinf=out.pinf or pinf,
                  nan=a.nan or b.nan or ((inf_a and b.zero) or (inf_b and a.zero)))
    out = run.overflowed(node, out, what, a, b)
    return _with_fin(out, a, b)


def _sign_of(v: Val) -> int:
    """1 (-1) when `v` is surely positive (negative) and finite, else 0."""
    if v.infinite or v.zero:
        return 0
    return 1 if v.neg is None and v.pos is not None else -1 if v.pos is None else 0


def _signed_base(run: _Run, t: Term) -> tuple[Term, int]:
    """`(u, s)` with `t = p * u` for some `p` of sign `s`: Stores, negations and products
    or quotients by values of known sign peeled off (`x / 37` is `(x, 1)`)."""
    sign = 1
    while True:
        t = _strip(t)
        if t.op is Op.NEG:
            t, sign = t.args[0], -sign
            continue
        if t.op in (Op.MUL, Op.DIV):
            a, b = t.args
            s_b = _sign_of(run.values[b])
            if s_b:
                t, sign = a, sign * s_b
                continue
            s_a = _sign_of(run.values[a]) if t.op is Op.MUL else 0
            if s_a:
                t, sign = b, sign * s_a
                continue
        return t, sign


def _with_fin(out: Val, *operands: Val) -> Val:
    if not out.infinite:
        return replace(out, fin=None)
    return replace(out, fin=_and(*(_finite_mask(v) for v in operands)))


def _add(run: _Run, node: Term, a: Val, b: Val) -> Val:
    out = _widen(_pairwise(a, b, _add_iv))
    if (a.pinf and b.ninf) or (a.ninf and b.pinf):
        run.flag("nan", node, f"inf - inf: {a} plus {b}")
    mixed = ((a.neg is not None or b.neg is not None)
             and (a.pos is not None or b.pos is not None))
    big = max(a.magnitude(), b.magnitude())
    if mixed and big >= CANCEL and out.zero:
        run.flag("cancel", node, f"a sum of mixed signs with addends up to {big:.3g} (float32 "
                                 "keeps no fraction there): it can cancel to rounding noise")
    out = replace(out, ninf=a.ninf or b.ninf, pinf=a.pinf or b.pinf,
                  nan=a.nan or b.nan or (a.pinf and b.ninf) or (a.ninf and b.pinf))
    return _with_fin(run.overflowed(node, out, "a sum", a, b), a, b)


def _sub(run: _Run, node: Term, a: Val, b: Val) -> Val:
    x, m = node.args
    out = _add(run, node, a, _neg(b))
    if _dominates(m, x) and not b.ninf:
        slack = _rounding_slack(x, a)
        out = _with_fin(_clamp(out, -math.inf, slack), a, b)
    return out


def _reduce(run: _Run, node: Term, x: Val, n: int) -> Val:
    """A sum of `n` terms each in `x`."""
    rel = REL + n * 2.0 ** -23
    if x.neg is not None and x.pos is not None:
        lo, hi = x.hull()
        out = _widen(interval(n * lo, n * hi), rel)
    else:  # terms of one sign (or 0): at least one term's magnitude unless all can be 0
        def total(m: Mag | None) -> Mag | None:
            return None if m is None else (m[0] if x.zero else n * m[0], n * m[1])

        out = _widen(Val(total(x.neg), x.zero, total(x.pos)), rel)
    if x.ninf and x.pinf:
        run.flag("nan", node, f"a sum of terms that can be -inf and +inf ({x})")
    mixed = x.neg is not None and x.pos is not None
    big = x.magnitude() * n
    if mixed and big >= CANCEL:
        run.flag("cancel", node, f"a sum of {n} terms of mixed signs up to {x.magnitude():.3g} "
                                 "each: it can cancel to rounding noise")
    out = replace(out, ninf=x.ninf, pinf=x.pinf, nan=x.nan or (x.ninf and x.pinf))
    out = run.overflowed(node, out, f"a sum of {n} terms", x)
    if out.infinite:
        mask = _finite_mask(x)
        out = replace(out, fin=_reduce_mask(mask, node.axis, "all"))
    return out


def _max_over(run: _Run, node: Term, x: Val) -> Val:
    """A max over the axis: one of the elements; -inf only where every element can be."""
    out = replace(x, fin=None)
    if x.ninf and not (x.pinf or x.nan):
        mask = _reduce_mask(_finite_mask(x), node.axis, "any")
        done = bool(mask.array.all())  # some element of every row is finite
        out = replace(out, ninf=False) if done else replace(out, fin=mask)
    elif x.infinite:
        out = replace(out, fin=_reduce_mask(_finite_mask(x), node.axis, "all"))
    return out


def _transfer(run: _Run, node: Term, kids: list[Val]) -> Val:
    op = node.op
    if op is Op.IN:
        name = str(node.attrs[0])
        if name not in run.ranges:
            raise KeyError(f"no range for input {name!r}")
        return run.ranges[name]
    if op in _PASS:
        return kids[0]
    if op is Op.NEG:
        return _neg(kids[0])
    if op in _MONOTONE:
        f, lo, hi = _MONOTONE[op]
        x = kids[0]
        a, b = x.hull()
        out = _clamp(_widen(interval(f(a), f(b))) if not x.empty else x, lo, hi)
        limits = {"ninf": f(-math.inf), "pinf": f(math.inf)}
        extra = [limits[k] for k in limits if getattr(x, k)]
        out = join(out, union_of([(v, v) for v in extra]))
        return replace(out, nan=x.nan, fin=None)
    if op in (Op.SIN, Op.COS):
        if kids[0].ninf or kids[0].pinf:
            run.flag("nan", node, f"{op.value} of a value that can be infinite ({kids[0]})")
        return replace(interval(-1.0, 1.0), nan=kids[0].infinite)
    if op is Op.EXP:
        return _exp(run, node, kids[0])
    if op is Op.LOG:
        return _log(run, node, kids[0])
    if op is Op.SQRT:
        return _sqrt(run, node, kids[0])
    if op is Op.RECIP:
        return _recip(run, node, kids[0])
    if op is Op.RELU:
        return _with_fin(_minmax(kids[0], Val(None, True, None), max), kids[0])
    if op is Op.ABS:
        x = kids[0]
        return replace(join(_neg(Val(x.neg, x.zero, None, x.ninf, False, x.nan)),
                            Val(None, x.zero, x.pos, False, x.pinf, x.nan)), fin=x.fin)
    if op is Op.ADD:
        return _add(run, node, *kids)
    if op is Op.SUB:
        return _sub(run, node, *kids)
    if op is Op.MUL:
        return _mul(run, node, kids[0], kids[1])
    if op is Op.DIV:
        r = _recip(run, node, kids[1], "x / y")
        return _mul(run, node, kids[0], r, "a quotient")
    if op in (Op.MAX, Op.MIN):
        return _with_fin(_minmax(kids[0], kids[1], max if op is Op.MAX else min), *kids)
    if op in COMPARISONS:
        return Val(None, True, (1.0, 1.0))
    if op is Op.WHERE:
        return _where(run, node, kids)
    if op is Op.ZERO:
        return Val(None, True, None)
    if op in (Op.CONST, Op.IDX, Op.NEGINF):  # decided concretely in `analyze`
        raise AssertionError(op)
    if op is Op.READ:
        return _read(node, kids[0])
    if op is Op.GATHER:
        return replace(kids[0], fin=None)
    if op is Op.SUM:
        out = _reduce(run, node, kids[0], node.all_sizes[node.axis])
        body = _strip(node.args[0])
        peak = _peak(run, body.args[0], node.axis) if body.op is Op.EXP else None
        if peak is not None and not kids[0].infinite:
            # the max element contributes exp(peak) (within rounding)
            out = _clamp(out, math.exp(peak[0] - peak[1]) * (1 - REL), math.inf)
        return out
    if op is Op.DOT:
        prod = _mul(run, node, kids[0], kids[1], "a product under the sum")
        return _reduce(run, node, prod, node.all_sizes[node.axis])
    if op is Op.RMAX:
        out = _max_over(run, node, kids[0])
        peak = _peak(run, node.args[0], node.axis)
        if peak is not None and not out.infinite:
            out = _clamp(out, peak[0] - peak[1], peak[0] + peak[1])
        return out
    if op is Op.LSE:
        # computed online with a running max: in [max, max + log n]
        m = _max_over(run, node, kids[0])
        a, b = m.hull()
        out = _widen(interval(a, b + math.log(node.all_sizes[node.axis])))
        return replace(out, ninf=m.ninf, pinf=m.pinf, nan=m.nan or m.pinf, fin=m.fin)
    if op is Op.SOFTMAXAVG:
        # a convex combination of v, computed online; a row whose scores are all -inf
        # averages to 0 (its weights are all 0: kernelsat.interp, codegen, docs/proofs.md)
        s, v = kids
        m = _max_over(run, node, s)
        if s.pinf or s.nan:
            run.flag("nan", node, "a softmax over scores that can be +inf or NaN")
        a, b = v.hull()
        out = _widen(interval(a, b), REL + node.all_sizes[node.axis] * 2.0 ** -23)
        if m.ninf:
            out = join(out, Val(None, True, None))
        return replace(out, nan=v.infinite or s.pinf or s.nan, fin=None)
    raise NotImplementedError(f"floatsafe: no rule for op {op.value}")  # pragma: no cover


_PASS = frozenset({Op.STORE, Op.SPLIT})
"""Ops whose value set is their operand's."""

_MONOTONE: dict[Op, tuple[Callable[[float], float], float, float]] = {
    Op.TANH: (math.tanh, -1.0, 1.0),
    Op.ERF: (math.erf, -1.0, 1.0),
    Op.SIGMOID: (lambda x: 0.5 * (1 + math.tanh(x / 2)) if math.isfinite(x)
                 else float(x > 0), 0.0, 1.0),
    Op.SOFTPLUS: (lambda x: max(x, 0.0) + math.log1p(math.exp(-abs(x)))
                  if math.isfinite(x) else max(x, 0.0), 0.0, math.inf),
}
"""Nondecreasing total functions and the range their float32 values stay in."""


def _minmax(a: Val, b: Val, pick: Callable[[float, float], float]) -> Val:
    out = union_of([(pick(p[0], q[0]), pick(p[1], q[1])) for p in a.pieces() for q in b.pieces()])
    if pick is max:
        extra = ([] if not a.ninf else b.pieces()) + ([] if not b.ninf else a.pieces())
        out = join(out, union_of(extra))
        return replace(out, ninf=a.ninf and b.ninf, pinf=a.pinf or b.pinf, nan=a.nan or b.nan)
    extra = ([] if not a.pinf else b.pieces()) + ([] if not b.pinf else a.pieces())
    out = join(out, union_of(extra))
    return replace(out, ninf=a.ninf or b.ninf, pinf=a.pinf and b.pinf, nan=a.nan or b.nan)


def _where(run: _Run, node: Term, kids: list[Val]) -> Val:
    c, x, y = kids
    cond = run.concrete.get(node.args[0])
    if not c.zero and not c.nan:
        return x
    if c.neg is None and c.pos is None and not c.infinite:
        return y
    out = join(x, y)
    if not out.infinite:
        return out
    mx, my = _finite_mask(x), _finite_mask(y)
    if cond is None:
        return replace(out, fin=_and(mx, my))
    axes = tuple(dict.fromkeys((*cond.axes, *mx.axes, *my.axes)))
    shape = np.broadcast_shapes(*(align_axes(t.array, t.axes, axes).shape
                                  for t in (cond, mx, my)))
    if math.prod(shape) > MASK_CAP:
        return replace(out, fin=None)
    pick = np.where(align_axes(cond.array, cond.axes, axes) != 0,
                    align_axes(mx.array, mx.axes, axes), align_axes(my.array, my.axes, axes))
    return replace(out, fin=Tensor(np.broadcast_to(pick, shape), axes))


def _read(node: Term, x: Val) -> Val:
    m: ReadMap = read_map(node)
    if m.pad is None:
        return replace(x, fin=None) if x.infinite else x
    pad = float(m.pad)
    pv = (Val(None, False, None, ninf=pad < 0) if math.isinf(pad) else interval(pad, pad))
    out = join(x, pv)
    if not out.infinite:
        return out
    src = x.fin if not x.infinite else None
    if x.infinite and src is None:
        return out
    sizes = node.args[0].shape
    axes = tuple(sizes)
    if math.prod(m.sizes.values()) > MASK_CAP:
        return out
    _, valid = read_indices(m, axes, tuple(sizes[a] for a in axes))
    own = tuple(a for a, _ in m.axes)
    if valid is None:
        return out
    if src is not None and src.axes:  # x itself is masked: not tracked through the map
        return out
    return replace(out, fin=Tensor(valid, own))


# -- the analysis -----------------------------------------------------------------------


def analyze(term: Term, ranges: Mapping[str, Val],
            concrete: dict[Term, Tensor | None] | None = None) -> Analysis:
    """Every node's abstract value and the hazards, children before parents. `ranges`
    gives each input's values (`input_ranges`, `data_range`); `concrete` keeps the values
    of input-free subterms between calls (they do not depend on the ranges)."""
    run = _Run(ranges, concrete)
    for node in _nodes(term):
        if node in run.concrete:
            conc = run.concrete[node]
        else:
            kids_c = [run.concrete.get(k) for k in node.args]
            conc = _concrete(run, node, kids_c) if node.op is not Op.IN else None
            run.concrete[node] = conc
        if conc is not None:
            run.values[node] = _from_concrete(conc)
            continue
        if node.op in (Op.CONST, Op.IDX, Op.NEGINF):  # a leaf past MASK_CAP: its bounds
            run.values[node] = _leaf_bounds(node)
            continue
        run.values[node] = _transfer(run, node, [run.values[k] for k in node.args])
    value = run.values[term]
    if value.infinite:
        kinds = [n for n, f in (("-inf", value.ninf), ("+inf", value.pinf),
                                ("NaN", value.nan)) if f]
        run.flag("infinite-output", term, f"the output can be {', '.join(kinds)}")
    return Analysis(value, run.values, _dedup(run.hazards))


def _leaf_bounds(node: Term) -> Val:
    if node.op is Op.IDX:
        return interval(0.0, float(idx_axis(node)[1] - 1))
    if node.op is Op.NEGINF:
        return Val(None, False, None, ninf=True)
    v = float(node.attrs[0])  # type: ignore[arg-type]
    return interval(v, v)


def _dedup(hazards: list[Hazard]) -> list[Hazard]:
    return list(dict.fromkeys(hazards))


# -- judging a candidate against the spec ---------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """Whether a candidate may be proposed: `reason` is "" when it may, else the first
    hazard the spec does not share, and the range it was found on."""

    reason: str
    hazards: tuple[Hazard, ...] = ()

    @property
    def safe(self) -> bool:
        return not self.reason


class Judge:
    """Judges candidates of one spec; the spec is analyzed once per range.

    A candidate is unsafe when, on the check's inputs or on the overflow check's (scaled)
    inputs, it has a hazard of a group (non-finite values; cancellation, judged on the
    check's inputs only, where precision is compared) in which the spec has none there:
    where the spec itself may not be finite, the run-time check compares only where it
    is, and the analysis has no ground to drop anything."""

    def __init__(self, program: Program, stress_scale: float) -> None:
        self.ranges = [("on the check's inputs", input_ranges(program, 1.0), GROUPS),
                       (f"on the overflow check's inputs (scaled by {stress_scale:g})",
                        input_ranges(program, stress_scale), GROUPS[:1])]
        self.concrete: dict[Term, Tensor | None] = {}  # input-free values, every call
        self.spec_groups = [{i for h in analyze(program.term, r, self.concrete).hazards
                             for i, g in enumerate(groups) if h.kind in g}
                            for _, r, groups in self.ranges]

    def __call__(self, term: Term) -> Verdict:
        found = [analyze(term, ranges, self.concrete).hazards for _, ranges, _ in self.ranges]
        for i, group in enumerate(GROUPS):  # non-finite values first: the worse reason
            hits = [(h.kind != "overflow", k, name, h)  # an overflow names the cause
                    for k, ((name, _, groups), spec, hazards)
                    in enumerate(zip(self.ranges, self.spec_groups, found, strict=True))
                    if group in groups and i not in spec
                    for h in hazards if h.kind in group]
            if hits:
                _, _, name, first = min(hits, key=lambda t: t[:2])
                return Verdict(f"float-unsafe {name}: {first}", tuple(t[3] for t in hits))
        return Verdict("")


GROUPS: tuple[frozenset[str], ...] = (
    frozenset({"overflow", "nan", "divide", "log-zero", "infinite-output"}),
    frozenset({"cancel"}),
)
"""The hazard groups `Judge` compares with the spec's: values that are not finite (the
overflow check's business), and cancellation (the numeric check's)."""


def judge(program: Program, term: Term, stress_scale: float) -> Verdict:
    """Whether `term`, a candidate for `program`, is float-unsafe where the spec is not
    (see `Judge`, which keeps the spec's analysis between calls)."""
    return Judge(program, stress_scale)(term)
