"""Multi-contractions: an elementwise function of several contractions that share the
reduction axis, the output axes and one operand (GLU variants: silu(X Wg) * (X Wu)) lowers
to one blocked GEMM whose microkernel multiplies the shared A panel with several B panels
at once, the accumulator tiles combined by the epilogue on the way out. Each against the
float64 interpreter at odd sizes, for every legal knob value."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.codegen import LoweredProgram, build, lower, render
from kernelsat.codegen.cuda_cpu import run_on_cpu
from kernelsat.codegen.gemm import contraction_of, register_tile
from kernelsat.codegen.loops import Gemm
from kernelsat.codegen.simd import REGISTERS, register_cost
from kernelsat.interp import evaluate_as
from kernelsat.ir import Dot, In, Store, Sum, Term, input_dims, inputs, mul, sub
from kernelsat.macros import ELEMENTWISE

KNOBS = ("mr", "nr", "vw", "kc", "mc", "nc", "par")


def check_c(term: Term, axes: tuple[str, ...], knobs: dict[str, Any] | None,
            folder: Path, seed: int = 0) -> LoweredProgram:
    """Lower, build for C with `knobs` on every kernel, run, compare to float64."""
    lowered = lower(term, axes)
    rng = np.random.default_rng(seed)
    env = {name: rng.standard_normal(input_dims(node)).astype(np.float32)
           for name, node in inputs(term).items()}
    exe = build(lowered, "c", [knobs] * len(lowered.kernels) if knobs else None, folder)
    out = np.empty(lowered.buffers["out"].shape, np.float32)
    exe(env, out)
    want = evaluate_as(term, {x: v.astype(np.float64) for x, v in env.items()}, axes)
    scale = 1.0 + float(np.max(np.abs(want)))
    depth = max(term.all_sizes.get("k", 1), term.all_sizes.get("d", 1), 1)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5 * scale * depth,
                               err_msg=f"{axes} {knobs}")
    return lowered


def glu(m: int, n: int, k: int, layout: str = "kn", count: int = 2, g: int = 0
        ) -> tuple[Term, tuple[str, ...]]:
    """silu(X W0) * (X W1) [* ...] (+ X W2 ... for count 3), W_t read (k, j) or (j, k)
    per `layout` letter, with a batch axis of `g` when g > 0."""
    batch = (("g", g),) if g else ()
    x = In("X", (*batch, ("i", m), ("k", k)))
    ws = [In(f"W{t}", (*batch, *((("k", k), ("j", n)) if layout[t % len(layout)] == "k"
                                 else (("j", n), ("k", k)))))
          for t in range(count)]
    dots: list[Term] = [Dot("k", x, w) if t % 2 == 0 else Sum("k", mul(w, x))
                        for t, w in enumerate(ws)]
    value = mul(ELEMENTWISE["silu"].build(dots[0]), dots[1])
    for extra in dots[2:]:
        value = sub(value, extra)
    axes = ("g", "i", "j") if g else ("i", "j")
    return value, axes


def test_detection() -> None:
    t, axes = glu(5, 7, 3)
    c = contraction_of(lower(t, axes).kernels[0])
    assert c is not None and c.count == 2 and (c.m, c.n, c.k) == ("i", "j", "k")
    assert str(c.a.attrs[0]) == "X"
    t, axes = glu(5, 7, 3, count=3, g=2)
    c = contraction_of(lower(t, axes).kernels[0])
    assert c is not None and c.count == 3 and c.outer == ("g",)
    # the output's stride-1 axis is X's: X is the B operand, the weights stacked A panels
    t, _ = glu(5, 7, 3)
    c = contraction_of(lower(t, ("j", "i")).kernels[0])
    assert c is not None and c.shared == "b" and (c.m, c.n) == ("j", "i")
    assert str(c.b.attrs[0]) == "X"


def test_one_microkernel_pass_holds_every_tile_in_registers() -> None:
    for count in (2, 3):
        for mr in (1, 6, 14):
            for nr in (16, 32, 64):
                r, n = register_tile(mr, nr, 16, count, "a")  # B panels side by side
                assert register_cost(r, n * count, 16) <= REGISTERS
                r, n = register_tile(mr, nr, 16, count, "b")  # A panels stacked
                assert register_cost(r * count, n, 16) <= REGISTERS
    for axes, ukr in ((("i", "j"), "ks_ukr_6x64_v16"), (("j", "i"), "ks_ukr_6x64_v16")):
        t, _ = glu(64, 64, 64)
        nest = lower(t, axes).kernels[0].nest()
        gemm = nest.body[0]
        assert isinstance(gemm, Gemm) and len(gemm.more) == 1
        assert gemm.shared == ("a" if axes[-1] == "j" else "b")
        source = render(lower(t, axes), None, "c")
        assert source.count(ukr + "(") == 2  # one microkernel call computes both tiles
        assert source.count("aligned_alloc") == 2  # A and B panels, no scratch (one kc)


@pytest.mark.parametrize(("sizes", "layout", "count", "out_t"), [
    ((37, 45, 130), "kn", 2, False),  # two kc blocks with 64/128: the scratch partial sums
    ((37, 45, 130), "kn", 2, True),   # the same with the weights as stacked A panels
    ((9, 70, 17), "nk", 2, False),    # B read transposed; edge tiles
    ((20, 33, 64), "kn", 3, True),    # three contractions
])
def test_every_knob_value(tmp_path: Path, sizes: tuple[int, int, int], layout: str,
                          count: int, out_t: bool) -> None:
    t, axes = glu(*sizes, layout=layout, count=count)
    if out_t:
        axes = axes[::-1]
    space = lower(t, axes).kernels[0].knob_space()
    assert space["gemm"][0] is True
    rounds = max(len(space[k]) for k in KNOBS)
    for r in range(rounds):
        knobs = {k: space[k][r % len(space[k])] for k in KNOBS}
        check_c(t, axes, {"gemm": True, **knobs}, tmp_path)


@settings(max_examples=10, deadline=None)
@given(m=st.sampled_from([1, 3, 17, 33]), n=st.sampled_from([1, 5, 17, 40]),
       k=st.sampled_from([1, 3, 31, 70]), layout=st.sampled_from(["kn", "nk", "kk"]),
       count=st.sampled_from([2, 3]), g=st.sampled_from([0, 2]), out_t=st.booleans(),
       data=st.data())
def test_random_multi_contractions(m: int, n: int, k: int, layout: str, count: int, g: int,
                                   out_t: bool, data: st.DataObject) -> None:
    t, axes = glu(m, n, k, layout=layout, count=count, g=g)
    if out_t:
        axes = axes[::-1]
    space = lower(t, axes).kernels[0].knob_space()
    knobs: dict[str, Any] = {}
    if "gemm" in space:
        knobs = {x: data.draw(st.sampled_from(space[x]), label=x) for x in KNOBS}
    with tempfile.TemporaryDirectory() as folder:
        check_c(t, axes, knobs or None, Path(folder))


def test_swiglu_hidden_layer_as_one_kernel(tmp_path: Path) -> None:
    """The swiglu program with H = silu(X Wg) * (X Wu) as one kernel and Y = H Wd as a
    second: the first is a multi-contraction, the second a GEMM, both equal float64."""
    t_, d, f = 13, 17, 40
    x = In("X", (("t", t_), ("d", d)))
    wg, wu = In("Wg", (("d", d), ("f", f))), In("Wu", (("d", d), ("f", f)))
    wd = In("Wd", (("f", f), ("e", d)))
    h = mul(ELEMENTWISE["silu"].build(Dot("d", x, wg)), Sum("d", mul(x, wu)))
    y = Sum("f", mul(Store(h), wd))
    lowered = check_c(y, ("t", "e"), None, tmp_path)
    kinds = [contraction_of(k) for k in lowered.kernels]
    assert [c.count if c else 0 for c in kinds] == [2, 1]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not installed")
@pytest.mark.parametrize("out_t", [False, True])
def test_cuda_renders_a_multi_contraction_as_loops(out_t: bool) -> None:
    """CUDA has no multi-contraction kernel: its plain loops, run on the CPU through
    codegen/cuda_cpu.py, equal float64."""
    t, axes = glu(17, 33, 9, count=2)
    axes = axes[::-1] if out_t else axes
    lowered = lower(t, axes)
    source = render(lowered, None, backend="cuda")
    assert "__global__" in source and "aligned_alloc" not in source
    rng = np.random.default_rng(1)
    env = {name: rng.standard_normal(input_dims(node)).astype(np.float32)
           for name, node in inputs(t).items()}
    out = run_on_cpu(lowered, lowered.nests(), env)
    want = evaluate_as(t, {x: v.astype(np.float64) for x, v in env.items()}, axes)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


def test_stats_count_every_contraction() -> None:
    t, axes = glu(6, 10, 4, count=2)
    stats = lower(t, axes).kernels[0].stats
    assert stats.flops >= 2 * (2 * 6 * 10 * 4)
