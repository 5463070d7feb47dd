"""All-sizes verification of rules with reductions, splits, stores and sizes.

Sizes are never instantiated. Every axis has a symbolic size (`$n[a0]`, a real >= 1),
every split factor a symbolic value (`$f[f]`, a real >= 1, or the literal the rule
writes), the outer part of a split a symbolic count `$q[a0,F]` with `n = q * F`; a
`(divides ?f ?a)` adds `1 < f < n`, `(Const (size ?a))` is `$n[a]` itself. What is
still enumerated is everything that changes a match's *structure*, none of it a size:
which axis variables name the same axis (or a literal axis), which factor variables
are equal (or a literal factor), and which of the rule's axes plus one extra axis `k`
each term variable has. For each such instance both sides are evaluated at a generic
index: a free axis `A` is the index `{A}`, a reduction over `A` binds `<A>`, a split
maps the index of `A` to `(<A/oF>*F+<A/iF>)`. A reduction becomes an *aggregate*
over a set of bound indices, canonicalized by lemmas proved once for every size
(`LEMMAS`, docs/rules.md argues each); a canonical aggregate is then an opaque real
(`sum{<a0>}#17`), equal aggregates are the same atom, and z3 proves the resulting
real identity (with the size hypotheses) as for an elementwise rule. Domain conditions
under a reduction (`x[<a0>] > 0` for a `log` inside a `Sum`) mean "for every index":
the bound index is a universally quantified variable of the query.

Nothing here is a bound: a proof holds for every size that satisfies the hypotheses
(`n >= 1`, `n = q * F`, `1 < F < n`), over the reals, so for every integer size. A
rule whose identity needs more than these lemmas is not proved here (`verify.py`
then tries the bounded method, whose result is only `bounded` and is not loaded by
default).

>>> from kernelsat.rewrites.rule import parse_rule
>>> r = parse_rule("s: (Sum ?a ?x) => (Sum (outer ?a ?f) (Sum (inner ?a ?f) "
...                "(Split ?a ?f ?x))) if (divides ?f ?a) [t]")
>>> out = verify_all_sizes(r)
>>> out.ok, sorted(out.lemmas)
(True, ['split-reindex', 'sum-fubini'])
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import cast

from kernelsat.affine import make_read_map
from kernelsat.ir import MAX_SIZE, In, ShapeError, Term, exp, postorder, read_map, split_axes
from kernelsat.ops import Op
from kernelsat.proofs.normalize import (
    ONE,
    REBUILD,
    Sym,
    add,
    const,
    fn,
    ge0,
    gt0,
    ite,
    max_,
    mul,
    ne0,
    neg,
    normalize,
    positive,
    var,
)
from kernelsat.proofs.verify_bounded import Instance as Concrete
from kernelsat.proofs.verify_bounded import (
    Literals,
    _partitions,
    assignments,
    fresh_names,
    rule_literals,
    var_kinds,
)
from kernelsat.proofs.verify_numeric import MAX_ELEMENTS, compare, largest_tensor
from kernelsat.proofs.verify_smt import (
    ATTR_SYM,
    DEFAULT_TIMEOUT_MS,
    Obligation,
    normalize_obligation,
    prove,
)
from kernelsat.proofs.verify_sym import SCALAR
from kernelsat.rewrites.rule import (
    FACTOR_FUNS,
    AttrFun,
    Bindings,
    ConstEq,
    Covers,
    Divides,
    HasAxis,
    NonZero,
    NotIn,
    PadZero,
    Pattern,
    PNode,
    Positive,
    Rule,
    RuleError,
    Unit,
    Unpadded,
    Var,
    check_condition,
    instantiate,
    pattern_vars,
)

LEMMAS: dict[str, str] = {
    "sum-const": "sum_{i<n} c = n * c  (c free of i)",
    "max-const": "max_{i<n} c = c  (c free of i, n >= 1)",
    "sum-linear": "sum_i (s + t) = sum_i s + sum_i t",
    "sum-hoist": "sum_i (c * t) = c * sum_i t  (c free of i)",
    "max-shift": "max_i (c + t) = c + max_i t  (c free of i)",
    "max-scale": "max_i (c * t) = c * max_i t  (c > 0, free of i)",
    "max-lattice": "max_i max(s, t) = max(max_i s, max_i t)",
    "max-exp": "max_i exp(t) = exp(max_i t)  (exp increasing)",
    "sum-fubini": "sum_i sum_j t = sum_{i,j} t  (finite sums: any order)",
    "max-fubini": "max_i max_j t = max_{i,j} t",
    "split-reindex": "R_{o<q} R_{i<F} t(o*F+i) = R_{a<q*F} t(a)  ((o,i) -> o*F+i is a bijection)",
    "agg-positive": "sum_{i<n} t > 0 and max_{i<n} t > 0 when t > 0 (n >= 1)",
    "agg-unit": "R_{i<1} t(i) = t(0)  (a reduction over an axis of size 1, `(unit ?a)`)",
}
"""Facts about reductions over an axis of any size, each proved once (docs/rules.md):
the canonicalization of aggregates uses only these."""

FACTOR_PRIMES = (11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61)
"""Stand-in values of factor variables while building an instance's terms (the proof
never reads them: a factor is the symbol `$f[...]`); primes that no literal equals."""
BASE = 7
_TOKEN = re.compile(r"[<{][^<>{}()*+,]*[>}]")


class OutsideFragment(RuleError):
    """The rule uses something the all-sizes method does not cover (it is then tried
    by the bounded method, and at best proved only up to a bound)."""


@dataclass(frozen=True)
class Agg:
    """A canonical aggregate: `kind` (sum or max) of `body` over the bound indices."""

    kind: str
    binders: frozenset[str]
    body: Sym


@dataclass
class Context:
    """The symbols of one instance: entries, aggregates, sizes, and what was used."""

    sizes: dict[str, Sym] = field(default_factory=dict)
    splits: dict[str, tuple[str, int, str, str]] = field(default_factory=dict)
    """Parent axis + factor -> (parent, factor, outer, inner), for every split seen."""
    factor_syms: dict[int, Sym] = field(default_factory=dict)
    hyps: list[Sym] = field(default_factory=list)
    entries: dict[str, tuple[str, tuple[str, ...], frozenset[str]]] = field(
        default_factory=dict)
    """Entry variable -> (input, index expressions, free indices)."""
    aggs: dict[str, Agg] = field(default_factory=dict)
    positive: set[str] = field(default_factory=set)
    lemmas: set[str] = field(default_factory=set)
    holders: dict[str, Callable[[list[Sym]], Sym]] = field(default_factory=dict)
    units: set[str] = field(default_factory=set)
    """Axes of size 1 (a `(unit ?a)` hypothesis): a reduction over one is its body at 0."""
    maps: dict[str, int] = field(default_factory=dict)
    """Affine read map text -> its number: the map's index functions `$g<k>_<axis>` and
    in-range predicate `$in<k>` are opaque (the proof holds for every map)."""
    _free: dict[int, frozenset[str]] = field(default_factory=dict)

    # -- sizes ------------------------------------------------------------------------

    def size(self, axis: str) -> Sym:
        if axis not in self.sizes:
            n = var(f"$n[{axis}]")
            self.sizes[axis] = n
            self.hyps.append(ge0(add(n, const(-1))))
        return self.sizes[axis]

    def factor(self, f: int) -> Sym:
        if f not in self.factor_syms:
            raise OutsideFragment(f"split factor {f} is computed: only a factor variable "
                                  "or a literal is covered for all sizes")
        return self.factor_syms[f]

    def split(self, axis: str, f: int) -> tuple[str, str]:
        outer, inner = split_axes(axis, f)
        key = f"{axis}*{f}"
        if key not in self.splits:
            self.splits[key] = (axis, f, outer, inner)
            fs = self.factor(f)
            q = var(f"$q[{axis},{fs}]")
            self.sizes[outer], self.sizes[inner] = q, fs
            self.hyps += [ge0(add(q, const(-1))), ge0(add(fs, const(-1))),
                          add(self.size(axis), neg(mul(q, fs)))]
        return outer, inner

    # -- free indices, renaming -----------------------------------------------------------

    def free(self, s: Sym) -> frozenset[str]:
        hit = self._free.get(s.serial)
        if hit is not None:
            return hit
        if s.op == "var":
            name = str(s.value)
            agg = self.aggs.get(name)
            entry = self.entries.get(name)
            out = (self.free(agg.body) - agg.binders) if agg else (
                entry[2] if entry else frozenset())
        else:
            out = frozenset().union(*(self.free(a) for a in s.args))
        self._free[s.serial] = out
        return out

    def entry(self, name: str, index: tuple[str, ...]) -> Sym:
        text = f"{name}[{','.join(index)}]"
        self.entries.setdefault(text, (name, index, frozenset(_TOKEN.findall(",".join(index)))))
        return var(text)

    def rename(self, s: Sym, old: str, new: str, memo: dict[int, Sym | None]) -> Sym | None:
        """`s` with the index expression `old` replaced by the index `new`; None where
        an aggregate inside binds `new` around an `old` (that would capture it)."""
        if s.serial in memo:
            return memo[s.serial]
        out: Sym | None
        if s.op == "var":
            name = str(s.value)
            agg = self.aggs.get(name)
            if agg is not None:
                body = self.rename(agg.body, old, new, memo)
                capture = new in agg.binders and body is not agg.body
                out = None if body is None or capture else (
                    s if body is agg.body else self.agg(agg.kind, agg.binders, body))
            elif name in self.entries:
                tensor, index, _ = self.entries[name]
                out = self.entry(tensor, tuple(i.replace(old, new) for i in index))
            else:
                out = s
        elif s.op == "const":
            out = s
        else:
            args = [self.rename(a, old, new, memo) for a in s.args]
            out = None if any(a is None for a in args) else _rebuild(s, cast(list[Sym], args))
        memo[s.serial] = out
        return out

    def reindex(self, s: Sym, bound: frozenset[str]) -> tuple[Sym, frozenset[str]]:
        """split-reindex for every split whose outer and inner indices are both bound."""
        changed = True
        while changed:
            changed = False
            for parent, f, outer, inner in list(self.splits.values()):
                o, i, a = f"<{outer}>", f"<{inner}>", f"<{parent}>"
                if o not in bound or i not in bound or a in self.free(s):
                    continue
                new = self.rename(s, f"({o}*{f}+{i})", a, {})
                if new is None or self.free(new) & {o, i}:
                    continue
                s, bound, changed = new, (bound - {o, i}) | {a}, True
                self.lemmas.add("split-reindex")
        return s, bound

    # -- aggregates -----------------------------------------------------------------------

    def agg(self, kind: str, bound: frozenset[str], body: Sym) -> Sym:
        """The canonical aggregate `kind_{bound} body` (see `LEMMAS`)."""
        body = normalize(body, frozenset(self.positive))
        live = bound & self.free(body)
        scale = ONE
        if kind == "sum" and live != bound:
            scale = mul(*(self.size(b[1:-1]) for b in sorted(bound - live)))
            self.lemmas.add("sum-const")
        elif live != bound:
            self.lemmas.add("max-const")
        if not live:
            return mul(scale, body) if kind == "sum" else body
        body, live = self.reindex(body, live)
        out = self._sum(live, body) if kind == "sum" else self._max(live, body)
        return mul(scale, out)

    def _depends(self, s: Sym, bound: frozenset[str]) -> bool:
        return bool(self.free(s) & bound)

    def _sum(self, bound: frozenset[str], body: Sym) -> Sym:
        if body.op == "add":
            self.lemmas.add("sum-linear")
            return add(*(self.agg("sum", bound, t) for t in body.args))
        if body.op == "mul":
            out = [f for f in body.args if not self._depends(f, bound)]
            rest = [f for f in body.args if self._depends(f, bound)]
            if out:
                self.lemmas.add("sum-hoist")
                return mul(*out, self.agg("sum", bound, mul(*rest)))
            inner = [f for f in rest if self._kind(f) == "sum"]
            if len(inner) == 1:
                return self._merge("sum", bound, inner[0], [f for f in rest if f is not inner[0]])
        if self._kind(body) == "sum":
            return self._merge("sum", bound, body, [])
        return self._atom("sum", bound, body)

    def _max(self, bound: frozenset[str], body: Sym) -> Sym:
        if body.op == "add":
            out = [t for t in body.args if not self._depends(t, bound)]
            if out:
                self.lemmas.add("max-shift")
                return add(*out, self.agg("max", bound, add(*(
                    t for t in body.args if self._depends(t, bound)))))
            inner = [t for t in body.args if self._kind(t) == "max"]
            if len(inner) == 1:
                return self._merge("max", bound, inner[0], [t for t in body.args
                                                            if t is not inner[0]], add)
        if body.op == "max":
            self.lemmas.add("max-lattice")
            return max_(*(self.agg("max", bound, t) for t in body.args))
        if body.op == "mul":
            pos = frozenset(self.positive)
            out = [f for f in body.args if not self._depends(f, bound) and positive(f, pos)]
            if out:
                self.lemmas.add("max-scale")
                return mul(*out, self.agg("max", bound, mul(*(
                    f for f in body.args if f not in out))))
            if all(f.op == "fn" and f.value == "exp" for f in body.args):
                self.lemmas.add("max-exp")
                return fn("exp", self.agg("max", bound, add(*(f.args[0] for f in body.args))))
        if body.op == "fn" and body.value == "exp":
            self.lemmas.add("max-exp")
            return fn("exp", self.agg("max", bound, body.args[0]))
        if self._kind(body) == "max":
            return self._merge("max", bound, body, [], add)
        return self._atom("max", bound, body)

    def _kind(self, s: Sym) -> str | None:
        agg = self.aggs.get(str(s.value)) if s.op == "var" else None
        return agg.kind if agg else None

    def _merge(self, kind: str, bound: frozenset[str], inner: Sym, rest: list[Sym],
               join: Callable[..., Sym] = mul) -> Sym:
        """Fubini: `R_B (c . R_C t) = R_{B+C} (c . t)`, unless a name of C is free in c
        or in B (it would be captured)."""
        agg = self.aggs[str(inner.value)]
        others = frozenset().union(*(self.free(r) for r in rest))
        if agg.binders & (others | bound):
            return self._atom(kind, bound, join(inner, *rest))
        self.lemmas.add(f"{kind}-fubini")
        return self.agg(kind, bound | agg.binders, join(agg.body, *rest))

    def _atom(self, kind: str, bound: frozenset[str], body: Sym) -> Sym:
        name = f"{kind}{{{','.join(sorted(bound))}}}#{body.serial}"
        if name not in self.aggs:
            self.aggs[name] = Agg(kind, bound, body)
            if positive(body, frozenset(self.positive)):
                self.positive.add(name)
                self.lemmas.add("agg-positive")
        return var(name)

    # -- evaluation -----------------------------------------------------------------------

    def value(self, t: Term, ix: Mapping[str, str], dom: list[Sym]) -> Sym:
        """The entry of `t` at the index `ix` (axis -> index expression)."""
        match t.op:
            case Op.IN:
                name = str(t.attrs[0])
                if name in self.holders:
                    return self.holders[name](dom)
                dims = cast(tuple[tuple[tuple[str, int], ...], ...], t.attrs[1])
                for a in (a for dim in dims for a, _ in dim):
                    self.size(a)
                return self.entry(name, tuple(ix[a] for dim in dims for a, _ in dim))
            case Op.CONST:
                return const(float(t.attrs[0]))  # type: ignore[arg-type]
            case Op.STORE:
                return self.value(t.args[0], ix, dom)
            case Op.SPLIT:
                axis, f = _split_attrs(t)
                outer, inner = self.split(axis, f)
                inner_ix = {k: v for k, v in ix.items() if k not in (outer, inner)}
                inner_ix[axis] = f"({ix[outer]}*{f}+{ix[inner]})"
                return self.value(t.args[0], inner_ix, dom)
            case Op.SUM | Op.RMAX | Op.LSE | Op.SOFTMAXAVG | Op.DOT:
                return self._reduce(t, ix, dom)
            case Op.READ:
                return self._read(t, ix, dom)
            case Op.GATHER:
                return self._gather(t, ix, dom)
            case op if op in SCALAR:
                return SCALAR[op](*(self.value(a, ix, dom) for a in t.args), dom)
        raise OutsideFragment(f"op {t.op} has no all-sizes semantics")

    def _read(self, t: Term, ix: Mapping[str, str], dom: list[Sym]) -> Sym:
        """An affine read, for every map: the operand at opaque index functions of the
        read's indices (`$g<k>_<axis>(...)`, one per map and operand axis), and where the
        map pads, `ite($in<k>[...] > 0, that, pad)` with an opaque in-range predicate."""
        m = read_map(t)
        if m.pad is not None and not math.isfinite(m.pad):
            raise OutsideFragment("a read padded with -inf")
        k = self.maps.setdefault(m.text, len(self.maps))
        own = [a for a, _ in m.axes]
        for a in own:
            self.size(a)
        at = ",".join(ix[a] for a in own)
        inner = {a: f"$g{k}_{a}({at})" for a, _ in m.forms}
        before = len(dom)
        v = self.value(t.args[0], inner, dom)
        if len(dom) > before:  # defined where read, or everywhere? left to the bounded method
            raise OutsideFragment("a partial op under a read")
        if m.pad is None:
            return v
        inside = self.entry(f"$in{k}", tuple(ix[a] for a in own))
        pad = const(0.0) if m.pad == 0.0 else var(f"$pad{k}")  # any other pad: any real
        return ite(gt0(inside), v, pad)

    def _gather(self, t: Term, ix: Mapping[str, str], dom: list[Sym]) -> Sym:
        """A gather (issue 18 part 3b), for every in-range label: the operand with the
        gathered axis at an opaque index function of the label's position
        (`$lab_<input>(...)`), the same on both sides of a rule, so what is proved holds
        whatever value each label takes in [0, size) (the range generated code checks at
        run time). A partial op under it whose definedness reads the gathered operand
        (a condition mentioning the label) is refused: the gather skips entries, and
        whether the skipped ones are defined is not a property of the entries read. A
        condition free of the label (a divisor free of the gathered axis) is kept."""
        x, labels = t.args
        name = str(labels.attrs[0])
        dims = cast(tuple[tuple[tuple[str, int], ...], ...], labels.attrs[1])
        own = [a for dim in dims for a, _ in dim]
        for a in own:
            self.size(a)
        inner = {**ix, str(t.attrs[0]): f"$lab_{name}({','.join(ix[a] for a in own)})"}
        before = len(dom)
        v = self.value(x, inner, dom)
        if any(self._mentions(d, "$lab_", set()) for d in dom[before:]):
            raise OutsideFragment("a partial op over the gathered axis under a gather")
        return v

    def _mentions(self, s: Sym, text: str, seen: set[int]) -> bool:
        """Whether `text` occurs in a variable of `s`, through aggregate bodies too."""
        if s.serial in seen:
            return False
        seen.add(s.serial)
        if s.op == "var":
            agg = self.aggs.get(str(s.value))
            return text in str(s.value) or (agg is not None
                                            and self._mentions(agg.body, text, seen))
        return any(self._mentions(a, text, seen) for a in s.args)

    def _reduce(self, t: Term, ix: Mapping[str, str], dom: list[Sym]) -> Sym:
        axis = t.axis
        self.size(axis)
        if axis in self.units:
            return self._reduce_unit(t, ix, dom)
        b = f"<{axis}>"
        inner = {**ix, axis: b}
        bound = frozenset({b})
        args = [self.value(a, inner, dom) for a in t.args]
        match t.op:
            case Op.SUM:
                return self.agg("sum", bound, args[0])
            case Op.RMAX:
                return self.agg("max", bound, args[0])
            case Op.DOT:
                return self.agg("sum", bound, mul(args[0], args[1]))
            case Op.LSE:  # log sum exp
                return SCALAR[Op.LOG](self.agg("sum", bound, fn("exp", args[0])), dom)
        w = fn("exp", args[0])  # SoftmaxAvg: (sum exp(s) v) / sum exp(s)
        return SCALAR[Op.DIV](self.agg("sum", bound, mul(w, args[1])),
                              self.agg("sum", bound, w), dom)


    def _reduce_unit(self, t: Term, ix: Mapping[str, str], dom: list[Sym]) -> Sym:
        """agg-unit: over an axis of size 1 a reduction is its operand at the index 0
        (the literal index `0`: an entry variable of its own, no bound index)."""
        self.lemmas.add("agg-unit")
        args = [self.value(a, {**ix, t.axis: "0"}, dom) for a in t.args]
        match t.op:
            case Op.SUM | Op.RMAX:
                return args[0]
            case Op.DOT:
                return mul(args[0], args[1])
            case Op.LSE:
                return SCALAR[Op.LOG](fn("exp", args[0]), dom)
        w = fn("exp", args[0])
        return SCALAR[Op.DIV](mul(w, args[1]), w, dom)


def _split_attrs(t: Term) -> tuple[str, int]:
    """The axis and the factor of a `Split` node."""
    return str(t.attrs[0]), int(cast(int, t.attrs[1]))


def _rebuild(s: Sym, args: list[Sym]) -> Sym:
    return fn(str(s.value), args[0]) if s.op == "fn" else REBUILD[s.op](*args)


# -- instances: everything but the sizes ----------------------------------------------------


def _factor_literals(rule: Rule) -> set[int]:
    """The literal split factors the rule writes; refuses a computed factor."""
    found: set[int] = set()

    def factor(a: object) -> None:
        match a:
            case Var():
                pass
            case int() | float() if not isinstance(a, bool) and a == int(a) and a >= 1:
                found.add(int(a))
            case _:
                raise OutsideFragment(f"split factor {a} is computed")

    def attr(a: object) -> None:
        if isinstance(a, AttrFun):
            if a.fun in FACTOR_FUNS:
                factor(a.args[1])
            for x in a.args:
                attr(x)

    def walk(p: Pattern) -> None:
        if isinstance(p, PNode):
            if p.op is Op.SPLIT:
                factor(p.attrs[1])
            for a in p.attrs:
                attr(a)
            for c in p.args:
                walk(c)

    walk(rule.lhs)
    walk(rule.rhs)
    return found


@dataclass(frozen=True)
class Instance:
    """One structural instance: the bindings (axes, factors, term variables' axes) and
    both sides built with stand-in sizes (the proof reads no size from them)."""

    bindings: Bindings
    lhs: Term
    rhs: Term | None
    factors: Mapping[str, int]

    def describe(self) -> str:
        parts = []
        for name, v in sorted(self.bindings.items()):
            if isinstance(v, Term):
                if not name.startswith("holder"):
                    axes = ", ".join(v.shape)
                    parts.append(f"?{name}[{axes}]" + (" (positive)" if v.op is Op.EXP else ""))
            elif name in self.factors:
                parts.append(f"?{name} = $f[{name}]")
            else:
                parts.append(f"?{name} = {v!r}")
        return ", ".join(parts) + "; every size symbolic"


def _lift_consts(p: Pattern, holders: dict[str, object], taken: set[str]) -> Pattern:
    """Every `(Const X)` whose X is not a number becomes a scalar placeholder variable
    (its value is X over the reals: a constant variable is a symbol, a size a size)."""
    match p:
        case PNode(Op.CONST, (attr,), ()) if isinstance(attr, Var | AttrFun):
            name = fresh_names([f"holder{len(holders)}"], taken)[0]
            taken.add(name)
            holders[name] = attr
            return Var(name)
        case PNode(op, attrs, args):
            return PNode(op, attrs, tuple(_lift_consts(a, holders, taken) for a in args))
    return p


@dataclass
class _Setup:
    rule: Rule
    lhs: Pattern
    rhs: Pattern
    holders: dict[str, object]
    factor_literals: set[int]
    literals: Literals


RESERVED = frozenset("<>{}#$,*+()")
"""Characters of the verifier's own names (indices, aggregates, sizes): a rule whose
variables or literal axes use one is left to the bounded method."""


def _setup(rule: Rule) -> _Setup:
    taken = pattern_vars(rule.lhs) | pattern_vars(rule.rhs)
    literal = rule_literals(rule)
    clash = sorted(n for n in taken | literal.strings
                   if RESERVED & set(n) or ("/" in n and n in literal.axes))
    if clash:
        raise OutsideFragment(f"names {clash} use a character the all-sizes method reserves "
                              "(or name a split part literally)")
    guarded = {c.map for c in rule.conditions if isinstance(c, Unpadded | PadZero)}
    if set(var_kinds(rule).maps) - guarded:  # a -inf pad is no real: no all-sizes proof
        raise OutsideFragment("a read map variable without (unpadded) or (pad-zero)")
    holders: dict[str, object] = {}
    lhs = _lift_consts(rule.lhs, holders, taken)
    rhs = _lift_consts(rule.rhs, holders, taken)
    return _Setup(rule, lhs, rhs, holders, _factor_literals(rule), literal)


Found = Iterator[tuple[Instance, dict[str, str], dict[int, Sym]]]
"""Structural instances, each with its axis names and its factor symbols."""


def instances(s: _Setup) -> Found:
    """Every structural instance of the rule `s` sets up, with the axis names and the
    factor symbols."""
    rule, literals = s.rule, s.literals
    kinds = var_kinds(rule)
    names_wanted = [f"a{i}" for i in range(len(kinds.axes))] + ["k"]
    fresh = fresh_names(names_wanted, literals.strings)
    axis_names, extra = fresh[:-1], fresh[-1]
    literal_axes = sorted(literals.axes)
    primes = [p for p in FACTOR_PRIMES if float(p) not in literals.numbers]
    factors = sorted(kinds.factors)
    positives = {c.term for c in rule.conditions if isinstance(c, Positive)}
    terms = sorted(kinds.terms - set(s.holders))
    for part in _partitions(sorted(kinds.axes)):
        for assigned in assignments(len(part), literal_axes):
            it = iter(axis_names)
            names = {v: lit if lit is not None else next(it)
                     for group, lit in zip(part, assigned, strict=True) for v in group}
            for fpart in _partitions(factors):
                for fassigned in assignments(len(fpart), sorted(s.factor_literals)):
                    if len(fpart) > len(primes):
                        raise OutsideFragment("too many factor variables")
                    values: dict[str, int] = {}
                    fsyms: dict[int, Sym] = {lit: const(lit) for lit in s.factor_literals}
                    for j, (group, lit) in enumerate(zip(fpart, fassigned, strict=True)):
                        value = lit if lit is not None else primes[j]
                        if lit is None:
                            fsyms[value] = var(f"$f[{'='.join(group)}]")
                        values.update({g: value for g in group})
                    yield from _with_structure(s, names, values, fsyms, extra, terms, positives)


def _with_structure(s: _Setup, names: dict[str, str], values: dict[str, int],
                    fsyms: dict[int, Sym], extra: str, terms: list[str],
                    positives: set[str]) -> Found:
    depth = 1 + sum(1 for _ in _splits(s.lhs)) + sum(1 for _ in _splits(s.rhs))
    unit = math.prod(set(values.values()) | s.factor_literals) or 1
    size = BASE * unit ** depth
    if size > MAX_SIZE:
        raise OutsideFragment("too many nested splits")
    universe = sorted(set(names.values()) | set(s.literals.axes) | {extra})
    sizes = dict.fromkeys(universe, size)
    subsets = [tuple(c) for r in range(len(universe) + 1)
               for c in itertools.combinations(universe, r)]
    for axes_tuple in itertools.product(subsets, repeat=len(terms)):
        b: Bindings = {**names, **values}
        for name, axes in zip(terms, axes_tuple, strict=True):
            t = In(name, tuple((a, sizes[a]) for a in axes))
            b[name] = exp(t) if name in positives else t
        for h in s.holders:
            b[h] = In(h, ())
        for maps in itertools.product(*(_placeholder_maps(s, m, b, sizes)
                                        for m in sorted(var_kinds(s.rule).maps))):
            b.update(zip(sorted(var_kinds(s.rule).maps), maps, strict=True))
            inst = _build(s, b, sizes, values)
            if inst is not None:
                yield inst, names, fsyms


def _placeholder_maps(s: _Setup, m: str, b: Bindings, sizes: Mapping[str, int]) -> list[str]:
    """Stand-ins for the map variable `m`, one unpadded and one padded with 0: `Context`
    reads a map through opaque index functions, so its forms never enter the proof (a
    shift keeps the padded one well formed). The read's axes are fresh names."""
    try:
        x = instantiate(var_kinds(s.rule).maps[m], b, sizes)
    except (ShapeError, RuleError, KeyError, ValueError, ZeroDivisionError):
        return []
    src = sorted(x.shape)
    own = fresh_names([f"r{i}" for i in range(len(src))],
                      s.literals.strings | set(x.all_sizes) | set(sizes))
    r = dict(zip(src, own, strict=True))
    n = {r[a]: x.shape[a] for a in src}
    out = [make_read_map({a: ({r[a]: 1}, 0) for a in src}, n, None).text]
    if src:  # padded with 0, and with any other real (`Context._read`)
        out += [make_read_map({a: ({r[a]: 1}, -1) for a in src}, n, p).text for p in (0.0, 1.0)]
    return out


def _splits(p: Pattern) -> Iterator[PNode]:
    if isinstance(p, PNode):
        if p.op is Op.SPLIT:
            yield p
        for a in p.args:
            yield from _splits(a)


def _build(s: _Setup, b: Bindings, sizes: Mapping[str, int],
           values: Mapping[str, int]) -> Instance | None:
    ctx = dict(sizes)
    try:
        lhs = instantiate(s.lhs, b, ctx)
    except (ShapeError, RuleError, KeyError, ValueError, ZeroDivisionError):
        return None
    ctx.update(lhs.all_sizes)
    structural = [c for c in s.rule.conditions if isinstance(c, NotIn | HasAxis | Divides
                                                             | Positive | Covers | Unpadded
                                                             | PadZero)]
    if not all(check_condition(c, b, ctx) for c in structural):
        return None
    try:
        rhs: Term | None = instantiate(s.rhs, b, ctx)
    except (ShapeError, RuleError, KeyError, ValueError, ZeroDivisionError):
        rhs = None
    return Instance(dict(b), lhs, rhs, values)


# -- the proof ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LemmaOutcome:
    ok: bool
    status: str
    instances: int
    counterexample: str | None = None
    lemmas: frozenset[str] = frozenset()


def _holder(attr: object, names: Mapping[str, str], values: Mapping[str, int],
            rule: Rule, ctx: Context) -> Callable[[list[Sym]], Sym]:
    fixed = {c.var: c.value for c in rule.conditions if isinstance(c, ConstEq)}

    def sym(a: object, dom: list[Sym]) -> Sym:
        match a:
            case Var(name) if name in fixed:
                return const(fixed[name])
            case Var(name):
                return var(f"$c[{name}]")
            case AttrFun("size", (ax,)):
                return ctx.size(_axis(ax, names))
            case AttrFun("quot", (ax, f)):
                outer, _ = ctx.split(_axis(ax, names), _factor(f, values))
                return ctx.sizes[outer]
            case AttrFun(fun, args) if fun in ATTR_SYM:
                return ATTR_SYM[fun](*(sym(x, dom) for x in args), dom)
            case bool():
                pass
            case int() | float():
                return const(a)
        raise OutsideFragment(f"constant {a} has no all-sizes meaning")

    return lambda dom: sym(attr, dom)


def _axis(a: object, names: Mapping[str, str]) -> str:
    if isinstance(a, Var):
        return names[a.name]
    if isinstance(a, str):
        return a
    raise OutsideFragment(f"axis {a} is computed")


def _factor(a: object, values: Mapping[str, int]) -> int:
    if isinstance(a, Var):
        return values[a.name]
    if isinstance(a, int | float) and not isinstance(a, bool):
        return int(a)
    raise OutsideFragment(f"split factor {a} is computed")


def check(rule: Rule, inst: Instance, names: Mapping[str, str], fsyms: dict[int, Sym],
          setup: _Setup, timeout_ms: int) -> tuple[str, str | None, set[str]]:
    """Prove one structural instance for every size: (status, why, lemmas used). When
    the proof fails, z3 is asked for integer sizes where the sides differ, and the rule
    is run there by the float64 interpreter: a disagreement makes it `refuted`."""
    assert inst.rhs is not None
    if set(inst.lhs.shape) != set(inst.rhs.shape):
        return "refuted", (f"shape: {inst.describe()}: left has axes {sorted(inst.lhs.shape)}, "
                           f"right {sorted(inst.rhs.shape)}"), set()
    ctx = Context(factor_syms=dict(fsyms))
    for node in (*postorder(inst.lhs), *postorder(inst.rhs)):
        if node.op is Op.SPLIT:  # every split axis gets its symbolic size first
            ctx.split(*_split_attrs(node))
    for h, attr in setup.holders.items():
        ctx.holders[h] = _holder(attr, names, inst.factors, rule, ctx)
    ob = Obligation()
    for c in rule.conditions:
        match c:
            case NonZero(v):
                ob.hyps.append(ne0(var(f"$c[{v}]")))
            case Divides(f, a):
                fs, n = ctx.factor(inst.factors[f]), ctx.size(names[a])
                ob.hyps += [gt0(add(fs, const(-1))), gt0(add(n, neg(fs)))]
            case Unit(a):
                ctx.units.add(names[a])
                ob.hyps.append(add(ctx.size(names[a]), const(-1)))  # n = 1
    out = {a: f"{{{a}}}" for a in inst.lhs.shape}
    left = ctx.value(inst.lhs, out, ob.dl)
    right = ctx.value(inst.rhs, out, ob.dr)
    ob.pairs = [(left, right)]
    ob.hyps += ctx.hyps
    ob.pos_vars = frozenset(ctx.positive)
    ob = normalize_obligation(ob)
    ob.dl = _canonical_domain(ctx, ob.dl)
    ob.dr = _canonical_domain(ctx, ob.dr)
    res = prove(ob, timeout_ms)
    if res.status == "proved":
        return "proved", None, ctx.lemmas
    if res.status == "unknown":
        return "unknown", f"{inst.describe()}: {res.reason}", ctx.lemmas
    seen: list[dict[str, float]] = []
    for _ in range(SIZE_ROUNDS):  # integer sizes where the identity fails, then run there
        whole = prove(ob, min(timeout_ms, INTEGER_TIMEOUT_MS), seen, integers=_is_size)
        if whole.status != "refuted" or whole.model is None:
            break
        confirmed = _confirm(rule, inst, names, whole.model)
        if confirmed is not None:
            return "refuted", (f"{inst.describe()}; the identity the lemmas leave fails at "
                               f"sizes and values {_values(whole.model)}\n    confirmed "
                               f"numerically at those sizes: {confirmed}"), ctx.lemmas
        seen.append({k: v for k, v in whole.model.items() if _is_size(k)})
        if not seen[-1]:
            break
    return "unproved", (f"{inst.describe()}; the lemmas leave a real identity z3 refutes "
                        f"({res.reason}) at {_values(res.model or {})}"), ctx.lemmas


SIZE_ROUNDS = 8
"""Integer size assignments tried (each other than the ones before) for a counterexample."""


def _values(model: Mapping[str, float]) -> str:
    return ", ".join(f"{k} = {v:.4g}" for k, v in sorted(model.items()) if "#" not in k)


INTEGER_TIMEOUT_MS = 3_000


def _is_size(name: str) -> bool:
    return name[:3] in ("$n[", "$q[", "$f[")


def _confirm(rule: Rule, inst: Instance, names: Mapping[str, str],
             model: Mapping[str, float]) -> str | None:
    """Run the rule by the float64 interpreter at the sizes (and constants) of a z3
    model; a description of the mismatch, or None (no mismatch, or the model's sizes
    are not sizes a program can have)."""
    sizes: dict[str, int] = {}
    for name, v in model.items():
        if name.startswith("$n[") and v == int(v) and 1 <= v <= 1 << 12:
            sizes[name[3:-1]] = int(v)
    b: Bindings = {}
    for name, v in inst.bindings.items():
        if name in inst.factors:
            f = [x for k, x in model.items() if k.startswith("$f[") and name in
                 k[3:-1].split("=")]
            b[name] = int(f[0]) if f and f[0] == int(f[0]) and f[0] >= 1 else v
        elif isinstance(v, Term) and v.op in (Op.IN, Op.EXP) and not name.startswith("holder"):
            leaf = v if v.op is Op.IN else v.args[0]
            try:
                t = In(name, tuple((a, sizes[a]) for a in leaf.shape))
            except (KeyError, ShapeError):
                return None
            b[name] = exp(t) if v.op is Op.EXP else t
        elif not isinstance(v, Term):
            b[name] = v
    consts = {c for c in var_kinds(rule).consts}
    fixed = {c.var: c.value for c in rule.conditions if isinstance(c, ConstEq)}
    for c in consts:
        value = model.get(f"$c[{c}]", 0.5)
        b[c] = fixed.get(c, float(round(value * 8) / 8) or 0.5)
    ctx = dict(sizes)
    try:
        lhs = instantiate(rule.lhs, b, ctx)
        ctx.update(lhs.all_sizes)
        if not all(check_condition(c, b, ctx) for c in rule.conditions):
            return None
        rhs = instantiate(rule.rhs, b, ctx)
    except (ShapeError, RuleError, KeyError, ValueError, ZeroDivisionError):
        return None
    if largest_tensor(lhs, rhs) > MAX_ELEMENTS:
        return None
    return compare(Concrete(b, ctx, lhs, rhs), seed=0)


def _canonical_domain(ctx: Context, atoms: list[Sym]) -> list[Sym]:
    """Each domain atom with a bound split index renamed to its parent (the atom holds
    for every index, and (o, i) -> o*F+i is a bijection)."""
    out = []
    for atom in atoms:
        atom, _ = ctx.reindex(atom, frozenset(t for t in ctx.free(atom) if t.startswith("<")))
        out.append(atom)
    return out


def verify_all_sizes(rule: Rule, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> LemmaOutcome:
    """Prove `rule` for every size (see the module doc); stop at the first failure."""
    Sym.reset()
    setup = _setup(rule)
    count = 0
    lemmas: set[str] = set()
    for inst, names, fsyms in instances(setup):
        if inst.rhs is None:
            continue
        count += 1
        status, why, used = check(rule, inst, names, fsyms, setup, timeout_ms)
        lemmas |= used
        if status != "proved":
            return LemmaOutcome(False, status, count, why, frozenset(lemmas))
    if count == 0:
        return LemmaOutcome(False, "vacuous", 0, "no instance applies")
    return LemmaOutcome(True, "proved", count, None, frozenset(lemmas))
