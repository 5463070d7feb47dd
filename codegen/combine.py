"""Which accumulators a reduction loop carries and how two partial results of it merge,
read from the loop-nest IR (`kernelsat.codegen.loops`), for every renderer that splits a
reduction's iterations:

- CUDA splits a row's reduction over the lanes of a warp (`codegen/cuda.py`, checked
  by `cuda_emulate.combine_ok`);
- C splits a reduction loop that runs outside every OpenMP loop over the threads
  (`parallel_sums`, knob `psum`): each thread sums its contiguous share of the
  iterations into its own zeroed copy of the accumulators, and the copies are added
  to the accumulators in thread order afterwards, so the result does not depend on
  which thread finishes first (only on the thread count). Batch-norm's per-channel
  statistics over 262144 samples, or a column sum, ran on one thread before.

Sums, maxima and online pairs are split on the CPU: a sum's merge is an addition, a
reassociation (exact over the reals; in float32 a different rounding, which the float64
comparison checks like any other schedule); a maximum's is the larger of the parts,
exact; an online pair's (a running max and partners accumulated relative to it) rescales
both parts to the larger max, exact over the reals. The C merge is the CUDA one
(`CRenderer.merge`). A loop whose iterations each
write their own slots of arrays ("slot", `slot_states`) is split with no merge at all.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from kernelsat.codegen.loops import (
    Array,
    Assign,
    Call,
    Expr,
    Gemm,
    Let,
    Lit,
    Load,
    Loop,
    Ref,
    Stmt,
    Write,
    stmt_exprs,
)


@dataclass(frozen=True)
class Combine:
    """How one accumulator of a split reduction merges with another part's.

    kind: "sum" (add), "max" (the larger), "online" (a running max whose "scaled"
    partners were accumulated relative to it: merging rescales both sides by
    exp(own max - merged max)), "scaled" (one such partner; `by` names its max).
    size: 0 for a scalar, else the array length (merged element by element; an array
    of online maxima rescales its partners, arrays of its length, element by
    element)."""

    name: str
    kind: str
    size: int = 0
    by: str = ""


def walk(stmts: tuple[Stmt, ...]) -> Iterator[Stmt]:
    """Every statement under `stmts`, preorder (a `Gemm` through its plain loops)."""
    for s in stmts:
        yield s
        if isinstance(s, Loop):
            yield from walk(s.body)
        elif isinstance(s, Gemm):
            yield from walk(s.expand())


def refs(e: Expr) -> Iterator[str]:
    """The names of the scalars and local arrays `e` reads."""
    match e:
        case Ref(name, _):
            yield name
        case Load(_, _, _, _, labels):  # a gather's checked label (issue 18 part 3b)
            for lb in labels:
                if lb.value is not None:
                    yield from refs(lb.value)
        case Call(_, args):
            for a in args:
                yield from refs(a)


def declared(stmts: tuple[Stmt, ...]) -> set[str]:
    return {s.name for s in walk(stmts) if isinstance(s, Let | Array)}


def assigned(stmts: tuple[Stmt, ...]) -> set[str]:
    return {s.target.name for s in walk(stmts) if isinstance(s, Assign)}


def infer_combines(loop: Loop, decls: Mapping[str, Let | Array]) -> tuple[Combine, ...] | None:
    """The combine of each accumulator a reduction loop updates (`decls`: the
    declarations in scope before it), or None where one is not recognised (a store to a
    buffer inside, several updates of one name, an update of an unknown form, an
    accumulator declared outside `decls` or without a constant initial value)."""
    inner = declared(loop.body)
    states = sorted(assigned(loop.body) - inner)
    if not states or any(isinstance(s, Write) for s in walk(loop.body)):
        return None
    lets = {s.name: s.expr for s in walk(loop.body) if isinstance(s, Let)}

    def deps(e: Expr, seen: frozenset[str] = frozenset()) -> set[str]:
        out: set[str] = set()
        for n in refs(e):
            out.add(n)
            if n in lets and n not in seen:
                out |= deps(lets[n], seen | {n})
        return out

    updates: dict[str, list[Assign]] = {n: [] for n in states}
    for s in walk(loop.body):
        if isinstance(s, Assign) and s.target.name in updates:
            updates[s.target.name].append(s)
    kinds: dict[str, str] = {}
    for name in states:
        decl = decls.get(name)
        if decl is None or len(updates[name]) != 1:
            return None
        if isinstance(decl, Let) and not (decl.mutable and isinstance(decl.expr, Lit)):
            return None
        target, u = updates[name][0].target, updates[name][0].expr
        if isinstance(u, Call) and u.op == "select_gt" and target in u.args[2:]:
            kinds[name] = "max"
        elif isinstance(u, Call) and u.op in ("max", "add") and target in u.args:
            other = next(a for a in u.args if a != target)
            kinds[name] = ("max" if u.op == "max" else "sum") if name not in deps(other) \
                else "scaled"
        else:
            kinds[name] = "scaled"
    combines: list[Combine] = []
    online: set[str] = set()
    for name in states:
        size = decls[name].size if isinstance(decls[name], Array) else 0
        if kinds[name] != "scaled":
            continue
        u = updates[name][0].expr
        tops = [n for n in deps(u) if n != name and kinds.get(n) == "max"]
        if len(tops) != 1 or not _pairs_with(decls[tops[0]], size):
            return None
        online.add(tops[0])
        combines.append(Combine(name, "scaled", size, tops[0]))
    for name in states:
        size = decls[name].size if isinstance(decls[name], Array) else 0
        if kinds[name] == "max":
            combines.append(Combine(name, "online" if name in online else "max", size))
        elif kinds[name] == "sum":
            combines.append(Combine(name, "sum", size))
    return tuple(combines)


def _pairs_with(top: Let | Array, size: int) -> bool:
    """Whether a running max declared as `top` can rescale a partner of `size` (0: a
    scalar): a scalar max rescales a scalar or a whole array (an online softmax's output
    row); an array of maxima (one per vector lane or column: a column log-sum-exp)
    rescales an array of its length element by element, partner element k relative to
    max element k, which the interpreter's check of the split confirms
    (`cuda_emulate.combine_ok`) before a renderer uses it."""
    return not isinstance(top, Array) or top.size == size


PSUM_MIN_POINTS = 1 << 16
"""Fewest executions of a reduction loop's innermost statements worth a parallel region
(the region costs a few microseconds; 65536 updates take about ten)."""

SPLIT_KINDS: dict[str, float] = {"sum": 0.0, "max": float("-inf"), "online": float("-inf"),
                                  "scaled": 0.0}
"""The accumulators a reduction split over threads may carry, with the value each part
starts from (the merge's identity): sums (merged by addition), maxima (by the larger,
exact in float32 too), and online pairs: a running max (-inf) with its partners
accumulated relative to it (0), merged by rescaling both sides to the larger max
(log-sum-exp's rescaled sum, the softmax average's output row)."""

PSUM_CAP = 1024
"""Most accumulator floats a split reduction may carry: every thread keeps a copy, and
the partials of all threads live on the calling thread's stack."""


def points(stmts: tuple[Stmt, ...]) -> int:
    """Executions of the innermost statements of `stmts` (loop extents multiplied down
    each path, summed over the paths)."""
    total = 0
    for s in stmts:
        if isinstance(s, Loop):
            total += s.extent * max(points(s.body), 1)
        elif isinstance(s, Let | Assign | Write):
            total += 1
        elif isinstance(s, Gemm):
            total += points(s.expand())
    return total


def slot_states(loop: Loop, decls: Mapping[str, Let | Array]) -> tuple[Combine, ...] | None:
    """The arrays a loop writes one disjoint slot of per iteration (kind "slot": no
    merge), when every state the loop updates is such an array, else None. A slot
    write is the one update of an array declared before the loop, at an index whose
    coefficient of the loop variable exceeds the largest offset the rest of the index
    (variables of loops inside, nonnegative coefficients, no constant) can add, and no
    statement of the loop reads the array: the iterations are then independent (the
    one-pass squared deviations' per-block statistics, `Builder.blocked_sq_dev`)."""
    inner = declared(loop.body)
    states = sorted(assigned(loop.body) - inner)
    if not states or any(isinstance(s, Write | Gemm) for s in walk(loop.body)):
        return None
    extents = {s.var: s.extent for s in walk(loop.body) if isinstance(s, Loop)}
    read = {n for s in walk(loop.body) for e in stmt_exprs(s) for n in refs(e)}
    out: list[Combine] = []
    for name in states:
        decl = decls.get(name)
        ups = [s for s in walk(loop.body) if isinstance(s, Assign) and s.target.name == name]
        if not isinstance(decl, Array) or len(ups) != 1 or name in read:
            return None
        idx = ups[0].target.index
        if idx is None or idx.const:
            return None
        coef = dict(idx.terms)
        stride = coef.pop(loop.var, 0)
        if stride <= 0 or any(c < 0 or v not in extents for v, c in coef.items()):
            return None
        if sum(c * (extents[v] - 1) for v, c in coef.items()) >= stride:
            return None
        if stride * loop.extent > decl.size:
            return None
        out.append(Combine(name, "slot", decl.size))
    return tuple(out)


def parallel_sums(body: tuple[Stmt, ...]) -> dict[int, tuple[Combine, ...]]:
    """The top-level loops of a kernel body that the C renderer splits over threads
    (knob `psum`), by `id`, with their accumulators: reduction loops outside every
    other loop (so outside the kernel's OpenMP loop) whose accumulators are all sums,
    maxima or online pairs (`SPLIT_KINDS`; the C renderer splits an online one only where
    the interpreter's check accepts it, `c.checked_splits`), at most `PSUM_CAP` floats,
    or whose iterations each write their own slots (`slot_states`), doing at least
    `PSUM_MIN_POINTS` updates.

    >>> from kernelsat.codegen.loops import Affine
    >>> n = Affine.var("n")
    >>> acc = Let("acc0", Lit(0.0), mutable=True)
    >>> loop = Loop("n", 1 << 20, (Assign(Ref("acc0"), Call("add", (Ref("acc0"),
    ...     Load("in0", n)))),), "reduce")
    >>> [c.name for c in parallel_sums((acc, loop))[id(loop)]]
    ['acc0']
    >>> parallel_sums((acc, Loop("n", 8, loop.body, "reduce")))
    {}
    """
    decls: dict[str, Let | Array] = {}
    out: dict[int, tuple[Combine, ...]] = {}
    for s in body:
        if isinstance(s, Let | Array):
            decls[s.name] = s
        if not (isinstance(s, Loop) and s.kind == "reduce" and s.extent > 1):
            continue
        found = infer_combines(s, decls)
        if not (found and all(c.kind in SPLIT_KINDS for c in found)
                and sum(max(c.size, 1) for c in found) <= PSUM_CAP):
            found = slot_states(s, decls)
        if found and points((s,)) >= PSUM_MIN_POINTS:
            out[id(s)] = found
    return out


def psum_share(body: tuple[Stmt, ...]) -> float:
    """The share of a kernel body's innermost executions in `parallel_sums` loops."""
    total, split_loops = points(body), parallel_sums(body)
    split = sum(points((s,)) for s in body if id(s) in split_loops)
    return split / total if total else 0.0

