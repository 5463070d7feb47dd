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
from dataclasses import dataclass, field
from pathlib import Path

from kernelsat.ir import MAX_DEPTH

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
                    frame.reduce(_PRECEDENCE[self.tok.kind], self.line)
                    frame.ops.append(self.tok)
                    self.i += 1
                    break
                frame.reduce(0, self.line)
                result = frame.vals.pop()
                if frame.kind == "top":
                    return result
                stack.pop()
                if frame.kind == "paren":
                    self.expect(")", "')' closing the parenthesis")
                    value = self.negate(result, frame.negs)
                    continue
                assert frame.call is not None
                frame.call.args.append(result)
                if self.accept(",") and self.next_argument(frame.call):
                    self.open(stack, _Open("arg", frame.call.name, call=frame.call))
                    break
                value = self.close_call(frame.call)

    def operand(self, stack: list[_Open]) -> Expr | None:
        """Read minus signs and a primary; None when a '(' or a call opened a level."""
        negs: list[Token] = []
        while self.tok.kind == "-":
            negs.append(self.tok)
            self.i += 1
        t = self.tok
        if self.accept("num"):
            return self.negate(Num(float(t.text), self.loc(t)), negs)
        if self.accept("("):
            self.open(stack, _Open("paren", t, negs=negs))
            return None
        if self.accept("name"):
            if self.tok.kind == "(":
                call = self.call_head(t, negs)
                if self.next_argument(call):
                    self.open(stack, _Open("arg", t, call=call))
                    return None
                return self.close_call(call)
            if self.accept("["):
                return self.negate(Ref(t.text, self.index(), self.loc(t)), negs)
            return self.negate(Ref(t.text, None, self.loc(t)), negs)
        raise self.error(f"unexpected {self.found()}",
                         "an operand: a number, a name, NAME[axes], f(...) or (...)")

    def open(self, stack: list[_Open], frame: _Open) -> None:
        if len(stack) > MAX_NESTING:
            raise self.error(f"expression nested deeper than {MAX_NESTING}",
                             f"at most {MAX_NESTING} nested parentheses and calls",
                             frame.token)
        stack.append(frame)

    def negate(self, x: Expr, negs: list[Token]) -> Expr:
        for op in reversed(negs):  # the sign nearest the operand applies first
            x = Num(-x.value, self.loc(op)) if isinstance(x, Num) else Neg(x, self.loc(op))
        return x

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

    def call_head(self, name: Token, negs: list[Token]) -> _CallState:
        self.expect("(", "(")
        axis = None
        if self.tok.kind == "name" and self.toks[self.i + 1].kind == ":":
            axis = Axis(self.tok.text, self.loc())
            self.i += 2
        return _CallState(name, axis, negs)

    def next_argument(self, call: _CallState) -> bool:
        """Read keyword arguments up to the next positional one; False at the call's end."""
        while self.tok.kind != ")":
            if self.tok.kind == "name" and self.toks[self.i + 1].kind == "=":
                k = self.tok
                self.i += 2
                negs: list[Token] = []
                while self.tok.kind == "-":
                    negs.append(self.tok)
                    self.i += 1
                v = self.accept("num")
                if v is None:
                    raise self.error(f"{k.text}= takes a number", "a numeric literal", k)
                value = self.negate(Num(float(v.text), self.loc(v)), negs)
                assert isinstance(value, Num)
                call.kwargs.append((k.text, value.value, self.loc(k)))
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
        made = Call(name.text, call.axis, tuple(call.args), tuple(call.kwargs), self.loc(name))
        return self.negate(made, call.negs)


MAX_NESTING = MAX_DEPTH
"""Parentheses and calls nested deeper than this in one expression are a syntax error
(the term would pass `kernelsat.ir.MAX_DEPTH` anyway)."""

_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


@dataclass
class _CallState:
    """A call being read: its name token, axis, arguments so far, and the minus signs
    written before it."""

    name: Token
    axis: Axis | None
    negs: list[Token]
    args: list[Expr] = field(default_factory=list)
    kwargs: list[tuple[str, float, Loc]] = field(default_factory=list)


@dataclass
class _Open:
    """One open level of an expression: the statement's right side ("top"), a
    parenthesis ("paren") or one argument of a call ("arg"); operands and the binary
    operators still waiting for their right operand."""

    kind: str
    token: Token
    negs: list[Token] = field(default_factory=list)
    call: _CallState | None = None
    vals: list[Expr] = field(default_factory=list)
    ops: list[Token] = field(default_factory=list)

    def reduce(self, precedence: int, line: int) -> None:
        """Apply the waiting operators that bind at least as tightly (left associative)."""
        while self.ops and _PRECEDENCE[self.ops[-1].kind] >= precedence:
            op = self.ops.pop()
            y = self.vals.pop()
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
