"""The loop-nest IR that lowering produces and every renderer reads.

Index expressions are affine (`Affine`: sum of coefficient * loop variable plus a
constant); values are float expressions (`Lit`, `Ref`, `Load`, `Call`); statements are
`Let` (define a scalar), `Array` (a local accumulator array), `Assign` (update a scalar
or an array element), `Write` (store into a buffer) and `Loop`. All identifiers are
generated (`ax3`, `t7`, `acc2`, `in0`, `buf1`, `out`), never taken from user input.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Affine:
    """`sum(coef * var) + const` over loop variables, with integer coefficients."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0

    @staticmethod
    def var(name: str) -> Affine:
        return Affine(((name, 1),))

    def __add__(self, other: Affine) -> Affine:
        coefs: dict[str, int] = dict(self.terms)
        for v, c in other.terms:
            coefs[v] = coefs.get(v, 0) + c
        return Affine(tuple((v, c) for v, c in coefs.items() if c), self.const + other.const)

    def scale(self, k: int) -> Affine:
        return Affine(tuple((v, c * k) for v, c in self.terms), self.const * k)

    @property
    def vars(self) -> frozenset[str]:
        return frozenset(v for v, _ in self.terms)

    def render(self) -> str:
        parts = [v if c == 1 else f"{v}*{c}" for v, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


@dataclass(frozen=True, slots=True)
class Lit:
    """A float constant (may be +-inf)."""

    value: float


@dataclass(frozen=True, slots=True)
class Ref:
    """A scalar variable (`index is None`) or an element of a local array."""

    name: str
    index: Affine | None = None


@dataclass(frozen=True, slots=True)
class Load:
    """An element of an input or intermediate buffer."""

    buf: str
    index: Affine


@dataclass(frozen=True, slots=True)
class Call:
    """An elementwise op (an `Op` value such as "exp", or "select_gt": a > b ? c : d)."""

    op: str
    args: tuple[Expr, ...]


type Expr = Lit | Ref | Load | Call


@dataclass(frozen=True, slots=True)
class Let:
    """`float name = expr;` (a fresh scalar; `mutable` ones are later `Assign`ed)."""

    name: str
    expr: Expr
    mutable: bool = False


@dataclass(frozen=True, slots=True)
class Array:
    """`float name[size];` with every element set to `init`."""

    name: str
    size: int
    init: float


@dataclass(frozen=True, slots=True)
class Assign:
    target: Ref
    expr: Expr


@dataclass(frozen=True, slots=True)
class Write:
    buf: str
    index: Affine
    expr: Expr


@dataclass(frozen=True, slots=True)
class Loop:
    """`for var in [0, extent)`. kind: "parallel" (an output-axis loop, may be threaded),
    "tile" (intra-tile output loop), "reduce" (a reduction axis), "vector" (a loop over
    the lanes or the vector accumulators inside a reduction), "serial" (anything else)."""

    var: str
    extent: int
    body: tuple[Stmt, ...]
    kind: str
    axis: str = ""  # the IR axis it iterates (for printing only, never rendered as code)


type Stmt = Let | Array | Assign | Write | Loop


def expr_text(e: Expr) -> str:
    """Readable pseudo-code of an expression (for `str(lowered)` and golden files)."""
    match e:
        case Lit(v):
            return repr(v) if math.isfinite(v) else ("-inf" if v < 0 else "inf")
        case Ref(name, None):
            return name
        case Ref(name, idx):
            assert idx is not None
            return f"{name}[{idx.render()}]"
        case Load(buf, idx):
            return f"{buf}[{idx.render()}]"
        case Call(op, args):
            return f"{op}({', '.join(expr_text(a) for a in args)})"


def stmt_lines(s: Stmt, depth: int) -> list[str]:
    """Readable pseudo-code of a statement, indented by `depth`."""
    pad = "  " * depth
    match s:
        case Let(name, expr, mutable):
            return [f"{pad}{'var' if mutable else 'let'} {name} = {expr_text(expr)}"]
        case Array(name, size, init):
            return [f"{pad}array {name}[{size}] = {expr_text(Lit(init))}"]
        case Assign(target, expr):
            return [f"{pad}{expr_text(target)} = {expr_text(expr)}"]
        case Write(buf, idx, expr):
            return [f"{pad}{buf}[{idx.render()}] = {expr_text(expr)}"]
        case Loop(var, extent, body, kind, axis):
            head = f"{pad}for {var} in 0..{extent} {kind}" + (f"  # {axis}" if axis else "")
            return [head] + [line for b in body for line in stmt_lines(b, depth + 1)]


def walk_calls(e: Expr) -> list[Call]:
    """Every `Call` in an expression (preorder)."""
    match e:
        case Call(_, args):
            return [e] + [c for a in args for c in walk_calls(a)]
        case _:
            return []


def stmt_exprs(s: Stmt) -> list[Expr]:
    match s:
        case Let(_, expr, _) | Assign(_, expr) | Write(_, _, expr):
            return [expr]
        case _:
            return []
