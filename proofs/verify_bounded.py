"""Bounded-exhaustive verification of rules with reductions, splits and stores.

An *instance* of a rule fixes everything a match could bind: which axis variables
name the same axis, every axis size, every split factor, and the axes of every term
variable (any subset of the rule's axes plus one extra axis `k`, the rest of the
program). A term variable is an input of fresh reals over its axes; one with a
`(positive ?x)` condition is `exp` of such an input (every positive real is one,
and the positivity analysis then proves the condition). The instance is kept when
the left side is well formed and every condition holds, by the one evaluator
`check_condition` (the same code the checker and rewrites run); then both sides
must have the same shape and z3 must prove every entry equal (`prove`).

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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import cast

from kernelsat.ir import In, ShapeError, Term, exp
from kernelsat.ops import REDUCTIONS, Op
from kernelsat.proofs.normalize import Sym, ne0, var
from kernelsat.proofs.verify_smt import (
    DEFAULT_TIMEOUT_MS,
    Obligation,
    SmtResult,
    normalize_obligation,
    prove,
)
from kernelsat.proofs.verify_sym import evaluate, inputs_for
from kernelsat.rewrites.rule import (
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
)

SENTINEL_BASE = 7919.0625
"""Placeholder constants for `(Const ?c)` variables, read back as symbols."""


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
    consts: set[str] = field(default_factory=set)
    terms: set[str] = field(default_factory=set)
    const_arith: bool = False


def _attr_kinds(a: object, role: str, k: VarKinds) -> None:
    match a:
        case Var(name) if role == "axis":
            k.axes.add(name)
        case Var(name) if role == "const":
            k.consts.add(name)
        case Var(name):
            k.factors.setdefault(name, None)
        case AttrFun(f, args) if f in ("outer", "inner", "quot"):
            _attr_kinds(args[0], "axis", k)
            _attr_kinds(args[1], "factor", k)
            if isinstance(args[0], Var) and isinstance(args[1], Var):
                k.factors[args[1].name] = args[0].name
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
                    if isinstance(attrs[0], Var) and isinstance(attrs[1], Var):
                        k.factors[attrs[1].name] = attrs[0].name
                elif op in REDUCTIONS:
                    _attr_kinds(attrs[0], "axis", k)
                elif op is Op.CONST:
                    _attr_kinds(attrs[0], "const", k)
                for a in args:
                    walk(a)

    walk(rule.lhs)
    walk(rule.rhs)
    for c in rule.conditions:
        if isinstance(c, Divides):
            k.factors[c.factor] = c.axis
            k.axes.add(c.axis)
    return k


def _partitions(items: list[str]) -> Iterator[list[list[str]]]:
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for part in _partitions(rest):
        for i in range(len(part)):
            yield [*part[:i], [first, *part[i]], *part[i + 1:]]
        yield [[first], *part]


@dataclass(frozen=True)
class Instance:
    """One concrete match of a rule: bindings, sizes and both sides as terms."""

    bindings: Bindings
    sizes: Mapping[str, int]
    lhs: Term
    rhs: Term | None
    consts: Mapping[float, Sym]

    def describe(self) -> str:
        parts = []
        for name, v in sorted(self.bindings.items()):
            if isinstance(v, Term):
                shape = ", ".join(f"{a}:{s}" for a, s in v.shape.items())
                parts.append(f"?{name}[{shape}]" + (" (positive)" if v.op is Op.EXP else ""))
            elif isinstance(v, float) and v in self.consts:
                parts.append(f"?{name} = symbolic")
            else:
                parts.append(f"?{name} = {v!r}")
        return ", ".join(parts)


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


def _divisors(n: int, proper: bool) -> list[int]:
    return [f for f in range(1, n + 1) if n % f == 0 and (not proper or 1 < f < n)]


def instances(rule: Rule, choices: Choices) -> Iterator[Instance]:
    """Every instance (or, with a random `choices`, one random candidate) of `rule`."""
    kinds = var_kinds(rule)
    if kinds.const_arith and kinds.consts and choices.rng is None:
        raise RuleError(f"{rule.name}: constant arithmetic is verified only elementwise")
    split_axes = {a for a in kinds.factors.values() if a}
    positives = {c.term for c in rule.conditions if isinstance(c, Positive)}
    fixed = {c.var: c.value for c in rule.conditions if isinstance(c, ConstEq)}
    for part in choices.pick(list(_partitions(sorted(kinds.axes)))):
        names = {v: f"a{i}" for i, group in enumerate(part) for v in group}
        concrete = sorted(set(names.values()))
        splitting = {names[a] for a in split_axes}
        top = {c: choices.bounds.split if c in splitting else choices.bounds.size for c in concrete}
        ranges = [list(range(1, top[c] + 1)) for c in concrete]
        for size_tuple in choices.pick(list(itertools.product(*ranges))):
            sizes = dict(zip(concrete, size_tuple, strict=True))
            sizes.update(choices.bounds.extra)
            yield from _with_sizes(rule, kinds, names, sizes, positives, fixed, choices)


def _with_sizes(rule: Rule, kinds: VarKinds, names: Mapping[str, str], sizes: dict[str, int],
                positives: set[str], fixed: Mapping[str, float],
                choices: Choices) -> Iterator[Instance]:
    factor_opts = []
    divides = {c.factor for c in rule.conditions if isinstance(c, Divides)}
    for f in sorted(kinds.factors):
        axis = kinds.factors[f]
        n = sizes[names[axis]] if axis else max(sizes.values())
        factor_opts.append(_divisors(n, proper=f in divides))
    universe = sorted(sizes)
    subsets = [tuple(c) for r in range(len(universe) + 1)
               for c in itertools.combinations(universe, r)]
    terms = sorted(kinds.terms)
    consts = sorted(kinds.consts - set(fixed))
    for factor_tuple in choices.pick(list(itertools.product(*factor_opts))):
        for axes_tuple in choices.pick(list(itertools.product(subsets, repeat=len(terms)))):
            b: Bindings = {v: a for v, a in names.items()}
            b.update(zip(sorted(kinds.factors), factor_tuple, strict=True))
            for name, axes in zip(terms, axes_tuple, strict=True):
                t = In(name, tuple((a, sizes[a]) for a in axes))
                b[name] = exp(t) if name in positives else t
            sentinels: dict[float, Sym] = {}
            for i, c in enumerate(consts):
                if choices.rng is None:
                    b[c] = SENTINEL_BASE + i
                    sentinels[SENTINEL_BASE + i] = var(f"?{c}")
                else:
                    b[c] = round(choices.rng.uniform(-2, 2), 3) or 0.5
            b.update(fixed)
            inst = _build(rule, b, sizes, sentinels)
            if inst is not None:
                yield inst


def _build(rule: Rule, b: Bindings, sizes: Mapping[str, int],
           sentinels: Mapping[float, Sym]) -> Instance | None:
    ctx = dict(sizes)
    try:
        lhs = instantiate(rule.lhs, b, ctx)
    except (ShapeError, RuleError, KeyError, ValueError, ZeroDivisionError):
        return None
    ctx.update(lhs.all_sizes)
    if not all(check_condition(c, b, ctx) for c in rule.conditions):
        return None
    try:
        rhs: Term | None = instantiate(rule.rhs, b, ctx)
    except (ShapeError, RuleError, KeyError, ValueError, ZeroDivisionError):
        rhs = None  # the rule does not apply here (the rewrite would be refused)
    return Instance(dict(b), ctx, lhs, rhs, dict(sentinels))


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
        if isinstance(c, NonZero) and inst.bindings[c.var] in inst.consts:
            ob.hyps.append(ne0(inst.consts[cast(float, inst.bindings[c.var])]))
    left = evaluate(inst.lhs, env, ob.dl, inst.consts)
    right = evaluate(inst.rhs, env, ob.dr, inst.consts)
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
