"""Proving `lhs = rhs` with z3, and the elementwise verifier.

An obligation is: hypotheses `H` (side conditions), the domains `DL`, `DR` of the
two sides (every divisor nonzero, every `log` argument positive, every `sqrt`
argument non-negative) and pairs of normalized expressions. It holds when

    H and DL  implies  DR and lhs = rhs     (forward: defined left => defined, equal right)
    H and DR  implies  DL                   (backward: the rule is used both ways)

so a rule must preserve where a value is defined, in both directions, and agree
wherever it is. Division by zero is never given a value: a rule is only ever claimed
on the points where its divisors are nonzero, and it must not change which points
those are.

>>> from kernelsat.rewrites.rule import parse_rule
>>> verify_elementwise(parse_rule("exp-add: (exp (add ?x ?y)) => (mul (exp ?x) (exp ?y)) [e]")).ok
True
>>> bad = verify_elementwise(parse_rule("bad: (exp (mul ?x ?y)) => (mul (exp ?x) (exp ?y)) [e]"))
>>> bad.ok, bad.counterexample is not None
(False, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import cast

import z3

from kernelsat.ops import Op
from kernelsat.proofs.axioms import function, instances
from kernelsat.proofs.normalize import (
    Sym,
    add,
    const,
    max_,
    min_,
    mul,
    ne0,
    neg,
    normalize,
    positive,
    recip,
    var,
)
from kernelsat.proofs.verify_sym import SCALAR, to_float
from kernelsat.rewrites.rule import (
    AttrFun,
    ConstEq,
    NonZero,
    Pattern,
    PNode,
    Positive,
    Rule,
    Var,
    term_vars,
)

DEFAULT_TIMEOUT_MS = 10_000
MODEL_TRIES = 5
"""z3 models tried for a counterexample that the real functions confirm."""


@dataclass
class Obligation:
    """What one instance of a rule must satisfy (see the module doc)."""

    hyps: list[Sym] = field(default_factory=list)
    dl: list[Sym] = field(default_factory=list)
    dr: list[Sym] = field(default_factory=list)
    pairs: list[tuple[Sym, Sym]] = field(default_factory=list)
    pos_vars: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SmtResult:
    """`status`: proved, refuted (with a model of the variables) or unknown."""

    status: str
    model: Mapping[str, float] | None = None
    reason: str = ""
    trivial: bool = False


class _Encoder:
    """Sym -> z3, memoized, collecting the instance axioms of every application. Every
    term lives in the encoder's own z3 context: z3's choices (and so which model it
    returns for a refutation) depend on the terms its context already holds, so a shared
    context would make a verdict depend on what the process verified before."""

    def __init__(self) -> None:
        self.ctx = z3.Context()
        self.memo: dict[int, z3.ExprRef] = {}
        self.vars: dict[str, z3.ArithRef] = {}
        self.axioms: list[z3.BoolRef] = []

    def real(self, s: Sym) -> z3.ArithRef:
        hit = self.memo.get(s.serial)
        if hit is not None:
            return cast(z3.ArithRef, hit)
        if s.op == "ite":  # selection: exact, z3's if-then-else
            out_ite = z3.If(self.atom(s.args[0]), self.real(s.args[1]), self.real(s.args[2]))
            self.memo[s.serial] = out_ite
            return cast(z3.ArithRef, out_ite)
        args = [self.real(a) for a in s.args] if s.op not in ("gt0", "ge0", "ne0") else []
        out: z3.ExprRef
        match s.op:
            case "var":
                out = self.vars.setdefault(str(s.value), z3.Real(str(s.value), self.ctx))
            case "const":
                q = Fraction(cast(Fraction, s.value))
                out = z3.RealVal(f"{q.numerator}/{q.denominator}", self.ctx)
            case "add":
                out = z3.Sum(*args)
            case "mul":
                out = z3.Product(*args)
            case "recip":
                out = 1 / args[0]
            case "max" | "min":
                out = args[0]
                for a in args[1:]:
                    out = z3.If(a > out, a, out) if s.op == "max" else z3.If(a < out, a, out)
            case "fn":
                out = function(str(s.value), self.ctx)(args[0])
                self.axioms.extend(instances(str(s.value), args[0], cast(z3.ArithRef, out)))
            case _:
                raise AssertionError(s.op)
        self.memo[s.serial] = out
        return cast(z3.ArithRef, out)

    def atom(self, s: Sym) -> z3.BoolRef:
        x = self.real(s.args[0])
        match s.op:
            case "gt0":
                return x > 0
            case "ge0":
                return x >= 0
            case "ne0":
                return x != 0
        raise AssertionError(s.op)


def _simplify_domain(atoms: Sequence[Sym], pos: frozenset[str]) -> frozenset[Sym]:
    """Drop the atoms that the syntactic positivity of their argument already proves."""
    return frozenset(a for a in atoms if not positive(a.args[0], pos))


def normalize_obligation(ob: Obligation) -> Obligation:
    """Every expression of `ob` normalized (one memo for all of them)."""
    memo: dict[int, Sym] = {}

    def n(s: Sym) -> Sym:
        return normalize(s, ob.pos_vars, memo)

    return Obligation(
        [n(h) for h in ob.hyps],
        [n(d) for d in ob.dl],
        [n(d) for d in ob.dr],
        [(n(a), n(b)) for a, b in ob.pairs],
        ob.pos_vars,
    )


def prove(ob: Obligation, timeout_ms: int = DEFAULT_TIMEOUT_MS,
          avoid: Sequence[Mapping[str, float]] = (),
          integers: Callable[[str], bool] | None = None) -> SmtResult:
    """Discharge a normalized obligation: syntactically when both sides are identical
    and the domains coincide, else with z3. `avoid`: points the model must differ from
    (to look for another counterexample). `integers`: which variables must take integer
    values (sizes, when looking for a counterexample at sizes a program can have)."""
    dl = _simplify_domain(ob.dl, ob.pos_vars)
    dr = _simplify_domain(ob.dr, ob.pos_vars)
    pairs = [(a, b) for a, b in ob.pairs if a is not b]
    if not pairs and dl == dr:
        return SmtResult("proved", trivial=True)
    enc = _Encoder()
    hyps = [enc.atom(h) if h.op in ("gt0", "ge0", "ne0") else enc.real(h) == 0 for h in ob.hyps]
    hyps += [enc.vars.setdefault(v, z3.Real(v, enc.ctx)) > 0 for v in sorted(ob.pos_vars)]
    dl_z = z3.And(*(enc.atom(a) for a in sorted(dl, key=lambda s: s.serial)), enc.ctx)
    dr_z = z3.And(*(enc.atom(a) for a in sorted(dr, key=lambda s: s.serial)), enc.ctx)
    eq = z3.And(*(enc.real(a) == enc.real(b) for a, b in pairs), enc.ctx)
    solver = z3.SolverFor("QF_UFNRA", ctx=enc.ctx) if integers is None else z3.Solver(ctx=enc.ctx)
    solver.set("timeout", timeout_ms)
    solver.add(*hyps, *enc.axioms)
    if integers is not None:
        solver.add(*(z3.IsInt(v) for name, v in sorted(enc.vars.items()) if integers(name)))
    solver.add(z3.Or(z3.And(dl_z, z3.Not(z3.And(dr_z, eq))), z3.And(dr_z, z3.Not(dl_z))))
    for point in avoid:
        solver.add(z3.Or(*(enc.vars[k] != z3.RealVal(str(v), enc.ctx) for k, v in point.items()
                           if k in enc.vars), enc.ctx))
    verdict = solver.check()
    if verdict == z3.unsat:
        return SmtResult("proved")
    if verdict == z3.unknown:
        return SmtResult("unknown", reason=f"z3: {solver.reason_unknown()}")
    model = solver.model()
    values = {name: _to_float(model.eval(v, model_completion=True)) for name, v in enc.vars.items()}
    forward = z3.is_true(model.eval(dl_z, model_completion=True))
    reason = ("the sides differ (or the right side is undefined) where the left is defined"
              if forward else "the left side is undefined where the right side is defined")
    return SmtResult("refuted", values, reason)


def _to_float(v: z3.ExprRef) -> float:
    if z3.is_rational_value(v):
        q = cast(z3.RatNumRef, v)
        return float(Fraction(q.numerator_as_long(), q.denominator_as_long()))
    if z3.is_algebraic_value(v):
        return float(cast(z3.AlgebraicNumRef, v).approx(20).as_fraction())
    return float("nan")


# -- the elementwise verifier ------------------------------------------------------------

ATTR_SYM: dict[str, Callable[..., Sym]] = {
    "+": lambda a, b, d: add(a, b),
    "-": lambda a, b, d: add(a, neg(b)),
    "*": lambda a, b, d: mul(a, b),
    "/": lambda a, b, d: (d.append(ne0(b)), mul(a, recip(b)))[1],
    "neg": lambda a, d: neg(a),
    "max": lambda a, b, d: max_(a, b),
    "min": lambda a, b, d: min_(a, b),
}
"""Attribute functions on constants, as real arithmetic (the rule files' constant folding)."""


class NotElementwise(ValueError):
    """The rule names an op or attribute the elementwise verifier does not cover."""


def _attr_sym(a: object, env: Mapping[str, Sym], dom: list[Sym]) -> Sym:
    match a:
        case Var(name):
            return env[name]
        case AttrFun(f, args) if f in ATTR_SYM:
            return ATTR_SYM[f](*(_attr_sym(x, env, dom) for x in args), dom)
        case float() | int():
            return const(a)
    raise NotElementwise(f"attribute {a} is not elementwise")


def pattern_sym(p: Pattern, env: Mapping[str, Sym], dom: list[Sym]) -> Sym:
    """The real value of an elementwise pattern at one index (`env`: variable -> Sym)."""
    match p:
        case Var(name):
            return env[name]
        case PNode(Op.CONST, (attr,), ()):
            return _attr_sym(attr, env, dom)
        case PNode(op, _, args) if op in SCALAR:
            return SCALAR[op](*(pattern_sym(a, env, dom) for a in args), dom)
    raise NotElementwise(f"{p} is not elementwise")


def is_elementwise(rule: Rule) -> bool:
    """Whether the rule has only elementwise ops and constants (no reductions, splits,
    stores or sizes): then one real identity decides it for every shape."""
    try:
        pattern_sym(rule.lhs, _Everything(), [])
        pattern_sym(rule.rhs, _Everything(), [])
    except NotElementwise:
        return False
    return True


class _Everything(dict[str, Sym]):
    def __missing__(self, key: str) -> Sym:
        return var(key)


@dataclass(frozen=True)
class ElementwiseOutcome:
    ok: bool
    status: str
    counterexample: str | None = None
    trivial: bool = False
    confirmed: bool = False
    """For a refutation: the real functions (float64) also disagree at the model's point."""


def elementwise_obligation(rule: Rule) -> Obligation:
    """The obligation of an elementwise rule: one real variable per pattern variable."""
    env: dict[str, Sym] = _Everything()
    pos = frozenset(c.term for c in rule.conditions if isinstance(c, Positive))
    hyps: list[Sym] = []
    for c in rule.conditions:
        match c:
            case ConstEq(v, value):
                env[v] = const(value)
            case NonZero(v):
                hyps.append(ne0(var(v)))
    ob = Obligation(hyps=hyps, pos_vars=pos)
    lhs = pattern_sym(rule.lhs, env, ob.dl)
    rhs = pattern_sym(rule.rhs, env, ob.dr)
    ob.pairs.append((lhs, rhs))
    return ob


def verify_elementwise(rule: Rule, timeout_ms: int = DEFAULT_TIMEOUT_MS) -> ElementwiseOutcome:
    """Prove an elementwise rule for all reals (and so for every shape: both sides'
    shapes are the union of their variables' shapes, which must be the same set)."""
    Sym.reset()
    lv, rv = term_vars(rule.lhs), term_vars(rule.rhs)
    if lv != rv:
        return ElementwiseOutcome(
            False, "refuted",
            f"shape: the sides use different variables ({sorted(lv ^ rv)}), so a variable "
            "with an axis the others lack changes the result's shape")
    ob = normalize_obligation(elementwise_obligation(rule))
    seen: list[Mapping[str, float]] = []
    first: tuple[str, bool] | None = None
    for _ in range(MODEL_TRIES):
        res = prove(ob, timeout_ms, seen)
        if res.status == "proved" and not seen:
            return ElementwiseOutcome(True, "proved", trivial=res.trivial)
        if res.status != "refuted":
            break
        why, confirmed = _describe(rule, res)
        if confirmed:
            return ElementwiseOutcome(False, "refuted", why, confirmed=True)
        first = first or (why, False)
        seen.append({k: v for k, v in (res.model or {}).items() if "(" not in k})
    if first is not None:  # every model leaned on the uninterpreted functions
        return ElementwiseOutcome(False, "refuted", first[0], confirmed=False)
    return ElementwiseOutcome(False, "unknown", res.reason)


def _describe(rule: Rule, res: SmtResult) -> tuple[str, bool]:
    """A counterexample: the model's variable values and the real values of both sides."""
    assert res.model is not None
    point = {k: v for k, v in res.model.items() if "(" not in k}
    env = {k: var(k) for k in point}
    dl: list[Sym] = []
    dr: list[Sym] = []
    full = _Everything(env)
    for c in rule.conditions:
        if isinstance(c, ConstEq):
            full[c.var] = const(c.value)
    lhs, rhs = pattern_sym(rule.lhs, full, dl), pattern_sym(rule.rhs, full, dr)
    values = ", ".join(f"?{k} = {v:.6g}" for k, v in sorted(point.items()))
    try:
        lval, rval = to_float(lhs, point), to_float(rhs, point)
    except (KeyError, OverflowError, ZeroDivisionError):
        return f"{res.reason}: {values}", False
    numbers = f"; in float64 the left side is {lval:.6g}, the right side {rval:.6g}"
    same = math.isclose(lval, rval, rel_tol=1e-9, abs_tol=1e-12) or (
        math.isnan(lval) and math.isnan(rval))
    return f"{res.reason}: {values}{numbers}", not same
