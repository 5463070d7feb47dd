"""The numpy target: vectorized, the quick path.

Each kernel becomes generated Python: one line per node, calling the float32 semantics
of the reference interpreter's op table (`kernelsat.interp.EVAL`) on whole arrays, with
`Store` buffers passed from kernel to kernel. The callable writes into `out` in place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernelsat.codegen.c import check_args
from kernelsat.codegen.lower import LoweredProgram, _kernel_nodes, in_axes, live_args
from kernelsat.interp import EVAL, Tensor
from kernelsat.ir import Term, idx_axis
from kernelsat.ops import SHAPE_ONLY, Op

F32 = np.dtype(np.float32)


def _leaf(node: Term, arrays: Mapping[str, np.ndarray], prog: LoweredProgram) -> Tensor:
    if node.op is Op.CONST:
        return Tensor(np.asarray(node.attrs[0], F32), ())
    if node.op in SHAPE_ONLY:  # a fill: the operand only gives the shape
        return Tensor(np.asarray(0.0, F32), ())
    if node.op is Op.NEGINF:
        return Tensor(np.asarray(-np.inf, F32), ())
    if node.op is Op.IDX:
        axis, size = idx_axis(node)
        return Tensor(np.arange(size, dtype=F32), (axis,))
    if node.op is Op.STORE:
        buf = prog.buffers[prog.store_buffer[node]]
        return Tensor(arrays[buf.name], buf.axes)
    pairs = in_axes(node)
    arr = arrays[prog.input_buffer[str(node.attrs[0])]].reshape([s for _, s in pairs])
    return Tensor(arr, tuple(a for a, _ in pairs))


def render_numpy(prog: LoweredProgram) -> tuple[str, list[Term]]:
    """Python source of the program and the node table it indexes (`N[k]`)."""
    nodes: list[Term] = []
    lines = ["def run(arrays, N, leaf, ev, dense):"]
    for kern in prog.kernels:
        lines.append(f"    # kernel {kern.index} -> {kern.out}")
        names: dict[int, str] = {}
        for node in _kernel_nodes(kern.term):
            k = len(nodes)
            nodes.append(node)
            var = f"v{k}"
            names[id(node)] = var
            if not live_args(node) or (node.op is Op.STORE and node is not kern.term):
                lines.append(f"    {var} = leaf(N[{k}], arrays)")
            else:
                args = ", ".join(names[id(c)] for c in node.args)
                lines.append(f"    {var} = ev(N[{k}], [{args}])")
        root = names[id(kern.term)]
        lines.append(f"    arrays[{kern.out!r}][...] = dense({root}, N[{len(nodes) - 1}], "
                     f"{tuple(prog.buffers[kern.out].axes)!r})")
    return "\n".join(lines) + "\n", nodes


@dataclass
class NumpyExecutable:
    prog: LoweredProgram
    source: str
    nodes: list[Term]
    _fn: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        scope: dict[str, Any] = {}
        exec(compile(self.source, "<kernelsat numpy>", "exec"), scope)
        self._fn = scope["run"]
        self._temps = {b.name: np.empty(b.shape, F32)
                       for b in self.prog.buffers.values() if b.role == "temp"}

    def __call__(self, inputs: Mapping[str, np.ndarray], out: np.ndarray) -> None:
        arrays = check_args(self.prog, inputs, out)
        arrays.update(self._temps)
        prog = self.prog

        def ev(node: Term, args: list[Tensor]) -> Tensor:
            res = EVAL[node.op](node, args, F32)
            return Tensor(np.asarray(res.array, F32), res.axes)

        def dense(t: Tensor, node: Term, axes: tuple[str, ...]) -> np.ndarray:
            return t.dense(axes, node.shape)

        with np.errstate(all="ignore"):
            self._fn(arrays, self.nodes, lambda n, a: _leaf(n, a, prog), ev, dense)


def build_numpy(prog: LoweredProgram) -> NumpyExecutable:
    source, nodes = render_numpy(prog)
    return NumpyExecutable(prog, source, nodes)
