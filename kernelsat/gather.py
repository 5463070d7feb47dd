"""Gathers by integer inputs (issue 18 part 3b): the run-time bounds check and the label
bounds of a program.

`Gather(a, x, l)` reads `x` with its axis `a` at the integer values of the input `l`
(`X[b, labels[b]]` in a spec, `in labels[b:B] i32`). A label outside `[0, size of a)` is
no value of the program: every executor (the interpreter, the numpy, C and CUDA
backends) raises `GatherIndexError` naming the input, the position and the bound, and
never reads outside `x`.

>>> import numpy as np
>>> try:
...     check_labels("labels", np.array([0, 4, 2]), 4)
... except GatherIndexError as e:
...     print(e)
input labels[1] = 4 is out of range: a gather index must lie in [0, 4)
"""

from __future__ import annotations

import numpy as np

from kernelsat.ir import Term, input_dims, postorder
from kernelsat.ops import Op

INT_DTYPES: frozenset[str] = frozenset({"i32"})
"""The declarable integer element types (gather indices)."""


class GatherIndexError(IndexError):
    """A gather index (an integer input's element) outside the gathered axis."""

    def __init__(self, name: str, position: tuple[int, ...], value: int, bound: int):
        self.name, self.position, self.value, self.bound = name, position, value, bound
        at = ", ".join(map(str, position))
        super().__init__(f"input {name}[{at}] = {value} is out of range: a gather index "
                         f"must lie in [0, {bound})")


def check_labels(name: str, labels: np.ndarray, bound: int) -> None:
    """Raise `GatherIndexError` for the first element of `labels` (row-major) outside
    `[0, bound)` (or not an integer value)."""
    arr = np.asarray(labels)
    bad = (arr < 0) | (arr >= bound) | (arr != np.floor(arr))
    if bad.any():
        pos = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad.reshape(-1))), arr.shape))
        value = arr[pos] if arr.ndim else arr[()]
        raise GatherIndexError(name, pos, int(value) if np.isfinite(value) else 0, bound)


def gather_axis(node: Term) -> str:
    """The axis a `Gather` node reads at its labels."""
    assert node.op is Op.GATHER
    return str(node.attrs[0])


def label_bounds(root: Term) -> dict[str, int]:
    """Each integer input of `root` (an input some `Gather` reads labels from) and the
    exclusive bound of its values: the least size of the axes it indexes.

    >>> from kernelsat.ir import Gather, In
    >>> x = In("X", (("b", 2), ("X.c", 5)))
    >>> label_bounds(Gather("X.c", x, In("y", (("b", 2),))))
    {'y': 5}
    """
    out: dict[str, int] = {}
    for node in postorder(root):
        if node.op is Op.GATHER:
            name = str(node.args[1].attrs[0])
            size = node.args[0].shape[gather_axis(node)]
            out[name] = min(out.get(name, size), size)
    return out


def label_dims(root: Term) -> dict[str, tuple[int, ...]]:
    """The declared dims of each integer input of `root`."""
    return {str(n.args[1].attrs[0]): input_dims(n.args[1])
            for n in postorder(root) if n.op is Op.GATHER}
