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

# -- issue 18 parts 4, 5, 6 (helper C): written from PyTorch's documented formulas ---------


def _norm_over(x: Arr, axes: tuple[int, ...], eps: float = 1e-5) -> Arr:
    mu = x.mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=axes, keepdims=True) + eps)


def _groupnorm(e: dict[str, Arr], groups: int) -> Arr:
    b, ch, h, w = e["X"].shape
    x = e["X"].reshape(b, groups, ch // groups, h, w)
    scale = e["Gamma"].reshape(groups, ch // groups, 1, 1)
    y = _norm_over(x, (2, 3, 4)) * scale + e["Beta"].reshape(groups, ch // groups, 1, 1)
    return y.reshape(b, ch, h, w)


def _per_channel(v: Arr) -> Arr:
    return v.reshape(1, -1, 1, 1)


def _softplus(x: Arr, beta: float = 1.0) -> Arr:
    # log(1 + exp(beta x)) / beta, written stably
    z = beta * x
    return (np.maximum(z, 0) + np.log1p(np.exp(-np.abs(z)))) / beta


def _elu(x: Arr, alpha: float = 1.0) -> Arr:
    return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))


SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def _relu6(x: Arr) -> Arr:
    return np.clip(x, 0, 6)


ACTIVATIONS: dict[str, Callable[[Arr], Arr]] = {
    "act_elu": lambda x: _elu(x, 0.5),
    "act_selu": lambda x: SELU_SCALE * _elu(x, SELU_ALPHA),
    "act_mish": lambda x: x * np.tanh(_softplus(x)),
    "act_hardswish": lambda x: x * _relu6(x + 3) / 6,
    "act_hardsigmoid": lambda x: _relu6(x + 3) / 6,
    "act_leaky_relu": lambda x: np.where(x >= 0, x, 0.2 * x),
    "act_softsign": lambda x: x / (1 + np.abs(x)),
    "act_logsigmoid": lambda x: -_softplus(-x),
    "act_hardtanh": lambda x: np.clip(x, -2.0, 2.0),
    "act_softplus": lambda x: _softplus(x, 2.0),
    "act_clamp": lambda x: np.maximum(_relu6(x) - 1, 0.25),
    "act_power": lambda x: x**3 - 0.5 * x**-2.0 + 2.0**x,
}
"""Each activation spec's formula on its input X (numpy, float64)."""

_ISSUE18_C: dict[str, tuple[dict[str, int], Reference]] = {
    "groupnorm": ({"B": 2, "G": 3, "C": 2, "H": 3, "W": 5}, lambda e: _groupnorm(e, 3)),
    "instancenorm": ({"B": 2, "C": 3, "H": 4, "W": 5},
                     lambda e: _norm_over(e["X"], (2, 3))),
    "batchnorm2d": ({"B": 2, "C": 3, "H": 4, "W": 5},
                    lambda e: _norm_over(e["X"], (0, 2, 3)) * _per_channel(e["Gamma"])
                    + _per_channel(e["Beta"])),
    **{name: ({"M": 5, "N": 7}, lambda e, f=f: f(e["X"])) for name, f in ACTIVATIONS.items()},
    "scaled_residual": ({"M": 5, "N": 7}, lambda e: e["X"] * e["alpha"] + e["Z"]),
    "rowmean_keepdim": ({"M": 5, "N": 7}, lambda e: e["X"].mean(axis=1, keepdims=True)),
    "global_avgpool": ({"B": 2, "C": 3, "H": 4, "W": 5},
                       lambda e: e["X"].mean(axis=(2, 3), keepdims=True)),
    "channel_scale": ({"B": 2, "C": 3, "H": 4, "W": 5},
                      lambda e: e["X"] * e["S"] + e["bias"]),
    "cat_features": ({"M": 3, "D1": 4, "D2": 2},
                     lambda e: _norm_over(np.concatenate([e["X"], 2 * e["Z"]], axis=1), (1,))),
}

# -- issue 18 part 1 (helper F): affine reads (convolutions, pooling, shifts) ------------


def _conv(x: Arr, w: Arr, stride: int, pad: int, groups: int = 1) -> Arr:
    """N-d cross-correlation (torch's conv): x [B, C, *S], w [O, C/groups, *K]."""
    nd = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(pad, pad)] * nd)
    b = x.shape[0]
    o, cg = w.shape[:2]
    ks = w.shape[2:]
    outs = [(xp.shape[2 + i] - ks[i]) // stride + 1 for i in range(nd)]
    y = np.zeros((b, o, *outs))
    og = o // groups
    for pos in np.ndindex(*outs):
        sl = tuple(slice(p * stride, p * stride + k) for p, k in zip(pos, ks, strict=True))
        for g in range(groups):
            win = xp[(slice(None), slice(g * cg, (g + 1) * cg), *sl)]
            y[(slice(None), slice(g * og, (g + 1) * og), *pos)] = np.tensordot(
                win, w[g * og:(g + 1) * og], axes=(list(range(1, nd + 2)),
                                                   list(range(1, nd + 2))))
    return y


def _pool(x: Arr, k: int, stride: int, pad: int, fn: Callable[..., Arr], fill: float) -> Arr:
    xp = np.pad(x, [(0, 0), (0, 0), (pad, pad), (pad, pad)], constant_values=fill)
    oh, ow = ((xp.shape[i] - k) // stride + 1 for i in (2, 3))
    y = np.empty((*x.shape[:2], oh, ow))
    for i in range(oh):
        for j in range(ow):
            win = xp[:, :, i * stride:i * stride + k, j * stride:j * stride + k]
            y[:, :, i, j] = fn(win, axis=(2, 3))
    return y


_ISSUE18_F: dict[str, tuple[dict[str, int], Reference]] = {
    "conv2d_3x3": ({"B": 2, "C": 3, "O": 4, "H": 5, "W": 6},
                   lambda e: _conv(e["X"], e["Wt"], 1, 1)),
    "conv2d_3x3_s2": ({"B": 2, "C": 3, "O": 4, "H": 6, "W": 8},
                      lambda e: _conv(e["X"], e["Wt"], 2, 1)),
    "conv2d_1x1": ({"B": 2, "C": 3, "O": 4, "H": 5, "W": 6},
                   lambda e: _conv(e["X"], e["Wt"][:, :, None, None], 1, 0)),
    "conv2d_depthwise": ({"B": 2, "C": 3, "H": 5, "W": 6},
                         lambda e: _conv(e["X"], e["Wt"][:, None], 1, 1, groups=3)),
    "conv2d_grouped": ({"B": 2, "G": 2, "CG": 3, "OG": 2, "H": 5, "W": 4},
                       lambda e: _conv(e["X"], e["Wt"].reshape(4, 3, 3, 3), 1, 1,
                                       groups=2).reshape(2, 2, 2, 5, 4)),
    "conv1d": ({"B": 2, "C": 3, "O": 4, "L": 9}, lambda e: _conv(e["X"], e["Wt"], 1, 2)),
    "conv3d": ({"B": 1, "C": 2, "O": 3, "D": 4, "H": 5, "W": 6},
               lambda e: _conv(e["X"], e["Wt"], 1, 0)),
    "maxpool2d": ({"B": 2, "C": 3, "H": 6, "W": 8},
                  lambda e: _pool(e["X"], 3, 2, 1, np.max, -np.inf)),
    "avgpool2d": ({"B": 2, "C": 3, "H": 6, "W": 8},
                  lambda e: _pool(e["X"], 2, 2, 0, np.mean, 0.0)),
    "diff1d": ({"M": 3, "N": 7}, lambda e: np.diff(e["X"], axis=1)),
}


# -- issue 18 parts 2 and 3a (helper E): masks, selection, positions ----------------------


def _masked_attention(e: dict[str, Arr], visible: Callable[[Arr, Arr], Arr]) -> Arr:
    q, k, v = e["Q"], e["K"], e["V"]
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    i, n = np.arange(s.shape[-2])[:, None], np.arange(s.shape[-1])[None, :]
    return _softmax(np.where(visible(i, n), s, -np.inf), -1) @ v


def _rope(x: Arr) -> Arr:
    b, t, c = x.shape
    half = c // 2
    theta = 10000.0 ** (-np.arange(half) / half)
    freqs = np.outer(np.arange(t), theta)
    emb = np.concatenate([freqs, freqs], axis=-1)
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return (x * np.cos(emb) + rotated * np.sin(emb)).reshape(b, t, 2, half)


_ISSUE18_E: dict[str, tuple[dict[str, int], Reference]] = {
    "causal_attention": ({"B": 2, "H": 3, "N": 5, "D": 4},
                         lambda e: _masked_attention(e, lambda i, n: n <= i)),
    "sliding_window_attention": ({"B": 1, "H": 2, "N": 7, "D": 4, "W": 3},
                                 lambda e: _masked_attention(e, lambda i, n: (n <= i)
                                                             & (i - n < 3))),
    "causal_softmax": ({"B": 2, "N": 5}, lambda e: _softmax(
        np.where(np.tril(np.ones((5, 5), bool)), e["X"], -np.inf), -1)),
    "tril_matmul": ({"M": 5, "N": 6}, lambda e: np.tril(e["A"]) @ e["B"]),
    "relu6_where": ({"M": 5, "N": 7}, lambda e: np.clip(e["X"], 0.0, 6.0)),
    "rope": ({"B": 2, "T": 5, "D2": 3}, lambda e: _rope(e["X"])),
}

# -- issue 18 part 7 (helper D): degenerate programs -------------------------------------

_ISSUE18_D: dict[str, tuple[dict[str, int], Reference]] = {
    "degenerate_zero": ({"M": 5, "N": 7}, lambda e: np.zeros_like(e["X"])),
    "degenerate_reductions": ({"M": 5, "N": 7}, lambda e: e["X"][:, 0, :] + 2.0),
}

# -- issue 18 part 5 (helper H): slices, reshapes, grouped-query attention ---------------


def _gqa(e: dict[str, Arr], r: int) -> Arr:
    """Query head h reads key/value head h // r (torch's repeat_interleave)."""
    k, v = (np.repeat(e[name], r, axis=1) for name in "KV")
    return _attention(e["Q"], k, v)


def _qk_norm(e: dict[str, Arr], h: int) -> Arr:
    t = e["X"] @ e["W"]
    t = t.reshape(t.shape[0], h, -1)
    return t / np.sqrt((t * t).mean(axis=2, keepdims=True) + 1e-6) * e["G"]


def _rope_interleaved(x: Arr) -> Arr:
    half = x.shape[-1] // 2
    freqs = np.outer(np.arange(x.shape[1]), 10000.0 ** (-np.arange(half) / half))
    x1, x2 = x[..., 0::2], x[..., 1::2]
    cos, sin = np.cos(freqs), np.sin(freqs)
    return np.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).reshape(x.shape)


def _conv_transpose2d(x: Arr, w: Arr, stride: int) -> Arr:
    """torch's definition: input (i, j) adds x * w[ky, kx] to output (s*i + ky, s*j + kx)."""
    b, _, h, wd = x.shape
    o, k = w.shape[1], w.shape[2]
    y = np.zeros((b, o, (h - 1) * stride + k, (wd - 1) * stride + k))
    for ky in range(k):
        for kx in range(k):
            y[:, :, ky:ky + stride * h:stride, kx:kx + stride * wd:stride] += np.einsum(
                "bcij,co->boij", x, w[:, :, ky, kx])
    return y


_ISSUE18_H: dict[str, tuple[dict[str, int], Reference]] = {
    "conv_transpose2d": ({"B": 2, "C": 3, "O": 2, "H": 5, "W": 4, "S": 2, "M": 2},
                         lambda e: _conv_transpose2d(e["X"], e["Wt"], 2)),
    "rope_interleaved": ({"B": 2, "T": 5, "D2": 3}, lambda e: _rope_interleaved(e["X"])),
    "glu_split": ({"M": 5, "F": 7}, lambda e: e["X"][:, :7] * _sigmoid(e["X"][:, 7:])),
    "qk_norm": ({"M": 5, "C": 6, "H": 3, "D": 4}, lambda e: _qk_norm(e, 3)),
    "gqa_attention": ({"B": 2, "G": 2, "R": 3, "N": 5, "D": 4}, lambda e: _gqa(e, 3)),
}

# -- issue 18 part 3b (helper G): integer inputs and gathers ------------------------------


def _at_labels(x: Arr, labels: Arr) -> Arr:
    """Row b of `x` at column labels[b] (numpy's fancy indexing)."""
    return x[np.arange(len(labels)), labels]


_ISSUE18_G: dict[str, tuple[dict[str, int], Reference]] = {
    "cross_entropy_labels": (
        {"B": 6, "C": 9},
        lambda e: np.mean(_lse(e["X"], 1) - _at_labels(e["X"], e["labels"])),
    ),
    "nll_loss": ({"B": 6, "C": 9}, lambda e: np.mean(-_at_labels(e["logp"], e["target"]))),
    "label_smoothing_ce": (
        {"B": 6, "C": 9},
        lambda e: np.mean(_lse(e["X"], 1) - 0.9 * _at_labels(e["X"], e["labels"])
                          - 0.1 * e["X"].mean(axis=1)),
    ),
    "embedding_lookup": ({"T": 7, "V": 11, "D": 5}, lambda e: e["E"][e["ids"]]),
    "embedding_positional": ({"T": 7, "V": 11, "D": 5}, lambda e: e["E"][e["ids"]] + e["P"]),
}


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
    # -- issue 18 parts 4, 5, 6 (helper C): norms over axis sets, activations, shapes --
    **_ISSUE18_C,
    # -- issue 18 part 1 (helper F): affine reads --
    **_ISSUE18_F,
    # -- issue 18 parts 2 and 3a (helper E): masks, selection, positions --
    **_ISSUE18_E,
    # -- issue 18 part 7 (helper D): degenerate programs --
    **_ISSUE18_D,
    # -- issue 18 part 3b (helper G): integer inputs and gathers --
    **_ISSUE18_G,
    # -- issue 18 part 5 (helper H): slices, reshapes, grouped-query attention --
    **_ISSUE18_H,
}


def test_every_spec_has_a_reference() -> None:
    assert {p.stem for p in SPECS.glob("*.ks")} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_spec_matches_numpy(name: str, seed: int) -> None:
    params, reference = CASES[name]
    program = load_spec(SPECS / f"{name}.ks", params)
    env = random_inputs(program, seed=seed)
    got = evaluate_as(program.term, env, program.out_axes).reshape(program.out_shape)
    want = np.asarray(reference(env))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
