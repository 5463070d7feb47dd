"""The canonical s-expression syntax of terms: print and parse, round-tripping exactly.

    (In Q b:1 i:128 d:64)            an input; dims bound to axes in order
    (In X n:16 (h:8 d:64))           a packed dim read as a group of axes
    (Const 0.125)                    a real scalar (Python's shortest round-trip repr)
    (add x y) (exp x)                elementwise ops, lower case
    (Sum n x) (Max n x) (LSE n x)    reductions over a named axis
    (SoftmaxAvg n s v) (Dot d x y)
    (Split n 64 x) (Store x)

Programs are DAGs. A node used more than once (and not a leaf) is printed once, in a
`let` binding, so the text is linear in the DAG size:

    (let ((%0 (exp (In x i:4)))) (add %0 %0))

The reader (`read`) is shared with rule patterns, which add `?x` variables.

>>> from kernelsat.ir import In, exp, add
>>> t = add(exp(In("x", (("i", 4),))), exp(In("x", (("i", 4),))))
>>> to_sexpr(t)
'(let ((%0 (exp (In x i:4)))) (add %0 %0))'
>>> parse_term(to_sexpr(t)) is t
True
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kernelsat.ir import MAX_DEPTH, Attr, Dim, ShapeError, Term, term_depth
from kernelsat.ir import to_sexpr as to_sexpr  # printed by ir (a Term is its repr), read here
from kernelsat.ops import AXIS_ATTR, BY_NAME, Op
from kernelsat.spec_syntax import read_source


class SExprError(ValueError):
    """Malformed s-expression text, with the line and column of the problem."""

    def __init__(self, message: str, line: int = 0, col: int = 0, source: str = "<sexpr>"):
        self.line, self.col, self.source = line, col, source
        where = f"{source}:{line}:{col}: " if line else f"{source}: "
        super().__init__(where + message)


@dataclass(frozen=True, slots=True)
class Atom:
    text: str
    line: int
    col: int


@dataclass(frozen=True, slots=True)
class SList:
    items: tuple[Atom | SList, ...]
    line: int
    col: int


SNode = Atom | SList


def read(text: str, source: str = "<sexpr>") -> list[SNode]:
    """Read every top-level s-expression in `text` (iteratively: depth is unbounded).
    `;` starts a comment to the end of the line."""
    out: list[SNode] = []
    stack: list[tuple[list[SNode], int, int]] = []
    line, col, i, n = 1, 1, 0, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line, col, i = line + 1, 1, i + 1
            continue
        if c in " \t\r":
            i, col = i + 1, col + 1
            continue
        if c == ";":
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "(":
            stack.append(([], line, col))
            i, col = i + 1, col + 1
            continue
        if c == ")":
            if not stack:
                raise SExprError("unexpected ')'", line, col, source)
            items, l0, c0 = stack.pop()
            node = SList(tuple(items), l0, c0)
            (stack[-1][0] if stack else out).append(node)
            i, col = i + 1, col + 1
            continue
        j = i
        while j < n and text[j] not in " \t\r\n();":
            j += 1
        atom = Atom(text[i:j], line, col)
        (stack[-1][0] if stack else out).append(atom)
        col += j - i
        i = j
    if stack:
        _, l0, c0 = stack[-1]
        raise SExprError("unclosed '(' (expected ')')", l0, c0, source)
    return out


# -- parsing ----------------------------------------------------------------------


def _err(node: SNode, message: str, source: str) -> SExprError:
    return SExprError(message, node.line, node.col, source)


def _parse_int(atom: SNode, what: str, source: str) -> int:
    if not isinstance(atom, Atom) or not atom.text.isdigit():
        raise _err(atom, f"expected {what} (a positive integer)", source)
    return int(atom.text)


def _parse_dim(node: SNode, source: str) -> Dim:
    atoms = node.items if isinstance(node, SList) else (node,)
    group = []
    for a in atoms:
        if not isinstance(a, Atom) or a.text.count(":") != 1:
            raise _err(a, "expected an axis binding 'axis:size'", source)
        axis, size = a.text.split(":")
        group.append((axis, _parse_int(Atom(size, a.line, a.col), "a size", source)))
    if not group:
        raise _err(node, "expected an axis group '(a:n b:m ...)'", source)
    return tuple(group)


def _attrs_of(op: Op, head: SList, source: str) -> tuple[tuple[Attr, ...], int]:
    """Attributes of a node and the index where its term children start."""
    items = head.items
    if op is Op.IN:
        if len(items) < 2 or not isinstance(items[1], Atom):
            raise _err(head, "expected (In NAME dims...)", source)
        dims = tuple(_parse_dim(d, source) for d in items[2:])
        return (items[1].text, dims), len(items)
    if op is Op.CONST:
        if len(items) != 2 or not isinstance(items[1], Atom):
            raise _err(head, "expected (Const NUMBER)", source)
        try:
            return (float(items[1].text),), 2
        except ValueError:
            raise _err(items[1], "expected a number", source) from None
    if op in AXIS_ATTR:  # a reduction's axis, a gather's axis
        if len(items) < 2 or not isinstance(items[1], Atom):
            raise _err(head, f"expected ({op.value} AXIS ...)", source)
        return (items[1].text,), 2
    if op is Op.IDX:
        if len(items) != 3 or not isinstance(items[1], Atom):
            raise _err(head, "expected (Idx AXIS SIZE)", source)
        return (items[1].text, _parse_int(items[2], "an axis size", source)), 3
    if op is Op.READ:  # affine reads (issue 18 part 1): the map is one token
        if len(items) < 2 or not isinstance(items[1], Atom):
            raise _err(head, "expected (Read FORMS|AXES|pad=VALUE x)", source)
        return (items[1].text,), 2
    if op is Op.SPLIT:
        if len(items) < 3 or not isinstance(items[1], Atom):
            raise _err(head, "expected (Split AXIS FACTOR x)", source)
        return (items[1].text, _parse_int(items[2], "a split factor", source)), 3
    return (), 1


def _build(node: SNode, env: dict[str, Term], source: str,
           depths: dict[Term, int] | None = None) -> Term:
    """Build the term for one s-expression (iteratively, post-order); with `depths`, a
    term deeper than `MAX_DEPTH` is an error at its '('."""
    done: dict[int, Term] = {}
    stack: list[tuple[SNode, bool]] = [(node, False)]
    while stack:
        cur, expanded = stack.pop()
        if isinstance(cur, Atom):
            if cur.text in env:
                done[id(cur)] = env[cur.text]
                continue
            if cur.text == Op.NEGINF.value:  # a leaf without attributes prints bare
                done[id(cur)] = Term(Op.NEGINF)
                continue
            raise _err(cur, f"expected a term, found {cur.text!r}", source)
        if not cur.items or not isinstance(cur.items[0], Atom):
            raise _err(cur, "expected (OP ...)", source)
        name = cur.items[0].text
        op = BY_NAME.get(name)
        if op is None:
            raise _err(cur.items[0], f"unknown op {name!r}", source)
        attrs, start = _attrs_of(op, cur, source)
        kids = cur.items[start:]
        if not expanded:
            stack.append((cur, True))
            stack.extend((k, False) for k in reversed(kids))
            continue
        try:
            term = Term(op, tuple(done[id(k)] for k in kids), attrs)
        except ShapeError as e:
            raise _err(cur, f"ill-formed term: {e}", source) from None
        if depths is not None and term_depth(term, depths) > MAX_DEPTH:
            raise _err(cur, f"term nested deeper than {MAX_DEPTH} (the limit every stage "
                       "supports)", source)
        done[id(cur)] = term
    return done[id(node)]


def parse_term(text: str, source: str = "<sexpr>", max_depth: bool = False) -> Term:
    """Parse the canonical text (with or without `let` sharing) into a term. With
    `max_depth`, a term deeper than `kernelsat.ir.MAX_DEPTH` is an `SExprError` at the
    offending '(' (`read_program` sets it for a user's file)."""
    nodes = read(text, source)
    if len(nodes) != 1:
        raise SExprError(f"expected one term, found {len(nodes)}", 1, 1, source)
    top = nodes[0]
    env: dict[str, Term] = {}
    depths: dict[Term, int] | None = {} if max_depth else None
    head = top.items[0] if isinstance(top, SList) and top.items else None
    if isinstance(top, SList) and isinstance(head, Atom) and head.text == "let":
        if len(top.items) != 3 or not isinstance(top.items[1], SList):
            raise _err(top, "expected (let ((%N term) ...) body)", source)
        for b in top.items[1].items:
            if (
                not isinstance(b, SList)
                or len(b.items) != 2
                or not isinstance(b.items[0], Atom)
                or not b.items[0].text.startswith("%")
            ):
                raise _err(b, "expected a binding (%N term)", source)
            if b.items[0].text in env:
                raise _err(b, f"{b.items[0].text} bound twice", source)
            env[b.items[0].text] = _build(b.items[1], env, source, depths)
        top = top.items[2]
    return _build(top, env, source, depths)


def read_program(path: str | Path) -> Term:
    """A user's program file (`--program`): UTF-8 (`read_source`), at most `MAX_DEPTH`
    deep. Raises `SExprError` or `SpecError` (both `ValueError`s, naming the file, line
    and column) or `OSError`."""
    return parse_term(read_source(path), str(path), max_depth=True)
