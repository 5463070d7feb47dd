"""The torch peers on the CPU: eager torch, `torch.compile`, and SDPA for attention.

torch's CPU wheel on these machines is for Python 3.11 only, and kernelsat needs 3.12,
so this script runs in its own environment and imports nothing from kernelsat:

    PYENV_VERSION=3.11.7 python3 -m venv .venv-torch
    .venv-torch/bin/pip install torch==2.13.0 numpy
    .venv-torch/bin/python bench/torch_peer.py [--only NAME ...] [-p K=V ...] [--out FILE]
        [--json FILE] [--threads N] [--flush | --no-flush] [--data FILE.npz]

`bench/peers.py` runs it once per spec, with `--data` (the very inputs kernelsat and
numpy get, and kernelsat's float64 reference) and `--json`, so that each spec's turn
is contiguous. Alone, it reads each spec's sizes and inputs from specs/*.ks (the
`kernel` line and the `in` lines) and fills the inputs as kernelsat.inputs does
(random sign times a uniform magnitude in [0.5, 1.5], never zero; one-hot inputs one
1 per row), with eager torch in float64 as the reference.

Every spec's torch is in `TORCH` (and `SDPA` for attention): the library call a user
writes for the spec's math (F.layer_norm, F.cross_entropy with probability targets,
torch.addmm ...), same shapes, same parameters, the output in the spec's layout.

Timing, as kernelsat.hardware.measure does it: `--warmup` untimed runs, then timed runs
until `--min-runs` runs and `--min-seconds` of timed work; the median and quartiles;
every run's output is checked against the float64 reference (relative L2 error below
3e-4, the float32 bound of kernelsat.hardware.measure.ERROR_BOUNDS). Cache: with
`--flush` (the default), when the inputs and the output fit in the last-level cache,
a buffer of min(1.5 LLC, max(4 x footprint, 8 MiB)) bytes is written before every
timed run, the rule of kernelsat.hardware.measure; `--no-flush` never flushes.
Threads: `--threads` (default OMP_NUM_THREADS, else the cores this process may use),
set with torch.set_num_threads.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"
ERROR_BOUND = 3e-4
"""float32's bound on the relative L2 error (kernelsat.hardware.measure.ERROR_BOUNDS)."""
FLUSH_FACTOR = 1.5
"""The flush buffer is this many times the LLC (kernelsat.hardware.measure.FLUSH_FACTOR)."""

Tensors = Mapping[str, torch.Tensor]
P = Mapping[str, int]
Fn = Callable[[Tensors, P], torch.Tensor]


class PeerError(Exception):
    """Bad input to this script (a spec, a parameter, a data file): said, then exit 2."""


# -- torch as a user would write each spec ------------------------------------------------


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(s, dim=-1) @ v


def _heads(t: torch.Tensor, p: P) -> torch.Tensor:
    """[B, N, H*D] -> [B, H, N, D] (a view)."""
    return t.view(p["B"], p["N"], p["H"], -1).transpose(1, 2)


def _packed(attn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> Fn:
    """attention_packed through `attn`: packed heads in, [B, N, H, D] out (contiguous)."""

    def fn(x: Tensors, p: P) -> torch.Tensor:
        q, k, v = (_heads(x[name], p) for name in "QKV")
        return attn(q, k, v).transpose(1, 2).contiguous()

    return fn


TORCH: dict[str, Fn] = {
    "attention": lambda x, p: _attention(x["Q"], x["K"], x["V"]),
    "attention_packed": _packed(_attention),
    "batchnorm": lambda x, p: F.batch_norm(x["X"], None, None, training=True, eps=1e-5),
    "bmm": lambda x, p: torch.bmm(x["A"], x["B"]),
    "cross_entropy": lambda x, p: F.cross_entropy(x["X"], x["T"]),  # probability targets
    "elementwise": lambda x, p: torch.exp(x["X"]) * torch.sigmoid(x["X"])
    + torch.tanh(x["X"]) * 0.5,
    "gemv": lambda x, p: torch.mv(x["A"], x["X"]),
    "l2norm": lambda x, p: F.normalize(x["X"], dim=1, eps=1e-12),
    "layernorm": lambda x, p: F.layer_norm(x["X"], (x["X"].shape[1],), x["G"], x["Bias"],
                                           eps=1e-5),
    "logsumexp": lambda x, p: torch.logsumexp(x["X"], dim=1),
    "matmul": lambda x, p: x["A"] @ x["B"],
    "matmul_bias_gelu": lambda x, p: F.gelu(torch.addmm(x["Bias"], x["X"], x["W"])),
    "mlp2": lambda x, p: torch.addmm(
        x["B2"], F.gelu(torch.addmm(x["B1"], x["X"], x["W1"]), approximate="tanh"), x["W2"]),
    "rmsnorm": lambda x, p: F.rms_norm(x["X"], (x["X"].shape[1],), x["W"], eps=1e-6),
    "row_range": lambda x, p: x["X"].amax(dim=1) - x["X"].amin(dim=1),
    "rowsum": lambda x, p: x["X"].sum(dim=1),
    "softmax": lambda x, p: torch.softmax(x["X"], dim=1),
    "swiglu": lambda x, p: (F.silu(x["X"] @ x["Wg"]) * (x["X"] @ x["Wu"])) @ x["Wd"],
    "variance": lambda x, p: torch.var(x["X"], dim=1, correction=0),
}
"""Spec name -> eager torch for it, returning the output in the spec's layout."""

# -- issue 18 parts 4, 5, 6 (helper C): norms over axis sets, activations, shapes --------


def _channel(v: torch.Tensor) -> torch.Tensor:
    return v.reshape(1, -1, 1, 1)


TORCH.update({
    "groupnorm": lambda x, p: F.group_norm(x["X"], p["G"], x["Gamma"], x["Beta"], eps=1e-5),
    "instancenorm": lambda x, p: F.instance_norm(x["X"], eps=1e-5),
    "batchnorm2d": lambda x, p: F.batch_norm(x["X"], None, None, x["Gamma"], x["Beta"],
                                             training=True, eps=1e-5),
    "act_elu": lambda x, p: F.elu(x["X"], alpha=0.5),
    "act_selu": lambda x, p: F.selu(x["X"]),
    "act_mish": lambda x, p: F.mish(x["X"]),
    "act_hardswish": lambda x, p: F.hardswish(x["X"]),
    "act_hardsigmoid": lambda x, p: F.hardsigmoid(x["X"]),
    "act_leaky_relu": lambda x, p: F.leaky_relu(x["X"], 0.2),
    "act_softsign": lambda x, p: F.softsign(x["X"]),
    "act_logsigmoid": lambda x, p: F.logsigmoid(x["X"]),
    "act_hardtanh": lambda x, p: F.hardtanh(x["X"], -2.0, 2.0),
    "act_softplus": lambda x, p: F.softplus(x["X"], beta=2.0),
    "act_clamp": lambda x, p: torch.clamp(F.relu6(x["X"]) - 1, min=0.25),
    "act_power": lambda x, p: x["X"] ** 3 - 0.5 * x["X"] ** -2 + torch.pow(2.0, x["X"]),
    "scaled_residual": lambda x, p: x["X"] * x["alpha"] + x["Z"],  # alpha: a 0-dim tensor
    "rowmean_keepdim": lambda x, p: x["X"].mean(dim=1, keepdim=True),
    "global_avgpool": lambda x, p: F.adaptive_avg_pool2d(x["X"], 1),
    "channel_scale": lambda x, p: x["X"] * x["S"] + x["bias"],
    "cat_features": lambda x, p: F.layer_norm(torch.cat([x["X"], 2 * x["Z"]], dim=1),
                                              (p["D1"] + p["D2"],), eps=1e-5),
})

# -- issue 18 part 1 (helper F): affine reads (convolutions, pooling, shifts) -------------

TORCH.update({
    "conv2d_3x3": lambda x, p: F.conv2d(x["X"], x["Wt"], stride=1, padding=1),
    "conv2d_3x3_s2": lambda x, p: F.conv2d(x["X"], x["Wt"], stride=2, padding=1),
    "conv2d_1x1": lambda x, p: F.conv2d(x["X"], x["Wt"][:, :, None, None]),
    "conv2d_depthwise": lambda x, p: F.conv2d(x["X"], x["Wt"][:, None], padding=1,
                                              groups=p["C"]),
    # the spec's [B, G, OG, H, W] output is [B, G*OG, H, W] in memory
    "conv2d_grouped": lambda x, p: F.conv2d(
        x["X"], x["Wt"].reshape(p["G"] * p["OG"], p["CG"], 3, 3), padding=1, groups=p["G"]),
    "conv1d": lambda x, p: F.conv1d(x["X"], x["Wt"], padding=2),
    "conv3d": lambda x, p: F.conv3d(x["X"], x["Wt"]),
    "maxpool2d": lambda x, p: F.max_pool2d(x["X"], 3, stride=2, padding=1),
    "avgpool2d": lambda x, p: F.avg_pool2d(x["X"], 2),
    "diff1d": lambda x, p: torch.diff(x["X"], dim=1),
})

# -- issue 18 parts 2 and 3a (helper E): masks, selection, positions ---------------------


def _causal(n: int) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


def _window(n: int, w: int) -> torch.Tensor:
    i, k = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (k <= i) & (i - k < w)


def _masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      visible: torch.Tensor) -> torch.Tensor:
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(s.masked_fill(~visible, -math.inf), dim=-1) @ v


def _rope(x: torch.Tensor, p: P) -> torch.Tensor:
    half = p["D2"]
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, 2 * half, 2, dtype=torch.float32) / (2 * half))
    freqs = torch.outer(torch.arange(p["T"], dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * emb.cos() + rotated * emb.sin()  # [B, T, 2*D2] = the spec's [B, T, 2, D2]


TORCH.update({
    "causal_attention": lambda x, p: _masked_attention(x["Q"], x["K"], x["V"],
                                                       _causal(p["N"])),
    "sliding_window_attention": lambda x, p: _masked_attention(
        x["Q"], x["K"], x["V"], _window(p["N"], p["W"])),
    "causal_softmax": lambda x, p: torch.softmax(
        x["X"].masked_fill(~_causal(p["N"]), -math.inf), dim=-1),
    "tril_matmul": lambda x, p: torch.tril(x["A"]) @ x["B"],
    "relu6_where": lambda x, p: F.relu6(x["X"]),
    "rope": lambda x, p: _rope(x["X"], p),
})

# -- issue 18 part 7 (helper D): degenerate programs ---------------------------------------

TORCH.update({
    "degenerate_zero": lambda x, p: torch.zeros_like(x["X"]),
    "degenerate_reductions": lambda x, p: x["X"][:, 0, :] + 2.0,
})

# -- issue 18 part 5 (helper H): slices, reshapes, grouped-query attention ---------------


def _gqa(attn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> Fn:
    """Query head h reads key/value head h // R: K and V repeated R times per head."""

    def fn(x: Tensors, p: P) -> torch.Tensor:
        k, v = (x[name].repeat_interleave(p["R"], dim=1) for name in "KV")
        return attn(x["Q"], k, v)

    return fn


def _rope_interleaved(x: torch.Tensor, p: P) -> torch.Tensor:
    """GPT-J style: rotate the (even, odd) feature pairs."""
    half = p["D2"]
    inv = 1.0 / 10000 ** (torch.arange(0, 2 * half, 2, dtype=torch.float32) / (2 * half))
    freqs = torch.outer(torch.arange(p["T"], dtype=torch.float32), inv)
    cos, sin = freqs.cos(), freqs.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)


TORCH.update({
    "rope_interleaved": lambda x, p: _rope_interleaved(x["X"], p),
    "conv_transpose2d": lambda x, p: F.conv_transpose2d(x["X"], x["Wt"], stride=p["S"]),
    "glu_split": lambda x, p: F.glu(x["X"], dim=1),
    "qk_norm": lambda x, p: F.rms_norm((x["X"] @ x["W"]).view(p["M"], p["H"], p["D"]),
                                       (p["D"],), x["G"], eps=1e-6),
    "gqa_attention": _gqa(_attention),
})

# -- issue 18 part 3b (helper G): integer inputs and gathers ------------------------------
# Integer inputs (`in labels[b:B] i32`) reach torch as int64 (the index dtype of
# F.cross_entropy, F.nll_loss and F.embedding); alone, they are filled uniformly below
# the size of the dim they index, the parameter `LABEL_BOUND` names.

TORCH.update({
    "cross_entropy_labels": lambda x, p: F.cross_entropy(x["X"], x["labels"]),
    "nll_loss": lambda x, p: F.nll_loss(x["logp"], x["target"]),
    "label_smoothing_ce": lambda x, p: F.cross_entropy(x["X"], x["labels"],
                                                       label_smoothing=0.1),
    "embedding_lookup": lambda x, p: F.embedding(x["ids"], x["E"]),
    "embedding_positional": lambda x, p: F.embedding(x["ids"], x["E"]) + x["P"],
})

LABEL_BOUND: dict[str, str] = {
    "cross_entropy_labels": "C", "nll_loss": "C", "label_smoothing_ce": "C",
    "embedding_lookup": "V", "embedding_positional": "V"}
"""Spec name -> the size parameter its integer inputs lie below (the gathered dim)."""

SDPA: dict[str, Fn] = {
    "gqa_attention": _gqa(F.scaled_dot_product_attention),
    "attention": lambda x, p: F.scaled_dot_product_attention(x["Q"], x["K"], x["V"]),
    "attention_packed": _packed(F.scaled_dot_product_attention),
    "causal_attention": lambda x, p: F.scaled_dot_product_attention(x["Q"], x["K"], x["V"],
                                                                    is_causal=True),
    "sliding_window_attention": lambda x, p: F.scaled_dot_product_attention(
        x["Q"], x["K"], x["V"], attn_mask=_window(p["N"], p["W"])),
}
"""The attention specs through torch's fused scaled_dot_product_attention."""


# -- the specs' sizes and inputs, read without kernelsat -----------------------------------

_KERNEL = re.compile(r"^kernel\s+(\w+)\s*\(([^)]*)\)\s*$")
_INPUT = re.compile(r"^in\s+(\w+)\s*\[([^\]]*)\]\s*(\w+)(?:\s+(\w+))?\s*$")


@dataclass(frozen=True)
class SpecInput:
    name: str
    dims: tuple[int, ...]
    role: str  # "data", "positive" or "onehot" (kernelsat.inputs' roles)
    dtype: str = "f32"  # "i32": an integer input (gather labels)


def read_spec(path: Path, overrides: P) -> tuple[str, dict[str, int], list[SpecInput]]:
    """(name, params, inputs) of a .ks file: the `kernel` line's parameters with the
    overrides it declares applied, and each `in` line's shape."""
    name, params, raw = "", {}, []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if m := _KERNEL.match(text):
            name = m.group(1)
            for item in filter(None, (s.strip() for s in m.group(2).split(","))):
                key, _, value = item.partition("=")
                if not value.strip().isdigit():
                    raise PeerError(f"{path}:{lineno}: parameter {item!r} is not NAME=INTEGER")
                params[key.strip()] = int(value)
        elif m := _INPUT.match(text):
            raw.append((lineno, m.group(1), m.group(2), m.group(4) or "data", m.group(3)))
    if not name:
        raise PeerError(f"{path}: no `kernel NAME(...)` line")
    params.update({k: v for k, v in overrides.items() if k in params})
    inputs = []
    for lineno, iname, dims, role, dtype in raw:
        shape = []
        # `in alpha[] f32`: a 0-dim input; `(h:H, d:D)`: one packed dim of size H*D
        for dim in filter(str.strip, re.split(r",(?![^(]*\))", dims)):
            size = "*".join(part.partition(":")[2] for part in dim.strip("() ").split(","))
            try:
                shape.append(math.prod(int(f) if f.strip().isdigit() else params[f.strip()]
                                       for f in size.split("*")))
            except KeyError as e:
                raise PeerError(f"{path}:{lineno}: size {size!r} of {iname} names no "
                                f"parameter {e}") from None
        inputs.append(SpecInput(iname, tuple(shape), role, dtype))
    return name, params, inputs


def fill(inputs: list[SpecInput], seed: int = 0, label_bound: int = 1) -> dict[str, np.ndarray]:
    """float32 inputs by role, as kernelsat.inputs fills them (never zero but one-hot);
    integer inputs int32, uniform in [0, label_bound)."""
    rng = np.random.default_rng(seed)
    out = {}
    for d in inputs:
        if d.dtype == "i32":
            out[d.name] = rng.integers(0, label_bound, size=d.dims, dtype=np.int32)
            continue
        if d.role == "onehot":
            a = np.zeros(d.dims)
            hot = rng.integers(0, d.dims[-1], size=d.dims[:-1])
            np.put_along_axis(a, hot[..., None], 1.0, axis=-1)
        elif d.role == "positive":
            a = rng.uniform(0.5, 1.5, size=d.dims)
        else:
            a = rng.choice([-1.0, 1.0], size=d.dims) * rng.uniform(0.5, 1.5, size=d.dims)
        out[d.name] = a.astype(np.float32)
    return out


# -- timing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Protocol:
    """kernelsat.hardware.measure's TIMING["bench"] by default."""

    warmup: int = 2
    min_runs: int = 10
    min_seconds: float = 0.2
    max_runs: int = 10_000
    max_seconds: float = 30.0


@dataclass
class Timing:
    """One side's result: seconds (NaN when not ok)."""

    median: float = math.nan
    q1: float = math.nan
    q3: float = math.nan
    runs: int = 0
    rel_err: float = math.nan
    ok: bool = False
    failure: str = ""
    compile_s: float = math.nan


def llc_bytes() -> int:
    """The largest CPU cache sysfs reports (kernelsat.hardware.cpu reads the same)."""
    best = 0
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        if m := re.fullmatch(r"(\d+)([KMG]?)", text):
            best = max(best, int(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20,
                                                "G": 1 << 30}[m.group(2)])
    return best or 32 << 20


def flush_bytes(footprint: int, llc: int) -> int:
    """Bytes written before each timed run: 0 when the working set does not fit in the
    LLC (it cannot stay cached), else measure's rule."""
    if footprint >= llc:
        return 0
    return int(min(FLUSH_FACTOR * llc, max(4 * footprint, 8 << 20)))


def flusher(nbytes: int) -> Callable[[], None]:
    """Write `nbytes` (a buffer allocated and touched now, before anything is timed)."""
    buf = np.ones(nbytes, np.uint8)
    counter = [0]

    def flush() -> None:
        counter[0] = (counter[0] + 1) & 0xFF
        buf.fill(counter[0])

    return flush


def rel_error(out: torch.Tensor, ref: np.ndarray) -> float:
    """Relative L2 error in float64; inf when the output has NaN/inf or the wrong size."""
    got = out.detach().to(torch.float64).reshape(-1).numpy()
    want = np.asarray(ref, np.float64).reshape(-1)
    if got.shape != want.shape or not np.all(np.isfinite(got)):
        return math.inf
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def time_side(fn: Callable[[], torch.Tensor], ref: np.ndarray, proto: Protocol,
              flush: Callable[[], None] | None) -> Timing:
    """Warm up, then time `fn` by the protocol, checking every run's output."""
    worst = 0.0
    try:
        for i in range(proto.warmup):
            err = rel_error(fn(), ref)
            if not err < ERROR_BOUND:
                return Timing(runs=0, rel_err=err, failure=f"warm-up run {i}: rel. error {err:.3g}")
            worst = max(worst, err)
        times: list[float] = []
        wall0 = time.perf_counter()
        while (len(times) < proto.min_runs or sum(times) < proto.min_seconds) and (
                len(times) < proto.max_runs and time.perf_counter() - wall0 < proto.max_seconds):
            if flush is not None:
                flush()
            t0 = time.perf_counter_ns()
            out = fn()
            times.append((time.perf_counter_ns() - t0) / 1e9)
            err = rel_error(out, ref)
            if not err < ERROR_BOUND:
                return Timing(runs=len(times), rel_err=err,
                              failure=f"run {len(times) - 1}: rel. error {err:.3g}")
            worst = max(worst, err)
    except Exception as exc:  # a failing peer is a result, not a crash of the benchmark
        return Timing(failure=f"raised {type(exc).__name__}: {str(exc)[:200]}")
    q1, median, q3 = (float(v) for v in np.percentile(times, [25, 50, 75]))
    return Timing(median, q1, q3, len(times), worst, True)


def run_spec(name: str, params: dict[str, int], arrays: Mapping[str, np.ndarray],
             ref: np.ndarray | None, proto: Protocol, flush_cache: bool, llc: int,
             ints: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Every torch side of one spec: {"eager": Timing, "compile": ..., "sdpa": ...}."""
    xs = {k: torch.from_numpy(np.ascontiguousarray(v, np.int64) if k in ints else
                              np.ascontiguousarray(v, np.float32)) for k, v in arrays.items()}
    fn = TORCH[name]
    if ref is None:  # alone: eager torch in float64 is the reference
        ref = fn({k: v if k in ints else v.double() for k, v in xs.items()}, params).numpy()
    footprint = sum(v.nbytes for v in xs.values()) + int(np.asarray(ref).size) * 4
    nbytes = flush_bytes(footprint, llc) if flush_cache else 0
    flush = flusher(nbytes) if nbytes else None
    names = list(xs)

    def positional(f: Fn) -> Callable[..., torch.Tensor]:
        def call(*tensors: torch.Tensor) -> torch.Tensor:
            return f(dict(zip(names, tensors, strict=True)), params)
        return call

    args = [xs[k] for k in names]
    sides: dict[str, Timing] = {}
    with torch.inference_mode():
        eager = positional(fn)
        sides["eager"] = time_side(lambda: eager(*args), ref, proto, flush)
        torch._dynamo.reset()  # a fresh compile: dynamo's per-code cache holds 8 entries
        t0 = time.perf_counter()
        try:
            compiled = torch.compile(positional(fn))
            compiled(*args)  # compiles here
            compile_s = time.perf_counter() - t0
            sides["compile"] = time_side(lambda: compiled(*args), ref, proto, flush)
            sides["compile"].compile_s = compile_s
        except Exception as exc:
            sides["compile"] = Timing(failure=f"torch.compile raised {type(exc).__name__}: "
                                      f"{str(exc)[:200]}")
        if name in SDPA:
            sdpa = positional(SDPA[name])
            sides["sdpa"] = time_side(lambda: sdpa(*args), ref, proto, flush)
    return {"spec": name, "params": params, "flush_bytes": nbytes, "footprint": footprint,
            "sides": {k: asdict(v) for k, v in sides.items()}}


# -- output ---------------------------------------------------------------------------------


def _cell(t: Mapping[str, Any] | None) -> str:
    if t is None:
        return "—"
    if not t["ok"]:
        return f"fails: {t['failure'][:60]}"
    return f"{t['median'] * 1e3:.3g} ({t['q1'] * 1e3:.3g}–{t['q3'] * 1e3:.3g})"


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [header, "", "| spec | sizes | torch eager ms | torch.compile ms | SDPA ms | "
             "compile s |", "|---|---|---|---|---|---|"]
    for r in rows:
        s = r["sides"]
        compile_s = s["compile"].get("compile_s", math.nan)
        sizes = ",".join(f"{k}={v}" for k, v in r["params"].items())
        lines.append(f"| {r['spec']} | {sizes} | {_cell(s.get('eager'))} | "
                     f"{_cell(s.get('compile'))} | {_cell(s.get('sdpa'))} | "
                     + (f"{compile_s:.1f} |" if math.isfinite(compile_s) else "— |"))
    return "\n".join(lines) + "\n"


def parse_params(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"\s*[A-Za-z_]\w*\s*", key) or not re.fullmatch(
                r"\s*[+-]?\d+\s*", value):
            raise PeerError(f"bad parameter {item!r}; expected NAME=INTEGER, e.g. -p N=2048")
        out[key.strip()] = int(value)
    return out


def default_threads() -> int:
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None, help="spec names (file stems)")
    ap.add_argument("-p", "--param", action="append", default=[], help="K=V for every spec")
    ap.add_argument("--out", type=Path, default=None, help="Markdown table (default: "
                    "bench/results/torch_peer.md unless --json is given)")
    ap.add_argument("--json", type=Path, default=None, help="write the results as JSON")
    ap.add_argument("--data", type=Path, default=None,
                    help="npz with the inputs and __reference__ (one spec: needs --only NAME)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--flush", action=argparse.BooleanOptionalAction, default=True,
                    help="flush the LLC before each timed run when the data fits (default)")
    ap.add_argument("--llc-bytes", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=Protocol.warmup)
    ap.add_argument("--min-runs", type=int, default=Protocol.min_runs)
    ap.add_argument("--min-seconds", type=float, default=Protocol.min_seconds)
    args = ap.parse_args(argv)
    try:
        return _main(args, argv)
    except PeerError as e:
        print(f"torch_peer: {e}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace, argv: list[str] | None) -> int:
    overrides = parse_params(args.param)
    paths = {p.stem: p for p in sorted(SPECS.glob("*.ks"))}
    names = args.only if args.only else sorted(paths)
    unknown = [n for n in names if n not in paths or n not in TORCH]
    if unknown:
        raise PeerError(f"unknown spec {', '.join(unknown)}; known: {', '.join(sorted(TORCH))}")
    if args.data is not None and len(names) != 1:
        raise PeerError("--data holds one spec's inputs: give exactly one --only NAME")
    threads = args.threads or default_threads()
    if threads < 1:
        raise PeerError(f"--threads must be at least 1, not {threads}")
    torch.set_num_threads(threads)
    proto = Protocol(args.warmup, args.min_runs, args.min_seconds)
    llc = args.llc_bytes or llc_bytes()
    rows = []
    for name in names:
        spec_name, params, inputs = read_spec(paths[name], overrides)
        ref = None
        if args.data is not None:
            try:
                data = dict(np.load(args.data))
            except (OSError, ValueError) as e:
                raise PeerError(f"--data {args.data}: {e}") from None
            ref = data.pop("__reference__", None)
            want = {d.name: d.dims for d in inputs}
            got = {k: tuple(v.shape) for k, v in data.items()}
            if ref is None or got != want:
                raise PeerError(f"--data {args.data}: expected arrays {want} and "
                                f"__reference__, found {got}")
            arrays = data
        else:
            arrays = fill(inputs, label_bound=params.get(LABEL_BOUND.get(name, ""), 1))
        ints = frozenset(d.name for d in inputs if d.dtype == "i32")
        rows.append(run_spec(spec_name, params, arrays, ref, proto, args.flush, llc, ints))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "flush": args.flush, "llc_bytes": llc, "protocol": asdict(proto)}
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**meta, "rows": rows}))
    out = args.out if args.out is not None or args.json is not None else \
        ROOT / "bench/results/torch_peer.md"
    if out is not None:
        cmd = " ".join(sys.argv[1:] if argv is None else argv)
        cache = ("flushed before each timed run when the data fits" if args.flush
                 else "not flushed")
        header = (f"Command: `.venv-torch/bin/python bench/torch_peer.py {cmd}` "
                  f"({time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}, "
                  f"{meta['threads']} threads, cache {cache}; median and quartiles, ms)")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(markdown(rows, header))
        print(out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
