"""What CPU this is: /proc/cpuinfo and sysfs read into a `CpuInfo` (vendor, model, cores,
frequency, SIMD flags, cache sizes, memory). `kernelsat.hardware.targets` builds the CPU
`Target` from it; the bandwidth probe sizes its arrays by the last-level cache.

>>> info = detect_cpu()
>>> info.cores >= 1 and info.llc_bytes > 0
True
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path

KIB = 1024
MIB = 1024 * KIB
GIB = 1024 * MIB

_SIMD_BY_FLAG: tuple[tuple[str, int, str], ...] = (
    ("avx512f", 512, "avx512"),
    ("avx2", 256, "avx2"),
    ("avx", 256, "avx"),
    ("sse2", 128, "sse2"),
    ("asimd", 128, "neon"),  # aarch64 NEON
)
"""cpuinfo flag -> (vector width in bits, the extension's name), widest first."""


@dataclass(frozen=True)
class CpuInfo:
    """What /proc/cpuinfo and sysfs say about this machine."""

    vendor: str
    model: str
    cores: int
    mhz: float
    flags: frozenset[str]
    l1d_bytes: int
    l2_bytes: int
    llc_bytes: int
    memory_bytes: int


def parse_cpuinfo(text: str) -> tuple[str, str, float, frozenset[str], int]:
    """(vendor, model, MHz, flags, logical processors) from /proc/cpuinfo text.

    >>> text = "processor : 0\\nvendor_id : X\\nmodel name : Y\\ncpu MHz : 2600.0\\nflags : fma\\n"
    >>> parse_cpuinfo(text)
    ('X', 'Y', 2600.0, frozenset({'fma'}), 1)
    """
    fields: dict[str, str] = {}
    count = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "processor":
            count += 1
        fields.setdefault(key, value.strip())
    flags = frozenset((fields.get("flags") or fields.get("Features") or "").split())
    mhz = float(fields.get("cpu MHz", "0") or 0)
    model = fields.get("model name") or fields.get("Model") or fields.get("CPU part") or "unknown"
    return fields.get("vendor_id", "unknown"), model, mhz, flags, max(count, 1)


def simd_arch(flags: frozenset[str]) -> str:
    """The widest SIMD extension the flags announce (the CPU's `Target.arch`).

    >>> simd_arch(frozenset({"sse2", "avx2"}))
    'avx2'
    >>> simd_arch(frozenset())
    'scalar'
    """
    for flag, _bits, arch in _SIMD_BY_FLAG:
        if flag in flags:
            return arch
    return "scalar"


def simd_bits(flags: frozenset[str]) -> int:
    """The widest vector width the flags announce (64 bits: scalar only).

    >>> simd_bits(frozenset({"sse2", "avx2"}))
    256
    """
    for flag, bits, _arch in _SIMD_BY_FLAG:
        if flag in flags:
            return bits
    return 64


def _parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)\s*", text)
    if not m:
        return 0
    return int(m.group(1)) * {"": 1, "K": KIB, "M": MIB, "G": GIB}[m.group(2)]


def read_caches(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict[int, int]:
    """Data/unified cache size per level (bytes) for cpu0, from sysfs."""
    sizes: dict[int, int] = {}
    for index in sorted(root.glob("index*")):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            size = _parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind != "Instruction":
            sizes[level] = max(sizes.get(level, 0), size)
    return sizes


def _frequency_hz(mhz_cpuinfo: float) -> float:
    """The max frequency from cpufreq when exposed (VMs often do not), else cpuinfo's MHz."""
    path = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    try:
        return int(path.read_text()) * 1e3
    except (OSError, ValueError):
        return (mhz_cpuinfo or 2000.0) * 1e6  # 2 GHz assumed when nothing is known


@functools.cache
def detect_cpu() -> CpuInfo:
    """This machine's CPU, from /proc/cpuinfo and sysfs (cached for the process)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    vendor, model, mhz, flags, logical = parse_cpuinfo(text)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else logical
    caches = read_caches()
    llc = caches[max(caches)] if caches else 32 * MIB
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        memory = 0
    return CpuInfo(vendor, model, cores, _frequency_hz(mhz) / 1e6, flags, caches.get(1, 32 * KIB),
                   caches.get(2, MIB), llc, memory)
