"""The reference interpreter: the living semantics of the IR.

Elementwise ops run their numpy semantics from the op table (`kernelsat.ops.OPS`);
reductions, layout and leaves are defined here (`EVAL`). A value is a `Tensor`: an array
and the axis name of each of its dimensions. Evaluated in float64 it is the oracle
every rewrite and every renderer is tested against.

>>> import numpy as np
>>> from kernelsat.ir import In, Sum, mul
>>> x = In("x", (("i", 3),))
>>> evaluate(Sum("i", mul(x, x)), {"x": np.array([1.0, 2.0, 3.0])}).array
array(14.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from kernelsat.affine import ReadMap
from kernelsat.gather import check_labels, gather_axis
from kernelsat.ir import Term, idx_axis, in_groups, input_dims, postorder, read_map, split_axes
from kernelsat.ops import BINARY, OPS, REDUCTIONS, TERNARY, UNARY, Op


@dataclass(frozen=True, slots=True)
class Tensor:
    """An array whose dimensions carry axis names."""

    array: np.ndarray
    axes: tuple[str, ...]

    def to(self, axes: tuple[str, ...]) -> np.ndarray:
        """The array with its dimensions in the order `axes` (size-1 for absent ones)."""
        return align_axes(self.array, self.axes, axes)

    def dense(self, axes: tuple[str, ...], shape: Mapping[str, int]) -> np.ndarray:
        """The array in the order `axes`, broadcast to full sizes (a copy)."""
        # np.array, not np.ascontiguousarray: the latter turns a 0-d result into shape (1,)
        return np.array(np.broadcast_to(self.to(axes), [shape[a] for a in axes]), order="C")


def align_axes(array: np.ndarray, have: tuple[str, ...], want: tuple[str, ...]) -> np.ndarray:
    """`array`, whose dimensions are the axes `have`, with its dimensions in the order
    `want` (size 1 for the axes it lacks): broadcasting by name."""
    missing = [a for a in want if a not in have]
    arr = array.reshape(array.shape + (1,) * len(missing))
    order = (*have, *missing)
    return np.transpose(arr, [order.index(a) for a in want])


def _union(*ts: Tensor) -> tuple[str, ...]:
    out: list[str] = []
    for t in ts:
        out.extend(a for a in t.axes if a not in out)
    return tuple(out)


def _reduce_axis(t: Tensor, axis: str) -> tuple[tuple[str, ...], int]:
    return tuple(a for a in t.axes if a != axis), t.axes.index(axis)


def _shift(arr: np.ndarray, k: int) -> np.ndarray:
    """The row maxima, 0 where a row is all -inf (fully masked): exp(x - shift) is then
    0 for every element of such a row, never exp(-inf + inf) = NaN."""
    m = np.max(arr, axis=k, keepdims=True)
    return np.where(m == -np.inf, 0.0, m).astype(arr.dtype)


def _lse(arr: np.ndarray, k: int) -> np.ndarray:
    # a fully masked row (every element -inf) has LSE log(0) = -inf
    m = _shift(arr, k)
    return np.squeeze(m, k) + np.log(np.sum(np.exp(arr - m), axis=k))


def _unary(node: Term, args: list[Tensor], dtype: np.dtype) -> Tensor:
    return Tensor(_numpy(node.op)(args[0].array), args[0].axes)


def _binary(node: Term, args: list[Tensor], dtype: np.dtype) -> Tensor:
    axes = _union(*args)
    return Tensor(_numpy(node.op)(*(a.to(axes) for a in args)), axes)


def _numpy(op: Op) -> Callable[..., np.ndarray]:
    fn = OPS[op].numpy
    assert fn is not None, op  # every elementwise op has one (kernelsat.ops checks)
    return fn


def _reduction(fn: Callable[..., np.ndarray]) -> Callable[[Term, list[Tensor], np.dtype], Tensor]:
    def run(node: Term, args: list[Tensor], dtype: np.dtype) -> Tensor:
        axes, k = _reduce_axis(args[0], node.axis)
        return Tensor(np.asarray(fn(args[0].array, k), dtype=dtype), axes)

    return run


def _einsum_letters(axes: tuple[str, ...]) -> dict[str, str] | None:
    """One einsum subscript letter per axis (None past the 52 letters einsum has)."""
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return None if len(axes) > len(letters) else dict(zip(axes, letters, strict=False))


def contract(axis: str, factors: list[Tensor], dtype: np.dtype) -> Tensor:
    """`Sum_axis(f1 * f2 * ...)` by one einsum (pairwise, in the order numpy finds best),
    never materializing the product over every axis: the same value as multiplying then
    summing, within float rounding."""
    axes = _union(*factors)
    out_axes = tuple(a for a in axes if a != axis)
    letters = _einsum_letters(axes)
    if letters is None:  # beyond einsum's alphabet: multiply, then sum
        prod = factors[0].to(axes)
        for f in factors[1:]:
            prod = np.multiply(prod, f.to(axes))
        prod = np.broadcast_to(prod, [_sizes(factors)[a] for a in axes])
        return Tensor(np.asarray(np.sum(prod, axis=axes.index(axis)), dtype=dtype), out_axes)
    spec = ",".join("".join(letters[a] for a in f.axes) for f in factors)
    spec += "->" + "".join(letters[a] for a in out_axes)
    out = np.einsum(spec, *(f.array for f in factors), optimize=True)
    return Tensor(np.asarray(out, dtype=dtype), out_axes)


def _sizes(ts: list[Tensor]) -> dict[str, int]:
    return {a: n for t in ts for a, n in zip(t.axes, t.array.shape, strict=True)}


def _softmax_avg(node: Term, args: list[Tensor], dtype: np.dtype) -> Tensor:
    # sum_n softmax_n(s) * v: normalize the weights over n, then contract them with v
    # a fully masked row (every score -inf) has all weights 0 and the average 0
    s, v = args
    k = s.axes.index(node.axis)
    w = np.exp(s.array - _shift(s.array, k))
    total = np.sum(w, axis=k, keepdims=True)
    w /= np.where(total == 0, 1, total)
    return contract(node.axis, [Tensor(w, s.axes), v], dtype)


def _dot(node: Term, args: list[Tensor], dtype: np.dtype) -> Tensor:
    return contract(node.axis, list(args), dtype)


def _split(node: Term, args: list[Tensor], dtype: np.dtype) -> Tensor:
    (x,) = args
    axis, factor = node.axis, int(node.attrs[1])  # type: ignore[arg-type]
    k = x.axes.index(axis)
    shape = list(x.array.shape)
    new_shape = [*shape[:k], shape[k] // factor, factor, *shape[k + 1 :]]
    outer, inner = split_axes(axis, factor)
    return Tensor(x.array.reshape(new_shape), (*x.axes[:k], outer, inner, *x.axes[k + 1 :]))


def read_indices(m: ReadMap, x_axes: tuple[str, ...], x_sizes: tuple[int, ...]
                 ) -> tuple[tuple[np.ndarray, ...], np.ndarray | None]:
    """For a read map over an operand with axes `x_axes` (sizes `x_sizes`): one integer
    index array per operand axis, broadcast over the read's axes (in `m.axes` order),
    clipped into range, and the mask of in-range positions (None when unpadded)."""
    own = [a for a, _ in m.axes]
    sizes = m.sizes
    grids = {a: np.arange(sizes[a]).reshape([-1 if b == a else 1 for b in own]) for a in own}
    shape = tuple(sizes[a] for a in own)
    index: list[np.ndarray] = []
    valid: np.ndarray | None = None
    for a, n in zip(x_axes, x_sizes, strict=True):
        terms, c0 = m.form(a)
        idx = np.broadcast_to(c0 + sum((c * grids[b] for b, c in terms), np.zeros((), int)),
                              shape)
        if m.pad is not None:
            ok = (idx >= 0) & (idx < n)
            valid = ok if valid is None else valid & ok
            idx = np.clip(idx, 0, n - 1)
        index.append(idx)
    return tuple(index), valid


def _read(node: Term, x: Tensor) -> Tensor:
    """`x` at the read's affine index forms; its pad where an index leaves `x`'s range."""
    m = read_map(node)
    index, valid = read_indices(m, x.axes, x.array.shape)
    out = x.array[index] if index else np.broadcast_to(x.array, tuple(s for _, s in m.axes))
    if valid is not None:
        assert m.pad is not None
        out = np.where(valid, out, np.asarray(m.pad, dtype=x.array.dtype))
    return Tensor(np.asarray(out, dtype=x.array.dtype), tuple(a for a, _ in m.axes))


def _gather(node: Term, x: Tensor, labels: Tensor) -> Tensor:
    """`x` with its axis `a` at the labels' values (gathers, issue 18 part 3b); a label
    outside `[0, size of a)` raises `GatherIndexError` (naming the input, the position
    and the bound)."""
    a = gather_axis(node)
    n = x.array.shape[x.axes.index(a)]
    lab = node.args[1]
    dims = input_dims(lab)  # positions as declared (a chunked evaluation sees a slice)
    arr = labels.array.reshape(dims) if labels.array.size == np.prod(dims) else labels.array
    check_labels(str(lab.attrs[0]), arr, n)
    keep = tuple(b for b in x.axes if b != a)
    axes = (*keep, *(b for b in labels.axes if b not in keep))
    idx = labels.to(axes).astype(np.int64)
    src = x.to((*axes, a))  # size 1 over the labels' own axes: broadcast
    full = np.broadcast_shapes(src.shape[:-1], idx.shape)
    src = np.broadcast_to(src, (*full, n))
    out = np.take_along_axis(src, np.broadcast_to(idx, full)[..., None], axis=-1)[..., 0]
    return Tensor(np.asarray(out, dtype=x.array.dtype), axes)


EVAL: dict[Op, Callable[[Term, list[Tensor], np.dtype], Tensor]] = {
    **{op: _unary for op in UNARY},
    **{op: _binary for op in BINARY | TERNARY},
    Op.SUM: _reduction(np.sum),
    Op.RMAX: _reduction(np.max),
    Op.LSE: _reduction(_lse),
    Op.SOFTMAXAVG: _softmax_avg,
    Op.DOT: _dot,
    Op.SPLIT: _split,
    Op.STORE: lambda node, args, dtype: args[0],
    Op.READ: lambda node, args, dtype: _read(node, args[0]),
    Op.GATHER: lambda node, args, dtype: _gather(node, args[0], args[1]),
}
"""The semantics of every op with children (`In` and `Const` are read from the environment)."""


def _leaf(node: Term, env: Mapping[str, np.ndarray], dtype: np.dtype) -> Tensor:
    if node.op is Op.CONST:
        return Tensor(np.asarray(node.attrs[0], dtype=dtype), ())
    if node.op is Op.NEGINF:
        return Tensor(np.asarray(-np.inf, dtype=dtype), ())
    if node.op is Op.IDX:
        axis, size = idx_axis(node)
        return Tensor(np.arange(size, dtype=dtype), (axis,))
    name = str(node.attrs[0])
    if name not in env:
        raise KeyError(f"no value for input {name!r}")
    arr = np.asarray(env[name], dtype=dtype)
    dims = input_dims(node)
    if arr.shape != dims:
        raise ValueError(f"input {name!r} has shape {arr.shape}, expected {dims}")
    groups = in_groups(node)
    axes = tuple(a for dim in groups for a, _ in dim)
    sizes = tuple(s for dim in groups for _, s in dim)
    return Tensor(arr.reshape(sizes), axes)


CHUNK_ELEMENTS = 1 << 24
"""A reduction whose private operands would hold more elements than this (128 MiB in
float64) is evaluated in slices of one of its output axes (see `Chunk`)."""


@dataclass(frozen=True)
class Chunk:
    """A reduction evaluated slice by slice along `axis`, one of its output axes, `step`
    indices at a time: `region` (the nodes only it reads, in order) is recomputed per slice
    from the slices of `reads` (values built outside), and the results are concatenated.
    No node of the region binds `axis`, so slicing commutes with every op in it."""

    axis: str
    step: int
    region: tuple[Term, ...]
    reads: tuple[Term, ...]


@dataclass(frozen=True)
class Plan:
    """How `evaluate` computes a term: the nodes it materializes, in order; what each one
    reads (`inputs`: for a contraction, a `Sum` of a product, the factors, the single-use
    `mul` nodes under it never being built); the reductions evaluated in slices (`chunks`);
    and per materialized node the reads still to come (`uses`), so each value is dropped
    after its last use."""

    order: tuple[Term, ...]
    inputs: dict[Term, tuple[Term, ...]]
    uses: dict[Term, int]
    chunks: dict[Term, Chunk]


def _factors(node: Term, users: Mapping[Term, int], root: Term) -> tuple[Term, ...]:
    """The factors of the product tree under a `Sum`: single-use `mul` nodes are opened."""
    out: list[Term] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if n.op is Op.MUL and users[n] == 1 and n is not root:
            stack.extend(reversed(n.args))
        else:
            out.append(n)
    return tuple(out)


def _binds(node: Term) -> tuple[str, ...]:
    """The axes a node binds or makes: a reduction's axis; a split's axis and its parts."""
    if node.op is Op.SPLIT:
        return (node.axis, *split_axes(node.axis, int(node.attrs[1])))  # type: ignore[arg-type]
    if node.op is Op.READ:  # its own axes and its operand's: slicing does not commute
        return (*node.shape, *node.args[0].shape)
    return (node.axis,) if node.op in REDUCTIONS or node.op is Op.GATHER else ()


def _chunk(red: Term, order: tuple[Term, ...], inputs: Mapping[Term, tuple[Term, ...]],
           readers: Mapping[Term, list[Term]], root: Term, limit: int) -> Chunk | None:
    """How to slice the reduction `red` (None when its private operands are small)."""
    pos = {n: i for i, n in enumerate(order)}
    below: set[Term] = set()
    stack = list(inputs[red])
    while stack:
        n = stack.pop()
        if n not in below and n.args and n is not root:
            below.add(n)
            stack.extend(inputs[n])
    region: set[Term] = set()
    for n in sorted(below, key=pos.__getitem__, reverse=True):  # readers first
        if all(r is red or r in region for r in readers[n]):
            region.add(n)
    big = max(region, key=lambda n: n.size(), default=None)
    if big is None or big.size() <= limit:
        return None
    bound = {a for n in region for a in _binds(n)}
    axes = [a for a in red.shape if a in big.shape and a not in bound and red.shape[a] > 1]
    if not axes:
        return None
    axis = max(axes, key=red.shape.__getitem__)
    step = max(1, red.shape[axis] * limit // big.size())
    if step >= red.shape[axis]:
        return None
    ordered = tuple(sorted(region, key=pos.__getitem__))
    reads = {c for n in (*ordered, red) for c in inputs[n] if c not in region}
    return Chunk(axis, step, ordered, tuple(sorted(reads, key=pos.__getitem__)))


def plan(root: Term, chunk_elements: int = CHUNK_ELEMENTS) -> Plan:
    """The evaluation plan of `root` (see `Plan`)."""
    users: dict[Term, int] = {}
    for node in postorder(root):
        for child in node.args:
            users[child] = users.get(child, 0) + 1
    inputs: dict[Term, tuple[Term, ...]] = {}
    needed = {root}
    for node in reversed(list(postorder(root))):  # parents first: find what is built
        if node not in needed:
            continue
        if node.op is Op.SUM and node.args[0].op is Op.MUL and users[node.args[0]] == 1:
            inputs[node] = _factors(node.args[0], users, root)
        else:
            inputs[node] = node.args
        needed.update(inputs[node])
    built = tuple(n for n in postorder(root) if n in needed)
    readers: dict[Term, list[Term]] = {n: [] for n in built}
    for n in built:
        for c in inputs[n]:
            readers[c].append(n)
    chunks: dict[Term, Chunk] = {}
    sliced: set[Term] = set()
    for node in reversed(built):  # outermost reductions first
        if node.op in REDUCTIONS and node not in sliced:
            chunk = _chunk(node, built, inputs, readers, root, chunk_elements)
            if chunk is not None:
                chunks[node] = chunk
                sliced.update(chunk.region)
    order = tuple(n for n in built if n not in sliced)
    uses: dict[Term, int] = {n: 0 for n in order}
    for n in order:
        for c in chunks[n].reads if n in chunks else inputs[n]:
            uses[c] += 1
    return Plan(order, inputs, uses, chunks)


def _step(node: Term, p: Plan, values: Mapping[Term, Tensor],
          env: Mapping[str, np.ndarray], dt: np.dtype) -> Tensor:
    """The value of one node from the values it reads."""
    args = [values[c] for c in p.inputs[node]]
    if not node.args:
        out = _leaf(node, env, dt)
    elif node.op is Op.SUM and p.inputs[node] != node.args:
        out = contract(node.axis, args, dt)
    else:
        out = EVAL[node.op](node, args, dt)
    return Tensor(np.asarray(out.array, dtype=dt), out.axes)


def _slice(t: Tensor, axis: str, lo: int, hi: int) -> Tensor:
    if axis not in t.axes:
        return t
    index: list[slice] = [slice(None)] * t.array.ndim
    index[t.axes.index(axis)] = slice(lo, hi)
    return Tensor(t.array[tuple(index)], t.axes)


def _sliced(node: Term, chunk: Chunk, p: Plan, values: Mapping[Term, Tensor],
            env: Mapping[str, np.ndarray], dt: np.dtype) -> Tensor:
    """A reduction evaluated slice by slice (see `Chunk`)."""
    pieces: list[Tensor] = []
    for lo in range(0, node.shape[chunk.axis], chunk.step):
        hi = lo + chunk.step
        local = {c: _slice(values[c], chunk.axis, lo, hi) for c in chunk.reads}
        for n in (*chunk.region, node):
            local[n] = _step(n, p, local, env, dt)
        pieces.append(local[node])
    k = pieces[0].axes.index(chunk.axis)
    return Tensor(np.concatenate([t.array for t in pieces], axis=k), pieces[0].axes)


def evaluate(
    root: Term, env: Mapping[str, np.ndarray], dtype: type | np.dtype = np.float64,
    chunk_elements: int = CHUNK_ELEMENTS,
) -> Tensor:
    """Evaluate `root` on input arrays (by input name) in `dtype` (float64: the oracle).
    Products under a `Sum` are contracted (`contract`), reductions over big private
    operands go slice by slice (`Chunk`), and each value is dropped after its last use,
    so memory stays near `peak_elements(root)`."""
    dt = np.dtype(dtype)
    p = plan(root, chunk_elements)
    values: dict[Term, Tensor] = {}
    left = dict(p.uses)
    with np.errstate(all="ignore"):
        for node in p.order:
            chunk = p.chunks.get(node)
            if chunk is None:
                values[node] = _step(node, p, values, env, dt)
            else:
                values[node] = _sliced(node, chunk, p, values, env, dt)
            for c in chunk.reads if chunk is not None else p.inputs[node]:
                left[c] -= 1
                if left[c] == 0 and c is not root:
                    del values[c]
    return values[root]


def _extra_elements(node: Term, inputs: tuple[Term, ...]) -> int:
    """Temporaries beyond the result while evaluating `node` (an upper estimate)."""
    if node.op is Op.LSE or node.op is Op.SOFTMAXAVG:
        return 2 * inputs[0].size() + sum(c.size() for c in inputs[1:])
    if node.op in (Op.SUM, Op.DOT) and len(inputs) > 1:
        return sum(c.size() for c in inputs)  # einsum may copy its operands once
    return 0


def _sliced_elements(node: Term, chunk: Chunk, p: Plan) -> int:
    """Elements one slice of a chunked reduction holds: its region and temporaries, each
    node scaled to the slice when it has the sliced axis (no node is dropped early)."""
    n = node.shape[chunk.axis]

    def scaled(m: Term, count: int) -> int:
        return -(-count * chunk.step // n) if chunk.axis in m.shape else count

    parts = (*chunk.region, node)
    return sum(scaled(m, m.size() + _extra_elements(m, p.inputs[m])) for m in parts)


def peak_elements(root: Term, chunk_elements: int = CHUNK_ELEMENTS) -> int:
    """An upper estimate of the elements `evaluate(root, ...)` holds at once, besides the
    input arrays themselves: results still to be read, plus each step's temporaries.

    >>> from kernelsat.ir import In, Sum, mul
    >>> a, b = In("a", (("i", 100), ("k", 100))), In("b", (("k", 100), ("j", 100)))
    >>> peak_elements(Sum("k", mul(a, b))) < 100 * 100 * 100
    True
    """
    p = plan(root, chunk_elements)
    left = dict(p.uses)
    live = peak = 0
    for node in p.order:
        own = 0 if node.op in (Op.IN, Op.CONST, Op.NEGINF) else node.size()
        chunk = p.chunks.get(node)
        if chunk is None:
            step = own + _extra_elements(node, p.inputs[node])
        else:  # the slices, then their concatenation
            step = own + max(own, _sliced_elements(node, chunk, p))
        peak = max(peak, live + step)
        live += own
        for c in chunk.reads if chunk is not None else p.inputs[node]:
            left[c] -= 1
            if left[c] == 0 and c is not root and c.op not in (Op.IN, Op.CONST, Op.NEGINF):
                live -= c.size()
    return peak


def evaluate_as(
    root: Term,
    env: Mapping[str, np.ndarray],
    axes: tuple[str, ...] | None = None,
    dtype: type | np.dtype = np.float64,
) -> np.ndarray:
    """Evaluate and return a dense array with dimensions in `axes` order (default: sorted)."""
    order = tuple(axes) if axes is not None else tuple(root.shape)
    return evaluate(root, env, dtype).dense(order, root.shape)
