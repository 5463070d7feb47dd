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
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # defined in codegen/flash.py (which imports this module)
    from kernelsat.codegen.flash import FlashAttention


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
class Label:
    """A gather's data-dependent index term (issue 18 part 3b): `stride` times the integer
    `buf[index]` (an int32 input), checked to lie in [0, bound) at run time: outside it the
    renderer records (`slot`, the flat position, the value, the bound) in an error flag
    and reads element 0 instead, so nothing outside a buffer is ever read. With `value`
    (a `Ref` to the `gather_check` call lowering placed where the label's axes are bound:
    once per row, not per element) the index term is that value, already checked."""

    buf: str
    index: Affine
    bound: int
    stride: int
    slot: int
    value: Expr | None = None


@dataclass(frozen=True, slots=True)
class Load:
    """An element of an input or intermediate buffer. A padded affine read (issue 18
    part 1) carries a `guard`: (index form, extent) pairs that must all lie in
    [0, extent) for the element to be read, else the value is `pad` (the load is not
    performed: renderers test the guard first). A gather (issue 18 part 3b) adds its
    `labels` to the index."""

    buf: str
    index: Affine
    guard: tuple[tuple[Affine, int], ...] = ()
    pad: float = 0.0
    labels: tuple[Label, ...] = ()


@dataclass(frozen=True, slots=True)
class IndexValue:
    """The value of an integer index expression as a float (an `Idx` leaf: a position)."""

    index: Affine


@dataclass(frozen=True, slots=True)
class Call:
    """An elementwise op (an `Op` value such as "exp", or "select_gt": a > b ? c : d)."""

    op: str
    args: tuple[Expr, ...]


type Expr = Lit | Ref | Load | Call | IndexValue

VARIANT_OF: dict[str, str] = {"exp_nonpos": "exp"}
"""Calls that compute an op's value by a cheaper method valid on a restricted domain,
and the op: `exp_nonpos` is the exp of an argument the lowering proved at most 0 (or
NaN): no overflow handling, one exponent factor (`ks_exp_nonpos` in the C prelude).
Interpreters and cost models read such a call as its op."""


@dataclass(frozen=True, slots=True)
class Let:
    """`float name = expr;` (a fresh scalar; `mutable` ones are later `Assign`ed)."""

    name: str
    expr: Expr
    mutable: bool = False


@dataclass(frozen=True, slots=True)
class Array:
    """`float name[size];` with every element set to `init` (`fill=False`: left unset,
    for a row that a pass writes in full before anything reads it)."""

    name: str
    size: int
    init: float
    fill: bool = True


@dataclass(frozen=True, slots=True)
class Assign:
    target: Ref
    expr: Expr


@dataclass(frozen=True, slots=True)
class Write:
    """`buf[index] = expr;`. `stream`: a non-temporal store (knob `nt`, codegen/stream.py:
    set only on a loop's one contiguous store; renderers without streaming ignore it)."""

    buf: str
    index: Affine
    expr: Expr
    stream: bool = False


@dataclass(frozen=True, slots=True)
class Loop:
    """`for var in [0, extent)`. kind: "parallel" (an output-axis loop, may be threaded),
    "tile" (intra-tile output loop), "reduce" (a reduction axis), "vector" (a loop over
    the lanes or the vector accumulators inside a reduction), "simd" (a reduction's lane loop
    that C marks `#pragma omp simd`), "serial" (anything else)."""

    var: str
    extent: int
    body: tuple[Stmt, ...]
    kind: str
    axis: str = ""  # the IR axis it iterates (for printing only, never rendered as code)


@dataclass(frozen=True, slots=True)
class Gemm:
    """A blocked contraction with an elementwise epilogue, for every (mvar, nvar) in
    [0, m) x [0, n) (inside whatever loops enclose it):

        acc = sum over kvar in [0, k) of a * b;  epilogue;  write

    `a` is A's element at (mvar, kvar) and `b` B's at (kvar, nvar): the coefficients of
    those variables in their indexes are the operands' strides, the rest of the index
    (enclosing loop variables, a constant) is the operand's base. `epilogue` (`Let`s)
    reads `Ref(acc)`, loop variables and buffers; `write` stores the result. The
    schedule (BLIS structure, see codegen/gemm.py): register tile `mr` x `nr` (`nr` a
    multiple of the vector width `vw`), cache blocks `kc` (reduction), `mc`, `nc`;
    `par`: the threads (OpenMP) of the GEMM split its m range ("m") or its n range
    ("n"), or it runs on the calling thread (""). `axes`: the IR axes of (m, n, k),
    for printing. `expand()` is the same computation as plain loops. `more`: further
    contractions (x_i, acc_i) that share one operand with the first (a multi-contraction:
    the epilogue reads every accumulator): with `shared` "a", acc_i = sum over kvar of
    a * x_i (x_i indexed like `b`); with "b", of x_i * b (x_i indexed like `a`)."""

    m: int
    n: int
    k: int
    mvar: str
    nvar: str
    kvar: str
    a: Load
    b: Load
    acc: str
    epilogue: tuple[Stmt, ...]
    write: Write
    mr: int = 8
    nr: int = 32
    kc: int = 256
    mc: int = 128
    nc: int = 1024
    vw: int = 16
    par: str = "m"
    axes: tuple[str, str, str] = ("", "", "")
    more: tuple[tuple[Load, str], ...] = ()
    shared: str = "a"

    def expand(self) -> tuple[Stmt, ...]:
        """The plain loop nest of this contraction (for renderers without a GEMM)."""
        pairs = ((self.a, self.b, self.acc), *(
            (self.a, x, acc) if self.shared == "a" else (x, self.b, acc) for x, acc in self.more))
        steps = tuple(Assign(Ref(acc), Call("add", (Ref(acc), Call("mul", (a, b)))))
                      for a, b, acc in pairs)
        body: tuple[Stmt, ...] = (
            *(Let(acc, Lit(0.0), mutable=True) for _, _, acc in pairs),
            Loop(self.kvar, self.k, steps, "reduce", self.axes[2]),
            *self.epilogue,
            self.write,
        )
        inner = Loop(self.nvar, self.n, body, "parallel", self.axes[1])
        return (Loop(self.mvar, self.m, (inner,), "parallel", self.axes[0]),)


type Stmt = Let | Array | Assign | Write | Loop | Gemm | FlashAttention


def expand_gemms(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    """`body` with every `Gemm` and `FlashAttention` (at any depth) replaced by its
    `expand()`."""
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Loop):
            out.append(Loop(s.var, s.extent, expand_gemms(s.body), s.kind, s.axis))
        elif isinstance(s, Let | Array | Assign | Write):
            out.append(s)
        else:
            out.extend(s.expand())
    return tuple(out)


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
        case Load(buf, idx, guard, pad, labels) if guard:
            conds = " && ".join(f"{g.render()} in [0, {n})" for g, n in guard)
            return f"({conds} ? {buf}[{label_text(idx, labels)}] : {expr_text(Lit(pad))})"
        case Load(buf, idx, _, _, labels):
            return f"{buf}[{label_text(idx, labels)}]"
        case Call(op, args):
            return f"{op}({', '.join(expr_text(a) for a in args)})"
        case IndexValue(idx):
            return f"float({idx.render()})"


def label_text(idx: Affine, labels: tuple[Label, ...]) -> str:
    """A load's index with its gathers: `i*4 + 4*label(in1[b], 10)`."""
    parts = [idx.render()] + [
        f"{lb.stride}*label({lb.buf}[{lb.index.render()}], {lb.bound})" if lb.value is None
        else f"{lb.stride}*long({expr_text(lb.value)})" for lb in labels]
    return " + ".join(parts)


def stmt_lines(s: Stmt, depth: int) -> list[str]:
    """Readable pseudo-code of a statement, indented by `depth`."""
    pad = "  " * depth
    match s:
        case Let(name, expr, mutable):
            return [f"{pad}{'var' if mutable else 'let'} {name} = {expr_text(expr)}"]
        case Array(name, size, init, fill):
            return [f"{pad}array {name}[{size}]" + (f" = {expr_text(Lit(init))}" if fill else "")]
        case Assign(target, expr):
            return [f"{pad}{expr_text(target)} = {expr_text(expr)}"]
        case Write(buf, idx, expr, stream):
            return [f"{pad}{buf}[{idx.render()}] = {expr_text(expr)}"
                    + ("  # streamed" if stream else "")]
        case Loop(var, extent, body, kind, axis):
            head = f"{pad}for {var} in 0..{extent} {kind}" + (f"  # {axis}" if axis else "")
            return [head] + [line for b in body for line in stmt_lines(b, depth + 1)]
        case Gemm():
            ma, na, ka = s.axes
            knobs = (f"mr={s.mr} nr={s.nr} kc={s.kc} mc={s.mc} nc={s.nc} vw={s.vw}"
                     f"{' par=' + s.par if s.par else ''}")
            head = (f"{pad}gemm {s.mvar} in 0..{s.m}, {s.nvar} in 0..{s.n}: "
                    f"{s.acc} = sum {s.kvar} in 0..{s.k} of "
                    f"{expr_text(s.a)} * {expr_text(s.b)}"
                    + "".join(f", {acc} = ... of " + (f"{expr_text(s.a)} * {expr_text(x)}"
                                                      if s.shared == "a" else
                                                      f"{expr_text(x)} * {expr_text(s.b)}")
                              for x, acc in s.more)
                    + f"  # {ma} {na} {ka}; {knobs}")
            return [head] + [line for b in (*s.epilogue, s.write)
                             for line in stmt_lines(b, depth + 1)]
        case _:  # FlashAttention
            return s.lines(depth)


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
