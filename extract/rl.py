"""`RLExtractor`: the learned policy as an extractor (the `Extractor` protocol).

It rolls the policy out on the snapshot's `ExtractionEnv`: first greedily (the most
probable candidate in every class), then by sampling, until it has `n` distinct
programs or `max_attempts` rollouts. Programs are returned in that order (the
policy's own ranking: greedy first), each checked acyclic and class-correct; the
`cost` is the given term cost, or the DAG cost under the given per-node cost. A
program the policy chose to materialize somewhere carries its `Store`s in `term`
(the `choice` is the class -> node map as for every extractor).

`propose(snapshot, root, cost, program, k, accept)` rolls out the joint policy
(`kernelsat.extract.rl_joint.JointEnv`: the program, then one decision per knob of its
lowering over `program.out_axes`) and returns up to `k` distinct `Proposal(term,
setting)` pairs that `accept` passes, greedy first; each is meant to be timed once at
exactly its setting. A caller that cannot time every pair (unproved, screened or
float-unsafe programs) passes its test as `accept`, so that `k` proposals are `k`
measurements.

The default checkpoint is the one shipped in `kernelsat/extract/checkpoints/`
(`DEFAULT_CHECKPOINT`); its features are computed for `target` (a `Target`, or a
name `get_target` resolves: "c", "numpy", "cuda", "h200" ...). It reads kernelsat ops,
so it extracts snapshots, not foreign e-graphs.

>>> from kernelsat.egraph.snapshot import ENode, Snapshot
>>> from kernelsat.ops import Op
>>> import numpy as np
>>> snap = Snapshot(
...     nodes=[ENode(Op.CONST, (0.0,), ()), ENode(Op.EXP, (), (0,)), ENode(Op.CONST, (1.0,), ())],
...     node_class=np.array([0, 1, 1]), classes=[[0], [1, 2]], class_shape=[{}, {}], root=1)
>>> found = RLExtractor(n=4).extract(snap, 1, lambda t: 1.0)
>>> {str(e.term) for e in found} <= {'(Const 1.0)', '(exp (Const 0.0))'}, found[0].method
(True, 'rl')
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

import numpy as np

from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract.base import (
    ASTSize,
    Cost,
    Extraction,
    ExtractionError,
    Graph,
    Pick,
    check_extraction,
    resolve_cost,
)
from kernelsat.extract.rl_env import ExtractionEnv, Featurizer, upgrade_policy
from kernelsat.extract.rl_joint import JointEnv
from kernelsat.extract.rl_policy import Decision, Policy, rollout
from kernelsat.hardware.knobs import Setting
from kernelsat.hardware.targets import Target, get_target
from kernelsat.ir import Term
from kernelsat.program import Program

DEFAULT_CHECKPOINT = Path(__file__).parent / "checkpoints" / "rl_c.npz"
"""The shipped checkpoint (trained for the C target on this kind of machine)."""


def load_policy(checkpoint: str | Path | None = None) -> Policy:
    """The policy at `checkpoint`, default the shipped one (cached per path), read for
    the current feature layout (`upgrade_policy`)."""
    path = Path(checkpoint) if checkpoint is not None else DEFAULT_CHECKPOINT
    key = str(path.resolve())
    if key not in _POLICIES:
        _POLICIES[key] = upgrade_policy(Policy.load(path)[0])
    return _POLICIES[key]


_POLICIES: dict[str, Policy] = {}

T = TypeVar("T")


@dataclass(frozen=True)
class Proposal:
    """One joint proposal: a program and the knob setting to time it at.

    `term` is a closed extraction of the snapshot; `setting` is in
    `kernelsat.hardware.knobs.Setting` form (kernel name -> knob -> value, the names
    `knob_table` gives for `lower(term, program.out_axes)` on the target), None for
    codegen's defaults. A proposal is measured once, at exactly its setting (a
    `Job.retime` timing: no knob search). `decisions` are the rollout's own (features,
    mask, action) steps that produced it, for a policy-gradient step on its measured
    reward; they take no part in equality."""

    term: Term
    setting: Setting | None
    decisions: tuple[Decision, ...] = field(default=(), compare=False, repr=False)


def proposal_key(term: Term, setting: Setting | None) -> str:
    """Equal for equal (program, setting) pairs (None and {} both mean the defaults)."""
    return f"{term.key}|{json.dumps(setting or {}, sort_keys=True, default=str)}"


MAX_WIDEN = 16.0  # a stream's temperature rises to at most this many times its own


class Widening:
    """The sampling temperature of a stream of distinct rollouts: `base` until
    `patience` rollouts in a row have found nothing new, then doubled (up to MAX_WIDEN x
    `base`), and so on. A peaked policy otherwise repeats its few favourite programs for
    every attempt and leaves the caller's budget unspent (the evaluation's rl once timed
    1 pair of 8 on logsumexp); its first picks are unchanged, and a stream that keeps
    finding new pairs never widens."""

    def __init__(self, base: float, patience: int) -> None:
        self.base = self.temperature = base
        self.patience = max(int(patience), 1)
        self.stale = 0

    def saw(self, new: bool) -> None:
        """Record whether the last rollout found a pair not seen before."""
        self.stale = 0 if new else self.stale + 1
        if self.stale >= self.patience and self.temperature < self.base * MAX_WIDEN:
            self.temperature = min(2.0 * self.temperature, self.base * MAX_WIDEN)
            self.stale = 0


@dataclass
class RLExtractor:
    """Up to `n` distinct programs from the policy: its greedy rollout, then samples
    at `temperature` drawn with `seed`, widened (`Widening`) while they repeat."""

    checkpoint: str | Path | None = None
    target: Target | str = "c"  # the record, or a name for `get_target`
    n: int = 8
    seed: int = 0
    temperature: float = 1.0
    max_attempts: int | None = None
    name: str = "rl"
    policy: Policy | None = field(default=None, repr=False)
    reads_ops: ClassVar[bool] = True  # the policy's features read the snapshot's ops

    def _policy(self) -> Policy:
        if self.policy is None:
            self.policy = load_policy(self.checkpoint)
        return self.policy

    def choose(self, graph: Graph, root: int, costs: Sequence[float]) -> list[Pick]:
        """The policy's picks (the costs play no part in them)."""
        if not isinstance(graph, Snapshot):
            raise ExtractionError("the rl extractor reads kernelsat ops: it extracts "
                                  "snapshots, not foreign e-graphs")
        return [Pick(e.choice, e.status) for e in self.extract(graph, root, ASTSize())]

    def propose(self, snapshot: Snapshot, root: int, cost: Cost, program: Program, k: int,
                accept: Callable[[Proposal], bool] | None = None) -> list[Proposal]:
        """Up to `k` distinct (program, setting) pairs that `accept` passes (default:
        all), best first: the greedy joint rollout (`JointEnv`: the program, then one
        decision per knob of its lowering over `program.out_axes` on the target), then
        samples at `temperature` drawn with `seed` (doubled, up to MAX_WIDEN x, after
        each `k` rollouts in a row that found nothing new: `Widening`),
        until `k` are found or `max_attempts` rollouts (default 10 k). `accept` sees
        each distinct pair once, in the stream's order. The `cost` plays no part in the
        choices; every program is checked acyclic and class-correct."""
        if not isinstance(snapshot, Snapshot):
            raise ExtractionError("the rl extractor reads kernelsat ops: it proposes for "
                                  "snapshots, not foreign e-graphs")
        policy = self._policy()
        env = JointEnv(snapshot, root, out_axes=program.out_axes,
                       target=get_target(self.target), featurize=True)

        def proposal(rolled: tuple[list[Decision], dict[str, Any]]) -> Proposal:
            decisions, info = rolled
            check_extraction(snapshot, root, info["choice"])
            return Proposal(info["term"], info["setting"], tuple(decisions))

        return list(self._distinct(env, policy, k,
                                   lambda info: proposal_key(info["term"], info["setting"]),
                                   proposal, accept))

    def extract(self, snapshot: Snapshot, root: int, cost: Cost) -> list[Extraction]:
        policy = self._policy()
        search, term_cost = resolve_cost(cost)
        env = ExtractionEnv(snapshot, root,
                            featurize=Featurizer.of(snapshot, root, get_target(self.target)))
        found: list[Extraction] = []

        def extraction(rolled: tuple[list[Decision], dict[str, Any]]) -> Extraction:
            info = rolled[1]
            term, choice = info["term"], info["choice"]
            used = check_extraction(snapshot, root, choice)
            choice = {c: choice[c] for c in used}
            value = (float(term_cost(term)) if term_cost is not None
                     else sum(float(search(snapshot, n)) for n in choice.values()))
            return Extraction(term, MappingProxyType(choice), value, self.name,
                              "policy-sampled" if found else "policy-greedy")

        for e in self._distinct(env, policy, self.n, lambda info: info["term"].key,
                                extraction):
            found.append(e)  # before the next one is made: only the first is greedy
        return found

    def _distinct(self, env: JointEnv | ExtractionEnv, policy: Policy, k: int,
                  key: Callable[[dict[str, Any]], str],
                  make: Callable[[tuple[list[Decision], dict[str, Any]]], T],
                  accept: Callable[[T], bool] | None = None) -> Iterator[T]:
        """`make(decisions, info)` of up to `k` rollouts with distinct `key`s that
        `accept` passes: the greedy rollout first, then samples at `temperature` drawn
        with `seed`, widened while they repeat (`Widening`; a new pair `accept` rejects
        is no repeat: a hotter policy strays into programs the screens remove, and once
        widened on those found none of a softmax's usable pairs in 400 rollouts), for at
        most `max_attempts` rollouts (default 10 k)."""
        rng = np.random.default_rng(self.seed)
        seen: set[str] = set()
        heat = Widening(self.temperature, k)
        attempts = self.max_attempts if self.max_attempts is not None else 10 * k
        found = 0
        for i in range(attempts):
            if found >= k:
                return
            decisions, _, info = rollout(env, policy, None if i == 0 else rng,
                                         heat.temperature)
            name = key(info)
            heat.saw(name not in seen)
            if name in seen:
                continue
            seen.add(name)
            made = make((decisions, info))
            if accept is None or accept(made):
                found += 1
                yield made

