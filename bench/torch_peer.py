"""The torch peers on the CPU: eager torch, `torch.compile`, and SDPA for attention.

torch's CPU wheel on these machines is for Python 3.11 only, and kernelsat needs 3.12,
so this script runs in its own environment and imports nothing from kernelsat:

    PYENV_VERSION=3.11.7 python3 -m venv .venv-torch
    .venv-torch/bin/pip install torch==2.13.0 numpy
    .venv-torch/bin/python bench/torch_peer.py [--only NAME ...] [-p K=V ...] [--out FILE]

Shapes are the specs' defaults (specs/*.ks); inputs are random normal float32 (never
zeros); each function is warmed up (torch.compile compiles then), then timed: the median
of at least 10 runs and 0.5 s, with the interquartile range. Threads: torch's default
(the machine's cores). A numpy-free float64 check compares each result with eager torch
in float64.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _attention(q, k, v):
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return torch.softmax(s, dim=-1) @ v


def _layernorm(x, g, b):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), g, b, eps=1e-5)


def _rmsnorm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


def _chain(x):
    return torch.exp(x) * torch.sigmoid(x) + torch.tanh(x) * 0.5


CASES: dict[str, tuple[Callable[[dict[str, int]], list[torch.Tensor]], Callable[..., torch.Tensor],
                       dict[str, int]]] = {
    "attention": (lambda p: [torch.randn(p["B"], p["H"], p["N"], p["D"]) for _ in range(3)],
                  _attention, {"B": 1, "H": 8, "N": 1024, "D": 64}),
    "softmax": (lambda p: [torch.randn(p["M"], p["N"])], lambda x: torch.softmax(x, -1),
                {"M": 4096, "N": 1024}),
    "layernorm": (lambda p: [torch.randn(p["M"], p["N"]), torch.randn(p["N"]),
                             torch.randn(p["N"])], _layernorm, {"M": 4096, "N": 1024}),
    "rmsnorm": (lambda p: [torch.randn(p["M"], p["N"]), torch.randn(p["N"])], _rmsnorm,
                {"M": 4096, "N": 4096}),
    "elementwise": (lambda p: [torch.randn(p["M"], p["N"])], _chain, {"M": 4096, "N": 4096}),
}


def timeit(fn: Callable[[], torch.Tensor], min_runs: int = 10, min_seconds: float = 0.5
           ) -> tuple[float, float, float]:
    for _ in range(3):
        fn()
    times: list[float] = []
    while len(times) < min_runs or sum(times) < min_seconds:
        t0 = time.perf_counter_ns()
        fn()
        times.append((time.perf_counter_ns() - t0) / 1e9)
    q = statistics.quantiles(times, n=4)
    return statistics.median(times), q[0], q[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("-p", "--param", action="append", default=[])
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/torch_peer.md")
    args = ap.parse_args()
    overrides = {k: int(v) for k, v in (a.split("=") for a in args.param)}
    torch.manual_seed(0)
    rows = []
    for name, (make, fn, defaults) in CASES.items():
        if args.only and name not in args.only:
            continue
        params = {k: overrides.get(k, v) for k, v in defaults.items()}
        xs = make(params)
        ref = fn(*[x.double() for x in xs])
        variants: dict[str, Callable[..., torch.Tensor]] = {"eager": fn}
        t0 = time.perf_counter()
        compiled = torch.compile(fn)
        compiled(*xs)
        compile_s = time.perf_counter() - t0
        variants["compile"] = compiled
        if name == "attention":
            variants["sdpa"] = torch.nn.functional.scaled_dot_product_attention
        cells = []
        for label, f in variants.items():
            out = f(*xs)
            err = float((out.double() - ref).norm() / ref.norm())
            assert err < 1e-3, (name, label, err)
            med, q1, q3 = timeit(lambda f=f, xs=xs: f(*xs))
            cells.append(f"{label} {med * 1e3:.3g} ms ({q1 * 1e3:.3g}–{q3 * 1e3:.3g})")
        rows.append(f"| {name} | {','.join(f'{k}={v}' for k, v in params.items())} | "
                    + " | ".join(cells) + f" | {compile_s:.0f} s |")
        print(rows[-1], flush=True)
    head = ("| spec | sizes | torch eager | torch.compile | SDPA / — | compile time |\n"
            "|---|---|---|---|---|---|")
    argv = " ".join(sys.argv[1:])
    text = (f"Command: `.venv-torch/bin/python bench/torch_peer.py {argv}` "
            f"({time.strftime('%Y-%m-%d %H:%M')}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads)\n\n{head}\n" + "\n".join(rows) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
