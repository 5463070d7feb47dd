"""Targets: frozen descriptions of the machines kernelsat generates code for.

A `Target` is one record: the codegen backend that produces code for the machine
(`backend`: "c", "numpy", "cuda", "hip"), the architecture that code is compiled for
(`arch`: "sm_90", "gfx942", "avx512" ...) and the figures the roofline cost model and
the knob search read (compute units, SIMD width, peak rates, memory bandwidth, on-chip
memories). It is chosen once, by name, and passed down unchanged:

>>> get_target("h100").units
132
>>> get_target("h200").arch
'sm_90'
>>> get_target("cuda").name == DEFAULT_GPU  # "cuda": the default GPU
True
>>> get_target("c").kind
'cpu'
>>> target_names()[:4]
['a100', 'b200', 'c', 'c-x86-64-v2']

A new GPU is one entry in `GPU_TARGETS`: its name, codegen arch flag and cost figures
then follow everywhere (`get_target`, `kernelsat targets`, `optimize(target=...)`).

GPU figures come from the vendors' datasheets and architecture whitepapers (each
figure's source is in a comment beside it); the CPU is detected from
`/proc/cpuinfo` and sysfs, and its memory bandwidth is measured once with a STREAM
triad (`kernelsat.hardware.probe`) and cached, or, when no measurement is at hand,
an assumed figure marked as such (`bandwidth_source == "assumed"`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

from kernelsat.hardware import probe as probe_mod
from kernelsat.hardware.cpu import GIB, KIB, MIB, detect_cpu, simd_arch, simd_bits

Kind = Literal["cpu", "gpu"]

TB = 1e12
TFLOPS = 1e12


@dataclass(frozen=True)
class Target:
    """A machine's capabilities, as data. Rates are per second, sizes in bytes.

    `arch` is the architecture flag codegen compiles for (`nvcc -arch=sm_90` on NVIDIA);
    on a CPU it names the widest SIMD extension (the C backend compiles with
    `-march=native`). `units` are cores (CPU), SMs (NVIDIA) or CUs (AMD). `simd_bits` is the CPU's
    vector register width; on GPUs it is the SIMT group (warp 32 / wavefront 64
    lanes) times 32 bits. `shared_mem_per_unit` is the L1 data cache on a CPU and the
    shared memory / LDS on a GPU; `registers_per_unit` counts 32-bit registers.
    `transcendental_penalty` is the extra cost of one transcendental evaluation,
    in flops, beyond what `kernelsat.ops.FLOPS_PER_ELEMENT` already charges.
    """

    name: str
    kind: Kind
    backend: str  # the codegen backend: "c", "numpy", "cuda", "hip"
    arch: str  # what code is compiled for: "sm_90" (nvcc -arch), "gfx942", "avx512" (CPU SIMD)
    vendor: str
    model: str
    units: int
    simd_bits: int
    frequency_hz: float
    peak_fp32: float
    peak_bf16: float
    mem_bandwidth: float
    bandwidth_source: str  # "datasheet", "measured (triad ...)", "assumed"
    memory_bytes: int
    shared_mem_per_unit: int
    registers_per_unit: int
    l2_bytes: int
    llc_bytes: int
    launch_overhead: float  # seconds per kernel launch
    transcendental_penalty: float
    sources: tuple[str, ...] = ()
    flags_hash: str = ""
    notes: tuple[str, ...] = field(default=())
    peak_source: str = "datasheet"  # CPU: "measured (FMA loop ...)" or "computed (...)"
    compile_flags: tuple[str, ...] = ()
    """The C backend's instruction-set flags for this target (`("-march=x86-64-v2",)`);
    empty: this CPU's own (`kernelsat.codegen.c.NATIVE_ISA_FLAGS`, -march=native)."""

    @property
    def fingerprint(self) -> str:
        """A stable key for the measurement cache: what makes timings comparable.

        For the CPU: model, core count, the hash of the cpuinfo flags and the backend
        (numpy and C timings on one CPU are different measurements), and the compile
        flags when the target names some (code for x86-64-v2 and for this CPU's own ISA
        are different measurements; the native target's fingerprint is as it always
        was, so existing caches stay valid). For a GPU: its name, model and backend.
        Figures that are measured (bandwidth) are left out so that re-probing does not
        invalidate the cache.
        """
        parts = [self.kind, self.vendor, self.model, str(self.units), self.flags_hash,
                 self.backend]
        if self.compile_flags:
            parts.append(" ".join(self.compile_flags))
        return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]

    def describe(self) -> dict[str, object]:
        """The figures as a plain dict (for `kernelsat targets` and reports)."""
        out = asdict(self)
        out["fingerprint"] = self.fingerprint
        return out


# -- GPUs: datasheet figures ----------------------------------------------------

_NVIDIA_LAUNCH = 4e-6  # assumed: a typical measured CUDA kernel launch latency (no datasheet)
_NVIDIA_SFU = 14.0  # CUDA C Programming Guide, throughput table: 16 SFU results/clk/SM vs
# 128 FP32 FMA/clk/SM on sm_80/sm_90, i.e. 8 FMA slots = 16 flops, less the table's ~2 extra

H100 = Target(
    name="h100",
    kind="gpu",
    backend="cuda",
    arch="sm_90",  # CUDA guide: H100 is compute capability 9.0
    vendor="NVIDIA",
    model="H100 SXM5 80GB",
    units=132,  # NVIDIA H100 Tensor Core GPU Architecture whitepaper: 132 SMs on SXM5
    simd_bits=32 * 32,  # warp of 32 lanes
    frequency_hz=1.98e9,  # H100 whitepaper: SXM5 boost clock 1980 MHz (for FP32 67 TF)
    peak_fp32=67 * TFLOPS,  # NVIDIA H100 datasheet: FP32 67 teraFLOPS (SXM)
    peak_bf16=989 * TFLOPS,  # H100 datasheet: BF16 Tensor Core 1979 TF with sparsity -> 989 dense
    mem_bandwidth=3.35 * TB,  # H100 datasheet: GPU memory bandwidth 3.35 TB/s (SXM)
    bandwidth_source="datasheet",
    memory_bytes=80 * GIB,  # H100 datasheet: 80 GB HBM3
    shared_mem_per_unit=228 * KIB,  # H100 whitepaper / CUDA guide cc 9.0: 228 KB smem per SM
    registers_per_unit=65536,  # CUDA guide cc 9.0: 64K 32-bit registers per SM
    l2_bytes=50 * MIB,  # H100 whitepaper: 50 MB L2
    llc_bytes=50 * MIB,
    launch_overhead=_NVIDIA_LAUNCH,
    transcendental_penalty=_NVIDIA_SFU,
    sources=("NVIDIA H100 Tensor Core GPU datasheet", "NVIDIA H100 architecture whitepaper",
             "CUDA C++ Programming Guide, compute capability 9.0"),
)

H200 = replace(
    H100,
    name="h200",
    model="H200 SXM 141GB",
    # same GH100 die (sm_90) and clocks as H100 SXM: 132 SMs, 50 MB L2, 228 KB smem, 64K regs
    peak_fp32=67 * TFLOPS,  # NVIDIA H200 datasheet: FP32 67 TFLOPS (SXM)
    peak_bf16=989 * TFLOPS,  # H200 datasheet: BF16 Tensor Core 1979 TF with sparsity -> 989 dense
    mem_bandwidth=4.8 * TB,  # H200 datasheet: 4.8 TB/s
    memory_bytes=141 * GIB,  # H200 datasheet: 141 GB HBM3e
    sources=("NVIDIA H200 Tensor Core GPU datasheet", "NVIDIA H100 architecture whitepaper"),
)

B200 = Target(
    name="b200",
    kind="gpu",
    backend="cuda",
    arch="sm_100",  # CUDA guide: B200 is compute capability 10.0
    vendor="NVIDIA",
    model="B200 (HGX, 1000 W)",
    units=148,  # not on the datasheet: 148 SMs as reported for B200 (2 dies x 74); uncertain
    simd_bits=32 * 32,
    frequency_hz=1.96e9,  # not on the datasheet; implied by 80 TF / (148 SMs x 128 x 2); uncertain
    peak_fp32=80 * TFLOPS,  # NVIDIA Blackwell datasheet, HGX B200: FP32 80 TFLOPS
    peak_bf16=2250 * TFLOPS,  # HGX B200 datasheet: BF16 4.5 PF with sparsity -> 2.25 PF dense
    mem_bandwidth=8.0 * TB,  # HGX B200 datasheet: up to 8 TB/s per GPU
    bandwidth_source="datasheet",
    memory_bytes=180 * GIB,  # HGX B200 datasheet: 180 GB HBM3e per GPU (usable)
    shared_mem_per_unit=228 * KIB,  # CUDA guide, compute capability 10.0: 228 KB smem per SM
    registers_per_unit=65536,  # CUDA guide, compute capability 10.0: 64K registers per SM
    l2_bytes=126 * MIB,  # not on the datasheet: 126 MB L2 as reported by microbenchmarks; uncertain
    llc_bytes=126 * MIB,
    launch_overhead=_NVIDIA_LAUNCH,
    transcendental_penalty=_NVIDIA_SFU,
    sources=("NVIDIA Blackwell / HGX B200 datasheet",
             "CUDA C++ Programming Guide, compute capability 10.0"),
    notes=("SM count, clock and L2 size are not datasheet figures",),
)

A100 = Target(
    name="a100",
    kind="gpu",
    backend="cuda",
    arch="sm_80",  # CUDA guide: A100 is compute capability 8.0
    vendor="NVIDIA",
    model="A100 SXM4 80GB",
    units=108,  # NVIDIA A100 Tensor Core GPU Architecture whitepaper: 108 SMs
    simd_bits=32 * 32,
    frequency_hz=1.41e9,  # A100 whitepaper: boost clock 1410 MHz
    peak_fp32=19.5 * TFLOPS,  # NVIDIA A100 datasheet: FP32 19.5 TFLOPS
    peak_bf16=312 * TFLOPS,  # A100 datasheet: BF16 Tensor Core 312 TFLOPS (624 with sparsity)
    mem_bandwidth=2.039 * TB,  # A100 datasheet: 80GB SXM, 2,039 GB/s
    bandwidth_source="datasheet",
    memory_bytes=80 * GIB,  # A100 datasheet: 80 GB HBM2e
    shared_mem_per_unit=164 * KIB,  # A100 whitepaper / CUDA guide cc 8.0: up to 164 KB smem per SM
    registers_per_unit=65536,  # CUDA guide cc 8.0: 64K 32-bit registers per SM
    l2_bytes=40 * MIB,  # A100 whitepaper: 40 MB L2
    llc_bytes=40 * MIB,
    launch_overhead=_NVIDIA_LAUNCH,
    transcendental_penalty=_NVIDIA_SFU,
    sources=("NVIDIA A100 Tensor Core GPU datasheet", "NVIDIA A100 architecture whitepaper",
             "CUDA C++ Programming Guide, compute capability 8.0"),
)

MI300X = Target(
    name="mi300x",
    kind="gpu",
    backend="hip",
    arch="gfx942",  # ROCm docs: MI300X is gfx942 (CDNA 3)
    vendor="AMD",
    model="Instinct MI300X",
    units=304,  # AMD Instinct MI300X data sheet: 304 compute units
    simd_bits=64 * 32,  # wavefront of 64 lanes (CDNA 3 ISA)
    frequency_hz=2.1e9,  # MI300X data sheet: peak engine clock 2100 MHz
    peak_fp32=81.7 * TFLOPS,  # MI300X data sheet: peak FP32 vector 81.7 TFLOPs (163.4 matrix)
    peak_bf16=1307.4 * TFLOPS,  # MI300X data sheet: peak BF16 1307.4 TFLOPs dense (2614.9 sparse)
    mem_bandwidth=5.3 * TB,  # MI300X data sheet: 5.3 TB/s peak memory bandwidth
    bandwidth_source="datasheet",
    memory_bytes=192 * GIB,  # MI300X data sheet: 192 GB HBM3
    shared_mem_per_unit=64 * KIB,  # AMD CDNA 3 whitepaper: 64 KB LDS per CU
    registers_per_unit=131072,  # CDNA 3 whitepaper: 512 KB VGPR file per CU = 128K 32-bit regs
    l2_bytes=32 * MIB,  # CDNA 3 whitepaper: 4 MB L2 per XCD x 8 XCDs
    llc_bytes=256 * MIB,  # MI300X data sheet: 256 MB AMD Infinity Cache
    launch_overhead=_NVIDIA_LAUNCH,  # assumed the same order as CUDA launches
    transcendental_penalty=6.0,  # CDNA 3 ISA: transcendentals issue at quarter rate (4 slots)
    sources=("AMD Instinct MI300X data sheet", "AMD CDNA 3 architecture whitepaper",
             "AMD ROCm docs: MI300 microarchitecture"),
)

GPU_TARGETS: dict[str, Target] = {t.name: t for t in (H100, H200, B200, A100, MI300X)}
"""The GPU table, by name: adding a GPU is adding its `Target` here."""

DEFAULT_GPU = "h100"
"""The GPU the backend names "cuda" (and a GPU-less run's cost model) mean."""


# -- the CPU: detected ------------------------------------------------------------

CPU_FMA_UNITS = 2
"""Assumed FMA pipes per core: true of server x86 cores with AVX-512 (Skylake-SP Gold/
Platinum onwards, Zen 4 executes 512-bit FMAs as two 256-bit halves); some parts have
one. Peak FP32 = cores x frequency x (SIMD bits / 32) x FMA units x 2 flops per FMA."""

ASSUMED_BANDWIDTH_PER_CORE = 8e9
"""Assumed memory bandwidth per core (bytes/s) when no triad measurement is cached:
a conservative figure for one server core's share; marked `bandwidth_source="assumed"`."""

CPU_LAUNCH_OVERHEAD = 3e-6  # assumed: a ctypes call plus an OpenMP parallel region
CPU_TRANSCENDENTAL_PENALTY = 12.0  # assumed: a vectorized exp/log is ~20 instructions

def _bf16_flops_per_cycle_per_core(flags: frozenset[str], fp32_per_cycle: float) -> float:
    """Dense BF16 rate per core per cycle: AMX tiles (Intel optimization manual: 1024 BF16
    flops/cycle/core on Sapphire Rapids), else AVX512_BF16 dot products (2x FP32), else FP32."""
    if "amx_bf16" in flags:
        return 1024.0
    if "avx512_bf16" in flags:
        return 2 * fp32_per_cycle
    return fp32_per_cycle


def _flags_hash(flags: frozenset[str]) -> str:
    return hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12]


def cpu_key() -> str:
    """This CPU's key in the measured-figures cache (model, cores, flags)."""
    info = detect_cpu()
    return f"{info.model}|{info.cores}|{_flags_hash(info.flags)}"


def cpu_target(name: str = "cpu", backend: str = "c", *, probe: bool = False,
               cache: str | Path | None = None) -> Target:
    """The detected CPU as a target.

    Bandwidth and FP32 peak: this CPU's cached measurements (`probe.machine_figures`:
    the better of a triad and a read-only stream; the FMA loop's rate); with `probe`,
    measured now (a few seconds) unless the cached ones are settled. Without a
    measurement the bandwidth is an assumed figure (`bandwidth_source == "assumed"`)
    and the peak is computed from /proc/cpuinfo's clock (`peak_source`). A measured
    peak sets `frequency_hz` to the clock it implies (CPU_FMA_UNITS pipes per core).
    """
    info = detect_cpu()
    bits = simd_bits(info.flags)
    hz = info.mhz * 1e6
    fp32_per_cycle = (bits / 32) * CPU_FMA_UNITS * 2
    flags_hash = _flags_hash(info.flags)
    figures = probe_mod.machine_figures(cpu_key(), cache, probe=probe)
    if figures is not None:
        bandwidth = figures.bandwidth
        source = ("measured (STREAM triad and read stream, kernelsat.hardware.probe"
                  + ("" if figures.quiet else "; never on a quiet machine") + ")")
    else:
        bandwidth, source = ASSUMED_BANDWIDTH_PER_CORE * info.cores, "assumed"
    nominal = info.cores * hz * fp32_per_cycle
    measured = figures.peak_fp32 if figures is not None else None
    quiet = figures is not None and figures.quiet
    if measured is not None and (quiet or measured > nominal):
        hz = measured / (info.cores * fp32_per_cycle)  # the clock the cores really run at
        peak_source = "measured (FMA loop, kernelsat.hardware.probe)"
    else:
        peak_source = "computed (/proc/cpuinfo clock)"
    return Target(
        name=name,
        kind="cpu",
        backend=backend,
        arch=simd_arch(info.flags),  # widest SIMD flag; the C backend compiles -march=native
        vendor=info.vendor,
        model=info.model,
        units=info.cores,  # os.sched_getaffinity: the cores this process may use
        simd_bits=bits,  # widest SIMD flag in /proc/cpuinfo
        frequency_hz=hz,  # implied by the measured peak, else cpufreq max / cpuinfo MHz
        peak_fp32=info.cores * hz * fp32_per_cycle,  # measured, or CPU_FMA_UNITS FMA pipes
        peak_bf16=info.cores * hz * _bf16_flops_per_cycle_per_core(info.flags, fp32_per_cycle),
        mem_bandwidth=bandwidth,
        bandwidth_source=source,
        memory_bytes=info.memory_bytes,  # sysconf physical pages
        shared_mem_per_unit=info.l1d_bytes,  # sysfs cache index: L1 data
        registers_per_unit=(32 if bits >= 512 else 16) * (bits // 32),  # vector registers x lanes
        l2_bytes=info.l2_bytes,  # sysfs
        llc_bytes=info.llc_bytes,  # sysfs, highest level
        launch_overhead=CPU_LAUNCH_OVERHEAD,
        transcendental_penalty=CPU_TRANSCENDENTAL_PENALTY,
        sources=("/proc/cpuinfo", "/sys/devices/system/cpu/cpu0/cache"),
        flags_hash=flags_hash,
        peak_source=peak_source,
        notes=(f"peak FP32 {peak_source}: {CPU_FMA_UNITS} FMA units per core at "
               f"{hz / 1e9:.2f} GHz",),
    )


# -- the CPU at a lower instruction-set level: the C target compiled for less -------


@dataclass(frozen=True)
class IsaLevel:
    """An instruction set the C backend compiles for instead of this CPU's own: a
    distinct target (its own fingerprint, build key and figures) on the same machine."""

    march: str  # gcc -march value
    simd_bits: int  # its widest vectors
    fma: bool  # fused multiply-add instructions (2 flops per lane per pipe)
    requires: frozenset[str]  # /proc/cpuinfo flags a CPU needs to run its code
    source: str


ISA_LEVELS: dict[str, IsaLevel] = {
    "c-x86-64-v2": IsaLevel(
        march="x86-64-v2",
        simd_bits=128,  # SSE: 128-bit xmm registers, no AVX
        fma=False,  # FMA arrives with x86-64-v3
        # "pni" is how /proc/cpuinfo spells SSE3
        requires=frozenset({"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3"}),
        source="x86-64 psABI, micro-architecture levels: x86-64-v2 = CMPXCHG16B, LAHF-SAHF, "
               "POPCNT, SSE3, SSE4.1, SSE4.2, SSSE3 (gcc -march=x86-64-v2)"),
}
"""Targets of the C backend at an instruction-set level below this CPU's (by name): the
same machine through code without AVX / AVX-512, e.g. to try a policy or cost model on
an ISA it was not trained on."""


def isa_target(name: str, *, probe: bool = False, cache: str | Path | None = None) -> Target:
    """The detected CPU through C compiled for the instruction set `ISA_LEVELS[name]`:
    its vector width, FP32 peak (no FMA: one flop per lane per pipe) and vector
    registers (16 below AVX-512) are that level's. KeyError when this CPU cannot run
    that code."""
    level = ISA_LEVELS[name]
    missing = level.requires - detect_cpu().flags
    if missing:
        raise KeyError(f"target {name} needs a CPU with {', '.join(sorted(level.requires))}; "
                       f"this one lacks {', '.join(sorted(missing))}")
    native = cpu_target(name, "c", probe=probe, cache=cache)
    lanes = level.simd_bits // 32
    fp32_per_cycle = lanes * CPU_FMA_UNITS * (2 if level.fma else 1)
    peak = native.units * native.frequency_hz * fp32_per_cycle
    return replace(
        native,
        arch=level.march,
        simd_bits=level.simd_bits,
        peak_fp32=peak,
        peak_bf16=peak,  # no BF16 instructions at this level: converted, then FP32
        registers_per_unit=16 * lanes,  # 16 xmm registers x lanes
        compile_flags=(f"-march={level.march}",),
        sources=(*native.sources, level.source),
        peak_source=("computed (this CPU's measured clock)"
                     if native.peak_source.startswith("measured") else native.peak_source),
        notes=(f"peak FP32 assumes {CPU_FMA_UNITS} vector pipes per core"
               f"{' with FMA' if level.fma else ', no FMA'} at "
               f"{native.frequency_hz / 1e9:.2f} GHz",),
    )


CPU_BACKENDS: dict[str, str] = {"cpu": "c", "c": "c", "numpy": "numpy"}
"""CPU target names -> codegen backend. "numpy" runs on the CPU too, through numpy."""

GPU_BACKEND_NAMES: frozenset[str] = frozenset({"cuda"})
"""Backend names accepted as target names, meaning `DEFAULT_GPU`."""


def target_names() -> list[str]:
    """Every name `get_target` accepts, sorted (read from the tables each call, so a GPU
    added to `GPU_TARGETS` is named at once)."""
    return sorted({*CPU_BACKENDS, *ISA_LEVELS, *GPU_BACKEND_NAMES, *GPU_TARGETS})


def get_target(name: str | Target, *, probe: bool = False,
               cache: str | Path | None = None) -> Target:
    """The target called `name` (case-insensitive): "cpu"/"c" (the detected CPU with the C
    backend), "numpy" (the same CPU through numpy), an instruction-set level of
    `ISA_LEVELS` ("c-x86-64-v2": the CPU through C without AVX), a GPU of `GPU_TARGETS`,
    or "cuda" (the default GPU, `DEFAULT_GPU`). A `Target` is returned as it is.

    >>> get_target("A100").peak_fp32 / 1e12
    19.5
    """
    if isinstance(name, Target):
        return name
    key = name.lower()
    if key in GPU_BACKEND_NAMES:
        key = DEFAULT_GPU
    if key in GPU_TARGETS:
        return GPU_TARGETS[key]
    if key in CPU_BACKENDS:
        return cpu_target(key, CPU_BACKENDS[key], probe=probe, cache=cache)
    if key in ISA_LEVELS:
        return isa_target(key, probe=probe, cache=cache)
    raise KeyError(f"unknown target {name!r}; known: {', '.join(target_names())}")


def targets_json(probe: bool = False) -> str:
    """Every target's figures as JSON (CPU first)."""
    rows = [get_target("cpu", probe=probe).describe()]
    rows += [isa_target(name, probe=probe).describe() for name, level in ISA_LEVELS.items()
             if level.requires <= detect_cpu().flags]
    rows += [t.describe() for t in GPU_TARGETS.values()]
    return json.dumps(rows, indent=2, default=list)
