"""Targets load by name with sane figures; the CPU is detected."""

from __future__ import annotations

import pytest

from kernelsat.hardware.targets import (
    GPU_TARGETS,
    get_target,
    parse_cpuinfo,
    simd_bits,
    target_names,
)


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
