"""The C target at a lower instruction-set level (`c-x86-64-v2`): a distinct target whose
compile flags come from the target, with its own fingerprint and build key; code built
for it has no AVX registers and computes what the float64 reference does."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kernelsat import optimize
from kernelsat.codegen import build, lower
from kernelsat.codegen.c import CFLAGS, NATIVE_ISA_FLAGS, c_flags, compile_c
from kernelsat.driver.jobs import job_builder
from kernelsat.hardware.cache import MeasureCache
from kernelsat.hardware.cpu import detect_cpu
from kernelsat.hardware.knobs import (
    VECTOR_WIDTH_KNOBS,
    codegen_knobs,
    default_setting,
    knob_table,
)
from kernelsat.hardware.targets import ISA_LEVELS, get_target, isa_target, target_names
from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as
from kernelsat.spec import parse_spec

V2 = "c-x86-64-v2"

needs_v2 = pytest.mark.skipif(not ISA_LEVELS[V2].requires <= detect_cpu().flags,
                              reason="this CPU cannot run x86-64-v2 code")
needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")
needs_objdump = pytest.mark.skipif(shutil.which("objdump") is None, reason="no objdump")

# a reduction, transcendentals and a division: vectorizable loops of several kinds
SOFTMAX = ("kernel s(M=8, N=64)\nin x[m:M, n:N] f32\n"
           "out y[m, n] = softmax(n: x[m, n]) + sqrt(exp(x[m, n]) + 1)\n")
MATMUL = ("kernel mm(M=32, N=32, K=64)\nin a[m:M, k:K] f32\nin b[k:K, n:N] f32\n"
          "out c[m, n] = sum(k: a[m, k] * b[k, n])\n")
AVX_REGISTER = re.compile(r"%[yz]mm\d+")


def _old_fingerprint(t) -> str:
    """The fingerprint as it was before targets carried compile flags."""
    parts = [t.kind, t.vendor, t.model, str(t.units), t.flags_hash, t.backend]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


@needs_v2
def test_the_isa_target_is_named_distinct_and_stable() -> None:
    assert V2 in target_names()
    v2, c = get_target(V2), get_target("c")
    assert get_target(V2.upper()).fingerprint == v2.fingerprint == isa_target(V2).fingerprint
    assert v2.fingerprint not in {c.fingerprint, get_target("numpy").fingerprint}
    assert v2.backend == "c" and v2.kind == "cpu" and v2.name == V2
    assert v2.compile_flags == ("-march=x86-64-v2",) and c.compile_flags == ()
    assert (v2.simd_bits, v2.registers_per_unit, v2.arch) == (128, 16 * 4, "x86-64-v2")
    # no FMA at this level: one flop per lane per pipe, on the same cores and clock
    assert v2.peak_fp32 == pytest.approx(v2.units * v2.frequency_hz * 4 * 2)
    assert v2.peak_fp32 <= c.peak_fp32 and v2.peak_bf16 == v2.peak_fp32
    # the native target's fingerprint is what it was (existing caches stay valid) ...
    assert c.fingerprint == _old_fingerprint(c)
    # ... and any compile flags make another one
    assert replace(c, compile_flags=("-march=x86-64-v3",)).fingerprint != c.fingerprint
    assert replace(v2, compile_flags=("-march=x86-64-v3",)).fingerprint != v2.fingerprint


def test_a_cpu_without_the_level_is_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernelsat.hardware import targets

    poor = replace(detect_cpu(), flags=frozenset({"sse2"}))
    monkeypatch.setattr(targets, "detect_cpu", lambda: poor)
    with pytest.raises(KeyError, match=r"lacks .*sse4_2"):
        get_target(V2)


def test_compile_flags_name_the_isa_and_key_the_build(tmp_path: Path) -> None:
    assert c_flags() == CFLAGS and NATIVE_ISA_FLAGS[0] in CFLAGS
    v2 = c_flags(("-march=x86-64-v2",))
    assert "-march=x86-64-v2" in v2 and not any(f in v2 for f in NATIVE_ISA_FLAGS)
    assert set(CFLAGS) - set(NATIVE_ISA_FLAGS) <= set(v2)  # the rest is shared
    if shutil.which("gcc") is None:
        return
    source = "float ks_f(float x) { return x * 2.0f; }\n"
    native = compile_c(source, tmp_path)
    lower_isa = compile_c(source, tmp_path, ("-march=x86-64-v2",))
    assert native != lower_isa  # one source, two instruction sets: two libraries
    assert compile_c(source, tmp_path, ("-march=x86-64-v2",)) == lower_isa  # cached


def _vector_registers(lib: Path) -> set[str]:
    text = subprocess.run(["objdump", "-d", str(lib)], capture_output=True, text=True,
                          check=True).stdout
    return {m[:4] for m in AVX_REGISTER.findall(text)}


@needs_v2
@needs_gcc
@needs_objdump
@pytest.mark.parametrize("spec", [SOFTMAX, MATMUL], ids=["softmax", "matmul"])
@pytest.mark.parametrize("knobs", ["codegen defaults", "table defaults", "gemm"])
def test_code_for_x86_64_v2_has_no_avx_registers_and_equals_the_reference(
        tmp_path: Path, spec: str, knobs: str) -> None:
    program = parse_spec(spec, "k")
    lowered = lower(program.term, program.out_axes)
    v2 = get_target(V2)
    table = knob_table(lowered, v2.backend, v2)
    setting = default_setting(table)
    if knobs == "gemm":  # the blocked GEMM at the target's vector width, where there is one
        setting = {k: {**v, **({"gemm": True} if "gemm" in table[k] else {})}
                   for k, v in setting.items()}
    per_kernel = None if knobs == "codegen defaults" else codegen_knobs(lowered, setting)
    exe = job_builder(v2, tmp_path)(lowered, "c", per_kernel)
    assert not _vector_registers(exe.library)
    env64 = random_inputs(program, seed=3)
    expected = evaluate_as(program.term, env64, program.out_axes)
    out = np.empty(expected.shape, np.float32)
    exe({k: v.astype(np.float32) for k, v in env64.items()}, out)
    np.testing.assert_allclose(out, expected, rtol=2e-5, atol=1e-4)
    if {"avx", "avx512f"} & detect_cpu().flags:  # the check can fail: native code has them
        native = build(lowered, "c", per_kernel, tmp_path / "native")
        assert _vector_registers(native.library)


@needs_v2
def test_vector_width_knobs_are_clipped_to_the_target() -> None:
    program = parse_spec(MATMUL, "k")
    lowered = lower(program.term, program.out_axes)
    v2, c = get_target(V2), get_target("c")
    lanes = v2.simd_bits // 32

    def widths(target) -> list[int]:
        return [v for knobs in knob_table(lowered, "c", target).values()
                for k, vals in knobs.items() if k in VECTOR_WIDTH_KNOBS for v in vals]

    assert widths(v2) == [lanes]  # kept although single: codegen's default is wider
    if c.simd_bits > v2.simd_bits:
        assert max(widths(c)) == c.simd_bits // 32 > lanes


@needs_v2
@needs_gcc
def test_optimize_for_the_isa_target_end_to_end(tmp_path: Path) -> None:
    r = optimize(MATMUL, target=V2, seconds=600, trials=2, knob_budget=2, cache_dir=tmp_path,
                 extract="greedy")
    assert r.best.proved and r.target.name == V2
    knobs = r.best.knobs or {}  # a Setting: kernel -> knob -> value
    per_kernel = knobs.values() if isinstance(knobs, dict) else knobs
    widths = [v for k in per_kernel for n, v in dict(k or {}).items() if n in VECTOR_WIDTH_KNOBS]
    assert all(w <= 4 for w in widths)
    with MeasureCache(tmp_path / "measure.sqlite") as cache:  # timed under its fingerprint
        prints = {s.fingerprint for s in cache.samples()}
    assert prints == {get_target(V2).fingerprint}


def _spy_compiles(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """The instruction-set flags of every C compile from here on."""
    import kernelsat.codegen.c as c_module

    seen: list[tuple[str, ...]] = []
    real = c_module.compile_c

    def spy(source, cache_dir=None, isa_flags=()):
        seen.append(tuple(isa_flags))
        return real(source, cache_dir, isa_flags)

    monkeypatch.setattr(c_module, "compile_c", spy)
    return seen


@needs_v2
@needs_gcc
def test_run_and_the_overflow_check_build_for_the_isa_target(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`kernelsat run -t c-x86-64-v2` and the overflow check's own float32 spec build are
    compiled for x86-64-v2, as the candidate is, not for this CPU."""
    from typer.testing import CliRunner

    from kernelsat.cli import app
    from kernelsat.driver import jobs
    from kernelsat.driver.pipeline import Options, job_for

    spec = tmp_path / "s.ks"
    spec.write_text(SOFTMAX)
    monkeypatch.setenv("KERNELSAT_CACHE_DIR", str(tmp_path / "cache"))
    seen = _spy_compiles(monkeypatch)
    res = CliRunner().invoke(app, ["run", str(spec), "-t", V2, "--json"])
    assert res.exit_code == 0, res.output
    assert seen and all(flags == ("-march=x86-64-v2",) for flags in seen)

    program = parse_spec(SOFTMAX, "k")
    job = job_for(program, program.term, Options(target=V2))
    exe = job_builder(get_target(V2), tmp_path / "b")(
        lower(program.term, program.out_axes), "c", None)
    seen.clear()
    jobs._stress.cache_clear()
    assert jobs.overflow_failure(job, exe, tmp_path / "b") == ""
    assert seen == [("-march=x86-64-v2",)]  # the spec's own stress build
