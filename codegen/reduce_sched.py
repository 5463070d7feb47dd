"""Schedule decisions of reductions (norms, softmax, log-sum-exp), read from the IR.

Three decisions, each recognised from the term's structure, never from a spec's name:

- **keep** (knob `keep`, default on where it applies): a node that holds a
  transcendental (softmax's `exp(x - max)`) is evaluated inside a reduction's operand
  over axis `a` and again elsewhere in the kernel (the output pass over the same
  axis). With `keep` the reduction pass stores each value into a per-row local array
  `keep[a]` and every later use at the same position reads it back: one `exp` per
  element instead of two. Legal when the row (the reduction's extent) fits `KEEP_CAP`
  floats and the reduction carries no vector accumulators (one row at a time).
- **hoist**: inside an intra-tile (vectorized) output loop, an elementwise node that
  depends on a reduction's result and on the tile variables only (batchnorm's
  `sqrt(var[c] + eps)` per channel) would be recomputed at every step of the loops it
  does not depend on; it is computed once into a local array over the tile instead.
- **transposed reductions** (default tiles): a reduction over an axis that is not the
  stride-1 axis of what it reads, while an output axis is (per-channel statistics of a
  samples x channels matrix), gets that output axis tiled, so the reduction runs with
  vector accumulators over contiguous channels instead of striding through memory once
  per channel (batchnorm 262144x64: 10x faster than the untiled default): by the whole
  axis when it fits TILE_CAP, else by TILE_CAP; where that does not divide the extent,
  the nest runs the whole tiles and then the rest as one shorter tile (`_Builder.build`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from kernelsat.ir import Term
from kernelsat.ops import REDUCTIONS, TRANSCENDENTAL, Op

if TYPE_CHECKING:
    from kernelsat.codegen.lower import Kernel

KEEP_CAP = 16384
"""Largest row (floats, 64 KiB of stack) a `keep` array may hold."""

KEEP_OPS = frozenset({Op.SUM, Op.RMAX, Op.LSE, Op.DOT})
"""Reductions whose operand pass may keep its values (the ones `reduction` lowers)."""

TILE_CAP = 64
"""Largest intra-tile extent (floats) chosen for a transposed reduction's output axis."""


def _subterms(t: Term) -> list[Term]:
    """Nodes of `t` within its kernel (a `Store` is a leaf), `t` included."""
    out: dict[int, Term] = {}
    stack = [t]
    while stack:
        n = stack.pop()
        if id(n) in out:
            continue
        out[id(n)] = n
        if n.op is not Op.STORE:
            stack.extend(n.args)
    return list(out.values())


def _costly(t: Term) -> bool:
    """`t` evaluates a transcendental within its kernel."""
    return any(n.op in TRANSCENDENTAL for n in _subterms(t))


def _outside(root: Term, skip: Term) -> set[int]:
    """ids of the nodes reachable from `root` without entering `skip` (nor a `Store`)."""
    seen: set[int] = set()
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in seen or n is skip:
            continue
        seen.add(id(n))
        if n.op is not Op.STORE:
            stack.extend(n.args)
    return seen


def keep_candidates(root: Term) -> dict[int, tuple[Term, list[Term]]]:
    """For each reduction of the kernel `root` (by id) that `keep` applies to: the
    reduction and the topmost nodes of its operand that depend on its axis, evaluate a
    transcendental and are also used outside it. Empty when no reduction qualifies."""
    out: dict[int, tuple[Term, list[Term]]] = {}
    for r in _subterms(root):
        if r.op not in KEEP_OPS:
            continue
        a = r.axis
        inside = [u for arg in r.args for u in _subterms(arg)
                  if a in u.shape and u.op not in REDUCTIONS and u.op is not Op.STORE]
        if not inside:
            continue
        outside = _outside(root, r)
        shared = {id(u): u for u in inside if id(u) in outside and _costly(u)}
        if not shared:
            continue
        below = {id(c) for u in shared.values() for c in _subterms(u) if c is not u}
        out[id(r)] = (r, [u for k, u in shared.items() if k not in below])
    return out


def keep_space(kernel: Kernel) -> dict[str, tuple[bool, ...]]:
    """The `keep` knob where some reduction of the kernel has a value worth keeping and
    its row fits `KEEP_CAP` (on by default: it saves one transcendental per element)."""
    cands = kernel.keep_candidates()
    nodes = {id(n): n for n in _subterms(kernel.term)}
    if any(_row(nodes[k]) <= KEEP_CAP for k in cands):
        return {"keep": (True, False)}
    return {}


def _row(r: Term) -> int:
    """The extent of reduction `r`'s axis."""
    for c in r.args:
        if r.axis in c.shape:
            return c.shape[r.axis]
    return 1


def transposed_tiles(kernel: Kernel, nodes: Iterable[Term], tiles: dict[str, int]) -> list[str]:
    """Tile output axes for reductions that read their axis with a stride (see the module
    docstring); updates `tiles` in place and returns the axes it tiled."""
    shape = kernel.term.shape
    done: list[str] = []
    for r in nodes:
        if r.op not in REDUCTIONS or not set(r.shape) <= set(shape):
            continue
        for read in _subterms(r):
            base = read
            while base.op is Op.SPLIT:
                base = base.args[0]
            if base.op not in (Op.IN, Op.STORE) or r.axis not in read.shape:
                continue
            last = kernel.last_axis(read)
            if last == r.axis or last not in r.shape or last not in tiles:
                continue
            if tiles[last] > 1:
                continue
            n = shape[last]
            # the whole axis when it fits, else TILE_CAP with a shorter last tile where it
            # does not divide (a prime extent once fell back to one strided scalar loop
            # per channel, 3-5x slower per element; and batchnorm 65536x1008 ran 389 ms
            # with 16-wide tiles, 65536x1001 275 ms with 64 and a rest)
            t = min(n, TILE_CAP)
            if t > 1:
                tiles[last] = t
                done.append(last)
    return done


def hoist_vars(needed: frozenset[str], vector_ok: list[str], bound_q: frozenset[str],
               bound_target: frozenset[str], extent: dict[str, int], cap: int) -> list[str]:
    """The tile variables a hoisted array runs over, or [] when hoisting does not apply:
    it applies when the node needs some tile variable not bound at its outer home, and
    the innermost scope binds a loop the node does not depend on (it would be recomputed
    there)."""
    vec = [v for v in vector_ok if v in needed and v not in bound_q]
    if not vec or not (bound_target - bound_q - needed):
        return []
    if math.prod(extent[v] for v in vec) > cap:
        return []
    return vec


def has_reduction(t: Term) -> bool:
    """`t`'s kernel-local subterms include a reduction (it is per-row state)."""
    return any(n.op in REDUCTIONS for n in _subterms(t))


# -- one-pass squared deviations (knob `welford`) ------------------------------------

WELFORD_MIN_BYTES = 1 << 20
"""Data one squared-deviation reduction sweeps (per output slice) from which its
one-pass form is the default: past a core's L2 on the machines here, the second pass of
the two-pass form reads it again from L3 or DRAM (the schedule model ranks both)."""

WELFORD_OFFER_BYTES = 256 << 10
"""Smallest such sweep for which knob `welford` is offered at all."""

WELFORD_BLOCK_BYTES = 128 << 10
"""Data of one block: small enough that its second sweep hits L2."""

WELFORD_CAP = 16384
"""Most floats each block-statistics array may hold (two of them live on the stack)."""


def sq_dev(r: Term) -> tuple[Term, Term] | None:
    """(x, k) where `r` is `Sum_a((x - k) * (x - k))`, `x` depends on `a` and `k` does
    not (its axes are among x's): a sum of squared deviations, such as a variance's
    `Sum_a((x - mean_a x)^2)`. None otherwise."""
    if r.op is not Op.SUM or r.args[0].op is not Op.MUL:
        return None
    d, e = r.args[0].args
    if d is not e or d.op is not Op.SUB:
        return None
    x, k = d.args
    a = r.axis
    if a not in x.shape or a in k.shape or not set(k.shape) <= set(x.shape):
        return None
    if any(n.op in REDUCTIONS and a in n.shape for n in _subterms(x)):
        return None  # x itself reduces over a: each block would recompute it
    return x, k


def _unreduced(root: Term) -> dict[int, Term]:
    """The nodes of a kernel reachable from `root` without entering the operand of a
    reduction (reductions themselves included), by id: computed once per element of
    their scope, not once per step of some other reduction."""
    out: dict[int, Term] = {}
    stack = [root]
    while stack:
        n = stack.pop()
        if id(n) in out:
            continue
        out[id(n)] = n
        if n.op is not Op.STORE and n.op not in REDUCTIONS:
            stack.extend(n.args)
    return out


def welford_reductions(root: Term) -> list[tuple[Term, Term, Term, Term | None]]:
    """The squared-deviation reductions of the kernel `root` that are not inside another
    reduction's operand: (reduction, x, k, `Sum_a(x)` or None). The sum is given where k
    is an elementwise function of it (a mean: `Sum_a(x) / n`): the one-pass form then
    computes it too, so the mean's pass and the deviations' pass become one."""
    out = []
    for r in _unreduced(root).values():
        got = sq_dev(r)
        if got is not None:
            x, k = got
            s = Term(Op.SUM, (x,), (r.axis,))
            out.append((r, x, k, s if id(s) in _unreduced(k) else None))
    return out


def welford_blocks(n: int, step_floats: int) -> tuple[int, ...]:
    """Block lengths for a one-pass reduction of extent `n` whose every step reads
    `step_floats` floats: divisors of n giving at least 4 blocks, the one nearest
    `WELFORD_BLOCK_BYTES` of data first, then one 4x shorter and one 4x longer."""
    divs = [b for b in range(16, n // 4 + 1) if n % b == 0
            and (n // b) * step_floats <= WELFORD_CAP]
    if not divs:
        return ()
    target = max(WELFORD_BLOCK_BYTES // (4 * step_floats), 16)
    out: list[int] = []
    for t in (target, target // 4, target * 4):
        best = min(divs, key=lambda b: (abs(math.log(b / max(t, 1))), b))
        if best not in out:
            out.append(best)
    return tuple(out)


def welford_space(kernel: Kernel, tiles: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """Knob `welford`: the block length of the one-pass squared deviations (0: the
    two-pass form), offered where a squared-deviation reduction sweeps at least
    `WELFORD_OFFER_BYTES` per output slice; on by default where it sweeps at least
    `WELFORD_MIN_BYTES` and the kernel also computes the sum it would share. `tiles`:
    the default intra-tile extents (what one step's vector accumulators span)."""
    best: tuple[tuple[int, ...], bool] | None = None
    for r, x, _k, s in welford_reductions(kernel.term):
        n = x.shape[r.axis]
        step = math.prod(tiles.get(b, 1) for b in x.shape if b != r.axis)
        if 4 * n * step < WELFORD_OFFER_BYTES:
            continue
        blocks = welford_blocks(n, step)
        if blocks:
            on = s is not None and 4 * n * step >= WELFORD_MIN_BYTES
            if best is None or (on and not best[1]):
                best = (blocks, on)
    if best is None:
        return {}
    blocks, on = best
    return {"welford": (*blocks, 0) if on else (0, *blocks)}
