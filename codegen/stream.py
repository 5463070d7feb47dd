"""Non-temporal (streaming) stores: the schedule knob `nt`.

A store through the cache first reads the line it writes (a read-for-ownership, RFO),
so a kernel that writes a large output moves its bytes twice over the memory bus,
plus the write-back. A streaming store (x86 `movntps`) writes whole lines straight to
memory: no RFO, and the output does not evict the inputs from the caches. It pays
where the output is written once, in full lines, and is too large to be read again
from the cache: the knob is offered (`stream_space`) for a kernel whose output is at
least `STREAM_MIN_BYTES` and whose default nest has a loop that can stream its store
(`streamable`); the schedule model prices it (`kernelsat.hardware.schedule_model`:
no RFO for a streamed store), and the knob search measures it. The default is off.

A loop streams its store when (`streamable`):

- it is innermost (no loop or blocked statement inside) and is not the kernel's first
  parallel loop (that one carries the OpenMP pragma);
- its body is `Let`s (no `Assign`, no local array: iterations independent, so they
  may run a line at a time) and exactly one `Write`, whose index moves by exactly one
  element per iteration (contiguous);
- nothing in the body reads the buffer it writes;
- its extent is at least four lines (`MIN_EXTENT`).

`mark_streams` flags such writes (`Write.stream`); the C renderer
(`kernelsat.codegen.c.CRenderer`) then emits, per execution of the loop: a scalar head
up to the first 64-byte boundary of the output, the body a chunk of up to 16 lines at a
time (then a line at a time) into an aligned local buffer that `ks_stream_line` stores
a line at a time, non-temporally
(`_mm512_stream_ps`, two `_mm256_stream_ps` or four `_mm_stream_ps`, by the ISA the
compiler targets; an ordinary store elsewhere), a scalar tail, and `ks_stream_fence`
(`sfence`: the streamed lines are visible before the thread goes on). Every other
renderer ignores the flag (an ordinary store).

>>> from kernelsat.codegen.loops import Affine, Let, Load, Loop, Ref, Write
>>> i, j = Affine.var("i"), Affine.var("j")
>>> row = Loop("j", 64, (Let("t", Load("x", i.scale(64) + j)),
...                      Write("out", i.scale(64) + j, Ref("t"))), "parallel")
>>> body = (Loop("i", 8, (row,), "parallel"),)
>>> has_streams(mark_streams(body)), streamable(row, first=False) is not None
(True, True)
"""

from __future__ import annotations

from collections.abc import Sequence

from kernelsat.codegen.loops import (
    Affine,
    Call,
    Expr,
    Let,
    Load,
    Loop,
    Ref,
    Stmt,
    Write,
)

LINE_FLOATS = 16
"""Floats per streamed line (64 bytes: one cache line, one AVX-512 vector)."""

STREAM_MIN_BYTES = 8 << 20
"""The knob is offered for outputs of at least this many bytes: larger than the private
caches of any CPU target here (L2 <= 2 MiB a core), so the output does not stay in
them for a next reader. Whether it pays beyond that (a large shared LLC may still hold
it) is the model's and the measurement's call. Read at call time (tests lower it)."""

STREAM_HELPERS = r"""#if defined(__SSE__)
#include <immintrin.h>
#endif
/* Non-temporal store of one 64-byte line (p 64-byte aligned, v a 64-byte aligned line). */
static inline void ks_stream_line(float* restrict p, const float* restrict v) {
#if defined(__AVX512F__)
  _mm512_stream_ps(p, _mm512_load_ps(v));
#elif defined(__AVX__)
  _mm256_stream_ps(p, _mm256_load_ps(v));
  _mm256_stream_ps(p + 8, _mm256_load_ps(v + 8));
#elif defined(__SSE__)
  for (int k = 0; k < 16; k += 4) _mm_stream_ps(p + k, _mm_load_ps(v + k));
#else
  memcpy(p, v, 64);  /* no streaming store on this ISA: an ordinary one */
#endif
}
static inline void ks_stream_fence(void) {
#if defined(__SSE__)
  _mm_sfence();
#endif
}"""
"""The C helpers a streamed loop calls (emitted once per translation unit)."""


CHUNK_LINES = 16
"""Lines computed into the local buffer before they are streamed (1 KiB: in L1): a
body computed a line at a time was measured 1.5x slower on the transcendental-heavy
elementwise chain (a 16-iteration loop per line); a longer loop vectorizes as the
plain one does."""


MIN_EXTENT = 4 * LINE_FLOATS
"""A loop streams only when it runs at least this many iterations: each execution pays
a scalar head (up to 15 elements, to the output's next 64-byte boundary) and tail, so
a register tile of 16 or 32 (measured: 1.1-1.8x slower with the knob on) gains
nothing; a row of 4096 streams all but its head."""


def chunk_floats(extent: int) -> int:
    """Floats computed per streamed chunk: `CHUNK_LINES` lines, fewer for a short loop
    (whole lines, at least one)."""
    return LINE_FLOATS * max(1, min(CHUNK_LINES, extent // LINE_FLOATS))


def _reads(e: Expr, buf: str) -> bool:
    """Whether expression `e` reads buffer `buf`."""
    match e:
        case Load(name, _, _, _, labels):
            return name == buf or any(lb.buf == buf or (lb.value is not None
                                                        and _reads(lb.value, buf))
                                      for lb in labels)
        case Ref(name, _):
            return name == buf
        case Call(_, args):
            return any(_reads(a, buf) for a in args)
        case _:
            return False


def _coef(idx: Affine, var: str) -> int:
    return next((c for v, c in idx.terms if v == var), 0)


def streamable(loop: Loop, first: bool) -> Write | None:
    """The `Write` that `loop` can stream (see the module docstring), else None. `first`:
    the loop is the kernel's first parallel loop (never streamed)."""
    if first or loop.extent < MIN_EXTENT:
        return None
    writes = [s for s in loop.body if isinstance(s, Write)]
    lets = [s for s in loop.body if isinstance(s, Let)]
    if len(writes) != 1 or len(writes) + len(lets) != len(loop.body):
        return None
    w = writes[0]
    if any(s.mutable for s in lets) or _coef(w.index, loop.var) != 1:
        return None
    if any(_reads(e, w.buf) for e in (*(s.expr for s in lets), w.expr)):
        return None
    return w


def _first_parallel(body: Sequence[Stmt]) -> Loop | None:
    """The loop the C renderer puts the OpenMP pragma on: the first (preorder) of kind
    "parallel" with extent > 1."""
    for s in body:
        if isinstance(s, Loop):
            if s.kind == "parallel" and s.extent > 1:
                return s
            inner = _first_parallel(s.body)
            if inner is not None:
                return inner
    return None


def mark_streams(body: Sequence[Stmt]) -> tuple[Stmt, ...]:
    """`body` with the store of every loop that can stream it flagged (`Write.stream`)."""
    first = _first_parallel(body)

    def visit(s: Stmt) -> Stmt:
        if not isinstance(s, Loop):
            return s
        w = streamable(s, s is first)
        if w is not None:
            marked = Write(w.buf, w.index, w.expr, True)
            return Loop(s.var, s.extent, tuple(marked if b is w else b for b in s.body),
                        s.kind, s.axis)
        return Loop(s.var, s.extent, tuple(visit(b) for b in s.body), s.kind, s.axis)

    return tuple(visit(s) for s in body)


def has_streams(body: Sequence[Stmt]) -> bool:
    """Whether any store in `body` is flagged to stream."""
    for s in body:
        if isinstance(s, Write) and s.stream:
            return True
        if isinstance(s, Loop) and has_streams(s.body):
            return True
    return False


def streamed_write(loop: Loop) -> Write | None:
    """The flagged store of `loop`'s body (a loop `mark_streams` chose), else None."""
    return next((s for s in loop.body if isinstance(s, Write) and s.stream), None)


def c_stream_loop(loop: Loop, w: Write, body_lines: Sequence[str], lane_lines: Sequence[str],
                  write_plain: str, write_lane: str, depth: int) -> list[str]:
    """C of a streamed loop (see the module docstring). `body_lines`: the body's `Let`s
    rendered at depth + 2 (head and tail loops), `lane_lines` the same at depth + 3 (the
    chunk loops); `write_plain` / `write_lane`: the store as an ordinary one and into the
    local buffer (`ks_line[ks_l]`), each a full line of C at its depth. After the head,
    chunks of `chunk_floats` floats while they fit, then single lines, then the tail."""
    pad = "  " * depth
    v, n = loop.var, loop.extent
    chunk = chunk_floats(n - LINE_FLOATS + 1)  # one chunk fits after any head
    base = Affine(tuple(t for t in w.index.terms if t[0] != v), w.index.const)
    at_block = Affine(tuple(("ks_b", c) if x == v else (x, c) for x, c in w.index.terms),
                      w.index.const)

    def blocks(size: int, start: str, stop: str) -> list[str]:
        return [
            f"{pad}  long {stop} = {start} + ({n} - {start}) / {size} * {size};",
            f"{pad}  for (long ks_b = {start}; ks_b < {stop}; ks_b += {size}) {{",
            f"{pad}    float ks_line[{size}] __attribute__((aligned(64)));",
            f"{pad}    for (long ks_l = 0; ks_l < {size}; ks_l++) {{",
            f"{pad}      long {v} = ks_b + ks_l;",
            *lane_lines, write_lane,
            f"{pad}    }}",
            f"{pad}    for (long ks_l = 0; ks_l < {size}; ks_l += {LINE_FLOATS})",
            f"{pad}      ks_stream_line({w.buf} + {at_block.render()} + ks_l, ks_line + ks_l);",
            f"{pad}  }}",
        ]

    sizes = [chunk, LINE_FLOATS] if chunk > LINE_FLOATS else [LINE_FLOATS]
    ends = [f"ks_t{k}" for k in range(len(sizes))]
    starts = ["ks_h", *ends[:-1]]
    return [
        f"{pad}{{  /* non-temporal stores (knob nt): head to a 64-byte boundary, chunks "
        "and lines streamed, tail */",
        f"{pad}  long ks_h = (long)((64 - ((unsigned long)({w.buf} + {base.render()}) & 63)) "
        f"& 63) / 4;",
        f"{pad}  if (ks_h > {n}) ks_h = {n};",
        f"{pad}  for (long {v} = 0; {v} < ks_h; {v}++) {{",
        *body_lines, write_plain,
        f"{pad}  }}",
        *(line for size, a, b in zip(sizes, starts, ends, strict=True)
          for line in blocks(size, a, b)),
        f"{pad}  for (long {v} = {ends[-1]}; {v} < {n}; {v}++) {{",
        *body_lines, write_plain,
        f"{pad}  }}",
        f"{pad}  ks_stream_fence();",
        f"{pad}}}",
    ]


__all__ = ["LINE_FLOATS", "STREAM_HELPERS", "STREAM_MIN_BYTES", "c_stream_loop",
           "has_streams", "mark_streams", "streamable", "streamed_write"]
