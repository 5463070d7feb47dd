"""Rules as data: patterns, side conditions, and one application of a rule.

A rule is `Rule(name, lhs, rhs, conditions, family)`. Patterns use the term
s-expression syntax with variables:

    ?x                   a term variable (in a child position)
    (Sum ?a ?x)          ?a: an axis variable (in an attribute position)
    (Split ?a ?f ?x)     ?f: a split-factor variable
    (Const ?c)           ?c: a constant-value variable
    (Sum (outer ?a ?f) ...)   an attribute computed from bound variables
    (Const (size ?a))         (table `ATTR_FUNS`)

Side conditions are a small named vocabulary (`NotIn`, `HasAxis`, `Divides`,
`Positive`, `ConstEq`, `NonZero`, `Unit`, `Covers`), each with one evaluator on
concrete terms, here. The same objects serve the egglog renderer, the verifier,
the checker and the docs.

Constant arithmetic (`(Const (+ ?c ?d))`, constant folding) is exact, over the
rationals the rules are proved on: a result no float64 holds exactly makes the rule
not apply (`as_constant`), and a rule that computes a constant runs forward only
(`Rule.forward_only`, enforced by `rewrite_once`, hence by the checker).

>>> r = parse_rule("mul-one: (mul ?x (Const 1.0)) => ?x [elementwise]")
>>> from kernelsat.ir import In, Const, mul
>>> x = In("x", (("i", 2),))
>>> apply_at(r, mul(x, Const(1.0)), (), "forward") is x
True
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal, assert_never

from kernelsat.affine import parse_read_map
from kernelsat.ir import ShapeError, Term, split_axes
from kernelsat.ops import ARITY, AXIS_ATTR, BY_NAME, NEVER, POSITIVITY, UNARY, Op
from kernelsat.sexpr import Atom, SExprError, SList, SNode, read

Value = Term | str | int | float
Bindings = dict[str, Value]
Direction = Literal["forward", "backward"]
Path = tuple[int, ...]


class RuleError(ValueError):
    """A malformed rule: unbound right-hand variable, bad pattern, bad condition."""


# -- patterns -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Var:
    """A pattern variable `?name` (a term, an axis, a factor or a constant)."""

    name: str

    def __str__(self) -> str:
        return f"?{self.name}"


@dataclass(frozen=True, slots=True)
class AttrFun:
    """An attribute computed from bound variables, e.g. `(outer ?a ?f)`."""

    fun: str
    args: tuple[AttrPat, ...]

    def __str__(self) -> str:
        return "(" + " ".join([self.fun, *map(str, self.args)]) + ")"


AttrPat = Var | AttrFun | str | int | float


@dataclass(frozen=True, slots=True)
class PNode:
    """A pattern node: an op, attribute patterns and child patterns."""

    op: Op
    attrs: tuple[AttrPat, ...]
    args: tuple[Pattern, ...]

    def __str__(self) -> str:
        parts = [self.op.value, *(_fmt_attr(self.op, a) for a in self.attrs), *map(str, self.args)]
        return "(" + " ".join(parts) + ")"


Pattern = Var | PNode


def _fmt_attr(op: Op, a: AttrPat) -> str:
    if isinstance(a, float):
        return repr(a)
    return str(a)


def _size_of(axis: Value, ctx: Mapping[str, int]) -> int:
    if not isinstance(axis, str) or axis not in ctx:
        raise RuleError(f"size of unknown axis {axis!r}")
    return ctx[axis]


def _exact(v: Value) -> Fraction:
    """A constant as an exact rational (a float64 constant is one exactly)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise RuleError(f"constant arithmetic on {v!r}, which is not a finite number")
    return Fraction(v)


def as_constant(q: Fraction) -> float:
    """The float64 constant that is exactly `q`, or RuleError: a fold whose exact result
    no float64 holds (1/3, 1e16 + 1, past the largest finite float) is refused, never
    rounded, since the rules are proved over the reals."""
    try:
        f = float(q)
    except OverflowError:
        raise RuleError(f"constant {q} is out of float64 range") from None
    if not math.isfinite(f) or Fraction(f) != q:
        raise RuleError(f"constant {q} is not exactly a float64 (it would round to {f!r})")
    return f


def _quotient(a: Fraction, b: Fraction) -> Fraction:
    if b == 0:
        raise RuleError("constant division by zero")
    return a / b


def _factor(v: Value) -> int:
    if isinstance(v, bool) or not isinstance(v, int | float) or v != int(v) or v < 1:
        raise RuleError(f"split factor {v!r} is not a positive integer")
    return int(v)


def _parts(size: int, factor: int) -> int:
    """How many parts of `factor` an axis of `size` splits into (it must divide)."""
    if size % factor:
        raise RuleError(f"factor {factor} does not divide size {size}")
    return size // factor


def _arith(f: Callable[..., Fraction]) -> Callable[[list[Value], Mapping[str, int]], Value]:
    return lambda v, ctx: as_constant(f(*map(_exact, v)))


ARITHMETIC: dict[str, Callable[..., Fraction]] = {
    "+": lambda a, b: a + b,
    "*": lambda a, b: a * b,
    "-": lambda a, b: a - b,
    "/": _quotient,
    "neg": lambda a: -a,
    "max": max,
    "min": min,
}
"""Constant arithmetic, exact over the rationals (`as_constant` refuses a result no
float64 holds): what constant folding computes, and what the verifier proves."""

ATTR_FUNS: dict[str, Callable[[list[Value], Mapping[str, int]], Value]] = {
    "outer": lambda v, ctx: split_axes(str(v[0]), _factor(v[1]))[0],
    "inner": lambda v, ctx: split_axes(str(v[0]), _factor(v[1]))[1],
    "size": lambda v, ctx: as_constant(Fraction(_size_of(v[0], ctx))),
    "quot": lambda v, ctx: as_constant(Fraction(_parts(_size_of(v[0], ctx), _factor(v[1])))),
    **{name: _arith(f) for name, f in ARITHMETIC.items()},
}
"""Attribute functions usable on right-hand sides. `size` reads the axis size from the
matched term; `quot` is `size / factor`, refused unless exact (as a split's sizes are);
arithmetic is exact on the (finite) constant values (see `ARITHMETIC`)."""

ATTR_ARITY: dict[str, int] = {"outer": 2, "inner": 2, "size": 1, "quot": 2, "neg": 1,
                              **{f: 2 for f in ("+", "*", "-", "/", "max", "min")}}
"""How many arguments each attribute function takes."""
assert ATTR_ARITY.keys() == ATTR_FUNS.keys()


def folds_constants(p: Pattern | AttrPat) -> bool:
    """Whether a pattern computes a constant by arithmetic (`(Const (+ ?c ?d))`)."""
    match p:
        case AttrFun(fun, args):
            return fun in ARITHMETIC or any(folds_constants(a) for a in args)
        case PNode(_, attrs, args):
            return any(folds_constants(a) for a in (*attrs, *args))
    return False


def _check_attr_funs(p: Pattern | AttrPat, rule: str) -> None:
    """Refuse an attribute function of the wrong arity and an input node (a pattern
    names terms by variables: an `In` written into a rule could be the very input the
    verifier makes for a variable)."""
    match p:
        case AttrFun(fun, args):
            if ATTR_ARITY.get(fun) != len(args):
                raise RuleError(f"{rule}: ({fun} ...) takes {ATTR_ARITY.get(fun, '?')} "
                                f"argument(s), got {len(args)}")
            for x in args:
                _check_attr_funs(x, rule)
        case PNode(op, attrs, kids):
            if op is Op.IN:
                raise RuleError(f"{rule}: patterns cannot name inputs: use a variable")
            for a in (*attrs, *kids):
                _check_attr_funs(a, rule)


def pattern_vars(p: Pattern | AttrPat) -> set[str]:
    """Every variable named in a pattern (term and attribute variables)."""
    match p:
        case Var(name):
            return {name}
        case PNode(_, attrs, args):
            out: set[str] = set()
            for a in (*attrs, *args):
                out |= pattern_vars(a)
            return out
        case AttrFun(_, args):
            return set().union(*(pattern_vars(a) for a in args)) if args else set()
        case _:
            return set()


def term_vars(p: Pattern) -> set[str]:
    """Variables in child (term) positions."""
    match p:
        case Var(name):
            return {name}
        case PNode(_, _, args):
            return set().union(*(term_vars(a) for a in args)) if args else set()
    return set()


# -- parsing patterns ------------------------------------------------------------------


def _parse_attr(node: SNode, source: str) -> AttrPat:
    if isinstance(node, Atom):
        t = node.text
        if t.startswith("?"):
            return Var(t[1:])
        if re.fullmatch(r"-?\d+", t):
            return int(t)
        try:
            return float(t) if re.fullmatch(r"[-+0-9.eE]+|inf|nan", t) else t
        except ValueError:
            return t
    if not node.items or not isinstance(node.items[0], Atom) or node.items[0].text not in ATTR_FUNS:
        raise SExprError(
            f"expected an attribute function ({' '.join(ATTR_FUNS)})", node.line, node.col, source
        )
    fun, args = node.items[0].text, node.items[1:]
    if len(args) != ATTR_ARITY[fun]:
        raise SExprError(f"({fun} ...) takes {ATTR_ARITY[fun]} argument(s), got {len(args)}",
                         node.line, node.col, source)
    return AttrFun(fun, tuple(_parse_attr(a, source) for a in args))


def parse_pattern(node: SNode, source: str = "<rule>") -> Pattern:
    """Build a pattern from a read s-expression."""
    if isinstance(node, Atom):
        if node.text.startswith("?") and len(node.text) > 1:
            return Var(node.text[1:])
        raise SExprError(f"expected a pattern, found {node.text!r}", node.line, node.col, source)
    if not node.items or not isinstance(node.items[0], Atom) or node.items[0].text not in BY_NAME:
        raise SExprError("expected (OP ...) with a known op", node.line, node.col, source)
    op = BY_NAME[node.items[0].text]
    if op is Op.IN:
        raise SExprError("patterns cannot name inputs: use a variable", node.line, node.col, source)
    n_attrs = 1 if op in AXIS_ATTR or op in (Op.CONST, Op.READ) else 2 if op is Op.SPLIT else 0
    items = node.items[1:]
    if len(items) != n_attrs + ARITY[op]:
        raise SExprError(
            f"{op.value} takes {n_attrs} attribute(s) and {ARITY[op]} child(ren), got {len(items)}",
            node.line,
            node.col,
            source,
        )
    attrs = tuple(_parse_attr(a, source) for a in items[:n_attrs])
    if op is Op.CONST and isinstance(attrs[0], int):
        attrs = (float(attrs[0]),)
    args = tuple(parse_pattern(a, source) for a in items[n_attrs:])
    return PNode(op, attrs, args)


# -- side conditions -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NotIn:
    """`(not-in ?a ?x)`: axis a is not a free axis of x."""

    axis: str
    term: str


@dataclass(frozen=True, slots=True)
class HasAxis:
    """`(has-axis ?a ?x)`: axis a is a free axis of x."""

    axis: str
    term: str


@dataclass(frozen=True, slots=True)
class Divides:
    """`(divides ?f ?a)`: 1 < f < size(a) and f divides size(a) (a proper split)."""

    factor: str
    axis: str


@dataclass(frozen=True, slots=True)
class Positive:
    """`(positive ?x)`: x > 0 everywhere, by the positivity analysis (`is_positive`)."""

    term: str


@dataclass(frozen=True, slots=True)
class ConstEq:
    """`(const-eq ?c V)`: the constant bound to c equals V."""

    var: str
    value: float


@dataclass(frozen=True, slots=True)
class NonZero:
    """`(nonzero ?c)`: the constant bound to c is not zero."""

    var: str


@dataclass(frozen=True, slots=True)
class Unit:
    """`(unit ?a)`: axis a has size 1 (a reduction over it reads its one element)."""

    axis: str


@dataclass(frozen=True, slots=True)
class Covers:
    """`(covers ?x ?y)`: every free axis of y is a free axis of x (so `x + zero y` has
    x's shape)."""

    term: str
    other: str


@dataclass(frozen=True, slots=True)
class Unpadded:
    """`(unpadded ?m)`: the affine read map m never leaves its operand (no pad)."""

    map: str


@dataclass(frozen=True, slots=True)
class PadZero:
    """`(pad-zero ?m)`: the affine read map m reads 0 outside its operand, or never
    leaves it (then `f(Read_m x) = Read_m f(x)` for every `f` with `f(0) = 0`)."""

    map: str


Condition = (NotIn | HasAxis | Divides | Positive | ConstEq | NonZero | Unit | Covers | Unpadded
             | PadZero)

CONDITION_SYNTAX: dict[str, tuple[type, int]] = {
    "not-in": (NotIn, 2),
    "has-axis": (HasAxis, 2),
    "divides": (Divides, 2),
    "positive": (Positive, 1),
    "const-eq": (ConstEq, 2),
    "nonzero": (NonZero, 1),
    "unit": (Unit, 1),
    "covers": (Covers, 2),
    "unpadded": (Unpadded, 1),
    "pad-zero": (PadZero, 1),
}


def condition_text(c: Condition) -> str:
    match c:
        case NotIn(a, t):
            return f"(not-in ?{a} ?{t})"
        case HasAxis(a, t):
            return f"(has-axis ?{a} ?{t})"
        case Divides(f, a):
            return f"(divides ?{f} ?{a})"
        case Positive(t):
            return f"(positive ?{t})"
        case ConstEq(v, value):
            return f"(const-eq ?{v} {value!r})"
        case NonZero(v):
            return f"(nonzero ?{v})"
        case Unit(a):
            return f"(unit ?{a})"
        case Covers(x, y):
            return f"(covers ?{x} ?{y})"
        case Unpadded(m):
            return f"(unpadded ?{m})"
        case PadZero(m):
            return f"(pad-zero ?{m})"
    raise AssertionError(c)


def condition_vars(c: Condition) -> set[str]:
    match c:
        case NotIn(a, t) | HasAxis(a, t):
            return {a, t}
        case Divides(f, a):
            return {f, a}
        case Positive(t) | NonZero(t):
            return {t}
        case ConstEq(v, _) | Unit(v):
            return {v}
        case Covers(x, y):
            return {x, y}
        case Unpadded(m) | PadZero(m):
            return {m}
    raise AssertionError(c)


def parse_condition(node: SNode, source: str = "<rule>") -> Condition:
    if (
        not isinstance(node, SList)
        or not node.items
        or not isinstance(node.items[0], Atom)
        or node.items[0].text not in CONDITION_SYNTAX
    ):
        raise SExprError(
            f"expected a condition ({', '.join(CONDITION_SYNTAX)})", node.line, node.col, source
        )
    cls, n = CONDITION_SYNTAX[node.items[0].text]
    args = node.items[1:]
    if len(args) != n or not all(isinstance(a, Atom) for a in args):
        raise SExprError(f"{node.items[0].text} takes {n} arguments", node.line, node.col, source)
    texts = [a.text for a in args]  # type: ignore[union-attr]
    if cls is ConstEq:
        if not texts[0].startswith("?"):
            raise SExprError("const-eq takes ?var VALUE", node.line, node.col, source)
        return ConstEq(texts[0][1:], float(texts[1]))
    if not all(t.startswith("?") for t in texts):
        raise SExprError("condition arguments are ?variables", node.line, node.col, source)
    return cls(*(t[1:] for t in texts))


def is_positive(t: Term) -> bool:
    """The positivity analysis: a sound, syntactic proof that `t > 0` at every index, by
    the op table's rule for each op (`kernelsat.ops.POSITIVITY`; egglog runs the same
    table as analysis rules)."""
    kind, kids = POSITIVITY.get(t.op, NEVER)
    match kind:
        case "never":
            return False
        case "always":
            return True
        case "const":
            return float(t.attrs[0]) > 0  # type: ignore[arg-type]
        case "all":
            return all(is_positive(t.args[i]) for i in kids)
        case "any":
            return any(is_positive(t.args[i]) for i in kids)
    assert_never(kind)


def check_condition(c: Condition, b: Mapping[str, Value], ctx: Mapping[str, int]) -> bool:
    """Evaluate a side condition on concrete bindings (`ctx`: axis sizes of the match)."""
    match c:
        case NotIn(a, t):
            term = b[t]
            return isinstance(term, Term) and b[a] not in term.shape
        case HasAxis(a, t):
            term = b[t]
            return isinstance(term, Term) and b[a] in term.shape
        case Divides(f, a):
            factor, axis = b[f], b[a]
            if not isinstance(factor, int) or isinstance(factor, bool) or axis not in ctx:
                return False
            n = ctx[str(axis)]
            return 1 < factor < n and n % factor == 0
        case Positive(t):
            term = b[t]
            return isinstance(term, Term) and is_positive(term)
        case ConstEq(v, value):
            return isinstance(b[v], float) and b[v] == value
        case NonZero(v):
            return isinstance(b[v], float) and b[v] != 0.0
        case Unit(a):
            return ctx.get(str(b[a])) == 1
        case Covers(x, y):
            big, small = b[x], b[y]
            return (isinstance(big, Term) and isinstance(small, Term)
                    and set(small.shape) <= set(big.shape))
        case Unpadded(m):
            return isinstance(b[m], str) and parse_read_map(str(b[m])).pad is None
        case PadZero(m):
            return isinstance(b[m], str) and parse_read_map(str(b[m])).pad in (None, 0.0)
    raise AssertionError(c)


# -- variable roles ------------------------------------------------------------------------

Role = Literal["term", "axis", "factor", "const", "map"]

ATTR_ROLES: dict[Op, tuple[Role, ...]] = {
    **{op: ("axis",) for op in AXIS_ATTR}, Op.SPLIT: ("axis", "factor"), Op.CONST: ("const",),
    Op.READ: ("map",)}  # an affine read's map text (`kernelsat.affine`)
"""The role of each attribute position of an op."""

ATTR_FUN_ROLES: dict[str, tuple[Role, ...]] = {
    "outer": ("axis", "factor"), "inner": ("axis", "factor"), "quot": ("axis", "factor"),
    "size": ("axis",)}
"""The role of each argument of the attribute functions that read an axis; the others
(arithmetic) take operands in their result's role."""

FACTOR_FUNS = frozenset(f for f, roles in ATTR_FUN_ROLES.items() if "factor" in roles)
"""The attribute functions of an axis and a split factor (`outer inner quot`)."""


def _condition_roles(c: Condition) -> list[tuple[str, Role]]:
    match c:
        case NotIn(a, t) | HasAxis(a, t):
            return [(a, "axis"), (t, "term")]
        case Divides(f, a):
            return [(f, "factor"), (a, "axis")]
        case Positive(t):
            return [(t, "term")]
        case ConstEq(v, _) | NonZero(v):
            return [(v, "const")]
        case Unit(a):
            return [(a, "axis")]
        case Covers(x, y):
            return [(x, "term"), (y, "term")]
        case Unpadded(m) | PadZero(m):
            return [(m, "map")]
    raise AssertionError(c)


def variable_roles(rule: Rule) -> dict[str, Role]:
    """What each variable of `rule` stands for, from every position it occurs in. A
    variable in two roles (a term and a constant, an axis and a factor ...) is refused:
    no match binds it, and the verifier would prove something about another rule."""
    roles: dict[str, Role] = {}

    def put(name: str, role: Role) -> None:
        if roles.setdefault(name, role) != role:
            raise RuleError(f"{rule.name}: variable ?{name} is used as a {roles[name]} and "
                            f"as a {role}")

    def attr(a: AttrPat, role: Role) -> None:
        match a:
            case Var(name):
                put(name, role)
            case AttrFun(fun, args):
                inner = ATTR_FUN_ROLES.get(fun, (role,) * len(args))
                for x, r in zip(args, inner, strict=False):
                    attr(x, r)

    def pat(p: Pattern) -> None:
        match p:
            case Var(name):
                put(name, "term")
            case PNode(op, attrs, args):
                for a, r in zip(attrs, ATTR_ROLES.get(op, ()), strict=False):
                    attr(a, r)
                for c in args:
                    pat(c)

    pat(rule.lhs)
    pat(rule.rhs)
    for c in rule.conditions:
        for name, role in _condition_roles(c):
            put(name, role)
    return roles


# -- rules ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """A rewrite rule `lhs => rhs if conditions`, sound in both directions where the
    right side binds every variable of the left (see `reversible`)."""

    name: str
    lhs: Pattern
    rhs: Pattern
    conditions: tuple[Condition, ...] = ()
    family: str = "user"
    verified: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", self.name):
            raise RuleError(f"rule name {self.name!r} is not kebab-case")
        if isinstance(self.lhs, Var):
            raise RuleError(f"{self.name}: the left side must not be a bare variable")
        for side in (self.lhs, self.rhs):
            _check_attr_funs(side, self.name)
        variable_roles(self)
        unbound = pattern_vars(self.rhs) - pattern_vars(self.lhs) - set(self.parameters)
        if unbound:
            raise RuleError(
                f"{self.name}: right-hand variable(s) {sorted(unbound)} not bound by the left side"
            )
        bound = pattern_vars(self.lhs) | set(self.parameters)
        for c in self.conditions:
            missing = condition_vars(c) - bound
            if missing:
                raise RuleError(
                    f"{self.name}: condition {condition_text(c)} uses unbound {missing}"
                )

    @property
    def parameters(self) -> tuple[str, ...]:
        """Split-factor variables of the right side that the left side does not bind:
        each is constrained by `(divides ?f ?a)` and chosen from the target's candidate
        factors when the rule is applied (they are recorded in every step's bindings)."""
        lhs = pattern_vars(self.lhs)
        return tuple(
            sorted(
                c.factor
                for c in self.conditions
                if isinstance(c, Divides) and c.factor not in lhs and c.axis in lhs
            )
        )

    @property
    def forward_only(self) -> bool:
        """Constant folding (`(Const (+ ?c ?d))` on the right) runs forward only: a fold
        computes its constant exactly, and nothing is gained by un-folding one."""
        return folds_constants(self.rhs)

    @property
    def reversible(self) -> bool:
        """Whether the rule can be applied backwards (rhs => lhs): the right side must bind
        every variable the left side needs (otherwise a backward step must supply the
        missing bindings itself)."""
        return pattern_vars(self.lhs) <= pattern_vars(self.rhs)

    def text(self) -> str:
        """The rule in the `.rules` file syntax (parse_rule inverts it)."""
        conds = " ".join(condition_text(c) for c in self.conditions)
        tail = f" if {conds}" if conds else ""
        return f"{self.name}: {self.lhs} => {self.rhs}{tail} [{self.family}]"

    @property
    def key(self) -> str:
        """A stable hash of the rule's text."""
        return hashlib.sha256(self.text().encode()).hexdigest()[:32]


_RULE_LINE = re.compile(
    r"^\s*([a-z0-9-]+)\s*:\s*(.*?)\s*=>\s*(.*?)\s*(?:\bif\b\s*(.*?))?\s*\[([a-z-]+)\]\s*$"
)


def parse_rule(line: str, source: str = "<rule>", lineno: int = 1) -> Rule:
    """Parse one rule line: `name: LHS => RHS [if COND...] [family]`."""
    m = _RULE_LINE.match(line)
    if not m:
        raise RuleError(f"{source}:{lineno}: expected 'name: LHS => RHS [if CONDS] [family]'")
    name, lhs_text, rhs_text, cond_text, family = m.groups()
    try:
        lhs_nodes = read(lhs_text, source)
        rhs_nodes = read(rhs_text, source)
        if len(lhs_nodes) != 1 or len(rhs_nodes) != 1:
            raise RuleError(f"{source}:{lineno}: {name}: each side must be one pattern")
        conds = tuple(parse_condition(c, source) for c in read(cond_text or "", source))
        return Rule(
            name,
            parse_pattern(lhs_nodes[0], source),
            parse_pattern(rhs_nodes[0], source),
            conds,
            family,
        )
    except SExprError as e:
        raise RuleError(f"{source}:{lineno}: {name}: {e}") from None


def parse_rules(text: str, source: str = "<rules>") -> list[Rule]:
    """Parse a `.rules` file: one rule a line, `#` comments, blank lines ignored."""
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        stripped = line.split("#", 1)[0].strip()
        if stripped:
            out.append(parse_rule(stripped, source, i))
    return out


# -- matching and instantiation -----------------------------------------------------------


def _bind(b: Bindings, name: str, value: Value) -> bool:
    if name in b:
        old = b[name]
        return old is value or (
            not isinstance(old, Term) and old == value and type(old) is type(value)
        )
    b[name] = value
    return True


def match(p: Pattern, t: Term, b: Bindings | None = None) -> Bindings | None:
    """Bindings under which pattern `p` is exactly `t`, or None. A variable bound twice
    must be bound to the identical term (non-linear patterns). A computed attribute
    (`(outer ?a ?f)`) is checked once its variables are bound."""
    b = {} if b is None else b
    deferred: list[tuple[AttrFun, object]] = []
    stack: list[tuple[Pattern, Term]] = [(p, t)]
    while stack:
        pat, term = stack.pop()
        if isinstance(pat, Var):
            if not _bind(b, pat.name, term):
                return None
            continue
        if pat.op is not term.op:
            return None
        for ap, av in zip(pat.attrs, term.attrs, strict=True):
            if isinstance(ap, Var):
                if not _bind(b, ap.name, av):  # type: ignore[arg-type]
                    return None
            elif isinstance(ap, AttrFun):
                deferred.append((ap, av))
            elif ap != av or type(ap) is not type(av):
                return None
        stack.extend(zip(pat.args, term.args, strict=True))
    for fun, value in deferred:
        if not pattern_vars(fun) <= set(b):
            return None
        try:
            if eval_attr(fun, b, t.all_sizes) != value:
                return None
        except (RuleError, ValueError, ZeroDivisionError):
            return None
    return b


def eval_attr(a: AttrPat, b: Mapping[str, Value], ctx: Mapping[str, int]) -> Value:
    match a:
        case Var(name):
            return b[name]
        case AttrFun(fun, args):
            return ATTR_FUNS[fun]([eval_attr(x, b, ctx) for x in args], ctx)
    return a


def instantiate(p: Pattern, b: Mapping[str, Value], ctx: Mapping[str, int]) -> Term:
    """The term of pattern `p` under bindings `b` (shape-checked on construction)."""
    if isinstance(p, Var):
        v = b[p.name]
        if not isinstance(v, Term):
            raise RuleError(f"?{p.name} is bound to {v!r}, not a term")
        return v
    attrs = tuple(eval_attr(a, b, ctx) for a in p.attrs)
    if p.op is Op.SPLIT and isinstance(attrs[1], float):
        attrs = (attrs[0], int(attrs[1]))
    return Term(p.op, tuple(instantiate(c, b, ctx) for c in p.args), attrs)  # type: ignore[arg-type]


def subterm(t: Term, path: Path) -> Term:
    for i in path:
        if i >= len(t.args):
            raise RuleError(f"position {list(path)} does not exist")
        t = t.args[i]
    return t


def replace_at(t: Term, path: Path, new: Term) -> Term:
    """`t` with the subterm at `path` replaced (rebuilt and shape-checked upward)."""
    spine = [t]
    for i in path:
        spine.append(subterm(spine[-1], (i,)))
    out = new
    for parent, i in zip(reversed(spine[:-1]), reversed(path), strict=True):
        args = list(parent.args)
        args[i] = out
        out = Term(parent.op, tuple(args), parent.attrs)
    return out


def rewrite_once(rule: Rule, t: Term, direction: Direction, b: Bindings | None = None) -> Term:
    """Apply `rule` at the root of `t`. Raises RuleError when it does not apply.

    Backward application matches the right side and builds the left side; it needs a
    reversible rule (or explicit bindings for the variables only the left side has)."""
    if direction == "backward" and rule.forward_only:
        raise RuleError(f"{rule.name} folds constants and is applied forward only")
    if direction not in ("forward", "backward"):
        raise RuleError(f"{rule.name}: direction must be forward or backward, not {direction!r}")
    src, dst = (rule.lhs, rule.rhs) if direction == "forward" else (rule.rhs, rule.lhs)
    given = dict(b or {})
    found = match(src, t, dict(given) if isinstance(src, PNode) else {})
    if found is None and isinstance(src, Var):
        found = {src.name: t}
    if found is None:
        raise RuleError(f"{rule.name} ({direction}) does not match {t!r}")
    for k, v in given.items():
        if k in found and not (found[k] is v or found[k] == v):
            raise RuleError(f"{rule.name}: binding ?{k} disagrees with the match")
        found.setdefault(k, v)
    missing = pattern_vars(dst) - set(found)
    if missing:
        raise RuleError(f"{rule.name} ({direction}): no binding for {sorted(missing)}")
    ctx = dict(t.all_sizes)
    for v in found.values():
        if isinstance(v, Term):
            ctx.update(v.all_sizes)
    for c in rule.conditions if direction == "forward" else ():
        if not check_condition(c, found, ctx):
            raise RuleError(f"{rule.name}: condition {condition_text(c)} fails")
    try:
        out = instantiate(dst, found, ctx)
    except (ShapeError, KeyError, ValueError, ZeroDivisionError) as e:
        raise RuleError(f"{rule.name} ({direction}): the result is ill-formed: {e}") from None
    if direction == "backward":
        # the conditions speak of the left side, which exists only now
        ctx.update(out.all_sizes)
        for c in rule.conditions:
            if not check_condition(c, found, ctx):
                raise RuleError(f"{rule.name}: condition {condition_text(c)} fails")
    return out


def apply_at(
    rule: Rule, t: Term, path: Path, direction: Direction, b: Bindings | None = None
) -> Term:
    """Apply `rule` once at position `path` of `t` (a path of child indices)."""
    return replace_at(t, path, rewrite_once(rule, subterm(t, path), direction, b))


UNARY_OPS = UNARY  # re-exported for rule-family files
