"""The syntax of the spec language: tokens, the statement tree and the line parser.

One statement a line; `#` starts a comment. `read_statements` turns text into
statements without looking at names or sizes (that is `kernelsat.spec`'s job); a
syntax error is a `SpecError` at the offending token.

>>> [type(s).__name__ for s in read_statements("kernel k(N=2)\\nin X[i:N]\\nout Y = X # c\\n")]
['KernelStmt', 'InStmt', 'AssignStmt']
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kernelsat.ir import MAX_DEPTH

DTYPE_BYTES: dict[str, int] = {"f32": 4, "f64": 8, "i32": 4}
"""Storage size of each declarable element type."""

ROLES: frozenset[str] = frozenset({"data", "positive", "onehot"})
"""Input roles: how `kernelsat.inputs.random_inputs` fills an input (see there)."""


class SpecError(ValueError):
    """A spec the parser rejects: `path:line:col: what is wrong; expected ...`."""

    def __init__(self, path: str, line: int, col: int, what: str, expected: str):
        self.path, self.line, self.col = path, line, col
        self.what, self.expected = what, expected
        super().__init__(f"{path}:{line}:{col}: {what}; expected {expected}")


def read_source(path: str | Path) -> str:
    """The text of a user's file (spec, program, rules): UTF-8, a leading byte-order mark
    dropped. Bytes that are not UTF-8 raise `SpecError` naming the file, the line, the
    column and the byte offset; `OSError` passes through for the caller to report.

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("wb", suffix=".ks", delete=False) as f:
    ...     _ = f.write(b"kernel k()\\n# caf\\xe9\\n")
    >>> try:
    ...     read_source(f.name)
    ... except SpecError as e:
    ...     print(e.line, e.col, e.what)
    2 6 invalid UTF-8 byte 0xe9 at byte offset 16
    >>> os.unlink(f.name)
    """
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        bom = 3 if data.startswith(b"\xef\xbb\xbf") else 0
        at = e.start + bom
        line_start = data.rfind(b"\n", 0, at) + 1
        col = len(data[max(line_start, bom):at].decode("utf-8", errors="replace")) + 1
        raise SpecError(str(path), data.count(b"\n", 0, at) + 1, col,
                        f"invalid UTF-8 byte 0x{data[at]:02x} at byte offset {at}",
                        "a UTF-8 text file (re-save it as UTF-8)") from None


Loc = tuple[int, int]
"""(line, column), both from 1."""

# -- tokens -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # "name", "num", "end", or the punctuation character itself
    text: str
    col: int


_TOKEN = re.compile(
    r"(?P<ws>[ \t\r]+)"
    r"|(?P<num>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<cmp><=|>=|==|!=|<|>)"  # comparisons (issue 18): before '=' so '==' is one token
    r"|(?P<punct>[\[\](),:=+\-*/^])"
)


def _tokens(text: str, line: int, path: str) -> list[Token]:
    out: list[Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise SpecError(path, line, pos + 1, f"unexpected character {text[pos]!r}",
                            "a name, a number or one of [ ] ( ) , : = + - * / ^ < <= > >= == !=")
        kind = m.lastgroup
        if kind == "num" or kind == "name":
            out.append(Token(kind, m.group(), pos + 1))
        elif kind == "punct" or kind == "cmp":
            out.append(Token(m.group(), m.group(), pos + 1))
        pos = m.end()
    out.append(Token("end", "end of line", len(text) + 1))
    return out


# -- syntax tree ---------------------------------------------------------------------


@dataclass(frozen=True)
class SizeExpr:
    """A dim size: a product of size parameters and integer literals."""

    factors: tuple[tuple[str | int, Loc], ...]


@dataclass(frozen=True)
class Axis:
    name: str
    loc: Loc
    size: SizeExpr | None = None  # an explicit annotation inside a group `(h:H, d)`


@dataclass(frozen=True)
class Group:
    axes: tuple[Axis, ...]
    loc: Loc


@dataclass(frozen=True)
class GatherIndex(Group):
    """An index item `labels[b, s]` (issue 18 part 3b): the dim read at the values of the
    integer input `labels` (its `axes`, free in the use's result). A group of axes with a
    name: the builder reads it as a gather, never as a packed dim."""

    labels: str = ""


@dataclass(frozen=True)
class Num:
    value: float
    loc: Loc


@dataclass(frozen=True)
class Ref:
    name: str
    index: tuple[Axis | Group | AffineIndex | SliceIndex, ...] | None
    loc: Loc
    pad: float | None = None  # `X[...] pad 0`: the value outside X's range (affine reads)


# -- affine reads (issue 18 part 1) ---------------------------------------------------


@dataclass(frozen=True)
class AffineIndex:
    """An index item that is not a plain axis: `2*h + kh - 1`, `i + 1`, `N - 1 - i`.
    `terms` are (name, coefficient, loc); a name may be an axis or a size parameter
    (a constant), which the builder decides."""

    terms: tuple[tuple[str, int, Loc], ...]
    const: int
    text: str
    loc: Loc


SizeArith = tuple[object, ...]
"""A size expression tree: ("num", n, loc), ("name", p, loc) or (op, left, right, loc)
with op one of + - * / (exact division)."""


# -- slices (issue 18 part 5) ---------------------------------------------------------


@dataclass(frozen=True)
class SliceIndex:
    """An index item `START:STOP` or `START:STOP:STEP` (numpy's half-open range; START
    defaults to 0, STOP to the dim's size, STEP to 1), optionally named `j=START:STOP`:
    the use's axis along that dim (unnamed: the dim's own name). The bounds are sizes
    (`size_arith`: parameters and integers with + - * / //)."""

    name: str | None
    start: SizeArith | None
    stop: SizeArith | None
    step: SizeArith | None
    text: str
    loc: Loc


@dataclass(frozen=True)
class AxisStmt:
    """`axis h:H, w:(W + 2*P - K)/S + 1`: declared axis sizes (axes that only appear in
    index expressions, or a window narrower than the dims it reads)."""

    axes: tuple[tuple[str, SizeArith, Loc], ...]
    loc: Loc


@dataclass(frozen=True)
class Call:
    """`f(x, y)`, or a reduction `f(a, b: x)` over the axes before the colon (`axes`
    empty for an elementwise call)."""

    name: str
    axes: tuple[Axis, ...]
    args: tuple[Expr, ...]
    kwargs: tuple[tuple[str, float, Loc], ...]
    loc: Loc

    @property
    def axis(self) -> Axis | None:
        """The first reduction axis (None for an elementwise call)."""
        return self.axes[0] if self.axes else None


@dataclass(frozen=True)
class Neg:
    x: Expr
    loc: Loc


@dataclass(frozen=True)
class Bin:
    op: str
    x: Expr
    y: Expr
    loc: Loc


Expr = Num | Ref | Call | Neg | Bin


@dataclass(frozen=True)
class KernelStmt:
    name: str
    params: tuple[tuple[str, int, Loc], ...]
    loc: Loc


@dataclass(frozen=True)
class DimDecl:
    name: str
    size: SizeExpr
    loc: Loc
    group: tuple[tuple[str, SizeExpr, Loc], ...] = ()
    """A packed dim declared as a group `(h:H, d:D)` (issue 18 part 5, reshape): its
    axes, outer first; `name` is then `(h, d)` and `size` the product of theirs."""


@dataclass(frozen=True)
class InStmt:
    name: str
    dims: tuple[DimDecl, ...]
    dtype: str
    role: str
    loc: Loc
    pad: float | None = None  # `in X[...] f32 pad 0`: the default pad of X's affine reads


@dataclass(frozen=True)
class AssignStmt:
    is_out: bool
    name: str
    axes: tuple[Axis, ...]
    expr: Expr
    loc: Loc
    rhs_loc: Loc
    text: str
    keep: tuple[Loc, ...] = ()  # `out Y[i, 1] = ...`: where the size-1 (keepdim) dims are
    dims: tuple[tuple[str, ...], ...] = ()
    """The declared dims when the left side has a `1` (a size-1 dim: `()`) or a group
    `(g, c)` (one dim over several axes, outer first); empty when each axis is a dim."""


Stmt = KernelStmt | InStmt | AssignStmt | AxisStmt


class _LineParser:
    """Recursive descent over the tokens of one line (expressions by an explicit stack)."""

    def __init__(self, text: str, line: int, path: str):
        self.text, self.line, self.path = text, line, path
        self.toks = _tokens(text, line, path)
        self.i = 0

    # helpers
    @property
    def tok(self) -> Token:
        return self.toks[self.i]

    def loc(self, tok: Token | None = None) -> Loc:
        return (self.line, (tok or self.tok).col)

    def error(self, what: str, expected: str, tok: Token | None = None) -> SpecError:
        return SpecError(self.path, self.line, (tok or self.tok).col, what, expected)

    def found(self) -> str:
        return "end of line" if self.tok.kind == "end" else repr(self.tok.text)

    def accept(self, kind: str) -> Token | None:
        if self.tok.kind == kind:
            self.i += 1
            return self.toks[self.i - 1]
        return None

    def expect(self, kind: str, expected: str) -> Token:
        tok = self.accept(kind)
        if tok is None:
            raise self.error(f"unexpected {self.found()}", expected)
        return tok

    def done(self) -> None:
        if self.tok.kind != "end":
            raise self.error(f"unexpected {self.found()} after the statement", "end of line")

    # statements
    def statement(self) -> Stmt:
        first = self.tok
        if first.kind == "name" and first.text == "kernel":
            return self.kernel()
        if first.kind == "name" and first.text == "in" and self.toks[1].kind == "name":
            return self.input()
        if first.kind == "name" and first.text == "axis" and self.toks[1].kind == "name":
            return self.axis_stmt()
        return self.assign()

    def kernel(self) -> KernelStmt:
        start = self.expect("name", "kernel")
        name = self.expect("name", "a kernel name")
        params: list[tuple[str, int, Loc]] = []
        if self.accept("("):
            while self.tok.kind != ")":
                p = self.expect("name", "a size parameter NAME=DEFAULT or ')'")
                self.expect("=", f"'=' and a default size after {p.text}")
                v = self.expect("num", f"a positive integer default for {p.text}")
                if not v.text.isdigit() or int(v.text) < 1:
                    raise self.error(f"bad default {v.text!r} for {p.text}",
                                     "a positive integer", v)
                params.append((p.text, int(v.text), self.loc(p)))
                if not self.accept(","):
                    break
            self.expect(")", "',' or ')' closing the parameter list")
        self.done()
        return KernelStmt(name.text, tuple(params), self.loc(start))

    def size_expr(self) -> SizeExpr:
        factors: list[tuple[str | int, Loc]] = []
        while True:
            t = self.tok
            if t.kind == "name":
                factors.append((t.text, self.loc(t)))
            elif t.kind == "num" and t.text.isdigit():
                factors.append((int(t.text), self.loc(t)))
            else:
                raise self.error(f"unexpected {self.found()}",
                                 "a size: a parameter, an integer or a product of them")
            self.i += 1
            if not self.accept("*"):
                return SizeExpr(tuple(factors))

    def input(self) -> InStmt:
        start = self.expect("name", "in")
        name = self.expect("name", "an input name")
        self.expect("[", f"'[' and the dims of {name.text}, e.g. [i:N, d:D] ([] for a scalar)")
        dims: list[DimDecl] = []
        while self.tok.kind != "]" or dims:  # `X[]`: a scalar (0-dim) input
            if self.tok.kind == "(":  # a packed dim `(h:H, d:D)`: a reshape at the boundary
                dims.append(self.packed_dim())
                if not self.accept(","):
                    break
                continue
            d = self.expect("name", "a dim NAME:SIZE")
            self.expect(":", f"':' and a size after dim {d.text}")
            dims.append(DimDecl(d.text, self.size_expr(), self.loc(d)))
            if not self.accept(","):
                break
        self.expect("]", "',' or ']' closing the dims")
        dtype, role = "f32", "data"
        t = self.accept("name")
        if t is not None and t.text in DTYPE_BYTES:
            dtype, t = t.text, self.accept("name")
        if t is not None and t.text == "pad":  # `pad VALUE` (affine reads) without a role
            self.i -= 1
            t = None
        if t is not None:
            if t.text not in ROLES:
                raise self.error(f"unknown type or role {t.text!r}",
                                 f"a dtype ({', '.join(DTYPE_BYTES)}) then optionally a role "
                                 f"({', '.join(sorted(ROLES))})", t)
            role = t.text
        pad = self.pad_value()
        self.done()
        return InStmt(name.text, tuple(dims), dtype, role, self.loc(start), pad)

    def packed_dim(self) -> DimDecl:
        """`(h:H, d:D)` in an input declaration: one dim of size H*D read as h, d."""
        start = self.expect("(", "(")
        members: list[tuple[str, SizeExpr, Loc]] = []
        while True:
            a = self.expect("name", "an axis NAME:SIZE in the packed dim")
            self.expect(":", f"':' and a size after {a.text} (every axis of a packed dim "
                        "declares its size)")
            members.append((a.text, self.size_expr(), self.loc(a)))
            if not self.accept(","):
                break
        self.expect(")", "',' or ')' closing the packed dim")
        size = SizeExpr(tuple(f for _, m, _ in members for f in m.factors))
        name = f"({', '.join(m for m, _, _ in members)})"
        return DimDecl(name, size, self.loc(start), tuple(members))

    def assign(self) -> AssignStmt:
        start = self.tok
        is_out = start.kind == "name" and start.text == "out" and self.toks[1].kind == "name"
        if is_out:
            self.i += 1
        name = self.expect("name", "a statement: kernel, in, NAME[axes] = ... or out ...")
        axes: list[Axis] = []
        keep: list[Loc] = []
        dims: list[tuple[str, ...]] = []
        if self.accept("["):
            while self.tok.kind != "]":
                one = self.accept("num")
                if one is not None:
                    if one.text != "1":
                        raise self.error(f"a dim of size {one.text} on the left side",
                                         "an axis name, a group (a, b), or 1 for a size-1 "
                                         "(keepdim) dim", one)
                    keep.append(self.loc(one))
                    dims.append(())
                elif self.accept("("):
                    group: list[str] = []
                    while True:
                        a = self.expect("name", "an axis name in the group")
                        axes.append(Axis(a.text, self.loc(a)))
                        group.append(a.text)
                        if not self.accept(","):
                            break
                    self.expect(")", "',' or ')' closing the group")
                    dims.append(tuple(group))
                else:
                    a = self.expect("name", "an axis name, a group (a, b), 1 (a size-1 dim) "
                                    "or ']'")
                    axes.append(Axis(a.text, self.loc(a)))
                    dims.append((a.text,))
                if not self.accept(","):
                    break
            self.expect("]", "',' or ']' closing the axes")
        if all(len(d) == 1 for d in dims):
            dims = []
        self.expect("=", f"'=' after {name.text}[...]")
        rhs_loc = self.loc()
        expr = self.expr()
        self.done()
        return AssignStmt(is_out, name.text, tuple(axes), expr, self.loc(name), rhs_loc,
                          self.text.strip(), tuple(keep), tuple(dims))

    # expressions: read with an explicit stack of open parentheses and call arguments,
    # not by recursion, so a deep expression is an error at its token, never a crash
    def expr(self) -> Expr:
        stack = [_Open("top", self.tok)]
        while True:
            value = self.operand(stack)
            if value is None:
                continue  # a '(' or a call's first argument opened a new level
            while True:  # operators after an operand; closing levels that end here
                frame = stack[-1]
                frame.vals.append(value)
                if self.tok.kind in _PRECEDENCE:
                    if self.tok.kind in COMPARISONS and any(o.kind in COMPARISONS
                                                            for o in frame.ops):
                        raise self.error(f"a second comparison {self.tok.text!r} in a "
                                         "chain", "parentheses: (a < b) * (b < c)")
                    frame.reduce(self.tok.kind, self.line)
                    frame.ops.append(self.tok)
                    self.i += 1
                    break
                frame.reduce(None, self.line)
                result = frame.vals.pop()
                if frame.kind == "top":
                    return result
                stack.pop()
                if frame.kind == "paren":
                    self.expect(")", "')' closing the parenthesis")
                    value = result
                    continue
                assert frame.call is not None
                frame.call.args.append(result)
                if self.accept(",") and self.next_argument(frame.call):
                    self.open(stack, _Open("arg", frame.call.name, call=frame.call))
                    break
                value = self.close_call(frame.call)

    def operand(self, stack: list[_Open]) -> Expr | None:
        """Read minus signs (unary operators of the current level: `-x^2` is `-(x^2)`)
        and a primary; None when a '(' or a call opened a level."""
        while self.tok.kind == "-":
            stack[-1].ops.append(Token(_NEG, "-", self.tok.col))
            self.i += 1
        t = self.tok
        if self.accept("num"):
            return Num(float(t.text), self.loc(t))
        if self.accept("("):
            self.open(stack, _Open("paren", t))
            return None
        if self.accept("name"):
            if self.tok.kind == "(":
                call = self.call_head(t)
                if self.next_argument(call):
                    self.open(stack, _Open("arg", t, call=call))
                    return None
                return self.close_call(call)
            if self.accept("["):
                return Ref(t.text, self.index(), self.loc(t), self.pad_value())
            return Ref(t.text, None, self.loc(t))
        raise self.error(f"unexpected {self.found()}",
                         "an operand: a number, a name, NAME[axes], f(...) or (...)")

    def open(self, stack: list[_Open], frame: _Open) -> None:
        if len(stack) > MAX_NESTING:
            raise self.error(f"expression nested deeper than {MAX_NESTING}",
                             f"at most {MAX_NESTING} nested parentheses and calls",
                             frame.token)
        stack.append(frame)

    # affine reads (issue 18 part 1) -------------------------------------------------
    def pad_value(self) -> float | None:
        """`pad NUMBER`, `pad -NUMBER` or `pad -inf` after a use or a declaration."""
        if not (self.tok.kind == "name" and self.tok.text == "pad"):
            return None
        self.i += 1
        sign = -1.0 if self.accept("-") else 1.0
        t = self.tok
        if t.kind == "num":
            self.i += 1
            return sign * float(t.text)
        if t.kind == "name" and t.text == "inf" and sign < 0:
            self.i += 1
            return -math.inf
        raise self.error(f"bad pad value {self.found()}",
                         "pad NUMBER (e.g. pad 0) or pad -inf", t)

    def affine_item(self) -> Axis | AffineIndex:
        """One index item: a plain axis, or a sum of integer multiples of names plus an
        integer (`2*h + kh - 1`)."""
        first = self.i
        terms: list[tuple[str, int, Loc]] = []
        const = 0
        sign = -1 if self.accept("-") else 1
        while True:
            t = self.tok
            if t.kind == "num":
                if not t.text.isdigit():
                    raise self.error(f"non-integer {t.text} in an index expression",
                                     "integers and axis names (an affine index such as "
                                     "2*h + kh - 1)", t)
                self.i += 1
                if self.accept("*"):
                    a = self.expect("name", f"an axis name after {t.text}* (an affine index)")
                    terms.append((a.text, sign * int(t.text), self.loc(a)))
                else:
                    const += sign * int(t.text)
            elif t.kind == "name":
                self.i += 1
                coef = 1
                if self.accept("*"):
                    n = self.tok
                    if n.kind != "num" or not n.text.isdigit():
                        raise self.error(f"non-affine index: {t.text} * {self.found()}",
                                         "an axis times an integer (2*h), never a product "
                                         "of axes", n)
                    self.i += 1
                    coef = int(n.text)
                terms.append((t.text, sign * coef, self.loc(t)))
            else:
                raise self.error(f"unexpected {self.found()} in an index",
                                 "an axis name, an integer or an affine index (2*h + kh - 1)")
            if self.tok.kind in ("+", "-"):
                sign = 1 if self.tok.kind == "+" else -1
                self.i += 1
                continue
            if self.tok.kind in (",", "]"):
                break
            raise self.error(f"non-affine index: unexpected {self.found()}",
                             "an affine index: integer multiples of axes plus an integer, "
                             "e.g. 2*h + kh - 1, then ',' or ']'")
        if self.i == first + 1 and terms:
            return Axis(terms[0][0], terms[0][2])
        text = " ".join(tk.text for tk in self.toks[first:self.i])
        return AffineIndex(tuple(terms), const, text, self.loc(self.toks[first]))

    # -- gathers (issue 18 part 3b) ----------------------------------------------------
    def is_gather(self) -> bool:
        """Whether the index item at the cursor is `NAME[...]` (a gather index)."""
        return self.tok.kind == "name" and self.toks[self.i + 1].kind == "["

    def gather_item(self) -> GatherIndex:
        """`labels[b, s]`: plain axis names, then ',' or ']' closing the use's index."""
        name = self.expect("name", "an integer input")
        self.expect("[", "[")
        axes: list[Axis] = []
        while self.tok.kind != "]" or axes:
            a = self.expect("name", f"an axis name indexing {name.text} (a gather index "
                            "takes plain axes)")
            axes.append(Axis(a.text, self.loc(a)))
            if not self.accept(","):
                break
        self.expect("]", f"',' or ']' closing the index of {name.text} (plain axes)")
        if self.tok.kind not in (",", "]"):
            raise self.error(f"unexpected {self.found()} after the gather index {name.text}[...]",
                             "',' or ']' (a gather index is used as it is: no arithmetic)")
        return GatherIndex(tuple(axes), self.loc(name), name.text)

    def axis_stmt(self) -> AxisStmt:
        start = self.expect("name", "axis")
        axes: list[tuple[str, SizeArith, Loc]] = []
        while True:
            a = self.expect("name", "an axis NAME:SIZE")
            self.expect(":", f"':' and a size after axis {a.text}")
            axes.append((a.text, self.size_arith(), self.loc(a)))
            if not self.accept(","):
                break
        self.done()
        return AxisStmt(tuple(axes), self.loc(start))

    def size_arith(self) -> SizeArith:
        """A size: integers and size parameters with + - * / (exact), // (floor) and
        parentheses."""
        def atom() -> SizeArith:
            t = self.tok
            if self.accept("("):
                inner = add()
                self.expect(")", "')' closing the size expression")
                return inner
            if t.kind == "num" and t.text.isdigit():
                self.i += 1
                return ("num", int(t.text), self.loc(t))
            if t.kind == "name":
                self.i += 1
                return ("name", t.text, self.loc(t))
            raise self.error(f"unexpected {self.found()}",
                             "a size: integers and parameters with + - * / and parentheses")

        def mul() -> SizeArith:
            x = atom()
            while self.tok.kind in ("*", "/"):
                op = self.tok
                self.i += 1
                kind = op.kind
                if kind == "/" and self.tok.kind == "/" and self.tok.col == op.col + 1:
                    self.i += 1
                    kind = "//"  # floor division: conv's (H + 2*P - K)//S + 1
                x = (kind, x, atom(), self.loc(op))
            return x

        def add() -> SizeArith:
            x = mul()
            while self.tok.kind in ("+", "-"):
                op = self.tok
                self.i += 1
                x = (op.kind, x, mul(), self.loc(op))
            return x

        return add()

    def index(self) -> tuple[Axis | Group | AffineIndex | SliceIndex, ...]:
        items: list[Axis | Group | AffineIndex | SliceIndex] = []
        while self.tok.kind != "]":
            if self.is_slice():
                items.append(self.slice_item())
            elif self.tok.kind == "(":
                g = self.tok
                self.i += 1
                members: list[Axis] = []
                while True:
                    a = self.expect("name", "an axis name in the group")
                    size = self.size_expr() if self.accept(":") else None
                    members.append(Axis(a.text, self.loc(a), size))
                    if not self.accept(","):
                        break
                self.expect(")", "',' or ')' closing the group")
                items.append(Group(tuple(members), self.loc(g)))
            else:
                items.append(self.gather_item() if self.is_gather() else self.affine_item())
            if not self.accept(","):
                break
        self.expect("]", "',' or ']' closing the index")
        return tuple(items)

    def is_slice(self) -> bool:
        """Whether the index item at the cursor has a ':' outside parentheses (a slice;
        a group's sizes `(h:H, d)` are inside its parentheses)."""
        depth = 0
        for t in self.toks[self.i:]:
            if t.kind == "(":
                depth += 1
            elif t.kind == ")":
                depth -= 1
            elif depth == 0 and t.kind in (",", "]", "end"):
                return False
            elif depth == 0 and t.kind == ":":
                return True
        return False

    def slice_item(self) -> SliceIndex:
        """`[NAME=][START]:[STOP][:STEP]` (the cursor is on an item `is_slice` accepted)."""
        first, begin = self.tok, self.i
        name: str | None = None
        if self.tok.kind == "name" and self.toks[self.i + 1].kind == "=":
            name = self.tok.text
            self.i += 2
        bounds: list[SizeArith | None] = []
        for k in range(3):
            if k and not self.accept(":"):
                break
            if self.tok.kind in (":", ",", "]"):
                bounds.append(None)
            else:
                bounds.append(self.size_arith())
        if len(bounds) < 2:
            raise self.error(f"unexpected {self.found()} in a slice",
                             "a slice START:STOP or START:STOP:STEP (sizes), e.g. 0:F")
        if self.tok.kind not in (",", "]"):
            hint = ""
            if self.tok.kind == "name" and self.toks[self.i - 1].kind == "num":
                hint = f"; a product is written {self.toks[self.i - 1].text}*{self.tok.text}"
            raise self.error(f"unexpected {self.found()} after a slice",
                             f"',' or ']' (a slice is START:STOP or START:STOP:STEP){hint}")
        text = "".join(tk.text for tk in self.toks[begin:self.i])
        return SliceIndex(name, bounds[0], bounds[1], bounds[2] if len(bounds) > 2 else None,
                          text, self.loc(first))

    def call_head(self, name: Token) -> _CallState:
        """`f(` and, for a reduction, its axes `a, b, c:` (names and commas up to a colon)."""
        self.expect("(", "(")
        k = self.i
        while self.toks[k].kind == "name" and self.toks[k + 1].kind == ",":
            k += 2
        axes: list[Axis] = []
        if self.toks[k].kind == "name" and self.toks[k + 1].kind == ":":
            axes = [Axis(self.toks[j].text, self.loc(self.toks[j]))
                    for j in range(self.i, k + 1, 2)]
            self.i = k + 2
        return _CallState(name, tuple(axes))

    def next_argument(self, call: _CallState) -> bool:
        """Read keyword arguments up to the next positional one; False at the call's end."""
        while self.tok.kind != ")":
            if self.tok.kind == "name" and self.toks[self.i + 1].kind == "=":
                k = self.tok
                self.i += 2
                sign = 1.0
                while self.accept("-"):
                    sign = -sign
                v = self.accept("num")
                if v is None:
                    raise self.error(f"{k.text}= takes a number", "a numeric literal", k)
                call.kwargs.append((k.text, sign * float(v.text), self.loc(k)))
                if not self.accept(","):
                    return False
            elif call.kwargs:
                raise self.error("a positional argument after a keyword argument",
                                 "keyword arguments last")
            else:
                return True
        return False

    def close_call(self, call: _CallState) -> Expr:
        name = call.name
        self.expect(")", f"',' or ')' closing the call of {name.text}")
        return Call(name.text, call.axes, tuple(call.args), tuple(call.kwargs), self.loc(name))


MAX_NESTING = MAX_DEPTH
"""Parentheses and calls nested deeper than this in one expression are a syntax error
(the term would pass `kernelsat.ir.MAX_DEPTH` anyway)."""

COMPARISONS: frozenset[str] = frozenset({"<", "<=", ">", ">=", "==", "!="})
"""The comparison operators: 1.0 where they hold, else 0.0; they bind loosest of all and
do not chain (`a < b < c` is an error)."""

_PRECEDENCE: dict[str, float] = {"+": 1, "-": 1, "*": 2, "/": 2, "^": 4,
                                 **dict.fromkeys(COMPARISONS, 0.5)}
"""Binary operators and how tightly they bind (higher first). Unary minus binds at 3:
tighter than `*`, looser than `^` (as in Python: `-x^2` is `-(x^2)`, `2^-1` is `2^(-1)`)."""

_NEG = "neg"
"""The token kind of a unary minus on the operator stack."""

_OPERATOR_RANK = {**_PRECEDENCE, _NEG: 3}

_RIGHT_ASSOCIATIVE = frozenset({"^"})
"""`x^2^3` is `x^(2^3)`."""


@dataclass
class _CallState:
    """A call being read: its name token, reduction axes and arguments so far."""

    name: Token
    axes: tuple[Axis, ...]
    args: list[Expr] = field(default_factory=list)
    kwargs: list[tuple[str, float, Loc]] = field(default_factory=list)


@dataclass
class _Open:
    """One open level of an expression: the statement's right side ("top"), a
    parenthesis ("paren") or one argument of a call ("arg"); operands and the binary
    operators still waiting for their right operand (a unary minus: kind `_NEG`)."""

    kind: str
    token: Token
    call: _CallState | None = None
    vals: list[Expr] = field(default_factory=list)
    ops: list[Token] = field(default_factory=list)

    def reduce(self, incoming: str | None, line: int) -> None:
        """Apply the waiting operators that bind before the `incoming` binary operator
        (all of them at the end, `None`): the tighter ones, and equal ones unless it is
        right associative. A minus before a number makes a negative number."""
        rank = 0 if incoming is None else _OPERATOR_RANK[incoming]
        while self.ops:
            top = _OPERATOR_RANK[self.ops[-1].kind]
            if top < rank or (top == rank and incoming in _RIGHT_ASSOCIATIVE):
                return
            op = self.ops.pop()
            y = self.vals.pop()
            if op.kind == _NEG:
                self.vals.append(Num(-y.value, (line, op.col)) if isinstance(y, Num)
                                 else Neg(y, (line, op.col)))
                continue
            x = self.vals.pop()
            self.vals.append(Bin(op.kind, x, y, (line, op.col)))


def _strip_comment(line: str) -> str:
    k = line.find("#")
    return line if k < 0 else line[:k]


def read_statements(text: str, path: str = "<spec>") -> list[Stmt]:
    """The statements of a spec, syntax only (pass 1)."""
    out: list[Stmt] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        body = _strip_comment(raw)
        if body.strip():
            out.append(_LineParser(body, n, path).statement())
    return out


def expr_children(e: Expr) -> tuple[Expr, ...]:
    """The direct sub-expressions of `e`, in source order."""
    match e:
        case Num() | Ref():
            return ()
        case Call():
            return e.args
        case Neg():
            return (e.x,)
        case Bin():
            return (e.x, e.y)


def walk_expr(e: Expr) -> Iterator[Expr]:
    """Every sub-expression of `e`, parents first (iterative: any depth)."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(expr_children(node)))
