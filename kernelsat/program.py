"""A parsed kernel: its inputs, its output and the term that computes it."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kernelsat.ir import Term


@dataclass(frozen=True)
class InputDecl:
    """An `in` declaration: a name, its dims (axis name -> size parameter resolved) and dtype."""

    name: str
    dims: tuple[int, ...]
    dtype: str = "f32"
    dim_names: tuple[str, ...] = ()
    role: str = "data"  # how random inputs fill it: "data", "positive" or "onehot" (last dim)


@dataclass(frozen=True)
class Program:
    """A kernel as the spec wrote it.

    `term` is the output's value; every named intermediate is a `Store` inside it, so
    the term as parsed is the eager one-kernel-per-statement baseline. `out_axes` is
    the output's memory layout (its declared axis order)."""

    name: str
    params: dict[str, int]
    inputs: tuple[InputDecl, ...]
    out_name: str
    out_axes: tuple[str, ...]
    term: Term
    source: str = ""
    path: str = "<spec>"
    statements: tuple[str, ...] = field(default=())
    out_dims: tuple[tuple[str, ...], ...] = ()
    """The output array's dims when they are not one per axis: each a group of
    `out_axes` in order (`out Y[b, (g, c)]`: one dim of size G*C), `()` a size-1 (keepdim)
    dim (`out Y[i, 1]`). The term and every backend compute the same elements in the same
    memory order (`out_axes`); only the array's shape, `out_shape`, differs."""

    @property
    def out_shape(self) -> tuple[int, ...]:
        """The output array's shape: the product of each dim's axis sizes (1 for `()`).

        >>> from kernelsat.ir import In
        >>> x = In("X", (("i", 3), ("j", 2)))
        >>> Program("k", {}, (), "Y", ("i", "j"), x, out_dims=(("i", "j"), ())).out_shape
        (6, 1)
        """
        dims = self.out_dims or tuple((a,) for a in self.out_axes)
        return tuple(math.prod(self.term.shape[a] for a in d) for d in dims)

    @property
    def out_layout(self) -> tuple[str, ...]:
        """The output's declared dims as written: `i`, `(g, c)`, or `1` for a size-1 dim."""
        dims = self.out_dims or tuple((a,) for a in self.out_axes)
        return tuple("1" if not d else d[0] if len(d) == 1 else f"({', '.join(d)})"
                     for d in dims)

    def input(self, name: str) -> InputDecl:
        for decl in self.inputs:
            if decl.name == name:
                return decl
        raise KeyError(name)

    def with_term(self, term: Term) -> Program:
        """The same kernel computed by another (equivalent) term."""
        if dict(term.shape) != dict(self.term.shape):
            raise ValueError(
                f"shape {dict(term.shape)} differs from the spec's {dict(self.term.shape)}"
            )
        return Program(
            self.name,
            self.params,
            self.inputs,
            self.out_name,
            self.out_axes,
            term,
            self.source,
            self.path,
            self.statements,
            self.out_dims,
        )
