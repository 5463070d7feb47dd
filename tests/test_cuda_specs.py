"""Every spec's CUDA source compiles with nvcc for sm_90 (where nvcc exists)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelsat.codegen import lower, render
from kernelsat.codegen.cuda import compile_cuda, find_nvcc
from kernelsat.spec import load_spec

SPECS = sorted(Path(__file__).resolve().parents[1].glob("specs/*.ks"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(find_nvcc() is None, reason="nvcc is not installed: CUDA not compiled"),
]


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_every_spec_compiles_for_sm90(path: Path) -> None:
    program = load_spec(str(path))
    source = render(lower(program.term, program.out_axes), None, backend="cuda")
    assert "__global__" in source
    report = compile_cuda(source)
    assert report.ok, report.log[-2000:]
    for name, res in report.kernels.items():
        assert res.registers > 0, name


def test_every_elementwise_op_compiles_for_sm90() -> None:
    """One kernel applying every elementwise op of the op table (CUDA's spelling where
    the table gives one): a new op's CUDA spelling is compile-checked too."""
    from kernelsat.ir import In, Term, add
    from kernelsat.ops import ELEMENTWISE, OPS

    x, y = In("x", (("i", 256),)), In("y", (("i", 256),))
    acc: Term = x
    for op in sorted(ELEMENTWISE, key=str):
        acc = add(acc, Term(op, (x, y)[: OPS[op].arity]))
    source = render(lower(acc, ("i",)), None, backend="cuda")
    for op in ELEMENTWISE:
        spelling = OPS[op].cuda or OPS[op].c
        assert spelling is not None and spelling.split("(")[0] in source, op
    report = compile_cuda(source)
    assert report.ok, report.log[-2000:]
