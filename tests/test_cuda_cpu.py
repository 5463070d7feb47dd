"""The rendered CUDA source itself, run on the CPU through the g++ shim
(`codegen/cuda_cpu.py`: a thread per CUDA thread, barriers for `__syncthreads`, a per-warp
exchange for `__shfl_xor_sync`, statics for `__shared__`), against the float64 reference:
every spec at odd small sizes and every value of every CUDA-only knob, the staged fused
attention at each key-block size and rows per block, random programs under each row
mapping. What this cannot check (speed, coalescing, the real scheduler) bench/gpu_check.sh
does on a GPU."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelsat.codegen import lower, render
from kernelsat.codegen.cuda import CUDA_KNOBS, ROW_MODES
from kernelsat.codegen.cuda_cpu import run_on_cpu
from kernelsat.interp import evaluate_as
from kernelsat.ir import Const, In, SoftmaxAvg, Sum, Term, add, div, mul
from kernelsat.testing import programs, random_inputs, relative_error, small_spec

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")

SPECS = sorted(Path(__file__).resolve().parents[1].glob("specs/*.ks"))
BOUND = 1e-5  # float32 arithmetic on these sizes lands near 1e-7


def _variants(lowered: Any) -> list[tuple[str, list[dict[str, Any]]]]:
    spaces = [k.knob_space() for k in lowered.kernels]
    out: list[tuple[str, list[dict[str, Any]]]] = [("default", [{} for _ in spaces])]
    for knob in sorted({k for sp in spaces for k in sp if k in CUDA_KNOBS}):
        for v in dict.fromkeys(x for sp in spaces for x in sp.get(knob, ())[1:]):
            out.append((f"{knob}={v}", [{knob: v, "tpb": 64} if v in sp.get(knob, ()) else {}
                                        for sp in spaces]))
    return out


def _run_all(term: Term, axes: tuple[str, ...], seed: int = 1) -> None:
    lowered = lower(term, axes)
    env = random_inputs(term, seed=seed)
    ref = evaluate_as(term, env, axes)
    for label, knobs in _variants(lowered):
        out = run_on_cpu(lowered, lowered.nests(knobs), env)
        assert not np.isnan(out).any(), f"{label}: unwritten output elements"
        assert relative_error(out, ref) < BOUND, label


def _small(path: Path, size: int) -> Any:
    return small_spec(str(path), size)


QUICK = ("softmax",)


@pytest.mark.parametrize("name", QUICK)
def test_quick_specs_every_cuda_knob_value(name: str) -> None:
    prog = _small(next(p for p in SPECS if p.stem == name), 37)
    _run_all(prog.term, prog.out_axes)


@pytest.mark.slow
@pytest.mark.parametrize("path", [p for p in SPECS if p.stem not in QUICK],
                         ids=[p.stem for p in SPECS if p.stem not in QUICK])
def test_every_spec_every_cuda_knob_value(path: Path) -> None:
    prog = _small(path, 21)
    _run_all(prog.term, prog.out_axes)


def _attention(b: int, m: int, n: int, d: int, e: int) -> tuple[Term, tuple[str, ...]]:
    q = In("Q", (("b", b), ("i", m), ("d", d)))
    k = In("K", (("b", b), ("n", n), ("d", d)))
    v = In("V", (("b", b), ("n", n), ("e", e)))
    bias = In("M", (("i", m), ("n", n)))
    score = add(div(Sum("d", mul(q, k)), Const(2.0)), bias)
    return SoftmaxAvg("n", score, v), ("b", "i", "e")


@pytest.mark.parametrize("knobs", [{}, {"cuda.keys": 16}, {"cuda.keys": 128, "tpb": 64},
                                   {"tpb": 512}, {"flash": False, "cuda.rows": "warp"},
                                   {"flash": False, "cuda.rows": "block"}])
def test_staged_attention(knobs: dict[str, Any]) -> None:
    """The fused attention's staged kernel (K/V blocks in shared memory, a warp per query
    row) with a score epilogue reading another buffer (a bias), key counts that are no
    multiple of the key block, query rows that are no multiple of the rows per block."""
    term, axes = _attention(2, 37, 45, 5, 7)
    lowered = lower(term, axes)
    assert "cuda.keys" in lowered.kernels[0].knob_space()
    source = render(lowered, [knobs], backend="cuda")
    if "flash" not in knobs:
        assert "__shared__ float ks_K[" in source and "__shared__ float ks_V[" in source
        assert "__shfl_xor_sync" in source
    env = random_inputs(term, seed=4)
    out = run_on_cpu(lowered, lowered.nests([knobs]), env)
    assert relative_error(out, evaluate_as(term, env, axes)) < BOUND


@pytest.mark.slow
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(term=programs(max_depth=3, sizes=(1, 3, 5, 33)), mode=st.sampled_from(ROW_MODES),
       seed=st.integers(0, 1000))
def test_random_programs_on_the_shim(term: Term, mode: str, seed: int) -> None:
    axes = tuple(term.shape)
    lowered = lower(term, axes)
    knobs = [{"cuda.rows": mode, "tpb": 64} if "cuda.rows" in k.knob_space() else {}
             for k in lowered.kernels]
    env = random_inputs(term, seed=seed)
    ref = evaluate_as(term, env, axes)
    with np.errstate(all="ignore"):
        out = run_on_cpu(lowered, lowered.nests(knobs), env).astype(np.float64)
    finite = np.isfinite(ref) & (np.abs(ref) < 1e30)
    assert not np.isnan(out[finite]).any()
    if finite.any():
        assert relative_error(np.where(finite, out, 0), np.where(finite, ref, 0)) < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("mode", ROW_MODES)
def test_contraction_without_the_gemm_statement(mode: str) -> None:
    """`gemm=False`: the contraction's loop lowering (register tile, vector accumulators,
    the epilogue) under each row mapping."""
    prog = _small(next(p for p in SPECS if p.stem == "matmul_bias_gelu"), 19)
    lowered = lower(prog.term, prog.out_axes)
    knobs = [{"gemm": False, "cuda.rows": mode, "tpb": 64} if "gemm" in k.knob_space()
             else {} for k in lowered.kernels]
    env = random_inputs(prog.term, seed=5)
    out = run_on_cpu(lowered, lowered.nests(knobs), env)
    assert relative_error(out, evaluate_as(prog.term, env, prog.out_axes)) < BOUND
