"""The eager baseline against numpy (and torch on the CPU, when importable).

For every spec in specs/, time the eager program (one kernel per statement, as the
spec is written) through the C target, and the same computation written in numpy
the way a user would write it (below, one function per spec), by the same protocol
(`kernelsat.hardware.measure`: random inputs, poisoned output checked against the
float64 reference after every run, warm-up, median of repeated runs, LLC flushed
between runs). numpy and torch allocate their results as users' code does; only
their call is timed, not the copy into the checked output buffer.

Writes a Markdown table, with the command that produced it and a machine probe, to
bench/results/eager_vs_numpy.md (`--quick`: one small spec, to
bench/results/eager_vs_numpy.quick.md). The last line is the Spearman rank
correlation between the IR roofline estimate and the measured eager C times: how
well the cost model ranks programs (`kernelsat.hardware.cost.rank_correlation`).

    .venv/bin/python bench/eager_vs_numpy.py [--quick] [--spec softmax] [-p N=512]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kernelsat.hardware.bench import bench_term, out_shape, reference
from kernelsat.hardware.cost import estimate_term, rank_correlation
from kernelsat.hardware.measure import Measurement, measure
from kernelsat.hardware.targets import get_target

ROOT = Path(__file__).resolve().parent.parent
Arrays = Mapping[str, np.ndarray]
P = Mapping[str, int]


# -- numpy as a user would write it ------------------------------------------------------


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _lse(x: np.ndarray, axis: int = -1) -> np.ndarray:
    m = x.max(axis=axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.exp(x - m).sum(axis=axis))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _gelu(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf  # numpy has no erf; users reach for scipy

    return 0.5 * x * (1 + erf(x / np.sqrt(np.float32(2))))


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    c = np.float32(math.sqrt(2 / math.pi))
    return 0.5 * x * (1 + np.tanh(c * (x + np.float32(0.044715) * x**3)))


def _attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    s = q @ k.swapaxes(-1, -2) / np.float32(math.sqrt(q.shape[-1]))
    return _softmax(s) @ v


def _attention_packed(x: Arrays, p: P) -> np.ndarray:
    b, n, h = p["B"], p["N"], p["H"]
    q, k, v = (x[name].reshape(b, n, h, -1).transpose(0, 2, 1, 3) for name in "QKV")
    return _attention(q, k, v).transpose(0, 2, 1, 3)  # [b, i, h, e]


def _layernorm(x: np.ndarray, axis: int, eps: float = 1e-5) -> np.ndarray:
    mean = x.mean(axis=axis, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=axis, keepdims=True) + np.float32(eps))


NUMPY: dict[str, Callable[[Arrays, P], np.ndarray]] = {
    "attention": lambda x, p: _attention(x["Q"], x["K"], x["V"]),
    "attention_packed": _attention_packed,
    "batchnorm": lambda x, p: _layernorm(x["X"], axis=0),
    "bmm": lambda x, p: x["A"] @ x["B"],
    "cross_entropy": lambda x, p: np.mean(_lse(x["X"]) - (x["X"] * x["T"]).sum(axis=1)),
    "elementwise": lambda x, p: np.exp(x["X"]) * _sigmoid(x["X"]) + np.tanh(x["X"]) * 0.5,
    "gemv": lambda x, p: x["A"] @ x["X"],
    "l2norm": lambda x, p: x["X"] / np.maximum(
        np.sqrt((x["X"] * x["X"]).sum(axis=1, keepdims=True)), np.float32(1e-12)),
    "layernorm": lambda x, p: _layernorm(x["X"], axis=1) * x["G"] + x["Bias"],
    "logsumexp": lambda x, p: _lse(x["X"]),
    "matmul": lambda x, p: x["A"] @ x["B"],
    "matmul_bias_gelu": lambda x, p: _gelu(x["X"] @ x["W"] + x["Bias"]),
    "mlp2": lambda x, p: _gelu_tanh(x["X"] @ x["W1"] + x["B1"]) @ x["W2"] + x["B2"],
    "rmsnorm": lambda x, p: x["X"] / np.sqrt(
        (x["X"] * x["X"]).mean(axis=1, keepdims=True) + np.float32(1e-6)) * x["W"],
    "row_range": lambda x, p: x["X"].max(axis=1) - x["X"].min(axis=1),
    "rowsum": lambda x, p: x["X"].sum(axis=1),
    "softmax": lambda x, p: _softmax(x["X"]),
    "swiglu": lambda x, p: ((lambda g: g * _sigmoid(g))(x["X"] @ x["Wg"]) * (x["X"] @ x["Wu"]))
    @ x["Wd"],
    "variance": lambda x, p: x["X"].var(axis=1),
}
"""Spec name -> the numpy a user would write, returning the output in the spec's layout."""


def _torch_versions() -> dict[str, Callable[[Arrays, P], Any]]:
    """The same in torch (CPU: bench/torch_peer.TORCH), or {} when torch is not importable."""
    try:
        from torch_peer import TORCH
    except ImportError:
        return {}
    return dict(TORCH)


# -- timing ------------------------------------------------------------------------------


def time_function(fn: Callable[[Arrays, P], Any], inputs: Arrays, params: P,
                  shape: tuple[int, ...], ref: np.ndarray, convert: Callable[[Arrays], Arrays],
                  to_numpy: Callable[[Any], np.ndarray], **kw: Any) -> Measurement:
    """Time `fn` (which allocates its result) by the protocol: only its call is timed;
    its result is copied into the poisoned output buffer and checked."""
    args = convert(inputs)
    last = [0.0]

    def exe(_: Arrays, out: np.ndarray) -> None:
        t0 = time.perf_counter_ns()
        result = fn(args, params)
        last[0] = (time.perf_counter_ns() - t0) / 1e9
        out[...] = np.reshape(to_numpy(result), shape)

    def timer(thunk: Callable[[], Any]) -> float:
        thunk()
        return last[0]

    return measure(exe, inputs, shape, ref, timer=timer, **kw)


def _cell(m: Measurement | None) -> str:
    if m is None:
        return "—"
    if not m.ok:
        return f"fails: {m.failure[:40]}"
    return f"{m.median * 1e3:.3g} ms ±{(m.q3 - m.q1) / 2 * 1e3:.2g}"


def run_spec(path: Path, params: dict[str, int], torch_fns: dict[str, Any], kw: dict[str, Any]
             ) -> dict[str, Any]:
    """One table row: the eager C time, numpy, torch, and the roofline estimate."""
    from kernelsat.inputs import random_inputs
    from kernelsat.spec import load_spec

    declared = load_spec(path).params  # apply only the overrides this spec declares
    prog = load_spec(path, {k: v for k, v in params.items() if k in declared})
    inputs = {k: v.astype(np.float32) for k, v in random_inputs(prog, seed=0).items()}
    shape = out_shape(prog.term, prog.out_axes)
    ref = reference(prog.term, prog.out_axes, inputs)
    cpu = get_target("c")
    row: dict[str, Any] = {"spec": prog.name, "params": prog.params,
                           "estimate": estimate_term(prog.term, cpu)}
    try:
        result = bench_term(prog.term, prog.out_axes, inputs, cpu, **kw)
        row["c"], row["kernels"] = result.measurement, len(result.kernels)
    except Exception as exc:
        row["c"] = Measurement.failed(f"{type(exc).__name__}: {exc}")
        traceback.print_exc(file=sys.stderr)
    fn = NUMPY.get(prog.name)
    row["numpy"] = (time_function(fn, inputs, prog.params, shape, ref, dict, np.asarray, **kw)
                    if fn else None)
    tfn = torch_fns.get(prog.name)
    if tfn is not None:
        import torch

        def convert(x: Arrays) -> Arrays:
            return {k: torch.from_numpy(v) for k, v in x.items()}

        row["torch"] = time_function(tfn, inputs, prog.params, shape, ref, convert,
                                     lambda t: t.numpy(), **kw)
    return row


def markdown(rows: list[dict[str, Any]], command: str, machine: str, torch_ok: bool) -> str:
    """The results as a Markdown table with its provenance."""
    head = ["spec", "params", "kernels", "eager C", "numpy", "torch", "numpy / C",
            "roofline", "C of roofline"]
    lines = [f"Produced by `{command}`", "", f"Machine: {machine}", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        c, n = r["c"], r.get("numpy")
        ratio = f"{n.median / c.median:.2f}x" if c.ok and n is not None and n.ok else "—"
        frac = f"{r['estimate'] / c.median:.0%}" if c.ok else "—"
        params = " ".join(f"{k}={v}" for k, v in r["params"].items())
        lines.append("| " + " | ".join([
            r["spec"], params, str(r.get("kernels", "—")), _cell(c), _cell(n),
            _cell(r.get("torch")) if torch_ok else "not installed", ratio,
            f"{r['estimate'] * 1e3:.3g} ms", frac]) + " |")
    ok = [r for r in rows if r["c"].ok]
    rho = rank_correlation([r["estimate"] for r in ok], [r["c"].median for r in ok])
    lines += ["", f"Spearman rank correlation, IR roofline estimate vs measured eager C "
              f"({len(ok)} specs): {rho:.2f}" if not math.isnan(rho) else
              f"Spearman rank correlation: n/a ({len(ok)} specs timed)"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="one small spec (softmax 256x256), few runs")
    parser.add_argument("--spec", action="append", help="only these specs (by file stem)")
    parser.add_argument("-p", "--param", action="append", default=[], help="K=V for every spec")
    parser.add_argument("--out", type=Path, help="where to write the Markdown table")
    args = parser.parse_args()
    from kernelsat.spec import parse_params

    sys.path.insert(0, str(ROOT / "bench"))
    from machine import probe  # the probe beside this script

    params = parse_params(args.param)
    names = args.spec or (["softmax"] if args.quick else None)
    if args.quick and not args.param:
        params = {"M": 256, "N": 256}
    specs = sorted((ROOT / "specs").glob("*.ks"))
    if names:
        specs = [s for s in specs if s.stem in names]
    kw: dict[str, Any] = ({"min_runs": 3, "min_seconds": 0.0, "warmup": 1} if args.quick
                          else {"min_runs": 10, "min_seconds": 0.5, "warmup": 2})
    torch_fns = _torch_versions()
    before = probe(quick=args.quick)
    rows = []
    for path in specs:
        print(f"{path.stem} ...", file=sys.stderr, flush=True)
        rows.append(run_spec(path, params, torch_fns, kw))
    machine = (f"{before['cpu']} x{before['cores']}, matmul {before['matmul_gflops']} GFLOP/s, "
               f"triad {before['triad_gb_s']} GB/s, load {before['load_avg_1m']:.2f}, "
               f"{before['when']}")
    command = "python bench/eager_vs_numpy.py " + " ".join(sys.argv[1:])
    out = args.out or ROOT / "bench" / "results" / (
        "eager_vs_numpy.quick.md" if args.quick else "eager_vs_numpy.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(markdown(rows, command.strip(), machine, bool(torch_fns)))
    print(out.read_text())


if __name__ == "__main__":
    main()
