"""Extraction as a sequential decision process, with the gymnasium API.

The state is the partial program (the node chosen so far for each class, the
classes materialized) and the class to resolve next; an action picks one candidate
of that class. Classes are resolved top-down, depth first, as in the sampler: a class
is *entered* (put on the current path) when it is first needed, resolved at once, and
*done* when every class below its chosen node is done. A done class keeps its node,
so the program is a DAG with one node per class.

A class's candidates are its nodes, plus, when the class is `storable`, a *store*
action (its `Store(itself)` node, which no acyclic extraction can choose directly):
taking it materializes the class and asks for the class again, without the store
action. The action mask is exact: an action is legal if and only if some sequence of
later actions completes the program. A node is legal iff none of its child classes is
on the current path and each child is *extractable avoiding the path*: in the least
fixpoint of classes off the path that are done or have a node whose children are all
in it. Done classes never sit on a path, so finishing more classes never makes a
pending class infeasible, and a child that is not extractable now never will be
(`tests/test_rl_env.py` checks both directions by brute force).

>>> from kernelsat.egraph.snapshot import ENode, Snapshot
>>> from kernelsat.ops import Op
>>> import numpy as np
>>> snap = Snapshot(  # class 1 = neg(neg(x)) = x: neg-of-itself is masked as a cycle
...     nodes=[ENode(Op.CONST, (2.0,), ()), ENode(Op.NEG, (), (1,)), ENode(Op.NEG, (), (2,))],
...     node_class=np.array([2, 1, 2]), classes=[[], [1], [0, 2]],
...     class_shape=[{}, {}, {}], root=2)
>>> env = ExtractionEnv(snap)
>>> obs, info = env.reset()
>>> obs["candidates"].tolist(), obs["mask"].tolist()
([0, 2], [True, False])
>>> obs, reward, done, truncated, info = env.step(0)
>>> done, str(info["term"])
(True, '(Const 2.0)')
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernelsat import ops
from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract.base import (
    ExtractionError,
    RooflineCost,
    node_flops_bytes,
    reachable_classes,
)
from kernelsat.extract.greedy import settle, tree_score
from kernelsat.extract.rl_policy import Policy
from kernelsat.hardware.targets import Target
from kernelsat.ir import Term
from kernelsat.ops import REDUCTIONS, Op

STORE_ACTION = -1
"""The candidate id of a class's store action (materialize it, then choose again)."""

RewardFn = Callable[[Term], tuple[float, str]]
"""A terminal reward: the finished program -> (reward, how it was obtained)."""


# -- the exact mask ------------------------------------------------------------------


@dataclass(frozen=True)
class Graph:
    """Adjacency of the classes reachable from a root, precomputed once per snapshot."""

    snapshot: Snapshot
    root: int
    classes: tuple[int, ...]
    parents: Mapping[int, tuple[int, ...]]  # class -> nodes that have it as a child
    kids: Mapping[int, frozenset[int]]  # node -> its distinct child classes
    storable: frozenset[int]

    @staticmethod
    def of(snapshot: Snapshot, root: int) -> Graph:
        classes = tuple(reachable_classes(snapshot, root))
        parents: dict[int, list[int]] = defaultdict(list)
        kids: dict[int, frozenset[int]] = {}
        for c in classes:
            for n in snapshot.classes[c]:
                kids[n] = frozenset(snapshot.nodes[n].children)
                for k in kids[n]:
                    parents[k].append(n)
        storable = frozenset(c for c in classes if snapshot.storable(c))
        return Graph(snapshot, root, classes, {k: tuple(v) for k, v in parents.items()},
                     kids, storable)


def extractable(graph: Graph, path: frozenset[int] | set[int], done: Mapping[int, int]
                ) -> set[int]:
    """The classes off `path` that have an acyclic term avoiding `path`: done classes,
    and the least fixpoint of classes with a node whose child classes are all in it."""
    snap = graph.snapshot
    ok: set[int] = {c for c in done if c not in path}
    need: dict[int, int] = {}
    work: list[int] = list(ok)
    for c in graph.classes:
        if c in path or c in ok:
            continue
        for n in snap.classes[c]:
            need[n] = len(graph.kids[n])
            if need[n] == 0 and c not in ok:
                ok.add(c)
                work.append(c)
    while work:
        k = work.pop()
        for n in graph.parents.get(k, ()):
            if n not in need:
                continue
            need[n] -= 1
            c = int(snap.node_class[n])
            if need[n] == 0 and c not in ok:
                ok.add(c)
                work.append(c)
    return ok


def legal_nodes(graph: Graph, c: int, path: set[int], done: Mapping[int, int]) -> list[bool]:
    """For each node of class `c` (on `path`), whether choosing it can be completed."""
    ok = extractable(graph, path, done)
    return [all(k not in path and k in ok for k in graph.kids[n])
            for n in graph.snapshot.classes[c]]


# -- the environment -----------------------------------------------------------------


@dataclass
class State:
    """The partial program: chosen nodes, materialized classes, the DFS stack."""

    choice: dict[int, int] = field(default_factory=dict)
    stored: set[int] = field(default_factory=set)
    path: set[int] = field(default_factory=set)
    done: dict[int, int] = field(default_factory=dict)
    stack: list[tuple[int, int]] = field(default_factory=list)  # (class, next child)
    current: int | None = None  # the class waiting for an action
    steps: int = 0


class ExtractionEnv:
    """gymnasium-style environment (`reset`, `step`, `action_mask`) over one snapshot.

    Observation: a dict with `class` (the class to resolve), `candidates` (node ids;
    `STORE_ACTION` for the store action), `mask` (legal candidates, exact) and, when a
    `featurize` function is given, `features` (one row per candidate). An action is an
    index into `candidates`. The episode ends with the complete program in
    `info["term"]` (and `info["choice"]`, `info["stored"]`); the terminal reward is
    `reward_fn(term)`, 0 when none is given; every other step rewards 0.
    """

    def __init__(self, snapshot: Snapshot, root: int | None = None,
                 reward_fn: RewardFn | None = None,
                 featurize: Callable[[ExtractionEnv], np.ndarray] | None = None,
                 allow_store: bool = True) -> None:
        self.snapshot = snapshot
        self.root = snapshot.root if root is None else root
        self.graph = Graph.of(snapshot, self.root)
        self.reward_fn = reward_fn
        self.featurize = featurize
        self.allow_store = allow_store
        self.state = State()
        if self.root not in extractable(self.graph, set(), {}):
            raise ExtractionError(f"class {self.root} has no acyclic extraction")

    # gymnasium API
    def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        self.state = State()
        self._enter(self.root)
        return self.observation(), {}

    def step(self, action: int) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        s = self.state
        if s.current is None:
            raise RuntimeError("the episode is over: call reset()")
        cands, mask = self.candidates(), self.action_mask()
        if not 0 <= action < len(cands) or not mask[action]:
            raise ValueError(f"illegal action {action} in class {s.current} (mask {mask.tolist()})")
        c, node = s.current, int(cands[action])
        s.steps += 1
        if node == STORE_ACTION:
            s.stored.add(c)
            return self.observation(), 0.0, False, False, {}
        s.choice[c] = node
        s.stack.append((c, 0))
        s.current = None
        self._advance()
        if s.current is not None:
            return self.observation(), 0.0, False, False, {}
        term = self.snapshot.term(s.choice, self.root, stored=sorted(s.stored))
        info: dict[str, Any] = {"term": term, "choice": dict(s.choice), "stored": set(s.stored)}
        reward = 0.0
        if self.reward_fn is not None:
            reward, info["reward_source"] = self.reward_fn(term)
        return {}, float(reward), True, False, info

    # the state
    def candidates(self) -> np.ndarray:
        """Candidate ids of the current class: its nodes, then the store action."""
        c = self.state.current
        assert c is not None
        ids = list(self.snapshot.classes[c])
        if self._can_store(c):
            ids.append(STORE_ACTION)
        return np.array(ids, dtype=np.int64)

    def action_mask(self) -> np.ndarray:
        """Exact legality of each candidate of the current class."""
        s = self.state
        assert s.current is not None
        legal = legal_nodes(self.graph, s.current, s.path, s.done)
        # a store node of the class itself is never legal (it is the cycle c -> c)
        if self._can_store(s.current):
            legal.append(any(legal))
        return np.array(legal, dtype=bool)

    def observation(self) -> dict[str, Any]:
        s = self.state
        obs: dict[str, Any] = {"class": s.current, "candidates": self.candidates(),
                               "mask": self.action_mask()}
        if self.featurize is not None:
            obs["features"] = self.featurize(self)
        return obs

    def _can_store(self, c: int) -> bool:
        return self.allow_store and c in self.graph.storable and c not in self.state.stored

    def _enter(self, c: int) -> None:
        self.state.path.add(c)
        self.state.current = c

    def _advance(self) -> None:
        """Pop finished classes and enter the next class that needs a node."""
        s = self.state
        while s.stack:
            c, i = s.stack[-1]
            children = self.snapshot.nodes[s.choice[c]].children
            if i == len(children):
                s.stack.pop()
                s.path.discard(c)
                s.done[c] = s.choice[c]
                continue
            s.stack[-1] = (c, i + 1)
            k = children[i]
            if k not in s.choice:
                self._enter(k)
                return

    @property
    def depth(self) -> int:
        return len(self.state.path)


def enumerate_programs(env: ExtractionEnv, limit: int) -> tuple[list[Term], bool]:
    """The distinct programs `env` can produce, by depth-first search over its exact
    mask, stopping at `limit`: `(programs, complete)`, complete when every program was
    found (the search space has fewer than `limit` programs). Give it an environment
    without a featurizer: every step computes the observation."""
    found: dict[str, Term] = {}
    env.reset()

    def visit() -> bool:
        saved = env.state
        for a in np.flatnonzero(env.action_mask()):
            env.state = copy.deepcopy(saved)
            _, _, done, _, info = env.step(int(a))
            if done:
                found.setdefault(info["term"].key, info["term"])
                if len(found) >= limit:
                    return False
            elif not visit():
                return False
        return True

    complete = visit()
    return list(found.values()), complete


# -- static node features --------------------------------------------------------------

LEGACY_OPS: tuple[str, ...] = (
    "In", "Const", "neg", "exp", "log", "sqrt", "recip", "tanh", "erf", "sigmoid", "relu",
    "abs", "add", "sub", "mul", "div", "max", "min", "Sum", "Max", "LSE", "SoftmaxAvg", "Dot",
    "Split", "Store",
)
"""The ops of the first feature layout, frozen: their one-hot block is what the shipped
checkpoint was trained on. An op added later has zeros here and is seen through its
properties (`PROPERTIES`); the width never depends on the number of ops."""

PROPERTIES: tuple[tuple[str, frozenset[Op]], ...] = (
    ("leaf", ops.LEAVES),
    ("unary", ops.UNARY),
    ("binary", ops.BINARY),
    ("reduction", ops.REDUCTIONS),
    ("monoid-reduction", ops.MONOID_REDUCTIONS),
    ("online", ops.ONLINE),
    ("commutative", ops.COMMUTATIVE),
    ("associative", ops.ASSOCIATIVE),
    ("transcendental", ops.TRANSCENDENTAL),
    ("uninterpreted", ops.UNINTERPRETED),
    ("positive", ops.POSITIVE_ALWAYS),
    ("layout", frozenset(op for op, i in ops.OPS.items() if i.kind == "layout")),
)
"""Op properties as features, one column each (then one for the op's FLOP weight)."""

N_NUMERIC = 14
N_NODE = len(LEGACY_OPS) + N_NUMERIC + len(PROPERTIES) + 1
"""Static features per candidate: the legacy op one-hot, the numeric features below,
then the op's properties and FLOP weight."""

_LEGACY_INDEX = {name: i for i, name in enumerate(LEGACY_OPS)}


def op_features(op: Op) -> np.ndarray:
    """The property columns of `op`: membership in each `PROPERTIES` set, then its FLOP
    weight (log scale)."""
    flags = [float(op in members) for _, members in PROPERTIES]
    return np.array([*flags, math.log2(1.0 + ops.FLOPS_PER_ELEMENT[op]) / 4])


_OP_FEATURES = {op: op_features(op) for op in Op}


def _log2(x: float) -> float:
    return math.log2(1.0 + max(x, 0.0))


def node_table(snapshot: Snapshot, root: int, costs: list[float], dtype_bytes: int = 4,
               ridge: float = 10.0) -> np.ndarray:
    """Static features of every node (rows by node id) plus one extra row for the store
    action: op, axis sizes, split factor, reduction, the analytic seconds, FLOPs and
    bytes of the cheapest subtree under the node (tree cost, relative to the class's
    cheapest), and its arithmetic intensity against the target's ridge point."""
    settled = settle(snapshot, root, tree_score(snapshot, costs), full=True)
    sub_fb: dict[int, tuple[float, float]] = {}
    for c in settled.order:  # children settle before parents
        n = settled.best[c]
        f, b, _ = node_flops_bytes(snapshot, n, dtype_bytes)
        for k in snapshot.nodes[n].children:
            kf, kb = sub_fb[k]
            f, b = f + kf, b + kb
        sub_fb[c] = (f, b)
    rows = np.zeros((snapshot.n_nodes + 1, N_NODE))
    base, props = len(LEGACY_OPS), len(LEGACY_OPS) + N_NUMERIC
    for n, node in enumerate(snapshot.nodes):
        c = int(snapshot.node_class[n])
        row = rows[n]
        if node.op.value in _LEGACY_INDEX:
            row[_LEGACY_INDEX[node.op.value]] = 1.0
        row[props:] = _OP_FEATURES[node.op]
        shape = snapshot.class_shape[c]
        f, b, space = node_flops_bytes(snapshot, n, dtype_bytes)
        kids = node.children
        feasible = all(k in settled.cost for k in kids) and c in settled.cost
        below = costs[n] + sum(settled.cost.get(k, math.inf) for k in kids)
        best = settled.cost.get(c, math.inf)
        for k in kids:
            if k in sub_fb:
                f, b = f + sub_fb[k][0], b + sub_fb[k][1]
        row[base + 0] = _log2(math.prod(shape.values())) / 24
        row[base + 1] = _log2(space) / 30
        row[base + 2] = len(shape) / 6
        row[base + 3] = (_log2(float(node.attrs[1])) / 8) if node.op is Op.SPLIT else 0.0
        row[base + 4] = float(node.op in REDUCTIONS)
        if node.op in REDUCTIONS and len(kids) > 0:
            axis = str(node.attrs[0])
            row[base + 5] = _log2(snapshot.class_shape[kids[0]].get(axis, 1)) / 16
        row[base + 6] = len(kids) / 3
        rel = math.log(below / best) if feasible and best > 0 and below > 0 else 0.0
        row[base + 7] = min(rel, 5.0) / 5 if feasible else 1.0
        row[base + 8] = float(feasible and below <= best * (1 + 1e-9))
        row[base + 9] = math.log10(1.0 + f) / 12
        row[base + 10] = math.log10(1.0 + b) / 12
        row[base + 11] = (math.log10((f + 1) / (b + 1)) - math.log10(ridge)) / 3
        row[base + 12] = float(node.op is Op.STORE)
    rows[snapshot.n_nodes, base + 13] = 1.0  # the store action
    rows[snapshot.n_nodes, _LEGACY_INDEX[Op.STORE.value]] = 1.0
    rows[snapshot.n_nodes, props:] = _OP_FEATURES[Op.STORE]
    return rows


def target_features(target: Target) -> np.ndarray:
    """Target descriptors, normalized so that CPUs and GPUs share one scale."""
    peak, bw = float(target.peak_fp32), float(target.mem_bandwidth)
    return np.array([
        math.log10(peak) / 14,
        math.log10(bw) / 13,
        math.log2(max(float(target.llc_bytes), 1.0)) / 32,
        math.log2(max(float(target.units), 1.0)) / 8,
        float(target.simd_bits) / 1024,
        float(target.kind == "gpu"),
        math.log10(peak / bw) / 3,
        float(target.transcendental_penalty) / 32,
        min(float(target.launch_overhead) * 1e5, 10.0),
    ])


N_TARGET = 9
N_DYN = 3
N_PROGRAM = N_NODE + N_DYN + N_TARGET
"""Columns of a program decision's features: static node features, the step's dynamic
features (depth, fraction of classes resolved, class already stored), the target."""

N_SCHED = 15
"""Columns of a schedule decision's features (`kernelsat.extract.rl_joint`): the schedule
model's prediction of the kernel with the candidate value, its loop nest's cache
footprints, vector and thread use, and the value's own position."""

PHASE = N_PROGRAM
"""The phase column: 0 for a program decision, 1 for a schedule decision."""

N_FEATURES = N_PROGRAM + 1 + N_SCHED
"""Columns of one candidate's feature row, either phase: `[node | dynamic | target |
phase | schedule]`. A program decision has zeros in the schedule block; a schedule
decision zeros in the node and dynamic blocks (the target block is shared)."""

LEGACY_N_FEATURES = len(LEGACY_OPS) + N_NUMERIC + N_DYN + N_TARGET
"""The width of the first layout (no property columns): the shipped checkpoint's."""


def upgrade_policy(policy: Policy, extra: dict[str, np.ndarray] | None = None) -> Policy:
    """`policy` for the current layout, scoring every candidate it could score before
    exactly as before; its Adam state in `extra` is widened the same way (in place).

    - the first layout (`LEGACY_N_FEATURES` inputs) gets zero weights for the property
      columns, inserted where they sit, then as below;
    - the program layout (`N_PROGRAM` inputs, before the joint policy) gets zero
      weights for the phase and schedule columns, appended: its program decisions score
      as before (their phase and schedule columns are 0 anyway).

    A current policy is returned as is; any other width is an error."""
    n = policy.n_features
    if n == N_FEATURES:
        return policy
    if n not in (LEGACY_N_FEATURES, N_PROGRAM):
        raise ValueError(f"the policy has {n} input features; this version computes "
                         f"{N_FEATURES} (or reads the earlier layouts' {LEGACY_N_FEATURES} "
                         f"or {N_PROGRAM})")
    steps = [(len(LEGACY_OPS) + N_NUMERIC, len(PROPERTIES) + 1)] if n == LEGACY_N_FEATURES else []
    steps.append((N_PROGRAM, 1 + N_SCHED))
    params = dict(policy.params)
    width = n
    for at, count in steps:
        for k in list(extra or {}):
            if k.startswith(("adam_m_", "adam_v_")) and k[7:] in ("W1", "u"):
                assert extra is not None
                extra[k] = _widen(k[7:], extra[k], at, count, width)
        params = {k: _widen(k, v, at, count, width) for k, v in params.items()}
        width += count
    return Policy(params, dict(policy.meta, n_features=N_FEATURES, upgraded_from=n))


def _widen(name: str, a: np.ndarray, at: int, count: int, n: int) -> np.ndarray:
    """Parameter `name` with `count` zero input columns inserted at `at` (`u` holds two
    blocks of `n`: the mean and the max of the rows)."""
    match name:
        case "W1":
            return np.insert(a, [at] * count, 0.0, axis=0)
        case "u":
            return np.concatenate([np.insert(a[:n], [at] * count, 0.0),
                                   np.insert(a[n:], [at] * count, 0.0)])
    return a


@dataclass
class Featurizer:
    """Feature rows for an environment's current candidates (static table cached)."""

    table: np.ndarray
    target: np.ndarray

    @staticmethod
    def of(snapshot: Snapshot, root: int, target: Target) -> Featurizer:
        costs = [RooflineCost.for_target(target)(snapshot, n) for n in range(snapshot.n_nodes)]
        scale = min((x for x in costs if x > 0), default=1.0)
        costs = [x / scale for x in costs]  # units of the cheapest node: well conditioned
        ridge = float(target.peak_fp32) / float(target.mem_bandwidth)
        return Featurizer(node_table(snapshot, root, costs, ridge=ridge),
                          target_features(target))

    def __call__(self, env: ExtractionEnv) -> np.ndarray:
        cands = env.candidates()
        rows = self.table[np.where(cands == STORE_ACTION, env.snapshot.n_nodes, cands)]
        s = env.state
        dyn = np.array([min(env.depth, 32) / 16, len(s.choice) / max(len(env.graph.classes), 1),
                        float(s.current in s.stored)])
        extra = np.concatenate([dyn, self.target, np.zeros(1 + N_SCHED)])  # phase 0
        return np.hstack([rows, np.broadcast_to(extra, (len(rows), len(extra)))])
