"""Every spec in specs/ agrees with a numpy version written by hand, independently of the
parser: the interpreter (float64) on the parsed term vs. the formula below, on random
inputs at small sizes (`params`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from scipy.special import erf

from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as
from kernelsat.spec import load_spec

SPECS = Path(__file__).parent.parent / "specs"
Arr = np.ndarray


def _softmax(x: Arr, axis: int) -> Arr:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _lse(x: Arr, axis: int) -> Arr:
    m = x.max(axis=axis, keepdims=True)
    return (m + np.log(np.exp(x - m).sum(axis=axis, keepdims=True))).squeeze(axis)


def _gelu(x: Arr) -> Arr:
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))


def _gelu_tanh(x: Arr) -> Arr:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _sigmoid(x: Arr) -> Arr:
    return 1 / (1 + np.exp(-x))


def _attention(q: Arr, k: Arr, v: Arr) -> Arr:
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    return _softmax(s, -1) @ v


def _packed_attention(env: dict[str, Arr], h: int) -> Arr:
    def heads(x: Arr) -> Arr:  # [b, n, h*d] -> [b, h, n, d]
        b, n, hd = x.shape
        return x.reshape(b, n, h, hd // h).transpose(0, 2, 1, 3)

    o = _attention(heads(env["Q"]), heads(env["K"]), heads(env["V"]))
    return o.transpose(0, 2, 1, 3)  # [b, i, h, e]


def _layernorm(x: Arr, axis: int, eps: float = 1e-5) -> Arr:
    mu = x.mean(axis=axis, keepdims=True)
    return (x - mu) / np.sqrt(x.var(axis=axis, keepdims=True) + eps)


Reference = Callable[[dict[str, Arr]], Arr]

CASES: dict[str, tuple[dict[str, int], Reference]] = {
    "softmax": ({"M": 5, "N": 7}, lambda e: _softmax(e["X"], 1)),
    "layernorm": ({"M": 5, "N": 7}, lambda e: _layernorm(e["X"], 1) * e["G"] + e["Bias"]),
    "rmsnorm": (
        {"M": 5, "N": 7},
        lambda e: e["X"] / np.sqrt((e["X"] ** 2).mean(axis=1, keepdims=True) + 1e-6) * e["W"],
    ),
    "matmul": ({"M": 5, "N": 6, "K": 7}, lambda e: e["A"] @ e["B"]),
    "bmm": ({"G": 3, "M": 4, "N": 5, "K": 6}, lambda e: e["A"] @ e["B"]),
    "gemv": ({"M": 5, "K": 7}, lambda e: e["A"] @ e["X"]),
    "matmul_bias_gelu": (
        {"M": 4, "K": 5, "N": 6},
        lambda e: _gelu(e["X"] @ e["W"] + e["Bias"]),
    ),
    "mlp2": (
        {"T": 4, "D": 5, "F": 6},
        lambda e: _gelu_tanh(e["X"] @ e["W1"] + e["B1"]) @ e["W2"] + e["B2"],
    ),
    "swiglu": (
        {"T": 4, "D": 5, "F": 6},
        lambda e: ((e["X"] @ e["Wg"]) * _sigmoid(e["X"] @ e["Wg"]) * (e["X"] @ e["Wu"]))
        @ e["Wd"],
    ),
    "attention": ({"B": 2, "H": 3, "N": 5, "D": 4}, lambda e: _attention(e["Q"], e["K"], e["V"])),
    "attention_packed": ({"B": 2, "H": 3, "N": 5, "D": 4}, lambda e: _packed_attention(e, 3)),
    "rowsum": ({"M": 5, "N": 7}, lambda e: e["X"].sum(axis=1)),
    "logsumexp": ({"M": 5, "N": 7}, lambda e: _lse(e["X"], 1)),
    "cross_entropy": (
        {"B": 6, "C": 9},
        lambda e: np.mean(_lse(e["X"], 1) - e["X"][e["T"].astype(bool)]),
    ),
    "l2norm": (
        {"M": 5, "N": 7},
        lambda e: e["X"] / np.maximum(np.linalg.norm(e["X"], axis=1, keepdims=True), 1e-12),
    ),
    "elementwise": (
        {"M": 5, "N": 7},
        lambda e: np.exp(e["X"]) * _sigmoid(e["X"]) + np.tanh(e["X"]) * 0.5,
    ),
    "batchnorm": ({"N": 33, "C": 3}, lambda e: _layernorm(e["X"], 0)),
    "variance": ({"M": 3, "N": 33}, lambda e: e["X"].var(axis=1)),
    "row_range": ({"M": 5, "N": 7}, lambda e: e["X"].max(axis=1) - e["X"].min(axis=1)),
}


def test_every_spec_has_a_reference() -> None:
    assert {p.stem for p in SPECS.glob("*.ks")} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_spec_matches_numpy(name: str, seed: int) -> None:
    params, reference = CASES[name]
    program = load_spec(SPECS / f"{name}.ks", params)
    env = random_inputs(program, seed=seed)
    got = evaluate_as(program.term, env, program.out_axes)
    want = np.asarray(reference(env))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
