"""The GPU check: every spec's CUDA program against the float64 reference, and attention and
matmul timed against torch (SDPA, cuBLAS), on one NVIDIA GPU, in one bounded run.

    python3 bench/gpu_check.py --results out/gpu_check.md [--programs .gpu/programs]
                               [--budget-s 420] [--runtime auto|pycuda|cupy] [--quick]

Run through bench/gpu_check.sh, which builds pycuda from its source distribution first
(`--prepare` on a machine with network access puts it, and the wheels the GPU machine
lacks, under .gpu/). Without a usable GPU the script writes a results file that says why
and exits 2; it never waits on a device. Every part checks the clock and stops (saying
what it skipped) when the budget runs out.

1. Correctness: each spec (specs/*.ks) at its default sizes is lowered once; its CUDA
   program is rendered at the default knobs and at every value of every CUDA-only knob
   (`kernelsat.codegen.cuda.CUDA_KNOBS`, one at a time), compiled for the device's
   architecture, run on the spec's inputs in float32 (output poisoned with NaN first),
   and compared with the float64 interpreter by the ship gate's own check
   (`hardware.measure.check_output`: every element written, finite, relative L2 error
   under the float32 bound). Integer inputs (gather labels) go up as int32. A spec with
   a gather also gets a "gather-flag" row: one label set out of range must set the
   device flag `ks_gather_error`, whose read-back must give the `GatherIndexError`
   naming the input, its position and the bound (what the CUDA target raises), and
   in-range labels must leave the flag clear (issue 18 part 3b).
2. Timing: attention (B=1, H=8, D=64; N=1024, 2048, 4096) and matmul (1024^3, 2048^3),
   our program (the optimized term `--prepare` saved, else the spec's own) at each CUDA
   knob variant that passed, best reported, against torch's SDPA and torch.matmul in float32
   (TF32 off, the same arithmetic as ours; a TF32 figure beside it for reference). Median of
   CUDA-event timings after warm-up; inputs stay on the device.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import tomllib
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EXIT_NO_GPU = 2
EXIT_FAILED = 1
ATTENTION_SIZES = (1024, 2048, 4096)
MATMUL_SIZES = (1024, 2048)


# -- kernelsat from the working tree (no install needed) ------------------------------------


def kernelsat_path(root: Path = ROOT, scratch: Path | None = None) -> Path:
    """A folder to put on sys.path that holds `kernelsat` as pyproject.toml lays it out
    (kernelsat/ plus each `kernelsat.<stage>` folder linked in), built from symlinks."""
    conf = tomllib.loads((root / "pyproject.toml").read_text())
    dirs = conf["tool"]["setuptools"]["package-dir"]
    base = scratch or Path(os.environ.get("TMPDIR", "/tmp")) / f"kernelsat-path-{os.getuid()}"
    pkg = base / "kernelsat"
    pkg.mkdir(parents=True, exist_ok=True)
    for entry in (root / dirs.get("kernelsat", "kernelsat")).iterdir():
        link = pkg / entry.name
        if not link.exists():
            link.symlink_to(entry)
    for name, folder in dirs.items():
        parts = name.split(".")
        if len(parts) == 2:
            link = pkg / parts[1]
            if not link.exists():
                link.symlink_to(root / folder)
    return base


def import_kernelsat() -> None:
    try:
        import kernelsat.codegen  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(kernelsat_path()))


# -- the device runtime: pycuda (built from source by gpu_check.sh) or CuPy -----------------


class NoGPU(Exception):
    """No usable NVIDIA GPU or no runtime to drive one; the message says which."""


@dataclass
class Runtime:
    """Just what this check needs from a CUDA runtime."""

    name: str
    device: str
    arch: str
    compile: Callable[[str, list[str]], list[Any]]  # (source, kernel names) -> functions
    to_device: Callable[[np.ndarray], Any]
    empty: Callable[[int], Any]  # float32 elements
    to_host: Callable[[Any, np.ndarray], None]
    launch: Callable[[Any, int, int, list[Any]], None]  # fn, blocks, threads, buffers
    time_ms: Callable[[Callable[[], None], int, int], list[float]]  # fn, warmup, reps


GLOBALS: dict[int, Callable[[str, int], np.ndarray]] = {}
"""id(compiled kernel function) -> a reader of a `__device__` int64 array of its module
(the gather flag `ks_gather_error`), which reads it, returns it and zeroes it."""


def _device_dtype(a: np.ndarray) -> type:
    """Integer inputs (gather labels, int32 in generated code) stay int32; the rest float32."""
    return np.int32 if np.asarray(a).dtype.kind in "iu" else np.float32


def _pycuda_global(drv: Any, module: Any, name: str, n: int) -> np.ndarray:
    ptr, _ = module.get_global(name)
    out = np.zeros(n, np.int64)
    drv.Context.synchronize()
    drv.memcpy_dtoh(out, ptr)
    drv.memcpy_htod(ptr, np.zeros(n, np.int64))
    return out


def _cupy_global(cp: Any, module: Any, name: str, n: int) -> np.ndarray:
    ptr = module.get_global(name)
    arr = cp.ndarray((n,), cp.int64, ptr)
    out = cp.asnumpy(arr)
    arr[...] = 0
    cp.cuda.Device().synchronize()
    return out


def pycuda_runtime() -> Runtime:
    try:
        import pycuda.driver as drv  # optional: built by bench/gpu_check.sh
        from pycuda.compiler import SourceModule  # optional, as above
    except Exception as e:  # ImportError, or a build against another CUDA
        raise NoGPU(f"pycuda is not importable: {type(e).__name__}: {e}") from e
    try:
        drv.init()
        if drv.Device.count() < 1:
            raise NoGPU("pycuda sees no CUDA device")
        dev = drv.Device(0)
        ctx = dev.make_context()
    except NoGPU:
        raise
    except Exception as e:
        raise NoGPU(f"the CUDA driver did not start: {type(e).__name__}: {e}") from e
    import atexit

    atexit.register(ctx.pop)
    major, minor = dev.compute_capability()
    arch = f"sm_{major}{minor}"

    def compile_(source: str, names: list[str]) -> list[Any]:
        module = SourceModule(source, no_extern_c=True, arch=arch)
        fns = [module.get_function(n) for n in names]
        def read(name: str, n: int) -> np.ndarray:
            return _pycuda_global(drv, module, name, n)

        GLOBALS.update((id(f), read) for f in fns)
        return fns

    def empty(n: int) -> Any:
        return drv.mem_alloc(max(4, 4 * n))

    def to_device(a: np.ndarray) -> Any:
        buf = drv.mem_alloc(max(4, a.nbytes))
        drv.memcpy_htod(buf, np.ascontiguousarray(a, _device_dtype(a)))
        return buf

    def to_host(buf: Any, out: np.ndarray) -> None:
        drv.Context.synchronize()
        drv.memcpy_dtoh(out, buf)

    def launch(fn: Any, blocks: int, threads: int, args: list[Any]) -> None:
        fn(*args, block=(threads, 1, 1), grid=(blocks, 1))

    def time_ms(run: Callable[[], None], warmup: int, reps: int) -> list[float]:
        for _ in range(warmup):
            run()
        drv.Context.synchronize()
        out = []
        for _ in range(reps):
            start, end = drv.Event(), drv.Event()
            start.record()
            run()
            end.record()
            end.synchronize()
            out.append(start.time_till(end))
        return out

    return Runtime("pycuda", dev.name(), arch, compile_, to_device, empty, to_host, launch,
                   time_ms)


def cupy_runtime() -> Runtime:
    try:
        import cupy as cp  # optional: the GPU image's own
    except Exception as e:
        raise NoGPU(f"cupy is not importable: {type(e).__name__}: {e}") from e
    try:
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise NoGPU("cupy sees no CUDA device")
        props = cp.cuda.runtime.getDeviceProperties(0)
    except NoGPU:
        raise
    except Exception as e:
        raise NoGPU(f"the CUDA runtime did not start: {type(e).__name__}: {e}") from e
    arch = f"sm_{props['major']}{props['minor']}"
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])

    def compile_(source: str, names: list[str]) -> list[Any]:
        module = cp.RawModule(code=source, options=(f"--gpu-architecture={arch}",))
        fns = [module.get_function(n) for n in names]
        def read(name: str, n: int) -> np.ndarray:
            return _cupy_global(cp, module, name, n)

        GLOBALS.update((id(f), read) for f in fns)
        return fns

    def time_ms(run: Callable[[], None], warmup: int, reps: int) -> list[float]:
        for _ in range(warmup):
            run()
        cp.cuda.Device().synchronize()
        out = []
        for _ in range(reps):
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            run()
            end.record()
            end.synchronize()
            out.append(cp.cuda.get_elapsed_time(start, end))
        return out

    def to_host(buf: Any, out: np.ndarray) -> None:
        cp.cuda.Device().synchronize()
        out[...] = cp.asnumpy(buf).reshape(out.shape)

    return Runtime(
        "cupy", name, arch, compile_,
        lambda a: cp.asarray(np.ascontiguousarray(a, _device_dtype(a))),
        lambda n: cp.empty(max(1, n), dtype=cp.float32),
        to_host,
        lambda fn, blocks, threads, args: fn((blocks,), (threads,), tuple(args)),
        time_ms)


def pick_runtime(which: str) -> Runtime:
    """pycuda (what the project's CUDA target uses), else CuPy where `which` is auto."""
    if which == "pycuda":
        return pycuda_runtime()
    if which == "cupy":
        return cupy_runtime()
    reasons = []
    for make in (pycuda_runtime, cupy_runtime):
        try:
            return make()
        except NoGPU as e:
            reasons.append(str(e))
    raise NoGPU("; ".join(reasons))


# -- one program on the device ----------------------------------------------------------


@dataclass
class DeviceProgram:
    """A lowered program's CUDA build on the device: buffers allocated once."""

    rt: Runtime
    lowered: Any
    knobs: list[dict[str, Any]]
    source: str = ""
    launches: list[Any] = field(default_factory=list)
    fns: list[Any] = field(default_factory=list)
    bufs: dict[str, Any] = field(default_factory=dict)
    params: list[list[str]] = field(default_factory=list)

    def build(self) -> None:
        from kernelsat.codegen.c import buffer_order
        from kernelsat.codegen.cuda import CUDARenderer, device_nests

        # one nest per launch: a kernel with no rows runs as phases sharing scratch
        nests, scratch = device_nests(self.lowered.nests(self.knobs))
        r = CUDARenderer(self.rt.arch)
        self.source = r.render(self.lowered, nests)
        self.launches = r.launches(nests)
        self.fns = self.rt.compile(self.source, [x.name for x in self.launches])
        self.params = [list(n.params) for n in nests]
        info = self.lowered.buffers
        self.bufs = {b: self.rt.empty(info[b].size) for b in buffer_order(self.lowered)}
        self.bufs.update({b: self.rt.empty(n) for b, n in scratch.items()})

    def upload(self, inputs: dict[str, np.ndarray]) -> None:
        for b in self.lowered.inputs:
            info = self.lowered.buffers[b.name]
            dtype = np.int32 if info.dtype == "i32" else np.float32
            self.bufs[b.name] = self.rt.to_device(
                np.asarray(inputs[b.user_name], dtype).reshape(b.shape))

    def gather_error(self) -> Exception | None:
        """The `GatherIndexError` the last run's flag records (read back and cleared, as
        the CUDA target's executable does), or None; None for a program with no gather."""
        from kernelsat.codegen.c import gather_error

        if "ks_gather_error" not in self.source:
            return None
        return gather_error(self.lowered, GLOBALS[id(self.fns[0])]("ks_gather_error", 5))

    def run(self) -> None:
        for fn, launch, params in zip(self.fns, self.launches, self.params, strict=True):
            self.rt.launch(fn, launch.blocks, launch.threads, [self.bufs[b] for b in params])

    def output(self) -> np.ndarray:
        shape = self.lowered.buffers["out"].shape
        poison = np.full(shape, np.nan, np.float32)
        self.bufs["out"] = self.rt.to_device(poison)
        self.run()
        out = np.empty(shape, np.float32)
        self.rt.to_host(self.bufs["out"], out)
        return out


def variants(lowered: Any) -> list[tuple[str, list[dict[str, Any]]]]:
    """("default", the GPU's defaults: `cuda_defaults`) and, per CUDA-only knob and value,
    the knobs per kernel (on top of those defaults)."""
    from kernelsat.codegen.cuda import CUDA_KNOBS, cuda_defaults

    spaces = [k.knob_space() for k in lowered.kernels]
    base = cuda_defaults(lowered)
    out: list[tuple[str, list[dict[str, Any]]]] = [("default", base)]
    for knob in sorted({k for sp in spaces for k in sp if k in CUDA_KNOBS}):
        values = dict.fromkeys(v for sp in spaces for v in sp.get(knob, ())[1:])
        for value in values:
            per = [{**b, knob: value} if value in sp.get(knob, ()) else dict(b)
                   for b, sp in zip(base, spaces, strict=True)]
            if knob == "cuda.rows" and value == "block":
                per = [{**k, "tpb": 256} if knob in k else k for k in per]
            out.append((f"{knob}={value}", per))
    return out


# -- the two parts ---------------------------------------------------------------------


@dataclass
class Row:
    spec: str
    variant: str
    status: str  # "ok", "FAIL", "skip"
    detail: str = ""
    error: float = math.nan
    ms: float = math.nan


class Clock:
    def __init__(self, budget_s: float):
        self.end = time.monotonic() + budget_s

    def left(self) -> float:
        return self.end - time.monotonic()


def out_of_range(lowered: Any, env: dict[str, Any]) -> tuple[dict[str, Any], str, int, int]:
    """`env` with the last element of the first integer input set to its bound (one past
    the largest valid label): (inputs, that input's name, the flat position, the bound)."""
    from kernelsat.gather import label_bounds

    bounds = label_bounds(lowered.term)
    name = sorted(bounds)[0]
    bad = np.array(env[name], np.int32, copy=True)
    bad.reshape(-1)[-1] = bounds[name]
    return {**env, name: bad}, name, bad.size - 1, bounds[name]


def gather_flag_row(prog: DeviceProgram, spec: str, env: dict[str, Any]) -> Row:
    """Issue 18 part 3b on the device: a label out of range must set the device flag, and
    its read-back must name the input, the position and the bound (`GatherIndexError`,
    what the CUDA target raises); in-range labels afterwards must leave it clear."""
    from kernelsat.gather import GatherIndexError

    bad_env, name, flat, bound = out_of_range(prog.lowered, env)
    prog.upload(bad_env)
    prog.output()
    err = prog.gather_error()
    prog.upload(env)
    prog.output()
    after = prog.gather_error()
    shape = np.asarray(env[name]).shape
    want = tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()
    if not isinstance(err, GatherIndexError):
        why = f"an out-of-range label ({name} = {bound}) raised nothing" if err is None else \
            f"expected GatherIndexError, got {err!r}"
    elif (err.name, err.position, err.value, err.bound) != (name, want, bound, bound):
        why = f"wrong report: {err} (expected {name}{list(want)} = {bound}, bound {bound})"
    elif after is not None:
        why = f"the flag stayed set after in-range labels: {after}"
    else:
        why = ""
    return Row(spec, "gather-flag", "FAIL" if why else "ok", why or str(err))


def check_specs(rt: Runtime, specs: Sequence[Path], clock: Clock, quick: bool) -> list[Row]:
    """Two passes within the budget: every spec at its default knobs, then every spec's
    other CUDA knob values; what the budget leaves out is recorded as skipped."""
    from kernelsat.codegen import lower
    from kernelsat.hardware.measure import check_output
    from kernelsat.inputs import random_inputs
    from kernelsat.interp import evaluate_as
    from kernelsat.spec import load_spec

    rows: list[Row] = []
    ready: list[tuple[str, list[tuple[str, list[dict[str, Any]]]], dict[str, Any], Any]] = []
    for path in specs:
        if clock.left() < 60:
            rows.append(Row(path.stem, "all", "skip", "time budget spent"))
            continue
        try:
            program = load_spec(str(path))
            lowered = lower(program.term, program.out_axes)
            env = random_inputs(program, seed=0)
            ref = evaluate_as(program.term, env, program.out_axes)
        except Exception as e:
            rows.append(Row(path.stem, "all", "FAIL", f"reference: {type(e).__name__}: {e}"))
            continue
        ready.append((path.stem, variants(lowered), {"lowered": lowered, "env": env}, ref))
    passes = [(0, 1)] if quick else [(0, 1), (1, None)]
    for lo, hi in passes:
        for name, vs, data, ref in ready:
            for label, knobs in vs[lo:hi]:
                if clock.left() < 45:
                    rows.append(Row(name, label, "skip", "time budget spent"))
                    continue
                try:
                    prog = DeviceProgram(rt, data["lowered"], knobs)
                    prog.build()
                    prog.upload(data["env"])
                    err, why = check_output(prog.output(), ref, "float32")
                    flag = prog.gather_error()  # in-range labels: the flag must stay clear
                    why = why or (f"gather flag set on in-range labels: {flag}" if flag else "")
                    ms = statistics.median(rt.time_ms(prog.run, 2, 5))
                    rows.append(Row(name, label, "FAIL" if why else "ok", why, err, ms))
                    if label == "default" and "ks_gather_error" in prog.source:
                        rows.append(gather_flag_row(prog, name, data["env"]))
                except Exception as e:
                    detail = traceback.format_exception_only(type(e), e)[-1].strip()
                    rows.append(Row(name, label, "FAIL", detail[:300]))
                print(f"  {name:18s} {label:22s} {rows[-1].status} {rows[-1].detail[:80]}",
                      flush=True)
    return rows


@dataclass
class Timing:
    case: str
    ours_ms: float
    ours_setting: str
    peer: str
    peer_ms: float
    peer_tf32_ms: float
    note: str = ""


def _program_for(name: str, params: dict[str, int], programs: Path | None) -> tuple[Any, str]:
    """(Program, where its term came from): the optimized term `--prepare` saved
    (`<programs>/<name>-<size>.sexpr`) when there is one, else the spec's own term."""
    from kernelsat.sexpr import parse_term
    from kernelsat.spec import load_spec

    program = load_spec(str(ROOT / "specs" / f"{name}.ks"), params)
    tag = "-".join(str(v) for v in params.values())
    saved = programs / f"{name}-{tag}.sexpr" if programs else None
    if saved is not None and saved.exists():
        return program.with_term(parse_term(saved.read_text(), str(saved))), saved.name
    return program, "the spec's term (no optimized program was prepared)"


def time_peers(rt: Runtime, clock: Clock, programs: Path | None, quick: bool) -> list[Timing]:
    """Each case's program at every CUDA knob variant: checked against the float64
    reference (one reference per case), timed where it passed; the best against torch."""
    from kernelsat.codegen import lower
    from kernelsat.hardware.measure import check_output
    from kernelsat.inputs import random_inputs
    from kernelsat.interp import evaluate_as

    try:
        import torch  # optional: the GPU image's own
    except Exception as e:
        return [Timing("all", math.nan, "", "torch", math.nan, math.nan,
                       f"torch not importable: {e}")]
    out: list[Timing] = []
    for name, params in timing_cases(quick):
        label = f"{name} " + " ".join(f"{k}={v}" for k, v in params.items())
        if clock.left() < 40:
            out.append(Timing(label, math.nan, "", "", math.nan, math.nan, "time budget spent"))
            continue
        try:
            program, origin = _program_for(name, params, programs)
            lowered = lower(program.term, program.out_axes)
            env = random_inputs(program, seed=1)
            ref = evaluate_as(program.term, env, program.out_axes)
            best, failed, skipped = (math.inf, ""), [], 0
            for setting, knobs in variants(lowered)[: 1 if quick else None]:
                if clock.left() < 30:
                    skipped += 1
                    continue
                prog = DeviceProgram(rt, lowered, knobs)
                prog.build()
                prog.upload(env)
                _, why = check_output(prog.output(), ref, "float32")
                if why:
                    failed.append(f"{setting}: {why}")
                    continue
                ms = statistics.median(rt.time_ms(prog.run, 3, 20))
                best = min(best, (ms, setting))
            peer, peer_ms, tf32_ms = torch_time(torch, name, env)
            note = f"program: {origin}" + (f"; failed the check: {'; '.join(failed)}"
                                           if failed else "") + \
                (f"; {skipped} variants not run (time budget)" if skipped else "")
            out.append(Timing(label, best[0], best[1], peer, peer_ms, tf32_ms, note))
        except Exception as e:
            detail = traceback.format_exception_only(type(e), e)[-1].strip()
            out.append(Timing(label, math.nan, "", "", math.nan, math.nan, detail[:300]))
        print(f"  {out[-1]}", flush=True)
    return out


def torch_time(torch: Any, name: str, env: dict[str, np.ndarray]) -> tuple[str, float, float]:
    """(peer, ms in float32 without TF32, ms with TF32 allowed) on the same inputs."""
    dev = torch.device("cuda")
    ts = {k: torch.as_tensor(np.asarray(v, np.float32), device=dev) for k, v in env.items()}
    if name == "attention":
        q, k, v = ts["Q"], ts["K"], ts["V"]

        def run() -> Any:
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)
        peer = "torch SDPA"
    else:
        a, b = (ts[n] for n in sorted(ts))

        def run() -> Any:
            return torch.matmul(a, b)
        peer = "torch.matmul (cuBLAS)"

    def median_ms() -> float:
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        times = []
        for _ in range(20):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            run()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        return statistics.median(times)

    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        plain = median_ms()
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        tf32 = median_ms()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old
    return peer, plain, tf32


# -- prepared programs -----------------------------------------------------------------


def timing_cases(quick: bool = False) -> list[tuple[str, dict[str, int]]]:
    """(spec name, size parameters) of the timed cases."""
    cases: list[tuple[str, dict[str, int]]] = [
        ("attention", {"B": 1, "H": 8, "N": n, "D": 64}) for n in ATTENTION_SIZES]
    cases += [("matmul", {"M": n, "N": n, "K": n}) for n in MATMUL_SIZES]
    return [cases[0], cases[len(ATTENTION_SIZES)]] if quick else cases


def prepare_programs(folder: Path, seconds: float = 60.0) -> int:
    """Run `kernelsat optimize -t h200` on each timed case here (no GPU needed: the pick
    is ranked by the H200's cost model and gated through the C rendering) and save the
    picked term as `<folder>/<spec>-<sizes>.sexpr`, which the check then times."""
    import shutil
    import tempfile

    exe = shutil.which("kernelsat") or str(Path(sys.executable).parent / "kernelsat")
    folder.mkdir(parents=True, exist_ok=True)
    failed = 0
    for name, params in timing_cases():
        tag = "-".join(str(v) for v in params.values())
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [exe, "optimize", name, "-t", "h200", "--seconds", str(seconds),
                   "-o", str(Path(tmp) / "o"), *[a for k, v in params.items()
                                                  for a in ("-p", f"{k}={v}")]]
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True,
                                      timeout=seconds * 4)
                why = (proc.stderr or proc.stdout)[-300:] if proc.returncode else ""
            except subprocess.TimeoutExpired:
                why = f"no result within {seconds * 4:.0f} s"
            best = Path(tmp) / "o" / "best.sexpr"
            if why or not best.exists():
                failed += 1
                print(f"optimize {name} {tag} failed (its spec's own term will be timed): "
                      f"{why}", file=sys.stderr)
                continue
            (folder / f"{name}-{tag}.sexpr").write_text(best.read_text())
            print(f"saved {folder / f'{name}-{tag}.sexpr'}")
    return EXIT_FAILED if failed else 0


# -- the results file --------------------------------------------------------------------


def _fmt(x: float, digits: int = 3) -> str:
    return "-" if not math.isfinite(x) else f"{x:.{digits}f}"


def environment(rt: Runtime | None) -> list[str]:
    lines = [f"- date (UTC): {time.strftime('%Y-%m-%d %H:%M', time.gmtime())}",
             f"- host: {platform.node()} ({platform.machine()}), "
             f"Python {platform.python_version()}"]
    if rt is not None:
        lines.append(f"- GPU: {rt.device} ({rt.arch}), runtime {rt.name}")
    for cmd in (["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.sm",
                 "--format=csv,noheader"], ["nvcc", "--version"]):
        try:
            text = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout
            lines.append(f"- `{cmd[0]}`: {text.strip().splitlines()[-1] if text.strip() else '-'}")
        except Exception as e:
            lines.append(f"- `{cmd[0]}`: not available ({type(e).__name__})")
    return lines


def write_results(path: Path, rt: Runtime | None, rows: list[Row], timings: list[Timing],
                  problem: str = "") -> None:
    lines = ["# kernelsat GPU check", "", *environment(rt), ""]
    if problem:
        lines += ["**No GPU check was run:** " + problem, ""]
    if rows:
        ok = sum(r.status == "ok" for r in rows)
        fail = sum(r.status == "FAIL" for r in rows)
        lines += [f"## Correctness: {ok} ok, {fail} failed, "
                  f"{sum(r.status == 'skip' for r in rows)} skipped "
                  "(float32 on the GPU vs the float64 interpreter; the ship gate's check)", "",
                  "| spec | CUDA knobs | result | rel. L2 error | ms (median of 5) | detail |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {r.spec} | {r.variant} | {r.status} | {r.error:.2e} | {_fmt(r.ms)} | "
                  f"{r.detail.replace('|', '/')} |" for r in rows]
        lines.append("")
    if timings:
        lines += ["## Timing against torch (float32; median of 20 CUDA-event timings)", "",
                  "| case | kernelsat ms | best CUDA knobs | peer | peer ms (no TF32) | "
                  "peer/kernelsat | peer ms (TF32) | note |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for t in timings:
            ratio = t.peer_ms / t.ours_ms if t.ours_ms > 0 else math.nan
            lines.append(f"| {t.case} | {_fmt(t.ours_ms)} | {t.ours_setting} | {t.peer} | "
                         f"{_fmt(t.peer_ms)} | {_fmt(ratio, 2)} | {_fmt(t.peer_tf32_ms)} | "
                         f"{t.note.replace('|', '/')} |")
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


# -- main ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    default = Path(os.environ["OUT"]) / "gpu_check.md" if os.environ.get("OUT") else \
        ROOT / "out" / "gpu_check.md"
    p = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=default,
                   help=f"results file (markdown; default {default})")
    p.add_argument("--programs", type=Path, default=ROOT / ".gpu" / "programs",
                   help="optimized terms saved by gpu_check.sh --prepare (optional)")
    p.add_argument("--budget-s", type=float, default=420.0,
                   help="wall-clock budget for both parts (s, > 0; default 420)")
    p.add_argument("--runtime", choices=("auto", "pycuda", "cupy"), default="auto")
    p.add_argument("--quick", action="store_true",
                   help="default knobs only, one attention and one matmul size")
    p.add_argument("--specs", nargs="*", default=None, help="spec names (default: all)")
    p.add_argument("--prepare-programs", type=Path, default=None, metavar="DIR",
                   help="no GPU: save the optimized programs of the timed cases in DIR")
    args = p.parse_args(argv)
    if not args.budget_s > 0:
        p.error(f"--budget-s must be > 0, got {args.budget_s}")
    known = {x.stem for x in (ROOT / "specs").glob("*.ks")}
    for name in args.specs or ():
        if name not in known:
            p.error(f"unknown spec {name!r} (have {', '.join(sorted(known))})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    clock = Clock(args.budget_s)
    import_kernelsat()
    if args.prepare_programs is not None:
        return prepare_programs(args.prepare_programs)
    try:
        rt = pick_runtime(args.runtime)
    except NoGPU as e:
        write_results(args.results, None, [], [], f"no GPU: {e}")
        print(f"gpu_check: no GPU: {e}\nwrote {args.results}", file=sys.stderr)
        return EXIT_NO_GPU
    print(f"gpu_check: {rt.device} ({rt.arch}) via {rt.name}; budget {args.budget_s:.0f} s",
          flush=True)
    specs = sorted((ROOT / "specs").glob("*.ks"))
    if args.specs:
        specs = [s for s in specs if s.stem in args.specs]
    rows = check_specs(rt, specs, Clock(clock.left() * 0.6), args.quick)
    write_results(args.results, rt, rows, [])  # partial results survive a kill
    programs = args.programs if args.programs.is_dir() else None
    timings = time_peers(rt, clock, programs, args.quick)
    write_results(args.results, rt, rows, timings)
    print(f"wrote {args.results}")
    return EXIT_FAILED if any(r.status == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
