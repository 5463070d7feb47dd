"""Every spec's CUDA source compiles with nvcc for sm_90 (where nvcc exists), at the
default knobs and at every value of every CUDA-only knob (`codegen.cuda.CUDA_KNOBS`, one
knob at a time, the others at their defaults), with the structure the knob asks for."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelsat.codegen import lower, render
from kernelsat.codegen.cuda import CUDA_KNOBS, compile_cuda, find_nvcc
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


def _variants(path: Path) -> list[tuple[str, list[dict[str, object]]]]:
    """(label, knobs per kernel) for each value of each CUDA knob any kernel has."""
    program = load_spec(str(path))
    lowered = lower(program.term, program.out_axes)
    spaces = [k.knob_space() for k in lowered.kernels]
    out = []
    for knob in sorted({k for sp in spaces for k in sp if k in CUDA_KNOBS}):
        values = dict.fromkeys(v for sp in spaces for v in sp.get(knob, ()))
        for value in values:
            knobs = [{knob: value} if value in sp.get(knob, ()) else {} for sp in spaces]
            if knob == "cuda.rows" and value == "block":
                knobs = [{**k, "tpb": 256} if k else k for k in knobs]
            out.append((f"{knob}={value}", knobs))
    return out


@pytest.mark.parametrize("path", SPECS, ids=[p.stem for p in SPECS])
def test_every_spec_compiles_at_every_cuda_knob_value(path: Path) -> None:
    program = load_spec(str(path))
    lowered = lower(program.term, program.out_axes)
    for label, knobs in _variants(path):
        source = render(lowered, knobs, backend="cuda")
        report = compile_cuda(source)
        assert report.ok, f"{path.stem} {label}: {report.log[-2000:]}"
        if label == "cuda.rows=thread":
            assert "__shfl_xor_sync" not in source, label
        if label in ("cuda.rows=warp", "cuda.rows=block") and "ks_As" not in source:
            assert "ks_lane" in source, label
        if label.startswith("cuda.b"):
            assert "__shared__ float ks_As" in source, label
        for name, res in report.kernels.items():
            assert res.spill_stores == 0 or label.startswith("cuda."), (label, name)


def test_every_elementwise_op_compiles_for_sm90() -> None:
    """One kernel applying every elementwise op of the op table (CUDA's spelling where
    the table gives one): a new op's CUDA spelling is compile-checked too."""
    from kernelsat.ir import In, Term, add
    from kernelsat.ops import ELEMENTWISE, OPS

    x, y = In("x", (("i", 256),)), In("y", (("i", 256),))
    acc: Term = x
    for op in sorted(ELEMENTWISE, key=str):
        acc = add(acc, Term(op, (x, y, x)[: OPS[op].arity]))
    source = render(lower(acc, ("i",)), None, backend="cuda")
    for op in ELEMENTWISE:
        spelling = OPS[op].cuda or OPS[op].c
        assert spelling is not None and spelling.split("(")[0] in source, op
    report = compile_cuda(source)
    assert report.ok, report.log[-2000:]


def test_fused_attention_compiles_at_every_key_block_and_block_size() -> None:
    """The staged fused attention at the attention spec's sizes (D = 64): every legal key
    block (`cuda.keys`) and threads per block compile for sm_90 without spills, its shared
    memory under the 48 KiB a block may declare statically."""
    from kernelsat.ir import Const, In, SoftmaxAvg, Sum, div, mul, sqrt

    q = In("Q", (("b", 1), ("h", 8), ("i", 1024), ("d", 64)))
    k = In("K", (("b", 1), ("h", 8), ("n", 1024), ("d", 64)))
    v = In("V", (("b", 1), ("h", 8), ("n", 1024), ("e", 64)))
    term = SoftmaxAvg("n", div(Sum("d", mul(q, k)), sqrt(Const(64.0))), v)
    lowered = lower(term, ("b", "h", "i", "e"))
    space = lowered.kernels[0].knob_space()
    for keys in space["cuda.keys"]:
        for tpb in space["tpb"]:
            source = render(lowered, [{"cuda.keys": keys, "tpb": tpb}], backend="cuda")
            report = compile_cuda(source)
            assert report.ok, report.log[-2000:]
            res = report.kernels["ks_kernel0"]
            assert res.spill_stores == 0 and res.shared_bytes <= 48 * 1024, (keys, tpb, res)
