"""A parsed kernel: its inputs, its output and the term that computes it."""

from __future__ import annotations

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
    out_keep: tuple[int, ...] = ()
    """Positions of size-1 (keepdim) dims in the output array, `out Y[i, 1] = ...`: the
    array has shape `out_shape`; the term and every backend compute the same elements in
    the same memory order without them (`out_axes`)."""

    @property
    def out_shape(self) -> tuple[int, ...]:
        """The output array's shape: the sizes of `out_axes`, 1 at each `out_keep`
        position.

        >>> from kernelsat.ir import In
        >>> Program("k", {}, (), "Y", ("i",), In("X", (("i", 3),)), out_keep=(1,)).out_shape
        (3, 1)
        """
        sizes = [self.term.shape[a] for a in self.out_axes]
        for k in sorted(self.out_keep):
            sizes.insert(k, 1)
        return tuple(sizes)

    @property
    def out_layout(self) -> tuple[str, ...]:
        """The output's declared dims: its axes with "1" at each keepdim position."""
        names = list(self.out_axes)
        for k in sorted(self.out_keep):
            names.insert(k, "1")
        return tuple(names)

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
            self.out_keep,
        )
