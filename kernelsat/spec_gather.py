"""Gathers in the spec language (issue 18 part 3b): `X[b, labels[b]]`, `E[ids[t], d]`.

An integer input (`in labels[b:B] i32`) is only ever an index: an item `NAME[axes]` in a
use of a float input reads that dim at the labels' values (a `Gather` node over the dim's
hidden axis `X.dim`), the labels' axes free in the result beside the use's other axes; in
a use of an intermediate it reads the stored value's axis at the labels (a `Gather` over
the `Store`: the value is computed once, whole). Used as a value it is an error at the
offending token.

>>> from kernelsat.spec import parse_spec
>>> p = parse_spec('''
... kernel ce(B=2, C=5)
... in X[b:B, c:C] f32
... in y[b:B] i32
... out L[b] = logsumexp(c: X[b, c]) - X[b, y[b]]
... ''')
>>> [d.dtype for d in p.inputs], "(Gather X.c (In X b:2 X.c:5) (In y b:2))" in repr(p.term)
(['f32', 'i32'], True)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from kernelsat import ir
from kernelsat.gather import INT_DTYPES
from kernelsat.ir import Term
from kernelsat.ops import Op
from kernelsat.spec_syntax import Axis, GatherIndex, InStmt, Loc, Ref, SpecError


class Builder(Protocol):
    """What gathers need of the spec builder (`kernelsat.spec._Builder`)."""

    sizes: dict[str, tuple[int, Loc]]
    inputs: dict[str, InStmt]
    input_sizes: dict[str, tuple[int, ...]]

    def err(self, loc: Loc, what: str, expected: str) -> SpecError: ...

    def bind(self, axis: str, size: int, loc: Loc) -> None: ...

    def make(self, loc: Loc, fn: Callable[..., Term], *args: object, **kw: object) -> Term: ...

    def use_input(self, decl: InStmt, e: Ref) -> Term: ...

    def use_intermediate(self, it: Any, e: Ref) -> Term: ...


def _labels_decl(b: Builder, item: GatherIndex) -> InStmt:
    decl = b.inputs.get(item.labels)
    if decl is None:
        raise b.err(item.loc, f"{item.labels!r} is not an input",
                    f"an integer input declared 'in {item.labels}[...] i32' (a gather index)")
    if decl.dtype not in INT_DTYPES:
        raise b.err(item.loc, f"{item.labels} is a {decl.dtype} input, not an integer one",
                    f"an integer input for a gather index (declare it "
                    f"'in {item.labels}[...] i32')")
    if len(item.axes) != len(decl.dims):
        raise b.err(item.loc, f"{item.labels} has {len(decl.dims)} dims but is indexed with "
                    f"{len(item.axes)}", f"{item.labels}[{', '.join(d.name for d in decl.dims)}]")
    for a in item.axes:
        if a.size is not None:
            raise b.err(a.loc, f"a size on axis {a.name} of the gather index {item.labels}",
                        "plain axis names (the labels' declaration gives their sizes)")
    return decl


def gather_sizes(b: Builder, item: GatherIndex) -> None:
    """Bind the axes of a gather index `labels[b, s]` to the labels' declared sizes."""
    _labels_decl(b, item)
    for a, n in zip(item.axes, b.input_sizes[item.labels], strict=True):
        b.bind(a.name, n, a.loc)


def _labels(b: Builder, item: GatherIndex) -> Term:
    return b.make(item.loc, ir.In, item.labels, tuple(
        (a.name, n) for a, n in zip(item.axes, b.input_sizes[item.labels], strict=True)))


def intermediate_use(b: Builder, it: Any, e: Ref) -> Term:
    """A use of an intermediate (`kernelsat.spec.Intermediate`: its `axes` and `store`);
    with gather items, the plain use (the gathered axes as themselves) gathered at the
    labels: `LP[b, labels[b]]` is `Gather(c, LP's Store, labels)`."""
    gathers = {k: item for k, item in enumerate(e.index or ()) if isinstance(item, GatherIndex)}
    if not gathers:
        return b.use_intermediate(it, e)
    assert e.index is not None
    if len(e.index) != len(it.axes):
        raise b.err(e.loc, f"{e.name} has {len(it.axes)} axes but is indexed with "
                    f"{len(e.index)}", f"{e.name}[{', '.join(it.axes)}]")
    if e.pad is not None:
        raise b.err(e.loc, f"a pad on the gathered use of {e.name}",
                    "no pad (a gather index outside its dim is a run-time error)")
    items: list[object] = list(e.index)
    for k, item in gathers.items():
        gather_sizes(b, item)  # uses of intermediates are not sized in advance
        items[k] = Axis(it.axes[k], item.loc)
    term = b.use_intermediate(it, Ref(e.name, tuple(items), e.loc))  # type: ignore[arg-type]
    if term.op is Op.READ:
        raise b.err(e.loc, f"a gather and an affine index or slice in one use of {e.name}",
                    "plain axes beside a gather index (read the window in a statement "
                    "of its own)")
    for k, item in gathers.items():
        term = b.make(item.loc, ir.Gather, it.axes[k], term, _labels(b, item))
    return term


def input_use(b: Builder, decl: InStmt, e: Ref) -> Term:
    """A use of an input: an integer input is an error here (it only indexes gathers);
    a use with gather items is the plain use over hidden axes, gathered at the labels."""
    if decl.dtype in INT_DTYPES:
        raise b.err(e.loc, f"{e.name} is an integer input ({decl.dtype}): it can only index "
                    "a gather", f"a gather such as X[b, {e.name}[b]] (or declare it f32)")
    gathers = {k: item for k, item in enumerate(e.index or ()) if isinstance(item, GatherIndex)}
    if not gathers:
        return b.use_input(decl, e)
    assert e.index is not None
    if e.pad is not None:
        raise b.err(e.loc, f"a pad on the gathered use of {e.name}",
                    "no pad (a gather index outside its dim is a run-time error)")
    items: list[object] = list(e.index)
    hidden: dict[int, tuple[str, GatherIndex]] = {}
    for k, item in gathers.items():
        axis = f"{e.name}.{decl.dims[k].name}"  # a name no spec can write
        b.bind(axis, b.input_sizes[e.name][k], item.loc)
        hidden[k] = (axis, item)
        items[k] = Axis(axis, item.loc)
    plain = Ref(e.name, tuple(items), e.loc)  # type: ignore[arg-type]
    term = b.use_input(decl, plain)
    if term.op is Op.READ:
        raise b.err(e.loc, f"a gather and an affine index or slice in one use of {e.name}",
                    "plain axes beside a gather index (read the window in a statement "
                    "of its own)")
    for axis, item in hidden.values():
        term = b.make(item.loc, ir.Gather, axis, term, _labels(b, item))
    return term
