"""kernelsat against its peers, spec by spec in one run: numpy, torch eager,
torch.compile and (attention) SDPA.

    bench/peers.sh [--only NAME ...] [-p K=V ...] [--out FILE] [--quick] [--no-extra]
        [--no-cliff] [--no-torch] [--no-flush] [--cache-dir DIR] [--keep-blas-env]

(bench/peers.sh makes .venv as bin/kernelsat does, then runs this file with it.)

For each spec in specs/*.ks (default sizes), in turn: `optimize` with its defaults for
the C target (its wall time recorded), then, on the same inputs (kernelsat.inputs:
random, never zero, one-hot where declared), kernelsat's shipped program, numpy as a
user would write it (bench/eager_vs_numpy.NUMPY), and torch eager, torch.compile and
SDPA through a subprocess into .venv-torch (bench/torch_peer.py, this one spec, the
same inputs and float64 reference through an .npz). The full run also times the
sizes the issue's targets name beyond the defaults (attention N=2048 and 4096, matmul
2048^3); they are listed apart and left out of the geometric mean.

numpy's BLAS runs its own kernels for this CPU: OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE,
which some of these machines set to force OpenBLAS's Haswell kernels, are unset for the
run (`--keep-blas-env` keeps them), and the table says which kernel ran.

Same for every side: the thread count (OMP_NUM_THREADS if set, else the cores this
process may use; set for OpenMP, OpenBLAS and torch before any of them loads), the
cache treatment (by default the LLC is flushed before every timed run when inputs and
output fit in it, kernelsat.hardware.measure's rule, which torch_peer.py applies too;
`--no-flush`: never), the timing protocol (warm-up, then the median and quartiles of
at least 10 runs and 0.2 s; every run's output checked against the float64 reference,
relative L2 error below 3e-4; the shipped and the eager program, when they differ,
in three alternating rounds each, `ALTERNATION`). The machine probe (bench/machine.py)
runs before and after. One Markdown table goes to bench/results/peers.md: the command and date, the
per-spec times, best peer / kernelsat (>1: kernelsat is faster), the fraction of the
roofline (kernelsat.hardware.cost's estimate of the shipped program), optimize's wall
time, kernels and extractors; the geometric mean; the issue's targets, met or not;
then bench/cliff.py's no-cliff cases (the default program at irregular sizes against
the nearest multiple of 16, per unit of work), also in the targets.

`.venv-torch` is created when missing (torch's CPU wheel needs Python 3.11):
`PYENV_VERSION=3.11.7 python3 -m venv .venv-torch && .venv-torch/bin/pip install
torch==2.13.0 numpy`. Expected time on the 2-core machine: 30-35 minutes for the full
run, about two thirds of it in optimize (in the last suite run optimize took 12 minutes
over the 19 specs and 8 more for attention N=4096 alone: `--no-extra` leaves the extra
sizes out); `--quick` (lighter protocol, optimize seconds=30, no extra sizes) about 15
minutes; `--only` for a few specs. The table is rewritten after every spec.
"""

from __future__ import annotations

import os
import sys


def pin_threads() -> int:
    """One thread count for every side, set before numpy, OpenMP or torch loads."""
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    threads = int(env) if env.isdigit() and int(env) > 0 else len(os.sched_getaffinity(0))
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    return threads


BLAS_OVERRIDES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
"""Variables some machines set to force OpenBLAS onto older kernels (older builds crash or
compute wrongly on new CPUs; a current numpy's does not, and every output is checked
here): unset for this benchmark, before numpy loads, unless --keep-blas-env."""

UNSET_BLAS: dict[str, str] = {}


def free_blas() -> dict[str, str]:
    """Unset BLAS_OVERRIDES (the ones set, with their values), so that numpy's OpenBLAS
    (and torch in its subprocess) picks its kernels for this CPU."""
    return {name: os.environ.pop(name) for name in BLAS_OVERRIDES if name in os.environ}


if __name__ == "__main__":
    THREADS = pin_threads()
    if "--keep-blas-env" not in sys.argv:
        UNSET_BLAS = free_blas()

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Mapping, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cliff  # noqa: E402
from harness import (  # noqa: E402
    ROOT,
    geomean,
    inputs_and_reference,
    load_program,
    ms,
    roofline_seconds,
    sizes,
    spec_paths,
    time_numpy,
    time_program,
    timed_optimize,
)

TORCH_ENV = ROOT / ".venv-torch"
TORCH_PEER = ROOT / "bench" / "torch_peer.py"
EXTRA = ("attention:N=2048", "attention:N=4096", "matmul:M=2048,N=2048,K=2048")
"""Sizes the issue's targets name beyond the specs' defaults (the full run times them)."""
TORCH_TIMEOUT_S = 900.0
"""torch_peer.py's limit for one spec (torch.compile included)."""
PEERS = ("numpy", "eager", "compile", "sdpa")
LABELS = {"numpy": "numpy", "eager": "torch eager", "compile": "torch.compile",
          "sdpa": "SDPA"}


class BenchError(Exception):
    """A setup or usage problem: said in one line, exit 2."""


# -- one side's figures ---------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One side's timing in seconds (NaN when it failed or was not run)."""

    median: float = math.nan
    q1: float = math.nan
    q3: float = math.nan
    ok: bool = False
    failure: str = ""

    @staticmethod
    def of(m: Any) -> Side:
        """From a kernelsat Measurement (or None: not run)."""
        if m is None:
            return Side()
        return Side(m.median, m.q1, m.q3, bool(m.ok), m.failure)

    @staticmethod
    def combine(rounds: Sequence[Side]) -> Side:
        """One side from several rounds' timings: the median of their medians (and of
        their quartiles); the first failure when any round failed."""
        failed = [r for r in rounds if not r.ok]
        if failed or not rounds:
            return failed[0] if failed else Side()
        med = [float(np.median([getattr(r, f) for r in rounds])) for f in ("median", "q1", "q3")]
        return Side(med[0], med[1], med[2], True)

    def cell(self) -> str:
        if self.ok:
            return f"{ms(self.median)} ({ms(self.q1)}–{ms(self.q3)})"
        return f"fails: {self.failure[:50]}" if self.failure else "—"


def torch_sides(payload: Mapping[str, Any], spec: str) -> dict[str, Side]:
    """The sides of `spec` in torch_peer.py's --json output; ValueError when it is not
    there or malformed."""
    rows = [r for r in payload.get("rows", []) if isinstance(r, Mapping) and r.get("spec") == spec]
    if len(rows) != 1:
        raise ValueError(f"torch_peer's JSON has {len(rows)} rows for {spec!r}, expected 1")
    out = {}
    for name, t in rows[0].get("sides", {}).items():
        try:
            out[name] = Side(float(t["median"]), float(t["q1"]), float(t["q3"]), bool(t["ok"]),
                             str(t.get("failure", "")))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"torch_peer's JSON: side {name!r} of {spec!r}: {e!r}") from None
    return out


@dataclass
class Row:
    """One spec at one size: every side's time and kernelsat's figures."""

    spec: str
    sizes: str
    kernelsat: Side
    peers: dict[str, Side] = field(default_factory=dict)
    roofline_s: float = math.nan  # the roofline time of the shipped program
    eager_c: float = math.nan  # the eager program's median (optimize's eager candidate)
    optimize_s: float = math.nan
    kernels: str = ""
    chosen_by: str = ""
    extra: bool = False  # a size beyond the defaults (left out of the geometric mean)

    def best_peer(self, among: Sequence[str] = PEERS) -> tuple[str, float]:
        """(name, median) of the fastest peer of `among` that ran and passed; ("", NaN)."""
        timed = [(s.median, n) for n, s in self.peers.items() if n in among and s.ok]
        if not timed:
            return "", math.nan
        t, name = min(timed)
        return name, t

    def ratio(self, among: Sequence[str] = PEERS) -> float:
        """Best peer's time / kernelsat's: above 1 kernelsat is faster."""
        return ratio(self.best_peer(among)[1], self.kernelsat.median if self.kernelsat.ok
                     else math.nan)

    def peer_ratio(self, name: str) -> float:
        """That peer's time / kernelsat's (NaN when either is missing)."""
        s = self.peers.get(name)
        return ratio(s.median if s and s.ok else math.nan,
                     self.kernelsat.median if self.kernelsat.ok else math.nan)

    @property
    def roofline(self) -> float:
        """Fraction of the roofline kernelsat's program reaches."""
        return ratio(self.roofline_s, self.kernelsat.median if self.kernelsat.ok else math.nan)

    @property
    def speedup_over_eager(self) -> float:
        return ratio(self.eager_c, self.kernelsat.median if self.kernelsat.ok else math.nan)


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator; NaN unless both are finite and positive."""
    if not (math.isfinite(numerator) and math.isfinite(denominator)
            and numerator > 0 and denominator > 0):
        return math.nan
    return numerator / denominator


def fmt_ratio(r: float) -> str:
    return f"{r:.2f}x" if math.isfinite(r) else "—"


def percent(fraction: float) -> str:
    """"45%", or "0.4%" below 1% (so that small is not shown as zero); "—" for NaN."""
    if not math.isfinite(fraction):
        return "—"
    return f"{fraction:.0%}" if fraction >= 0.01 else f"{fraction:.1%}"


# -- the tables -----------------------------------------------------------------------------


def spec_table(rows: Sequence[Row]) -> str:
    head = ["spec", "sizes", "kernelsat ms", "numpy ms", "torch eager ms", "torch.compile ms",
            "SDPA ms", "best peer / kernelsat", "of roofline", "over eager C", "optimize s",
            "kernels", "chosen by"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        name, _ = r.best_peer()
        best = f"{fmt_ratio(r.ratio())} ({LABELS[name]})" if name else "—"
        roof = percent(r.roofline)
        opt = f"{r.optimize_s:.0f}" if math.isfinite(r.optimize_s) else "—"
        cells = [r.spec + (" (extra size)" if r.extra else ""), r.sizes, r.kernelsat.cell(),
                 *(r.peers.get(p, Side()).cell() for p in PEERS), best, roof,
                 fmt_ratio(r.speedup_over_eager), opt, r.kernels or "—", r.chosen_by or "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


@dataclass(frozen=True)
class Target:
    """One line of the issue's target table: `value` must reach `need` (higher is better)."""

    what: str
    target: str
    value: float
    need: float
    shown: str = ""  # how the measured value reads (default: value as "1.23x")

    @property
    def met(self) -> bool | None:
        return None if not math.isfinite(self.value) else self.value >= self.need

    def line(self) -> str:
        shown = self.shown or fmt_ratio(self.value)
        if self.met is None:
            verdict, margin = "not measured", "—"
        elif self.met:
            verdict, margin = "yes", f"{self.value / self.need:.2f}x margin"
        else:
            verdict, margin = "**no**", f"{self.need / self.value:.2f}x short"
        return f"| {self.what} | {self.target} | {shown} | {verdict} | {margin} |"


REDUCTIONS = ("softmax", "layernorm", "rmsnorm", "logsumexp", "cross_entropy", "l2norm",
              "variance", "batchnorm")
FUSED = ("matmul_bias_gelu", "mlp2", "swiglu", "bmm")
ROOFLINE_NEED = 0.6
OPTIMIZE_LIMIT_S = 60.0


def targets(rows: Sequence[Row], cliffs: Sequence[cliff.Case] = ()) -> list[Target]:
    """The issue's targets against these rows and cliff cases (a spec that did not run
    gets no line)."""
    named = {r.spec: r for r in rows if not r.extra}
    out: list[Target] = []
    for r in sorted((r for r in rows if r.spec == "attention"), key=lambda r: r.sizes):
        out.append(Target(f"attention {r.sizes}", "faster than torch SDPA",
                          r.peer_ratio("sdpa"), 1.0))
    for r in sorted((r for r in rows if r.spec == "matmul"), key=lambda r: r.sizes):
        out.append(Target(f"matmul {r.sizes}", "≥ 0.9x numpy's speed",
                          r.peer_ratio("numpy"), 0.9))
    for name in FUSED:
        if name in named:
            out.append(Target(name, "faster than numpy and torch.compile",
                              named[name].ratio(("numpy", "compile")), 1.0))
    for name in REDUCTIONS:
        if name in named:
            out.append(Target(name, "≤ 1.1x the best of numpy, torch eager, torch.compile",
                              named[name].ratio(("numpy", "eager", "compile")), 1 / 1.1))
    if "elementwise" in named:
        out.append(Target("elementwise", "≥ 2x faster than torch.compile",
                          named["elementwise"].peer_ratio("compile"), 2.0))
    defaults = [r for r in rows if not r.extra]
    roof = [r.roofline for r in defaults if math.isfinite(r.roofline)]
    if roof:
        low = [f"{r.spec} {percent(r.roofline)}" for r in defaults
               if r.roofline < ROOFLINE_NEED]
        out.append(Target("every spec", "≥ 60% of the roofline", min(roof) / ROOFLINE_NEED, 1.0,
                          f"lowest {percent(min(roof))}; below: {', '.join(low) or 'none'}"))
    eager = [r.speedup_over_eager for r in defaults if math.isfinite(r.speedup_over_eager)]
    if eager:
        slow = [f"{r.spec} {fmt_ratio(r.speedup_over_eager)}" for r in defaults
                if r.speedup_over_eager < 1]
        out.append(Target("every spec", "never slower than the eager program", min(eager), 1.0,
                          f"lowest {fmt_ratio(min(eager))}; below 1: {', '.join(slow) or 'none'}"))
    g = geomean(r.ratio(("eager", "compile", "sdpa")) for r in defaults)
    if defaults:
        out.append(Target(f"geomean over {len(defaults)} specs", "≥ 1.5x the best torch figure",
                          g, 1.5))
    opt = [r.optimize_s for r in defaults if math.isfinite(r.optimize_s)]
    if opt:
        over = [f"{r.spec} {r.optimize_s:.0f} s" for r in defaults
                if r.optimize_s >= OPTIMIZE_LIMIT_S]
        out.append(Target("optimize wall time", "under 60 s per spec",
                          OPTIMIZE_LIMIT_S / max(opt), 1.0,
                          f"longest {max(opt):.0f} s; over: {', '.join(over) or 'none'}"))
    if cliffs:
        what, worst = cliff.worst(cliffs)
        out.append(Target(f"no cliff ({len(cliffs)} cases)",
                          f"≤ {cliff.LIMIT}x per element at the nearest multiple",
                          ratio(cliff.LIMIT, worst), 1.0,
                          f"worst {fmt_ratio(worst)} ({what})" if what else ""))
    return out


def markdown(rows: Sequence[Row], command: str, setup: str, before: Mapping[str, Any],
             after: Mapping[str, Any], cliffs: Sequence[cliff.Case] = (),
             cliff_setup: str = "") -> str:
    defaults = [r for r in rows if not r.extra]
    g = geomean(r.ratio() for r in defaults)
    g_torch = geomean(r.ratio(("eager", "compile", "sdpa")) for r in defaults)
    n = sum(math.isfinite(r.ratio()) for r in defaults)
    parts = [
        f"Command: `{command}` ({time.strftime('%Y-%m-%d %H:%M %Z')})",
        "",
        setup,
        "",
        f"Machine probe before: {probe_line(before)}",
        "",
        f"Machine probe after: {probe_line(after)}",
        "",
        "Times: median (first–third quartile) in ms. best peer / kernelsat above 1: kernelsat "
        "is faster. of roofline: the roofline time of the shipped program "
        "(kernelsat.hardware.cost) / its measured time. over eager C: optimize's eager "
        "candidate (the spec as written) timed here / the shipped program.",
        "",
        spec_table(rows),
        "",
        f"Geometric mean of best peer / kernelsat over {n} specs (extra sizes left out): "
        f"**{fmt_ratio(g)}**; of best torch figure / kernelsat: **{fmt_ratio(g_torch)}**.",
        "",
        "Targets (issue 15):",
        "",
        "| what | target | measured | met? | by how much |",
        "|---|---|---|---|---|",
        *(t.line() for t in targets(rows, cliffs)),
    ]
    if cliffs:
        parts += ["", f"No cliff (bench/cliff.py's cases, in this run). {cliff_setup}", "",
                  cliff.table(cliffs)]
    return "\n".join(parts) + "\n"


def probe_line(p: Mapping[str, Any]) -> str:
    """bench/machine.py's probe as one line."""
    if not p:
        return "not taken yet (the run is in progress, or was interrupted)"
    return (f"{p.get('when')} {p.get('cpu')} x{p.get('cores')}, "
            f"load {p.get('load_avg_1m', 0):.2f}, "
            f"matmul {p.get('matmul_gflops')} GFLOP/s (peak {p.get('peak_fp32_gflops')}), "
            f"triad {p.get('triad_gb_s')} GB/s ({p.get('triad_engine')})")


# -- running ------------------------------------------------------------------------------


ALTERNATION = (0, 1, 1, 0, 0, 1)
"""The order in which the shipped program (0) and the eager one (1) are timed when they
differ: three rounds each, alternating, so that a slow minute of the machine lands on
both."""

TORCH_THREADS: set[int] = set()
"""The thread counts torch_peer.py reported (torch.get_num_threads) in this run."""


def blas_threads() -> int | None:
    """The thread count numpy's OpenBLAS reports, when it is OpenBLAS (None otherwise)."""
    return _openblas_call(("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_",
                           "openblas_get_num_threads"), int)


def blas_kernel() -> str | None:
    """The kernel family numpy's OpenBLAS runs ("SkylakeX", "Haswell" ...), None when it
    is not OpenBLAS."""
    return _openblas_call(("scipy_openblas_get_corename64_", "openblas_get_corename64_",
                           "openblas_get_corename"), lambda b: b.decode(), returns_string=True)


def _openblas_call(names: Sequence[str], convert: Any, returns_string: bool = False) -> Any:
    """The first of `names` found in a loaded OpenBLAS, called, its result converted."""
    import ctypes

    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    libs = sorted({line.split()[-1] for line in maps.splitlines()
                   if "openblas" in line.lower() and line.split()[-1].startswith("/")})
    for path in libs:
        lib = ctypes.CDLL(path)
        for name in names:
            fn = getattr(lib, name, None)
            if fn is not None:
                if returns_string:
                    fn.restype = ctypes.c_char_p
                return convert(fn())
    return None


def torch_python(create: bool = True) -> Path:
    """.venv-torch's python with torch importable, created when missing (BenchError when
    that fails)."""
    python = TORCH_ENV / "bin" / "python"
    if python.exists() and subprocess.run([str(python), "-c", "import torch, numpy"],
                                          capture_output=True).returncode == 0:
        return python
    if not create:
        raise BenchError(f"{python} cannot import torch")
    print(f"peers: creating {TORCH_ENV} (torch 2.13.0, Python 3.11; a few minutes)",
          file=sys.stderr, flush=True)
    env = {**os.environ, "PYENV_VERSION": "3.11.7"}
    is_311 = "import sys; sys.exit(sys.version_info[:2] != (3, 11))"
    base = next((c for c in ("python3", "python3.11") if subprocess.run(
        [c, "-c", is_311], env=env, capture_output=True).returncode == 0), None)
    if base is None:
        raise BenchError("torch 2.13.0's CPU wheel needs Python 3.11: found neither "
                         "`PYENV_VERSION=3.11.7 python3` nor python3.11 (or run with --no-torch)")
    for cmd in ([base, "-m", "venv", str(TORCH_ENV)],
                [str(TORCH_ENV / "bin" / "pip"), "install", "torch==2.13.0", "numpy"]):
        if subprocess.run(cmd, env=env, cwd=ROOT).returncode != 0:
            raise BenchError(f"setting up the torch environment failed at: {' '.join(cmd)} "
                             f"(or run with --no-torch)")
    return python


def run_torch(python: Path, name: str, params: Mapping[str, int],
              inputs: Mapping[str, np.ndarray], ref: np.ndarray, threads: int, flush: bool,
              protocol: Mapping[str, Any]) -> dict[str, Side]:
    """torch_peer.py for one spec on these inputs, holding the machine's timing lock."""
    from kernelsat.hardware.cpu import detect_cpu
    from kernelsat.hardware.timing_lock import timing_session

    with tempfile.TemporaryDirectory(prefix="kernelsat-peers-") as tmp:
        data, out = Path(tmp) / "data.npz", Path(tmp) / "out.json"
        arrays: dict[str, Any] = {"__reference__": ref, **inputs}
        np.savez(data, **arrays)
        cmd = [str(python), str(TORCH_PEER), "--only", name, "--data", str(data),
               "--json", str(out), "--threads", str(threads),
               "--llc-bytes", str(detect_cpu().llc_bytes),
               "--warmup", str(protocol["warmup"]), "--min-runs", str(protocol["min_runs"]),
               "--min-seconds", str(protocol["min_seconds"]),
               "--flush" if flush else "--no-flush"]
        for k, v in params.items():
            cmd += ["-p", f"{k}={v}"]
        try:
            with timing_session():
                proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                                      timeout=TORCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            failed = Side(failure=f"torch_peer stopped after {TORCH_TIMEOUT_S:.0f} s")
            return {"eager": failed, "compile": failed}
        if proc.returncode != 0 or not out.exists():
            why = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            failed = Side(failure=f"torch_peer exit {proc.returncode}: {why}")
            return {"eager": failed, "compile": failed}
        result = json.loads(out.read_text())
        TORCH_THREADS.add(int(result.get("threads", 0)))
        return torch_sides(result, name)


def run_row(path: Path, overrides: Mapping[str, int], args: argparse.Namespace,
            python: Path | None, protocol: Mapping[str, Any], extra: bool) -> Row:
    """One spec's turn: optimize, then every side on the same inputs."""
    program = load_program(path, overrides)
    options: dict[str, Any] = {"cache_dir": args.cache_dir}
    if args.quick:
        options["seconds"] = 30.0
    try:
        result, opt_s = timed_optimize(program, **options)
    except Exception as exc:  # a failing spec is a row, not the end of the run
        return Row(program.name, sizes(program),
                   Side(failure=f"optimize raised {type(exc).__name__}: {exc}"), extra=extra)
    best = result.best
    inputs, ref = inputs_and_reference(program)
    kw = {**protocol, "flush_cache": args.flush}

    def timed(c: Any) -> Side:
        try:
            return Side.of(time_program(c.term, program.out_axes, inputs, ref, result.target,
                                        c.knobs, **kw))
        except Exception as exc:  # a build failure is a result too
            return Side(failure=f"{type(exc).__name__}: {exc}")

    if best is result.eager:
        ks = eager = timed(best)
    else:  # "over eager C" is a ratio of two timings: taken in alternating rounds
        rounds: dict[int, list[Side]] = {0: [], 1: []}
        for i in ALTERNATION:
            rounds[i].append(timed((best, result.eager)[i]))
        ks, eager = Side.combine(rounds[0]), Side.combine(rounds[1])
    row = Row(program.name, sizes(program), ks,
              peers={"numpy": Side.of(time_numpy(program, inputs, ref, **kw))},
              roofline_s=roofline_seconds(best.term, program.out_axes),
              eager_c=eager.median if eager.ok else math.nan, optimize_s=opt_s,
              kernels=f"{result.eager.kernels}->{best.kernels}",
              chosen_by=",".join(best.methods), extra=extra)
    if python is not None:
        row.peers.update(run_torch(python, program.name, program.params, inputs, ref,
                                   args.threads, args.flush, protocol))
    return row


def parse_extra(items: Sequence[str]) -> list[tuple[str, dict[str, int]]]:
    """["attention:N=2048", "matmul:M=2048,N=2048"] -> [(spec, params), ...]."""
    from kernelsat.spec import parse_params

    out = []
    for item in items:
        name, colon, rest = item.partition(":")
        if not colon or not name.strip():
            raise BenchError(f"bad --extra {item!r}; expected SPEC:K=V[,K=V...], "
                             f"e.g. attention:N=2048")
        try:
            out.append((name.strip(), parse_params(rest.split(","))))
        except ValueError as e:
            raise BenchError(f"bad --extra {item!r}: {e}") from None
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None, help="these specs (file stems)")
    ap.add_argument("-p", "--param", action="append", default=[], help="K=V for every spec")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "peers.md")
    ap.add_argument("--quick", action="store_true",
                    help="lighter protocol (warm-up 1, 5 runs, 0.1 s), optimize seconds=30, "
                         "no extra sizes")
    ap.add_argument("--extra", action="append", default=None,
                    help=f"SPEC:K=V,... beyond the defaults (default: {' '.join(EXTRA)}; "
                         "none with -p or --quick)")
    ap.add_argument("--no-extra", action="store_true", help="no sizes beyond the defaults")
    ap.add_argument("--no-torch", action="store_true", help="numpy only (no .venv-torch)")
    ap.add_argument("--keep-blas-env", action="store_true",
                    help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE (default: unset them)")
    ap.add_argument("--no-cliff", action="store_true",
                    help="skip bench/cliff.py's cases (run after the specs by default)")
    ap.add_argument("--flush", action=argparse.BooleanOptionalAction, default=True,
                    help="flush the LLC before each timed run when the data fits, every side "
                         "(default); --no-flush: never, every side")
    ap.add_argument("--cache-dir", type=Path, default=None, help="optimize's cache folder")
    args = ap.parse_args(argv)
    args.threads = pin_threads()  # idempotent: the count chosen at start-up
    try:
        return _main(args, list(sys.argv[1:] if argv is None else argv))
    except BenchError as e:
        print(f"peers: {e}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace, argv: list[str]) -> int:
    from machine import probe

    from kernelsat.spec import parse_params

    try:
        overrides = parse_params(args.param)
        paths = spec_paths(args.only)
    except ValueError as e:
        raise BenchError(str(e)) from None
    extra = [] if args.quick or args.no_extra or args.param else parse_extra(
        args.extra if args.extra is not None else EXTRA)
    if args.only:
        extra = [(n, p) for n, p in extra if n in args.only]
    extra_paths = {n: spec_paths([n])[0] for n, _ in extra} if extra else {}
    protocol = ({"warmup": 1, "min_runs": 5, "min_seconds": 0.1} if args.quick
                else {"warmup": 2, "min_runs": 10, "min_seconds": 0.2})
    python = None if args.no_torch else torch_python()
    cache = ("LLC flushed before every timed run when inputs and output fit in it "
             "(kernelsat.hardware.measure's rule), for every side" if args.flush
             else "never flushed, for every side")
    setup = (f"Threads: {args.threads} for every side (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, "
             f"torch.set_num_threads). Cache: {cache}. Protocol: warm-up {protocol['warmup']}, "
             f"then at least {protocol['min_runs']} runs and {protocol['min_seconds']} s, every "
             "output checked against the float64 reference. Inputs: kernelsat.inputs (random "
             "sign x uniform [0.5, 1.5], one-hot targets), the same arrays for every side. "
             f"optimize: its defaults{' but seconds=30 (--quick)' if args.quick else ''}, C "
             "target." + ("" if python else " torch: not run (--no-torch)."))
    before = probe(quick=True)
    rows: list[Row] = []
    turns = [(p, overrides, False) for p in paths] + [
        (extra_paths[n], p, True) for n, p in extra]
    command = ("python bench/peers.py " + " ".join(argv)).strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for i, (path, params, is_extra) in enumerate(turns, 1):
        t0 = time.perf_counter()
        try:
            rows.append(run_row(path, params, args, python, protocol, is_extra))
        except Exception as exc:  # one spec's crash is its row, not the end of the run
            traceback.print_exc(file=sys.stderr)
            rows.append(Row(path.stem, ",".join(f"{k}={v}" for k, v in params.items()),
                            Side(failure=f"{type(exc).__name__}: {exc}"), extra=is_extra))
        r = rows[-1]
        print(f"[{i}/{len(turns)}, {time.perf_counter() - start:.0f} s] {r.spec} {r.sizes}: "
              f"kernelsat {r.kernelsat.cell()} ms, "
              + ", ".join(f"{LABELS[k]} {v.cell()}" for k, v in r.peers.items())
              + f" ({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        # the table so far, so that an interrupted run leaves its rows
        args.out.write_text(markdown(rows, command, setup, before, {}))
    cliffs: list[cliff.Case] = []
    cases = [] if args.no_cliff else [cliff.parse_case(c) for c in cliff.CASES]
    repeat = 1 if args.quick else 2
    for name, params in cases:
        if args.only and name not in args.only:
            continue
        try:
            a, b = cliff.time_case(name, params, 16, repeat, False, protocol)
        except Exception as exc:
            traceback.print_exc(file=sys.stderr)
            failed = cliff.Timed(",".join(f"{k}={v}" for k, v in params.items()), math.nan,
                                 math.nan, f"{type(exc).__name__}: {exc}")
            a, b = failed, failed
        cliffs.append((name, a, b))
        print(f"cliff {name}: {a.sizes} {ms(a.median)} ms, {b.sizes} {ms(b.median)} ms, "
              f"ratio {fmt_ratio(cliff.cliff_ratio(a, b))}", file=sys.stderr, flush=True)
    cliff_setup = cliff.describe("the spec as written, lowered with the default knobs", 16,
                                 repeat, protocol)
    after = probe(quick=True)
    setup += (f" Checked: numpy's OpenBLAS reports {blas_threads() or 'n/a'} threads and runs "
              f"its {blas_kernel() or 'n/a'} kernels, torch "
              f"{', '.join(map(str, sorted(TORCH_THREADS))) or 'n/a'} threads.")
    if UNSET_BLAS:
        setup += (" Unset for this run (so that OpenBLAS picks its kernels for this CPU; "
                  "--keep-blas-env keeps them): "
                  + ", ".join(f"{k}={v}" for k, v in UNSET_BLAS.items()) + ".")
    text = markdown(rows, command, setup, before, after, cliffs, cliff_setup)
    text += f"\nTotal wall time: {time.perf_counter() - start:.0f} s.\n"
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
