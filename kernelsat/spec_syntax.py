"""The syntax of the spec language: tokens, the statement tree and the line parser.

One statement a line; `#` starts a comment. `read_statements` turns text into
statements without looking at names or sizes (that is `kernelsat.spec`'s job); a
syntax error is a `SpecError` at the offending token.

>>> [type(s).__name__ for s in read_statements("kernel k(N=2)\\nin X[i:N]\\nout Y = X # c\\n")]
['KernelStmt', 'InStmt', 'AssignStmt']
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

DTYPE_BYTES: dict[str, int] = {"f32": 4, "f64": 8}
"""Storage size of each declarable element type."""

ROLES: frozenset[str] = frozenset({"data", "positive", "onehot"})
"""Input roles: how `kernelsat.inputs.random_inputs` fills an input (see there)."""


class SpecError(ValueError):
    """A spec the parser rejects: `path:line:col: what is wrong; expected ...`."""

    def __init__(self, path: str, line: int, col: int, what: str, expected: str):
        self.path, self.line, self.col = path, line, col
        self.what, self.expected = what, expected
        super().__init__(f"{path}:{line}:{col}: {what}; expected {expected}")


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
    r"|(?P<punct>[\[\](),:=+\-*/])"
)


def _tokens(text: str, line: int, path: str) -> list[Token]:
    out: list[Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise SpecError(path, line, pos + 1, f"unexpected character {text[pos]!r}",
                            "a name, a number or one of [ ] ( ) , : = + - * /")
        kind = m.lastgroup
        if kind == "num" or kind == "name":
            out.append(Token(kind, m.group(), pos + 1))
        elif kind == "punct":
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
class Num:
    value: float
    loc: Loc


@dataclass(frozen=True)
class Ref:
    name: str
    index: tuple[Axis | Group, ...] | None
    loc: Loc


@dataclass(frozen=True)
class Call:
    name: str
    axis: Axis | None
    args: tuple[Expr, ...]
    kwargs: tuple[tuple[str, float, Loc], ...]
    loc: Loc


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


@dataclass(frozen=True)
class InStmt:
    name: str
    dims: tuple[DimDecl, ...]
    dtype: str
    role: str
    loc: Loc


@dataclass(frozen=True)
class AssignStmt:
    is_out: bool
    name: str
    axes: tuple[Axis, ...]
    expr: Expr
    loc: Loc
    rhs_loc: Loc
    text: str


Stmt = KernelStmt | InStmt | AssignStmt


class _LineParser:
    """Recursive descent over the tokens of one line."""

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
        self.expect("[", f"'[' and the dims of {name.text}, e.g. [i:N, d:D]")
        dims: list[DimDecl] = []
        while True:
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
        if t is not None:
            if t.text not in ROLES:
                raise self.error(f"unknown type or role {t.text!r}",
                                 f"a dtype ({', '.join(DTYPE_BYTES)}) then optionally a role "
                                 f"({', '.join(sorted(ROLES))})", t)
            role = t.text
        self.done()
        return InStmt(name.text, tuple(dims), dtype, role, self.loc(start))

    def assign(self) -> AssignStmt:
        start = self.tok
        is_out = start.kind == "name" and start.text == "out" and self.toks[1].kind == "name"
        if is_out:
            self.i += 1
        name = self.expect("name", "a statement: kernel, in, NAME[axes] = ... or out ...")
        axes: list[Axis] = []
        if self.accept("["):
            while self.tok.kind != "]":
                a = self.expect("name", "an axis name or ']'")
                axes.append(Axis(a.text, self.loc(a)))
                if not self.accept(","):
                    break
            self.expect("]", "',' or ']' closing the axes")
        self.expect("=", f"'=' after {name.text}[...]")
        rhs_loc = self.loc()
        expr = self.expr()
        self.done()
        return AssignStmt(is_out, name.text, tuple(axes), expr, self.loc(name), rhs_loc,
                          self.text.strip())

    # expressions
    def expr(self) -> Expr:
        x = self.term()
        while self.tok.kind in ("+", "-"):
            op = self.tok
            self.i += 1
            x = Bin(op.kind, x, self.term(), self.loc(op))
        return x

    def term(self) -> Expr:
        x = self.unary()
        while self.tok.kind in ("*", "/"):
            op = self.tok
            self.i += 1
            x = Bin(op.kind, x, self.unary(), self.loc(op))
        return x

    def unary(self) -> Expr:
        if self.tok.kind == "-":
            op = self.tok
            self.i += 1
            x = self.unary()
            return Num(-x.value, self.loc(op)) if isinstance(x, Num) else Neg(x, self.loc(op))
        return self.primary()

    def primary(self) -> Expr:
        t = self.tok
        if self.accept("num"):
            return Num(float(t.text), self.loc(t))
        if self.accept("("):
            x = self.expr()
            self.expect(")", "')' closing the parenthesis")
            return x
        if self.accept("name"):
            if self.tok.kind == "(":
                return self.call(t)
            if self.accept("["):
                return Ref(t.text, self.index(), self.loc(t))
            return Ref(t.text, None, self.loc(t))
        raise self.error(f"unexpected {self.found()}",
                         "an operand: a number, a name, NAME[axes], f(...) or (...)")

    def index(self) -> tuple[Axis | Group, ...]:
        items: list[Axis | Group] = []
        while self.tok.kind != "]":
            if self.tok.kind == "(":
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
                a = self.expect("name", "an axis name, a group (a, b) or ']'")
                items.append(Axis(a.text, self.loc(a)))
            if not self.accept(","):
                break
        self.expect("]", "',' or ']' closing the index")
        return tuple(items)

    def call(self, name: Token) -> Call:
        self.expect("(", "(")
        axis = None
        if self.tok.kind == "name" and self.toks[self.i + 1].kind == ":":
            axis = Axis(self.tok.text, self.loc())
            self.i += 2
        args: list[Expr] = []
        kwargs: list[tuple[str, float, Loc]] = []
        while self.tok.kind != ")":
            if self.tok.kind == "name" and self.toks[self.i + 1].kind == "=":
                k = self.tok
                self.i += 2
                v = self.unary()
                if not isinstance(v, Num):
                    raise self.error(f"{k.text}= takes a number", "a numeric literal", k)
                kwargs.append((k.text, v.value, self.loc(k)))
            elif kwargs:
                raise self.error("a positional argument after a keyword argument",
                                 "keyword arguments last")
            else:
                args.append(self.expr())
            if not self.accept(","):
                break
        self.expect(")", f"',' or ')' closing the call of {name.text}")
        return Call(name.text, axis, tuple(args), tuple(kwargs), self.loc(name))


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


def walk_expr(e: Expr) -> Iterator[Expr]:
    """Every sub-expression of `e`, parents first."""
    yield e
    match e:
        case Num() | Ref():
            pass
        case Call():
            for a in e.args:
                yield from walk_expr(a)
        case Neg():
            yield from walk_expr(e.x)
        case Bin():
            yield from walk_expr(e.x)
            yield from walk_expr(e.y)


