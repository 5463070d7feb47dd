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
        )
