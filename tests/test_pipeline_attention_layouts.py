"""Attention in any layout reaches the fused single-kernel form: with Q, K, V read in
the packed-head layout [B, N, H*D] (groups), with heads inner, as [B, N, H, D], with K
transposed, or mixed, `optimize`'s saturation and extraction propose the online-softmax
program (SoftmaxAvg over key blocks), it lowers to the fused attention kernel (the
`flash` schedule), and that kernel computes the spec."""

from __future__ import annotations

import numpy as np
import pytest

from kernelsat.codegen import lower, run_program
from kernelsat.driver.pipeline import Options, as_program, extractor_options, saturate_program
from kernelsat.extract import EXTRACTOR_GROUPS, extract
from kernelsat.extract.base import RooflineCost
from kernelsat.hardware.knobs import knob_table
from kernelsat.hardware.targets import get_target
from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as
from kernelsat.ir import postorder
from kernelsat.ops import Op
from kernelsat.proofs.library import load_library
from kernelsat.testing import relative_error

SIZES = "B=1, H=2, N=256, D=64"  # four key blocks of the default split factor 64
SCORES = "P[b,h,i,n] = softmax(n: S[b,h,i,n])\n"

LAYOUTS = {
    "packed": (
        "in  Q[b:B, i:N, x:H*D] f32\nin  K[b:B, n:N, x:H*D] f32\nin  V[b:B, n:N, x:H*D] f32\n"
        "S[b,h,i,n] = sum(d: Q[b, i, (h:H, d)] * K[b, n, (h, d)]) / sqrt(D)\n" + SCORES +
        "out O[b,i,h,e] = sum(n: P[b,h,i,n] * V[b, n, (h, e)])\n"),
    "packed-heads-inner": (
        "in  Q[b:B, i:N, x:H*D] f32\nin  K[b:B, n:N, x:H*D] f32\nin  V[b:B, n:N, x:H*D] f32\n"
        "S[b,h,i,n] = sum(d: Q[b, i, (d:D, h)] * K[b, n, (d, h)]) / sqrt(D)\n" + SCORES +
        "out O[b,h,i,e] = sum(n: P[b,h,i,n] * V[b, n, (e:D, h)])\n"),
    "bnhd": (
        "in  Q[b:B, i:N, h:H, d:D] f32\nin  K[b:B, n:N, h:H, d:D] f32\n"
        "in  V[b:B, n:N, h:H, e:D] f32\n"
        "S[b,h,i,n] = sum(d: Q[b,i,h,d] * K[b,n,h,d]) / sqrt(D)\n" + SCORES +
        "out O[b,i,h,e] = sum(n: P[b,h,i,n] * V[b,n,h,e])\n"),
    "k-transposed": (
        "in  Q[b:B, h:H, i:N, d:D] f32\nin  K[b:B, h:H, d:D, n:N] f32\n"
        "in  V[b:B, h:H, n:N, e:D] f32\n"
        "S[b,h,i,n] = sum(d: Q[b,h,i,d] * K[b,h,d,n]) / sqrt(D)\n" + SCORES +
        "out O[b,h,i,e] = sum(n: P[b,h,i,n] * V[b,h,n,e])\n"),
    "mixed": (
        "in  Q[b:B, i:N, x:H*D] f32\nin  K[b:B, h:H, n:N, d:D] f32\n"
        "in  V[b:B, n:N, h:H, e:D] f32\n"
        "S[b,h,i,n] = sum(d: Q[b, i, (h:H, d)] * K[b,h,n,d]) / sqrt(D)\n" + SCORES +
        "out O[b,i,h,e] = sum(n: P[b,h,i,n] * V[b,n,h,e])\n"),
}


def _fused_candidates(text: str) -> tuple[object, list[object]]:
    """The spec and its extracted programs that compute softmax-weighted sums online
    (a SoftmaxAvg node), as `optimize` saturates and extracts them."""
    program = as_program(text, None)
    opts, hw = Options(), get_target("c")
    sat = saturate_program(program, load_library(), opts)
    options = extractor_options(program, opts, hw)
    terms = []
    for method in EXTRACTOR_GROUPS[opts.extract]:
        for ex in extract(sat.snapshot, method, cost=RooflineCost.for_target(hw),
                          **options.get(method, {})):
            if any(n.op is Op.SOFTMAXAVG for n in postorder(ex.term)):
                terms.append(ex.term)
    return program, terms


def _check_layout(name: str) -> None:
    program, fused = _fused_candidates(f"kernel attention_{name.replace('-', '_')}({SIZES})\n"
                                       + LAYOUTS[name])
    assert fused, f"{name}: no online-softmax program among the candidates"
    hw = get_target("c")
    flash = [t for t in fused
             if "flash" in next(iter(knob_table(lower(t, program.out_axes), "c", hw).values()),
                                {})]
    assert flash, f"{name}: no candidate lowers to the fused attention kernel"
    env = random_inputs(program, seed=3)
    want = evaluate_as(program.term, env, program.out_axes)
    got = run_program(flash[0], program.out_axes,
                      {k: v.astype(np.float32) for k, v in env.items()}, "c")
    assert relative_error(got, want) < 1e-4


def test_packed_attention_reaches_the_fused_kernel() -> None:
    """specs/attention_packed.ks's layout: the case that shipped the eager program."""
    _check_layout("packed")


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in LAYOUTS if n != "packed"])
def test_every_attention_layout_reaches_the_fused_kernel(name: str) -> None:
    _check_layout(name)


def test_dot_factors_and_splits_move_out_of_the_dot_and_keep_its_value() -> None:
    """The forms extraction may pick for the scores (the scale on Q, the key split on K)
    become the one the fused kernel matches, with the same value."""
    from kernelsat.codegen.flash import hoist_dot_factors
    from kernelsat.ir import Const, Dot, In, Split, div, mul, sqrt

    q = In("Q", (("i", 8), ("d", 4)))
    k = In("K", (("n", 16), ("d", 4)))
    scale = sqrt(Const(4.0))
    for score in (Dot("d", Split("n", 4, k), div(q, scale)),
                  Dot("d", mul(Const(0.5), q), Split("n", 4, k))):
        hoisted = hoist_dot_factors(score)
        (dot,) = [n for n in postorder(hoisted) if n.op is Op.DOT]
        assert all(a.op is Op.IN for a in dot.args) and hoisted.op is not Op.DOT
        env = random_inputs(as_program(
            "kernel s(N=16)\nin Q[i:8, d:4] f32\nin K[n:N, d:4] f32\nout y[i] = Q[i, 0]\n",
            None), seed=1)
        axes = tuple(score.shape)
        np.testing.assert_allclose(evaluate_as(hoisted, env, axes),
                                   evaluate_as(score, env, axes), rtol=1e-12)
