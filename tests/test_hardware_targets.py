"""Targets load by name with sane figures; the CPU is detected."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kernelsat.hardware.cpu import parse_cpuinfo, simd_arch, simd_bits
from kernelsat.hardware.targets import DEFAULT_GPU, GPU_TARGETS, get_target, target_names


@pytest.mark.parametrize("name", target_names())
def test_targets_load_with_sane_figures(name: str) -> None:
    t = get_target(name)
    assert t.units >= 1
    assert 1e9 < t.peak_fp32 < 1e16
    assert t.peak_bf16 >= t.peak_fp32 * 0.99
    assert 1e9 < t.mem_bandwidth < 1e14
    assert t.llc_bytes >= 1 << 20 and t.shared_mem_per_unit >= 16 << 10
    assert t.registers_per_unit > 0 and t.launch_overhead > 0
    assert t.sources and len(t.fingerprint) == 16
    assert t.fingerprint == get_target(name).fingerprint  # stable


def test_gpu_figures_from_datasheets() -> None:
    h100, a100, mi = GPU_TARGETS["h100"], GPU_TARGETS["a100"], GPU_TARGETS["mi300x"]
    assert (h100.units, h100.peak_fp32, h100.mem_bandwidth) == (132, 67e12, 3.35e12)
    assert GPU_TARGETS["h200"].mem_bandwidth > h100.mem_bandwidth
    assert (a100.units, a100.peak_bf16) == (108, 312e12)
    assert mi.units == 304 and mi.backend == "hip"


def test_aliases_and_backends() -> None:
    assert get_target("c").backend == get_target("cpu").backend == "c"
    assert get_target("numpy").backend == "numpy"
    assert get_target("c").fingerprint == get_target("cpu").fingerprint
    assert get_target("numpy").fingerprint != get_target("c").fingerprint
    assert len({get_target(n).fingerprint for n in GPU_TARGETS}) == len(GPU_TARGETS)
    with pytest.raises(KeyError, match="unknown target"):
        get_target("tpu")


def test_cpu_peak_follows_the_stated_formula() -> None:
    t = get_target("cpu")
    assert t.peak_fp32 == pytest.approx(t.units * t.frequency_hz * (t.simd_bits / 32) * 2 * 2)


def test_simd_width_from_flags() -> None:
    assert simd_bits(frozenset({"sse2", "avx", "avx2", "avx512f"})) == 512
    assert simd_bits(frozenset({"sse2", "avx2"})) == 256
    assert simd_bits(frozenset({"asimd"})) == 128
    assert simd_bits(frozenset()) == 64


def test_parse_cpuinfo_counts_processors() -> None:
    text = "processor : 0\nmodel name : M\nflags : avx2\n\nprocessor : 1\nmodel name : M\n"
    assert parse_cpuinfo(text)[4] == 2


def test_bandwidth_is_assumed_without_a_probe(tmp_path) -> None:
    t = get_target("cpu", cache=tmp_path)
    assert t.bandwidth_source == "assumed"


def test_backend_names_mean_their_targets() -> None:
    assert get_target("cuda") is GPU_TARGETS[DEFAULT_GPU]
    assert get_target("h200").arch == "sm_90" and get_target("a100").arch == "sm_80"
    assert get_target("mi300x").arch == "gfx942"
    h200 = get_target("h200")
    assert get_target(h200) is h200  # a record passes through unchanged
    assert set(target_names()) >= {"c", "cpu", "numpy", "cuda", *GPU_TARGETS}


def test_codegen_default_arch_is_the_default_gpus() -> None:
    """Code rendered without a target (tests, golden files) is for the default GPU."""
    from kernelsat.codegen import DEFAULT_ARCH

    assert get_target("cuda").arch == DEFAULT_ARCH


def test_cpu_arch_is_its_widest_simd() -> None:
    assert simd_arch(frozenset({"sse2", "avx", "avx2", "avx512f"})) == "avx512"
    assert simd_arch(frozenset({"asimd"})) == "neon"
    assert get_target("c").arch == get_target("numpy").arch != ""


def test_a_new_gpu_is_one_table_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a GPU to `GPU_TARGETS` is all it takes: its name resolves, the cost model
    reads its figures, and CUDA code is written and compiled for its arch."""
    import kernelsat.codegen.cuda as cuda
    from kernelsat.codegen import build, lower, render
    from kernelsat.hardware.cost import estimate_term
    from kernelsat.ir import In, Sum, exp

    new = replace(GPU_TARGETS["h100"], name="x900", model="X900", arch="sm_120",
                  mem_bandwidth=10 * GPU_TARGETS["h100"].mem_bandwidth)
    monkeypatch.setitem(GPU_TARGETS, "x900", new)
    assert get_target("X900") is new and "x900" in target_names()
    term = Sum("n", exp(In("x", (("i", 64), ("n", 4096)))))
    assert estimate_term(term, new) < estimate_term(term, get_target("h100"))  # its bandwidth
    lowered = lower(term, ("i",))
    assert render(lowered, None, new.backend, arch=new.arch).startswith(
        "// kernelsat CUDA source (sm_120)")
    assert build(lowered, new.backend, arch=new.arch).arch == "sm_120"  # type: ignore[attr-defined]
    seen: list[list[str]] = []

    def fake_run(cmd: list[str], **_: object) -> object:
        seen.append(cmd)
        return type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()

    monkeypatch.setattr(cuda, "find_nvcc", lambda: "nvcc")
    monkeypatch.setattr(cuda.subprocess, "run", fake_run)
    assert cuda.compile_cuda("", new.arch).ok and "-arch=sm_120" in seen[0]


def test_the_commands_read_targets_by_name(tmp_path) -> None:
    """`kernelsat codegen` writes CUDA for a named GPU's arch, `kernelsat targets` shows
    each target's backend and arch, and an unknown or code-less target is refused by
    name with exit 2."""
    from typer.testing import CliRunner

    from kernelsat.cli import app

    program = tmp_path / "p.sexpr"
    program.write_text("(exp (In x i:8))\n")
    runner = CliRunner()
    res = runner.invoke(app, ["codegen", str(program), "--target", "a100"])
    assert res.exit_code == 0 and res.output.startswith("// kernelsat CUDA source (sm_80)")
    res = runner.invoke(app, ["targets"])
    assert res.exit_code == 0 and "sm_90" in res.output and f"cuda = {DEFAULT_GPU}" in res.output
    for bad, message in (("tpu", "unknown target 'tpu'"), ("mi300x", "no hip code")):
        res = runner.invoke(app, ["codegen", str(program), "--target", bad])
        assert res.exit_code == 2 and message in res.output
