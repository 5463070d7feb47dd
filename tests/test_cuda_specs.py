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
