"""A float64 Python interpreter of the loop-nest IR, and of the CUDA row mapping.

Two users:

- `CUDARenderer` asks `combine_ok` whether a reduction loop's accumulators may be split
  across the lanes of a warp (each lane runs every G-th iteration from the initial
  state) and merged afterwards with the inferred combine (`Combine`). The answer comes
  from running the loop's body on pseudo-random data here, once sequentially and once
  split over lanes, and comparing: a construct the inference misreads is refused (the
  loop then runs whole in every lane), never rendered wrong.
- tests run a whole lowered program under the row mapping (`cuda.emulate`, built on
  this interpreter): every lane of
  every row, the lane-strided loops, the butterfly combine with its real xor partners,
  and the per-warp shared-memory step of the block mapping, against the float64
  reference. This checks the mapping's index math and combines on the CPU; nvcc checks
  that the CUDA text it renders compiles.

The interpreter is slow (one Python call per scalar operation): small sizes only.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernelsat.codegen.combine import Combine
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
)
from kernelsat.ops import BY_NAME, OPS

Env = dict[str, Any]
"""Loop variables (int), scalars (float) and arrays (float64 numpy arrays) by name."""


class Budget(Exception):
    """The interpreter ran past its step budget."""


def _gather_check(v: float, bound: float, slot: float, pos: float) -> float:
    """The rendered `ks_gather_check`: the label, or an error for one out of range."""
    if not 0 <= v < bound:
        raise IndexError(f"label {v:g} at position {pos:g} of input slot {slot:g} outside "
                         f"[0, {bound:g})")
    return v


def _op_table() -> dict[str, Callable[..., float]]:
    table: dict[str, Callable[..., float]] = {}
    for name, op in BY_NAME.items():
        fn = OPS[op].numpy
        if fn is not None:
            table[name] = (lambda f: lambda *a: float(f(*(np.float64(x) for x in a))))(fn)
    table["select_gt"] = lambda a, b, c, d: c if a > b else d
    table.update({v: table[of] for v, of in VARIANT_OF.items()})  # the same value
    table["gather_check"] = _gather_check
    return table


OPS_F64 = _op_table()
"""Each op of the loop IR in float64 (the op table's numpy semantics, and the selects)."""


def index(idx: Affine, env: Env) -> int:
    return int(sum(c * env[v] for v, c in idx.terms) + idx.const)


def _checked_label(load: Callable[[str, int], float], value: Callable[[Expr], float],
                   lb: Label, env: Env) -> int:
    """A gather's label (issue 18 part 3b), checked as the rendered `ks_label` checks it."""
    if lb.value is not None:  # checked once per row by the `gather_check` call
        return lb.stride * int(value(lb.value))
    v = load(lb.buf, index(lb.index, env))
    if not 0 <= v < lb.bound:
        raise IndexError(f"label {lb.buf}[{index(lb.index, env)}] = {v:g} outside "
                         f"[0, {lb.bound})")
    return lb.stride * int(v)


@dataclass
class Interp:
    """Runs statements on an environment. `load(buf, i)` reads buffers; `write(buf, i, v)`
    stores (None: writes are dropped); `outer(name, i)` gives the value of a name the
    statements use but never define (None: an undefined name raises)."""

    load: Callable[[str, int], float]
    write: Callable[[str, int, float], None] | None = None
    outer: Callable[[str, int | None], float] | None = None
    steps: int = 10**9

    def expr(self, e: Expr, env: Env) -> float:
        match e:
            case Lit(v):
                return float(v)
            case Ref(name, None):
                if name not in env:
                    return self._outer(name, None)
                return float(env[name])
            case Ref(name, idx):
                assert idx is not None
                if name not in env:
                    return self._outer(name, index(idx, env))
                return float(env[name][index(idx, env)])
            case Load(buf, idx, guard, pad) if guard and not all(
                    0 <= index(g, env) < n for g, n in guard):
                return float(pad)  # a padded affine read outside its operand
            case Load(buf, idx, _, _, labels) if labels:  # a gather
                at = index(idx, env) + sum(
                    _checked_label(self.load, lambda e: self.expr(e, env), lb, env)
                    for lb in labels)
                return self.load(buf, at)
            case Load(buf, idx):
                return self.load(buf, index(idx, env))
            case IndexValue(idx):
                return float(index(idx, env))
            case Call(op, args):
                self.steps -= 1
                if self.steps < 0:
                    raise Budget
                with np.errstate(all="ignore"):
                    return OPS_F64[op](*(self.expr(a, env) for a in args))
        raise AssertionError(f"not an expression: {e!r}")

    def _outer(self, name: str, i: int | None) -> float:
        if self.outer is None:
            raise KeyError(f"undefined name {name!r}")
        return self.outer(name, i)

    def run(self, stmts: tuple[Stmt, ...], env: Env) -> None:
        for s in stmts:
            self.stmt(s, env)

    def stmt(self, s: Stmt, env: Env) -> None:
        match s:
            case Let(name, expr, _):
                env[name] = self.expr(expr, env)
            case Array(name, size, init):
                env[name] = np.full(size, float(init))
            case Assign(Ref(name, None), expr):
                env[name] = self.expr(expr, env)
            case Assign(Ref(name, idx), expr):
                assert idx is not None
                value = self.expr(expr, env)
                env[name][index(idx, env)] = value
            case Write(buf, idx, expr):
                value = self.expr(expr, env)
                if self.write is not None:
                    self.write(buf, index(idx, env), value)
            case Loop(var, extent, body, _, _):
                for v in range(extent):
                    env[var] = v
                    self.run(body, env)
            case _:
                raise AssertionError(f"not a statement: {s!r}")

    def iterations(self, loop: Loop, its: range | list[int], env: Env) -> None:
        """Run `loop`'s body for the iteration values `its` only."""
        for v in its:
            env[loop.var] = v
            self.run(loop.body, env)


# -- combines ---------------------------------------------------------------------


def _pair_max(a: Any, b: Any) -> Any:
    """The larger of two maxima (element by element for arrays of them)."""
    if isinstance(a, np.ndarray):
        return np.where(b > a, b, a)
    return b if b > a else a


def _rescale(m: Any, top: Any) -> Any:
    """exp(m - top), exactly 1 where m is the top (so -inf against -inf is 1, not NaN)."""
    if isinstance(m, np.ndarray):
        with np.errstate(invalid="ignore"):
            return np.where(m == top, 1.0, np.exp(m - top))
    return 1.0 if m == top else math.exp(m - top)


def merge(combines: tuple[Combine, ...], mine: Env, other: Mapping[str, Any]) -> None:
    """`mine` <- combine(mine, other), as the CUDA combine code computes it."""
    tops = {c.name: _pair_max(mine[c.name], other[c.name])
            for c in combines if c.kind == "online"}
    for c in combines:
        a, b = mine[c.name], other[c.name]
        if c.kind == "sum":
            mine[c.name] = a + b
        elif c.kind == "max":
            mine[c.name] = _pair_max(a, b)
        elif c.kind == "scaled":
            top = tops[c.by]
            ca, cb = _rescale(mine[c.by], top), _rescale(other[c.by], top)
            mine[c.name] = a * ca + b * cb
    for name, top in tops.items():
        mine[name] = top


def _copy(env: Env) -> Env:
    return {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in env.items()}


def _close(a: Any, b: Any, rel: float = 1e-9) -> bool:
    x, y = np.atleast_1d(np.asarray(a, float)), np.atleast_1d(np.asarray(b, float))
    if x.shape != y.shape or not (np.isfinite(x).all() and np.isfinite(y).all()):
        return bool(x.shape == y.shape and np.array_equal(x, y, equal_nan=True))
    return bool(np.abs(x - y).max() <= rel * (1.0 + np.abs(y).max()))


def _noise(*key: object) -> float:
    """A fixed pseudo-random value in [-2, 2) per key."""
    h = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little") / 2**64 * 4.0 - 2.0


def _loops(stmts: tuple[Stmt, ...]) -> list[Loop]:
    out: list[Loop] = []
    for s in stmts:
        if isinstance(s, Loop):
            out += [s, *_loops(s.body)]
    return out


def _expr_indexes(e: Expr) -> list[Affine]:
    match e:
        case Ref(_, None):
            return []
        case Ref(_, idx) | Load(_, idx):
            assert idx is not None
            return [idx]
        case IndexValue(idx):
            return [idx]
        case Call(_, args):
            return [i for a in args for i in _expr_indexes(a)]
    return []


def _indexes(stmts: tuple[Stmt, ...]) -> list[Affine]:
    """Every affine index the statements use."""
    out: list[Affine] = []
    for s in stmts:
        match s:
            case Let(_, expr, _):
                out += _expr_indexes(expr)
            case Assign(target, expr):
                out += _expr_indexes(target) + _expr_indexes(expr)
            case Write(_, idx, expr):
                out += [idx, *_expr_indexes(expr)]
            case Loop(_, _, body, _, _):
                out += _indexes(body)
    return out


def initial_state(decls: Mapping[str, Let | Array], names: list[str]) -> Env:
    """The starting values of the accumulators `names` (constant-initialised scalars and
    filled arrays, as `combine.infer_combines` requires), for `combine_ok`."""
    out: Env = {}
    for n in names:
        d = decls[n]
        if isinstance(d, Array):
            out[n] = np.full(d.size, float(d.init))
        else:
            assert isinstance(d.expr, Lit)
            out[n] = float(d.expr.value)
    return out


def combine_ok(loop: Loop, init: Env, combines: tuple[Combine, ...], *,
               lanes: int = 3, iterations: int = 12, steps: int = 200_000) -> bool:
    """Whether splitting `loop` over `lanes` (iteration r to lane r % lanes, each lane
    from the initial state `init`) and merging with `combines` gives the sequential
    result, on pseudo-random loads and outer values; also that merging with an idle
    lane (the initial state) changes nothing and that merging is symmetric (every lane
    of a butterfly must end with the same value). False where the body runs past
    `steps` operations."""
    its = list(range(min(loop.extent, iterations)))
    if len(its) < 2:
        return False
    interp = Interp(load=lambda b, i: _noise("load", b, i),
                    outer=lambda n, i: _noise("outer", n, i), steps=steps)
    bound = {s.var for s in _loops((loop,))}
    free = {v for e in _indexes((loop,)) for v in e.vars} - bound
    init = {**{v: 1 + len(v) % 3 for v in free}, **init}  # enclosing loop variables
    try:
        whole = _copy(init)
        interp.iterations(loop, its, whole)
        parts = []
        for lane in range(lanes):
            part = _copy(init)
            interp.iterations(loop, its[lane::lanes], part)
            parts.append(part)
    except (Budget, KeyError, IndexError, OverflowError, ZeroDivisionError):
        return False
    names = [c.name for c in combines]
    ab, ba = _copy(parts[0]), _copy(parts[1])
    merge(combines, ab, parts[1])
    merge(combines, ba, parts[0])
    idle = _copy(parts[0])
    merge(combines, idle, init)
    total = _copy(ab)
    for p in parts[2:]:
        merge(combines, total, p)
    return all(_close(ab[n], ba[n], 1e-12) and _close(idle[n], parts[0][n], 1e-12)
               and _close(total[n], whole[n]) for n in names)


# -- the whole program under the CUDA row mapping ------------------------------------------
