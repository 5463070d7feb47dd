"""Terms: immutable, hash-consed DAG nodes of the named-axis tensor algebra.

A `Term` is one node: an `Op`, its term children and its attributes. Equal
subterms are the same object (a constructor cache), so equality is identity and
a program is a DAG. Every term is shape-checked when it is built: building an
ill-formed term raises `ShapeError`, whose message shows the offending node and
the shapes of its children.

>>> q = In("Q", (("i", 4), ("d", 8)))
>>> s = Sum("d", mul(q, q))
>>> dict(s.shape)
{'i': 4}
>>> s is Sum("d", mul(q, q))
True
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, cast
from weakref import WeakValueDictionary

from kernelsat.affine import ReadMap, ReadMapError, make_read_map, parse_read_map
from kernelsat.ops import ARITY, AXIS_ATTR, BINARY, LEAVES, REDUCTIONS, TERNARY, UNARY, Op

Dim = tuple[tuple[str, int], ...]
"""One declared dim of an input, bound to one axis or a group of axes (outer first)."""

Attr = str | int | float | tuple[Dim, ...]


class ShapeError(ValueError):
    """An ill-formed term: the message names the node and its neighbourhood."""


def split_axes(axis: str, factor: int) -> tuple[str, str]:
    """The outer and inner axis names that `Split(axis, factor, x)` produces.

    >>> split_axes("n", 64)
    ('n/o64', 'n/i64')
    """
    return f"{axis}/o{factor}", f"{axis}/i{factor}"


def _check_axis_name(name: object) -> str:
    if not isinstance(name, str) or not name or any(c in name for c in " ()\t\n:;\"'"):
        raise ShapeError(f"bad axis name {name!r}")
    return name


class Term:
    """One node of a program. Build terms with the constructors below (`In`, `add`,
    `Sum` ...) or `Term(op, args, attrs)`; never mutate them."""

    __slots__ = ("__weakref__", "_all_sizes", "_key", "args", "attrs", "op", "shape")
    _cache: ClassVar[WeakValueDictionary[tuple[Any, ...], Term]] = WeakValueDictionary()

    op: Op
    args: tuple[Term, ...]
    attrs: tuple[Attr, ...]
    shape: Mapping[str, int]
    _all_sizes: Mapping[str, int]
    _key: str | None

    def __new__(cls, op: Op, args: tuple[Term, ...] = (), attrs: tuple[Attr, ...] = ()) -> Term:
        op = Op(op)
        args = tuple(args)
        attrs = _normalize_attrs(op, tuple(attrs))
        cache_key = (op, tuple(id(a) for a in args), _attr_key(attrs))
        hit = cls._cache.get(cache_key)
        if hit is not None:
            return hit
        self = object.__new__(cls)
        object.__setattr__(self, "op", op)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "attrs", attrs)
        object.__setattr__(self, "_key", None)
        shape, all_sizes = _infer(self)
        object.__setattr__(self, "shape", MappingProxyType(shape))
        object.__setattr__(self, "_all_sizes", MappingProxyType(all_sizes))
        cls._cache[cache_key] = self
        return self

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Term is immutable")

    def __reduce__(self) -> tuple[Any, ...]:
        return (Term, (self.op, self.args, self.attrs))

    def __repr__(self) -> str:
        text = to_sexpr(self)
        return text if len(text) <= 200 else text[:197] + "..."

    # -- derived facts ----------------------------------------------------
    @property
    def axes(self) -> frozenset[str]:
        """The free axes of this term (its shape's keys)."""
        return frozenset(self.shape)

    @property
    def all_sizes(self) -> Mapping[str, int]:
        """Every axis named anywhere in this term (free or bound) and its size."""
        return self._all_sizes

    @property
    def axis(self) -> str:
        """The axis of a reduction, a `Split` or a `Gather`."""
        if self.op not in AXIS_ATTR and self.op is not Op.SPLIT:
            raise AttributeError(f"{self.op} has no axis")
        return str(self.attrs[0])

    @property
    def key(self) -> str:
        """A stable structural key: equal for equal terms, the same in every process."""
        if self._key is None:
            for node in postorder(self):
                if node._key is None:
                    h = hashlib.sha256()
                    h.update(node.op.value.encode())
                    h.update(repr(_attr_key(node.attrs)).encode())
                    for child in node.args:
                        h.update(b"|")
                        h.update(str(child._key).encode())
                    object.__setattr__(node, "_key", h.hexdigest()[:32])
        assert self._key is not None
        return self._key

    def size(self) -> int:
        """Number of elements of this term's value."""
        return math.prod(self.shape.values())


def postorder(root: Term) -> Iterator[Term]:
    """Every distinct node under `root` once, children before parents (iterative, so
    arbitrarily deep terms are fine)."""
    seen: set[int] = set()
    stack: list[tuple[Term, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in seen:
            continue
        if expanded:
            seen.add(id(node))
            yield node
            continue
        stack.append((node, True))
        for child in reversed(node.args):
            if id(child) not in seen:
                stack.append((child, False))


def dag_size(root: Term) -> int:
    """Number of distinct nodes in the DAG."""
    return sum(1 for _ in postorder(root))


MAX_DEPTH = 256
"""The deepest term a spec or a program file may build (a chain of N additions is N
deep). Every stage works iteratively or within Python's recursion limit below it, and the
certificate checker's own limit (400) leaves room for rewrites that deepen a term."""


def term_depth(root: Term, memo: dict[Term, int] | None = None) -> int:
    """Nodes on the longest path from `root` to a leaf (a leaf is 1 deep). `memo` carries
    depths between calls, so checking each new node of a growing term costs O(1).

    >>> x = In("x", (("i", 2),))
    >>> term_depth(add(exp(x), x))
    3
    """
    depths = memo if memo is not None else {}
    stack = [root]
    while stack:  # iterative post-order that stops at nodes already measured
        node = stack[-1]
        if node in depths:
            stack.pop()
            continue
        todo = [c for c in node.args if c not in depths]
        if todo:
            stack.extend(todo)
            continue
        depths[node] = 1 + max((depths[c] for c in node.args), default=0)
        stack.pop()
    return depths[root]


# -- attribute normalization --------------------------------------------------


def _attr_key(attrs: tuple[Attr, ...]) -> tuple[Any, ...]:
    # floats by exact bit pattern, so the cache never conflates distinct constants
    return tuple(("f", float(a).hex()) if isinstance(a, float) else a for a in attrs)


def _normalize_attrs(op: Op, attrs: tuple[Attr, ...]) -> tuple[Attr, ...]:
    if op is Op.CONST:
        if len(attrs) != 1 or isinstance(attrs[0], bool | tuple | str):
            raise ShapeError(f"Const takes one number, got {attrs!r}")
        value = float(attrs[0])
        if not math.isfinite(value):
            raise ShapeError(f"Const must be a finite real, got {value!r}")
        return (value + 0.0,)  # -0.0 -> 0.0: one real, one node
    if op is Op.IN:
        if len(attrs) != 2 or not isinstance(attrs[0], str) or not isinstance(attrs[1], tuple):
            raise ShapeError(f"In takes (name, dims), got {attrs!r}")
        name = attrs[0]
        if not name or any(c in name for c in " ()\t\n:;\"'"):
            raise ShapeError(f"bad input name {name!r}")
        dims: list[Dim] = []
        for dim in attrs[1]:
            group = tuple((_check_axis_name(a), _check_size(s)) for a, s in dim)
            if not group:
                raise ShapeError(f"In {name}: an empty dim group")
            dims.append(group)
        return (name, tuple(dims))
    if op in AXIS_ATTR:
        if len(attrs) != 1:
            raise ShapeError(f"{op} takes one axis, got {attrs!r}")
        return (_check_axis_name(attrs[0]),)
    if op is Op.IDX:
        if len(attrs) != 2:
            raise ShapeError(f"Idx takes (axis, size), got {attrs!r}")
        return (_check_axis_name(attrs[0]), _check_size(attrs[1]))
    if op is Op.READ:  # affine reads (issue 18 part 1): one canonical map text
        if len(attrs) != 1 or not isinstance(attrs[0], str | ReadMap):
            raise ShapeError(f"Read takes one affine map, got {attrs!r}")
        try:
            m = attrs[0] if isinstance(attrs[0], ReadMap) else parse_read_map(attrs[0])
        except ReadMapError as e:
            raise ShapeError(str(e)) from None
        return (m.text,)
    if op is Op.SPLIT:
        if len(attrs) != 2:
            raise ShapeError(f"Split takes (axis, factor), got {attrs!r}")
        return (_check_axis_name(attrs[0]), _check_size(attrs[1]))
    if attrs:
        raise ShapeError(f"{op} takes no attributes, got {attrs!r}")
    return ()


MAX_SIZE = 1 << 48
"""The largest axis size, and the most elements of any value or iteration space, that the
IR supports (2^48: flat indices and byte offsets stay far inside int64 in egglog and in
generated code)."""


def _check_size(size: object) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ShapeError(f"bad size {size!r}: sizes are positive integers")
    if size > MAX_SIZE:
        raise ShapeError(f"size {size} is over the largest supported size 2^48")
    return size


# -- shape inference ------------------------------------------------------------


def _describe(node: Term) -> str:
    parts = [f"  node: {node.op.value} {' '.join(map(str, node.attrs))}".rstrip()]
    for i, child in enumerate(node.args):
        shape = ", ".join(f"{a}:{s}" for a, s in child.shape.items())
        parts.append(f"  child {i}: {repr(child)[:120]}  shape {{{shape}}}")
    return "\n".join(parts)


def _merge_sizes(node: Term, maps: list[Mapping[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in maps:
        for axis, size in m.items():
            if out.setdefault(axis, size) != size:
                raise ShapeError(
                    f"axis {axis!r} has size {out[axis]} and {size} in one term "
                    f"(an axis name has one size everywhere)\n{_describe(node)}"
                )
    return out


def _infer(node: Term) -> tuple[dict[str, int], dict[str, int]]:
    """(free shape, every axis size seen below) of a node whose children are checked."""
    op, args, attrs = node.op, node.args, node.attrs
    if len(args) != ARITY[op]:
        raise ShapeError(f"{op.value} takes {ARITY[op]} children, got {len(args)}")
    for child in args:
        if not isinstance(child, Term):
            raise ShapeError(f"{op.value}: child {child!r} is not a Term")
    all_sizes = _merge_sizes(node, [c.all_sizes for c in args])
    shape: dict[str, int]
    if op is Op.CONST or op is Op.NEGINF:
        shape = {}
    elif op is Op.IDX:
        shape = {str(attrs[0]): int(attrs[1])}  # type: ignore[arg-type]
    elif op is Op.IN:
        shape = {}
        for dim in in_groups(node):
            for axis, size in dim:
                if axis in shape:
                    raise ShapeError(
                        f"input {attrs[0]} binds axis {axis!r} twice\n{_describe(node)}"
                    )
                shape[axis] = size
    elif op in UNARY or op is Op.STORE:
        shape = dict(args[0].shape)
    elif op in BINARY or op in TERNARY:
        shape = _merge_sizes(node, [a.shape for a in args])
    elif op is Op.SPLIT:
        axis, factor = str(attrs[0]), int(attrs[1])  # type: ignore[arg-type]
        x = args[0].shape
        if axis not in x:
            raise ShapeError(f"Split over axis {axis!r} that the operand lacks\n{_describe(node)}")
        if x[axis] % factor:
            raise ShapeError(
                f"Split factor {factor} does not divide size {x[axis]} of {axis!r}\n"
                f"{_describe(node)}"
            )
        outer, inner = split_axes(axis, factor)
        if outer in x or inner in x:
            raise ShapeError(f"Split of {axis!r} clashes with an existing axis\n{_describe(node)}")
        shape = {}
        for a, s in x.items():
            if a == axis:
                shape[outer], shape[inner] = s // factor, factor
            else:
                shape[a] = s
    elif op is Op.READ:
        shape = _read_shape(node)
    elif op is Op.GATHER:
        shape = _gather_shape(node)
    elif op in REDUCTIONS:
        axis = str(attrs[0])
        if op is Op.DOT:
            operand = _merge_sizes(node, [args[0].shape, args[1].shape])
        elif op is Op.SOFTMAXAVG:
            if axis not in args[0].shape:
                raise ShapeError(
                    f"SoftmaxAvg over axis {axis!r} that the scores lack\n{_describe(node)}"
                )
            operand = _merge_sizes(node, [args[0].shape, args[1].shape])
        else:
            operand = dict(args[0].shape)
        if axis not in operand:
            raise ShapeError(
                f"{op.value} over axis {axis!r}, which is not an axis of its operand\n"
                f"{_describe(node)}"
            )
        shape = {a: s for a, s in operand.items() if a != axis}
    else:  # pragma: no cover - every op is handled above
        raise ShapeError(f"unknown op {op!r}")
    all_sizes = _merge_sizes(node, [all_sizes, shape])
    shape = dict(sorted(shape.items()))
    return shape, all_sizes


def read_map(node: Term) -> ReadMap:
    """The affine map of a `Read` node (parsed once, cached)."""
    assert node.op is Op.READ
    return parse_read_map(str(node.attrs[0]))


def _read_shape(node: Term) -> dict[str, int]:
    m, x = read_map(node), node.args[0].shape
    sources = {a for a, _ in m.forms}
    if sources != set(x):
        raise ShapeError(f"Read gives index forms for axes {sorted(sources)} but its operand "
                         f"has axes {sorted(x)}\n{_describe(node)}")
    if m.pad is None:
        for a, _ in m.forms:
            lo, hi = m.span(a)
            if lo < 0 or hi >= x[a]:
                raise ShapeError(f"Read of axis {a!r} spans [{lo}, {hi}] outside its range "
                                 f"[0, {x[a] - 1}] and declares no pad\n{_describe(node)}")
    elif m.in_range(x):
        raise ShapeError(f"Read declares a pad that no index reaches (write pad=none)\n"
                         f"{_describe(node)}")
    return m.sizes


def _gather_shape(node: Term) -> dict[str, int]:
    """`Gather a x l`: x's axes but a, and l's axes (gathers, issue 18 part 3b)."""
    axis, (x, labels) = str(node.attrs[0]), node.args
    if labels.op is not Op.IN:
        raise ShapeError(f"Gather's labels must be an input (an integer input read whole), "
                         f"got {labels.op.value}\n{_describe(node)}")
    if axis not in x.shape:
        raise ShapeError(f"Gather over axis {axis!r} that the operand lacks\n{_describe(node)}")
    if axis in labels.shape:
        raise ShapeError(f"Gather over axis {axis!r}, which the labels also have\n"
                         f"{_describe(node)}")
    return _merge_sizes(node, [{a: s for a, s in x.shape.items() if a != axis}, labels.shape])


# -- constructors -----------------------------------------------------------------


def In(name: str, dims: tuple[tuple[str, int], ...] | tuple[Dim, ...]) -> Term:
    """An input whose declared dims are bound, in order, to axes.

    `dims` is either `(("i", 4), ("d", 8))` (one axis per dim) or a tuple of groups
    `((("i", 4),), (("h", 2), ("d", 4)))`, where a group reads one packed dim as
    several axes, outer first (a split of that dim).
    """
    groups: list[Dim] = []
    for d in dims:
        if len(d) == 2 and isinstance(d[0], str):
            groups.append(((d[0], cast(int, d[1])),))
        else:
            groups.append(cast(Dim, tuple(d)))
    return Term(Op.IN, (), (name, tuple(groups)))


def Const(value: float) -> Term:
    return Term(Op.CONST, (), (float(value),))


def _unary(op: Op) -> Any:
    def make(x: Term) -> Term:
        return Term(op, (x,))

    make.__name__ = op.value
    make.__doc__ = f"Elementwise `{op.value}`."
    return make


def _binary(op: Op) -> Any:
    def make(x: Term, y: Term) -> Term:
        return Term(op, (x, y))

    make.__name__ = op.value
    make.__doc__ = f"Elementwise `{op.value}`, broadcast by axis name."
    return make


neg, exp, log, sqrt, recip = (_unary(o) for o in (Op.NEG, Op.EXP, Op.LOG, Op.SQRT, Op.RECIP))
tanh, erf, sigmoid, relu, abs_ = (_unary(o) for o in (Op.TANH, Op.ERF, Op.SIGMOID, Op.RELU, Op.ABS))
add, sub, mul, div, max_, min_ = (
    _binary(o) for o in (Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.MAX, Op.MIN)
)


sin, cos = (_unary(o) for o in (Op.SIN, Op.COS))
lt, le, eq, ne = (_binary(o) for o in (Op.LT, Op.LE, Op.EQ, Op.NE))


def where(c: Term, x: Term, y: Term) -> Term:
    """`x` where `c` is nonzero, else `y` (elementwise, broadcast by axis name)."""
    return Term(Op.WHERE, (c, x, y))


def Idx(axis: str, size: int) -> Term:
    """The index of `axis` (of size `size`) as a value: `Idx(i)[i] = i`."""
    return Term(Op.IDX, (), (axis, size))


def idx_axis(node: Term) -> tuple[str, int]:
    """The axis and its size of an `Idx` node (typed access to its attributes)."""
    assert node.op is Op.IDX
    return str(node.attrs[0]), cast(int, node.attrs[1])


def NegInf() -> Term:
    """-inf, the value of a masked score (see docs/proofs.md, "Masks")."""
    return Term(Op.NEGINF)


def zero(x: Term) -> Term:
    """0 at every index of `x`'s shape (degenerate programs, issue 18 part 7): `x` is a
    shape witness only; codegen never computes it."""
    return Term(Op.ZERO, (x,))


def Sum(axis: str, x: Term) -> Term:
    return Term(Op.SUM, (x,), (axis,))


def Max(axis: str, x: Term) -> Term:
    return Term(Op.RMAX, (x,), (axis,))


def LSE(axis: str, x: Term) -> Term:
    return Term(Op.LSE, (x,), (axis,))


def SoftmaxAvg(axis: str, s: Term, v: Term) -> Term:
    return Term(Op.SOFTMAXAVG, (s, v), (axis,))


def Dot(axis: str, x: Term, y: Term) -> Term:
    return Term(Op.DOT, (x, y), (axis,))


def Split(axis: str, factor: int, x: Term) -> Term:
    return Term(Op.SPLIT, (x,), (axis, factor))


def Store(x: Term) -> Term:
    return Term(Op.STORE, (x,))


def Read(x: Term, forms: Mapping[str, tuple[Mapping[str, int], int]],
         sizes: Mapping[str, int], pad: float | None = None) -> Term:
    """`x` read at affine index forms: `forms[a] = ({b: coef}, const)` for every axis `a`
    of `x`, over the read's axes `b` of `sizes`; `pad` outside `x`'s range (None: every
    index must be in range). A map the pad cannot reach drops it (one term, one meaning).

    >>> x = In("x", (("i", 5),))
    >>> Read(x, {"i": ({"j": 2}, 1)}, {"j": 2}, pad=0.0)
    (Read i=2*j+1|j:2|pad=none (In x i:5))
    """
    try:
        m = make_read_map(forms, sizes, pad)
    except ReadMapError as e:
        raise ShapeError(str(e)) from None
    if m.pad is not None and set(forms) == set(x.shape) and m.in_range(x.shape):
        m = m.with_pad(None)
    return Term(Op.READ, (x,), (m.text,))


def Gather(axis: str, x: Term, labels: Term) -> Term:
    """`x` with its axis `axis` read at the integer values of `labels` (an `In` node of an
    integer input): `Gather(a, x, l)[i] = x[i, a = l[i]]`, free axes x's but `a`, and l's.

    >>> x = In("X", (("b", 2), ("X.c", 5)))
    >>> dict(Gather("X.c", x, In("y", (("b", 2),))).shape)
    {'b': 2}
    """
    return Term(Op.GATHER, (x, labels), (axis,))


def inputs(root: Term) -> dict[str, Term]:
    """The `In` nodes of a term by input name (one binding per name is expected by
    callers that need input layouts; the first found wins)."""
    out: dict[str, Term] = {}
    for node in postorder(root):
        if node.op is Op.IN:
            out.setdefault(str(node.attrs[0]), node)
    return out


def input_dims(node: Term) -> tuple[int, ...]:
    """The declared (packed) dim sizes of an `In` node, in declaration order."""
    assert node.op is Op.IN
    return tuple(math.prod(s for _, s in dim) for dim in in_groups(node))


def in_groups(node: Term) -> tuple[Dim, ...]:
    """The dim groups of an `In` node (typed access to `attrs[1]`)."""
    return cast(tuple[Dim, ...], node.attrs[1])


# -- printing: the canonical s-expression (parsed back by `kernelsat.sexpr`) -----------
# Here rather than in kernelsat.sexpr because a Term prints itself (`repr`) with it.


def _fmt_dims(dims: tuple[Dim, ...]) -> list[str]:
    out = []
    for dim in dims:
        parts = [f"{a}:{s}" for a, s in dim]
        out.append(parts[0] if len(parts) == 1 else "(" + " ".join(parts) + ")")
    return out


def _head(node: Term) -> list[str]:
    op = node.op
    if op is Op.IN:
        return [op.value, str(node.attrs[0]), *_fmt_dims(node.attrs[1])]  # type: ignore[arg-type]
    if op is Op.CONST:
        return [op.value, repr(node.attrs[0])]
    return [op.value, *(str(a) for a in node.attrs)]


def to_sexpr(root: Term) -> str:
    """The canonical text of a term (linear in the DAG size)."""
    refs: Counter[int] = Counter()
    order = list(postorder(root))
    for node in order:
        for child in node.args:
            refs[id(child)] += 1
    shared = {id(n) for n in order if refs[id(n)] > 1 and n.op not in LEAVES and n is not root}
    text: dict[int, str] = {}
    names: dict[int, str] = {}
    bindings: list[str] = []
    for node in order:
        parts = _head(node) + [names.get(id(c)) or text[id(c)] for c in node.args]
        s = parts[0] if node.op in LEAVES and len(parts) == 1 else "(" + " ".join(parts) + ")"
        if id(node) in shared:
            name = f"%{len(bindings)}"
            bindings.append(f"({name} {s})")
            names[id(node)] = name
        else:
            text[id(node)] = s
        # children texts are no longer needed once embedded: keep memory linear
        for c in node.args:
            if refs[id(c)] == 1:
                text.pop(id(c), None)
    body = text[id(root)]
    return f"(let ({' '.join(bindings)}) {body})" if bindings else body
