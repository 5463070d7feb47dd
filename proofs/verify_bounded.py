"""Bounded-exhaustive verification of rules with reductions, splits and stores.

An *instance* of a rule fixes everything a match could bind: which axis variables
name the same axis (or an axis the rule writes literally), every axis size, every
split factor, and the axes of every term variable (any subset of the rule's axes,
its literal axes and one extra axis `k`, the rest of the program). A term variable
is an input of fresh reals over its axes; one with a `(positive ?x)` condition is
`exp` of such an input (every positive real is one, and the positivity analysis
then proves the condition). A constant variable `(Const ?c)` is a scalar input: a
symbol, never a placeholder value a literal could equal. The instance is kept when
the left side is well formed and every condition holds, by the one evaluator
`check_condition` (the same code the checker and rewrites run); then both sides
must have the same shape and z3 must prove every entry equal (`prove`).

Placeholders are fresh by construction: axis names `a0 a1 ... k` (and the scalar
inputs `const_c`) get a suffix `_` until none equals, or is the stem of a split axis
`name/o4` equal to, anything the rule writes (`fresh_names`).

Instance space (`Bounds`): axis sizes 1..`size` (4), axes that are split 1..`split`
(8) with every valid factor, the extra axis `k` of size 2 (`Bounds`).

>>> from kernelsat.rewrites.rule import parse_rule
>>> r = parse_rule("hoist: (Sum ?a (mul ?x ?y)) => (mul ?x (Sum ?a ?y)) if (not-in ?a ?x) [r]")
>>> out = verify_bounded(r)
>>> out.ok, out.instances > 0
(True, True)
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from kernelsat.affine import ReadMap, make_read_map
from kernelsat.ir import In, ShapeError, Term, exp
from kernelsat.ops import AXIS_ATTR, REDUCTIONS, Op
from kernelsat.proofs.normalize import Sym, ne0
from kernelsat.proofs.verify_smt import (
    DEFAULT_TIMEOUT_MS,
    Obligation,
    SmtResult,
    normalize_obligation,
    prove,
)
from kernelsat.proofs.verify_sym import evaluate, inputs_for
from kernelsat.rewrites.rule import (
    ATTR_FUN_ROLES,
    FACTOR_FUNS,
    AttrFun,
    Bindings,
    ConstEq,
    Divides,
    NonZero,
    Pattern,
    PNode,
    Positive,
    Rule,
    RuleError,
    Var,
    check_condition,
    instantiate,
    pattern_vars,
)


@dataclass(frozen=True)
class Bounds:
    """The instance space of bounded verification."""

    size: int = 4
    split: int = 8
    extra: tuple[tuple[str, int], ...] = (("k", 2),)
    """Axes no pattern names: they stand for the rest of the program (broadcasting)."""

    def text(self) -> str:
        return f"sizes<={self.size}, split sizes<={self.split}, all factors"


@dataclass
class VarKinds:
    """The role of each variable of a rule."""

    axes: set[str] = field(default_factory=set)
    factors: dict[str, str | None] = field(default_factory=dict)  # factor var -> its axis var
    factor_axes: dict[str, list[Var | str]] = field(default_factory=dict)
    """Every axis (variable or literal) each factor variable splits or divides."""
    consts: set[str] = field(default_factory=set)
    terms: set[str] = field(default_factory=set)
    const_arith: bool = False
    maps: dict[str, Pattern] = field(default_factory=dict)
    """Affine read map variables and the operand pattern each reads (`(Read ?m x)`)."""


def _attr_kinds(a: object, role: str, k: VarKinds) -> None:
    match a:
        case Var(name) if role == "axis":
            k.axes.add(name)
        case Var(name) if role == "const":
            k.consts.add(name)
        case Var(name):
            k.factors.setdefault(name, None)
        case AttrFun(f, args) if f in FACTOR_FUNS:
            _attr_kinds(args[0], "axis", k)
            _attr_kinds(args[1], "factor", k)
            _factor_of(args[0], args[1], k)
        case AttrFun("size", args):
            _attr_kinds(args[0], "axis", k)
        case AttrFun(_, args):
            k.const_arith = True
            for x in args:
                _attr_kinds(x, "const", k)


def var_kinds(rule: Rule) -> VarKinds:
    """Classify every variable of `rule` by where it occurs."""
    k = VarKinds()

    def walk(p: Pattern) -> None:
        match p:
            case Var(name):
                k.terms.add(name)
            case PNode(op, attrs, args):
                if op is Op.SPLIT:
                    _attr_kinds(attrs[0], "axis", k)
                    _attr_kinds(attrs[1], "factor", k)
                    _factor_of(attrs[0], attrs[1], k)
                elif op in AXIS_ATTR:  # a reduction's or a gather's axis
                    _attr_kinds(attrs[0], "axis", k)
                elif op is Op.CONST:
                    _attr_kinds(attrs[0], "const", k)
                elif op is Op.READ and isinstance(attrs[0], Var):
                    k.maps.setdefault(attrs[0].name, args[0])
                for a in args:
                    walk(a)

    walk(rule.lhs)
    walk(rule.rhs)
    for c in rule.conditions:
        if isinstance(c, Divides):
            k.factors[c.factor] = c.axis
            k.factor_axes.setdefault(c.factor, []).append(Var(c.axis))
            k.axes.add(c.axis)
    return k


def _factor_of(axis: object, factor: object, k: VarKinds) -> None:
    if isinstance(factor, Var) and isinstance(axis, Var | str):
        k.factor_axes.setdefault(factor.name, []).append(axis)
        if isinstance(axis, Var):
            k.factors[factor.name] = axis.name


def _partitions(items: list[str]) -> Iterator[list[list[str]]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1:]]
        yield [[first], *part]


# -- what the rule writes, and placeholders that cannot coincide with it ------------------


@dataclass(frozen=True)
class Literals:
    """Everything a rule writes literally: axis names (and any other string) and numbers."""

    axes: frozenset[str]
    split: frozenset[str]
    """The literal axes the rule splits (or names a part of)."""
    strings: frozenset[str]
    numbers: frozenset[float]


def rule_literals(rule: Rule) -> Literals:
    """The literal axes, strings and numbers of `rule` (patterns and conditions)."""
    axes: set[str] = set()
    split: set[str] = set()
    strings: set[str] = set()
    numbers: set[float] = set()

    def attr(a: object, is_axis: bool, is_split: bool) -> None:
        match a:
            case str():
                strings.add(a)
                if is_axis:
                    axes.add(a)
                if is_split:
                    split.add(a)
            case bool():
                pass
            case int() | float():
                numbers.add(float(a))
            case AttrFun(fun, args):
                for i, x in enumerate(args):
                    first = i == 0 and fun in ATTR_FUN_ROLES  # each reads an axis first
                    attr(x, first, first and fun in FACTOR_FUNS)

    def walk(p: Pattern) -> None:
        if isinstance(p, PNode):
            for i, a in enumerate(p.attrs):
                first = i == 0 and (p.op in REDUCTIONS or p.op is Op.SPLIT)
                attr(a, first, first and p.op is Op.SPLIT)
            for c in p.args:
                walk(c)

    walk(rule.lhs)
    walk(rule.rhs)
    numbers |= {c.value for c in rule.conditions if isinstance(c, ConstEq)}
    return Literals(frozenset(axes), frozenset(split), frozenset(strings),
                    frozenset(numbers))


def _clashes(name: str, taken: Iterable[str]) -> bool:
    return any(t == name or t.startswith(name + "/") for t in taken)


def fresh_names(wanted: Sequence[str], taken: Iterable[str]) -> list[str]:
    """`wanted`, each with the same run of `_` appended, as short as makes every name (and
    every split axis `name/o4` derived from it) differ from everything in `taken`: what
    a rule writes can never be one of the verifier's placeholders."""
    taken = set(taken)
    suffix = ""
    while any(_clashes(w + suffix, taken) for w in wanted):
        suffix += "_"
    return [w + suffix for w in wanted]


def assignments[L](groups: int, literals: Sequence[L]) -> Iterator[tuple[L | None, ...]]:
    """For each group of coinciding variables (axes, factors): a literal of the rule it
    names (each at most once), or None for a fresh placeholder."""
    if groups == 0:
        yield ()
        return
    for rest in assignments(groups - 1, literals):
        yield (None, *rest)
        for lit in literals:
            if lit not in rest:
                yield (lit, *rest)


def _consts_as_terms(p: Pattern, inputs: Mapping[str, str]) -> Pattern:
    """`p` with every `(Const ?c)` of a placeholder constant replaced by a term variable
    (bound to a scalar input): a symbol that no literal constant can be confused with."""
    match p:
        case PNode(Op.CONST, (Var(c),), ()) if c in inputs:
            return Var(inputs[c])
        case PNode(op, attrs, args):
            return PNode(op, attrs, tuple(_consts_as_terms(a, inputs) for a in args))
    return p


@dataclass(frozen=True)
class Instance:
    """One concrete match of a rule: bindings, sizes and both sides as terms. `consts`
    maps each constant variable proved symbolically to the scalar input standing for it."""

    bindings: Bindings
    sizes: Mapping[str, int]
    lhs: Term
    rhs: Term | None
    consts: Mapping[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        parts = [f"?{c} = symbolic" for c in self.consts]
        stand_ins = set(self.consts.values())
        for name, v in sorted(self.bindings.items()):
            if name in stand_ins:
                continue
            if isinstance(v, Term):
                shape = ", ".join(f"{a}:{s}" for a, s in v.shape.items())
                parts.append(f"?{name}[{shape}]" + (" (positive)" if v.op is Op.EXP else ""))
            else:
                parts.append(f"?{name} = {v!r}")
        return ", ".join(sorted(parts))


@dataclass
class Choices:
    """Where an instance's free choices come from: every one (exhaustive) or one at random."""

    rng: random.Random | None = None
    bounds: Bounds = field(default_factory=Bounds)

    def pick[T](self, options: list[T]) -> Iterator[T]:
        if self.rng is None:
            yield from options
        elif options:
            yield self.rng.choice(options)

    def product[T](self, ranges: Sequence[Sequence[T]]) -> Iterator[tuple[T, ...]]:
        """`pick` over the product of `ranges`, without listing it when random."""
        if self.rng is None:
            yield from itertools.product(*ranges)
        elif all(ranges):
            rng = self.rng
            yield tuple(rng.choice(r) for r in ranges)

    def constant(self, avoid: frozenset[float]) -> float:
        """A random nonzero constant, a multiple of 1/8 (so sums and products of two are
        exact) and none of the numbers the rule writes."""
        assert self.rng is not None
        while True:
            v = self.rng.randint(-24, 24) / 8
            if v != 0 and v not in avoid:
                return v


def _divisors(n: int, proper: bool) -> list[int]:
    return [f for f in range(1, n + 1) if n % f == 0 and (not proper or 1 < f < n)]


@dataclass(frozen=True)
class _Plan:
    """What every instance of one rule shares: the variable roles, the placeholders."""

    rule: Rule
    kinds: VarKinds
    literals: Literals
    axis_names: list[str]
    extra: tuple[tuple[str, int], ...]
    const_inputs: Mapping[str, str]
    lhs: Pattern
    rhs: Pattern


def _plan(rule: Rule, choices: Choices) -> _Plan:
    kinds = var_kinds(rule)
    if kinds.const_arith and kinds.consts and choices.rng is None:
        raise RuleError(f"{rule.name}: constant arithmetic is verified only elementwise")
    literals = rule_literals(rule)
    wanted = [f"a{i}" for i in range(len(kinds.axes))] + [a for a, _ in choices.bounds.extra]
    names = fresh_names(wanted, literals.strings)
    extra = tuple((n, s) for n, (_, s) in zip(names[len(kinds.axes):], choices.bounds.extra,
                                              strict=True))
    fixed = {c.var for c in rule.conditions if isinstance(c, ConstEq)}
    symbolic = sorted(kinds.consts - fixed) if choices.rng is None else []
    taken = pattern_vars(rule.lhs) | pattern_vars(rule.rhs)
    inputs = dict(zip(symbolic, fresh_names([f"const_{c}" for c in symbolic], taken),
                      strict=True))
    return _Plan(rule, kinds, literals, names[:len(kinds.axes)], extra, inputs,
                 _consts_as_terms(rule.lhs, inputs), _consts_as_terms(rule.rhs, inputs))


def instances(rule: Rule, choices: Choices) -> Iterator[Instance]:
    """Every instance (or, with a random `choices`, one random candidate) of `rule`.

    Axis variables become placeholder axes `a0 a1 ...` (or, where some group of them
    names an axis the rule writes, that axis); the rest of the program is the extra
    axes; constant variables are symbols (scalar inputs) in exhaustive mode and random
    constants in random mode. Every placeholder differs from everything the rule
    writes (`fresh_names`), so a rule can never name one."""
    plan = _plan(rule, choices)
    split_axes = {a for a in plan.kinds.factors.values() if a}
    literal_axes = sorted(plan.literals.axes)
    for part in choices.pick(list(_partitions(sorted(plan.kinds.axes)))):
        for assigned in choices.pick(list(assignments(len(part), literal_axes))):
            fresh = iter(plan.axis_names)
            names = {v: lit if lit is not None else next(fresh)
                     for group, lit in zip(part, assigned, strict=True) for v in group}
            concrete = sorted(set(names.values()) | set(literal_axes))
            splitting = {names[a] for a in split_axes} | plan.literals.split
            top = {c: choices.bounds.split if c in splitting else choices.bounds.size
                   for c in concrete}
            ranges = [list(range(1, top[c] + 1)) for c in concrete]
            for size_tuple in choices.product(ranges):
                sizes = dict(zip(concrete, size_tuple, strict=True))
                sizes.update(plan.extra)
                yield from _with_sizes(plan, names, sizes, choices)


def _with_sizes(plan: _Plan, names: Mapping[str, str], sizes: dict[str, int],
                choices: Choices) -> Iterator[Instance]:
    rule, kinds = plan.rule, plan.kinds
    positives = {c.term for c in rule.conditions if isinstance(c, Positive)}
    fixed = {c.var: c.value for c in rule.conditions if isinstance(c, ConstEq)}
    factor_opts = [_factor_options(f, kinds, names, sizes, rule) for f in sorted(kinds.factors)]
    universe = sorted(sizes)
    subsets = [tuple(c) for r in range(len(universe) + 1)
               for c in itertools.combinations(universe, r)]
    terms = sorted(kinds.terms)
    consts = sorted(kinds.consts - set(fixed) - set(plan.const_inputs))
    for factor_tuple in choices.product(factor_opts):
        for axes_tuple in choices.product([subsets] * len(terms)):
            b: Bindings = {v: a for v, a in names.items()}
            b.update(zip(sorted(kinds.factors), factor_tuple, strict=True))
            for name, axes in zip(terms, axes_tuple, strict=True):
                t = In(name, tuple((a, sizes[a]) for a in axes))
                b[name] = exp(t) if name in positives else t
            for stand_in in plan.const_inputs.values():
                b[stand_in] = In(stand_in, ())
            for c in consts:
                b[c] = choices.constant(plan.literals.numbers)
            b.update(fixed)
            for maps in choices.product(_map_options(plan, b, sizes)):
                b.update(zip(sorted(kinds.maps), maps, strict=True))
                inst = _build(plan, b, sizes)
                if inst is not None:
                    yield inst


def _map_options(plan: _Plan, b: Bindings, sizes: Mapping[str, int]) -> list[list[str]]:
    """For each affine read map variable (sorted), the maps an instance tries over the
    operand it reads (instantiated from `b`): the identity, a shift by one padded with 0,
    a reversal, a prefix (entries never read: a rule must not change where a program is
    defined), a stride-2 window of width 2 (unpadded where it fits), and a window that
    leaves the operand on both sides padded with -1.5. The read's own axes are fresh
    placeholders (`r0 r1 ...`, never anything the rule writes)."""
    out: list[list[str]] = []
    for name in sorted(plan.kinds.maps):
        try:
            x = instantiate(plan.kinds.maps[name], b, sizes)
        except (ShapeError, RuleError, KeyError, ValueError, ZeroDivisionError):
            out.append([])
            continue
        src = sorted(x.shape)
        own = fresh_names([f"r{i}" for i in range(len(src))] + ["w"],
                          plan.literals.strings | set(x.all_sizes) | set(sizes))
        r = dict(zip(src, own, strict=False))
        w = own[-1]
        n = dict(x.shape)
        options: list[ReadMap] = [
            make_read_map({a: ({r[a]: 1}, 0) for a in src}, {r[a]: n[a] for a in src}, None),
            make_read_map({a: ({r[a]: 1}, -1) for a in src}, {r[a]: n[a] for a in src}, 0.0),
            make_read_map({a: ({r[a]: -1}, n[a] - 1) for a in src},
                          {r[a]: n[a] for a in src}, None),
            make_read_map({a: ({r[a]: 1}, 0) for a in src},  # a prefix: some never read
                          {r[a]: max(1, n[a] - 1) for a in src}, None),
        ]
        if src:
            first = src[0]
            half = max(1, n[first] // 2)
            forms = {a: ({r[a]: 1}, 0) for a in src}
            forms[first] = ({r[first]: 2, w: 1}, 0)
            sizes_w = {**{r[a]: n[a] for a in src}, r[first]: half, w: 2}
            fits = 2 * (half - 1) + 1 < n[first]
            options.append(make_read_map(forms, sizes_w, None if fits else 0.0))
            forms[first] = ({r[first]: 1, w: 1}, -1)
            options.append(make_read_map(forms, {**sizes_w, r[first]: n[first], w: 3}, -1.5))
        out.append([m.text for m in options])
    return out


def _factor_options(f: str, kinds: VarKinds, names: Mapping[str, str],
                    sizes: Mapping[str, int], rule: Rule) -> list[int]:
    """Every value a match can bind factor `f` to: a proper divisor of the axis a
    `(divides ?f ?a)` names; else a divisor of any axis it splits; else any size."""
    for c in rule.conditions:
        if isinstance(c, Divides) and c.factor == f:
            return _divisors(sizes[names[c.axis]], proper=True)
    ns = {sizes[names[a.name]] if isinstance(a, Var) else sizes[a]
          for a in kinds.factor_axes.get(f, ()) if not isinstance(a, str) or a in sizes}
    if not ns:
        return list(range(1, max(sizes.values()) + 1))
    return sorted({d for n in ns for d in _divisors(n, proper=False)})


def _build(plan: _Plan, b: Bindings, sizes: Mapping[str, int]) -> Instance | None:
    ctx = dict(sizes)
    try:
        lhs = instantiate(plan.lhs, b, ctx)
    except (ShapeError, RuleError, KeyError, ValueError, ZeroDivisionError):
        return None
    ctx.update(lhs.all_sizes)
    # a symbolic constant's (nonzero ?c) is a hypothesis of the proof (`check_instance`)
    conditions = [c for c in plan.rule.conditions
                  if not (isinstance(c, NonZero) and c.var in plan.const_inputs)]
    if not all(check_condition(c, b, ctx) for c in conditions):
        return None
    try:
        rhs: Term | None = instantiate(plan.rhs, b, ctx)
    except (ShapeError, RuleError, KeyError, ValueError, ZeroDivisionError):
        rhs = None  # the rule does not apply here (the rewrite would be refused)
    return Instance(dict(b), ctx, lhs, rhs, dict(plan.const_inputs))


@dataclass(frozen=True)
class BoundedOutcome:
    ok: bool
    status: str
    instances: int
    counterexample: str | None = None
    smt_calls: int = 0


def check_instance(rule: Rule, inst: Instance,
                   timeout_ms: int = DEFAULT_TIMEOUT_MS) -> tuple[SmtResult, str | None]:
    """Prove one instance; on failure also say why, with shapes and values."""
    assert inst.rhs is not None
    if dict(inst.lhs.shape) != dict(inst.rhs.shape):
        return SmtResult("refuted"), (
            f"shape: {inst.describe()}: left {dict(inst.lhs.shape)}, right {dict(inst.rhs.shape)}")
    env = inputs_for(inst.lhs) | inputs_for(inst.rhs)
    ob = Obligation()
    for c in rule.conditions:
        if isinstance(c, NonZero) and c.var in inst.consts and inst.consts[c.var] in env:
            ob.hyps.append(ne0(cast(Sym, env[inst.consts[c.var]].array.item())))
    left = evaluate(inst.lhs, env, ob.dl)
    right = evaluate(inst.rhs, env, ob.dr)
    order = tuple(inst.lhs.shape)
    ob.pairs = list(zip(left.entries(order, inst.lhs.shape), right.entries(order, inst.lhs.shape),
                        strict=True))
    res = prove(normalize_obligation(ob), timeout_ms)
    if res.status == "proved":
        return res, None
    if res.status == "unknown":
        return res, f"{inst.describe()}: {res.reason}"
    values = ", ".join(f"{k} = {v:.4g}" for k, v in sorted((res.model or {}).items())
                       if "(" not in k)
    return res, f"{res.reason}: {inst.describe()}; values {values}"


def verify_bounded(rule: Rule, bounds: Bounds | None = None,
                   timeout_ms: int = DEFAULT_TIMEOUT_MS) -> BoundedOutcome:
    """Prove every instance of `rule` within `bounds`; stop at the first failure."""
    Sym.reset()
    count = calls = 0
    for inst in instances(rule, Choices(None, bounds or Bounds())):
        if inst.rhs is None:
            continue
        count += 1
        res, why = check_instance(rule, inst, timeout_ms)
        calls += 0 if res.trivial else 1
        if why is not None:
            return BoundedOutcome(False, res.status, count, why, calls)
    if count == 0:
        return BoundedOutcome(False, "vacuous", 0, "no instance within the bounds applies")
    return BoundedOutcome(True, "proved", count, None, calls)
