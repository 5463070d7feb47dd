"""Symbolic real expressions and the normalizer (part of the trusted base).

`Sym` is a hash-consed real expression: variables, exact rational constants,
n-ary `add`/`mul`/`max`/`min`, `recip`, and applications of the transcendental
functions (`exp log sqrt tanh erf`), plus the domain atoms `gt0 ge0 ne0`. The
constructors put sums and products in a canonical order (associativity and
commutativity of `+ * max min` over the reals), fold constants and cancel `y * (1/y)`
(valid because a `recip(y)` only ever exists where `y != 0` is a recorded domain
condition, see `proofs.verify_sym`).

`normalize` then rewrites with oriented instances of the axioms in
`proofs.axioms` (each rewrite names its axiom), bottom-up, so that z3 sees a
rational identity over fresh positive values instead of quantified axioms:

>>> x, y = var("x"), var("y")
>>> normalize(fn("exp", add(x, mul(const(-1), y)))) is mul(fn("exp", x), recip(fn("exp", y)))
True
>>> normalize(fn("log", fn("exp", x))) is x
True
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from fractions import Fraction
from typing import ClassVar, cast

from kernelsat.ops import UNINTERPRETED

Num = Fraction

AC_OPS = frozenset({"add", "mul", "max", "min"})
FUNCTIONS = frozenset(op.value for op in UNINTERPRETED)
"""The function symbols: the op table's uninterpreted ops."""
BOOL_OPS = frozenset({"gt0", "ge0", "ne0"})


class Sym:
    """One node of a real expression; equal expressions (up to AC order) are one object."""

    __slots__ = ("args", "op", "serial", "value")
    _table: ClassVar[dict[tuple[object, ...], Sym]] = {}
    _serials = itertools.count()

    op: str
    args: tuple[Sym, ...]
    value: object
    serial: int

    def __new__(cls, op: str, args: tuple[Sym, ...] = (), value: object = None) -> Sym:
        key = (op, tuple(a.serial for a in args), value)
        hit = cls._table.get(key)
        if hit is not None:
            return hit
        self = object.__new__(cls)
        self.op, self.args, self.value, self.serial = op, args, value, next(cls._serials)
        cls._table[key] = self
        return self

    @classmethod
    def reset(cls) -> None:
        """Forget every node but the constants 0 and 1 (call between independent
        verifications: bounds memory and makes the canonical order reproducible). A node
        built before a reset must not be used after it."""
        cls._table.clear()
        cls._serials = itertools.count()
        for keep in (ZERO, ONE):
            keep.serial = next(cls._serials)
            cls._table[(keep.op, (), keep.value)] = keep

    def __repr__(self) -> str:
        match self.op:
            case "var":
                return str(self.value)
            case "const":
                return str(self.value)
            case "add" | "mul":
                sep = " + " if self.op == "add" else "*"
                return "(" + sep.join(map(repr, self.args)) + ")"
            case "ite":
                c, a, b = self.args
                return f"({c} ? {a} : {b})"
            case _:
                inner = ", ".join(map(repr, self.args))
                return f"{self.value if self.op == 'fn' else self.op}({inner})"


# -- canonicalizing constructors ----------------------------------------------------


def var(name: str) -> Sym:
    return Sym("var", (), name)


def const(value: float | int | Fraction) -> Sym:
    return Sym("const", (), Fraction(value))


ZERO, ONE = const(0), const(1)


def is_const(s: Sym, value: int | None = None) -> bool:
    return s.op == "const" and (value is None or s.value == value)


def _flatten(op: str, xs: Iterable[Sym]) -> list[Sym]:
    out: list[Sym] = []
    for x in xs:
        out.extend(x.args if x.op == op else (x,))
    return out


def add(*xs: Sym) -> Sym:
    """Sum, flattened and sorted; constants folded; zero dropped."""
    terms = _flatten("add", xs)
    c = sum((Fraction(cast(Fraction, t.value)) for t in terms if t.op == "const"), Fraction(0))
    rest = sorted((t for t in terms if t.op != "const"), key=lambda t: t.serial)
    if c == 0 and len(rest) > 1:
        common = _common_factors(rest)
        if common:
            return mul(*common, add(*(_divide_out(t, common) for t in rest)))
    if c != 0 or not rest:
        rest = [const(c), *rest]
    return rest[0] if len(rest) == 1 else Sym("add", tuple(rest))


def _factors(t: Sym) -> list[Sym]:
    return [f for f in (t.args if t.op == "mul" else (t,)) if f.op != "const"]


def _common_factors(terms: list[Sym]) -> list[Sym]:
    """The non-constant factors every term shares (as a multiset): `a*x + a*y = a*(x + y)`."""
    common = _factors(terms[0])
    for t in terms[1:]:
        fs = _factors(t)
        keep = []
        for f in common:
            if f in fs:
                fs.remove(f)
                keep.append(f)
        common = keep
        if not common:
            break
    return common


def _divide_out(t: Sym, common: list[Sym]) -> Sym:
    factors = list(t.args) if t.op == "mul" else [t]
    for f in common:
        factors.remove(f)
    return mul(*factors) if factors else ONE


def mul(*xs: Sym) -> Sym:
    """Product, flattened and sorted; constants folded; `y * recip(y)` cancelled; a
    constant factor distributed over a single sum (so `-(a + b)` is `-a + -b`)."""
    factors = _flatten("mul", xs)
    c = Fraction(1)
    rest: list[Sym] = []
    for f in factors:
        if f.op == "const":
            c *= f.value  # type: ignore[operator]
        else:
            rest.append(f)
    if c == 0:
        return ZERO
    rest = _cancel(rest)
    if len(rest) == 1 and rest[0].op == "add" and c != 1:
        return add(*(mul(const(c), t) for t in rest[0].args))
    rest.sort(key=lambda t: t.serial)
    if c != 1 or not rest:
        rest = [const(c), *rest]
    return rest[0] if len(rest) == 1 else Sym("mul", tuple(rest))


def _cancel(factors: list[Sym]) -> list[Sym]:
    pending = list(factors)
    for f in list(pending):
        if f.op == "recip" and f in pending and f.args[0] in pending:
            pending.remove(f)
            pending.remove(f.args[0])
    return pending


def recip(x: Sym) -> Sym:
    """`1/x`: constants folded (not zero), `recip(recip y) = y`, `recip` of a product is
    the product of the `recip`s."""
    if x.op == "const" and x.value != 0:
        return const(1 / Fraction(cast(Fraction, x.value)))
    if x.op == "recip":
        return x.args[0]
    if x.op == "mul":
        return mul(*(recip(f) for f in x.args))
    return Sym("recip", (x,))


def _lattice(op: str, xs: Iterable[Sym]) -> Sym:
    items = sorted(set(_flatten(op, xs)), key=lambda t: t.serial)
    return items[0] if len(items) == 1 else Sym(op, tuple(items))


def max_(*xs: Sym) -> Sym:
    return _lattice("max", xs)


def min_(*xs: Sym) -> Sym:
    return _lattice("min", xs)


def neg(x: Sym) -> Sym:
    return mul(const(-1), x)


def fn(name: str, x: Sym) -> Sym:
    """An application of a transcendental function (uninterpreted until normalized)."""
    assert name in FUNCTIONS, name
    return Sym("fn", (x,), name)


def gt0(x: Sym) -> Sym:
    return Sym("gt0", (x,))


def ge0(x: Sym) -> Sym:
    return Sym("ge0", (x,))


def ne0(x: Sym) -> Sym:
    return Sym("ne0", (x,))


def ite(cond: Sym, then: Sym, other: Sym) -> Sym:
    """`then` where the atom `cond` (`gt0 ge0 ne0`) holds, else `other`: selection
    (`where`) and the comparisons (`lt(x, y) = ite(gt0(y - x), 1, 0)`). Equal branches
    and a constant condition fold (`where(c, x, x) = x`)."""
    assert cond.op in BOOL_OPS, cond
    if then is other:
        return then
    arg = cond.args[0]
    if arg.op == "const":
        v = cast(Fraction, arg.value)
        holds = v > 0 if cond.op == "gt0" else v >= 0 if cond.op == "ge0" else v != 0
        return then if holds else other
    return Sym("ite", (cond, then, other))


# -- positivity (syntactic, sound) --------------------------------------------------


def positive(s: Sym, pos_vars: frozenset[str]) -> bool:
    """A syntactic proof that `s > 0` wherever it is defined."""
    match s.op:
        case "const":
            return s.value > 0  # type: ignore[operator]
        case "var":
            return s.value in pos_vars
        case "fn":
            return s.value == "exp" or (s.value == "sqrt" and positive(s.args[0], pos_vars))
        case "add" | "mul" | "min":
            return all(positive(a, pos_vars) for a in s.args)
        case "max":
            return any(positive(a, pos_vars) for a in s.args)
        case "recip":
            return positive(s.args[0], pos_vars)
        case "ite":
            return positive(s.args[1], pos_vars) and positive(s.args[2], pos_vars)
    return False


# -- the normalizer -------------------------------------------------------------------


def _exp(a: Sym, pos: frozenset[str]) -> Sym:
    if is_const(a, 0):
        return ONE  # exp-zero
    if a.op == "add":
        return mul(*(_exp(t, pos) for t in a.args))  # exp-add
    if a.op == "mul" and a.args[0].op == "const" and a.args[0].value < 0:  # type: ignore[operator]
        return recip(_exp(neg(a), pos))  # exp-neg
    if a.op == "fn" and a.value == "log":
        return a.args[0]  # exp-log (valid where log's argument is positive: a domain fact)
    if a.op == "max":
        return max_(*(_exp(t, pos) for t in a.args))  # exp-monotone
    if a.op == "min":
        return min_(*(_exp(t, pos) for t in a.args))  # exp-monotone
    return fn("exp", a)


def _log(a: Sym, pos: frozenset[str]) -> Sym:
    if is_const(a, 1):
        return ZERO  # log-one
    if a.op == "fn" and a.value == "exp":
        return a.args[0]  # log-exp
    if a.op == "mul" and all(positive(f, pos) for f in a.args):
        return add(*(_log(f, pos) for f in a.args))  # log-mul
    if a.op == "recip" and positive(a.args[0], pos):
        return neg(_log(a.args[0], pos))  # log-recip
    if a.op in ("max", "min") and all(positive(f, pos) for f in a.args):
        lattice = max_ if a.op == "max" else min_
        return lattice(*(_log(f, pos) for f in a.args))  # log-monotone
    return fn("log", a)


REBUILD: dict[str, Callable[..., Sym]] = {
    "add": add,
    "mul": mul,
    "max": max_,
    "min": min_,
    "recip": recip,
    "gt0": gt0,
    "ge0": ge0,
    "ne0": ne0,
    "ite": ite,
}


def normalize(s: Sym, pos_vars: frozenset[str] = frozenset(),
              memo: dict[int, Sym] | None = None) -> Sym:
    """`s` rewritten bottom-up by the oriented axiom instances (see module doc).
    `pos_vars` are variables known positive (from `(positive ?x)` conditions)."""
    memo = {} if memo is None else memo
    stack: list[tuple[Sym, bool]] = [(s, False)]
    while stack:
        node, ready = stack.pop()
        if node.serial in memo:
            continue
        if not ready:
            stack.append((node, True))
            stack.extend((a, False) for a in node.args if a.serial not in memo)
            continue
        args = tuple(memo[a.serial] for a in node.args)
        match node.op:
            case "var" | "const":
                out = node
            case "fn" if node.value == "exp":
                out = _exp(args[0], pos_vars)
            case "fn" if node.value == "log":
                out = _log(args[0], pos_vars)
            case "fn":
                out = fn(str(node.value), args[0])
            case op:
                out = REBUILD[op](*args)
        memo[node.serial] = out
    return memo[s.serial]
