"""Lowering: a term -> kernels (cut at `Store`) -> one loop nest per kernel and schedule.

Each kernel computes one tensor into a buffer. Its loop nest, built by `Kernel.nest`:

- output axes are parallel loops, in the order of the `order` knob; an axis with a tile
  knob t > 1 becomes an outer loop (step t) plus an intra-tile loop placed innermost;
- every node is computed once per scope (CSE by term identity and index environment),
  at the outermost scope where the loop variables of its free axes are bound
  (a row max is computed once per row);
- a reduction whose free axes are bound except for intra-tile variables is placed
  above those loops with a vector accumulator over them: the parts of its operand that
  do not depend on the tile are computed once per reduction step (attention's score
  over d once per key, reused across the whole e vector; a 4x16 register tile for
  `Dot` of two buffers);
- `LSE` and `SoftmaxAvg` are single-pass online updates (running max, one exp per
  element); a `SoftmaxAvg` also yields the `LSE` of its scores, so the split form
  `SoftmaxAvg_o(LSE_i s, SoftmaxAvg_i(s, v))` runs one inner pass per block and an
  outer online update over blocks;
- a reduction whose operand has no inner loop is split into `vec` lanes (`a = a0*W + l`)
  with per-lane accumulators combined at the end, so gcc vectorizes it without
  -ffast-math;
- `Split` is index arithmetic (`a = o*f + i`), also for inputs read with grouped dims.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from kernelsat.codegen import reduce_sched, stream
from kernelsat.codegen.combine import parallel_sums
from kernelsat.codegen.loops import (
    VARIANT_OF,
    Affine,
    Array,
    Assign,
    Call,
    Expr,
    IndexValue,
    Label,
    Let,
    Lit,
    Load,
    Loop,
    Ref,
    Stmt,
    Write,
    stmt_exprs,
    stmt_lines,
    walk_calls,
)
from kernelsat.ir import (
    LSE,
    Const,
    Read,
    Split,
    Store,
    Sum,
    Term,
    div,
    idx_axis,
    input_dims,
    mul,
    postorder,
    read_map,
    split_axes,
    sub,
)
from kernelsat.ops import BINARY, BY_NAME, REDUCTIONS, SHAPE_ONLY, TERNARY, UNARY, Op
from kernelsat.work import ITEMSIZE, KernelStats, op_work

NEG_BIG = -3.4028234663852886e38
"""-FLT_MAX: the running-max initializer of online updates (exp(x - m) stays 0, never NaN)."""

VECTOR_CAP = 4096
"""Largest vector accumulator (floats) a reduction may carry."""

LANE_OPS = frozenset({Op.SUM, Op.RMAX, Op.LSE, Op.DOT})
"""Reductions that may be split into per-lane accumulators."""


class CodegenError(Exception):
    """A construct a lowering or a renderer cannot handle; the message names the node."""


Knobs = Mapping[str, Any]


@dataclass(frozen=True)
class BufferInfo:
    """A buffer: an input (packed dims), an intermediate (`buf<k>`) or the output."""

    name: str
    role: str  # "input" | "temp" | "output"
    shape: tuple[int, ...]
    axes: tuple[str, ...] = ()  # memory order of a temp / output
    user_name: str = ""  # the input's name in the spec (never rendered into code)
    dtype: str = "f32"  # "i32": an integer input (gather labels, issue 18 part 3b)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class KernelNest:
    """One kernel's loop nest under one knob setting."""

    kernel: int
    knobs: Mapping[str, Any]
    body: tuple[Stmt, ...]
    params: tuple[str, ...]  # buffers the kernel reads, then the one it writes
    phase: int | None = None  # one launch of a kernel the GPU runs as several (cuda_phases)

    @property
    def symbol(self) -> str:
        """The rendered function's name."""
        return f"ks_kernel{self.kernel}" + ("" if self.phase is None else f"_{self.phase}")

    def __str__(self) -> str:
        return "\n".join(line for s in self.body for line in stmt_lines(s, 1))


def _strides(sizes: list[int]) -> list[int]:
    out, acc = [], 1
    for s in reversed(sizes):
        out.append(acc)
        acc *= s
    return out[::-1]


def _kernel_nodes(term: Term) -> list[Term]:
    """Nodes of one kernel: postorder, not descending into `Store` (a buffer read)."""
    return live_postorder(term, stop_at_stores=True)


def live_args(node: Term) -> tuple[Term, ...]:
    """The children whose values `node` reads: none for a shape-only op (`zero x`: x is a
    shape witness, never computed, so a kernel of `zero` is a fill that reads nothing)."""
    return () if node.op in SHAPE_ONLY else node.args


def live_postorder(root: Term, stop_at_stores: bool = False) -> list[Term]:
    """`postorder` without the shape witnesses of shape-only ops (what lowering computes);
    with `stop_at_stores`, a `Store` below the root is a leaf (a buffer read)."""
    seen: set[int] = set()
    out: list[Term] = []
    stack: list[tuple[Term, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in seen:
            continue
        if done or (stop_at_stores and node.op is Op.STORE and node is not root):
            seen.add(id(node))
            out.append(node)
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(live_args(node)) if id(c) not in seen)
    return out


def read_env(node: Term, env: Env) -> Env:
    """The index environment of a `Read`'s operand: each of its axes at its affine form
    over the read's own axes (affine reads, issue 18 part 1)."""
    out: Env = {}
    for a, (terms, c0) in read_map(node).forms:
        idx = Affine((), c0)
        for b, c in terms:
            idx = idx + env[b].scale(c)
        out[a] = idx
    return out


def in_axes(node: Term) -> list[tuple[str, int]]:
    """The (axis, size) pairs an `In` node binds, flattened over its dim groups."""
    dims = cast(tuple[tuple[tuple[str, int], ...], ...], node.attrs[1])
    return [(a, s) for dim in dims for a, s in dim]


def _operand_shape(node: Term) -> dict[str, int]:
    out: dict[str, int] = {}
    for c in node.args:
        out.update(c.shape)
    return out


def _operand_nodes(node: Term) -> list[Term]:
    """Nodes of a node's operands within its kernel (a `Store` is a leaf)."""
    out: dict[int, Term] = {}
    stack = list(node.args)
    while stack:
        t = stack.pop()
        if id(t) in out:
            continue
        out[id(t)] = t
        if t.op is not Op.STORE:
            stack.extend(live_args(t))
    return list(out.values())


def _dot_operands(r: Term) -> tuple[Term, Term] | None:
    """The two buffer reads of a dot product: `Dot a x y`, or `Sum a (mul x y)`."""
    if r.op is Op.DOT:
        x, y = r.args
    elif r.op is Op.SUM and r.args[0].op is Op.MUL:
        x, y = r.args[0].args
    else:
        return None
    return (x, y) if _is_load(x) and _is_load(y) else None


def _below(m: Term, x: Term) -> bool:
    """`x <= m` at every index as the C code computes them, or one of them NaN: `m` is
    `x` or a max / log-sum-exp over a term that `x` is below. Stricter than
    `floatsafe._dominates` (which also takes an elementwise max): C's `max` returns its
    other operand for a NaN one, so an elementwise max can fall below `x`."""
    while m.op is Op.STORE:
        m = m.args[0]
    while x.op is Op.STORE:
        x = x.args[0]
    return m is x or (m.op in (Op.RMAX, Op.LSE) and _below(m.args[0], x))


def nonpositive(t: Term) -> bool:
    """`t` is at most 0 (or NaN) at every index, by its structure: `x - m` with `m` a max
    or log-sum-exp over `x` (the max-subtracted forms of softmax and log-sum-exp), or
    `-|y|`. Its exp is lowered to `exp_nonpos` (`loops.VARIANT_OF`): no overflow
    branch, one exponent factor (logsumexp 4096x4096 measured 1.40x faster).

    >>> from kernelsat.ir import In, Max, abs_, neg, sub
    >>> x = In("x", (("i", 4), ("n", 8)))
    >>> nonpositive(sub(x, Max("n", x))), nonpositive(neg(abs_(x)))
    (True, True)
    >>> nonpositive(sub(Max("n", x), x))
    False
    """
    if t.op is Op.SUB:
        return _below(t.args[1], t.args[0])
    return t.op is Op.NEG and t.args[0].op is Op.ABS


def _is_load(t: Term) -> bool:
    while t.op is Op.SPLIT:
        t = t.args[0]
    return t.op in (Op.IN, Op.STORE)


class Schedule(Protocol):
    """A specialised lowering that some kernels take instead of the generic loop nest (the
    blocked GEMM of codegen/gemm.py, the fused attention of codegen/flash.py), or knobs
    one renderer adds (codegen/cuda.py). `knobs` returns the knobs it adds to a kernel's
    space (given the space so far; empty where it does not apply); `nest` returns the
    kernel's nest when the resolved knobs select it, else None."""

    rank: int  # registration order: lower ranks add their knobs and are asked first

    def knobs(self, kernel: Kernel, space: Mapping[str, tuple[Any, ...]]
              ) -> dict[str, tuple[Any, ...]]: ...

    def nest(self, kernel: Kernel, knobs: Mapping[str, Any]) -> KernelNest | None: ...


SCHEDULES: list[Schedule] = []
"""The registered schedules, by rank. Each module registers its own when it is imported,
and `kernelsat.codegen` imports them all, so they are registered before any kernel is
lowered (importing any codegen module runs the package's `__init__` first)."""


def register_schedule(schedule: Schedule) -> None:
    """Add `schedule` to `SCHEDULES` (once), keeping rank order."""
    if schedule not in SCHEDULES:
        SCHEDULES.append(schedule)
        SCHEDULES.sort(key=lambda s: s.rank)


@dataclass
class Kernel:
    """One kernel: computes `term` (its value, any `Store` inside is a buffer read) into
    buffer `out` laid out as `out_axes`."""

    index: int
    term: Term
    out: str
    out_axes: tuple[str, ...]
    program: LoweredProgram = field(repr=False)
    _streams: bool | None = field(default=None, init=False, repr=False, compare=False)
    _generic: tuple[Stmt, ...] | None = field(default=None, init=False, repr=False,
                                              compare=False)
    # computed once per kernel: a knob search lowers one kernel at hundreds of settings
    _space: dict[str, tuple[Any, ...]] | None = field(default=None, init=False,
                                                      repr=False, compare=False)
    _keep: dict[int, tuple[Term, list[Term]]] | None = field(default=None, init=False,
                                                             repr=False, compare=False)
    _reduces: dict[int, tuple[Term, bool]] = field(default_factory=dict, init=False, repr=False,
                                      compare=False)
    _welford: list[tuple[Term, Term, Term, Term | None]] | None = field(
        default=None, init=False, repr=False, compare=False)

    # -- knobs ------------------------------------------------------------------
    def _defaults(self) -> tuple[tuple[str, ...], dict[str, int]]:
        nodes = _kernel_nodes(self.term)
        shape = self.term.shape
        tiles = {a: 1 for a in self.out_axes}
        inner = ""  # the register tile's vectorized axis: last in the loop order
        for r in nodes:
            if r.op is Op.SOFTMAXAVG:
                for a in set(r.shape) - set(r.args[0].shape):
                    if a in tiles and shape[a] <= 256:
                        tiles[a] = shape[a]
        for r in nodes:
            pair = _dot_operands(r)
            if pair is None or not set(r.shape) <= set(shape):
                continue
            xs, ys = set(pair[0].shape), set(pair[1].shape)
            pos = self.out_axes.index
            ii = sorted((a for a in xs - ys if a in tiles), key=pos)
            jj = sorted((a for a in ys - xs if a in tiles), key=pos)
            if ii and jj:
                i, j = ii[-1], jj[-1]
                if pos(i) > pos(j):
                    i, j = j, i
                # the vectorized (innermost) axis should be stride 1 in its read
                lasts = {self.last_axis(t) for t in pair}
                if i in lasts and j not in lasts:
                    i, j = j, i
                # reduction axis contiguous in both reads (A B^T): 4x4 dots with lanes
                # over the reduction; else (A B) an 8x32 tile vectorized over j (16 zmm
                # accumulators: matmul 1024^3 129 -> 46 ms, bmm 64 -> 8.4 ms vs 4x16)
                if all(self.last_axis(t) == r.axis for t in pair):
                    tiles[i] = next(t for t in (4, 2, 1) if shape[i] % t == 0)
                    tiles[j] = next(t for t in (4, 8, 4, 1) if shape[j] % t == 0)
                else:
                    tiles[i] = next(t for t in (8, 4, 2, 1) if shape[i] % t == 0)
                    tiles[j] = next(t for t in (32, 16, 8, 4, 1) if shape[j] % t == 0)
                inner = j
            break
        count = {a: sum(1 for r in nodes if r.op in REDUCTIONS and a in r.shape) for a in shape}
        transposed = reduce_sched.transposed_tiles(self, nodes, tiles)
        order = tuple(
            sorted(self.out_axes, key=lambda a: (tiles[a] > 1 and a not in transposed,
                                                 a == inner, -count[a], self.out_axes.index(a)))
        )
        return order, tiles

    def _default_lanes(self) -> int:
        """Lanes such that each lane still sums >= 8 elements of the shortest lane-split
        reduction (a 64-long dot per key: 8 lanes, measured 1.3x faster than 16 in fused
        attention); 16 for a register-tiled dot (4x4x16 accumulators: 1.7x faster than 8)."""
        sizes = [_operand_shape(r)[r.axis] for r in _kernel_nodes(self.term)
                 if r.op in LANE_OPS]
        if not sizes or any(_dot_operands(r) for r in _kernel_nodes(self.term)
                            if r.op in REDUCTIONS and set(r.shape) <= set(self.term.shape)):
            return 16  # a register-tiled dot: 16 lanes x 4x4 dots fill the registers
        return next((w for w in (16, 8, 4) if min(sizes) >= 8 * w), 1)

    def last_axis(self, t: Term) -> str:
        """The stride-1 axis of a buffer read (through `Split`: the split axis)."""
        while t.op is Op.SPLIT:
            t = t.args[0]
        if t.op is Op.IN:
            return in_axes(t)[-1][0]
        return self.program.buffers[self.program.store_buffer[t]].axes[-1]

    def knob_space(self) -> dict[str, tuple[Any, ...]]:
        """Legal values of each schedule knob, the default first. None changes semantics:
        `order` (loop order of the output axes), `tile.<axis>` (intra-tile extent),
        `vec` (reduction lanes), `omp` (OpenMP threads, C), `psum` (C: a reduction loop
        outside the OpenMP loop split over the threads, `codegen/combine.py`; offered where
        the default nest has one), `welford` (the block length of a one-pass sum of
        squared deviations, 0: two passes; `reduce_sched.welford_space`), `tpb` (threads
        per block, CUDA). Computed once (every
        schedule registers itself on import, before any kernel is lowered); a copy."""
        if self._space is None:
            self._space = self._knob_space()
        return dict(self._space)

    def _knob_space(self) -> dict[str, tuple[Any, ...]]:
        order, tiles = self._defaults()
        axes = self.out_axes
        orders = [order]
        perms = itertools.permutations(axes) if len(axes) <= 3 else iter([axes, axes[::-1]])
        orders += [p for p in perms if p != order]
        space: dict[str, tuple[Any, ...]] = {"order": tuple(orders)}
        for a in axes:
            n = self.term.shape[a]
            cands = [d for d in (1, 2, 4, 8, 16, 32, 64) if n % d == 0]
            if n <= 256:
                cands.append(n)
            space[f"tile.{a}"] = tuple(dict.fromkeys([tiles[a], *cands]))
        space["vec"] = tuple(dict.fromkeys([self._default_lanes(), 16, 8, 4, 1]))
        space["stage"] = (True, False)
        space.update(reduce_sched.keep_space(self))
        space.update(reduce_sched.welford_space(self, tiles))
        space["omp"] = (True, False)
        space["tpb"] = (128, 64, 256, 512)
        if self.streams(space):  # non-temporal stores (codegen/stream.py), default off
            space["nt"] = (False, True)
        if parallel_sums(self._generic_body(space)):  # C: split reductions (codegen/combine.py)
            space["psum"] = (True, False)
        for schedule in SCHEDULES:  # a blocked GEMM, the fused attention, CUDA's knobs
            space.update(schedule.knobs(self, space))
        return space

    def streams(self, space: Mapping[str, tuple[Any, ...]]) -> bool:
        """Whether knob `nt` applies: the output is at least `stream.STREAM_MIN_BYTES`
        and the generic nest at the default knobs (`space`'s first values) has a loop
        that can stream its store (`stream.mark_streams`; computed once)."""
        out = self.program.buffers[self.out]
        if 4 * out.size < stream.STREAM_MIN_BYTES:  # float32 buffers
            return False
        if self._streams is None:
            self._streams = stream.has_streams(stream.mark_streams(self._generic_body(space)))
        return self._streams

    def _generic_body(self, space: Mapping[str, tuple[Any, ...]]) -> tuple[Stmt, ...]:
        """The generic nest's statements at the default knobs (`space`'s first values),
        built once: what knobs `nt` and `psum` are offered from."""
        if self._generic is None:
            self._generic = _Builder(self, {k: v[0] for k, v in space.items()}).build().body
        return self._generic

    def keep_candidates(self) -> dict[int, tuple[Term, list[Term]]]:
        """`reduce_sched.keep_candidates` of this kernel's term, computed once."""
        if self._keep is None:
            self._keep = reduce_sched.keep_candidates(self.term)
        return self._keep

    def welford_reductions(self) -> list[tuple[Term, Term, Term, Term | None]]:
        """`reduce_sched.welford_reductions` of this kernel's term, computed once."""
        if self._welford is None:
            self._welford = reduce_sched.welford_reductions(self.term)
        return self._welford

    def has_reduction(self, node: Term) -> bool:
        """`reduce_sched.has_reduction(node)`, memoized by id (the memo holds the node,
        so that its id is never reused)."""
        hit = self._reduces.get(id(node))
        if hit is None:
            hit = self._reduces[id(node)] = (node, reduce_sched.has_reduction(node))
        return hit[1]

    def default_knobs(self) -> dict[str, Any]:
        return {k: v[0] for k, v in self.knob_space().items()}

    def resolve(self, knobs: Knobs | None) -> dict[str, Any]:
        """Defaults overridden by `knobs`; an unknown knob or an illegal value raises."""
        space = self.knob_space()
        out = {k: v[0] for k, v in space.items()}
        for k, v in (knobs or {}).items():
            if k not in space:
                have = ", ".join(sorted(space))
                raise CodegenError(f"kernel {self.index}: unknown knob {k!r} (have {have})")
            if v not in space[k] and not (k == "order" and sorted(v) == sorted(self.out_axes)):
                raise CodegenError(f"kernel {self.index}: knob {k}={v!r} not in {space[k]}")
            out[k] = tuple(v) if k == "order" else v
        return out

    # -- lowering -----------------------------------------------------------------
    def nest(self, knobs: Knobs | None = None) -> KernelNest:
        """The loop nest under `knobs` (defaults for missing ones)."""
        k = self.resolve(knobs)
        for schedule in SCHEDULES:
            nest = schedule.nest(self, k)
            if nest is not None:
                return nest
        return _Builder(self, k).build()

    @property
    def stats(self) -> KernelStats:
        """(flops, bytes_read, bytes_written, transcendentals) of the default loop nest:
        flops and transcendental calls counted from the loops (recomputation included),
        bytes as compulsory traffic (each buffer read once, float32)."""
        nest = self.nest()
        flops = trans = 0.0

        def visit(stmts: tuple[Stmt, ...], mult: int) -> None:
            nonlocal flops, trans
            for s in stmts:
                if not isinstance(s, Let | Array | Assign | Write | Loop):  # a Gemm, a
                    visit(s.expand(), mult)  # FlashAttention: what their plain loops do
                    continue
                if isinstance(s, Loop):
                    visit(s.body, mult * s.extent)
                    continue
                for e in stmt_exprs(s):
                    for c in walk_calls(e):
                        op = BY_NAME.get(VARIANT_OF.get(c.op, c.op))  # a helper: one flop
                        call_flops, call_trans = op_work(op, mult) if op else (mult, 0)
                        flops += call_flops
                        trans += call_trans

        visit(nest.body, 1)
        bufs = self.program.buffers
        item = ITEMSIZE["float32"]
        read = sum(item * bufs[b].size for b in nest.params[:-1])
        return KernelStats(flops, read, item * bufs[self.out].size, trans)


@dataclass
class _Scope:
    bound: frozenset[str]
    loops: list[tuple[str, int, str, str]]
    stmts: list[Stmt] = field(default_factory=list)
    memo: dict[Any, Expr] = field(default_factory=dict)
    lazy: dict[Any, Expr] = field(default_factory=dict)  # defined here on first use

    def close(self) -> Stmt:
        body: tuple[Stmt, ...] = tuple(self.stmts)
        for var, extent, kind, axis in reversed(self.loops):
            body = (Loop(var, extent, body, kind, axis),)
        return body[0]


Env = dict[str, Affine]


class _Builder:
    """Builds one kernel's loop nest (see the module docstring for the rules)."""

    def __init__(self, kernel: Kernel, knobs: dict[str, Any]):
        self.kernel, self.knobs, self.prog = kernel, knobs, kernel.program
        self.counter: dict[str, int] = {}
        self.extent: dict[str, int] = {}
        self.vector_ok: list[str] = []  # intra-tile output variables, in loop order
        self.reads: dict[str, None] = {}
        # keep: (node, its other axes' indices) -> (row array, reduction axis, home scope)
        self.kept: dict[Any, tuple[str, str, _Scope]] = {}
        self.keep = kernel.keep_candidates() if knobs.get("keep", False) else {}
        self.keeper = {id(u): r for r, us in self.keep.values() for u in us}
        self.active: set[int] = set()  # reductions whose loops are being built
        # knob `welford`: squared-deviation reductions lowered in one blocked pass (by id,
        # with their x and k), and the sums of x that pass also yields (id -> reduction)
        self.welford: dict[int, tuple[Term, Term, Term]] = {}
        self.welford_sum: dict[int, Term] = {}
        block = int(knobs.get("welford", 0) or 0)
        for r, x, k, total in kernel.welford_reductions() if block else ():
            n = x.shape[r.axis]
            if n % block == 0 and n // block >= 2:
                self.welford[id(r)] = (r, x, k)
                if total is not None:
                    self.welford_sum[id(total)] = r
        # padded affine reads of computed values: index forms (and extents) the loads
        # under them must test, so that nothing outside a buffer is ever read
        self.guard: tuple[tuple[Affine, int], ...] = ()

    def fresh(self, prefix: str) -> str:
        n = self.counter.get(prefix, 0)
        self.counter[prefix] = n + 1
        return f"{prefix}{n}"

    def loop_var(self, extent: int) -> str:
        v = self.fresh("ax")
        self.extent[v] = extent
        return v

    # -- entry --------------------------------------------------------------------
    def build(self) -> KernelNest:
        """The nest. An axis whose tile does not divide its extent (a transposed
        reduction's tile at a size with no divisor near it) runs its whole tiles, then
        its remaining elements as one shorter tile: one copy of the nest per combination
        of whole / rest over such axes, each output element in exactly one."""
        kern, shape = self.kernel, self.kernel.term.shape
        ragged = [a for a in self.knobs["order"] if shape[a] % self.knobs[f"tile.{a}"]]
        body: list[Stmt] = []
        for rest in itertools.product((False, True), repeat=len(ragged)):
            body += self.build_part(dict(zip(ragged, rest, strict=True)))
        names = list(self.prog.buffers)
        params = (*sorted(self.reads, key=names.index), kern.out)
        nest = tuple(stream.mark_streams(body)) if self.knobs.get("nt") else tuple(body)
        return KernelNest(kern.index, dict(self.knobs), nest, params)

    def build_part(self, rest: dict[str, bool]) -> list[Stmt]:
        """The nest over the whole tiles of each axis, or (`rest[a]`) over axis a's
        remaining elements past them; [] where an axis has no whole tile."""
        kern, shape = self.kernel, self.kernel.term.shape
        env: Env = {}
        outer: list[tuple[str, int, str, str]] = []
        inner: list[tuple[str, int, str, str]] = []
        for a in self.knobs["order"]:
            t = self.knobs[f"tile.{a}"]
            whole = shape[a] // t
            idx = Affine()
            if rest.get(a):  # the elements past the whole tiles, as one tile
                idx, whole, t = Affine((), whole * t), 1, shape[a] - whole * t
            elif whole == 0:
                return []
            if whole > 1:
                v = self.loop_var(whole)
                outer.append((v, whole, "parallel", a))
                idx = idx + Affine.var(v).scale(t)
            if t > 1:
                w = self.loop_var(t)
                inner.append((w, t, "tile", a))
                self.vector_ok.append(w)
                idx = idx + Affine.var(w)
            env[a] = idx
        chain = [_Scope(frozenset(), [])]
        for loop in outer + inner:
            chain.append(_Scope(chain[-1].bound | {loop[0]}, [loop]))
        for r, _x, _k in self.welford.values():  # before any use of the sums they yield
            if set(r.shape) <= set(env):
                self.compile(r, env, chain)
        value = self.compile(kern.term, env, chain)
        out = self.prog.buffers[kern.out]
        index = self.index_of(list(out.axes), list(out.shape), env)
        chain[-1].stmts.append(Write(kern.out, index, value))
        for i in range(len(chain) - 1, 0, -1):
            chain[i - 1].stmts.append(chain[i].close())
        return chain[0].stmts

    # -- helpers --------------------------------------------------------------------
    @staticmethod
    def index_of(axes: list[str], sizes: list[int], env: Env) -> Affine:
        idx = Affine()
        for a, st in zip(axes, _strides(sizes), strict=True):
            idx = idx + env[a].scale(st)
        return idx

    @staticmethod
    def needed(axes: Any, env: Env) -> frozenset[str]:
        return frozenset(v for a in axes for v in env[a].vars)

    @staticmethod
    def place(needed: frozenset[str], chain: list[_Scope]) -> int:
        return next(i for i, s in enumerate(chain) if needed <= s.bound)

    def let(self, scope: _Scope, expr: Expr) -> Ref:
        name = self.fresh("t")
        scope.stmts.append(Let(name, expr))
        return Ref(name)

    # -- compile ----------------------------------------------------------------------
    def compile(self, node: Term, env: Env, chain: list[_Scope]) -> Expr:
        """The value of `node` at the innermost scope of `chain`, computed where it belongs."""
        if node.op is Op.CONST:
            return Lit(float(node.attrs[0]))  # type: ignore[arg-type]
        if node.op is Op.NEGINF:
            return Lit(-math.inf)
        if node.op is Op.ZERO:  # a fill: the operand only gives the shape
            return Lit(0.0)
        if node.op is Op.SPLIT:
            a, f = node.axis, int(node.attrs[1])  # type: ignore[arg-type]
            o, i = (f"{a}/o{f}", f"{a}/i{f}")
            inner = {k: v for k, v in env.items() if k not in (o, i)}
            inner[a] = env[o].scale(f) + env[i]
            return self.compile(node.args[0], inner, chain)
        if node.op is Op.READ and read_map(node).pad is None:  # index arithmetic only
            return self.compile(node.args[0], read_env(node, env), chain)
        key = (node, tuple(env[a] for a in node.shape))
        target = self.place(self.needed(node.shape, env), chain)
        for scope in chain[target:]:
            if key in scope.memo:
                return scope.memo[key]
            if key in scope.lazy:
                scope.memo[key] = self.let(scope, scope.lazy.pop(key))
                return scope.memo[key]
        kept = self.kept_value(node, env, chain)
        if kept is not None:
            return kept
        if node.op in REDUCTIONS:  # computed with vector accumulators at an outer scope?
            q0 = self.vector_placement(node, env, chain, target)[0]
            if key in chain[q0].memo:
                return chain[q0].memo[key]
        hoisted = self.hoist(node, env, chain, target)
        if hoisted is not None:
            return hoisted
        owner = self.welford_sum.pop(id(node), None)
        if owner is not None and id(owner) not in self.active:
            self.compile(owner, env, chain)  # its one blocked pass yields this sum too
            return self.compile(node, env, chain)
        if node.op in REDUCTIONS:
            self.active.add(id(node))
            q, expr = self.reduction(node, env, chain, target)
            self.active.discard(id(node))
            chain[q].memo[key] = expr
            return expr
        expr = self.leaf_or_op(node, env, chain)
        ref = self.let(chain[target], expr)
        chain[target].memo[key] = ref
        return ref

    def kept_value(self, node: Term, env: Env, chain: list[_Scope]) -> Expr | None:
        """`node`'s value read back from a reduction pass's `keep` array, when that pass
        kept it for the same indices on the other axes and its row is in scope."""
        owner = self.keeper.get(id(node))
        if (owner is not None and id(owner) not in self.active and owner.axis in node.shape
                and set(owner.shape) <= set(env)
                and self.needed(owner.shape, env) <= chain[-1].bound):
            self.compile(owner, env, chain)  # the pass that keeps it runs first
        if not self.kept:
            return None
        if not set(node.shape) <= set(env):
            return None
        for a in node.shape:
            others = tuple(env[x] for x in node.shape if x != a)
            hit = self.kept.get((node, a, others))
            if hit is not None and any(s is hit[2] for s in chain):
                return Ref(hit[0], env[a])
        return None

    def hoist(self, node: Term, env: Env, chain: list[_Scope], target: int) -> Expr | None:
        """An elementwise node of per-row state that needs intra-tile variables, placed
        where loops it does not depend on would recompute it: computed once into an array
        over those tile variables at its outer home (`reduce_sched.hoist_vars`)."""
        if not self.vector_ok or not (node.op in UNARY or node.op in BINARY
                                      or node.op in TERNARY):
            return None
        needed = self.needed(node.shape, env)
        q = self.place(needed - set(self.vector_ok), chain)
        if q >= target or not self.kernel.has_reduction(node):
            return None
        vec = reduce_sched.hoist_vars(needed, self.vector_ok, chain[q].bound,
                                      chain[target].bound, self.extent, VECTOR_CAP)
        if not vec:
            return None
        key = (node, tuple(env[a] for a in node.shape))
        if key in chain[q].memo:
            return chain[q].memo[key]
        scopes: list[_Scope] = []
        for v in vec:
            bound = scopes[-1].bound if scopes else chain[q].bound
            scopes.append(_Scope(bound | {v}, [(v, self.extent[v], "vector", "")]))
        expr = self.leaf_or_op(node, env, [*chain[: q + 1], *scopes])
        name = self.fresh("acc")
        idx = self.index_of(vec, [self.extent[v] for v in vec], {v: Affine.var(v) for v in vec})
        scopes[-1].stmts.append(Assign(Ref(name, idx), expr))
        chain[q].stmts.append(Array(name, math.prod(self.extent[v] for v in vec), 0.0))
        for i in range(len(scopes) - 1, 0, -1):
            scopes[i - 1].stmts.append(scopes[i].close())
        chain[q].stmts.append(scopes[0].close())
        chain[q].memo[key] = Ref(name, idx)
        return chain[q].memo[key]

    def keep_row(self, node: Term, inner: Env, scopes: list[_Scope], home: _Scope,
                 n: int, at: Affine) -> list[tuple[Any, str]]:
        """Knob `keep`: store the values `reduce_sched.keep_candidates` names for this
        reduction into per-row arrays `acc[at]` (declared in `home`, stored in the
        innermost of `scopes`). Returns the `kept` entries to register once the pass
        is emitted."""
        out: list[tuple[Any, str]] = []
        if n > reduce_sched.KEEP_CAP:
            return out
        a = node.axis
        for u in self.keep.get(id(node), (node, []))[1]:
            if not set(u.shape) <= set(inner):  # an axis bound elsewhere (a split part)
                continue
            key = (u, tuple(inner[x] for x in u.shape))
            ref = next((s.memo[key] for s in scopes if key in s.memo), None)
            if ref is None:
                continue
            name = self.fresh("acc")
            home.stmts.append(Array(name, n, 0.0, fill=False))  # the pass writes every element
            scopes[-1].stmts.append(Assign(Ref(name, at), ref))
            out.append(((u, a, tuple(inner[x] for x in u.shape if x != a)), name))
        return out

    def keep_tail(self, kept: list[tuple[Any, str]], inner: Env, scopes: list[_Scope],
                  at: Affine) -> list[tuple[Any, str]]:
        """The `keep` stores of a lane-split reduction's tail loop (`keep_row` made the
        arrays for the main loop): the kept entries whose value the tail computed too
        (the others are dropped, so later uses recompute them)."""
        out: list[tuple[Any, str]] = []
        for entry, name in kept:
            u = entry[0]
            key = (u, tuple(inner[x] for x in u.shape))
            ref = next((s.memo[key] for s in scopes if key in s.memo), None)
            if ref is not None:
                scopes[-1].stmts.append(Assign(Ref(name, at), ref))
                out.append((entry, name))
        return out

    def leaf_or_op(self, node: Term, env: Env, chain: list[_Scope]) -> Expr:
        op = node.op
        if op is Op.IN:
            buf = self.prog.input_buffer[str(node.attrs[0])]
            pairs = in_axes(node)
            self.reads[buf] = None
            return Load(buf, self.index_of([a for a, _ in pairs], [s for _, s in pairs], env),
                        self.guard)
        if op is Op.STORE:
            info = self.prog.buffers[self.prog.store_buffer[node]]
            self.reads[info.name] = None
            return Load(info.name, self.index_of(list(info.axes), list(info.shape), env),
                        self.guard)
        if op is Op.READ:
            return self.padded_load(node, env, chain)
        if op is Op.GATHER:
            return self.gathered_load(node, env, chain)
        if op is Op.DIV:
            quotient = self.invariant_div(node, env, chain)
            if quotient is not None:
                return quotient
        if op is Op.IDX:  # a position: the loop index of its axis, as a float
            return IndexValue(env[idx_axis(node)[0]])
        if op is Op.EXP and nonpositive(node.args[0]):  # no overflow handling needed
            return Call("exp_nonpos", (self.compile(node.args[0], env, chain),))
        if op in UNARY or op in BINARY or op in TERNARY:
            return Call(op.value, tuple(self.compile(c, env, chain) for c in node.args))
        raise CodegenError(f"no lowering for node {node!r}")

    def padded_load(self, node: Term, env: Env, chain: list[_Scope]) -> Expr:
        """A padded affine read: the operand's load, guarded by the index forms that can
        leave its range (the pad where one does). The operand must be a buffer read
        (through `Split`s): a computed value is stored first."""
        m, x = read_map(node), node.args[0]
        inner = read_env(node, env)
        guard = tuple((inner[a], x.shape[a]) for a, _ in m.forms
                      if m.span(a)[0] < 0 or m.span(a)[1] >= x.shape[a])
        t, tenv = x, inner
        while t.op is Op.SPLIT:
            a, f = t.axis, int(t.attrs[1])  # type: ignore[arg-type]
            o, i = (f"{a}/o{f}", f"{a}/i{f}")
            split = {k: v for k, v in tenv.items() if k not in (o, i)}
            split[a] = tenv[o].scale(f) + tenv[i]
            t, tenv = t.args[0], split
        assert m.pad is not None  # an unpadded read is index arithmetic (`compile`)
        if t.op not in (Op.IN, Op.STORE):
            return self.padded_value(node, read_env(node, env), guard, m.pad, chain)
        load = self.leaf_or_op(t, tenv, chain)
        assert isinstance(load, Load)
        return Load(load.buf, load.index, guard + load.guard, m.pad)

    def gathered_load(self, node: Term, env: Env, chain: list[_Scope]) -> Expr:
        """A gather (issue 18 part 3b): the operand's load with its gathered axis at index
        0, plus `stride * labels[...]` (a `Label`: checked against the axis size at run
        time). The operand must be a buffer read (through `Split`s)."""
        a, (x, labels) = str(node.attrs[0]), node.args
        lab = self.leaf_or_op(labels, env, chain)
        assert isinstance(lab, Load)
        def load_at(k: int) -> Load:
            t, tenv = x, {**env, a: Affine((), k)}
            while t.op is Op.SPLIT:
                f = int(t.attrs[1])  # type: ignore[arg-type]
                o, i = (f"{t.axis}/o{f}", f"{t.axis}/i{f}")
                split = {b: v for b, v in tenv.items() if b not in (o, i)}
                split[t.axis] = tenv[o].scale(f) + tenv[i]
                t, tenv = t.args[0], split
            if t.op not in (Op.IN, Op.STORE):
                raise CodegenError(f"a gather of a computed value (store it first): {node!r}")
            load = self.leaf_or_op(t, tenv, chain)
            assert isinstance(load, Load)
            return load

        base, next_ = load_at(0), load_at(1)
        stride = next_.index.const - base.index.const
        if next_.index.terms != base.index.terms:
            raise CodegenError(f"a gather whose axis is no constant stride: {node!r}")
        slot = list(self.prog.input_buffer.values()).index(lab.buf)
        label = Label(lab.buf, lab.index, x.shape[a], stride, slot,
                      self.checked_label(labels, lab, x.shape[a], slot, env, chain))
        return Load(base.buf, base.index, self.guard + base.guard, base.pad,
                    (*base.labels, label))

    def checked_label(self, labels: Term, lab: Load, bound: int, slot: int, env: Env,
                      chain: list[_Scope]) -> Expr | None:
        """The label checked once where its axes are bound (a row's label once per row,
        not once per element of the row): a `gather_check` call in a `Let`, whose value
        (a float, exact below 2^24) is the label or 0 after recording the error. None
        past 2^24 (a bound or a label count a float cannot hold exactly): the index then
        checks the label inline."""
        if bound > 1 << 24 or math.prod(input_dims(labels)) > 1 << 24:
            return None
        key = ("gather_check", labels, bound, tuple(env[b] for b in labels.shape))
        q = self.place(self.needed(labels.shape, env), chain)
        for scope in chain[q:]:
            if key in scope.memo:
                return scope.memo[key]
        call = Call("gather_check", (lab, Lit(float(bound)), Lit(float(slot)),
                                     IndexValue(lab.index)))
        chain[q].memo[key] = self.let(chain[q], call)
        return chain[q].memo[key]

    def padded_value(self, node: Term, inner: Env, guard: tuple[tuple[Affine, int], ...],
                     pad: float, chain: list[_Scope]) -> Expr:
        """A padded read of a computed value: the value computed at the read's forms with
        every load under it guarded (reading 0 outside its buffer), then the pad selected
        where a form leaves the operand (the index compared as a float: exact below 2^23)."""
        if any(n >= 1 << 23 for _, n in guard):
            raise CodegenError(f"a padded read of a computed value over an axis of 2^23 or "
                               f"more (store it first): {node!r}")
        saved, self.guard = self.guard, self.guard + guard
        try:
            value = self.compile(node.args[0], inner, chain)
        finally:
            self.guard = saved
        for idx, n in guard:
            at = IndexValue(idx)
            inside = Call("select_gt", (at, Lit(-0.5), value, Lit(pad)))
            value = Call("select_gt", (Lit(n - 0.5), at, inside, Lit(pad)))
        return value

    def invariant_div(self, node: Term, env: Env, chain: list[_Scope]) -> Expr | None:
        """`x / d` with `d` computed at an outer scope than `x / d` (a row's sum or norm
        divides every element of the row): one division per `d`, a multiply per element
        (a vector division costs ~10x a multiply). Written `(x * s) * (1 / (d * s))`
        with s = 2^100 where |d| < 2^-100, else 1 (exact powers of two): 1 / (d * s)
        never overflows for a finite nonzero `d`, and where `x * s` overflows, `x / d`
        does too; d = 0, inf or NaN give what `x / d` gives. Within ~1 ulp of `x / d`."""
        num, den = node.args
        if den.op is Op.CONST:
            return None
        needed = self.needed(den.shape, env)
        qd = self.place(needed, chain)
        qn = self.place(self.needed(node.shape, env), chain)
        vec: list[str] = []
        if qd >= qn:  # per tile element: invariant over a loop outside the tile?
            qd = self.place(needed - set(self.vector_ok), chain)
            if qd >= qn or not self.kernel.has_reduction(den):
                return None
            vec = reduce_sched.hoist_vars(needed, self.vector_ok, chain[qd].bound,
                                          chain[qn].bound, self.extent, VECTOR_CAP)
            if not vec:
                return None
        x = self.compile(num, env, chain)
        d = self.compile(den, env, chain)
        scope = chain[qd]
        key = ("reciprocal", den, tuple(env[a] for a in den.shape))
        if key not in scope.memo:
            big = Call("select_gt", (Lit(2.0 ** -100), Call("abs", (d,)), Lit(2.0 ** 100),
                                     Lit(1.0)))
            if not vec:
                s = self.let(scope, big)
                scope.memo[key] = s
                scope.memo[(*key, "inv")] = self.let(scope, Call("div", (Lit(1.0),
                                                                         Call("mul", (d, s)))))
            else:  # arrays over the tile, filled once at the outer scope
                idx = self.index_of(vec, [self.extent[v] for v in vec],
                                    {v: Affine.var(v) for v in vec})
                size = math.prod(self.extent[v] for v in vec)
                sa, ia = Ref(self.fresh("acc"), idx), Ref(self.fresh("acc"), idx)
                scope.stmts += [Array(sa.name, size, 1.0, fill=False),
                                Array(ia.name, size, 1.0, fill=False)]
                body: tuple[Stmt, ...] = (Assign(sa, big),
                                          Assign(ia, Call("div", (Lit(1.0), Call("mul", (d, sa))))))
                for v in reversed(vec):
                    body = (Loop(v, self.extent[v], body, "vector"),)
                scope.stmts += body
                scope.memo[key], scope.memo[(*key, "inv")] = sa, ia
        s, inv = scope.memo[key], scope.memo[(*key, "inv")]
        return Call("mul", (Call("mul", (x, s)), inv))

    def vector_placement(
        self, node: Term, env: Env, chain: list[_Scope], target: int
    ) -> tuple[int, list[str]]:
        needed = self.needed(node.shape, env)
        q = self.place(needed - set(self.vector_ok), chain)
        if q >= target:
            return target, []
        vec = [v for v in self.vector_ok if v in needed and v not in chain[q].bound]
        if math.prod(self.extent[v] for v in vec) > VECTOR_CAP:
            return target, []
        if node.op is Op.SOFTMAXAVG:  # loops the score depends on first (per-row state)
            svars = self.needed([a for a in node.args[0].shape if a != node.axis], env)
            vec = [v for v in vec if v in svars] + [v for v in vec if v not in svars]
        return q, vec

    def contiguous_in(self, node: Term) -> bool:
        """Every buffer the operand reads along the reduction axis has it at stride 1
        (then lanes over that axis load contiguous vectors even inside a register tile)."""
        reads = [n for n in _operand_nodes(node) if n.op in (Op.IN, Op.STORE, Op.SPLIT)]
        return not any(n.op is Op.SPLIT for n in reads) and all(
            self.kernel.last_axis(n) == node.axis for n in reads if node.axis in n.shape)

    def loop_free(self, node: Term) -> bool:
        """No reduction inside the operand runs over this reduction's axis."""
        nodes = _operand_nodes(node)
        return not any(n.op in REDUCTIONS and node.axis in n.shape for n in nodes)

    def reduction(
        self, node: Term, env: Env, chain: list[_Scope], target: int
    ) -> tuple[int, Expr]:
        """Emit the loop of reduction `node`; return (scope index, its value expression)."""
        op, a = node.op, node.axis
        n = _operand_shape(node)[a]
        q, vec = self.vector_placement(node, env, chain, target)
        home = chain[q]
        w = int(self.knobs["vec"])
        if id(node) in self.welford:
            blocked = self.blocked_sq_dev(node, env, chain, q, vec)
            if blocked is not None:
                return q, blocked
        if op is Op.SOFTMAXAVG:
            return q, self.softmax_avg(node, env, chain, q, vec)
        lane_ok = not vec or (op in (Op.SUM, Op.DOT) and self.contiguous_in(node)
                              and math.prod(self.extent[v] for v in vec) * w <= VECTOR_CAP)
        lanes = w if (lane_ok and op in LANE_OPS and w > 1 and n > w
                      and self.loop_free(node)) else 1
        # lanes: a main loop over whole groups of `lanes` elements, then (n not a multiple)
        # a tail loop over the rest, each element into the lane of its position in the group
        main = n // lanes
        rest = n - main * lanes
        if lanes > 1:
            a0, lane = self.loop_var(main), self.loop_var(lanes)
            loop = _Scope(home.bound | {a0}, [(a0, main, "reduce", a)])
            env_a = Affine.var(a0).scale(lanes) + Affine.var(lane)
            vvars = [*vec, lane]
        else:
            r = self.loop_var(n)
            loop = _Scope(home.bound | {r}, [(r, n, "reduce", a)])
            env_a, vvars = Affine.var(r), vec

        def lane_scopes(outer: _Scope, vars_: list[str]) -> list[_Scope]:
            """One scope per vector loop, so LICM hoists between them."""
            out: list[_Scope] = []
            for v in vars_:
                outer_bound = out[-1].bound if out else outer.bound
                # a max's lanes: gcc fully unrolls the lane loop and then leaves the select
                # scalar (vmaxss x16); marked "simd" (C: `#pragma omp simd`) it is one vmaxps
                kind = "simd" if op is Op.RMAX and lanes > 1 and v == vars_[-1] else "vector"
                out.append(_Scope(outer_bound | {v}, [(v, self.extent[v], kind, "")]))
            return out

        vscopes = lane_scopes(loop, vvars)
        vext = [self.extent[v] for v in vvars]
        vsize = math.prod(vext)
        vidx = self.index_of(vvars, vext, {v: Affine.var(v) for v in vvars})
        inner = {**env, a: env_a}
        chain_full = [*chain[: q + 1], loop, *vscopes]

        def state(init: float) -> str:
            name = self.fresh("acc")
            if vsize > 1:
                home.stmts.append(Array(name, vsize, init))
            else:
                home.stmts.append(Let(name, Lit(init), mutable=True))
            return name

        def add(x: Expr, y: Expr) -> Call:
            return Call("add", (x, y))

        def mul(x: Expr, y: Expr) -> Call:
            return Call("mul", (x, y))

        def gt(x: Expr, y: Expr, then: Expr, other: Expr) -> Call:
            return Call("select_gt", (x, y, then, other))

        zero, one = Lit(0.0), Lit(1.0)
        if op in (Op.SUM, Op.DOT):
            names = [state(0.0)]
        elif op is Op.RMAX:
            names = [state(-math.inf)]
        elif op is Op.LSE:
            names = [state(NEG_BIG), state(0.0)]
        else:  # pragma: no cover
            raise CodegenError(f"no lowering for reduction {node!r}")

        def update(inner: Env, scopes: list[_Scope], idx: Affine) -> None:
            """The accumulators' update for one element, in the innermost of `scopes`."""
            last = scopes[-1]
            refs = [Ref(x, idx) if vsize > 1 else Ref(x) for x in names]
            if op in (Op.SUM, Op.DOT):
                x = self.compile(node.args[0], inner, scopes)
                if op is Op.DOT:
                    x = mul(x, self.compile(node.args[1], inner, scopes))
                last.stmts.append(Assign(refs[0], add(refs[0], x)))
            elif op is Op.RMAX:
                x = self.compile(node.args[0], inner, scopes)
                last.stmts.append(Assign(refs[0], gt(x, refs[0], x, refs[0])))
            else:  # LSE: t = x - m; e = exp(-|t|), the weight of the smaller of (m, x)
                m, s = refs
                x = self.compile(node.args[0], inner, scopes)
                t = self.let(last, Call("sub", (x, m)))
                e = self.let(last, Call("exp_nonpos", (Call("neg", (Call("abs", (t,)),)),)))
                last.stmts.append(Assign(s, gt(t, zero, add(mul(s, e), one), add(s, e))))
                last.stmts.append(Assign(m, gt(t, zero, x, m)))

        def close(outer: _Scope, scopes: list[_Scope]) -> None:
            for i in range(len(scopes) - 1, -1, -1):
                (scopes[i - 1] if i else outer).stmts.append(scopes[i].close())

        update(inner, chain_full, vidx)
        kept = self.keep_row(node, inner, chain_full, home, n, env_a) if not vec else []
        close(loop, vscopes)
        home.stmts.append(loop.close())
        if lanes > 1 and rest:  # the tail: lanes [0, rest) of one more group
            tail = self.loop_var(rest)
            env_t = Affine((), main * lanes) + Affine.var(tail)
            tscopes = lane_scopes(home, [*vec, tail])
            inner_t = {**env, a: env_t}
            update(inner_t, [*chain[: q + 1], *tscopes],
                   self.index_of([*vec, tail], vext, {v: Affine.var(v) for v in [*vec, tail]}))
            kept = self.keep_tail(kept, inner_t, tscopes, env_t)
            tops = tscopes[0]
            close(tops, tscopes[1:])
            home.stmts.append(tops.close())
        for kept_key, kept_name in kept:
            self.kept[kept_key] = (kept_name, node.axis, home)

        lane_state = [Ref(x, vidx) if vsize > 1 else Ref(x) for x in names]
        result: Expr
        if lanes > 1:
            result = self.combine_lanes(op, home, lanes, lane_state,
                                        tuple((v, self.extent[v]) for v in vec))
        elif op is Op.LSE:
            result = add(lane_state[0], Call("log", (lane_state[1],)))
        else:
            result = lane_state[0]
        if isinstance(result, Call) and not vec:
            result = self.let(home, result)
        return q, result

    def accumulator(self, home: _Scope, init: float, size: int, idx: Affine) -> Ref:
        """A fresh accumulator declared in `home`: an array of `size` floats read at `idx`,
        or a scalar when size is 1, every element starting at `init`."""
        name = self.fresh("acc")
        if size > 1:
            home.stmts.append(Array(name, size, init))
            return Ref(name, idx)
        home.stmts.append(Let(name, Lit(init), mutable=True))
        return Ref(name)

    def blocked_sq_dev(self, node: Term, env: Env, chain: list[_Scope], q: int,
                       vec: list[str]) -> Expr | None:
        """Knob `welford`: `Sum_a((x - k)^2)` (`reduce_sched.sq_dev`) in one pass over x.
        Axis a is split into blocks of B (the knob's value); each block's sum s_b and
        squared deviations from its own mean, q_b = sum over the block of (x - s_b/B)^2,
        are computed by two sweeps over the block (the second from cache) into per-block
        arrays; then sum_a x = sum_b s_b, and

            Sum_a((x - k)^2) = sum_b (q_b + B * (s_b/B - k)^2)

        an identity over the reals for any k free of a (each block's deviations from
        its mean sum to zero), whose terms are all nonnegative (no cancellation, unlike
        E[x^2] - E[x]^2). k is computed after the pass, so when k is built from sum_a x
        (a variance's mean) that sum comes from the same pass (`welford_sum`): batchnorm's
        statistics read their input once instead of twice. The blocks are independent
        (each writes its own slots), so C splits the block loop over the threads
        (`combine.parallel_sums`). None (the two-pass form) where the block arrays would
        exceed `reduce_sched.WELFORD_CAP`."""
        _, x, k = self.welford[id(node)]
        a, home = node.axis, chain[q]
        block = int(self.knobs["welford"])
        n = x.shape[a]
        nb = n // block
        vext = [self.extent[v] for v in vec]
        vsize = math.prod(vext)
        if nb * vsize > reduce_sched.WELFORD_CAP:
            return None
        vidx = self.index_of(vec, vext, {v: Affine.var(v) for v in vec})
        xs = Split(a, block, x)
        o, i = split_axes(a, block)
        s_node = Sum(i, xs)
        mean_b = div(s_node, Const(float(block)))
        q_node = Sum(i, mul(sub(xs, mean_b), sub(xs, mean_b)))

        def nest(var: str | None, extent: int = 1, kind: str = "reduce") -> list[_Scope]:
            """A loop scope at `home` (none for `var` None) and the vector loops over `vec`
            inside it."""
            out = [_Scope(home.bound | {var}, [(var, extent, kind, a)])] if var else []
            for v in vec:
                bound = out[-1].bound if out else home.bound
                out.append(_Scope(bound | {v}, [(v, self.extent[v], "vector", "")]))
            return out

        def close(scopes: list[_Scope]) -> None:
            for j in range(len(scopes) - 1, 0, -1):
                scopes[j - 1].stmts.append(scopes[j].close())
            home.stmts.append(scopes[0].close())

        sums, devs = self.fresh("acc"), self.fresh("acc")
        home.stmts += [Array(sums, nb * vsize, 0.0, fill=False),
                       Array(devs, nb * vsize, 0.0, fill=False)]
        bo = self.loop_var(nb)
        blk = nest(bo, nb, "reduce")
        benv = {**env, o: Affine.var(bo)}
        inner = [*chain[: q + 1], *blk]
        sv = self.compile(s_node, benv, inner)
        qv = self.compile(q_node, benv, inner)
        slot = Affine.var(bo).scale(vsize) + vidx
        blk[-1].stmts += [Assign(Ref(sums, slot), sv), Assign(Ref(devs, slot), qv)]
        close(blk)
        # the sum of x over a, from the block sums
        total = self.accumulator(home, 0.0, vsize, vidx)
        b = self.loop_var(nb)
        merge = nest(b, nb, "reduce")
        at = Affine.var(b).scale(vsize) + vidx
        merge[-1].stmts.append(Assign(total, Call("add", (total, Ref(sums, at)))))
        close(merge)
        home.memo[(Sum(a, x), tuple(env[c] for c in node.shape))] = total
        # k, once per output slice, then the deviations from it, block by block
        if vec:
            kvals = self.fresh("acc")
            home.stmts.append(Array(kvals, vsize, 0.0, fill=False))
            kscopes = nest(None)
            kv = self.compile(k, env, [*chain[: q + 1], *kscopes])
            kscopes[-1].stmts.append(Assign(Ref(kvals, vidx), kv))
            for j in range(len(kscopes) - 1, 0, -1):
                kscopes[j - 1].stmts.append(kscopes[j].close())
            home.stmts.append(kscopes[0].close())
            kref: Expr = Ref(kvals, vidx)
            home.memo.setdefault((k, tuple(env[c] for c in k.shape)), kref)  # for hoists
        else:
            kref = self.compile(k, env, chain[: q + 1])
        dev = self.accumulator(home, 0.0, vsize, vidx)
        b2 = self.loop_var(nb)
        merge = nest(b2, nb, "reduce")
        at = Affine.var(b2).scale(vsize) + vidx
        t = self.let(merge[-1], Call("sub", (Call("div", (Ref(sums, at), Lit(float(block)))),
                                             kref)))
        step = Call("add", (Ref(devs, at), Call("mul", (Lit(float(block)),
                                                        Call("mul", (t, t))))))
        merge[-1].stmts.append(Assign(dev, Call("add", (dev, step))))
        close(merge)
        return dev

    def softmax_avg(self, node: Term, env: Env, chain: list[_Scope], q: int,
                    vec: list[str]) -> Expr:
        """`SoftmaxAvg a s v` with vector accumulators over `vec` (the loops the score
        depends on first: one running max and sum per score row). Staged (knob `stage`,
        operand loop-free, scores fit in VECTOR_CAP): the scores of the whole axis go to a
        local array, then max, exp and sum run as vectorized passes and the weighted sum
        of `v` follows, with no rescaling. Otherwise one online update per element."""
        a, home = node.axis, chain[q]
        n = _operand_shape(node)[a]
        svars = self.needed([x for x in node.args[0].shape if x != a], env)
        srow = [v for v in vec if v in svars]
        ssize = math.prod(self.extent[v] for v in srow)
        sidx = self.index_of(srow, [self.extent[v] for v in srow],
                             {v: Affine.var(v) for v in srow})
        vidx = self.index_of(vec, [self.extent[v] for v in vec], {v: Affine.var(v) for v in vec})
        vsize = math.prod(self.extent[v] for v in vec)

        def scopes(outer: _Scope, vars_: list[str], kind: str = "vector") -> list[_Scope]:
            out: list[_Scope] = []
            for v in vars_:
                bound = out[-1].bound if out else outer.bound
                out.append(_Scope(bound | {v}, [(v, self.extent[v], kind, "")]))
            return out

        def close(outer: _Scope, inner: list[_Scope]) -> None:
            for i in range(len(inner) - 1, -1, -1):
                (inner[i - 1] if i else outer).stmts.append(inner[i].close())

        m, ls = (self.accumulator(home, init, ssize, sidx) for init in (NEG_BIG, 0.0))
        acc = self.accumulator(home, 0.0, vsize, vidx)
        value_nodes = _operand_nodes(Store(node.args[1])) if node.args[1].op is not Op.STORE else []
        staged = (bool(self.knobs["stage"]) and n * ssize <= VECTOR_CAP
                  and not any(x.op in REDUCTIONS for x in value_nodes))
        if staged:
            sc_name = self.staged_passes(node, env, chain, q, srow, (m, ls))
            r = self.loop_var(n)
            loop = _Scope(home.bound | {r}, [(r, n, "reduce", a)])
            vs = scopes(loop, vec)
            inner = {**env, a: Affine.var(r)}
            val = self.compile(node.args[1], inner, [*chain[: q + 1], loop, *vs])
            p = Ref(sc_name, sidx.scale(n) + Affine.var(r))
            (vs[-1] if vs else loop).stmts.append(
                Assign(acc, Call("add", (acc, Call("mul", (p, val))))))
            close(loop, vs)
            home.stmts.append(loop.close())
        else:
            r = self.loop_var(n)
            loop = _Scope(home.bound | {r}, [(r, n, "reduce", a)])
            vs = scopes(loop, vec)
            inner = {**env, a: Affine.var(r)}
            chain_s = [*chain[: q + 1], loop, *vs[: len(srow)]]
            sscope = chain_s[-1]
            val = self.compile(node.args[1], inner, [*chain[: q + 1], loop, *vs])
            sc = self.compile(node.args[0], inner, chain_s)
            zero, one = Lit(0.0), Lit(1.0)
            t = self.let(sscope, Call("sub", (sc, m)))
            e = self.let(sscope, Call("exp_nonpos", (Call("neg", (Call("abs", (t,)),)),)))
            c = self.let(sscope, Call("select_gt", (t, zero, e, one)))
            p = self.let(sscope, Call("select_gt", (t, zero, one, e)))
            sscope.stmts.append(Assign(ls, Call("add", (Call("mul", (ls, c)), p))))
            sscope.stmts.append(Assign(m, Call("select_gt", (t, zero, sc, m))))
            (vs[-1] if vs else loop).stmts.append(Assign(acc, Call(
                "add", (Call("mul", (acc, c)), Call("mul", (p, val))))))
            close(loop, vs)
            home.stmts.append(loop.close())
        score_lse = LSE(a, node.args[0])
        lse_key = (score_lse, tuple(env[x] for x in score_lse.shape))
        home.lazy[lse_key] = Call("add", (m, Call("log", (ls,))))  # no log unless used
        # every score -inf (a fully masked row or key block): the weights are all 0 and
        # the average is 0, not 0/0 (kernelsat.interp's SoftmaxAvg; docs/proofs.md, "Masks")
        result: Expr = Call("select_gt", (ls, Lit(0.0), Call("div", (acc, ls)), Lit(0.0)))
        return self.let(home, result) if not vec else result

    def staged_passes(self, node: Term, env: Env, chain: list[_Scope], q: int,
                      srow: list[str], state: tuple[Ref, Ref]) -> str:
        """Scores of the whole axis into `sc[row*n + r]`; then per row: m = max (lanes),
        sc = exp(sc - m) and ls = sum (lanes). Returns the score array, which then holds
        the weights."""
        a, home = node.axis, chain[q]
        m, ls = state
        n = _operand_shape(node)[a]
        ssize = math.prod(self.extent[v] for v in srow)
        sidx = self.index_of(srow, [self.extent[v] for v in srow],
                             {v: Affine.var(v) for v in srow})
        r = self.loop_var(n)
        loop = _Scope(home.bound | {r}, [(r, n, "reduce", a)])
        rows: list[_Scope] = []
        for v in srow:
            bound = rows[-1].bound if rows else loop.bound
            rows.append(_Scope(bound | {v}, [(v, self.extent[v], "vector", "")]))
        sc = self.compile(node.args[0], {**env, a: Affine.var(r)}, [*chain[: q + 1], loop, *rows])
        name = self.fresh("acc")
        home.stmts.append(Array(name, ssize * n, 0.0))
        (rows[-1] if rows else loop).stmts.append(
            Assign(Ref(name, sidx.scale(n) + Affine.var(r)), sc))
        for i in range(len(rows) - 1, -1, -1):
            (rows[i - 1] if i else loop).stmts.append(rows[i].close())
        home.stmts.append(loop.close())
        # lanes of w: whole groups in the main loops, the rest (n not a multiple) in tails
        w = next((x for x in (16, 8, 4) if n >= 2 * x), 1)
        main, rest = n // w, n % w
        row = sidx.scale(n)

        def passes(update: Any) -> list[Stmt]:
            """`update(element, lane)` over the row: main loop, then the tail's lanes."""
            r0, lane = self.loop_var(main), self.loop_var(w)
            out: list[Stmt] = [Loop(r0, main, (Loop(lane, w, update(
                Ref(name, row + Affine.var(r0).scale(w) + Affine.var(lane)), Affine.var(lane)),
                "vector"),), "reduce", a)]
            if rest:
                tail = self.loop_var(rest)
                out.append(Loop(tail, rest, update(
                    Ref(name, row + Affine((), main * w) + Affine.var(tail)), Affine.var(tail)),
                    "vector"))
            return out

        body: list[Stmt] = []
        mx, sm = self.fresh("acc"), self.fresh("acc")
        body.append(Array(mx, w, NEG_BIG))
        body += passes(lambda at, lane: (
            Assign(Ref(mx, lane), Call("select_gt", (at, Ref(mx, lane), at, Ref(mx, lane)))),))
        body += self.fold_tree(mx, w, Affine(), lambda x, y: Call("select_gt", (y, x, y, x)))
        body.append(Assign(m, Ref(mx, Affine())))
        body.append(Array(sm, w, 0.0))
        body += passes(lambda at, lane: (
            Assign(at, Call("exp_nonpos", (Call("sub", (at, m)),))),  # at <= its max m
            Assign(Ref(sm, lane), Call("add", (Ref(sm, lane), at)))))
        body += self.fold_tree(sm, w, Affine(), lambda x, y: Call("add", (x, y)))
        body.append(Assign(ls, Ref(sm, Affine())))
        stmts: tuple[Stmt, ...] = tuple(body)
        for v in reversed(srow):
            stmts = (Loop(v, self.extent[v], stmts, "serial"),)
        home.stmts.extend(stmts)
        return name

    def fold_tree(self, name: str, lanes: int, base: Affine, update: Any) -> list[Stmt]:
        """name[base + l] = update(name[base + l], name[base + l + step]) for step =
        lanes/2, ..., 1: the pairwise fold of `lanes` accumulators into name[base]."""
        stmts: list[Stmt] = []
        step = lanes
        while step > 1:
            half = step // 2
            lv = self.loop_var(half)
            lo = Ref(name, base + Affine.var(lv))
            hi = Ref(name, base + Affine.var(lv) + Affine((), half))
            if step % 2:  # odd lane counts: fold the last lane first
                last = Ref(name, base + Affine((), step - 1))
                stmts.append(Assign(Ref(name, base), update(Ref(name, base), last)))
            stmts.append(Loop(lv, half, (Assign(lo, update(lo, hi)),), "serial"))
            step = half
        return stmts

    def combine_lanes(self, op: Op, home: _Scope, lanes: int, refs: list[Ref],
                      vec: tuple[tuple[str, int], ...] = ()) -> Expr:
        """Fold per-lane accumulators into lane 0 by a pairwise tree after the lane-split
        loop (log2(lanes) vectorizable steps instead of a serial chain of `lanes` adds).
        With vector accumulators `vec` ((loop var, extent), lanes innermost) every
        vector element is folded, inside loops over the same variables."""
        zero = Affine()
        if vec:
            base = self.index_of([v for v, _ in vec], [e for _, e in vec],
                                 {v: Affine.var(v) for v, _ in vec}).scale(lanes)
            zero = base

        def tree(name: str, update: Any) -> Ref:
            body: tuple[Stmt, ...] = tuple(self.fold_tree(name, lanes, zero, update))
            for v, extent in reversed(vec):
                body = (Loop(v, extent, body, "serial"),)
            home.stmts.extend(body)
            return Ref(name, zero)

        def add_(x: Expr, y: Expr) -> Expr:
            return Call("add", (x, y))

        def max_(x: Expr, y: Expr) -> Expr:
            return Call("select_gt", (y, x, y, x))

        if op in (Op.SUM, Op.DOT):
            return tree(refs[0].name, add_)
        if op is Op.RMAX:
            return tree(refs[0].name, max_)
        m, s = refs
        mx = self.fresh("acc")
        home.stmts.append(Array(mx, lanes, NEG_BIG))
        lv = self.loop_var(lanes)
        at = Affine.var(lv)
        home.stmts.append(Loop(lv, lanes, (Assign(Ref(mx, at), Ref(m.name, at)),), "serial"))
        top = tree(mx, max_)
        lw = self.loop_var(lanes)
        aw = Affine.var(lw)
        w = Call("exp_nonpos", (Call("sub", (Ref(m.name, aw), top)),))  # a lane's max <= top
        home.stmts.append(Loop(lw, lanes, (Assign(Ref(s.name, aw),
                                                  Call("mul", (Ref(s.name, aw), w))),), "serial"))
        total = tree(s.name, add_)
        return Call("add", (top, Call("log", (total,))))


@dataclass
class LoweredProgram:
    """A term cut into kernels, with its buffers. `str()` shows every kernel's default
    loop nest; `kernels[k].nest(knobs)` gives another schedule."""

    term: Term
    out_axes: tuple[str, ...]
    buffers: dict[str, BufferInfo] = field(default_factory=dict)
    input_buffer: dict[str, str] = field(default_factory=dict)  # user name -> in<k>
    store_buffer: dict[Term, str] = field(default_factory=dict)
    kernels: list[Kernel] = field(default_factory=list)

    @property
    def key(self) -> str:
        """Stable key of (term, output layout): the program part of a build cache key."""
        text = f"{self.term.key}|{','.join(self.out_axes)}"
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    @property
    def inputs(self) -> list[BufferInfo]:
        return [b for b in self.buffers.values() if b.role == "input"]

    def nests(self, knobs: list[Knobs | None] | None = None) -> list[KernelNest]:
        ks = knobs or [None] * len(self.kernels)
        if len(ks) != len(self.kernels):
            raise CodegenError(f"{len(ks)} knob settings for {len(self.kernels)} kernels")
        return [k.nest(s) for k, s in zip(self.kernels, ks, strict=True)]

    def __str__(self) -> str:
        lines = []
        for b in self.inputs:
            lines.append(f"input {b.name}: {b.user_name} {list(b.shape)}")
        for kern, nest in zip(self.kernels, self.nests(), strict=True):
            ob = self.buffers[kern.out]
            dims = ", ".join(f"{a}:{s}" for a, s in zip(ob.axes, ob.shape, strict=True))
            reads = ", ".join(nest.params[:-1])
            lines.append(f"kernel {kern.index} -> {kern.out}[{dims}]  reads {reads}")
            lines.append(str(nest))
        return "\n".join(lines)


PAD_COPY_REUSE = 2
"""A padded read of a buffer whose elements are at least this many times the padded
copy's (a convolution window reads each input element K times) reads a zero-padded copy
instead, made by a kernel of its own: the guards (which keep gcc from vectorizing the
window's loads) run once per copied element, not once per read."""


def pad_copies(root: Term) -> Term:
    """`root` with each padded read of an input or a stored buffer that reuses its
    elements (`PAD_COPY_REUSE`) rewritten to an unpadded read of a stored padded copy:
    `Read_m(x) = Read_m'(Store(Read_e(x)))`, `e` extending every axis of `x` to the range
    the forms span (pad outside), `m'` the forms shifted into that range. The same value
    at every index (tests/test_affine.py runs both through the interpreter and C)."""
    done: dict[int, Term] = {}
    for node in live_postorder(root):
        args = tuple(done.get(id(c), c) for c in node.args)
        new = node if args == node.args else Term(node.op, args, node.attrs)
        if new.op is Op.READ and read_map(new).pad is not None and new.args[0].op in (
                Op.IN, Op.STORE):
            new = _padded_copy(new)
        done[id(node)] = new
    return done.get(id(root), root)


def gather_stores(root: Term) -> Term:
    """`root` with the operand of each gather that is no buffer read (through `Split`s)
    stored first: `Gather(a, x, l) = Gather(a, Store(x), l)` (a `Store` is the identity),
    so a gather always loads from a buffer (extraction may drop a spec's `Store` under a
    gather: the value is then computed whole by a kernel of its own, never at a
    data-dependent index)."""
    done: dict[int, Term] = {}
    for node in live_postorder(root):
        args = tuple(done.get(id(c), c) for c in node.args)
        new = node if args == node.args else Term(node.op, args, node.attrs)
        if new.op is Op.GATHER:
            x = new.args[0]
            while x.op is Op.SPLIT:
                x = x.args[0]
            if x.op not in (Op.IN, Op.STORE):
                new = Term(Op.GATHER, (Store(new.args[0]), new.args[1]), new.attrs)
        done[id(node)] = new
    return done.get(id(root), root)


def _padded_copy(node: Term) -> Term:
    m, x = read_map(node), node.args[0]
    order = [a for a, _ in in_axes(x)] if x.op is Op.IN else list(x.shape)
    ext: dict[str, tuple[str, int, int]] = {}  # source axis -> (copy axis, low, size)
    for k, a in enumerate(order):
        lo, hi = m.span(a)
        lo, hi = min(lo, 0), max(hi, x.shape[a] - 1)
        # names sort in the operand's order (the copy's layout), carry the range (two
        # copies of one input with other ranges are other axes), and no spec can write
        ext[a] = (f"p{k:02d}.{-lo}.{hi}.{a}", lo, hi - lo + 1)
    if node.size() < PAD_COPY_REUSE * math.prod(n for _, _, n in ext.values()):
        return node
    copy = Read(x, {a: ({e: 1}, lo) for a, (e, lo, _) in ext.items()},
                {e: n for e, _, n in ext.values()}, m.pad)
    forms = {ext[a][0]: (dict(terms), c0 - ext[a][1]) for a, (terms, c0) in m.forms}
    return Read(Store(copy), forms, m.sizes)


def lower(term: Term, out_axes: tuple[str, ...] | list[str] | None = None) -> LoweredProgram:
    """Cut `term` at its `Store`s into kernels (dependencies first; the root is the last
    kernel, writing buffer `out` laid out as `out_axes`, default sorted).

    >>> from kernelsat.ir import In, Sum, exp
    >>> x = In("x", (("i", 4), ("n", 8)))
    >>> p = lower(Sum("n", exp(x)), ("i",))
    >>> len(p.kernels), p.kernels[0].stats.transcendentals
    (1, 32.0)
    """
    axes = tuple(out_axes) if out_axes is not None else tuple(term.shape)
    if sorted(axes) != sorted(term.shape):
        raise CodegenError(f"out_axes {axes} are not the axes {tuple(term.shape)} of the term")
    prog = LoweredProgram(term, axes)
    labels = {str(n.args[1].attrs[0]) for n in postorder(term) if n.op is Op.GATHER}
    for node in postorder(term):
        if node.op is Op.IN:
            name, dims = str(node.attrs[0]), input_dims(node)
            if name in prog.input_buffer:
                if prog.buffers[prog.input_buffer[name]].shape != dims:
                    raise CodegenError(f"input {name!r} read with two shapes: {node!r}")
                continue
            buf = f"in{len(prog.input_buffer)}"
            prog.input_buffer[name] = buf
            prog.buffers[buf] = BufferInfo(buf, "input", dims, user_name=name,
                                           dtype="i32" if name in labels else "f32")
    root = term
    while root.op is Op.STORE:
        root = root.args[0]
    root = gather_stores(pad_copies(root))
    for node in live_postorder(root):
        if node.op is Op.STORE and node is not root:
            buf = f"buf{len(prog.store_buffer)}"
            prog.store_buffer[node] = buf
            kaxes = tuple(node.shape)
            prog.buffers[buf] = BufferInfo(buf, "temp", tuple(node.shape[a] for a in kaxes), kaxes)
            prog.kernels.append(Kernel(len(prog.kernels), node.args[0], buf, kaxes, prog))
    prog.buffers["out"] = BufferInfo("out", "output", tuple(term.shape[a] for a in axes), axes)
    prog.kernels.append(Kernel(len(prog.kernels), root, "out", axes, prog))
    return prog
