"""Golden generated sources (loop nests, C, CUDA) for a few terms: compared exactly,
executed (C) and compiled (CUDA). Regenerate only on purpose:
KERNELSAT_UPDATE_GOLDEN=1 pytest tests/test_codegen_golden.py"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from kernelsat.codegen import build, compile_cuda, lower, render
from kernelsat.codegen.cuda import find_nvcc
from kernelsat.interp import evaluate_as
from kernelsat.ir import (
    LSE,
    Const,
    Dot,
    In,
    Max,
    SoftmaxAvg,
    Split,
    Store,
    Sum,
    Term,
    add,
    div,
    exp,
    mul,
    sqrt,
    sub,
)

GOLDEN = Path(__file__).with_name("golden")
UPDATE = os.environ.get("KERNELSAT_UPDATE_GOLDEN") == "1"


def softmax_fused() -> tuple[Term, tuple[str, ...]]:
    x = In("x", (("i", 64), ("n", 128)))
    e = exp(sub(x, Max("n", x)))
    return div(e, Sum("n", e)), ("i", "n")


def softmax_eager() -> tuple[Term, tuple[str, ...]]:
    x = In("x", (("i", 64), ("n", 128)))
    e = Store(exp(sub(x, Store(Max("n", x)))))
    return div(e, Store(Sum("n", e))), ("i", "n")


def attention_split() -> tuple[Term, tuple[str, ...]]:
    q, k = In("Q", (("i", 64), ("d", 32))), In("K", (("n", 128), ("d", 32)))
    v = In("V", (("n", 128), ("e", 32)))
    s = mul(Dot("d", q, k), Const(32 ** -0.5))
    ss, vs = Split("n", 32, s), Split("n", 32, v)
    return SoftmaxAvg("n/o32", LSE("n/i32", ss), SoftmaxAvg("n/i32", ss, vs)), ("i", "e")


def layernorm() -> tuple[Term, tuple[str, ...]]:
    x = In("x", (("i", 64), ("d", 128)))
    g, b = In("g", (("d", 128),)), In("b", (("d", 128),))
    c = sub(x, mul(Sum("d", x), Const(1 / 128)))
    var = mul(Sum("d", mul(c, c)), Const(1 / 128))
    return add(mul(div(c, sqrt(add(var, Const(1e-5)))), g), b), ("i", "d")


CASES = {f.__name__: f for f in (softmax_fused, softmax_eager, attention_split, layernorm)}


def check_golden(path: Path, text: str) -> None:
    if UPDATE:
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with KERNELSAT_UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{path.name} differs (KERNELSAT_UPDATE_GOLDEN=1 to accept)"


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_loops_and_c(name: str, tmp_path: Path) -> None:
    term, axes = CASES[name]()
    lowered = lower(term, axes)
    check_golden(GOLDEN / f"{name}.loops.txt", str(lowered) + "\n")
    check_golden(GOLDEN / f"{name}.c", render(lowered, backend="c"))
    from kernelsat.ir import input_dims, inputs

    rng = np.random.default_rng(0)
    env = {n: rng.standard_normal(input_dims(t)).astype(np.float32)
           for n, t in inputs(term).items()}
    out = np.full(lowered.buffers["out"].shape, np.nan, np.float32)
    build(lowered, "c", cache_dir=tmp_path)(env, out)
    want = evaluate_as(term, {k: v.astype(np.float64) for k, v in env.items()}, axes)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_cuda(name: str) -> None:
    term, axes = CASES[name]()
    source = render(lower(term, axes), backend="cuda")
    check_golden(GOLDEN / f"{name}.cu", source)
    if find_nvcc() is None:
        pytest.skip("nvcc not found (PATH or /usr/local/cuda/bin): golden text checked only")
    report = compile_cuda(source)
    assert report.ok, report.log
