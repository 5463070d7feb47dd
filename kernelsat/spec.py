"""The spec language: kernels in index notation, one statement a line (`.ks` files).

    kernel attention(B=1, H=8, N=1024, D=64)
    in  Q[b:B, h:H, i:N, d:D] f32
    in  K[b:B, h:H, n:N, d:D] f32
    in  V[b:B, h:H, n:N, e:D] f32
    S[b,h,i,n] = sum(d: Q[b,h,i,d] * K[b,h,n,d]) / sqrt(D)
    P[b,h,i,n] = softmax(n: S[b,h,i,n])
    out O[b,h,i,e] = sum(n: P[b,h,i,n] * V[b,h,n,e])

Parsing runs in three passes: read every line into a statement (syntax, in
`kernelsat.spec_syntax`), fix the size of every axis name (one size per name in a
kernel; packed-dim groups infer at most one size by division), then build the term
statement by statement. Every
named intermediate is wrapped in `Store`, so the parsed term is the eager,
one-kernel-per-statement baseline; the `out` statement's term is the program's.
Every error is a `SpecError` naming the file, line and column.

>>> p = parse_spec('''
... kernel rowsum(M=4, N=8)
... in X[i:M, j:N] f32
... out Y[i] = sum(j: X[i, j])
... ''')
>>> p.name, p.out_axes, dict(p.term.shape)
('rowsum', ('i',), {'i': 4})
>>> from kernelsat.sexpr import to_sexpr
>>> to_sexpr(p.term)
'(Sum j (In X i:4 j:8))'
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from kernelsat import ir
from kernelsat.gather import INT_DTYPES
from kernelsat.ir import MAX_DEPTH, MAX_SIZE, Const, Dim, ShapeError, Term, postorder, term_depth
from kernelsat.macros import (
    CAT,
    ELEMENTWISE,
    FUNCTION_NAMES,
    REDUCTIONS,
    MacroArgumentError,
    concat,
    integer_exponent,
    power,
)
from kernelsat.ops import OPS, Op
from kernelsat.ops import REDUCTIONS as BINDERS
from kernelsat.program import InputDecl, Program
from kernelsat.spec_gather import gather_sizes, input_use, intermediate_use
from kernelsat.spec_syntax import (
    DTYPE_BYTES,
    ROLES,
    AffineIndex,
    AssignStmt,
    Axis,
    AxisStmt,
    Bin,
    Call,
    Expr,
    GatherIndex,
    Group,
    InStmt,
    KernelStmt,
    Loc,
    Neg,
    Num,
    Ref,
    SizeArith,
    SizeExpr,
    SliceIndex,
    SpecError,
    Stmt,
    expr_children,
    read_source,
    read_statements,
    walk_expr,
)
from kernelsat.work import term_flops

__all__ = [
    "DTYPE_BYTES",
    "ROLES",
    "Intermediate",
    "ParsedSpec",
    "SpecError",
    "analyze_spec",
    "eager_kernels",
    "load_spec",
    "min_bytes",
    "output_dtype",
    "parse_params",
    "parse_spec",
    "read_source",
    "read_statements",
    "term_flops",
]

# -- building -----------------------------------------------------------------------

_BINARY = {info.infix: op for op, info in OPS.items() if info.infix and info.arity == 2}
"""The op of each binary operator (`x + y`), from the op table's `OpInfo.infix`."""

_COMPARE: dict[str, tuple[Op, bool]] = {
    "<": (Op.LT, False), "<=": (Op.LE, False), ">": (Op.LT, True), ">=": (Op.LE, True),
    "==": (Op.EQ, False), "!=": (Op.NE, False)}
"""The op of each comparison operator and whether its operands swap (`x > y` is
`lt(y, x)`): 1.0 where it holds, else 0.0."""

INF_NAME = "inf"
"""The name of infinity in value position (`-inf` is the masked score `NegInf`)."""


@dataclass(frozen=True)
class Intermediate:
    """A named statement: its axes (the layout) and its `Store` node."""

    name: str
    axes: tuple[str, ...]
    store: Term
    line: int


@dataclass(frozen=True)
class ParsedSpec:
    """A program plus what the parser knows about its intermediates (for `show`)."""

    program: Program
    intermediates: tuple[Intermediate, ...]


class _Builder:
    def __init__(self, stmts: list[Stmt], text: str, path: str,
                 overrides: Mapping[str, object] | None):
        self.stmts, self.text, self.path = stmts, text, path
        self.sizes: dict[str, tuple[int, Loc]] = {}
        self.inputs: dict[str, InStmt] = {}
        self.input_sizes: dict[str, tuple[int, ...]] = {}
        self.defined: dict[str, AssignStmt] = {}
        self.inter: dict[str, Intermediate] = {}
        self.declared: dict[str, int] = {}  # `axis h:SIZE` statements (affine reads)
        self.fresh = 0
        self.depths: dict[Term, int] = {}
        self.kernel = self._kernel_stmt()
        self.params = self._params(overrides)

    def err(self, loc: Loc, what: str, expected: str) -> SpecError:
        return SpecError(self.path, loc[0], loc[1], what, expected)

    # kernel line and parameters
    def _kernel_stmt(self) -> KernelStmt:
        if not self.stmts:
            raise self.err((1, 1), "an empty spec", "a first line 'kernel NAME(PARAM=SIZE, ...)'")
        first = self.stmts[0]
        if not isinstance(first, KernelStmt):
            raise self.err(first.loc, "the spec does not start with a kernel line",
                           "'kernel NAME(PARAM=SIZE, ...)' first")
        for s in self.stmts[1:]:
            if isinstance(s, KernelStmt):
                raise self.err(s.loc, "a second kernel line", "one kernel per file")
        return first

    def _params(self, overrides: Mapping[str, object] | None) -> dict[str, int]:
        params: dict[str, int] = {}
        for name, value, loc in self.kernel.params:
            if name in params:
                raise self.err(loc, f"parameter {name} defined twice", "distinct parameter names")
            if value > MAX_SIZE:
                raise self.err(loc, f"parameter {name}={value} is over the largest supported "
                               "size 2^48", f"a size of at most {MAX_SIZE}")
            params[name] = value
        for name, given in (overrides or {}).items():
            if name not in params:
                known = ", ".join(params) or "none"
                raise self.err(self.kernel.loc, f"unknown parameter {name!r} in the overrides",
                               f"one of the kernel's parameters ({known})")
            if isinstance(given, bool) or not isinstance(given, int):
                raise self.err(self.kernel.loc, f"parameter {name}={given!r} is not an integer",
                               "a positive integer")
            value = given
            if value < 1:
                raise self.err(self.kernel.loc, f"parameter {name}={value} is not positive",
                               "a positive integer")
            if value > MAX_SIZE:
                raise self.err(self.kernel.loc, f"parameter {name}={value} (-p {name}=...) is "
                               "over the largest supported size 2^48",
                               f"a size of at most {MAX_SIZE}")
            params[name] = value
        return params

    def size_of(self, s: SizeExpr) -> int:
        total = 1
        for f, loc in s.factors:
            if isinstance(f, int):
                if f < 1:
                    raise self.err(loc, f"size {f} is not positive", "a positive size")
                total *= f
            elif f in self.params:
                total *= self.params[f]
            else:
                raise self.err(loc, f"unknown size parameter {f!r}",
                               f"one of the kernel's parameters ({', '.join(self.params)})")
            if total > MAX_SIZE:
                raise self.err(loc, f"size {total} is over the largest supported size 2^48",
                               f"a size of at most {MAX_SIZE}")
        return total

    def check_size(self, term: Term, loc: Loc) -> None:
        """Every value and iteration space within `MAX_SIZE` elements (an input's total
        too: its dims are checked one by one)."""
        sizes = dict(term.shape)
        for c in term.args:
            sizes.update(c.shape)
        n = math.prod(sizes.values())
        if n > MAX_SIZE:
            shape = " x ".join(f"{a}:{s}" for a, s in sizes.items())
            raise self.err(loc, f"{n} elements in one value or loop nest ({shape}), over the "
                           "largest supported 2^48", f"at most {MAX_SIZE} elements")

    # pass 2: declarations and axis sizes
    def declare(self) -> None:
        for s in self.stmts:
            if isinstance(s, InStmt | AssignStmt):
                prev = self.inputs.get(s.name) or self.defined.get(s.name)
                if prev is not None or s.name in self.params:
                    where = f" (line {prev.loc[0]})" if prev else " (a size parameter)"
                    raise self.err(s.loc, f"{s.name} is defined twice{where}", "a fresh name")
                if s.name in FUNCTION_NAMES:
                    raise self.err(s.loc, f"{s.name} is a function name", "another name")
            if isinstance(s, InStmt):
                self.inputs[s.name] = s
                seen: set[str] = set()
                for d in s.dims:
                    for name, loc in ([(m, ml) for m, _, ml in d.group] if d.group
                                      else [(d.name, d.loc)]):
                        if name in seen:
                            raise self.err(loc, f"dim {name} declared twice",
                                           "distinct dim names")
                        seen.add(name)
                self.input_sizes[s.name] = tuple(self.size_of(d.size) for d in s.dims)
            elif isinstance(s, AssignStmt):
                self.defined[s.name] = s
        outs = [s for s in self.stmts if isinstance(s, AssignStmt) and s.is_out]
        if not outs:
            last = len(self.text.splitlines()) or 1
            raise self.err((last, 1), "no out statement", "one 'out NAME[axes] = ...'")
        if len(outs) > 1:
            raise self.err(outs[1].loc, f"a second out statement (the first is line "
                           f"{outs[0].loc[0]})", "exactly one out statement")

    def bind(self, axis: str, size: int, loc: Loc) -> None:
        old = self.sizes.get(axis)
        if old is None:
            self.sizes[axis] = (size, loc)
        elif old[0] != size:
            raise self.err(loc, f"axis {axis!r} has size {size} here but {old[0]} at "
                           f"{old[1][0]}:{old[1][1]}", "one size per axis name in a kernel")

    def input_uses(self) -> Iterator[tuple[Ref, InStmt]]:
        for s in self.stmts:
            if isinstance(s, AssignStmt):
                for e in walk_expr(s.expr):
                    if isinstance(e, Ref) and e.name in self.inputs:
                        yield e, self.inputs[e.name]

    def collect_sizes(self) -> None:
        self.declare_axes()
        groups: list[tuple[Group, int]] = []
        ones: list[tuple[str, Loc]] = []  # size-1 dims: they broadcast (`use_input`)
        for ref, decl in self.input_uses():
            if ref.index is None:  # a bare use reads the declared dim names
                for d, size in zip(decl.dims, self.input_sizes[ref.name], strict=True):
                    if d.group:  # a packed dim declared `(h:H, d:D)`: its axes
                        for name, msize, loc in d.group:
                            self.bind(name, self.size_of(msize), loc)
                    elif size == 1:
                        ones.append((d.name, ref.loc))
                    else:
                        self.bind(d.name, size, ref.loc)
                continue
            if len(ref.index) != len(decl.dims):
                raise self.err(ref.loc, f"{ref.name} has {len(decl.dims)} dims but is indexed "
                               f"with {len(ref.index)}",
                               f"{ref.name}[{', '.join(d.name for d in decl.dims)}]")
            for item, size, d in zip(ref.index, self.input_sizes[ref.name], decl.dims,
                                     strict=True):
                if isinstance(item, SliceIndex):  # binds its axis (`slice_range`)
                    self.slice_range(item, d.name, size, ref.name)
                    continue
                if isinstance(item, GatherIndex):  # gathers (issue 18 part 3b)
                    gather_sizes(self, item)
                    continue
                if isinstance(item, AffineIndex) or (isinstance(item, Axis)
                                                     and item.name in self.declared):
                    continue  # affine reads: sized by declarations and other uses
                if isinstance(item, Axis) and size == 1:
                    ones.append((item.name, item.loc))
                    continue
                if isinstance(item, Axis):
                    self.bind(item.name, size, item.loc)
                    continue
                groups.append((item, size))
                for a in item.axes:
                    if a.size is not None:
                        self.bind(a.name, self.size_of(a.size), a.loc)
        one_axes = {axis: loc for axis, loc in ones}
        for group, packed in groups:
            unknown = [a for a in group.axes if a.name not in self.sizes]
            if len(unknown) > 1:  # axes seen only on size-1 dims elsewhere are size 1
                for a in unknown:
                    if a.name in one_axes:
                        self.bind(a.name, 1, one_axes[a.name])
            self.infer_group(group, packed)
        for axis, loc in ones:  # an axis bound only to size-1 dims has size 1
            if axis not in self.sizes:
                self.bind(axis, 1, loc)

    def slice_range(self, item: SliceIndex, dim: str, n: int, what: str
                    ) -> tuple[str, int, int, int]:
        """A slice `START:STOP:STEP` of `what`'s dim `dim` (size `n`): its axis (the
        slice's name, else the dim's), first index, size and step; the axis is bound to
        the size. Errors: a bound outside 0..n, an empty slice, a step below 1."""
        start = 0 if item.start is None else self.arith_size(item.start)
        stop = n if item.stop is None else self.arith_size(item.stop)
        step = 1 if item.step is None else self.arith_size(item.step)
        where = f"slice {item.text} of {what} (dim {dim}, size {n})"
        if step < 1:
            raise self.err(item.loc, f"{where} has step {step}", "a positive step")
        if not 0 <= start <= n or not 0 <= stop <= n:
            raise self.err(item.loc, f"{where} reaches outside 0..{n}: {start}:{stop}",
                           f"bounds inside the dim, 0 <= START <= STOP <= {n}")
        if stop <= start:
            raise self.err(item.loc, f"{where} is empty ({start}:{stop})",
                           "START < STOP")
        axis = item.name or dim
        if axis.startswith("("):
            raise self.err(item.loc, f"{where}: a packed dim's slice needs a name",
                           f"a named slice, e.g. {what}[..., j={item.text}]")
        size = len(range(start, stop, step))
        old = self.sizes.get(axis)
        if item.name is None and old is not None and old[0] != size:
            raise self.err(item.loc, f"{where} has {size} elements, but its axis {axis} "
                           f"(the dim's name) has size {old[0]} at {old[1][0]}:{old[1][1]}",
                           f"a named slice for a new axis, e.g. {what}[..., {axis}2={item.text}]")
        self.bind(axis, len(range(start, stop, step)), item.loc)
        return axis, start, len(range(start, stop, step)), step

    def infer_group(self, group: Group, packed: int) -> None:
        unknown = [a for a in group.axes if a.name not in self.sizes]
        if len(unknown) > 1:
            names = ", ".join(a.name for a in unknown)
            raise self.err(unknown[0].loc, f"cannot infer the sizes of {names} in this group",
                           "sizes for all but one axis, e.g. (h:H, d)")
        known = math.prod(self.sizes[a.name][0] for a in group.axes if a.name in self.sizes)
        if unknown:
            if packed % known:
                raise self.err(group.loc, f"the group's known sizes ({known}) do not divide "
                               f"the packed dim ({packed})", "sizes whose product is the dim")
            self.bind(unknown[0].name, packed // known, unknown[0].loc)
        elif known != packed:
            raise self.err(group.loc, f"the group's sizes multiply to {known}, but the packed "
                           f"dim has size {packed}", "sizes whose product is the dim")

    # pass 3: terms
    def make(self, loc: Loc, fn: Callable[..., Term], *args: object, **kw: object) -> Term:
        try:
            return fn(*args, **kw)
        except ShapeError as e:
            first = str(e).splitlines()[0]
            raise self.err(loc, f"ill-formed expression: {first}",
                           "operands whose shapes agree") from None

    def expr(self, root: Expr) -> Term:
        """The term of an expression, built bottom-up with an explicit stack (any length
        of sum is fine); a term deeper than `MAX_DEPTH` is an error at its token."""
        done: dict[int, Term] = {}
        stack: list[tuple[Expr, bool]] = [(root, False)]
        while stack:
            e, ready = stack.pop()
            if not ready:
                if isinstance(e, Call):
                    self.check_call(e)  # the call's own errors before its arguments'
                stack.append((e, True))
                stack.extend((c, False) for c in reversed(expr_children(e)))
                continue
            term = self.node(e, [done.pop(id(c)) for c in expr_children(e)])
            self.check_size(term, e.loc)
            depth = term_depth(term, self.depths)
            if depth > MAX_DEPTH:
                raise self.err(e.loc, f"expression nested deeper than {MAX_DEPTH} (this "
                               f"term is {depth} deep, intermediates included)",
                               f"at most {MAX_DEPTH} levels: a sum of many terms as a "
                               "reduction, e.g. sum(k: X[k, i])")
            done[id(e)] = term
        return done[id(root)]

    def node(self, e: Expr, args: list[Term]) -> Term:
        """The term of one expression node whose operands are built."""
        match e:
            case Num():
                return self.make(e.loc, Const, e.value)
            case Neg() if args[0].op is Op.CONST:  # -2^2: the constant -4
                return Const(-float(args[0].attrs[0]))  # type: ignore[arg-type]
            case Neg() if args[0].op is Op.NEG and args[0].args[0].op is Op.NEGINF:
                return ir.NegInf()  # -inf
            case Neg():
                return self.make(e.loc, ir.neg, *args)
            case Bin() if e.op in _COMPARE:
                op, swap = _COMPARE[e.op]
                pair = args[::-1] if swap else args
                return self.make(e.loc, lambda x, y: Term(op, (x, y)), *pair)
            case Bin() if e.op == "^":
                return self.power(e, *args)
            case Bin():
                return self.make(e.loc, lambda x, y: Term(_BINARY[e.op], (x, y)), *args)
            case Ref():
                return self.ref(e)
            case Call():
                return self.call(e, args)

    def ref(self, e: Ref) -> Term:
        if e.name in self.inter:  # plain, or gathered (issue 18 part 3b)
            return intermediate_use(self, self.inter[e.name], e)
        if e.name in self.inputs:  # plain, or gathered by an integer input (issue 18 3b)
            return input_use(self, self.inputs[e.name], e)
        if e.name in self.params:
            if e.index is not None:
                raise self.err(e.loc, f"{e.name} is a size parameter, not a tensor",
                               f"{e.name} alone (a scalar)")
            return Const(float(self.params[e.name]))
        if e.name in self.defined:
            raise self.err(e.loc, f"{e.name} is used before its definition at line "
                           f"{self.defined[e.name].loc[0]}", "statements defined before use")
        if e.name in FUNCTION_NAMES:
            raise self.err(e.loc, f"{e.name} is a function", f"a call {e.name}(...)")
        if e.index is None and e.name in self.sizes:  # an axis as a value: its index
            return ir.Idx(e.name, self.sizes[e.name][0])
        if e.index is None and e.name == INF_NAME:
            return ir.neg(ir.NegInf())
        raise self.err(e.loc, f"unknown name {e.name!r}",
                       "an input, an intermediate defined above, a size parameter, an "
                       "axis (its index as a value) or inf")

    # -- affine reads (issue 18 part 1) -------------------------------------------------
    def declare_axes(self) -> None:
        """`axis h:SIZE` statements: sizes fixed before any use binds them."""
        for s in self.stmts:
            if isinstance(s, AxisStmt):
                for name, tree, loc in s.axes:
                    if name in self.declared:
                        raise self.err(loc, f"axis {name} declared twice", "one size per axis")
                    size = self.arith_size(tree)
                    if size < 1:
                        raise self.err(loc, f"axis {name} has size {size}",
                                       "a positive size")
                    self.bind(name, size, loc)
                    self.declared[name] = size

    def arith_size(self, tree: SizeArith) -> int:
        kind, *rest = tree
        loc = cast(Loc, rest[-1])
        if kind == "num":
            value = cast(int, rest[0])
        elif kind == "name":
            name = cast(str, rest[0])
            if name not in self.params:
                raise self.err(loc, f"unknown size parameter {name!r}",
                               f"one of the kernel's parameters ({', '.join(self.params)})")
            value = self.params[name]
        else:
            x = self.arith_size(cast(SizeArith, rest[0]))
            y = self.arith_size(cast(SizeArith, rest[1]))
            if kind == "/" and (y == 0 or x % y):
                raise self.err(loc, f"size {x} / {y} is not an exact division",
                               "sizes whose divisions are exact, or // to round down (e.g. "
                               "(H + 2*P - K)//S + 1)")
            if kind == "//" and y <= 0:
                raise self.err(loc, f"size {x} // {y} divides by a non-positive number",
                               "a positive divisor")
            value = {"+": x + y, "-": x - y, "*": x * y, "/": x // (y or 1),
                     "//": x // (y or 1)}[str(kind)]
        if value > MAX_SIZE:
            raise self.err(loc, f"size {value} is over the largest supported size 2^48",
                           f"a size of at most {MAX_SIZE}")
        return value

    def is_affine_use(self, e: Ref, sizes: tuple[int, ...]) -> bool:
        """A use read through a `Read`: an affine index, or a declared axis whose size
        differs from the dim it indexes (a window)."""
        return e.index is not None and any(
            isinstance(item, AffineIndex | SliceIndex)
            or (isinstance(item, Axis) and item.name in self.declared
                and self.declared[item.name] != n)
            for item, n in zip(e.index, sizes, strict=False))

    def index_form(self, item: Axis | Group | AffineIndex | SliceIndex, what: str,
                   dim: str, n: int) -> tuple[dict[str, int], int]:
        """The affine form `({axis: coef}, const)` of one index item of a use of `what`
        along its dim `dim` of size `n`."""
        if isinstance(item, SliceIndex):
            axis, start, _, step = self.slice_range(item, dim, n, what)
            return {axis: step}, start
        if isinstance(item, Group):  # a reshape: the group's axes read the dim row-major
            for a in item.axes:
                if a.size is not None:
                    self.bind(a.name, self.size_of(a.size), a.loc)
            self.infer_group(item, n)
            terms: dict[str, int] = {}
            stride = 1
            for a in reversed(item.axes):
                terms[a.name] = stride
                stride *= self.sizes[a.name][0]
            return terms, 0
        pieces = ((item.name, 1, item.loc),) if isinstance(item, Axis) else item.terms
        terms = {}
        const = 0 if isinstance(item, Axis) else item.const
        for name, coef, loc in pieces:
            if name in self.params:
                const += coef * self.params[name]
            elif name in self.sizes:
                terms[name] = terms.get(name, 0) + coef
            else:
                raise self.err(loc, f"axis {name!r} has no size (it appears only in index "
                               "expressions)", f"a declaration 'axis {name}:SIZE' or a plain "
                               f"use that binds it")
        return terms, const

    def affine_read(self, e: Ref, x: Term,
                    sources: list[tuple[Axis | Group | AffineIndex | SliceIndex, str, str,
                                        int]],
                    pad: float | None) -> Term:
        """`x` read at the use's index forms; `sources` gives per axis of `x` its index
        item, the axis, the dim's name and its size."""
        forms: dict[str, tuple[dict[str, int], int]] = {}
        sizes: dict[str, int] = {}
        for item, src, dim, n in sources:
            terms, const = self.index_form(item, e.name, dim, n)
            forms[src] = (terms, const)
            sizes.update({a: self.sizes[a][0] for a in terms})
            lo = const + sum(c * (sizes[a] - 1) for a, c in terms.items() if c < 0)
            hi = const + sum(c * (sizes[a] - 1) for a, c in terms.items() if c > 0)
            if pad is None and (lo < 0 or hi >= n):
                assert isinstance(item, AffineIndex | Axis)  # slices and groups fit the dim
                text = item.text if isinstance(item, AffineIndex) else item.name
                raise self.err(item.loc, f"index {text} of {e.name} (dim {dim}, size {n}) "
                               f"spans {lo}..{hi}, outside 0..{n - 1}",
                               f"an index inside the dim, or a pad value: {e.name}[...] pad 0")
        return self.make(e.loc, ir.Read, x, forms, sizes, pad)

    def affine_input(self, decl: InStmt, e: Ref) -> Term:
        assert e.index is not None
        pad = e.pad if e.pad is not None else decl.pad
        dims: list[Dim] = []
        sources: list[tuple[Axis | Group | AffineIndex | SliceIndex, str, str, int]] = []
        for item, d, n in zip(e.index, decl.dims, self.input_sizes[e.name], strict=True):
            if isinstance(item, Group):  # a packed dim read whole: its axes as themselves
                group = tuple((a.name, self.sizes[a.name][0]) for a in item.axes)
                dims.append(group)
                sources += [(a, a.name, d.name, s) for a, (_, s) in zip(item.axes, group,
                                                                        strict=True)]
                continue
            src = f"{e.name}.{d.name}"  # a name no spec can write: the read binds it
            dims.append(((src, n),))
            sources.append((item, src, d.name, n))
        return self.affine_read(e, self.make(e.loc, ir.In, e.name, tuple(dims)), sources, pad)

    def affine_intermediate(self, it: Intermediate, e: Ref) -> Term:
        assert e.index is not None
        sources = [(item, a, a, it.store.shape[a])
                   for item, a in zip(e.index, it.axes, strict=True)]
        return self.affine_read(e, it.store, sources, e.pad)

    def use_input(self, decl: InStmt, e: Ref) -> Term:
        if self.is_affine_use(e, self.input_sizes[e.name]):
            return self.affine_input(decl, e)
        if e.index is None:
            items: tuple[Axis | Group, ...] = tuple(
                Group(tuple(Axis(m, e.loc) for m, _, _ in d.group), e.loc) if d.group
                else Axis(d.name, e.loc) for d in decl.dims)
        else:  # affine items went to affine_input above
            items = cast(tuple[Axis | Group, ...], e.index)
        dims: list[Dim] = []
        seen: set[str] = set()
        for item in items:
            axes = (item,) if isinstance(item, Axis) else item.axes
            for a in axes:
                if a.name in seen:
                    raise self.err(a.loc, f"axis {a.name!r} bound twice in one use of {e.name}",
                                   "distinct axis names (diagonals are not supported)")
                seen.add(a.name)
            dims.append(tuple((a.name, self.sizes[a.name][0]) for a in axes))
        # numpy-style broadcasting: a declared size-1 dim bound to an axis of another size
        # reads its one element at every index of the axis (a fresh size-1 axis, summed)
        spread: list[str] = []
        for k, size in enumerate(self.input_sizes[e.name]):
            if size == 1 and dims[k][0][1] != 1:
                self.fresh += 1
                spread.append(f"{dims[k][0][0]}.{self.fresh}")
                self.bind(spread[-1], 1, (0, 0))
                dims[k] = ((spread[-1], 1),)
        term = self.make(e.loc, ir.In, e.name, tuple(dims))
        for name in spread:
            term = self.make(e.loc, ir.Sum, name, term)
        return term

    def use_intermediate(self, it: Intermediate, e: Ref) -> Term:
        if e.index is None:
            return it.store
        if len(e.index) != len(it.axes):
            raise self.err(e.loc, f"{e.name} has {len(it.axes)} axes but is indexed with "
                           f"{len(e.index)}", f"{e.name}[{', '.join(it.axes)}]")
        if (self.is_affine_use(e, tuple(it.store.shape[a] for a in it.axes))
                or any(isinstance(item, Group) for item in e.index)):  # a reshape
            return self.affine_intermediate(it, e)
        mapping: dict[str, str] = {}
        for item, old in zip(e.index, it.axes, strict=True):
            assert isinstance(item, Axis)  # the others went to affine_intermediate above
            if item.name in mapping.values():
                raise self.err(item.loc, f"axis {item.name!r} bound twice in one use of "
                               f"{e.name}", "distinct axis names")
            self.bind(item.name, it.store.shape[old], item.loc)
            mapping[old] = item.name
        if all(k == v for k, v in mapping.items()):
            return it.store
        return self.make(e.loc, self.rename, it.store, mapping)

    def rename(self, root: Term, mapping: Mapping[str, str]) -> Term:
        """`root` with its free axes renamed by `mapping`; bound axes that would capture a
        new name get fresh names (spelled `a.N`, which no spec can write)."""
        memo: dict[tuple[int, tuple[tuple[str, str], ...]], Term] = {}

        def go(node: Term, sub: dict[str, str]) -> Term:
            live = {a: b for a, b in sub.items() if a in node.all_sizes and a != b}
            if not live:
                return node
            key = (id(node), tuple(sorted(live.items())))
            if key in memo:
                return memo[key]
            attrs = node.attrs
            if node.op is Op.IN:
                groups = cast(tuple[Dim, ...], node.attrs[1])
                dims = tuple(tuple((live.get(a, a), s) for a, s in g) for g in groups)
                out = ir.In(str(node.attrs[0]), dims)
            elif node.op is Op.IDX:
                axis, size = ir.idx_axis(node)
                out = ir.Idx(live.get(axis, axis), size)
            elif node.op is Op.READ:  # the map's own axes are free; its operand's are bound
                m = ir.read_map(node).rename(live)
                out = Term(Op.READ, node.args, (m.text,))
            elif node.op is Op.SPLIT or node.op in BINDERS:
                axis = str(node.attrs[0])
                inner = {a: b for a, b in live.items() if a != axis}
                if node.op is not Op.SPLIT and axis in inner.values():
                    self.fresh += 1
                    new = f"{axis}.{self.fresh}"
                    self.bind(new, node.all_sizes[axis], (0, 0))
                    inner[axis] = new
                    attrs = (new, *attrs[1:])
                elif node.op is Op.SPLIT:
                    attrs = (live.get(axis, axis), *attrs[1:])
                out = Term(node.op, tuple(go(c, inner) for c in node.args), attrs)
            else:
                out = Term(node.op, tuple(go(c, live) for c in node.args), attrs)
            memo[key] = out
            return out

        return go(root, dict(mapping))

    def check_call(self, e: Call) -> None:
        """A call's errors that do not need its operands: the name, arity and keywords."""
        if e.name not in FUNCTION_NAMES:
            raise self.err(e.loc, f"unknown function {e.name!r}",
                           f"one of {', '.join(sorted(FUNCTION_NAMES))}")
        if e.name == CAT:
            if len(e.axes) != 1 or len(e.args) < 2 or e.kwargs:
                raise self.err(e.loc, "cat takes a new axis and two or more operands",
                               "cat(j: A, B, ...)")
            return
        if e.axes:
            r = REDUCTIONS.get(e.name)
            if r is None:
                raise self.err(e.loc, f"{e.name} is elementwise, not a reduction",
                               _signature(e.name))
            axes = ", ".join(a.name for a in e.axes)
            if len(e.args) != 1:
                raise self.err(e.loc, f"{e.name} takes one expression after the axes, got "
                               f"{len(e.args)}", f"{e.name}({axes}: expression)")
            seen: set[str] = set()
            for a in e.axes:
                if a.name in seen:
                    raise self.err(a.loc, f"axis {a.name!r} twice in the axes of {e.name}",
                                   "distinct axes, e.g. sum(b, h, w: x)")
                seen.add(a.name)
            for k, _, loc in e.kwargs:
                if k not in r.kwargs:
                    allowed = ", ".join(f"{k}=" for k in r.kwargs) or "no keyword arguments"
                    raise self.err(loc, f"{e.name} has no argument {k!r}", allowed)
            return
        f = ELEMENTWISE.get(e.name)
        if f is None:
            raise self.err(e.loc, f"{e.name} reduces over an axis",
                           f"{e.name}(axis: expression) or {e.name}(a, b: expression)")
        names = [p for p, _ in f.params]
        if not f.arity <= len(e.args) <= f.arity + len(names):
            want = "1 argument" if f.arity == 1 else f"{f.arity} arguments"
            if names:
                want = f"{f.arity} to {f.arity + len(names)} arguments"
            raise self.err(e.loc, f"{e.name} takes {want}, got {len(e.args)}",
                           _signature(e.name))
        given = set(names[: len(e.args) - f.arity])
        for k, _, loc in e.kwargs:
            if k not in names:
                allowed = ", ".join(f"{p}=" for p in names) or "no keyword arguments"
                raise self.err(loc, f"{e.name} has no argument {k!r}", allowed)
            if k in given:
                raise self.err(loc, f"{e.name}'s argument {k} given twice",
                               "each argument once, by position or by name")
            given.add(k)

    def call(self, e: Call, args: list[Term]) -> Term:
        """The term of a checked call (`check_call`) whose arguments are built."""
        if e.name == CAT:
            (axis,) = e.axes
            term = self.make_macro(e, concat, axis.name, args)
            self.bind(axis.name, term.shape[axis.name], axis.loc)
            return term
        if not e.axes:
            f = ELEMENTWISE[e.name]
            params: dict[str, Term | None] = {
                p: None if d is None else Const(d) for p, d in f.params}
            params.update(zip((p for p, _ in f.params), args[f.arity:], strict=False))
            params.update({k: Const(v) for k, v, _ in e.kwargs})
            return self.make_macro(e, f.build, *args[: f.arity], **params)
        r = REDUCTIONS[e.name]
        kw = dict(r.kwargs) | {k: v for k, v, _ in e.kwargs}
        (body,) = args
        for a in e.axes:
            if a.name not in body.shape:
                free = ", ".join(body.shape) or "none"
                raise self.err(a.loc, f"{e.name} over axis {a.name!r}, which is not a "
                               f"free axis of its operand", f"one of its free axes ({free})")
        return self.make(e.loc, r.build, tuple(a.name for a in e.axes), body, kw)

    def make_macro(self, e: Call | Bin, fn: Callable[..., Term], *args: object,
                   **params: Term | None) -> Term:
        """`make` for a macro that may reject an argument (`MacroArgumentError`): the
        error points at that argument."""
        try:
            return self.make(e.loc, fn, *args, **params)
        except MacroArgumentError as err:
            loc = e.loc
            if isinstance(e, Bin):
                loc = e.y.loc if err.arg == 1 else e.x.loc
            elif isinstance(err.arg, int) and err.arg < len(e.args):
                loc = e.args[err.arg].loc
            elif isinstance(err.arg, str):
                loc = next((kl for k, _, kl in e.kwargs if k == err.arg), e.loc)
            raise self.err(loc, err.what, err.expected) from None

    def power(self, e: Bin, x: Term, k: Term) -> Term:
        """`x ^ k`: k must be an integer constant (a literal, a size parameter ...)."""
        def build(x: Term, k: Term) -> Term:
            n = integer_exponent(k)
            if n is None:
                raise MacroArgumentError(1, "the exponent of ^ is not a constant",
                                         "an integer constant exponent (x ^ 2, x ^ -1); "
                                         "a varying real power of a positive base: pow(a, x)")
            return power(x, n)

        return self.make_macro(e, build, x, k)

    def statement(self, s: AssignStmt) -> Term:
        if s.keep and not s.is_out:
            raise self.err(s.keep[0], f"a size-1 dim on the intermediate {s.name}",
                           "size-1 (keepdim) dims only on the out statement")
        seen: set[str] = set()
        for a in s.axes:
            if a.name in seen:
                raise self.err(a.loc, f"axis {a.name!r} twice on the left side",
                               "distinct axis names")
            seen.add(a.name)
        rhs = self.expr(s.expr)
        extra = sorted(set(rhs.shape) - seen)
        if extra:
            raise self.err(s.rhs_loc, f"the right side has free axes {extra} that the left "
                           f"side {s.name}[{', '.join(a.name for a in s.axes)}] lacks",
                           f"the left side to list every free axis (or a reduction over "
                           f"{extra[0]})")
        for a in s.axes:
            if a.name not in rhs.shape:
                raise self.err(a.loc, f"axis {a.name!r} of the left side is not a free axis "
                               f"of the right side", "the right side's free axes "
                               f"({', '.join(rhs.shape) or 'none'})")
        return rhs

    def build(self) -> ParsedSpec:
        self.declare()
        self.collect_sizes()
        out: tuple[AssignStmt, Term] | None = None
        for s in self.stmts:
            if not isinstance(s, AssignStmt):
                continue
            term = self.statement(s)
            if s.is_out:
                out = (s, term)
            else:
                store = self.make(s.loc, ir.Store, term)
                if term_depth(store, self.depths) > MAX_DEPTH:
                    raise self.err(s.loc, f"expression nested deeper than {MAX_DEPTH} (the "
                                   f"stored {s.name} is {MAX_DEPTH + 1} deep)",
                                   f"at most {MAX_DEPTH} levels")
                self.inter[s.name] = Intermediate(s.name, tuple(a.name for a in s.axes),
                                                  store, s.loc[0])
        assert out is not None
        ostmt, term = out
        decls = tuple(
            InputDecl(d.name, self.input_sizes[d.name], d.dtype,
                      tuple(x.name for x in d.dims), d.role)
            for d in self.inputs.values()
        )
        program = Program(
            name=self.kernel.name, params=dict(self.params), inputs=decls,
            out_name=ostmt.name, out_axes=tuple(a.name for a in ostmt.axes), term=term,
            source=self.text, path=self.path,
            statements=tuple(s.text for s in self.stmts if isinstance(s, AssignStmt)),
            out_dims=ostmt.dims,
        )
        return ParsedSpec(program, tuple(self.inter.values()))


def _signature(name: str) -> str:
    """How to call `name`: `f(x)`, `f(x, y)`, `f(x, alpha=1.0)`."""
    f = ELEMENTWISE[name]
    args = ["xyz"[k] for k in range(f.arity)]
    args += [p if d is None else f"{p}={d:g}" for p, d in f.params]
    return f"{name}({', '.join(args)})"


# -- public entry points ----------------------------------------------------------------


def analyze_spec(text: str, path: str = "<spec>",
                 params: Mapping[str, object] | None = None) -> ParsedSpec:
    """Parse a spec and keep its intermediates (name, axes, `Store` node) beside the program."""
    return _Builder(read_statements(text, path), text, path, params).build()


def parse_spec(text: str, path: str = "<spec>",
               params: Mapping[str, object] | None = None) -> Program:
    """Parse spec text into a `Program`; `params` overrides size parameters by name.
    Raises `SpecError` (a `ValueError`) with `path:line:col` on any problem."""
    return analyze_spec(text, path, params).program


def load_spec(path: str | Path, params: Mapping[str, object] | None = None) -> Program:
    """Read and parse a `.ks` file (UTF-8, a byte-order mark allowed: `read_source`)."""
    return parse_spec(read_source(path), str(path), params)


def parse_params(items: list[str] | tuple[str, ...] | None) -> dict[str, int]:
    """`["N=2048", "D=64"]` (the CLI's repeatable `-p K=V`) -> `{"N": 2048, "D": 64}`.

    >>> parse_params(["N=2048", " D = 64 "])
    {'N': 2048, 'D': 64}
    """
    out: dict[str, int] = {}
    for item in items or ():
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"bad parameter {item!r}; expected NAME=INTEGER, e.g. -p N=2048")
        if not re.fullmatch(r"[+-]?\d+", value):
            raise ValueError(f"bad parameter {item!r}: {value!r} is not an integer; "
                             "expected NAME=INTEGER")
        out[name] = int(value)
    return out


# -- analysis helpers shared by the commands ---------------------------------------------


def output_dtype(program: Program) -> str:
    """The output's element type: the widest input type (f32 when there are no inputs)."""
    return max((d.dtype for d in program.inputs if d.dtype not in INT_DTYPES),
               key=DTYPE_BYTES.__getitem__, default="f32")


def min_bytes(program: Program) -> int:
    """Bytes every implementation must move: read each input once, write the output once."""
    read = sum(math.prod(d.dims) * DTYPE_BYTES[d.dtype] for d in program.inputs)
    return read + program.term.size() * DTYPE_BYTES[output_dtype(program)]


def eager_kernels(term: Term, names: Mapping[Term, str] | None = None,
                  root_name: str = "out") -> list[tuple[str, Term]]:
    """The eager baseline's kernels: one per `Store` (innermost first), then the root.
    Each body reads earlier kernels' results as inputs named after them."""
    names = dict(names or {})
    stores = [n for n in postorder(term) if n.op is Op.STORE]
    for k, s in enumerate(stores):
        names.setdefault(s, f"t{k}")
    done: dict[int, Term] = {}
    result: list[tuple[str, Term]] = []

    def body_of(node: Term) -> Term:
        memo: dict[int, Term] = {}
        for n in postorder(node):
            if n.op is Op.STORE and n is not node:
                memo[id(n)] = done[id(n)]
            else:
                memo[id(n)] = n if not n.args else Term(n.op, tuple(memo[id(c)] for c in n.args),
                                                        n.attrs)
        return memo[id(node)]

    for s in stores:
        result.append((names[s], body_of(s).args[0]))
        done[id(s)] = ir.In(names[s], tuple((a, n) for a, n in s.shape.items()))
    if term.op is not Op.STORE:
        result.append((root_name, body_of(term)))
    return result

