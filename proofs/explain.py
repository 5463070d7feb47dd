"""Explanations: a rewrite chain between two terms of one e-class, from the firing log.

egglog cannot produce proofs, so saturation records every rule firing (rule, root
class, variable bindings). From the final snapshot and that log:

1. the hash-cons maps each canonical node (op, attrs, child classes) to its class;
2. each firing's two patterns, instantiated bottom-up with its bindings and looked up
   in the hash-cons, give an edge between the canonical top nodes of its left and
   right instance (both in the root class), plus the canonical node of every inner
   pattern node; a right side that is a bare variable gives a *collapse* edge (the
   left instance <-> any node of the class, since the bound sub-term is in it);
3. within a class, nodes and edges (usable both ways) form a connected graph;
4. `explain` walks the cheapest path of edges from the current term's top node to the
   target's; before each edge it rewrites the term's children until the term is
   exactly the rule's instance (nested pattern nodes reached recursively, a variable
   bound twice made identical), then applies the rule; when the top nodes agree it
   recurses into the children.

Every step is one application of a named rule (`Step`), which the checker replays
with `apply_at`; nothing here is trusted.

>>> from kernelsat.ir import In, Const, mul
>>> from kernelsat.rewrites.rule import parse_rule, apply_at
>>> from kernelsat.egraph.snapshot import Snapshot, ENode, Firing
>>> from kernelsat.ops import Op
>>> import numpy as np
>>> r = parse_rule("mul-one: (mul ?x (Const 1.0)) => ?x [elementwise]")
>>> x = In("x", (("i", 2),))
>>> snap = Snapshot(
...     nodes=[ENode(Op.IN, x.attrs, ()), ENode(Op.CONST, (1.0,), ()), ENode(Op.MUL, (), (0, 1))],
...     node_class=np.array([0, 1, 0]), classes=[[0, 2], [1]], class_shape=[{"i": 2}, {}],
...     root=0, firings=[Firing("mul-one", 0, {"x": 0}, frozenset({"x"}))])
>>> steps = explain(snap, [r], mul(x, Const(1.0)), x)
>>> [(s.rule, s.direction, s.path) for s in steps]
[('mul-one', 'forward', ())]
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kernelsat.egraph.snapshot import Firing, Snapshot
from kernelsat.ir import Attr, ShapeError, Term, _normalize_attrs
from kernelsat.ops import Op
from kernelsat.proofs.steps import Step
from kernelsat.rewrites.rule import (
    Bindings,
    Direction,
    Path,
    Pattern,
    PNode,
    Positive,
    Rule,
    RuleError,
    Value,
    Var,
    apply_at,
    eval_attr,
    is_positive,
    match,
    pattern_vars,
    rewrite_once,
    term_vars,
)

NodeKey = tuple[Op, tuple[Attr, ...], tuple[int, ...]]


class ExplainError(RuntimeError):
    """No rewrite chain found; the message names the class and the nodes involved."""


class ExplainBudgetError(ExplainError):
    """A limit (steps, visits) was reached: the search stops, it does not retry."""


class ExplainDepthError(ExplainError):
    """The recursion got too deep: this attempt stops (a restart may still succeed)."""


class _RuleSource(Protocol):
    rules: Any


@dataclass(frozen=True, slots=True)
class Edge:
    """One use of a firing inside a class: apply `firing`'s rule in `direction` to a
    term whose top node is `src`, giving a term whose top node is `dst`."""

    firing: int
    direction: Direction
    src: int
    dst: int


@dataclass
class _Instance:
    """A firing resolved against the hash-cons."""

    rule: Rule
    bindings: Mapping[str, Value | int]  # term variables -> class ids
    nodes: dict[int, int]  # id(pattern node) -> its canonical node
    lhs_top: int
    rhs_top: int | None  # None: the right side is a bare variable (collapse)
    cls: int


@dataclass
class Stats:
    """What the explainer did (for logs): firings used/skipped, visits, steps."""

    firings_used: int = 0
    firings_skipped: int = 0
    visits: int = 0
    skipped_reasons: list[str] = field(default_factory=list)


def _norm_attrs(op: Op, attrs: tuple[Any, ...]) -> tuple[Attr, ...]:
    if op in (Op.SPLIT, Op.IDX) and len(attrs) == 2 and isinstance(attrs[1], float):
        attrs = (attrs[0], int(attrs[1]))
    if op is Op.IN and len(attrs) == 2:
        attrs = (attrs[0], tuple(tuple((str(a), int(s)) for a, s in g) for g in attrs[1]))
    return _normalize_attrs(op, attrs)


def _inner_nodes(p: Pattern) -> list[PNode]:
    """The pattern nodes strictly below the top of `p`."""
    out: list[PNode] = []
    stack = list(p.args) if isinstance(p, PNode) else []
    while stack:
        q = stack.pop()
        if isinstance(q, PNode):
            out.append(q)
            stack.extend(q.args)
    return out


def _rules_by_name(rules: Iterable[Rule] | _RuleSource) -> dict[str, Rule]:
    items = rules.rules if hasattr(rules, "rules") else rules
    if isinstance(items, Mapping):
        items = items.values()
    return {r.name: r for r in items}


class Explainer:
    """The explainer of one snapshot: the hash-cons and the firing edges are built once,
    then `explain(spec, target)` may be called for many targets."""

    def __init__(
        self,
        snap: Snapshot,
        rules: Iterable[Rule] | _RuleSource,
        *,
        max_steps: int = 20_000,
        max_visits: int = 50_000,
        max_depth: int = 150,
        restarts: int = 2,
    ) -> None:
        self.snap = snap
        self.restarts = restarts
        self.shuffle: random.Random | None = None
        self.unit_cost = False
        self.rules = _rules_by_name(rules)
        self._tvars = {n: term_vars(r.lhs) | term_vars(r.rhs) for n, r in self.rules.items()}
        self.max_steps, self.max_visits, self.max_depth = max_steps, max_visits, max_depth
        self._budget = max_visits  # this attempt's visit limit (`explain` sets it)
        self.stats = Stats()
        self.steps: list[Step] = []
        self.active: set[tuple[Term, int]] = set()
        self.depth = 0
        self._build_hashcons()
        self.ctx: dict[str, int] = {}
        for shape in snap.class_shape:
            self.ctx.update(shape)
        self.inst: list[_Instance] = []
        self.adj: dict[int, list[Edge]] = {}
        self.collapse: dict[int, list[int]] = {}  # class -> instance ids
        for f in snap.firings:
            self._add_firing(f)
        self._any: dict[int, Term] | None = None
        self._pos: dict[int, Term] | None = None
        self._node_memo: dict[Term, int] = {}
        self._edge_cost: dict[tuple[int, str], int] = {}

    def explain(self, spec_term: Term, target_term: Term, stats: Stats | None = None) -> list[Step]:
        """The chain from `spec_term` to `target_term` (see the module docstring)."""
        self.stats.visits = 0
        try:
            cs, ct = self.class_of(spec_term), self.class_of(target_term)
            if cs != ct:
                raise ExplainError(f"the spec is in class {cs}, the target in class {ct}")
            # attempt 0: cheapest paths; 1: fewest edges; then shuffled fewest edges. The
            # attempts run in rounds of growing visit budgets (1/25, 1/5, all of
            # max_visits), so one strategy stuck in backtracking does not spend the whole
            # budget before another that needs a few hundred visits runs (cross-entropy
            # with labels: 50k visits each for attempts 0 and 1, 18 s a candidate, where
            # attempt 2 needed 555). A dead end (no path, not a limit) is not retried. All
            # attempts together get at most max_visits (three full attempts before): a
            # program with no chain costs a third of what it did (label_smoothing_ce: one
            # such candidate took 63 of optimize's 74 s at 2 * max_visits).
            budgets = sorted({max(1, self.max_visits // 25), max(1, self.max_visits // 5),
                              self.max_visits})
            left = self.max_visits
            dead: set[int] = set()
            final: Term | None = None
            last: ExplainError | None = None
            for budget in budgets:
                for attempt in range(self.restarts + 1):
                    if attempt in dead or final is not None or left <= 0:
                        continue
                    self.steps, self.active, self.depth = [], set(), 0
                    self.stats.visits = 0
                    self._budget = min(budget, left)
                    self.unit_cost = attempt > 0
                    self.shuffle = random.Random(attempt) if attempt > 1 else None
                    try:
                        final = self.to_term(spec_term, (), target_term)
                    except ExplainBudgetError as e:  # retried with the next budget
                        last = e
                    except ExplainError as e:  # a dead end or the depth limit: for good
                        dead.add(attempt)
                        last = e
                    left -= self.stats.visits
            if final is None:
                assert last is not None
                raise last
        except RecursionError:
            raise ExplainBudgetError("Python recursion limit reached (term too deep)") from None
        finally:
            if stats is not None:
                for name in ("firings_used", "firings_skipped", "visits", "skipped_reasons"):
                    setattr(stats, name, getattr(self.stats, name))
        if final is not target_term:  # pragma: no cover - to_term guarantees it
            raise ExplainError("internal: the chain does not end at the target")
        return self.steps

    # -- the hash-cons ------------------------------------------------------------
    def _build_hashcons(self) -> None:
        self.hashcons: dict[NodeKey, int] = {}
        self.rep: list[int] = []
        self.cls_of: list[int] = [int(c) for c in self.snap.node_class]
        for nid, node in enumerate(self.snap.nodes):
            key = (node.op, _norm_attrs(node.op, tuple(node.attrs)), tuple(node.children))
            self.rep.append(self.hashcons.setdefault(key, nid))
        self.members: dict[int, list[int]] = {}
        for nid in sorted(set(self.rep)):
            self.members.setdefault(self.cls_of[nid], []).append(nid)

    def node_of(self, t: Term) -> int:
        """The canonical node of a concrete term (which must be in the e-graph)."""
        hit = self._node_memo.get(t)
        if hit is not None:
            return hit
        stack: list[Term] = [t]
        while stack:
            u = stack[-1]
            if u in self._node_memo:
                stack.pop()
                continue
            todo = [a for a in u.args if a not in self._node_memo]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            kids = tuple(self.cls_of[self._node_memo[a]] for a in u.args)
            nid = self.hashcons.get((u.op, u.attrs, kids))
            if nid is None:
                raise ExplainError(f"term is not in the e-graph: {u!r} (child classes {kids})")
            self._node_memo[u] = nid
        return self._node_memo[t]

    def class_of(self, t: Term) -> int:
        return self.cls_of[self.node_of(t)]

    # -- firings ------------------------------------------------------------------
    def _skip(self, why: str) -> None:
        self.stats.firings_skipped += 1
        if len(self.stats.skipped_reasons) < 20:
            self.stats.skipped_reasons.append(why)

    def _instance_class(self, p: Pattern, b: Mapping[str, Any], tvars: set[str],
                        nodes: dict[int, int]) -> int:
        if isinstance(p, Var):
            if p.name not in tvars or not isinstance(b.get(p.name), int):
                raise RuleError(f"term variable ?{p.name} has no class binding")
            return int(b[p.name])
        kids = tuple(self._instance_class(a, b, tvars, nodes) for a in p.args)
        attrs = _norm_attrs(p.op, tuple(eval_attr(a, b, self.ctx) for a in p.attrs))
        nid = self.hashcons.get((p.op, attrs, kids))
        if nid is None:
            raise RuleError(f"instance node {p.op.value} {attrs} {kids} is not in the e-graph")
        nodes[id(p)] = nid
        return self.cls_of[nid]

    def _add_firing(self, f: Firing) -> None:
        rule = self.rules.get(f.rule)
        if rule is None:
            self._skip(f"unknown rule {f.rule!r}")
            return
        tvars = self._tvars[rule.name]
        nodes: dict[int, int] = {}
        try:
            lc = self._instance_class(rule.lhs, f.bindings, tvars, nodes)
            rc = self._instance_class(rule.rhs, f.bindings, tvars, nodes)
        except (RuleError, ShapeError, KeyError, ValueError, TypeError, ZeroDivisionError) as e:
            self._skip(f"{f.rule} at class {f.root}: {e}")
            return
        if lc != rc:
            self._skip(f"{f.rule}: left instance in class {lc}, right in {rc}")
            return
        assert isinstance(rule.lhs, PNode)
        lhs_top = nodes[id(rule.lhs)]
        rhs_top = nodes[id(rule.rhs)] if isinstance(rule.rhs, PNode) else None
        k = len(self.inst)
        self.inst.append(_Instance(rule, f.bindings, nodes, lhs_top, rhs_top, lc))
        self.stats.firings_used += 1
        if rhs_top is None:
            self.collapse.setdefault(lc, []).append(k)
        elif rhs_top != lhs_top:
            self.adj.setdefault(lhs_top, []).append(Edge(k, "forward", lhs_top, rhs_top))
            self.adj.setdefault(rhs_top, []).append(Edge(k, "backward", rhs_top, lhs_top))

    # -- helper terms: one small term per class, one positive term per class ------
    def any_term(self, c: int) -> Term:
        if self._any is None:
            self._any = self._fixpoint(lambda t: True, {})
        if c not in self._any:
            raise ExplainError(f"class {c} has no finite term")
        return self._any[c]

    def positive_term(self, c: int) -> Term | None:
        if self._pos is None:
            self.any_term(c)
            assert self._any is not None
            self._pos = self._fixpoint(is_positive, self._any)
        return self._pos.get(c)

    def _fixpoint(self, accept: Any, fallback: Mapping[int, Term]) -> dict[int, Term]:
        """A term for every class that has one satisfying `accept`, built bottom-up
        (children: an accepted term where known, else `fallback`)."""
        out: dict[int, Term] = {}
        changed = True
        while changed:
            changed = False
            for c, members in self.members.items():
                if c in out:
                    continue
                for nid in members:
                    node = self.snap.nodes[nid]
                    kids = [out.get(k, fallback.get(k)) for k in node.children]
                    if any(k is None for k in kids):
                        continue
                    try:
                        t = Term(node.op, tuple(kids), _norm_attrs(node.op, tuple(node.attrs)))  # type: ignore[arg-type]
                    except ShapeError:
                        continue
                    if accept(t):
                        out[c] = t
                        changed = True
                        break
        return out

    # -- search -------------------------------------------------------------------
    def _visit(self) -> None:
        self.stats.visits += 1
        if self.stats.visits > self._budget:
            raise ExplainBudgetError(f"visit limit {self._budget} reached")

    def _neighbours(self, c: int, n: int) -> list[Edge]:
        out = list(self.adj.get(n, ()))
        for k in self.collapse.get(c, ()):
            top = self.inst[k].lhs_top
            if n == top:
                out.extend(Edge(k, "forward", top, m) for m in self.members[c] if m != top)
            else:
                out.append(Edge(k, "backward", n, top))
        if self.shuffle is not None:  # a restart explores the edges in another order
            self.shuffle.shuffle(out)
        return out

    def _cost(self, e: Edge) -> int:
        """An edge costs 1 plus the pattern nodes below its source's top: each of those
        is a sub-goal (reaching a node in a child class) before the rule applies."""
        if self.unit_cost:
            return 1
        cached = self._edge_cost.get((e.firing, e.direction))
        if cached is None:
            rule = self.inst[e.firing].rule
            src = rule.lhs if e.direction == "forward" else rule.rhs
            cached = 1 + sum(1 for _ in _inner_nodes(src))
            self._edge_cost[(e.firing, e.direction)] = cached
        return cached

    def bfs(self, c: int, start: int, goal: int, banned: set[Edge]) -> list[Edge] | None:
        """The cheapest path of edges (Dijkstra on `_cost`) from `start` to `goal`."""
        prev: dict[int, Edge | None] = {start: None}
        dist = {start: 0}
        heap = [(0, 0, start)]
        tie = 0
        while heap:
            d, _, n = heapq.heappop(heap)
            if n == goal:
                path: list[Edge] = []
                while (e := prev[n]) is not None:
                    path.append(e)
                    n = e.src
                return path[::-1]
            if d > dist[n]:
                continue
            for e in self._neighbours(c, n):
                nd = d + self._cost(e)
                if e not in banned and nd < dist.get(e.dst, nd + 1):
                    dist[e.dst], prev[e.dst] = nd, e
                    tie += 1
                    heapq.heappush(heap, (nd, tie, e.dst))
        return None

    def _describe(self, n: int) -> str:
        node = self.snap.nodes[n]
        attrs = " ".join(map(str, node.attrs))
        return f"node {n} ({node.op.value}{' ' + attrs if attrs else ''} {list(node.children)})"

    def to_node(self, t: Term, path: Path, goal: int) -> Term:
        """Rewrite `t` (at `path`) until its top node is `goal` (same class)."""
        start = self.node_of(t)
        if start == goal:
            return t
        c = self.cls_of[start]
        if self.cls_of[goal] != c:
            raise ExplainError(f"{self._describe(start)} and {self._describe(goal)} "
                               f"are in different classes")
        if (t, goal) in self.active:
            raise ExplainError(f"class {c}: circular request {self._describe(start)} -> "
                               f"{self._describe(goal)}")
        if self.depth >= self.max_depth:
            raise ExplainDepthError(f"recursion depth {self.max_depth} reached in class {c}")
        self.active.add((t, goal))
        self.depth += 1
        banned: set[Edge] = set()
        firsts: set[Edge] = set()  # first edges of failed plans: the second strategy bans these
        mark = len(self.steps)
        last: ExplainError | None = None
        try:
            while True:
                self._visit()
                plan = self.bfs(c, start, goal, banned)
                if plan is None and firsts and not firsts <= banned:
                    banned = set(firsts)
                    continue
                if plan is None:
                    why = f" (last failure: {last})" if last else ""
                    raise ExplainError(f"class {c}: no path from {self._describe(start)} to "
                                       f"{self._describe(goal)}{why}")
                cur = t
                try:
                    for edge in plan:
                        cur = self.apply_edge(cur, path, edge)
                    return cur
                except (ExplainBudgetError, ExplainDepthError):
                    raise
                except ExplainError as e:
                    banned.add(edge)
                    firsts.add(plan[0])
                    last = e
                    del self.steps[mark:]
        finally:
            self.depth -= 1
            self.active.discard((t, goal))

    def to_term(self, t: Term, path: Path, u: Term) -> Term:
        """Rewrite `t` (at `path`) until it is exactly `u` (same class)."""
        if t is u:
            return t
        t = self.to_node(t, path, self.node_of(u))
        if t is u:
            return t
        pairs = enumerate(zip(t.args, u.args, strict=True))
        args = tuple(self.to_term(a, (*path, i), b) for i, (a, b) in pairs)
        return Term(t.op, args, t.attrs)

    def _positive_vars(self, rule: Rule) -> set[str]:
        return {c.term for c in rule.conditions if isinstance(c, Positive)}

    def _fix_var(self, t: Term, path: Path, name: str, inst: _Instance,
                 concrete: dict[str, Term], want: Mapping[str, int]) -> Term:
        """The sub-term at a variable position: the first occurrence binds it (after
        reaching a wanted top node, or a positive term if a condition asks), later
        occurrences are rewritten to be identical to it."""
        if name in concrete:
            return self.to_term(t, path, concrete[name])
        if name in want:
            t = self.to_node(t, path, want[name])
        if name in self._positive_vars(inst.rule) and not is_positive(t):
            w = self.positive_term(self.cls_of[self.node_of(t)])
            if w is None:
                raise ExplainError(f"{inst.rule.name}: no positive term for ?{name}")
            t = self.to_term(t, path, w)
        concrete[name] = t
        return t

    def conform(self, t: Term, path: Path, pat: PNode, inst: _Instance,
                concrete: dict[str, Term], want: Mapping[str, int]) -> Term:
        """Rewrite the children of `t` (whose top node is `pat`'s instance) until `t`
        is exactly an instance of `pat`."""
        args = list(t.args)
        for i, cp in enumerate(pat.args):
            cpath = (*path, i)
            if isinstance(cp, Var):
                args[i] = self._fix_var(args[i], cpath, cp.name, inst, concrete, want)
            else:
                child = self.to_node(args[i], cpath, inst.nodes[id(cp)])
                args[i] = self.conform(child, cpath, cp, inst, concrete, want)
        return t if tuple(args) == t.args else Term(t.op, tuple(args), t.attrs)

    def apply_edge(self, t: Term, path: Path, edge: Edge) -> Term:
        inst = self.inst[edge.firing]
        rule = inst.rule
        src, dst = (rule.lhs, rule.rhs) if edge.direction == "forward" else (rule.rhs, rule.lhs)
        concrete: dict[str, Term] = {}
        want = {dst.name: edge.dst} if isinstance(dst, Var) else {}
        if isinstance(src, Var):
            t = self._fix_var(t, path, src.name, inst, concrete, want)
        else:
            t = self.conform(t, path, src, inst, concrete, want)
        found = match(src, t) if isinstance(src, PNode) else {src.name: t}
        if found is None:
            raise ExplainError(f"{rule.name}: conformed term does not match {src}")
        extra = self._extra_bindings(inst, pattern_vars(dst) - set(found))
        try:
            out = rewrite_once(rule, t, edge.direction, extra)
        except RuleError as e:
            raise ExplainError(f"class {inst.cls}: {e}") from None
        if self.node_of(out) != edge.dst:
            got = self._describe(self.node_of(out))
            raise ExplainError(f"{rule.name} ({edge.direction}) reached {got}, "
                               f"expected {self._describe(edge.dst)}")
        self.steps.append(Step(rule.name, edge.direction, path, extra))
        if len(self.steps) > self.max_steps:
            raise ExplainBudgetError(f"step limit {self.max_steps} reached")
        return out

    def _extra_bindings(self, inst: _Instance, names: set[str]) -> Bindings:
        """Bindings the match cannot determine: split-factor parameters and, backwards,
        variables only the left side has (a term of the bound class)."""
        tvars = self._tvars[inst.rule.name]
        positive = self._positive_vars(inst.rule)
        out: Bindings = {}
        for name in sorted(names):
            v = inst.bindings.get(name)
            if v is None:
                raise ExplainError(f"{inst.rule.name}: firing has no binding for ?{name}")
            if name in tvars:
                c = int(v)
                w = self.positive_term(c) if name in positive else self.any_term(c)
                if w is None:
                    raise ExplainError(f"{inst.rule.name}: no positive term in class {c}")
                out[name] = w
            elif isinstance(v, float) and name in inst.rule.parameters:
                out[name] = int(v)
            else:
                out[name] = v
        return out


def explain(
    snapshot: Snapshot,
    rules: Iterable[Rule] | _RuleSource,
    spec_term: Term,
    target_term: Term,
    *,
    max_steps: int = 20_000,
    max_visits: int = 50_000,
    max_depth: int = 150,
    stats: Stats | None = None,
) -> list[Step]:
    """A chain of rule applications from `spec_term` to `target_term`, two terms of one
    e-class of `snapshot`, using only the recorded firings. Raises `ExplainError` (with
    the class and nodes involved) when none is found within the limits. (For many
    targets of one snapshot, build an `Explainer` once.)"""
    ex = Explainer(snapshot, rules, max_steps=max_steps, max_visits=max_visits,
                   max_depth=max_depth)
    return ex.explain(spec_term, target_term, stats=stats)


def replay(rules: Iterable[Rule] | _RuleSource, start: Term, steps: Iterable[Step]) -> Term:
    """Apply `steps` to `start` (a convenience for tests and callers; the checker has
    its own replay and trusts nothing here)."""
    by_name = _rules_by_name(rules)
    t = start
    for s in steps:
        t = apply_at(by_name[s.rule], t, s.path, s.direction, s.bindings)
    return t
