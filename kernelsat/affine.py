"""Affine index maps: the attribute of a `Read` (issue 18 part 1).

`Read(m, x)` is `x` read at affine index forms: for every axis `a` of `x`, a form
`a = c_1*b_1 + ... + c_k*b_k + c_0` over the read's own axes `b` (with sizes), and a pad
value for indexes outside `x`'s range (or none: then every index is in range, checked
when the term is built). Convolutions (`h = 2*oh + kh - 1`, stride 2, padding 1),
pooling windows, dilation (`2*kh`), shifts (`i + 1`) and reversal (`-i + 7`) are reads.

The map is one attribute, a canonical text (one token: no spaces, parentheses or `;`)
so that every stage (s-expressions, egglog, certificates) carries it as a string:

    FORM,FORM,...|AXIS:SIZE,...|pad=VALUE

forms sorted by source axis, result axes sorted by name, `pad=none`, `pad=0.0`,
`pad=-inf` (a finite pad is Python's shortest float repr).

>>> m = parse_read_map("h=2*oh+kh-1|oh:4,kh:3|pad=0")
>>> m.text
'h=kh+2*oh-1|kh:3,oh:4|pad=0.0'
>>> m.span("h")
(-1, 7)
>>> parse_read_map("i=i+1|i:3|pad=none").text
'i=i+1|i:3|pad=none'
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

Form = tuple[tuple[tuple[str, int], ...], int]
"""`(((axis, coef), ...), const)`: sum of coef * axis plus const; axes sorted, coefs nonzero."""

_BAD_NAME = set(" ()\t\n:;\"'=,|*+-")


class ReadMapError(ValueError):
    """A malformed or inconsistent affine read map."""


def _name(a: str) -> str:
    if not a or a[0].isdigit() or any(c in _BAD_NAME for c in a):
        raise ReadMapError(f"bad axis name {a!r} in a read map")
    return a


def _form_text(form: Form) -> str:
    parts = []
    for axis, c in form[0]:
        body = axis if abs(c) == 1 else f"{abs(c)}*{axis}"
        parts.append(("-" if c < 0 else "+") + body)
    if form[1] or not parts:
        parts.append(f"{form[1]:+d}")
    text = "".join(parts)
    return text[1:] if text.startswith("+") else text


def _pad_text(pad: float | None) -> str:
    if pad is None:
        return "none"
    if math.isinf(pad):
        return "-inf" if pad < 0 else "inf"
    return repr(float(pad) + 0.0)


@dataclass(frozen=True, slots=True)
class ReadMap:
    """The affine map of one `Read`: `forms[a]` for every axis `a` of the operand, the
    read's own axes and sizes, and the pad value (None: every index in range)."""

    forms: tuple[tuple[str, Form], ...]  # by source axis, sorted
    axes: tuple[tuple[str, int], ...]  # the read's axes and sizes, sorted
    pad: float | None

    @property
    def text(self) -> str:
        forms = ",".join(f"{a}={_form_text(f)}" for a, f in self.forms)
        axes = ",".join(f"{a}:{n}" for a, n in self.axes)
        return f"{forms}|{axes}|pad={_pad_text(self.pad)}"

    @property
    def sizes(self) -> dict[str, int]:
        return dict(self.axes)

    def form(self, source: str) -> Form:
        return dict(self.forms)[source]

    def span(self, source: str) -> tuple[int, int]:
        """The least and greatest index the form of `source` takes over the read's axes."""
        terms, c0 = self.form(source)
        sizes = self.sizes
        lo = c0 + sum(c * (sizes[a] - 1) for a, c in terms if c < 0)
        hi = c0 + sum(c * (sizes[a] - 1) for a, c in terms if c > 0)
        return lo, hi

    def in_range(self, source_sizes: Mapping[str, int]) -> bool:
        """Whether every index the map produces lies inside the operand."""
        return all(self.span(a)[0] >= 0 and self.span(a)[1] < source_sizes[a]
                   for a, _ in self.forms)

    def with_pad(self, pad: float | None) -> ReadMap:
        return ReadMap(self.forms, self.axes, pad)

    def rename(self, mapping: Mapping[str, str]) -> ReadMap:
        """The map with its own (result) axes renamed; the operand's axes unchanged."""
        forms = tuple((a, (tuple(sorted((mapping.get(b, b), c) for b, c in t)), c0))
                      for a, (t, c0) in self.forms)
        axes = tuple(sorted((mapping.get(a, a), n) for a, n in self.axes))
        return make_read_map(dict(forms), dict(axes), self.pad)

    def is_identity(self, source_sizes: Mapping[str, int]) -> bool:
        """`x` itself: every axis read as itself, over its whole range."""
        return (self.sizes == dict(source_sizes)
                and all(f == (((a, 1),), 0) for a, f in self.forms))


def make_read_map(forms: Mapping[str, Form | tuple[Mapping[str, int], int]],
                  sizes: Mapping[str, int], pad: float | None) -> ReadMap:
    """A validated map from `{source axis: ({axis: coef}, const)}` and the read's axis sizes.

    >>> make_read_map({"i": ({"i": 1}, 1)}, {"i": 3}, None).text
    'i=i+1|i:3|pad=none'
    """
    norm: dict[str, Form] = {}
    used: set[str] = set()
    for src, (terms, c0) in forms.items():
        items = terms.items() if isinstance(terms, Mapping) else terms
        t = tuple(sorted((_name(a), int(c)) for a, c in items if c))
        if len({a for a, _ in t}) != len(t):
            raise ReadMapError(f"axis repeated in the form of {src!r}")
        norm[_name(src)] = (t, int(c0))
        used |= {a for a, _ in t}
    for a, n in sizes.items():
        _name(a)
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ReadMapError(f"bad size {n!r} of read axis {a!r}")
    missing = used - set(sizes)
    if missing:
        raise ReadMapError(f"read axes {sorted(missing)} have no size")
    unused = set(sizes) - used
    if unused:
        raise ReadMapError(f"read axes {sorted(unused)} appear in no index form")
    if pad is not None:
        pad = float(pad)
        if math.isnan(pad) or pad == math.inf:
            raise ReadMapError(f"bad pad value {pad!r}: a finite number or -inf")
        pad += 0.0
    return ReadMap(tuple(sorted(norm.items())), tuple(sorted(sizes.items())), pad)


_TERM = re.compile(r"([+-]?)(?:(\d+)\*)?([^+\-*]+)")


def _parse_form(text: str) -> tuple[dict[str, int], int]:
    terms: dict[str, int] = {}
    c0 = 0
    pos = 0
    while pos < len(text):
        m = _TERM.match(text, pos)
        if m is None or m.end() == pos:
            raise ReadMapError(f"bad index form {text!r}")
        sign = -1 if m.group(1) == "-" else 1
        if pos and not m.group(1):
            raise ReadMapError(f"bad index form {text!r}")
        body = m.group(3)
        if body.isdigit():
            if m.group(2):
                raise ReadMapError(f"bad index form {text!r}")
            c0 += sign * int(body)
        else:
            coef = sign * int(m.group(2) or 1)
            terms[body] = terms.get(body, 0) + coef
        pos = m.end()
    return terms, c0


@lru_cache(maxsize=4096)
def parse_read_map(text: str) -> ReadMap:
    """The map of a canonical (or hand-written, unsorted) map text; raises `ReadMapError`."""
    parts = text.split("|")
    if len(parts) != 3 or not parts[2].startswith("pad="):
        raise ReadMapError(f"bad read map {text!r}: expected FORMS|AXES|pad=VALUE")
    forms: dict[str, tuple[dict[str, int], int]] = {}
    for item in parts[0].split(",") if parts[0] else []:
        src, eq, body = item.partition("=")
        if not eq or src in forms:
            raise ReadMapError(f"bad index form {item!r} in {text!r}")
        forms[src] = _parse_form(body)
    sizes: dict[str, int] = {}
    for item in parts[1].split(",") if parts[1] else []:
        a, colon, n = item.partition(":")
        if not colon or not n.isdigit() or a in sizes:
            raise ReadMapError(f"bad read axis {item!r} in {text!r}")
        sizes[a] = int(n)
    pad_text = parts[2][4:]
    try:
        pad = None if pad_text == "none" else float(pad_text)
    except ValueError:
        raise ReadMapError(f"bad pad value {pad_text!r} in {text!r}") from None
    return make_read_map(forms, sizes, pad)
