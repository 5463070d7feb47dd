"""The symbolic semantics of the IR: every op over `Sym` real expressions.

`SCALAR` gives each elementwise op's meaning on one real (one table, used both by
the elementwise verifier on patterns and by `evaluate` on tensors). Partial ops
record where they are defined: `div`/`recip` append `ne0(divisor)`, `log` appends
`gt0(arg)`, `sqrt` appends `ge0(arg)` to the domain list. `evaluate` computes a
term over tensors of `Sym` (numpy object arrays with named axes), mirroring
`kernelsat.interp`: `LSE_a x = log sum_a exp x` and
`SoftmaxAvg_a(s, v) = (sum_a exp(s) v) / sum_a exp(s)` (the max-shifted forms the
float interpreter computes are equal over the reals; a test checks the two agree).

>>> from kernelsat.ir import In, Sum, mul
>>> x = In("x", (("i", 2),))
>>> evaluate(Sum("i", mul(x, x)), inputs_for(x)).array.item()
((x[0]*x[0]) + (x[1]*x[1]))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import cast

import numpy as np

from kernelsat.interp import align_axes, read_indices
from kernelsat.ir import Dim, Term, idx_axis, postorder, read_map, split_axes
from kernelsat.ops import BINARY, BY_NAME, ELEMENTWISE, OPS, UNINTERPRETED, Op
from kernelsat.proofs.normalize import (
    ONE,
    ZERO,
    Sym,
    add,
    const,
    fn,
    ge0,
    gt0,
    ite,
    max_,
    min_,
    mul,
    ne0,
    neg,
    recip,
    var,
)
from kernelsat.sexpr import Atom, SNode, read

Domain = list[Sym]


def _div(x: Sym, y: Sym, dom: Domain) -> Sym:
    dom.append(ne0(y))
    return mul(x, recip(y))


def _recip(x: Sym, dom: Domain) -> Sym:
    dom.append(ne0(x))
    return recip(x)


def _log(x: Sym, dom: Domain) -> Sym:
    dom.append(gt0(x))
    return fn("log", x)


def _sqrt(x: Sym, dom: Domain) -> Sym:
    dom.append(ge0(x))
    return fn("sqrt", x)


PRIMITIVE: dict[Op, Callable[..., Sym]] = {
    Op.NEG: lambda x, d: neg(x),
    Op.LOG: _log,
    Op.SQRT: _sqrt,
    Op.RECIP: _recip,
    Op.ADD: lambda x, y, d: add(x, y),
    Op.SUB: lambda x, y, d: add(x, neg(y)),
    Op.MUL: lambda x, y, d: mul(x, y),
    Op.DIV: _div,
    Op.MAX: lambda x, y, d: max_(x, y),
    Op.MIN: lambda x, y, d: min_(x, y),
    # comparisons are 1.0 where they hold, else 0.0; where selects on a nonzero condition
    Op.LT: lambda x, y, d: ite(gt0(add(y, neg(x))), ONE, ZERO),
    Op.LE: lambda x, y, d: ite(ge0(add(y, neg(x))), ONE, ZERO),
    Op.EQ: lambda x, y, d: ite(ne0(add(x, neg(y))), ZERO, ONE),
    Op.NE: lambda x, y, d: ite(ne0(add(x, neg(y))), ONE, ZERO),
    Op.WHERE: lambda c, x, y, d: ite(ne0(c), x, y),
}
"""The ops the op table marks `primitive`, built from the algebra of `proofs.normalize`,
and the partial uninterpreted ones, which record their domain."""


def _uninterpreted(op: Op) -> Callable[..., Sym]:
    return lambda x, d: fn(op.value, x)


def _expand(node: SNode, env: Mapping[str, Sym]) -> Sym:
    if isinstance(node, Atom):
        return env[node.text[1:]]
    head, *kids = cast(tuple[Atom, ...], node.items)
    if head.text == "Const":
        return const(float(kids[0].text))
    # a definition is total: a partial op inside one records no domain condition (the
    # op table's definitions only apply them where defined, e.g. log(1 + e^x))
    return SCALAR[BY_NAME[head.text]](*(_expand(k, env) for k in kids), [])


def _defined(template: str) -> Callable[..., Sym]:
    (body,) = read(template, "<op definition>")
    return lambda *args: _expand(body, dict(zip(("x", "y"), args[:-1], strict=False)))


def _meaning(op: Op) -> Callable[..., Sym]:
    sym = OPS[op].sym
    if op in PRIMITIVE:
        return PRIMITIVE[op]
    if sym == "uninterpreted":
        return _uninterpreted(op)
    assert sym is not None, op
    return _defined(sym)


SCALAR: dict[Op, Callable[..., Sym]] = {op: _meaning(op) for op in OPS if op in ELEMENTWISE}
"""The meaning of each elementwise op on one real; the last argument is the domain list.
From the op table's `sym`: a primitive, an uninterpreted function (`exp tanh erf`), or
its definition over the others (`sigmoid(x) = 1 / (1 + exp(-x))`)."""


@dataclass(frozen=True)
class SymTensor:
    """A tensor of symbolic reals whose dimensions carry axis names."""

    array: np.ndarray
    axes: tuple[str, ...]

    def to(self, axes: tuple[str, ...]) -> np.ndarray:
        """The array with dimensions in order `axes` (size 1 for the missing ones)."""
        return align_axes(self.array, self.axes, axes)

    def entries(self, order: tuple[str, ...], shape: Mapping[str, int]) -> list[Sym]:
        """Every entry, dense, in row-major order over `order`."""
        full = np.broadcast_to(self.to(order), [shape[a] for a in order])
        return list(full.reshape(-1))


def _objects(x: object) -> np.ndarray:
    out = np.empty((), dtype=object) if not isinstance(x, np.ndarray) else x
    if not isinstance(x, np.ndarray):
        out[()] = x
    return out


def _union(*ts: SymTensor) -> tuple[str, ...]:
    out: list[str] = []
    for t in ts:
        out.extend(a for a in t.axes if a not in out)
    return tuple(out)


def _elementwise(node: Term, args: list[SymTensor], dom: Domain) -> SymTensor:
    f = SCALAR[node.op]
    axes = _union(*args)
    ufunc = np.frompyfunc(lambda *xs: f(*xs, dom), len(args), 1)
    return SymTensor(_objects(ufunc(*(a.to(axes) for a in args))), axes)


def _rows(t: SymTensor, axis: str, sizes: Mapping[str, int]) -> tuple[np.ndarray, tuple[str, ...]]:
    """The operand broadcast to full size with `axis` last, as (rows, axis) and the kept axes."""
    keep = tuple(a for a in t.axes if a != axis)
    full = np.broadcast_to(t.to((*keep, axis)), [*(sizes[a] for a in keep), sizes[axis]])
    return full.reshape(-1, sizes[axis]), keep


def _fold(rows: np.ndarray, keep: tuple[str, ...], sizes: Mapping[str, int],
          combine: Callable[[list[Sym]], Sym]) -> SymTensor:
    out = np.empty(len(rows), dtype=object)
    for r, row in enumerate(rows):
        out[r] = combine(list(row))
    return SymTensor(out.reshape([sizes[a] for a in keep]), keep)


def _reduction(combine: Callable[[list[Sym]], Sym]) -> Callable[..., SymTensor]:
    def run(node: Term, args: list[SymTensor], dom: Domain) -> SymTensor:
        sizes = node.all_sizes
        rows, keep = _rows(args[0], node.axis, sizes)
        return _fold(rows, keep, sizes, combine)

    return run


def _pairwise(node: Term, args: list[SymTensor],
              combine: Callable[[list[Sym], list[Sym]], Sym]) -> SymTensor:
    sizes, axis = node.all_sizes, node.axis
    axes = _union(*args)
    keep = tuple(a for a in axes if a != axis)
    order = (*keep, axis)
    shape = [*(sizes[a] for a in keep), sizes[axis]]
    x = np.broadcast_to(args[0].to(order), shape).reshape(-1, sizes[axis])
    y = np.broadcast_to(args[1].to(order), shape).reshape(-1, sizes[axis])
    out = np.empty(len(x), dtype=object)
    for r in range(len(x)):
        out[r] = combine(list(x[r]), list(y[r]))
    return SymTensor(out.reshape([sizes[a] for a in keep]), keep)


def _softmax_avg(node: Term, args: list[SymTensor], dom: Domain) -> SymTensor:
    def combine(s: list[Sym], v: list[Sym]) -> Sym:
        w = [fn("exp", si) for si in s]
        return mul(add(*(mul(wi, vi) for wi, vi in zip(w, v, strict=True))), recip(add(*w)))

    return _pairwise(node, args, combine)


def _dot(node: Term, args: list[SymTensor], dom: Domain) -> SymTensor:
    return _pairwise(node, args, lambda x, y: add(*(mul(a, b) for a, b in zip(x, y, strict=True))))


def _split(node: Term, args: list[SymTensor], dom: Domain) -> SymTensor:
    (x,) = args
    axis, factor = node.axis, int(node.attrs[1])  # type: ignore[arg-type]
    k = x.axes.index(axis)
    shape = list(x.array.shape)
    new_shape = [*shape[:k], shape[k] // factor, factor, *shape[k + 1:]]
    outer, inner = split_axes(axis, factor)
    return SymTensor(x.array.reshape(new_shape), (*x.axes[:k], outer, inner, *x.axes[k + 1:]))


def _read(node: Term, args: list[SymTensor], dom: Domain) -> SymTensor:
    """An affine read is composition (the operand's entry at the index forms); outside
    the operand's range it is the pad: a constant, or for -inf the opaque real that
    `NegInf` stands for (docs/proofs.md, "Affine reads")."""
    (x,) = args
    m = read_map(node)
    index, valid = read_indices(m, x.axes, x.array.shape)
    own = tuple(a for a, _ in m.axes)
    shape = tuple(n for _, n in m.axes)
    out = np.empty(shape, dtype=object)
    picked = x.array[index] if index else np.broadcast_to(x.array, shape)
    out[...] = picked
    if valid is not None:
        assert m.pad is not None
        pad = var(NEGINF_VAR) if math.isinf(m.pad) else const(m.pad)
        out[~valid] = pad
    return SymTensor(out, own)


def _gather(node: Term, args: list[SymTensor], dom: Domain) -> SymTensor:
    """A gather is a read of x at a data-dependent index (issue 18 part 3b): the label
    `l` (an input entry, an opaque real) selects x's entry along the axis through a chain
    of exact selections, `ite(l != 0, ite(l != 1, ... x[n-1]), x[0])`. For every label in
    `[0, n)` (the range generated code checks at run time) that is `x[l]`, so what is
    proved for every real `l` holds for every program run (docs/proofs.md, "Gathers")."""
    x, labels = args
    a = str(node.attrs[0])
    keep = tuple(b for b in x.axes if b != a)
    axes = (*keep, *(b for b in labels.axes if b not in keep))
    sizes = node.all_sizes
    n = sizes[a]
    shape = [sizes[b] for b in axes]
    src = np.broadcast_to(x.to((*axes, a)), [*shape, n])
    lab = np.broadcast_to(labels.to(axes), shape)
    out = np.empty(shape, dtype=object)
    for idx in np.ndindex(*shape):
        value = src[idx][n - 1]
        for c in range(n - 2, -1, -1):
            value = ite(ne0(add(lab[idx], const(-c))), value, src[idx][c])
        out[idx] = value
    return SymTensor(out, axes)


EVAL: dict[Op, Callable[[Term, list[SymTensor], Domain], SymTensor]] = {
    **{op: _elementwise for op in SCALAR},
    Op.SUM: _reduction(lambda xs: add(*xs)),
    Op.RMAX: _reduction(lambda xs: max_(*xs)),
    Op.LSE: _reduction(lambda xs: fn("log", add(*(fn("exp", x) for x in xs)))),
    Op.SOFTMAXAVG: _softmax_avg,
    Op.DOT: _dot,
    Op.SPLIT: _split,
    Op.STORE: lambda node, args, dom: args[0],
    Op.READ: _read,
    Op.GATHER: _gather,
}
"""The symbolic meaning of every op with children."""

assert set(SCALAR) >= BINARY


def inputs_for(root: Term, positive: frozenset[str] = frozenset()) -> dict[str, SymTensor]:
    """A fresh real variable `name[i,j..]` for every entry of every input of `root`."""
    env: dict[str, SymTensor] = {}
    for node in postorder(root):
        if node.op is not Op.IN or str(node.attrs[0]) in env:
            continue
        name = str(node.attrs[0])
        groups = cast(tuple[Dim, ...], node.attrs[1])
        axes = tuple(a for dim in groups for a, _ in dim)
        sizes = tuple(s for dim in groups for _, s in dim)
        arr = np.empty(sizes, dtype=object)
        for idx in np.ndindex(*sizes):
            arr[idx] = var(f"{name}[{','.join(map(str, idx))}]")
        env[name] = SymTensor(arr, axes)
    return env


NEGINF_VAR = "-inf"
"""The variable `NegInf` stands for: a real the proof knows nothing about, so a rule
proved for every real holds with it in place of -inf (docs/proofs.md, "Masks")."""


def evaluate(root: Term, env: Mapping[str, SymTensor], dom: Domain | None = None) -> SymTensor:
    """The symbolic value of `root`; partial ops append their domain to `dom`. A constant
    is its exact value (a rule's constant variable is proved as a scalar input, never
    as a placeholder value that a literal could equal)."""
    dom = [] if dom is None else dom
    values: dict[int, SymTensor] = {}
    for node in postorder(root):
        if node.op is Op.IN:  # bound to this node's axes (a use may rename them)
            have = env[str(node.attrs[0])]
            groups = cast(tuple[Dim, ...], node.attrs[1])
            axes = tuple(a for dim in groups for a, _ in dim)
            sizes = tuple(s for dim in groups for _, s in dim)
            out = have if have.axes == axes else SymTensor(have.array.reshape(sizes), axes)
        elif node.op is Op.CONST:
            value = float(node.attrs[0])  # type: ignore[arg-type]
            out = SymTensor(_objects(const(value)), ())
        elif node.op is Op.NEGINF:  # an opaque real (docs/proofs.md, "Masks")
            out = SymTensor(_objects(var(NEGINF_VAR)), ())
        elif node.op is Op.IDX:
            axis, size = idx_axis(node)
            arr = np.empty(size, dtype=object)
            for k in range(size):
                arr[k] = const(k)
            out = SymTensor(arr, (axis,))
        else:
            out = EVAL[node.op](node, [values[id(c)] for c in node.args], dom)
        values[id(node)] = out
    return values[id(root)]


def to_float(s: Sym, env: Mapping[str, float]) -> float:
    """The value of a (normalized or raw) expression at a point, in float64."""
    match s.op:
        case "var":
            return env[str(s.value)]
        case "const":
            return float(cast(Fraction, s.value))
        case "add":
            return math.fsum(to_float(a, env) for a in s.args)
        case "mul":
            return math.prod(to_float(a, env) for a in s.args)
        case "recip":
            d = to_float(s.args[0], env)
            return 1 / d if d else math.nan
        case "max":
            return max(to_float(a, env) for a in s.args)
        case "min":
            return min(to_float(a, env) for a in s.args)
        case "fn":
            return FLOAT_FN[str(s.value)](to_float(s.args[0], env))
        case "ite":
            c = to_float(s.args[0].args[0], env)
            holds = {"gt0": c > 0, "ge0": c >= 0, "ne0": c != 0}[s.args[0].op]
            return to_float(s.args[1] if holds else s.args[2], env)
    raise AssertionError(s.op)


def _float_fn(op: Op) -> Callable[[float], float]:
    """The op table's float64 semantics of `op` on one float (NaN outside its domain)."""
    f = OPS[op].numpy
    assert f is not None, op

    def run(x: float) -> float:
        with np.errstate(all="ignore"):
            return float(f(np.float64(x)))

    return run


FLOAT_FN: dict[str, Callable[[float], float]] = {op.value: _float_fn(op) for op in UNINTERPRETED}
"""Each uninterpreted function's float64 value on one float (`to_float`)."""


__all__ = ["ONE", "SCALAR", "ZERO", "SymTensor", "evaluate", "inputs_for", "to_float"]
