"""A kernel with no rows, cut into launches for the GPU.

The CUDA renderer maps a kernel's leading parallel loops to its rows (`cuda.thread_loops`).
A kernel whose body starts with anything else has one row: one thread, one warp or one
block runs all of it, however much work it holds. That is every kernel whose statistics
are computed at its top level before a parallel pass uses them: batch norm's
per-channel sums over 262144 samples (split over blocks of samples, `welford`), then the
normalisation of every sample. On a CPU such a body runs under one OpenMP region; on a
GPU one block is one of a hundred-odd multiprocessors.

`device_nests` cuts such a body, at its top-level statements, into *phases*, one launch
each, in order (launches on one stream run one after another, so each phase sees all
the writes of the ones before):

- a *wide* phase is one top-level loop whose iterations are independent: a parallel
  loop that assigns nothing declared outside it, or a loop whose iterations each write
  their own slots of arrays (`combine.slot_states`). It becomes the phase's row loop,
  so its iterations spread over the grid, and its body is mapped by `cuda.rows` as any
  row body is;
- a *serial* phase is a run of the other top-level statements, run as one row, as the
  whole kernel was before (a reduction in it is still split over the row's lanes).

What one phase declares at the top level and another reads lives in global *scratch*
memory (`ks_k<kernel>_<name>`, one float per scalar): a wide phase reads and writes it
directly (its iterations write disjoint slots and read none of them); a serial phase
keeps its own declarations local, as before (every lane computes them), and *publishes*
what later phases read at its end, reads earlier phases' scratch directly, and copies
into a local what it updates but an earlier phase declared. A serial phase therefore
never reads global memory that it writes itself, and no lane reads what another lane of
the same launch wrote. Nothing changes for a kernel with rows, a GEMM, the fused
attention kernel, or a body with no wide loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence

from kernelsat.codegen.combine import (
    PSUM_CAP,
    PSUM_MIN_POINTS,
    SPLIT_KINDS,
    Combine,
    assigned,
    declared,
    infer_combines,
    points,
    refs,
    slot_states,
    walk,
)
from kernelsat.codegen.cuda_emulate import combine_ok, initial_state
from kernelsat.codegen.loops import (
    Affine,
    Array,
    Assign,
    Call,
    Expr,
    Gemm,
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
)

SCALAR = Affine()
"""The index of a scalar's one float in its scratch buffer."""


def scratch_name(kernel: int, name: str) -> str:
    """The global buffer holding kernel `kernel`'s top-level `name` between phases."""
    return f"ks_k{kernel}_{name}"


def wide(s: Stmt, decls: Mapping[str, Let | Array]) -> bool:
    """Whether the top-level statement `s` is a loop whose iterations can run on
    different blocks (`decls`: the top-level declarations before it)."""
    if not isinstance(s, Loop) or s.extent <= 1:
        return False
    if any(isinstance(x, Gemm) for x in walk(s.body)):
        return False
    if s.kind in ("parallel", "tile"):
        return not (assigned(s.body) - declared(s.body))
    return s.kind == "reduce" and slot_states(s, decls) is not None


def _expr(e: Expr, to: Mapping[str, str]) -> Expr:
    """`e` with each `Ref` to a name in `to` read from its scratch buffer instead."""
    match e:
        case Ref(name, index) if name in to:
            return Load(to[name], index if index is not None else SCALAR)
        case Load(buf, index, guard, pad, labels) if any(lb.value is not None for lb in labels):
            return Load(buf, index, guard, pad, tuple(
                dataclasses.replace(lb, value=_expr(lb.value, to)) if lb.value is not None
                else lb for lb in labels))
        case Call(op, args):
            return Call(op, tuple(_expr(a, to) for a in args))
        case _:
            return e


def _stmt(s: Stmt, to: Mapping[str, str]) -> Stmt:
    """`s` with the names in `to` read from and written to their scratch buffers."""
    match s:
        case Let(name, expr, _) if name in to:
            return Write(to[name], SCALAR, _expr(expr, to))
        case Let(name, expr, mutable):
            return Let(name, _expr(expr, to), mutable)
        case Assign(Ref(name, index), expr) if name in to:
            return Write(to[name], index if index is not None else SCALAR, _expr(expr, to))
        case Assign(target, expr):
            return Assign(target, _expr(expr, to))
        case Write(buf, index, expr, stream):
            return Write(buf, index, _expr(expr, to), stream)
        case Loop(var, extent, body, kind, axis):
            return Loop(var, extent, tuple(_stmt(x, to) for x in body), kind, axis)
        case _:
            return s


def _names(stmts: Sequence[Stmt]) -> set[str]:
    """Every scalar or local array `stmts` read or assign."""
    out = set(assigned(tuple(stmts)))
    for s in walk(tuple(stmts)):
        for e in stmt_exprs(s):
            out.update(refs(e))
    return out


def buffers_of(stmts: Sequence[Stmt]) -> tuple[str, ...]:
    """The buffers `stmts` read (in order of appearance), then those they write."""
    reads: dict[str, None] = {}
    writes: dict[str, None] = {}

    def loads(e: Expr) -> Iterator[str]:
        match e:
            case Load(buf, _, _, _, labels):
                yield buf
                for lb in labels:
                    yield lb.buf
                    if lb.value is not None:
                        yield from loads(lb.value)
            case Call(_, args):
                for a in args:
                    yield from loads(a)

    for s in walk(tuple(stmts)):
        for e in stmt_exprs(s):
            reads.update(dict.fromkeys(loads(e)))
        if isinstance(s, Write):
            writes[s.buf] = None
    return (*(b for b in reads if b not in writes), *writes)


def _size(decl: Let | Array) -> int:
    return decl.size if isinstance(decl, Array) else 1


def _copy(name: str, decl: Let | Array, buf: str, tag: str, publish: bool) -> Stmt:
    """Publish a local to its scratch buffer (lane-split loop: every lane holds the same
    values), or (`publish` False) the statement that loads it back into a local."""
    if isinstance(decl, Let):
        if publish:
            return Write(buf, SCALAR, Ref(name))
        return Let(name, Load(buf, SCALAR), mutable=True)
    var = f"ks_{tag}"
    i = Affine.var(var)
    if publish:
        return Loop(var, decl.size, (Write(buf, i, Ref(name, i)),), "parallel")
    return Loop(var, decl.size, (Assign(Ref(name, i), Load(buf, i)),), "serial")


def phases(kernel: int, body: tuple[Stmt, ...]) -> tuple[list[tuple[Stmt, ...]], dict[str, int]]:
    """The phase bodies of a row-less kernel body (one, `body` itself, where it has no
    wide loop) and the scratch buffers they share (name -> floats)."""
    decls: dict[str, Let | Array] = {}
    groups: list[tuple[bool, list[Stmt]]] = []
    for s in body:
        if isinstance(s, Let | Array):
            decls[s.name] = s
        if wide(s, decls):
            groups.append((True, [s]))
        elif groups and not groups[-1][0]:
            groups[-1][1].append(s)
        else:
            groups.append((False, [s]))
    if not any(w for w, _ in groups) or len(groups) < 2:
        return [body], {}
    owner = {s.name: g for g, (_, stmts) in enumerate(groups) for s in stmts
             if isinstance(s, Let | Array)}
    used = [_names(stmts) for _, stmts in groups]
    shared = {n for g, names in enumerate(used) for n in names if owner.get(n, g) != g}
    to = {n: scratch_name(kernel, n) for n in sorted(shared)}
    later = [set().union(*used[g + 1:]) for g in range(len(groups))]
    out: list[tuple[Stmt, ...]] = []
    for g, (is_wide, stmts) in enumerate(groups):
        if is_wide:
            (loop,) = stmts
            assert isinstance(loop, Loop)
            out.append((_stmt(dataclasses.replace(loop, kind="parallel"), to),))
            continue
        mine = {s.name for s in stmts if isinstance(s, Let | Array)}
        updates = assigned(tuple(stmts)) & shared - mine
        direct = {n: b for n, b in to.items() if n not in mine and n not in updates}
        head: list[Stmt] = []
        for k, n in enumerate(sorted(updates)):  # an earlier phase's, updated here
            decl = decls[n]
            if isinstance(decl, Array):
                head.append(dataclasses.replace(decl, fill=False))
            head.append(_copy(n, decl, to[n], f"in{k}", publish=False))
        kept: list[Stmt] = []
        dropped: set[str] = set()
        for s in stmts:
            if isinstance(s, Array) and s.name in shared and s.name not in used[g]:
                dropped.add(s.name)  # declared here, first used later
                if s.fill:
                    var = f"ks_fill{len(kept)}"
                    kept.append(Loop(var, s.size, (Write(to[s.name], Affine.var(var),
                                                         Lit(s.init)),), "parallel"))
                continue
            kept.append(_stmt(s, direct))
        tail = [_copy(n, decls[n], to[n], f"out{k}", publish=True) for k, n in
                enumerate(sorted((mine | updates) & shared & later[g] - dropped))]
        if head or kept or tail:
            out.append((*head, *kept, *tail))
    sizes = {to[n]: _size(decls[n]) for n in to}
    return out, sizes


# -- a top-level reduction over the grid ------------------------------------------------

GRID_CHUNKS = 1024
"""Most chunks a top-level reduction is split into (one row each: the partials' merge
runs on one row, one chunk after another)."""

GRID_MIN_CHUNK = 16
"""Fewest iterations of the reduction per chunk."""

GRID_KINDS = ("sum", "max", "online", "scaled")
"""The combines split over the grid: sums, maxima, and online pairs (a running max, or an
array of them, with partners accumulated relative to it), merged by rescaling both
sides to the larger max (`_merges`)."""


def chunks(extent: int) -> int:
    """How many equal chunks a reduction of `extent` iterations is split into: the
    largest divisor of `extent` of at most `GRID_CHUNKS` leaving each chunk at least
    `GRID_MIN_CHUNK` iterations (1: no split; a prime extent is not split)."""
    best = 1
    for g in range(2, min(GRID_CHUNKS, extent // GRID_MIN_CHUNK) + 1):
        if extent % g == 0:
            best = g
    return best


def _affine(a: Affine, sub: Mapping[str, Affine]) -> Affine:
    out = Affine((), a.const)
    for v, c in a.terms:
        out = out + (sub[v].scale(c) if v in sub else Affine(((v, c),)))
    return out


def _rename_expr(e: Expr, sub: Mapping[str, Affine], names: Mapping[str, str]) -> Expr:
    """`e` with loop variables replaced by affine forms (`sub`) and names renamed."""
    def idx(a: Affine | None) -> Affine | None:
        return None if a is None else _affine(a, sub)

    match e:
        case Ref(name, index):
            return Ref(names.get(name, name), idx(index))
        case Load(buf, index, guard, pad, labels):
            return Load(buf, _affine(index, sub), tuple((_affine(g, sub), n) for g, n in guard),
                        pad, tuple(Label(lb.buf, _affine(lb.index, sub), lb.bound, lb.stride,
                                         lb.slot, None if lb.value is None
                                         else _rename_expr(lb.value, sub, names))
                                   for lb in labels))
        case IndexValue(index):
            return IndexValue(_affine(index, sub))
        case Call(op, args):
            return Call(op, tuple(_rename_expr(a, sub, names) for a in args))
        case _:
            return e


def _rename(s: Stmt, sub: Mapping[str, Affine], names: Mapping[str, str]) -> Stmt:
    def ex(e: Expr) -> Expr:
        return _rename_expr(e, sub, names)

    match s:
        case Let(name, expr, mutable):
            return Let(names.get(name, name), ex(expr), mutable)
        case Array(name, size, init, fill):
            return Array(names.get(name, name), size, init, fill)
        case Assign(target, expr):
            renamed = ex(target)
            assert isinstance(renamed, Ref)
            return Assign(renamed, ex(expr))
        case Write(buf, index, expr, stream):
            return Write(buf, _affine(index, sub), ex(expr), stream)
        case Loop(var, extent, body, kind, axis):
            return Loop(var, extent, tuple(_rename(x, sub, names) for x in body), kind, axis)
    raise AssertionError(f"no rename for {s!r}")


def _merge(c: Combine, acc: Ref, part: Expr) -> Assign:
    if c.kind == "sum":
        return Assign(acc, Call("add", (acc, part)))
    return Assign(acc, Call("select_gt", (part, acc, part, acc)))


def _rescale(m: Expr, top: Expr) -> Expr:
    """exp(m - top) for m <= top, exactly 1 where m is the top (so an idle side at -inf
    against a top at -inf gives 1, not exp(NaN))."""
    return Call("exp_nonpos", (Call("select_gt", (top, m, Call("sub", (m, top)), Lit(0.0))),))


def _merges(found: tuple[Combine, ...], acc: Callable[[str, Affine | None], Ref],
            part: Callable[[str, Affine | None], Expr], tag: int) -> list[Stmt]:
    """The statements merging one part (`part(name, element)`, element None for a
    scalar) into the accumulators (`acc(name, element)`): sums added, maxima the larger,
    online pairs rescaled to the larger max (`cuda_emulate.merge`'s arithmetic; an array
    of maxima element by element, each rescaling its partners' element)."""
    xv, yv = f"ks_el{tag}", f"ks_row{tag}"
    x = Affine.var(xv)
    out: list[Stmt] = []
    for c in found:
        if c.kind in ("sum", "max"):
            out.append(_merge(c, acc(c.name, None), part(c.name, None)) if not c.size else
                       Loop(xv, c.size, (_merge(c, acc(c.name, x), part(c.name, x)),),
                            "vector"))
    for c in found:
        if c.kind != "online":
            continue
        el = x if c.size else None
        top, ca, cb = (f"ks_{n}{tag}_{c.name}" for n in ("top", "ca", "cb"))
        m, om = acc(c.name, el), part(c.name, el)
        group: list[Stmt] = [Let(top, Call("select_gt", (om, m, om, m))),
                             Let(ca, _rescale(m, Ref(top))), Let(cb, _rescale(om, Ref(top)))]
        for q in found:
            if q.kind != "scaled" or q.by != c.name:
                continue
            if q.size and not c.size:  # a scalar max rescaling a whole row
                group.append(Loop(yv, q.size, (_rescaled(q, acc, part, Affine.var(yv), ca,
                                                         cb),), "vector"))
            else:
                group.append(_rescaled(q, acc, part, el, ca, cb))
        group.append(Assign(m, Ref(top)))
        out += [Loop(xv, c.size, tuple(group), "vector")] if c.size else group
    return out


def _rescaled(q: Combine, acc: Callable[[str, Affine | None], Ref],
              part: Callable[[str, Affine | None], Expr], el: Affine | None, ca: str,
              cb: str) -> Assign:
    mine = acc(q.name, el)
    return Assign(mine, Call("add", (Call("mul", (mine, Ref(ca))),
                                     Call("mul", (part(q.name, el), Ref(cb))))))


def grid_split(loop: Loop, decls: Mapping[str, Let | Array], tag: int
               ) -> tuple[Stmt, ...] | None:
    """A top-level reduction whose accumulators are sums, maxima or online pairs, as
    chunks that write their partial results to slots (a loop `wide` recognises) and a
    loop that merges the slots, in chunk order, into the accumulators (`_merges`); None
    where it is not split (another combine, a combine the check refuses, too little work
    or too much state, an extent with no divisor giving chunks of `GRID_MIN_CHUNK`
    iterations). Over the reals the same value (a sum reassociated by chunks; a maximum
    exactly; an online pair rescaled exactly); in float32 a different rounding, which
    the float64 check judges as for any schedule."""
    if loop.kind != "reduce" or any(isinstance(s, Write | Gemm) for s in walk(loop.body)):
        return None
    found = infer_combines(loop, decls)
    if not found or any(c.kind not in GRID_KINDS for c in found):
        return None
    if sum(max(c.size, 1) for c in found) > PSUM_CAP or points((loop,)) < PSUM_MIN_POINTS:
        return None
    g = chunks(loop.extent)
    if g < 2:
        return None
    if not combine_ok(loop, initial_state(decls, [c.name for c in found]), found):
        return None
    per = loop.extent // g
    gv, rv, mv, xv = (f"ks_{n}{tag}" for n in ("chunk", "it", "merge", "el"))
    local = {c.name: f"{c.name}_c{tag}" for c in found}
    part = {c.name: f"part{tag}_{c.name}" for c in found}
    sub = {loop.var: Affine(((gv, per), (rv, 1)))}
    x = Affine.var(xv)
    chunk: list[Stmt] = []
    store: list[Stmt] = []
    for c in found:
        if c.size == 0:
            chunk.append(Let(local[c.name], Lit(SPLIT_KINDS[c.kind]), mutable=True))
            store.append(Assign(Ref(part[c.name], Affine.var(gv)), Ref(local[c.name])))
        else:
            chunk.append(Array(local[c.name], c.size, SPLIT_KINDS[c.kind]))
            store.append(Loop(xv, c.size, (Assign(Ref(part[c.name], Affine(((gv, c.size),))
                                                      + x), Ref(local[c.name], x)),), "vector"))
    sizes = {c.name: c.size for c in found}

    def slot(name: str, el: Affine | None) -> Ref:  # chunk mv's part of an accumulator
        base = Affine(((mv, sizes[name]),)) if sizes[name] else Affine.var(mv)
        return Ref(part[name], base + el if el is not None else base)

    merge = _merges(found, lambda name, el: Ref(name, el), slot, tag)
    inner = Loop(rv, per, tuple(_rename(s, sub, local) for s in loop.body), "reduce",
                 loop.axis)
    return (*(Array(part[c.name], g * max(c.size, 1), 0.0, fill=False) for c in found),
            Loop(gv, g, (*chunk, inner, *store), "reduce", loop.axis),
            Loop(mv, g, tuple(merge), "reduce", loop.axis))


def grid_reductions(body: tuple[Stmt, ...]) -> tuple[Stmt, ...]:
    """`body` with each top-level reduction `grid_split` splits replaced by its chunks
    and their merge."""
    decls: dict[str, Let | Array] = {}
    out: list[Stmt] = []
    for s in body:
        if isinstance(s, Let | Array):
            decls[s.name] = s
        split = grid_split(s, decls, len(out)) if isinstance(s, Loop) else None
        if split is None:
            out.append(s)
            continue
        # the accumulators' declarations move to the merge where nothing between reads
        # them (else the merge's phase would copy them in from an earlier phase)
        accs = assigned((split[-1],))
        moved = [d for d in out if isinstance(d, Let | Array) and d.name in accs
                 and not any(d.name in _names((x,)) for x in out[out.index(d) + 1:])]
        out = [x for x in out if not any(x is d for d in moved)]
        out += [*split[:-1], *moved, split[-1]]
    return tuple(out)
