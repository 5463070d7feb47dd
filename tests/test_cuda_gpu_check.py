"""bench/gpu_check.sh and bench/gpu_check.py, as far as a machine without a GPU allows:
the shell script's syntax and help, the Python part's argument errors, its clean "no GPU"
result, the import tree it builds from pyproject.toml, the knob variants it runs, and the
whole correctness pass driven through a fake runtime (plumbing, failure reporting)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = mod
    spec.loader.exec_module(mod)
    return mod


gc = _module()


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
def test_shell_script_syntax_and_help() -> None:
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    proc = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0 and "--prepare" in proc.stdout


@pytest.mark.parametrize("argv, message", [
    (["--budget-s", "0"], "--budget-s must be > 0"),
    (["--budget-s", "nan"], "--budget-s must be > 0"),
    (["--specs", "nosuchspec"], "unknown spec 'nosuchspec'"),
    (["--runtime", "opencl"], "invalid choice"),
])
def test_bad_arguments_exit_2_with_a_message(argv: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        gc.parse_args(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_no_gpu_writes_the_reason_and_exits_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    def no_gpu(which: str) -> Any:
        raise gc.NoGPU("pycuda is not importable: test")

    monkeypatch.setattr(gc, "pick_runtime", no_gpu)
    results = tmp_path / "r" / "gpu.md"
    assert gc.main(["--results", str(results), "--budget-s", "5"]) == gc.EXIT_NO_GPU
    text = results.read_text()
    assert "No GPU check was run:** no GPU: pycuda is not importable: test" in text


def test_no_gpu_here_is_reported_not_waited_on(tmp_path: Path) -> None:
    """The real runtime probe on this machine: no pycuda, no CuPy or no device."""
    try:
        gc.pick_runtime("auto")
    except gc.NoGPU:
        pass
    else:  # pragma: no cover - a machine with a GPU
        pytest.skip("this machine has a usable GPU")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--results",
                           str(tmp_path / "g.md"), "--budget-s", "5"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no GPU" in proc.stderr
    assert "No GPU check was run" in (tmp_path / "g.md").read_text()


def test_import_tree_from_pyproject(tmp_path: Path) -> None:
    """Without an install (-S: no site packages, no editable finder), `kernelsat` and its
    stage packages import from the symlink tree built from pyproject.toml."""
    base = gc.kernelsat_path(ROOT, tmp_path / "ks")
    numpy_parent = str(Path(np.__file__).resolve().parents[1])
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
            "import kernelsat.codegen.cuda as c, kernelsat.hardware.measure, kernelsat.spec; "
            "print(c.__file__)")
    proc = subprocess.run([sys.executable, "-S", "-c", code, str(base), numpy_parent],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().startswith(str(base))


def test_variants_cover_every_cuda_knob_value() -> None:
    from kernelsat.codegen import lower
    from kernelsat.codegen.cuda import GEMM_KNOBS
    from kernelsat.spec import load_spec

    program = load_spec(str(ROOT / "specs" / "matmul.ks"), {"M": 40, "N": 40, "K": 40})
    labels = [label for label, _ in gc.variants(lower(program.term, program.out_axes))]
    assert labels[0] == "default"
    for knob, values in GEMM_KNOBS.items():
        for v in values[1:]:
            assert labels.count(f"{knob}={v}") == 1


class FakeRuntime:
    """Records compiles and launches; its kernels write nothing (outputs stay NaN)."""

    def __init__(self) -> None:
        self.launched: list[tuple[str, int, int, int]] = []

    def make(self) -> Any:
        def compile_(source: str, names: list[str]) -> list[str]:
            assert "__global__" in source
            return names

        def launch(fn: str, blocks: int, threads: int, args: list[Any]) -> None:
            assert blocks >= 1 and 1 <= threads <= 1024
            self.launched.append((fn, blocks, threads, len(args)))

        def to_host(buf: Any, out: np.ndarray) -> None:
            out[...] = np.asarray(buf, np.float32).reshape(out.shape)

        return gc.Runtime("fake", "no device", "sm_90", compile_,
                          lambda a: np.array(a, np.float32),
                          lambda n: np.full(n, np.nan, np.float32), to_host, launch,
                          lambda run, w, r: [run() or 1.0 for _ in range(r)])


def test_correctness_pass_reports_unwritten_outputs(tmp_path: Path) -> None:
    fake = FakeRuntime()
    rt = fake.make()
    rows = gc.check_specs(rt, [ROOT / "specs" / "rowsum.ks"], gc.Clock(600), quick=False)
    labels = {r.variant for r in rows}
    assert "default" in labels  # the kernel's own row mode, and the other two:
    assert len(labels & {"cuda.rows=thread", "cuda.rows=warp", "cuda.rows=block"}) == 2
    assert all(r.status == "FAIL" and "unwritten" in r.detail for r in rows)
    assert fake.launched and all(name == "ks_kernel0" for name, *_ in fake.launched)
    results = tmp_path / "res.md"
    gc.write_results(results, rt, rows, [gc.Timing("matmul M=1024", 2.0, "cuda.bm=128",
                                                   "torch.matmul (cuBLAS)", 1.0, 0.5)])
    text = results.read_text()
    assert f"0 ok, {len(rows)} failed" in text
    assert "| matmul M=1024 | 2.000 | cuda.bm=128 | torch.matmul (cuBLAS) | 1.000 | 0.50 |" in text


def test_budget_spent_skips_instead_of_running() -> None:
    rows = gc.check_specs(FakeRuntime().make(), [ROOT / "specs" / "rowsum.ks"], gc.Clock(1),
                          quick=False)
    assert [r.status for r in rows] == ["skip"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not installed")
def test_shell_script_without_numpy_says_so(tmp_path: Path) -> None:
    """A python3 without numpy on the GPU machine: a results file naming it, exit 2."""
    fake = tmp_path / "python-without-site"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    fake.chmod(0o755)
    results = tmp_path / "out" / "gpu.md"
    proc = subprocess.run(["bash", str(SCRIPT), str(results)], capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHON": str(fake)})
    assert proc.returncode == 2, proc.stderr
    assert "cannot import numpy" in results.read_text()


class FlagRuntime(FakeRuntime):
    """FakeRuntime with a device gather flag: a launch that is passed an int32 buffer
    sets the flag at its first label outside [0, bound) (set, slot, flat position, value,
    bound), as `ks_label` does on the GPU; `sets_flag=False` is a device that never does."""

    def __init__(self, slot: int, bound: int, sets_flag: bool = True) -> None:
        super().__init__()
        self.slot, self.bound, self.sets_flag = slot, bound, sets_flag
        self.flag = np.zeros(5, np.int64)
        self.uploaded: list[np.dtype] = []

    def make(self) -> Any:
        rt = super().make()
        flag = self.flag

        def to_device(a: np.ndarray) -> np.ndarray:
            arr = np.array(a)
            self.uploaded.append(arr.dtype)
            return arr

        def launch(fn: str, blocks: int, threads: int, args: list[Any]) -> None:
            for a in args:
                if self.sets_flag and isinstance(a, np.ndarray) and a.dtype == np.int32:
                    bad = np.flatnonzero((a < 0) | (a >= self.bound))
                    if bad.size and not flag[0]:
                        flag[:] = [1, self.slot, bad[0], a.reshape(-1)[bad[0]], self.bound]

        def compile_(source: str, names: list[str]) -> list[str]:
            def read(name: str, n: int) -> np.ndarray:
                assert name == "ks_gather_error" and n == 5
                out = flag.copy()
                flag[:] = 0
                return out

            gc.GLOBALS.update((id(f), read) for f in names)
            return names

        return gc.Runtime(rt.name, rt.device, rt.arch, compile_, to_device, rt.empty,
                          rt.to_host, launch, rt.time_ms)


@pytest.mark.parametrize("sets_flag", [True, False])
def test_the_gather_flag_is_read_back_and_must_name_the_label(sets_flag: bool) -> None:
    """Issue 18 part 3b on the device: for a spec with a gather, the check uploads the
    labels as int32, sets one label out of range, reads the device flag back, and passes
    only when that gives the `GatherIndexError` naming the input, its position and the
    bound (and in-range labels leave the flag clear); a device that never sets the flag
    fails the row."""
    from kernelsat.codegen import lower
    from kernelsat.spec import load_spec

    spec = ROOT / "specs" / "cross_entropy_labels.ks"
    program = load_spec(str(spec))
    lowered = lower(program.term, program.out_axes)
    slot = list(lowered.input_buffer).index("labels")
    fake = FlagRuntime(slot, program.params["C"], sets_flag)
    rows = gc.check_specs(fake.make(), [spec], gc.Clock(600), quick=True)
    row = next(r for r in rows if r.variant == "gather-flag")
    assert np.dtype(np.int32) in fake.uploaded
    if sets_flag:
        last = program.params["B"] - 1
        assert row.status == "ok", row.detail
        assert f"labels[{last}] = {program.params['C']}" in row.detail
    else:
        assert row.status == "FAIL" and "raised nothing" in row.detail


def test_a_kernel_with_no_rows_launches_its_phases() -> None:
    """Batch norm's one kernel is launched as its phases, each with its own buffers, and
    the scratch they share is allocated beside the program's buffers."""
    from kernelsat.codegen import lower
    from kernelsat.codegen.cuda import device_nests
    from kernelsat.spec import load_spec

    fake = FakeRuntime()
    program = load_spec(str(ROOT / "specs" / "batchnorm.ks"))
    lowered = lower(program.term, program.out_axes)
    knobs = gc.variants(lowered)[0][1]
    dp = gc.DeviceProgram(fake.make(), lowered, knobs)
    dp.build()
    launched, scratch = device_nests(lowered.nests(knobs))
    assert len(launched) > 1 and scratch
    assert [x.name for x in dp.launches] == [n.symbol for n in launched]
    assert set(scratch) <= set(dp.bufs)
    dp.run()
    assert [(name, args) for name, _, _, args in fake.launched] == [
        (n.symbol, len(n.params)) for n in launched]
