"""What a program computes and moves: the one place FLOPs and bytes are counted.

Every count reads the op table. An op costs `FLOPS_PER_ELEMENT[op]` flops per point of
its iteration space, and a transcendental or online op one transcendental evaluation
per point besides (`op_work`); an element moved costs `ITEMSIZE[dtype]` bytes. Codegen
counts the calls of the loops it emits (recomputation included), the roofline model
counts the nodes of a term's kernels, extraction counts e-nodes: all through
`op_work` and `iteration_space`, and all report `KernelStats`.

>>> from kernelsat.ir import In, Sum, exp
>>> x = In("x", (("i", 4), ("n", 8)))
>>> term_points(Sum("n", exp(x)))  # the reduction visits every (i, n)
32
>>> op_work(Op.EXP, 32)
(256.0, 32.0)
>>> term_flops(Sum("n", exp(x)))
288
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from kernelsat.ir import Term, postorder
from kernelsat.ops import FLOPS_PER_ELEMENT, ONLINE, TRANSCENDENTAL, Op

ITEMSIZE: dict[str, int] = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
"""Bytes per element of each floating-point dtype."""


class KernelStats(NamedTuple):
    """What one kernel computes and moves (a tuple: unpack it or use the names)."""

    flops: float
    bytes_read: float
    bytes_written: float
    transcendentals: float = 0.0

    @property
    def bytes(self) -> float:
        """All memory traffic: read plus written."""
        return self.bytes_read + self.bytes_written


def iteration_space(op: Op, shape: Mapping[str, int],
                    operand_shapes: Iterable[Mapping[str, int]]) -> int:
    """Points an op visits: its output's axes joined with its operands' (a reduction
    also visits the axis it removes). A `Split` renames an axis: it visits its output
    only (the operand's axis is the same elements); so does a `Gather` (one element of
    the gathered axis per output point)."""
    space = dict(shape)
    if op is not Op.SPLIT and op is not Op.GATHER:
        for operand in operand_shapes:
            space.update(operand)
    return math.prod(space.values())


def op_work(op: Op, points: int | float) -> tuple[float, float]:
    """(flops, transcendental evaluations) of `op` over `points` points."""
    transcendental = op in TRANSCENDENTAL or op in ONLINE
    return float(FLOPS_PER_ELEMENT[op] * points), float(points if transcendental else 0)


def term_points(node: Term) -> int:
    """`iteration_space` of one term node."""
    return iteration_space(node.op, node.shape, (a.shape for a in node.args))


def term_flops(term: Term) -> int:
    """Analytic FLOPs of a term: `op_work` of each DAG node once over its iteration space
    (an integer: every count is a whole number)."""
    return int(sum(op_work(n.op, term_points(n))[0] for n in postorder(term)))
