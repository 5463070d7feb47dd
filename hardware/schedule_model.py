"""Schedule features and an analytic cost model that sees the schedule.

The roofline model (`kernelsat.hardware.cost`) prices a kernel by its work and its
compulsory traffic only, so every knob setting of a kernel costs the same there. This
model reads the loop nest a setting produces (`Kernel.nest(knobs)`, the
`kernelsat.codegen.loops` IR; a statement with an `expand()` method, such as a blocked
`Gemm`, is read through the plain loops it expands to) and prices what the schedule
changes. Generic over kernels: it sees loops, affine indices and calls, never a spec.

Features of one kernel nest (`nest_features`, `KernelFeatures`):

- work: flops and transcendental calls executed, recomputation included
  (`recompute` = executed / the term's flops counted once per point);
- vectorisation: each innermost loop is vectorised by the compiler when its writes
  move by one element per iteration (reads may be strided: gathers, one load per
  element) and no scalar is carried across its iterations (no `-ffast-math`: a float
  reduction into one scalar stays a serial chain); its lanes are used
  `extent / (ceil(extent / W) * W)` (the tail), W = SIMD floats;
- traffic into each storage level: registers <- L1, L1 <- L2, L2 <- L3, L3 <- DRAM,
  from the footprint of every loop level against the level's capacity (`traffic`);
- register tile: the accumulator floats that stay live across a loop and whether
  they fit the register file (a tile that spills pays L1 traffic every iteration);
- parallelism: the extent of the loop OpenMP splits, the threads it gets, the load
  balance `extent / (ceil(extent / threads) * threads)`, how often a parallel
  region is entered, and the share `p` of the loops' executions that run on those
  threads (`parallel_share`: the top-level loop holding the OpenMP loop and the
  reduction loops split over the threads, knob `psum`; other top-level loops, such as
  per-channel statistics computed before the parallel loop, run on one thread).

The cost (`predict`), one line per term, seconds per kernel, summed over kernels:

    cycles_compute = max(vector_ops / (lane_use * F) + scalar_ops * W / F
                         + chain_ops * LATENCY, latency_cycles)
    S(t)     = 1 / (p / t + (1 - p))          (Amdahl: the unshared part on one thread)
    compute  = cycles_compute / frequency / S(threads * balance)
    l1       = register_bytes / (L1_BYTES_PER_CYCLE * frequency * S(threads))
    l2       = l1_fill_bytes / (L2_BYTES_PER_CYCLE * frequency * S(threads))
    l3       = l2_fill_bytes / (L3_BYTES_PER_CYCLE * frequency * S(threads))
    dram     = dram_bytes / mem_bandwidth * (p / D(threads) + (1 - p) / D(1)),
               D(t) = min(1, DRAM_CORE_SHARE * t / units)
               (dram_bytes: a large output's read-for-ownership added unless it streams)
    seconds  = max(compute, l1, l2, l3, dram) + regions * FORK_SECONDS + launch_overhead

where F is the peak flops per cycle per core (`peak_fp32 / units / frequency`), the
ops are flops plus `transcendental_penalty` per transcendental call plus
`STATEMENT_OPS` per executed store or update (fields `vector_flops`, `scalar_flops`), and
the per-cycle cache
bandwidths are assumptions (constants below, documented where they stand). It ranks
settings; it does not replace measurement.

>>> from kernelsat.codegen.loops import Affine, Assign, Call, Let, Load, Loop, Ref, Write
>>> from kernelsat.hardware.targets import get_target
>>> i, j = Affine.var("i"), Affine.var("j")
>>> rows = Loop("i", 64, (Loop("j", 256, (Write("out", i.scale(256) + j,
...     Call("exp", (Load("x", i.scale(256) + j),))),), "parallel"),), "parallel")
>>> cols = Loop("j", 256, (Loop("i", 64, (Write("out", i.scale(256) + j,
...     Call("exp", (Load("x", i.scale(256) + j),))),), "parallel"),), "parallel")
>>> t = get_target("cpu")
>>> a, b = nest_features((rows,), {}, t), nest_features((cols,), {}, t)
>>> a.vector_fraction, b.vector_fraction
(1.0, 0.0)
>>> predict(a, t) < predict(b, t)
True
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from kernelsat.codegen.combine import parallel_sums, points
from kernelsat.codegen.loops import (
    VARIANT_OF,
    Affine,
    Array,
    Assign,
    Call,
    Expr,
    Let,
    Lit,
    Load,
    Loop,
    Ref,
    Stmt,
    Write,
    walk_calls,
)
from kernelsat.codegen.stream import STREAM_MIN_BYTES
from kernelsat.hardware.cost import kernel_stats_of
from kernelsat.hardware.targets import Target
from kernelsat.ops import BY_NAME
from kernelsat.work import op_work

ITEM = 4
"""Bytes per element (float32: the C backend's dtype)."""

LINE = 64
"""Cache line bytes."""

FILL = 0.75
"""Share of a cache a loop's working set may take and still be reused across its
iterations (associativity, other data, the hardware prefetcher's lines)."""

REGISTER_FILL = 1.0
"""The same for the register file (the compiler allocates it exactly)."""

STATIONARY = 0.5
"""Data a loop does not index (an accumulator tile across a reduction, a row reused
across columns) stays resident when it takes at most this share of a cache."""

REGISTER_SHARE = 0.75
"""The same share of the register file (the rest holds operands): accumulators above
it spill (a 16x32 float tile on AVX-512's 32x16 floats spills, 8x32 does not)."""

L1_BYTES_PER_CYCLE = 128.0
"""Register <- L1 bytes per cycle per core: two vector loads a cycle (64-byte loads on
AVX-512: Intel optimization manual, Skylake-SP L1D peak 2x64 B loads/cycle). With
vector-sized lines at this level, one unit of traffic is one load instruction."""

L2_BYTES_PER_CYCLE = 32.0
"""L1 <- L2 bytes per cycle per core (assumed: half of the 64 B/cycle peak Intel quotes
for Skylake-SP's L2, what streaming kernels sustain)."""

L3_BYTES_PER_CYCLE = 12.0
"""L2 <- L3 bytes per cycle per core (assumed: Skylake-SP's mesh LLC sustains ~10-15)."""

DRAM_CORE_SHARE = 2.0
"""One thread draws at most `DRAM_CORE_SHARE / units` of the memory bandwidth (assumed:
half the cores saturate DRAM)."""

LATENCY = 4.0
"""Cycles per step of a serial dependence chain (FP add/FMA latency on x86 cores)."""

FORK_SECONDS = 2e-6
"""Cost of entering one OpenMP parallel region (fork + barrier on a warm pool; assumed)."""

STATEMENT_OPS = 1.0
"""Instruction slots one executed store or update (`Write`, `Assign`) takes beyond its
flops, so a copy loop still gains from vectors (a `Let` is a register value: none)."""

RENDER_ONLY = frozenset({"tpb"})
"""Knobs no C nest reads (CUDA's threads per block): left out of the nest's memo key."""


# -- the features ----------------------------------------------------------------------


@dataclass(frozen=True)
class KernelFeatures:
    """What the schedule does to one kernel (see the module docstring)."""

    flops: float = 0.0  # executed, recomputation included
    transcendentals: float = 0.0
    recompute: float = 1.0  # executed flops / the term's flops (1.0 when unknown)
    vector_flops: float = 0.0  # ops in vectorised innermost loops (with transcendentals'
    # penalty and `STATEMENT_OPS` per statement: what compute time is charged for)
    lane_use: float = 1.0  # mean useful-lane share of the vectorised work (tails)
    scalar_flops: float = 0.0  # outside vectorised loops, not on a chain
    chain_ops: float = 0.0  # steps of serial loop-carried chains (scalar reductions)
    latency_cycles: float = 0.0  # iterations of loops carrying too few vector accumulators
    # to hide the FMA latency, times LATENCY
    strided_accesses: float = 0.0  # executed accesses with a stride > 1 in their innermost loop
    register_bytes: float = 0.0  # register <- L1 traffic (vector-line units)
    l1_fill_bytes: float = 0.0  # L1 <- L2
    l2_fill_bytes: float = 0.0  # L2 <- L3
    dram_bytes: float = 0.0  # L3 <- DRAM, at least the compulsory traffic
    compulsory_bytes: float = 0.0  # every buffer read once, the output written once
    register_floats: int = 0  # largest accumulator set held across a loop
    spills: bool = False  # that set exceeds the register budget
    parallel_extent: int = 1
    threads: int = 1
    balance: float = 1.0
    parallel_share: float = 1.0  # share of the loops' executions that run on `threads`
    # (the rest, top-level loops outside the OpenMP loop and not split, on one thread)
    regions: float = 0.0  # OpenMP parallel regions entered
    footprints: tuple[float, ...] = field(default=())  # bytes of each level, outermost first
    extents: tuple[int, ...] = field(default=())  # those levels' loop extents (the same path)
    vector_width: int = 1  # W, floats per vector on the target
    # blocked statements (`Gemm`, `FlashAttention`), priced from their fields, per thread:
    native_cycles: float = 0.0  # microkernel cycles on the busiest thread (edge tiles included)
    native_l2_bytes: float = 0.0  # L1 <- L2 traffic per thread (panels re-read, packing)
    native_l3_bytes: float = 0.0  # L2 <- L3 traffic per thread (blocks that miss L2)
    native_dram_bytes: float = 0.0  # operands and partial sums from memory (all threads)
    native_regions: float = 0.0  # parallel regions they enter
    native_spills: bool = False  # a register tile past the vector register file

    @property
    def vector_fraction(self) -> float:
        """Share of the executed flops in vectorised loops."""
        total = self.vector_flops + self.scalar_flops
        return self.vector_flops / total if total else 1.0

    @property
    def intensity(self) -> float:
        """Flops per DRAM byte."""
        return self.flops / self.dram_bytes if self.dram_bytes else math.inf

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (the measurement cache stores this)."""
        out = asdict(self)
        out["footprints"] = list(self.footprints)
        out["extents"] = list(self.extents)
        return out

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> KernelFeatures:
        """Inverse of `as_dict` (unknown keys ignored, missing ones default)."""
        names = {f.name for f in fields(KernelFeatures)}
        kw = {k: v for k, v in data.items() if k in names}
        if "footprints" in kw:
            kw["footprints"] = tuple(float(x) for x in kw["footprints"])
        if "extents" in kw:
            kw["extents"] = tuple(int(x) for x in kw["extents"])
        return KernelFeatures(**kw)


# -- the nest as a tree of accesses ------------------------------------------------------


@dataclass(frozen=True)
class _Access:
    buf: str
    coefs: tuple[tuple[str, int], ...]  # loop variable -> coefficient (nonzero)
    write: bool
    stream: bool = False  # a non-temporal store (knob `nt`): no read-for-ownership

    def coef(self, var: str) -> int:
        return next((c for v, c in self.coefs if v == var), 0)


@dataclass
class _Node:
    """A loop (or the kernel's top level: var "") with its direct accesses and loops."""

    var: str
    extent: int
    kind: str
    direct: list[_Access] = field(default_factory=list)
    loops: list[_Node] = field(default_factory=list)
    stmts: list[Stmt] = field(default_factory=list)  # direct non-loop statements
    _all: list[_Access] | None = None  # memo of all_accesses (the tree is built once)
    _vars: frozenset[str] | None = None  # memo of inner_vars
    _body: frozenset[str] | None = None  # memo of body_vars

    def all_accesses(self) -> list[_Access]:
        if self._all is None:
            self._all = self.direct + [a for c in self.loops for a in c.all_accesses()]
        return self._all

    def body_vars(self) -> frozenset[str]:
        """The variables of the loops inside (one iteration's scope)."""
        if self._body is None:
            self._body = self.inner_vars() - {self.var}
        return self._body

    def inner_vars(self) -> frozenset[str]:
        if self._vars is None:
            out = {self.var} if self.var else set()
            for c in self.loops:
                out |= c.inner_vars()
            self._vars = frozenset(out)
        return self._vars


def _is_native(s: Any) -> bool:
    """A blocked statement the renderer emits natively (a `Gemm`, a `FlashAttention`)."""
    return not isinstance(s, Loop | Let | Array | Assign | Write) and hasattr(s, "expand")


def _flatten(stmts: Iterable[Any]) -> list[Stmt]:
    """The plain statements (blocked ones are priced by `_natives`, not as loops)."""
    return [s for s in stmts if not _is_native(s)]


def _expr_accesses(e: Expr, out: list[_Access]) -> None:
    match e:
        case Load(buf, idx) | Ref(buf, idx) if idx is not None:
            out.append(_Access(buf, idx.terms, False))
        case Call(_, args):
            for a in args:
                _expr_accesses(a, out)
        case _:
            pass


def _stmt_accesses(s: Stmt) -> list[_Access]:
    out: list[_Access] = []
    match s:
        case Let(_, expr, _):
            _expr_accesses(expr, out)
        case Assign(target, expr):
            _expr_accesses(expr, out)
            if target.index is not None:
                out.append(_Access(target.name, target.index.terms, True))
        case Write(buf, idx, expr, stream):
            _expr_accesses(expr, out)
            out.append(_Access(buf, idx.terms, True, stream))
        case _:
            pass
    return out


def _rfo_bytes(root: _Node, ext: _Extents) -> float:
    """Read-for-ownership traffic: a store through the cache reads each line it writes
    first, so a buffer of at least `STREAM_MIN_BYTES` (beyond the private caches; the
    timing protocol starts every run cold) costs its bytes again from DRAM, unless every
    store to it streams (knob `nt`, codegen/stream.py)."""
    scope = root.inner_vars()
    sizes: dict[str, float] = {}
    streamed: dict[str, bool] = {}
    for a in root.all_accesses():
        if a.write:
            elems, _ = _span(a, scope, ext)
            sizes[a.buf] = max(sizes.get(a.buf, 0.0), ITEM * elems)
            streamed[a.buf] = streamed.get(a.buf, True) and a.stream
    return sum(b for buf, b in sizes.items()
               if b >= STREAM_MIN_BYTES and not streamed[buf])


def _tree(body: Iterable[Any], var: str = "", extent: int = 1, kind: str = "") -> _Node:
    node = _Node(var, extent, kind)
    for s in _flatten(body):
        if isinstance(s, Loop):
            node.loops.append(_tree(s.body, s.var, s.extent, s.kind))
        else:
            node.stmts.append(s)
            node.direct.extend(_stmt_accesses(s))
    return node


class _Extents(dict[str, int]):
    """Loop variable -> extent of one nest, with a memo of access spans over scopes."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: dict[tuple[tuple[tuple[str, int], ...], frozenset[str]],
                         tuple[float, int]] = {}


def _extents(node: _Node, out: _Extents | None = None) -> _Extents:
    out = _Extents() if out is None else out
    if node.var:
        out[node.var] = node.extent
    for c in node.loops:
        _extents(c, out)
    return out


# -- footprints and traffic -------------------------------------------------------------


def _span(a: _Access, scope: frozenset[str], ext: _Extents) -> tuple[float, int]:
    """(distinct elements, smallest |stride|) of one access over the loops in `scope`."""
    key = (a.coefs, scope)
    hit = ext.spans.get(key)
    if hit is None:
        hit = ext.spans[key] = _span_of(a, scope, ext)
    return hit


def _span_of(a: _Access, scope: frozenset[str], ext: _Extents) -> tuple[float, int]:
    terms = [(abs(c), ext[v]) for v, c in a.coefs if v in scope and ext.get(v, 1) > 1]
    if not terms:
        return 1.0, 0
    points = math.prod(e for _, e in terms)
    span = 1 + sum(c * (e - 1) for c, e in terms)
    return float(min(points, span)), min(c for c, _ in terms)


def _bytes(a: _Access, scope: frozenset[str], ext: _Extents, line: int) -> float:
    """Bytes of whole lines one access touches over `scope`."""
    elems, stride = _span(a, scope, ext)
    if stride == 0:
        return float(line)
    return max(float(line), elems * min(line, ITEM * stride))


def _footprint(accs: Sequence[_Access], scope: frozenset[str], ext: _Extents, line: int) -> float:
    """Bytes touched by `accs` over `scope`: per buffer, its largest access (the accesses
    of one buffer in one nest overlap: the same rows read by several passes)."""
    per: dict[str, float] = {}
    for a in accs:
        per[a.buf] = max(per.get(a.buf, 0.0), _bytes(a, scope, ext, line))
    return sum(per.values())


def _marginal(a: _Access, scope: frozenset[str], var: str, ext: _Extents, line: int) -> float:
    """New bytes one access brings per iteration of loop `var` (its body over `scope`):
    the rows it touches, each advancing by its stride in `var` (a line shared by
    consecutive iterations is fetched once)."""
    c = abs(a.coef(var))
    if c == 0:
        return 0.0
    elems, _ = _span(a, scope, ext)
    return min(_bytes(a, scope, ext, line), elems * min(line, ITEM * c))


def traffic(node: _Node, capacity: float, line: int, ext: _Extents, fill: float = FILL,
            mult: float = 1.0, skip: frozenset[int] = frozenset(),
            stationary: float = STATIONARY) -> float:
    """Bytes moved into a storage level of `capacity` bytes (lines of `line` bytes) by
    `node` executed `mult` times. A loop whose working set fits is fetched once per
    execution; otherwise data it does not index stays resident when small (`STATIONARY`),
    and when one iteration's working set fits, each iteration brings only its new lines
    (once per buffer and stride: several sweeps of one iteration share them);
    else each inner loop is priced the same way, one level down."""
    accs = [a for a in node.all_accesses() if id(a) not in skip]
    if not accs:
        return 0.0
    scope = node.inner_vars()
    whole = _footprint(accs, scope, ext, line)
    if node.var and whole <= fill * capacity:
        return mult * whole
    body = node.body_vars()
    invariant = [a for a in accs if a.coef(node.var) == 0] if node.var else []
    varying = [a for a in accs if not node.var or a.coef(node.var) != 0]
    inv_bytes = _footprint(invariant, body, ext, line)
    cost = 0.0
    if node.var and _footprint(accs, body, ext, line) <= fill * capacity:
        # reads (or writes) of one buffer with the same strides and extents, the same
        # but for the names of their inner loops, share their new lines (two sweeps
        # over one block of rows fetch it once)
        new: dict[tuple[Any, ...], float] = {}
        for a in varying:
            key = (a.buf, a.write, a.coef(node.var), tuple(sorted(
                (c, ext.get(v, 1)) for v, c in a.coefs if v != node.var)))
            new[key] = max(new.get(key, 0.0), _marginal(a, body, node.var, ext, line))
        per_iter = sum(new.values())
        return mult * (_footprint(varying, body, ext, line) + inv_bytes
                       + (node.extent - 1) * per_iter)
    room = capacity
    if invariant and inv_bytes <= stationary * capacity:
        cost += mult * inv_bytes
        skip = skip | {id(a) for a in invariant}
        room = capacity - inv_bytes
    inner_mult = mult * node.extent
    for a in node.direct:
        if id(a) in skip:
            continue
        c = abs(a.coef(node.var)) if node.var else 0
        cost += (inner_mult * min(line, ITEM * c)) if c else mult * line
    for child in node.loops:
        cost += traffic(child, room, line, ext, fill, inner_mult, skip, stationary)
    return cost


# -- work and vectorisation -------------------------------------------------------------


def _call_work(e: Expr) -> tuple[float, float]:
    flops = trans = 0.0
    for c in walk_calls(e):
        op = BY_NAME.get(VARIANT_OF.get(c.op, c.op))  # a helper call that is no op: one flop
        f, t = op_work(op, 1) if op else (1.0, 0.0)
        flops += f
        trans += t
    return flops, trans


def _stmt_exprs(s: Stmt) -> list[Expr]:
    match s:
        case Let(_, expr, _) | Assign(_, expr) | Write(_, _, expr):
            return [expr]
        case _:
            return []


def _reads(e: Expr, name: str) -> bool:
    match e:
        case Ref(n, _):
            return n == name
        case Call(_, args):
            return any(_reads(a, name) for a in args)
        case _:
            return False


def _carried(s: Stmt, var: str) -> bool:
    """An update of a value that does not move with `var` and reads itself: a chain
    across the iterations of `var` (a scalar reduction)."""
    if not isinstance(s, Assign):
        return False
    idx = s.target.index
    fixed = idx is None or var not in idx.vars
    return fixed and _reads(s.expr, s.target.name)


def _vectorisable_accesses(node: _Node) -> bool:
    """Every write of the loop's body moves by one element per iteration (or not at all,
    an accumulator updated in place); reads may be strided (gathers: each strided
    element then costs a load, in `register_bytes`)."""
    return all(a.coef(node.var) in (0, 1) for a in node.direct if a.write)


@dataclass
class _Work:
    vector_flops: float = 0.0
    lane_weighted: float = 0.0
    scalar_flops: float = 0.0
    chain_ops: float = 0.0
    latency_cycles: float = 0.0
    strided: float = 0.0
    flops: float = 0.0
    trans: float = 0.0


def _updates(node: _Node) -> list[Stmt]:
    out = [st for st in node.stmts if isinstance(st, Assign)]
    for c in node.loops:
        out += _updates(c)
    return out


def _latency(node: _Node, mult: float, width: int, arrays: dict[str, int], w: _Work) -> None:
    """A loop (not innermost) whose body updates accumulator arrays it does not index
    carries them across its iterations: each iteration waits `LATENCY` cycles for its
    updates unless the accumulators fill the FMA pipes (LATENCY x FMA_PORTS vectors)."""
    if not node.var or not node.loops:
        return
    accs = {st.target.name for st in _updates(node) if st.target.index is not None
            and node.var not in st.target.index.vars and st.target.name in arrays
            and _reads(st.expr, st.target.name)}
    if accs:
        vectors = sum(math.ceil(arrays[a] / width) for a in accs)
        if vectors < LATENCY * FMA_PORTS:
            w.latency_cycles += mult * node.extent * LATENCY


def _work(node: _Node, mult: float, width: int, penalty: float, w: _Work,
          arrays: dict[str, int] | None = None) -> None:
    arrays = arrays if arrays is not None else {}
    _latency(node, mult, width, arrays, w)
    inner = mult * node.extent if node.var else mult
    innermost = bool(node.var) and not node.loops
    vectorised = (innermost and node.extent > 1 and _vectorisable_accesses(node)
                  and not any(_carried(s, node.var) for s in node.stmts))
    lanes = node.extent / (math.ceil(node.extent / width) * width) if vectorised else 0.0
    if innermost:
        w.strided += inner * sum(1 for a in node.direct if abs(a.coef(node.var)) > 1)
    for s in node.stmts:
        flops = trans = 0.0
        for e in _stmt_exprs(s):
            f, t = _call_work(e)
            flops, trans = flops + f, trans + t
        w.flops += inner * flops
        w.trans += inner * trans
        stored = 0.0 if isinstance(s, Let) else STATEMENT_OPS  # a Let is a register value
        cost = inner * (flops + trans * penalty + stored)
        if vectorised:
            w.vector_flops += cost
            w.lane_weighted += cost * lanes
        elif node.var and _carried(s, node.var):
            w.chain_ops += inner
            w.scalar_flops += max(cost - inner, 0.0)
        else:
            w.scalar_flops += cost
    for child in node.loops:
        _work(child, inner, width, penalty, w, arrays)


# -- registers and parallelism ----------------------------------------------------------


def _arrays(stmts: Iterable[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in _flatten(stmts):
        if isinstance(s, Array):
            out[s.name] = s.size
        elif isinstance(s, Loop):
            out.update(_arrays(s.body))
    return out


def _register_floats(node: _Node, arrays: dict[str, int]) -> int:
    """The largest set of local-array floats updated inside one loop and declared
    outside it (the accumulators the loop keeps live)."""
    best = 0
    for child in node.loops:
        touched = {a.buf for a in child.all_accesses() if a.write and a.buf in arrays}
        declared_inside = set(_arrays(child.stmts)) | _inner_arrays(child)
        live = sum(arrays[b] for b in touched - declared_inside)
        best = max(best, live, _register_floats(child, arrays))
    return best


def _inner_arrays(node: _Node) -> set[str]:
    out = {s.name for s in node.stmts if isinstance(s, Array)}
    for c in node.loops:
        out |= _inner_arrays(c)
    return out


def _parallel(node: _Node, mult: float = 1.0) -> tuple[int, float]:
    """(extent, times entered) of the first parallel loop with extent > 1 in preorder:
    the one the C renderer gives to OpenMP."""
    for child in node.loops:
        if child.kind == "parallel" and child.extent > 1:
            return child.extent, mult
        got = _parallel(child, mult * child.extent)
        if got[0] > 1:
            return got
    return 1, 0.0


def _parallel_share(body: Sequence[Any], splits: Mapping[int, Any]) -> float:
    """The share of the loops' innermost executions that run on the OpenMP threads: the
    top-level statement holding the first parallel loop (the one the C renderer gives
    to OpenMP) and the reduction loops it splits (`splits`, knob `psum`); every other
    top-level loop runs on the calling thread."""
    stmts = _flatten(body)
    total = points(tuple(stmts))
    if not total:
        return 1.0
    on_threads, found = 0, False
    for s in stmts:
        if id(s) in splits:
            on_threads += points((s,))
        elif not found and isinstance(s, Loop) and _parallel(_tree((s,)))[0] > 1:
            found = True
            on_threads += points((s,))
    return on_threads / total


def _heaviest_path(node: _Node) -> list[_Node]:
    """The loops of the heaviest path (most accesses times extent), outermost first."""
    out: list[_Node] = []
    while node.loops:
        node = max(node.loops, key=lambda c: len(c.all_accesses()) * max(c.extent, 1))
        out.append(node)
    return out


def _level_footprints(node: _Node, ext: _Extents) -> tuple[float, ...]:
    """Bytes touched by one execution of each loop on the heaviest path, outermost first."""
    return tuple(_footprint(n.all_accesses(), n.inner_vars(), ext, LINE)
                 for n in _heaviest_path(node))


# -- blocked statements ----------------------------------------------------------------

FMA_PORTS = 2.0
"""Vector FMAs issued per cycle per core (two FMA units, as `peak_fp32` assumes)."""

LOAD_PORTS = 2.0
"""Vector loads (or broadcasts) issued per cycle per core."""


@dataclass
class _Native:
    cycles: float = 0.0
    l2: float = 0.0
    l3: float = 0.0
    dram: float = 0.0
    regions: float = 0.0
    spills: bool = False
    flops: float = 0.0
    trans: float = 0.0


def _step_cycles(rows: int, vectors: int, registers: int) -> tuple[float, bool]:
    """Cycles of one reduction step of a rows x vectors register tile (rows broadcasts,
    `vectors` loads, rows*vectors FMAs): issue-bound, load-bound or latency-bound (each
    accumulator is a chain), and whether its accumulators spill."""
    fmas = rows * vectors
    spills = fmas + vectors + 1 > registers
    cycles = max(fmas / FMA_PORTS, (rows + vectors) / LOAD_PORTS, LATENCY)
    return cycles + (fmas if spills else 0.0), spills  # a spilled tile stores every step


def _pad(n: int, t: int) -> int:
    return -(-n // max(t, 1)) * max(t, 1)


def _share(extent: int, tile: int, threads: int) -> tuple[int, float]:
    """(threads used, balance) of `extent` cut into per-thread ranges of whole tiles."""
    tiles = -(-extent // max(tile, 1))
    used = max(1, min(threads, tiles))
    per = -(-tiles // used)
    return used, tiles / (per * used)


def _gemm(g: Any, mult: float, outer_threads: int, target: Target, w: _Native) -> None:
    """A BLIS-structured `Gemm` (see codegen/gemm.py): mr x nr microkernel over kc, B
    panels (kc x nr) meant for L1, A blocks (mc x kc) for L2, partial sums in the output
    between kc blocks, each thread packing its own panels."""
    width = vector_floats(target)
    regs = max(1, target.registers_per_unit // width)
    m, n, k, mr, nr = int(g.m), int(g.n), int(g.k), int(g.mr), int(g.nr)
    vw = int(g.vw)
    # instructions of vw lanes (a narrower vector does less per instruction), or of the
    # target's width when vw is wider (the compiler splits it)
    vectors = max(1, nr // min(vw, width))
    step, spills = _step_cycles(mr, vectors, regs)
    tiles = (_pad(m, mr) // mr) * (_pad(n, nr) // nr)
    kc, mc, nc = min(int(g.kc), k), min(_pad(min(int(g.mc), m), mr), _pad(m, mr)), \
        min(_pad(min(int(g.nc), n), nr), _pad(n, nr))
    if g.par in ("m", "n"):
        used, balance = _share(m if g.par == "m" else n, mr if g.par == "m" else nr,
                               target.units)
        w.regions += mult
    else:  # on the calling thread: an enclosing OpenMP loop shares the executions
        used, balance = outer_threads, 1.0
    kblocks, nblocks = -(-k // kc), -(-n // nc)
    # per thread: its share of the tiles, its own packed panels
    share = 1.0 / (used * balance)
    w.cycles += mult * tiles * k * step * share
    b_fits_l1 = kc * nr * ITEM <= FILL * target.shared_mem_per_unit
    a_fits_l2 = mc * kc * ITEM <= FILL * target.l2_bytes
    a_reads = m * k * (_pad(n, nr) // nr) * ITEM  # an A micro-panel per B panel
    b_reads = k * n * (_pad(m, mc) // mc) * ITEM * (1 if b_fits_l1 else _pad(mc, mr) // mr)
    c_traffic = m * n * ITEM * (2 * kblocks - 1)
    pack = (m * k * nblocks + k * n * (used if g.par == "m" else 1)) * 2 * ITEM
    w.l2 += mult * (b_reads + c_traffic + pack + (0 if not a_fits_l2 else a_reads)) * share
    w.l3 += mult * (0 if a_fits_l2 else a_reads) * share
    w.dram += mult * ITEM * (m * k * nblocks + k * n * (used if g.par == "m" else 1) + m * n)
    w.spills = w.spills or spills
    w.flops += mult * 2.0 * m * n * k


def _flash(f: Any, mult: float, outer_threads: int, target: Target, w: _Native) -> None:
    """A `FlashAttention` (see codegen/flash.py): per task (batch position, block of
    `rows` query rows in vector lanes) and key block, a kr x rowvec score tile over d, the
    online-softmax epilogue (one exp per score), an er x rowvec P.V tile over the keys;
    K and V packed per head or per block."""
    sch = f.schedule
    width = vector_floats(target)
    regs = max(1, target.registers_per_unit // width)
    vw, rowvec = int(sch.vw), int(sch.rowvec)
    rows, kr, er = vw * rowvec, int(sch.kr), int(sch.er)
    per_vector = max(1, vw // width)  # instructions per vw-wide vector (narrower: one)
    heads, m, n, d, e = int(f.heads), int(f.m), int(f.n), int(f.d), int(f.e)
    tasks = heads * (_pad(m, rows) // rows)
    used, balance = _share(tasks, 1, target.units if sch.omp else 1)
    share = 1.0 / (used * balance * outer_threads)
    s_step, s_spill = _step_cycles(kr, rowvec * per_vector, regs)
    o_step, o_spill = _step_cycles(er, rowvec * per_vector, regs)
    n_pad, e_pad = _pad(n, kr), _pad(e, er)
    per_task = ((n_pad // kr) * d * s_step + (e_pad // er) * n_pad * o_step
                + n_pad * rowvec * per_vector * (EPILOGUE_OPS + target.transcendental_penalty)
                / (target.peak_fp32 / target.units / target.frequency_hz / width))
    w.cycles += mult * tasks * per_task * share
    kv = n * (d + e) * ITEM
    fits = kv <= FILL * target.l2_bytes
    reads = tasks * kv  # every task reads its head's K and V
    packs = (heads if sch.pack == "head" else tasks) * kv * 2
    w.l2 += mult * (reads + packs) * share
    w.l3 += mult * (0 if fits else reads) * share
    w.dram += mult * ITEM * heads * (m * d + n * (d + e) + m * e)
    w.regions += mult if used > 1 else 0.0
    w.spills = w.spills or s_spill or o_spill
    w.flops += mult * heads * m * n * (2.0 * d + 2.0 * e + EPILOGUE_OPS)
    w.trans += mult * heads * m * n


EPILOGUE_OPS = 6.0
"""Vector ops per score in the online softmax besides its exp (scale, max, subtract,
rescale, sum): an estimate."""


def _natives(stmts: Iterable[Any], mult: float, par_threads: int, first: list[bool],
             target: Target, w: _Native, omp: bool) -> None:
    """Price every blocked statement under `stmts` (executed `mult` times; `par_threads`:
    threads of an enclosing OpenMP loop)."""
    for s in stmts:
        if isinstance(s, Loop):
            threads = par_threads
            if s.kind == "parallel" and s.extent > 1 and first[0]:
                first[0] = False
                threads = min(target.units, s.extent) if omp else 1
            _natives(s.body, mult * s.extent, threads, first, target, w, omp)
        elif _is_native(s) and hasattr(s, "mr"):
            _gemm(s, mult, par_threads, target, w)
        elif _is_native(s) and hasattr(s, "schedule"):
            _flash(s, mult, par_threads, target, w)
        elif _is_native(s):
            got = s.expand()
            _natives(got, mult, par_threads, first, target, w, omp)


# -- entry points -------------------------------------------------------------------------


def vector_floats(target: Target) -> int:
    """W: float32 lanes of the target's vectors."""
    return max(1, target.simd_bits // 32)


def nest_features(body: Sequence[Any], knobs: Mapping[str, Any], target: Target, *,
                  compulsory_bytes: float = 0.0, ideal_flops: float = 0.0) -> KernelFeatures:
    """Features of one kernel's loop nest (its statements) under `knobs` on `target`."""
    root = _tree(body)
    ext = _extents(root)
    width = vector_floats(target)
    w = _Work()
    arrays = _arrays(body)
    _work(root, 1.0, width, target.transcendental_penalty, w, arrays)
    reg_floats = _register_floats(root, arrays)
    reg_budget = target.registers_per_unit
    vector_line = ITEM * width
    omp = bool(knobs.get("omp", True))
    splits = parallel_sums(tuple(body)) if omp and knobs.get("psum", True) else {}
    extent, regions = _parallel(root)
    threads = min(target.units, extent) if omp and extent > 1 else 1
    balance = extent / (math.ceil(extent / threads) * threads) if threads > 1 else 1.0
    if splits:  # split reductions (knob `psum`): one region each, on every thread
        threads = threads if extent > 1 else target.units
        regions += len(splits)
    dram = traffic(root, target.llc_bytes, LINE, ext) if root.all_accesses() else 0.0
    nat = _Native()
    _natives(body, 1.0, 1, [True], target, nat, bool(knobs.get("omp", True)))
    flops = w.flops + nat.flops
    return KernelFeatures(
        flops=flops,
        transcendentals=w.trans + nat.trans,
        recompute=flops / ideal_flops if ideal_flops else 1.0,
        vector_flops=w.vector_flops,
        lane_use=w.lane_weighted / w.vector_flops if w.vector_flops else 1.0,
        scalar_flops=w.scalar_flops,
        chain_ops=w.chain_ops,
        latency_cycles=w.latency_cycles,
        strided_accesses=w.strided,
        register_bytes=traffic(root, reg_budget * ITEM, vector_line, ext, REGISTER_FILL,
                               stationary=REGISTER_SHARE),
        l1_fill_bytes=traffic(root, target.shared_mem_per_unit, LINE, ext),
        l2_fill_bytes=traffic(root, target.l2_bytes, LINE, ext),
        dram_bytes=(dram if nat.flops else max(dram, compulsory_bytes))
        + (_rfo_bytes(root, ext) if root.all_accesses() else 0.0),
        compulsory_bytes=compulsory_bytes,
        register_floats=reg_floats,
        spills=reg_floats > REGISTER_SHARE * reg_budget,
        parallel_extent=extent,
        threads=threads,
        balance=balance,
        parallel_share=_parallel_share(body, splits) if threads > 1 else 1.0,
        regions=regions if threads > 1 else 0.0,
        footprints=_level_footprints(root, ext),
        extents=tuple(n.extent for n in _heaviest_path(root)),
        vector_width=width,
        native_cycles=nat.cycles,
        native_l2_bytes=nat.l2,
        native_l3_bytes=nat.l3,
        native_dram_bytes=nat.dram,
        native_regions=nat.regions,
        native_spills=nat.spills,
    )


def kernel_features(kernel: Any, knobs: Mapping[str, Any] | None, target: Target
                    ) -> KernelFeatures:
    """Features of `kernel` (a codegen `Kernel`) under `knobs` (defaults for missing ones)."""
    return _features_of(kernel, kernel.nest(dict(knobs or {})), target)


def _features_of(kernel: Any, nest: Any, target: Target) -> KernelFeatures:
    bufs = kernel.program.buffers
    compulsory = ITEM * (sum(bufs[b].size for b in nest.params[:-1]) + bufs[kernel.out].size)
    ideal = kernel_stats_of(kernel.term).flops
    return nest_features(nest.body, nest.knobs, target, compulsory_bytes=float(compulsory),
                         ideal_flops=ideal)


def predict(features: KernelFeatures | Sequence[KernelFeatures], target: Target) -> float:
    """Predicted seconds of one kernel (or the sum over kernels run one after another)."""
    if not isinstance(features, KernelFeatures):
        return sum(predict(f, target) for f in features)
    t = cost_terms(features, target)
    return (max(t["compute"], t["l1"], t["l2"], t["l3"], t["dram"]) + t["native"] + t["fork"]
            + t["launch"])


def cost_terms(f: KernelFeatures, target: Target) -> dict[str, float]:
    """The seconds of each term of `predict` for one kernel (the module docstring's
    lines): compute, l1, l2, l3, dram (the loops' bound is their max), native (blocked
    statements), fork (parallel regions) and launch."""
    freq = target.frequency_hz
    per_cycle = target.peak_fp32 / target.units / freq  # F: flops per cycle per core
    width = max(f.vector_width, 1)
    cycles = max(f.vector_flops / (max(f.lane_use, 1e-3) * per_cycle)
                 + f.scalar_flops * width / per_cycle + f.chain_ops * LATENCY,
                 f.latency_cycles)
    share = f.parallel_share

    def speedup(threads: float) -> float:  # Amdahl: the unshared part on one thread
        return 1.0 / (share / threads + (1.0 - share))

    compute = cycles / freq / speedup(f.threads * f.balance)
    l1 = f.register_bytes / (L1_BYTES_PER_CYCLE * freq * speedup(f.threads))
    l2 = f.l1_fill_bytes / (L2_BYTES_PER_CYCLE * freq * speedup(f.threads))
    l3 = f.l2_fill_bytes / (L3_BYTES_PER_CYCLE * freq * speedup(f.threads))
    draw = min(1.0, DRAM_CORE_SHARE * f.threads / target.units)  # of the bandwidth
    alone = min(1.0, DRAM_CORE_SHARE / target.units)  # one thread's share
    dram = f.dram_bytes / target.mem_bandwidth * (share / draw + (1.0 - share) / alone)
    native = max(f.native_cycles / freq,
                 f.native_l2_bytes / (L2_BYTES_PER_CYCLE * freq),
                 f.native_l3_bytes / (L3_BYTES_PER_CYCLE * freq),
                 f.native_dram_bytes / target.mem_bandwidth)
    return {"compute": compute, "l1": l1, "l2": l2, "l3": l3, "dram": dram, "native": native,
            "fork": (f.regions + f.native_regions) * FORK_SECONDS,
            "launch": target.launch_overhead}


class ScheduleModel:
    """Predicted seconds of a lowered program's kernels under knob settings, memoized
    per (kernel, nest-changing knobs). `kernel_seconds(i, knobs)` prices kernel i;
    `identity(i, knobs)` is equal for settings that give the same code (knobs the nest
    does not read: another path's tiles, CUDA-only knobs)."""

    def __init__(self, lowered: Any, target: Target) -> None:
        self.lowered, self.target = lowered, target
        self._memo: dict[tuple[int, str], tuple[str, KernelFeatures]] = {}
        self._by_nest: dict[str, KernelFeatures] = {}

    def _lookup(self, index: int, knobs: Mapping[str, Any]) -> tuple[str, KernelFeatures]:
        nest_knobs = {k: v for k, v in knobs.items() if k not in RENDER_ONLY}
        key = (index, repr(sorted(nest_knobs.items())))
        hit = self._memo.get(key)
        if hit is None:
            kernel = self.lowered.kernels[index]
            nest = kernel.nest(nest_knobs)
            # the renderer reads these from the knobs, not from the nest
            omp, psum = bool(nest.knobs.get("omp", True)), bool(nest.knobs.get("psum", True))
            ident = hashlib.sha256(f"{omp}{psum}{nest.body!r}".encode()).hexdigest()
            feats = self._by_nest.get(ident)
            if feats is None:
                feats = _features_of(kernel, nest, self.target)
                self._by_nest[ident] = feats
            hit = (ident, feats)
            self._memo[key] = hit
        return hit

    def features(self, index: int, knobs: Mapping[str, Any]) -> KernelFeatures:
        """Features of kernel `index` under `knobs` (memoized)."""
        return self._lookup(index, knobs)[1]

    def identity(self, index: int, knobs: Mapping[str, Any]) -> str:
        """Equal for two settings of kernel `index` that render the same code."""
        return self._lookup(index, knobs)[0]

    def kernel_seconds(self, index: int, knobs: Mapping[str, Any]) -> float:
        return predict(self.features(index, knobs), self.target)


__all__ = ["KernelFeatures", "ScheduleModel", "cost_terms", "kernel_features", "nest_features",
           "predict",
           "traffic", "vector_floats"]
_ = (Affine, Lit)  # IR types named in the doctest and the match patterns
