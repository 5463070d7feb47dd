"""The CUDA schedule space (`cuda.rows`, the shared-memory GEMM's tiles), checked without a
GPU: the row mapping emulated on the CPU against the float64 reference (lanes, lane-strided
loops, the xor butterfly, the block's shared-memory merge), the combine inference refusing
what it cannot merge, and the rendered source's structure. Compilation with nvcc for sm_90
at every knob value: tests/test_cuda_specs.py."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelsat.codegen import lower, render
from kernelsat.codegen.cuda import (
    CUDA_KNOBS,
    GEMM_KNOBS,
    ROW_MODES,
    CUDARenderer,
    device_body,
    emulate,
    row_plan,
    thread_loops,
)
from kernelsat.codegen.cuda_emulate import Combine, combine_ok
from kernelsat.codegen.loops import Affine, Array, Assign, Call, Let, Lit, Load, Loop, Ref
from kernelsat.interp import evaluate_as
from kernelsat.ir import LSE, In, Max, SoftmaxAvg, Sum, Term, div, exp, mul, sub
from kernelsat.spec import load_spec
from kernelsat.testing import programs, random_inputs, relative_error, small_spec

SPECS = sorted(Path(__file__).resolve().parents[1].glob("specs/*.ks"))


def _small(path: Path, size: int = 37):
    """The spec at small sizes (`size` not a multiple of a warp or any tile; batch-like
    parameters of at most 8 become 2), shrunk where its work would make emulation slow."""
    return small_spec(str(path), size)


def _knobs(lowered, mode: str, tpb: int = 64) -> list[dict[str, object]]:
    return [{"cuda.rows": mode, "tpb": tpb} if "cuda.rows" in k.knob_space() else {}
            for k in lowered.kernels]


def _check(term: Term, out_axes: tuple[str, ...], mode: str, tpb: int = 64,
           seed: int = 0) -> float:
    lowered = lower(term, out_axes)
    env = random_inputs(term, seed=seed)
    ref = evaluate_as(term, env, out_axes)
    out = emulate(lowered, lowered.nests(_knobs(lowered, mode, tpb)), env)
    assert not np.isnan(out).any(), "an output element was never written"
    return relative_error(out, ref)


# -- emulated against the reference ----------------------------------------------------

CHEAP = [p for p in SPECS if not any(s in p.stem for s in ("attention", "bmm", "swiglu", "mlp"))]


@pytest.mark.parametrize("mode", ROW_MODES)
@pytest.mark.parametrize("path", CHEAP, ids=[p.stem for p in CHEAP])
def test_spec_rows_emulated_match_reference(path: Path, mode: str) -> None:
    prog = _small(path)
    assert _check(prog.term, prog.out_axes, mode) < 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("mode", ROW_MODES)
@pytest.mark.parametrize("path", [p for p in SPECS if p not in CHEAP],
                         ids=[p.stem for p in SPECS if p not in CHEAP])
def test_spec_rows_emulated_match_reference_large(path: Path, mode: str) -> None:
    prog = _small(path, 19)
    assert _check(prog.term, prog.out_axes, mode) < 1e-12


def _attention(n: int, d: int, rows: int) -> tuple[Term, tuple[str, ...]]:
    q, k = In("Q", (("i", rows), ("d", d))), In("K", (("j", n), ("d", d)))
    v = In("V", (("j", n), ("e", d)))
    return SoftmaxAvg("j", Sum("d", mul(q, k)), v), ("i", "e")


@pytest.mark.parametrize("mode", ROW_MODES)
@pytest.mark.parametrize("variant", [{}, {"flash": False, "stage": False},
                                     {"flash": False, "stage": True}])
def test_fused_attention_rows(mode: str, variant: dict[str, bool]) -> None:
    """The single-pass online softmax (running max, rescaled sum and output row), as the
    fused attention statement's plain loops or as `lower`'s own nest: its accumulators
    are split over the lanes and merged with the online combine."""
    term, axes = _attention(45, 5, 3)
    lowered = lower(term, axes)
    space = lowered.kernels[0].knob_space()
    knobs = [{"cuda.rows": mode, "tpb": 64, **{k: v for k, v in variant.items() if k in space}}]
    env = random_inputs(term, seed=3)
    out = emulate(lowered, lowered.nests(knobs), env)
    assert relative_error(out, evaluate_as(term, env, axes)) < 1e-12
    if mode != "thread" and not variant.get("stage"):
        _, _, body = thread_loops(device_body(lowered.kernels[0].nest(knobs[0]).body))
        kinds = {c.kind for s in row_plan(body) for c in s.combines}
        assert {"online", "scaled"} <= kinds


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(term=programs(max_depth=3, sizes=(1, 3, 5, 33)), mode=st.sampled_from(ROW_MODES[1:]),
       seed=st.integers(0, 1000))
def test_random_programs_rows_emulated(term: Term, mode: str, seed: int) -> None:
    """Random programs (reductions, LSE, SoftmaxAvg, Dot, splits, stores) under a warp or a
    block per row equal the float64 reference."""
    axes = tuple(term.shape)
    if math.prod(term.all_sizes.values()) > 40_000:
        return
    lowered = lower(term, axes)
    env = random_inputs(term, seed=seed)
    ref = evaluate_as(term, env, axes)
    out = emulate(lowered, lowered.nests(_knobs(lowered, mode, 64)), env)
    finite = np.isfinite(ref)
    assert np.array_equal(np.isfinite(out), finite)
    if finite.any():
        assert relative_error(np.where(finite, out, 0), np.where(finite, ref, 0)) < 1e-9


# -- the combine inference ------------------------------------------------------------------


def _loop(*body: object) -> Loop:
    return Loop("r", 40, tuple(body), "reduce")


X = Load("in0", Affine.var("r"))


def test_combine_check_accepts_sum_and_max() -> None:
    acc = Ref("acc")
    assert combine_ok(_loop(Assign(acc, Call("add", (acc, X)))), {"acc": 0.0},
                      (Combine("acc", "sum"),))
    assert combine_ok(_loop(Assign(acc, Call("select_gt", (X, acc, X, acc)))),
                      {"acc": -math.inf}, (Combine("acc", "max"),))


def test_combine_check_refuses_wrong_merges() -> None:
    acc = Ref("acc")
    # a sum started from 1: every lane would add the 1 again
    assert not combine_ok(_loop(Assign(acc, Call("add", (acc, X)))), {"acc": 1.0},
                          (Combine("acc", "sum"),))
    # a product merged as a sum
    assert not combine_ok(_loop(Assign(acc, Call("mul", (acc, X)))), {"acc": 1.0},
                          (Combine("acc", "sum"),))
    # the last value seen (order-dependent): no merge is right
    assert not combine_ok(_loop(Assign(acc, X)), {"acc": 0.0}, (Combine("acc", "max"),))


def test_unmergeable_loops_run_in_every_lane() -> None:
    """A reduction loop whose accumulator is not a sum/max/online pair (here: a
    running product, and a scatter into a local array) is not split."""
    acc, arr = Ref("acc"), Ref("arr", Affine.var("r"))
    body = (Let("acc", Lit(1.0), mutable=True),
            _loop(Assign(acc, Call("mul", (acc, X)))),
            Array("arr", 40, 0.0),
            _loop(Assign(arr, X)))
    assert [s.mode for s in row_plan(body)] == ["all", "all", "all", "all"]


# -- the rendered source --------------------------------------------------------------------


def _source(path: Path, knobs: dict[str, object]) -> str:
    prog = load_spec(str(path))
    lowered = lower(prog.term, prog.out_axes)
    per_kernel = [{k: v for k, v in knobs.items() if k in kern.knob_space()}
                  for kern in lowered.kernels]
    return render(lowered, per_kernel, backend="cuda")


SOFTMAX = next(p for p in SPECS if p.stem == "softmax")
MATMUL = next(p for p in SPECS if p.stem == "matmul")


def test_thread_rows_use_no_shuffle() -> None:
    src = _source(SOFTMAX, {"cuda.rows": "thread"})
    assert "__shfl_xor_sync" not in src and "__shared__" not in src


def test_warp_rows_shuffle_without_shared_memory() -> None:
    src = _source(SOFTMAX, {"cuda.rows": "warp"})
    assert "__shfl_xor_sync" in src and "__shared__" not in src
    assert "threadIdx.x & 31" in src and "ks_lane < " not in src


def test_block_rows_merge_warps_in_shared_memory() -> None:
    src = _source(SOFTMAX, {"cuda.rows": "block", "tpb": 256})
    assert "__shfl_xor_sync" in src and "__shared__ float ks_red" in src
    assert "__syncthreads();" in src and "ks_w < 8" in src


def test_gemm_stages_tiles_in_shared_memory() -> None:
    src = _source(MATMUL, {"cuda.bm": 128, "cuda.bn": 32, "cuda.bk": 8, "cuda.tm": 8,
                           "cuda.tn": 2})
    assert "__shared__ float ks_As[8][128 + 1];" in src
    assert "__shared__ float ks_Bs[8][32 + 1];" in src
    assert "float ks_acc[8][2];" in src and "fmaf(" in src
    assert "wmma" not in src and "mma.sync" not in src  # float32 FMA only, no TF32


def test_launch_geometry() -> None:
    prog = load_spec(str(SOFTMAX))
    lowered = lower(prog.term, prog.out_axes)
    rows = prog.params["M"]
    for mode, tpb, blocks in (("thread", 128, -(-rows // 128)), ("warp", 128, rows // 4),
                              ("block", 256, rows)):
        nest = lowered.kernels[0].nest({"cuda.rows": mode, "tpb": tpb})
        launch = CUDARenderer().launch(nest)
        assert (launch.blocks, launch.threads) == (blocks, tpb)
    mm = load_spec(str(MATMUL))
    nest = lower(mm.term, mm.out_axes).kernels[0].nest({"cuda.bm": 32, "cuda.bn": 128,
                                                        "cuda.tm": 2, "cuda.tn": 8})
    launch = CUDARenderer().launch(nest)
    m, n = mm.params["M"], mm.params["N"]
    assert (launch.blocks, launch.threads) == (-(-m // 32) * -(-n // 128), 16 * 16)


def test_cuda_knobs_only_where_they_act() -> None:
    """`cuda.rows` only for kernels that reduce; the GEMM tiles only for contractions."""
    x = In("x", (("i", 8), ("n", 40)))
    assert not CUDA_KNOBS & set(lower(exp(x), ("i", "n")).kernels[0].knob_space())
    space = lower(div(exp(sub(x, Max("n", x))), Sum("n", exp(x))), ("i", "n")).kernels[0]
    assert set(space.knob_space()) & CUDA_KNOBS == {"cuda.rows"}
    mm = load_spec(str(MATMUL))
    assert set(GEMM_KNOBS) <= set(lower(mm.term, mm.out_axes).kernels[0].knob_space())
    _ = LSE


def test_block_merge_that_would_overflow_shared_memory_is_not_split() -> None:
    """A block of 512 threads merging a 4096-float accumulator (a 256-wide tile of j times
    16 lanes) per warp would need 256 KiB of shared memory: that reduction runs whole in
    every lane instead (still right); with 64 threads and 4 lanes it fits and merges."""
    x = In("x", (("i", 2), ("j", 256), ("n", 48)))
    term = Sum("n", x)
    lowered = lower(term, ("i", "j"))
    base = {"cuda.rows": "block", "tile.j": 256, "order": ("i", "j")}
    src = CUDARenderer().render(lowered, [lowered.kernels[0].nest({**base, "tpb": 64,
                                                                     "vec": 4})])
    assert "ks_red" in src
    nest = lowered.kernels[0].nest({**base, "tpb": 512, "vec": 16})
    src = CUDARenderer().render(lowered, [nest])
    assert "ks_red" not in src
    if shutil.which("g++") is not None:  # the source itself, on the CPU shim
        from kernelsat.codegen.cuda_cpu import run_on_cpu

        env = random_inputs(term, seed=0)
        out = run_on_cpu(lowered, [nest], env)
        assert relative_error(out, evaluate_as(term, env, ("i", "j"))) < 1e-5


def test_negated_negative_literal_is_no_decrement() -> None:
    """`neg` of a negative constant: `(-(-1.5f))`, not `--1.5f` (found by the random
    programs on the CPU shim)."""
    from kernelsat.ir import Const, neg

    src = render(lower(neg(Const(-1.5)), ()), None, backend="cuda")
    assert "--" not in src and "(-(-1.5f))" in src


def test_the_default_row_mapping_follows_the_kernel_shape() -> None:
    """With nothing timed, each reducing kernel's default `cuda.rows` comes from its
    shape: a thread per row where the rows fill the GPU, a warp where 32 lanes a row do or
    the row is short, a block for few long rows."""
    from kernelsat.codegen.cuda import FILL_THREADS, row_modes

    def first(rows: int, length: int) -> str:
        x = In("x", (("i", rows), ("n", length)))
        (kernel,) = lower(Sum("n", x), ("i",)).kernels
        modes = row_modes(kernel)
        assert sorted(modes) == sorted(ROW_MODES)
        assert kernel.knob_space()["cuda.rows"] == modes
        return modes[0]

    assert first(FILL_THREADS, 8) == "thread"
    assert first(4096, 1000) == "warp"  # softmax-like rows: at most 1024 long
    assert first(FILL_THREADS // 16, 4096) == "warp"  # enough rows for a warp each
    assert first(4096, 4096) == "block"
    assert first(64, 262144) == "block"  # a variance of 64 long rows


@pytest.mark.parametrize("name", ["softmax", "layernorm", "logsumexp", "variance"])
def test_the_gpu_defaults_split_every_row_loop(name: str) -> None:
    """Without knobs, CUDA gets one element a lane and no kept row (`cuda_defaults`): a
    warp-per-row softmax then splits all three of its row loops over the lanes and keeps
    no row-local array; the defaults equal the reference, emulated and as source run on
    the CPU."""
    from kernelsat.codegen.cuda import cuda_defaults
    from kernelsat.codegen.cuda_cpu import run_on_cpu

    prog = _small(SPECS[[p.stem for p in SPECS].index(name)])
    low = lower(prog.term, prog.out_axes)
    knobs = cuda_defaults(low)
    assert all(k.get("vec", 1) == 1 and not k.get("keep", False) for k in knobs)
    source = render(low, None, "cuda")
    assert source == render(low, knobs, "cuda")
    if name == "softmax":
        assert source.count("+= 32)") == 3 and "float acc2[" not in source
    env = random_inputs(prog.term, seed=5)
    ref = evaluate_as(prog.term, env, prog.out_axes)
    full = [{**k, "cuda.rows": "warp"} for k in knobs]
    assert relative_error(emulate(low, low.nests(full), env), ref) < 1e-12
    out = run_on_cpu(low, low.nests(full), env)
    assert relative_error(out.astype(np.float64), ref) < 1e-5


@pytest.mark.parametrize("name", ["softmax", "layernorm", "rmsnorm", "attention"])
def test_the_cuda_knob_table_lists_the_gpu_defaults_first(name: str) -> None:
    """The search's default setting on the cuda backend (each knob's first value) is
    the GPU's untimed default, not the CPU's: one element a lane, no kept row."""
    from kernelsat.codegen.cuda import GPU_DEFAULTS, cuda_defaults
    from kernelsat.hardware.knobs import default_setting, kernel_name, knob_table
    from kernelsat.hardware.targets import get_target

    prog = _small(SPECS[[p.stem for p in SPECS].index(name)])
    low = lower(prog.term, prog.out_axes)
    gpu = knob_table(low, "cuda", get_target("h100"))
    cpu = knob_table(low, "c", get_target("c"))
    first = default_setting(gpu)
    checked = 0
    for i, wanted in enumerate(cuda_defaults(low)):
        kernel = kernel_name(low.kernels[i], i)
        for knob, value in wanted.items():
            if knob in gpu.get(kernel, {}):
                assert first[kernel][knob] == value == GPU_DEFAULTS[knob]
                assert set(gpu[kernel][knob]) == set(cpu[kernel][knob])  # reordered only
                checked += 1
    assert checked
