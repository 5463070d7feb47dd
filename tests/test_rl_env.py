"""The RL extraction environment: exact masks, acyclic class-correct programs."""

from __future__ import annotations

import copy
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.egraph.snapshot import ENode, Snapshot
from kernelsat.extract.base import ExtractionError, check_extraction
from kernelsat.extract.rl_env import N_FEATURES, STORE_ACTION, ExtractionEnv, Featurizer
from kernelsat.ops import Op


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    """Small random e-graphs with cycles, shared classes and self-Store nodes."""
    n_classes = draw(st.integers(1, 5))
    nodes: list[ENode] = []
    owner: list[int] = []
    for c in range(n_classes):
        for _ in range(draw(st.integers(1, 3))):
            arity = draw(st.integers(0, 2))
            kids = tuple(draw(st.integers(0, n_classes - 1)) for _ in range(arity))
            op = (Op.CONST, Op.NEG, Op.ADD)[arity]
            attrs = (float(len(nodes)),) if arity == 0 else ()
            nodes.append(ENode(op, attrs, kids))
            owner.append(c)
        if draw(st.booleans()):
            nodes.append(ENode(Op.STORE, (), (c,)))
            owner.append(c)
    classes = [[n for n in range(len(nodes)) if owner[n] == c] for c in range(n_classes)]
    return Snapshot(nodes, np.array(owner), classes, [{} for _ in range(n_classes)], 0)


def _raw_step(env: ExtractionEnv, node: int) -> None:
    """Choose `node` for the current class without consulting the mask."""
    s = env.state
    assert s.current is not None
    if node == STORE_ACTION:
        s.stored.add(s.current)
        return
    s.choice[s.current] = node
    s.stack.append((s.current, 0))
    s.current = None
    env._advance()


def completable(env: ExtractionEnv) -> bool:
    """Brute force: can some sequence of choices finish the program without a cycle?"""
    s = env.state
    if s.current is None:
        return True
    c = s.current
    for n in env.snapshot.classes[c]:
        if any(k in s.path for k in env.snapshot.nodes[n].children):
            continue  # closes a cycle
        trial = copy.copy(env)
        trial.state = copy.deepcopy(s)
        _raw_step(trial, n)
        if completable(trial):
            return True
    return False


def _env_or_none(snap: Snapshot) -> ExtractionEnv | None:
    try:
        return ExtractionEnv(snap)
    except ExtractionError:
        return None


@settings(max_examples=150, deadline=None)
@given(snapshots(), st.integers(0, 2**16))
def test_random_episodes_are_acyclic_class_correct_and_masks_exact(snap: Snapshot, seed: int
                                                                   ) -> None:
    env = _env_or_none(snap)
    if env is None:
        assert not completable(_start(snap))
        return
    rng = random.Random(seed)
    obs, _ = env.reset()
    done = False
    for _ in range(100):
        cands, mask = obs["candidates"], obs["mask"]
        assert mask.any(), "a reachable state always has a legal action"
        for i, node in enumerate(cands):
            trial = copy.copy(env)
            trial.state = copy.deepcopy(env.state)
            if node != STORE_ACTION and any(k in trial.state.path
                                            for k in snap.nodes[node].children):
                assert not mask[i]
                continue
            _raw_step(trial, int(node))
            assert bool(mask[i]) == completable(trial), (i, node, mask)
        action = rng.choice([i for i in range(len(cands)) if mask[i]])
        obs, _, done, _, info = env.step(action)
        if done:
            break
    assert done
    order = check_extraction(snap, 0, info["choice"])
    assert set(order) == set(info["choice"])
    assert info["term"] == snap.term(info["choice"], 0, stored=info["stored"])


def _start(snap: Snapshot) -> ExtractionEnv:
    env = ExtractionEnv.__new__(ExtractionEnv)
    env.snapshot, env.root = snap, 0
    from kernelsat.extract.rl_env import Graph, State

    env.graph, env.allow_store = Graph.of(snap, 0), True
    env.state = State()
    env._enter(0)
    return env


def test_illegal_action_is_refused() -> None:
    snap = Snapshot([ENode(Op.CONST, (2.0,), ()), ENode(Op.NEG, (), (1,)),
                     ENode(Op.NEG, (), (2,))], np.array([2, 1, 2]), [[], [1], [0, 2]],
                    [{}, {}, {}], 2)
    env = ExtractionEnv(snap)
    env.reset()
    with pytest.raises(ValueError, match="illegal action"):
        env.step(1)


def test_store_action_materializes_the_class() -> None:
    from kernelsat.ir import In, Store, exp

    x = In("x", (("i", 4),))
    snap = Snapshot([ENode(Op.IN, x.attrs, ()), ENode(Op.EXP, (), (0,)),
                     ENode(Op.STORE, (), (1,))], np.array([0, 1, 1]), [[0], [1, 2]],
                    [{"i": 4}, {"i": 4}], 1)
    env = ExtractionEnv(snap)
    obs, _ = env.reset()
    assert obs["candidates"].tolist() == [1, 2, STORE_ACTION]
    assert obs["mask"].tolist() == [True, False, True]
    obs, *_ = env.step(2)
    assert obs["candidates"].tolist() == [1, 2] and obs["mask"].tolist() == [True, False]
    obs, _, done, _, _ = env.step(0)
    assert not done and obs["class"] == 0
    _, _, done, _, info = env.step(0)
    assert done and info["term"] == Store(exp(x))


def test_features_have_one_row_per_candidate() -> None:
    from kernelsat.hardware.targets import get_target
    from kernelsat.ir import In

    x = In("x", (("i", 4),))
    snap = Snapshot([ENode(Op.IN, x.attrs, ()), ENode(Op.EXP, (), (0,)),
                     ENode(Op.STORE, (), (1,))], np.array([0, 1, 1]), [[0], [1, 2]],
                    [{"i": 4}, {"i": 4}], 1)
    feat = Featurizer.of(snap, 1, get_target("c"))
    env = ExtractionEnv(snap, featurize=feat)
    obs, _ = env.reset()
    assert obs["features"].shape == (3, N_FEATURES)
    assert np.isfinite(obs["features"]).all()


def all_programs(env: ExtractionEnv) -> set[str]:
    """Brute force, without the mask: every program some sequence of choices finishes."""
    s = env.state
    if s.current is None:
        return {env.snapshot.term(s.choice, 0, stored=sorted(s.stored)).key}
    out: set[str] = set()
    c = s.current
    options = list(env.snapshot.classes[c])
    if env._can_store(c):
        options.append(STORE_ACTION)
    for n in options:
        if n != STORE_ACTION and any(k in s.path for k in env.snapshot.nodes[n].children):
            continue
        trial = copy.copy(env)
        trial.state = copy.deepcopy(s)
        _raw_step(trial, n)
        out |= all_programs(trial)
    return out


@settings(max_examples=120, deadline=None)
@given(snapshots())
def test_enumeration_finds_every_program_and_stops_at_its_limit(snap: Snapshot) -> None:
    from kernelsat.extract.rl_env import enumerate_programs

    env = _env_or_none(snap)
    if env is None:
        return
    expected = all_programs(_start(snap))
    programs, complete = enumerate_programs(env, len(expected) + 1)
    assert complete and {t.key for t in programs} == expected
    if len(expected) > 1:
        some, complete = enumerate_programs(env, len(expected) - 1)
        assert not complete and len(some) == len(expected) - 1
        assert {t.key for t in some} < expected
