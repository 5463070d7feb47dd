"""The CPU's measured figures: the FMA loop's peak, the read stream, and their cache
(a bound only rises; a measurement taken while other work ran is taken again)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time

import pytest

from kernelsat.hardware import probe
from kernelsat.hardware.cpu import detect_cpu, simd_bits
from kernelsat.hardware.probe import MachineFigures
from kernelsat.hardware.targets import CPU_FMA_UNITS, cpu_key, get_target


def _nominal() -> float:
    info = detect_cpu()
    return info.cores * info.mhz * 1e6 * simd_bits(info.flags) / 32 * CPU_FMA_UNITS * 2


def test_the_fma_loop_is_vector_fmas_at_a_plausible_rate(tmp_path) -> None:
    """The loop compiles to FMAs on the widest vectors (objdump, where there is one) and
    its rate stays below a few times cores x clock x lanes x 2 pipes x 2 (a dead loop
    would report far more; a VM's cpuinfo clock is the TSC's, so the measured rate may
    exceed the computed one). The lower bound is loose: other tests may share the cores."""
    peak = probe.fma_peak(reps=2, folder=tmp_path)
    if peak is None:
        pytest.skip("no gcc: no FMA probe")
    assert 0.02 * _nominal() < peak < 4 * _nominal()
    libs = list((tmp_path / "probe").glob("triad_*.so"))
    bits = simd_bits(detect_cpu().flags)
    if shutil.which("objdump") and libs and bits >= 256 and "fma" in detect_cpu().flags:
        text = subprocess.run(["objdump", "-d", str(libs[0])], capture_output=True,
                              text=True, check=True).stdout
        register = "zmm" if bits >= 512 else "ymm"
        assert re.search(rf"vfmadd\w*ps\s+%{register}", text)


def test_the_read_stream_measures_a_bandwidth(tmp_path) -> None:
    bw = probe.read_stream(n=1 << 22, reps=2, folder=tmp_path)
    if bw is None:
        pytest.skip("no gcc: no read stream")
    assert 1e8 < bw < 1e13


def _fake(monkeypatch, results: list[MachineFigures]) -> list[int]:
    calls: list[int] = []

    def measure(folder) -> MachineFigures:
        calls.append(1)
        return results[len(calls) - 1]

    monkeypatch.setattr(probe, "_measure_figures", measure)
    return calls


def test_the_cache_keeps_the_best_figures_and_stops_once_quiet(monkeypatch, tmp_path) -> None:
    calls = _fake(monkeypatch, [MachineFigures(2e10, 3e11, False, 1, "c-openmp"),
                                MachineFigures(4e10, 2e11, True, 1, "c-openmp"),
                                MachineFigures(1e12, 1e13, True, 1, "c-openmp")])
    first = probe.machine_figures("k", tmp_path, probe=True)
    assert first == MachineFigures(2e10, 3e11, False, 1, "c-openmp") and not first.settled
    second = probe.machine_figures("k", tmp_path, probe=True)  # not quiet: taken again
    assert (second.bandwidth, second.peak_fp32, second.quiet, second.tries) == (4e10, 3e11,
                                                                              True, 2)
    assert second.settled
    assert probe.machine_figures("k", tmp_path, probe=True) == second  # settled: no third
    assert len(calls) == 2
    assert probe.machine_figures("k", tmp_path) == second  # without probe: the cache only
    assert probe.cached_bandwidth("k", tmp_path) == 4e10


def test_figures_never_quiet_settle_after_the_tries(monkeypatch, tmp_path) -> None:
    busy = MachineFigures(1e10, 1e11, False, 1, "c-openmp")
    calls = _fake(monkeypatch, [busy] * 5)
    for _ in range(5):
        figures = probe.machine_figures("k", tmp_path, probe=True)
    assert len(calls) == probe.PROBE_TRIES and figures.settled and not figures.quiet


def test_an_entry_from_before_the_fma_probe_reads_as_one_busy_try(tmp_path) -> None:
    (tmp_path / "bandwidth.json").write_text(json.dumps(
        {"k": {"bandwidth": 4e10, "engine": "c-openmp", "n": 1, "when": "then"}}))
    assert probe.cached_figures("k", tmp_path) == MachineFigures(4e10, None, False, 1,
                                                                 "c-openmp")


def test_a_probe_that_did_not_get_its_cpu_time_is_not_quiet(monkeypatch, tmp_path) -> None:
    """Sleeping stands in for threads that other work kept off the cores."""
    monkeypatch.setattr(probe, "triad", lambda folder=None: (
        time.sleep(0.05), probe.TriadResult(1e10, 1, 1, "c-openmp"))[1])
    monkeypatch.setattr(probe, "read_stream", lambda folder=None: (time.sleep(0.05), 2e10)[1])
    monkeypatch.setattr(probe, "fma_peak", lambda folder=None: (time.sleep(0.05), 1e11)[1])
    figures = probe._measure_figures(tmp_path)
    assert figures == MachineFigures(2e10, 1e11, False, 1, "c-openmp")


def _cache(tmp_path, peak: float, quiet: bool) -> None:
    (tmp_path / "bandwidth.json").write_text(json.dumps(
        {cpu_key(): {"bandwidth": 5e10, "peak_fp32": peak, "quiet": quiet, "tries": 1,
                     "engine": "c-openmp"}}))


def test_the_cpu_target_takes_a_quiet_measured_peak(tmp_path) -> None:
    """A measured peak replaces the one computed from cpuinfo's clock, and the clock is
    the one it implies; the formula peak = cores x clock x lanes x 2 x 2 still holds."""
    _cache(tmp_path, 3 * _nominal(), True)
    t = get_target("cpu", cache=tmp_path)
    assert t.peak_fp32 == pytest.approx(3 * _nominal())
    assert t.peak_fp32 == pytest.approx(t.units * t.frequency_hz * t.simd_bits / 32 * 2 * 2)
    assert t.peak_source.startswith("measured") and t.mem_bandwidth == 5e10
    assert t.fingerprint == get_target("cpu").fingerprint  # measured figures: not in the key
    v2 = get_target("c-x86-64-v2", cache=tmp_path)
    assert v2.frequency_hz == pytest.approx(t.frequency_hz)


def test_a_busy_measured_peak_only_raises_the_computed_one(tmp_path) -> None:
    _cache(tmp_path, 0.5 * _nominal(), False)
    low = get_target("cpu", cache=tmp_path)
    assert low.peak_fp32 == pytest.approx(_nominal()) and low.peak_source.startswith("computed")
    _cache(tmp_path, 2 * _nominal(), False)
    assert get_target("cpu", cache=tmp_path).peak_fp32 == pytest.approx(2 * _nominal())


def test_targets_probe_measures_and_caches_the_figures(monkeypatch, tmp_path) -> None:
    """`kernelsat targets --probe` measures now and the listing reads the cache."""
    from typer.testing import CliRunner

    from kernelsat.cli import app

    monkeypatch.setenv("KERNELSAT_CACHE_DIR", str(tmp_path))
    calls = _fake(monkeypatch, [MachineFigures(5e10, 3 * _nominal(), True, 1, "c-openmp")])
    res = CliRunner().invoke(app, ["targets", "--probe", "--json"])
    assert res.exit_code == 0, res.output
    cpu = json.loads(res.output)[0]
    assert len(calls) == 1 and cpu["mem_bandwidth"] == 5e10
    assert cpu["peak_fp32"] == pytest.approx(3 * _nominal())
    assert cpu["peak_source"].startswith("measured")
    assert probe.cached_figures(cpu_key(), tmp_path).quiet
