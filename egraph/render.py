"""Rendering IR terms and rules to egglog program text.

Everything egglog sees is generated here from the op table (`kernelsat.ops`) and the
rule data (`kernelsat.rewrites.rule`); nothing is hand-written per rule.

The encoding:

- one sort `Term` with one constructor per op, named `T<op>` (`Tmul`, `TSum`,
  `TMax` ...: the prefix keeps egglog's primitives `max`/`min`/`abs` free). Attributes
  come first: an axis is a `String`, a split factor an `i64`, a constant an `f64`;
  an input is opaque, `(TIn "<s-expression of the In node>")`, with its axes asserted.
- analyses, computed by the ruleset `analysis` (saturated before every iteration):
  `(Shape t) -> StrSet`, the free axes of a class as a set (one value per class, since
  every term of a class has the same shape); `(AxSize a) -> i64`, the program-wide size
  of an axis (split axes get theirs from the `Split` that names them); `(Pos t)`, the
  positivity analysis of `is_positive`, lifted to classes (some term of the class is
  syntactically positive); `(Factor f)`, the candidate split factors.
- each rule direction is one egglog rule: its query matches the source side, checks the
  side conditions and checks that every node it builds is well-formed (the shape rules
  of `ir._infer`: a `Split` axis present and its outer/inner names fresh, a reduction
  axis present) and that the built term has the class's shape; its actions are the
  union and one row of a relation of its own, `(Fired_<rule>[_b] root v1 v2 ...)`: the
  matched class and the values of every rule variable, in sorted variable order.

>>> from kernelsat.rewrites.rule import parse_rule
>>> r = parse_rule("sum-hoist-mul: (Sum ?a (mul ?x ?y)) => (mul ?x (Sum ?a ?y))"
...                " if (not-in ?a ?x) [reduction]")
>>> text = render_rule(r, "forward", "r0").text
>>> print(text.splitlines()[0])
(rule ((= root (TSum v_a (Tmul v_x v_y)))
>>> "(set-not-contains (Shape v_x) v_a)" in text, "(Fired_sum-hoist-mul root v_a v_x v_y)" in text
(True, True)
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from kernelsat.ir import Term, postorder, read_map
from kernelsat.ops import ARITY, AXIS_ATTR, BINARY, POSITIVITY, REDUCTIONS, TERNARY, UNARY, Op
from kernelsat.rewrites.library import FORWARD_ONLY_FAMILIES
from kernelsat.rewrites.rule import (
    ATTR_FUN_ROLES,
    AttrFun,
    AttrPat,
    Condition,
    ConstEq,
    Covers,
    Direction,
    Divides,
    HasAxis,
    NonZero,
    NotIn,
    PadZero,
    Pattern,
    PNode,
    Positive,
    Role,
    Rule,
    RuleError,
    Unit,
    Unpadded,
    Var,
    pattern_vars,
    variable_roles,
)
from kernelsat.sexpr import to_sexpr

Sort = Literal["Term", "String", "i64", "f64"]

CONSTRUCTOR: dict[Op, str] = {op: f"T{op.value}" for op in Op}
"""The egglog constructor of each op."""

OP_OF_CONSTRUCTOR: dict[str, Op] = {name: op for op, name in CONSTRUCTOR.items()}

ATTR_SORTS: dict[Op, tuple[Sort, ...]] = {
    **{op: ("String",) for op in AXIS_ATTR},  # reductions, gathers
    Op.SPLIT: ("String", "i64"),
    Op.CONST: ("f64",),
    Op.IN: ("String",),
    Op.READ: ("String",),  # affine reads: the canonical map text (`kernelsat.affine`)
    Op.IDX: ("String", "i64"),
}
"""The sorts of each op's attributes (ops not listed have none). `In` has one: its key."""

MAX_F64 = 1.7976931348623157e308

DEFAULT_FACTORS: tuple[int, ...] = (2, 4, 8, 16, 32, 64)
"""Candidate split factors for rules with a `divides` parameter."""


# -- literals and names ---------------------------------------------------------------


def f64_literal(x: float) -> str:
    """An egglog f64 literal that parses back to exactly `x` (finite)."""
    if not math.isfinite(x):
        raise ValueError(f"egglog constants must be finite, got {x!r}")
    text = repr(float(x))
    return text if any(c in text for c in ".e") else text + ".0"


def str_literal(s: str) -> str:
    if any(c in s for c in '"\\\n'):
        raise ValueError(f"cannot render string {s!r} to egglog")
    return json.dumps(s)


def literal(value: str | int | float, sort: Sort) -> str:
    match sort:
        case "String":
            return str_literal(str(value))
        case "i64":
            if isinstance(value, float) and not value.is_integer():
                raise RuleError(f"{value!r} is not an integer")
            return str(int(value))
        case "f64":
            return f64_literal(float(value))
        case "Term":
            raise RuleError(f"a literal {value!r} cannot stand for a term")


def relation_name(rule: Rule, direction: Direction) -> str:
    """The firing relation of one rule direction."""
    return f"Fired_{rule.name}" + ("_b" if direction == "backward" else "")


def egg_var(name: str) -> str:
    """The egglog variable of rule variable `?name`."""
    if not re.fullmatch(r"[A-Za-z0-9_]+", name):
        raise RuleError(f"variable ?{name} cannot be rendered to egglog")
    return f"v_{name}"


# -- the program preamble: sorts, constructors, analyses --------------------------------


def render_declarations() -> str:
    """The `Term` datatype, the analysis tables and the `analysis` ruleset."""
    variants = []
    for op in Op:
        sorts = [*ATTR_SORTS.get(op, ()), *(["Term"] * ARITY[op])]
        variants.append(f"  ({CONSTRUCTOR[op]} {' '.join(sorts)})".replace(" )", ")"))
    lines = [
        "(datatype Term\n" + "\n".join(variants) + ")",
        "(sort StrSet (Set String))",
        # affine reads: a map's own axes and its operand's, set for every map of the term
        "(function ReadShape (String) StrSet :merge old)",
        "(function ReadSrc (String) StrSet :merge old)",
        "(relation Unpadded (String))",
        "(relation PadZero (String))",
        "(function Shape (Term) StrSet :merge old)",
        "(function AxSize (String) i64 :merge old)",
        "(relation Pos (Term))",
        "(relation Factor (i64))",
        "(relation Root (Term))",
        "(ruleset analysis)",
    ]
    lines += [_shape_rule(op) for op in Op if op is not Op.IN]
    lines.append(_split_size_rule())
    lines += _positivity_rules()
    return "\n".join(lines) + "\n"


def _node_vars(op: Op) -> tuple[list[str], list[str]]:
    attrs = ["a", "f"][: len(ATTR_SORTS.get(op, ()))] if op is not Op.CONST else ["c"]
    kids = [f"x{i}" for i in range(ARITY[op])]
    return attrs, kids


def _node_expr(op: Op) -> str:
    attrs, kids = _node_vars(op)
    return f"({CONSTRUCTOR[op]} {' '.join([*attrs, *kids])})"


def _outer(a: str, f: str) -> str:
    return f'(+ {a} "/o" (to-string {f}))'


def _inner(a: str, f: str) -> str:
    return f'(+ {a} "/i" (to-string {f}))'


def shape_value(op: Op, attrs: Sequence[str], kids: Sequence[str]) -> str:
    """The shape (an egglog `StrSet`) of an `op` node from its attribute expressions and
    its children's shape expressions: the one egglog copy of `ir._infer`'s shapes."""
    if op is Op.CONST or op is Op.NEGINF:
        return "(set-empty)"
    if op is Op.IDX:
        return f"(set-of {attrs[0]})"
    if op in UNARY or op is Op.STORE:
        return kids[0]
    if op in BINARY:
        return f"(set-union {kids[0]} {kids[1]})"
    if op in TERNARY:
        return f"(set-union (set-union {kids[0]} {kids[1]}) {kids[2]})"
    if op in (Op.DOT, Op.SOFTMAXAVG):
        return f"(set-remove (set-union {kids[0]} {kids[1]}) {attrs[0]})"
    if op in REDUCTIONS:
        return f"(set-remove {kids[0]} {attrs[0]})"
    if op is Op.SPLIT:
        a, f = attrs
        return f"(set-insert (set-insert (set-remove {kids[0]} {a}) {_outer(a, f)}) {_inner(a, f)})"
    if op is Op.READ:
        return f"(ReadShape {attrs[0]})"
    if op is Op.GATHER:  # x's axes but the gathered one, and the labels' axes
        return f"(set-union (set-remove {kids[0]} {attrs[0]}) {kids[1]})"
    raise AssertionError(op)


def well_formed(op: Op, attrs: Sequence[str], kids: Sequence[str]) -> list[str]:
    """Query facts that hold iff an `op` node with these attributes and child shapes is
    well-formed (`ir._infer` would accept it; sizes are program-wide, so binary ops
    always are)."""
    if op is Op.SPLIT:
        a, f = attrs
        return [
            f"(set-contains {kids[0]} {a})",
            f"(set-not-contains {kids[0]} {_outer(a, f)})",
            f"(set-not-contains {kids[0]} {_inner(a, f)})",
            f"(= 0 (% (AxSize {a}) {f}))",
        ]
    if op is Op.READ:  # the operand has exactly the axes the map reads
        return [f"(= {kids[0]} (ReadSrc {attrs[0]}))"]
    if op is Op.SOFTMAXAVG:
        return [f"(set-contains {kids[0]} {attrs[0]})"]
    if op is Op.GATHER:
        return [f"(set-contains {kids[0]} {attrs[0]})", f"(set-not-contains {kids[1]} {attrs[0]})"]
    if op is Op.DOT:
        return [f"(set-contains (set-union {kids[0]} {kids[1]}) {attrs[0]})"]
    if op in REDUCTIONS:
        return [f"(set-contains {kids[0]} {attrs[0]})"]
    return []


def _shape_rule(op: Op) -> str:
    attrs, kids = _node_vars(op)
    facts = [f"(= e {_node_expr(op)})", *(f"(= s{i} (Shape {k}))" for i, k in enumerate(kids))]
    if op is Op.READ:  # only maps the term declared (ReadShape is set per map)
        facts += [*well_formed(op, attrs, ["s0"]), f"(= rs {shape_value(op, attrs, ['s0'])})"]
    value = shape_value(op, attrs, [f"s{i}" for i in range(len(kids))])
    if op is Op.READ:
        value = "rs"  # an action may not look a function up: bound by the query
    name = f'"shape-{op.value}"'
    return f"(rule ({' '.join(facts)}) ((set (Shape e) {value})) :ruleset analysis :name {name})"


def _split_size_rule() -> str:
    return (
        f"(rule ((= e {_node_expr(Op.SPLIT)}) (= n (AxSize a)))"
        f" ((set (AxSize {_outer('a', 'f')}) (/ n f)) (set (AxSize {_inner('a', 'f')}) f))"
        ' :ruleset analysis :name "size-split")'
    )


def _positivity_rules() -> list[str]:
    """`is_positive` as egglog analysis rules, from the op table (`kernelsat.ops.POSITIVITY`)."""
    out = []
    for op, (kind, kids) in POSITIVITY.items():
        head = f"(= e {_node_expr(op)})"
        match kind:
            case "never":
                continue
            case "const":
                bodies = [[head, "(> c 0.0)"]]
            case "always":
                bodies = [[head]]
            case "all":
                bodies = [[head, *(f"(Pos x{i})" for i in kids)]]
            case "any":
                bodies = [[head, f"(Pos x{i})"] for i in kids]
        for j, body in enumerate(bodies):
            out.append(
                f'(rule ({" ".join(body)}) ((Pos e)) :ruleset analysis :name "pos-{op.value}-{j}")'
            )
    return out


# -- terms -------------------------------------------------------------------------------


@dataclass(frozen=True)
class RenderedTerm:
    """A term as egglog commands: `text` defines `$root` (and asserts input shapes and
    axis sizes); `inputs` maps each `TIn` key back to its `In` node."""

    text: str
    inputs: Mapping[str, Term]


def input_key(node: Term) -> str:
    """The opaque key of an `In` node: its s-expression."""
    return to_sexpr(node)


def render_term(term: Term, factors: Iterable[int] = DEFAULT_FACTORS) -> RenderedTerm:
    """Commands that add `term` (as `$root`), its input shapes, axis sizes and factors."""
    names: dict[int, str] = {}
    lines: list[str] = []
    inputs: dict[str, Term] = {}
    for i, node in enumerate(postorder(term)):
        name = f"$n{i}"
        names[id(node)] = name
        if node.op is Op.IN:
            key = input_key(node)
            inputs[key] = node
            expr = f"(TIn {str_literal(key)})"
            axes = " ".join(str_literal(a) for a in node.shape)
            lines.append(f"(let {name} {expr})")
            lines.append(f"(set (Shape {name}) (set-of {axes}))".replace(" )", ")"))
            continue
        sorts = ATTR_SORTS.get(node.op, ())
        attrs = [literal(v, s) for v, s in zip(node.attrs, sorts, strict=True)]  # type: ignore[arg-type]
        if node.op is Op.READ:
            for table, read_axes in (("ReadShape", node.shape),
                                     ("ReadSrc", node.args[0].shape)):
                members = " ".join(str_literal(a) for a in read_axes)
                lines.append(f"(set ({table} {attrs[0]}) (set-of {members}))".replace(" )", ")"))
            if read_map(node).pad is None:
                lines.append(f"(Unpadded {attrs[0]})")
            if read_map(node).pad in (None, 0.0):
                lines.append(f"(PadZero {attrs[0]})")
        kids = [names[id(c)] for c in node.args]
        lines.append(f"(let {name} ({CONSTRUCTOR[node.op]} {' '.join([*attrs, *kids])}))")
    lines.append(f"(let $root {names[id(term)]})")
    lines.append("(Root $root)")
    for axis, size in sorted(term.all_sizes.items()):
        lines.append(f"(set (AxSize {str_literal(axis)}) {size})")
    for f in sorted(set(factors)):
        lines.append(f"(Factor {int(f)})")
    return RenderedTerm("\n".join(lines) + "\n", inputs)


# -- rules ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RenderedRule:
    """One direction of one rule as an egglog rule.

    `relation` holds its firings as rows `(root, *values of var_names)`; `var_sorts`
    gives each variable's sort (`Term` variables are e-classes)."""

    rule: str
    direction: Direction
    relation: str
    var_names: tuple[str, ...]
    var_sorts: tuple[Sort, ...]
    text: str

    @property
    def declaration(self) -> str:
        return f"(relation {self.relation} (Term {' '.join(self.var_sorts)}))"

    @property
    def term_vars(self) -> frozenset[str]:
        return frozenset(
            n for n, s in zip(self.var_names, self.var_sorts, strict=True) if s == "Term"
        )


SORT_OF_ROLE: dict[Role, Sort] = {"term": "Term", "axis": "String", "factor": "i64",
                                  "const": "f64", "map": "String"}
"""The egglog sort of each variable role (`kernelsat.rewrites.rule.variable_roles`)."""


def var_sorts(rule: Rule) -> dict[str, Sort]:
    """The sort of every variable of `rule`, from the role of the positions it occurs in."""
    return {name: SORT_OF_ROLE[role] for name, role in variable_roles(rule).items()}


def _ATTR_FUN_ARG_SORTS(fun: str, out: Sort, n: int) -> tuple[Sort, ...]:
    if fun in ATTR_FUN_ROLES:
        return tuple(SORT_OF_ROLE[role] for role in ATTR_FUN_ROLES[fun])
    return (out,) * n  # arithmetic: operands in the result's sort


ARITH: dict[str, str] = {
    "+": "+",
    "*": "*",
    "-": "-",
    "/": "/",
    "neg": "neg",
    "max": "max",
    "min": "min",
}
"""Attribute arithmetic and its egglog primitive (on f64, or i64 where a factor is computed)."""


class _RuleWriter:
    """Builds the query facts and the action of one rule direction."""

    def __init__(self, rule: Rule, sorts: Mapping[str, Sort]) -> None:
        self.rule = rule
        self.sorts = sorts
        self.facts: list[str] = []
        self.fresh = 0

    def new_var(self) -> str:
        self.fresh += 1
        return f"w{self.fresh}"

    def attr_expr(self, a: AttrPat, sort: Sort) -> str:
        """An egglog expression for an attribute (variables must be bound by the query)."""
        match a:
            case Var(name):
                return egg_var(name)
            case AttrFun(fun, args):
                subs = [
                    self.attr_expr(x, s)
                    for x, s in zip(args, _ATTR_FUN_ARG_SORTS(fun, sort, len(args)), strict=True)
                ]
                return _attr_fun_expr(fun, subs, sort, self.rule.name)
            case str() | int() | float():
                return literal(a, sort)
        raise AssertionError(a)

    def computed(self, a: AttrPat, sort: Sort) -> str:
        """A query variable holding a computed attribute: failures (a division by zero,
        an unknown axis size, a non-finite constant) mean the rule does not match."""
        v = self.new_var()
        expr = self.attr_expr(a, sort)
        if sort == "f64":
            expr = f"(+ {expr} 0.0)"  # -0.0 -> 0.0, as the IR normalizes constants
        self.facts.append(f"(= {v} {expr})")
        if sort == "f64":
            self.facts.append(f"(< (abs {v}) {f64_literal(MAX_F64)})")
        return v

    def query(self, p: Pattern) -> str:
        match p:
            case Var(name):
                return egg_var(name)
            case PNode(op, attrs, args):
                parts = [
                    self.computed(a, s) if isinstance(a, AttrFun) else self.attr_expr(a, s)
                    for a, s in zip(attrs, ATTR_SORTS.get(op, ()), strict=True)
                ]
                parts += [self.query(c) for c in args]
                return f"({CONSTRUCTOR[op]} {' '.join(parts)})"
        raise AssertionError(p)

    def action(self, p: Pattern) -> tuple[str, str]:
        """The egglog expression that builds `p`, and its shape; every node built must
        be well-formed (a rule fires only where its result is a well-formed term, as
        `rewrite_once` requires)."""
        match p:
            case Var(name):
                return egg_var(name), f"(Shape {egg_var(name)})"
            case PNode(op, attrs, args):
                parts = [
                    self.computed(a, s) if isinstance(a, AttrFun) else self.attr_expr(a, s)
                    for a, s in zip(attrs, ATTR_SORTS.get(op, ()), strict=True)
                ]
                built = [self.action(c) for c in args]
                kid_shapes = []
                for _, shape in built:
                    v = self.new_var()
                    self.facts.append(f"(= {v} {shape})")
                    kid_shapes.append(v)
                self.facts += well_formed(op, parts, kid_shapes)
                expr = f"({CONSTRUCTOR[op]} {' '.join([*parts, *(e for e, _ in built)])})"
                return expr, shape_value(op, parts, kid_shapes)
        raise AssertionError(p)


def _attr_fun_expr(fun: str, args: list[str], sort: Sort, rule: str) -> str:
    match fun:
        case "outer" | "inner":
            tag = "/o" if fun == "outer" else "/i"
            return f'(+ {args[0]} "{tag}" (to-string {args[1]}))'
        case "size":
            return f"(AxSize {args[0]})" if sort == "i64" else f"(to-f64 (AxSize {args[0]}))"
        case "quot":
            q = f"(/ (AxSize {args[0]}) {args[1]})"
            return q if sort == "i64" else f"(to-f64 {q})"
        case _ if fun in ARITH:
            if sort not in ("f64", "i64"):
                raise RuleError(f"{rule}: arithmetic ({fun} ...) where a {sort} is expected")
            return f"({ARITH[fun]} {' '.join(args)})"
    raise RuleError(f"{rule}: no egglog encoding for attribute function {fun!r}")


def condition_facts(c: Condition, bound_by_query: set[str], w: _RuleWriter) -> list[str]:
    """The one egglog encoding of each side condition (query facts)."""
    match c:
        case NotIn(a, t):
            return [f"(set-not-contains (Shape {egg_var(t)}) {egg_var(a)})"]
        case HasAxis(a, t):
            return [f"(set-contains (Shape {egg_var(t)}) {egg_var(a)})"]
        case Divides(f, a):
            n = w.new_var()
            fv = egg_var(f)
            facts = [] if f in bound_by_query else [f"(Factor {fv})"]
            return [
                *facts,
                f"(= {n} (AxSize {egg_var(a)}))",
                f"(< 1 {fv})",
                f"(< {fv} {n})",
                f"(= 0 (% {n} {fv}))",
            ]
        case Positive(t):
            return [f"(Pos {egg_var(t)})"]
        case ConstEq(v, value):
            return [f"(= {egg_var(v)} {f64_literal(value)})"]
        case NonZero(v):
            return [f"(!= {egg_var(v)} 0.0)"]
        case Unit(a):
            return [f"(= (AxSize {egg_var(a)}) 1)"]
        case Unpadded(m):
            return [f"(Unpadded {egg_var(m)})"]
        case PadZero(m):
            return [f"(PadZero {egg_var(m)})"]
        case Covers(x, y):
            shape = f"(Shape {egg_var(x)})"
            return [f"(= {shape} (set-union {shape} (Shape {egg_var(y)})))"]
    raise AssertionError(c)


def plain_vars(p: Pattern) -> set[str]:
    """Variables a pattern binds by matching (not those only inside computed attributes)."""
    match p:
        case Var(name):
            return {name}
        case PNode(_, attrs, args):
            out = {a.name for a in attrs if isinstance(a, Var)}
            for c in args:
                out |= plain_vars(c)
            return out
    raise AssertionError(p)


def _canonical(src: Pattern, dst: Pattern, conditions: Sequence[Condition]) -> str:
    """The rule direction's text with variables renamed by first occurrence."""
    order: dict[str, str] = {}

    def rename(m: re.Match[str]) -> str:
        return order.setdefault(m.group(1), f"?_{len(order)}")

    head = re.sub(r"\?([A-Za-z0-9_]+)", rename, f"{src} => {dst}")
    conds = [
        re.sub(r"'([A-Za-z0-9_]+)'", lambda m: order.get(m.group(1), m.group(0)), repr(c))
        for c in conditions
    ]
    return head + " | " + " ".join(sorted(conds))


def is_self_inverse(rule: Rule) -> bool:
    """Whether the backward direction is the forward one up to renaming variables
    (`mul-comm`, `sum-swap`): then only the forward direction is run."""
    fwd = _canonical(rule.lhs, rule.rhs, rule.conditions)
    return fwd == _canonical(rule.rhs, rule.lhs, rule.conditions)


def can_render(rule: Rule, direction: Direction) -> str | None:
    """Why one direction of `rule` cannot run in the e-graph, or None when it can."""
    src, dst = (rule.lhs, rule.rhs) if direction == "forward" else (rule.rhs, rule.lhs)
    if isinstance(src, Var):
        return "its query side is a bare variable (it would match every class)"
    if direction == "backward" and not rule.reversible:
        return "it is not reversible"
    if direction == "backward" and is_self_inverse(rule):
        return "it is the forward direction with variables renamed"
    if direction == "backward" and rule.family in FORWARD_ONLY_FAMILIES:
        return f"the {rule.family} family runs forward only (backward only grows the e-graph)"
    bound = plain_vars(src) | set(rule.parameters if direction == "forward" else ())
    missing = (pattern_vars(src) | pattern_vars(dst)) - bound
    if missing:
        return f"variable(s) {sorted(missing)} are not bound by matching"
    return None


def render_rule(rule: Rule, direction: Direction, ruleset: str) -> RenderedRule:
    """One direction of `rule` as an egglog rule in `ruleset` (see `can_render`)."""
    why = can_render(rule, direction)
    if why is not None:
        raise RuleError(f"{rule.name} ({direction}) cannot be rendered: {why}")
    sorts = var_sorts(rule)
    src, dst = (rule.lhs, rule.rhs) if direction == "forward" else (rule.rhs, rule.lhs)
    w = _RuleWriter(rule, sorts)
    head = f"(= root {w.query(src)})"
    bound = plain_vars(src)
    for c in rule.conditions:
        w.facts += condition_facts(c, bound, w)
    rhs, shape = w.action(dst)
    w.facts.append(f"(= (Shape root) {shape})")  # a union never changes a class's shape
    names = tuple(sorted(pattern_vars(rule.lhs) | pattern_vars(rule.rhs) | set(rule.parameters)))
    relation = relation_name(rule, direction)
    row = f"({relation} root {' '.join(egg_var(n) for n in names)})".replace(" )", ")")
    facts = "\n       ".join([head, *w.facts])
    name = rule.name + ("/b" if direction == "backward" else "")
    text = (
        f"(rule ({facts})\n      ((union root {rhs})\n       {row})\n"
        f"      :ruleset {ruleset} :name {str_literal(name)})"
    )
    return RenderedRule(rule.name, direction, relation, names, tuple(sorts[n] for n in names), text)


def render_rules(
    rules: Sequence[Rule], ruleset_of: Mapping[str, str]
) -> tuple[list[RenderedRule], list[tuple[str, Direction, str]]]:
    """Every renderable direction of every rule, and (rule, direction, reason) for the
    directions that cannot run in the e-graph."""
    out: list[RenderedRule] = []
    skipped: list[tuple[str, Direction, str]] = []
    directions: tuple[Direction, ...] = ("forward", "backward")
    for rule in rules:
        for direction in directions:
            why = can_render(rule, direction)
            if why is None:
                out.append(render_rule(rule, direction, ruleset_of[rule.name]))
            elif direction == "forward" or rule.reversible:
                skipped.append((rule.name, direction, why))
    return out, skipped
