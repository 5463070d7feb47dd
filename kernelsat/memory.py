"""Memory a command needs, estimated from the program before anything is allocated, and
the memory this machine has free.

`run`, `bench` and `optimize` call `refuse_reason` first: a spec whose inputs, output,
stored intermediates or reference evaluation would not fit is refused with the figures
and the parameters to shrink, instead of dying in numpy's allocator (or the kernel's
OOM killer) minutes later.

>>> from kernelsat.spec import parse_spec
>>> p = parse_spec('''
... kernel mm(M=1024, N=1024, K=1024)
... in A[i:M, k:K] f32
... in B[k:K, j:N] f32
... out C[i, j] = sum(k: A[i, k] * B[k, j])
... ''')
>>> e = run_estimate(p, "reference")
>>> e.total < 200 * 2**20  # the product M*N*K is never materialized
True
>>> refuse_reason(e, available=2**40) is None
True
>>> print(refuse_reason(e, available=2**20).splitlines()[0])
`run` needs about 108.00 MiB but 1.00 MiB is available (using at most 80% of it)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from kernelsat.interp import peak_elements
from kernelsat.ir import Term, postorder
from kernelsat.ops import Op
from kernelsat.program import Program

F64, F32 = 8, 4

USABLE_FRACTION = 0.8
"""A command may plan to use at most this share of the available memory (the rest is
for Python, numpy's own buffers and the rest of the machine)."""


@dataclass(frozen=True)
class Estimate:
    """What a command would hold at its peak, part by part, in bytes."""

    command: str
    parts: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(n for _, n in self.parts)


def available_bytes() -> int | None:
    """Memory available to a new allocation now (`MemAvailable` on Linux, else the free
    physical pages); None where neither can be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def _elements(dims: tuple[int, ...]) -> int:
    return math.prod(dims)


def input_elements(program: Program) -> int:
    return sum(_elements(d.dims) for d in program.inputs)


def inputs_bytes(program: Program) -> int:
    """Random inputs in float64 and their float32 copy, plus the two float64 temporaries
    `random_inputs` makes while it fills the largest one."""
    largest = max((_elements(d.dims) for d in program.inputs), default=0)
    return input_elements(program) * (F64 + F32) + 2 * largest * F64


def stored_elements(term: Term) -> int:
    """Elements of every stored intermediate (the generated code's temporary buffers)."""
    return sum(n.size() for n in postorder(term) if n.op is Op.STORE and n is not term)


def kernel_elements(term: Term) -> int:
    """The largest sum of node sizes inside one kernel (between `Store`s): what the numpy
    backend holds while it runs that kernel, every node being a whole array there."""
    best = 0
    for top in [n for n in postorder(term) if n.op is Op.STORE or n is term]:
        seen: set[int] = set()
        total = 0
        stack = [top]
        while stack:
            n = stack.pop()
            if id(n) in seen or (n.op is Op.STORE and n is not top) or not n.args:
                continue
            seen.add(id(n))
            total += n.size()
            stack.extend(n.args)
        best = max(best, total)
    return best


def _program_parts(term: Term, backend: str) -> list[tuple[str, int]]:
    """The memory of running `term` once in float32 with a codegen `backend` ("c",
    "numpy"; "reference": the interpreter), inputs not counted."""
    if backend == "reference":
        return [("float32 interpreter", peak_elements(term) * F32)]
    parts = [("stored intermediates (float32)", stored_elements(term) * F32),
             ("output (float32)", term.size() * F32)]
    if backend == "numpy":
        parts.append(("numpy kernel arrays (float32)", kernel_elements(term) * F32))
    return parts


def bench_estimate(program: Program, backend: str, term: Term | None = None) -> Estimate:
    """`kernelsat bench`: random inputs (float64 and a float32 copy), the float64
    reference it checks against, the float32 run of `term` (default: the spec) on
    `backend`."""
    out = program.term.size()
    parts = [
        ("inputs (float64 and float32)", inputs_bytes(program)),
        ("float64 reference", peak_elements(program.term) * F64 + out * F64),
        *_program_parts(term if term is not None else program.term, backend),
    ]
    return Estimate("bench", tuple(parts))


def run_estimate(program: Program, backend: str, term: Term | None = None) -> Estimate:
    """`kernelsat run`: what `bench` needs, plus the comparison of the two results."""
    base = bench_estimate(program, backend, term)
    return Estimate("run", (*base.parts, ("comparison", 3 * program.term.size() * F64)))


def optimize_estimate(program: Program, backend: str) -> Estimate:
    """`kernelsat optimize`: what `bench` needs, plus the overflow check's scaled inputs
    and its output (candidates run one at a time and are of the same order)."""
    base = bench_estimate(program, backend)
    extra = (("overflow check inputs and output (float32)",
              (input_elements(program) + program.term.size()) * F32),)
    return Estimate("optimize", base.parts + extra)


def human_bytes(n: float) -> str:
    """`1536` -> `'1.50 KiB'`."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} B" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def refuse_reason(estimate: Estimate, available: int | None = None) -> str | None:
    """Why the command should not start (None when it fits): the estimate against
    `USABLE_FRACTION` of the available memory (default: `available_bytes()`; unknown
    memory never refuses)."""
    have = available if available is not None else available_bytes()
    if have is None or estimate.total <= USABLE_FRACTION * have:
        return None
    biggest = sorted(estimate.parts, key=lambda p: -p[1])[:3]
    detail = ", ".join(f"{name} {human_bytes(n)}" for name, n in biggest if n)
    return (f"`{estimate.command}` needs about {human_bytes(estimate.total)} but "
            f"{human_bytes(have)} is available (using at most {USABLE_FRACTION:.0%} of it)\n"
            f"  largest parts: {detail}")
