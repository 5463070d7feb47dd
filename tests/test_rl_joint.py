"""The joint program-and-schedule environment: exact masks in both phases, closed programs
with legal settings, exact gradients on joint features, learning a known best knob,
proposals, the reward shapes and resumed training."""

from __future__ import annotations

import copy
import itertools
import json
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.codegen.lower import lower
from kernelsat.driver.jobs import JobResult
from kernelsat.egraph.saturate import saturate
from kernelsat.egraph.snapshot import ENode, Snapshot
from kernelsat.extract.base import ASTSize, ExtractionError, check_extraction
from kernelsat.extract.rl import MAX_WIDEN, RLExtractor, Widening, proposal_key
from kernelsat.extract.rl_env import N_FEATURES, N_SCHED, PHASE
from kernelsat.extract.rl_joint import JointEnv, ScheduleSpace
from kernelsat.extract.rl_policy import Adam, Decision, Policy, rollout
from kernelsat.hardware.knobs import is_legal, knob_table
from kernelsat.hardware.targets import get_target
from kernelsat.ir import Term
from kernelsat.learning.rl_train import TRAIN_OPTIONS, TrainConfig, train, train_envs
from kernelsat.ops import Op
from kernelsat.rewrites.library import library_rules
from kernelsat.spec import parse_spec
from tests.test_rl_env import _raw_step, completable, snapshots

# -- random knob tables with cross-knob constraints ------------------------------------


@st.composite
def spaces(draw: st.DrawFn) -> ScheduleSpace:
    """1-3 kernels of 1-3 knobs of 1-4 values each, and a random set of forbidden
    complete knob dicts per kernel (never all of them: one dict stays allowed)."""
    table: dict[str, dict[str, tuple[Any, ...]]] = {}
    forbidden: dict[str, set[str]] = {}
    for k in range(draw(st.integers(1, 3))):
        knobs = {f"n{j}": tuple(draw(st.lists(st.sampled_from([1, 2, 4, 8, 16, 64, True, False]),
                                              min_size=1, max_size=4, unique=True)))
                 for j in range(draw(st.integers(1, 3)))}
        table[f"k{k}"] = knobs
        combos = [dict(zip(knobs, vals, strict=True))
                  for vals in itertools.product(*knobs.values())]
        keep = draw(st.integers(0, len(combos) - 1))
        forbidden[f"k{k}"] = {json.dumps(c, sort_keys=True) for i, c in enumerate(combos)
                              if i != keep and draw(st.booleans())}

    def allowed(kernel: str, knobs: Mapping[str, Any]) -> bool:
        return json.dumps(dict(knobs), sort_keys=True) not in forbidden[kernel]

    return ScheduleSpace(table, allowed=allowed)


def brute_completable(space: ScheduleSpace, kernel: str, fixed: Mapping[str, Any]) -> bool:
    """Some legal setting of `kernel` agrees with `fixed` (the whole product searched)."""
    knobs = space.table[kernel]
    for vals in itertools.product(*knobs.values()):
        full = dict(zip(knobs, vals, strict=True))
        if all(full[n] == v for n, v in fixed.items()) and (
                space.allowed is None or space.allowed(kernel, full)):
            return True
    return False


@settings(max_examples=80, deadline=None)
@given(snapshots(), spaces(), st.integers(0, 2**16))
def test_joint_masks_are_exact_and_episodes_end_closed_and_legal(
        snap: Snapshot, space: ScheduleSpace, seed: int) -> None:
    try:
        env = JointEnv(snap, 0, space=lambda term: space)
    except ExtractionError:
        return
    rng = random.Random(seed)
    obs, _ = env.reset()
    for _ in range(200):
        mask = obs["mask"]
        assert mask.any(), "a reachable state always has a legal action"
        if env.phase == "schedule":
            kernel, knob = obs["coordinate"]
            values = space.table[kernel][knob]
            for i, v in enumerate(values):
                assert bool(mask[i]) == brute_completable(
                    space, kernel, {**env.setting[kernel], knob: v}), (kernel, knob, v)
        else:  # the program phase is ExtractionEnv's: its mask is exact too
            for i, node in enumerate(obs["candidates"]):
                trial = copy.copy(env.program)
                trial.state = copy.deepcopy(env.program.state)
                if node >= 0 and any(k in trial.state.path for k in snap.nodes[node].children):
                    assert not mask[i]
                    continue
                _raw_step(trial, int(node))
                assert bool(mask[i]) == completable(trial)
        action = rng.choice([i for i in range(len(mask)) if mask[i]])
        obs, _, done, _, info = env.step(action)
        if done:
            break
    assert done
    check_extraction(snap, 0, info["choice"])
    setting = info["setting"]
    assert is_legal(space.table, setting)
    assert space.allowed is not None
    assert all(space.allowed(k, v) for k, v in setting.items())


def test_an_illegal_value_is_refused() -> None:
    snap = Snapshot([ENode(Op.CONST, (1.0,), ())], np.array([0]), [[0]], [{}], 0)
    space = ScheduleSpace({"k0": {"a": (1, 2), "b": (3, 4)}},
                          allowed=lambda k, knobs: not (knobs["a"] == 2 and knobs["b"] == 4)
                          and not (knobs["a"] == 2 and knobs["b"] == 3))
    env = JointEnv(snap, space=lambda term: space)
    env.reset()
    obs, *_ = env.step(0)
    assert obs["mask"].tolist() == [True, False]  # a=2 has no legal b
    with pytest.raises(ValueError, match="illegal value"):
        env.step(1)


# -- real programs lowered for a target --------------------------------------------------

SPEC = ("kernel jn(M=64, N=96)\nin X[i:M, n:N] f32\nin W[n:N] f32\n"
        "A[i, n] = exp(X[i, n])\nout Y[i, n] = A[i, n] / sum(n: A[i, n]) * W[n]\n")


@pytest.fixture(scope="module")
def saturated() -> tuple[Any, Snapshot]:
    program = parse_spec(SPEC, "jn")
    snap = saturate(program.term, library_rules(), iters=3, nodes=400, seconds=20.0).snapshot
    return program, snap


@pytest.mark.parametrize("target", ["c", "numpy"])
def test_lowered_episodes_end_with_a_closed_program_and_a_legal_setting(
        saturated: tuple[Any, Snapshot], target: str) -> None:
    program, snap = saturated
    tgt = get_target(target)
    env = JointEnv(snap, out_axes=program.out_axes, target=tgt, featurize=True)
    policy = Policy.init(N_FEATURES, 8, seed=1)
    for seed in range(4):
        decisions, _, info = rollout(env, policy, np.random.default_rng(seed))
        check_extraction(snap, snap.root, info["choice"])
        table = knob_table(lower(info["term"], program.out_axes), tgt.backend, tgt)
        assert is_legal(table, info["setting"])
        assert info["coordinates"] == sum(len(v) for v in table.values())
        phases = [float(d.features[0, PHASE]) for d in decisions]
        assert phases == sorted(phases)  # program decisions, then schedule ones
        assert phases.count(1.0) == info["coordinates"]
        for d in decisions:
            assert d.features.shape[1] == N_FEATURES and np.isfinite(d.features).all()
            if d.features[0, PHASE] == 0.0:
                assert not d.features[:, PHASE + 1:].any()
            else:
                assert not d.features[:, :PHASE - 9].any()  # node and dynamic blocks
                priced = d.features[:, -1]
                assert priced.all() == (target == "c")


def test_schedule_features_see_the_model_not_names(saturated: tuple[Any, Snapshot]) -> None:
    # the candidate the schedule model prices fastest has the "best predicted" flag and a
    # zero relative-time column; the columns do not change when the knob is renamed
    program, snap = saturated
    tgt = get_target("c")
    env = JointEnv(snap, out_axes=program.out_axes, target=tgt, featurize=True)
    obs, _ = env.reset()
    while env.phase == "program":
        obs, *_ = env.step(int(np.flatnonzero(obs["mask"])[0]))
    rows = obs["features"][:, PHASE + 1:]
    kernel, knob = obs["coordinate"]
    values = env.space.table[kernel][knob]
    secs = [env.space.seconds(kernel, env._knobs_with(kernel, knob, v)) for v in values]
    assert all(s is not None for s in secs)
    best = int(np.argmin(secs))
    assert rows[best, 1] == 1.0 and rows[best, 0] == 0.0
    assert rows.shape[1] == N_SCHED


def test_propose_gives_distinct_pairs_greedy_first(saturated: tuple[Any, Snapshot]) -> None:
    program, snap = saturated
    ex = RLExtractor(policy=Policy.init(N_FEATURES, 8, seed=2), target="c", seed=3)
    found = ex.propose(snap, snap.root, ASTSize(), program, 5)
    assert 1 <= len(found) <= 5
    assert len({proposal_key(p.term, p.setting) for p in found}) == len(found)
    env = JointEnv(snap, out_axes=program.out_axes, target=get_target("c"), featurize=True)
    _, _, greedy = rollout(env, ex._policy(), None)
    assert (found[0].term, found[0].setting) == (greedy["term"], greedy["setting"])
    tgt = get_target("c")
    for p in found:
        assert p.setting is not None
        assert is_legal(knob_table(lower(p.term, program.out_axes), tgt.backend, tgt),
                        p.setting)


# -- the policy on joint features ----------------------------------------------------------


def test_gradients_are_exact_on_joint_episodes(saturated: tuple[Any, Snapshot]) -> None:
    program, snap = saturated
    env = JointEnv(snap, out_axes=program.out_axes, target=get_target("c"), featurize=True)
    policy = Policy.init(N_FEATURES, 5, seed=4)
    rng = np.random.default_rng(0)
    policy.params["u"] = rng.normal(0, 0.1, 2 * N_FEATURES)
    episodes: list[tuple[Sequence[Decision], float]] = []
    for seed in range(2):
        decisions, _, _ = rollout(env, policy, np.random.default_rng(seed))
        episodes.append((decisions, float(rng.normal())))
    assert all(e[0][-1].features[0, PHASE] == 1.0 for e in episodes)  # schedule decisions
    beta, coef = 0.05, 0.5
    grads = policy.gradients(episodes, beta, coef)
    base = Policy({k: v.copy() for k, v in policy.params.items()})

    def loss() -> float:  # the advantage held constant: the baseline frozen at `base`
        total = 0.0
        for decisions, reward in episodes:
            for d in decisions:
                adv = reward - base.value(d.features, d.mask)
                p = policy.probabilities(d.features, d.mask)
                logp = np.log(np.where(d.mask, p, 1.0))
                ent = -float(np.sum(np.where(d.mask, p * logp, 0.0)))
                v = policy.value(d.features, d.mask)
                total += (-adv * logp[d.action] - beta * ent + coef * (v - reward) ** 2
                          ) / len(decisions)
        return total / len(episodes)

    assert loss() == pytest.approx(policy.loss(episodes, beta, coef), abs=1e-12)
    eps = 1e-6
    rows = [PHASE, PHASE + 1, PHASE + 3, N_FEATURES - 1, 0, PHASE - 1]  # schedule, node, target
    checks = ([("W1", (r, h)) for r in rows for h in range(5)]
              + [("u", (j,)) for r in rows for j in (r, N_FEATURES + r)]
              + [("w2", (h,)) for h in range(5)] + [("b1", (0,)), ("c", (0,))])
    for name, idx in checks:
        value = policy.params[name]
        old = value[idx]
        value[idx] = old + eps
        up = loss()
        value[idx] = old - eps
        down = loss()
        value[idx] = old
        numeric = (up - down) / (2 * eps)
        assert grads[name][idx] == pytest.approx(numeric, rel=1e-4, abs=1e-7), (name, idx)


def test_the_policy_learns_the_best_knob_value() -> None:
    # one program; kernel k0 has a tile knob whose best value is 32 (reward falls off in
    # log2 distance) and a flag whose best value is False: the policy must learn both
    snap = Snapshot([ENode(Op.CONST, (1.0,), ())], np.array([0]), [[0]], [{}], 0)
    space = ScheduleSpace({"k0": {"tile": (8, 16, 32, 64, 128), "flag": (True, False)}})

    def reward(term: Term, setting: dict[str, dict[str, Any]]) -> tuple[float, str]:
        k = setting["k0"]
        return -abs(math.log2(k["tile"] / 32)) / 2 - 0.5 * float(k["flag"]), "synthetic"

    env = JointEnv(snap, space=lambda term: space, reward_fn=reward, featurize=True,
                   target=get_target("c"))
    # seeded: on this problem 7 of 8 seeds reach the best pair in 4000 episodes, one
    # stops at its neighbour tile (the best value sits mid-list: the scorer must bend)
    policy = Policy.init(N_FEATURES, 32, seed=0)
    cfg = TrainConfig(batch=8, lr=0.02, beta=0.005, hidden=32, seed=0)
    rewards = train_envs([env], policy, Adam(cfg.lr), cfg, 4000)
    assert np.mean(rewards[-40:]) > np.mean(rewards[:40])
    _, r, info = rollout(env, policy, None)
    assert info["setting"] == {"k0": {"tile": 32, "flag": False}}, info["setting"]
    assert r == 0.0


# -- rewards and resumed training -------------------------------------------------------------


def test_reward_shapes_are_bounded_and_ordered() -> None:
    log = TrainConfig(clip=1.0)
    assert log.shape(1.0, 1.0, []) == 0.0
    assert log.shape(1e-6, 1.0, []) == 1.0 and log.shape(155.0, 1.0, []) == -1.0
    assert log.shape(math.inf, 1.0, []) == -1.0
    rank = TrainConfig(reward="rank")
    history = [1.0, 2.0, 3.0, 4.0]
    shaped = [rank.shape(t, 2.0, history) for t in history]
    assert shaped == sorted(shaped, reverse=True) and shaped[0] == 1.0 and shaped[-1] == -1.0
    assert rank.shape(1e-9, 2.0, [*history, 1e-9]) == 1.0  # an outlier is just the best
    with pytest.raises(ValueError, match="reward"):
        TrainConfig(reward="linear")


class FakeBackend:
    """Times a job by the size of its program and its setting (deterministic): the
    setting's `vec` halves the time, so the schedule matters."""

    name = "fake"

    def __init__(self) -> None:
        self.jobs: list[Any] = []

    def run(self, jobs: Sequence[Any], progress: Any = None) -> list[JobResult]:
        out = []
        for j in jobs:
            self.jobs.append(j)
            size = len(j.program)  # the s-expression's length
            knobs = json.loads(j.retime or "{}")
            bonus = 1.0 + sum(len(json.dumps(v)) for v in knobs.values()) % 7
            out.append(JobResult(j.key, True, 1e-3 * size / bonus, knobs=knobs))
        return out

    def close(self) -> None:
        pass


def test_resumed_joint_training_equals_one_run(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.ks").write_text("kernel a(N=64)\nin X[n:N] f32\nout Y[n] = exp(X[n]) * 2\n")
    (corpus / "b.ks").write_text("kernel b(M=16, N=32)\nin X[i:M, n:N] f32\n"
                                 "out Y[i] = sum(n: X[i, n] * X[i, n])\n")
    ms = replace(TRAIN_OPTIONS, iters=2, nodes=200)
    cfg = TrainConfig(batch=4, hidden=8, seed=1)
    kw: dict[str, Any] = {"ms": ms, "cfg": cfg, "progress": lambda m: None}
    train(corpus, tmp_path / "one.npz", episodes=16, backend=FakeBackend(), **kw)
    train(corpus, tmp_path / "two.npz", episodes=8, backend=FakeBackend(), **kw)
    second = FakeBackend()
    train(corpus, tmp_path / "two.npz", episodes=8, backend=second, resume=True, **kw)
    one, _ = Policy.load(tmp_path / "one.npz")
    two, _ = Policy.load(tmp_path / "two.npz")
    for k in one.params:
        np.testing.assert_allclose(one.params[k], two.params[k])
    assert one.meta["episodes"] == two.meta["episodes"] == 16 and one.meta["joint"]
    assert all(j.retime for j in second.jobs)  # every joint pair timed at its setting
    assert (tmp_path / "two.curve.csv").exists()
    rows = [json.loads(x) for x in (tmp_path / "two.rewards.jsonl").read_text().splitlines()]
    assert rows and all("|" in r["program"] for r in rows)



def test_the_shipped_checkpoint_keeps_the_defaults(saturated: tuple[Any, Snapshot]) -> None:
    # upgraded with zero weights on the schedule columns, it scores every value of a
    # knob alike: its greedy joint rollout is its program at the default setting
    from kernelsat.extract.rl import DEFAULT_CHECKPOINT, load_policy
    from kernelsat.hardware.knobs import default_setting

    if not DEFAULT_CHECKPOINT.exists():
        pytest.skip("no shipped checkpoint")
    program, snap = saturated
    tgt = get_target("c")
    env = JointEnv(snap, out_axes=program.out_axes, target=tgt, featurize=True)
    _, _, info = rollout(env, load_policy(), None)
    table = knob_table(lower(info["term"], program.out_axes), tgt.backend, tgt)
    assert info["setting"] == default_setting(table)


def test_far_slower_runs_are_abandoned_at_a_multiple_of_eager(tmp_path: Path) -> None:
    from kernelsat.learning.rl_train import RUN_FLOOR, SLOW_LIMIT, Oracle, make_task
    from kernelsat.proofs.library import load_library

    library = load_library()
    program = parse_spec("kernel k(N=8)\nin x[n:N] f32\nout y[n] = exp(x[n]) * 2\n", "k")
    ms = replace(TRAIN_OPTIONS, iters=2, nodes=200)
    task = make_task("k", program, library, ms, joint=True)
    backend = FakeBackend()
    oracle = Oracle([task], library, backend, ms)
    oracle([(0, program.term, {})])
    eager_job = backend.jobs[0]
    assert eager_job.timing.max_run_seconds == math.inf  # the eager run is never cut
    assert eager_job.retime == "{}"
    job = oracle._job(task, program.term, {"k0": {"vec": 4}})
    assert job.timing.max_run_seconds == max(RUN_FLOOR, SLOW_LIMIT * task.eager)
    assert json.loads(job.retime) == {"k0": {"vec": 4}}


def test_joint_episodes_roll_out_alike_in_worker_processes(
        saturated: tuple[Any, Snapshot]) -> None:
    # a JointEnv (its lowered schedule spaces, the model's memo) pickles to the workers,
    # and they roll out the decisions and settings one process rolls out
    from kernelsat.learning.rl_rollouts import Rollouts

    program, snap = saturated
    env = JointEnv(snap, out_axes=program.out_axes, target=get_target("c"), featurize=True)
    policy = Policy.init(N_FEATURES, 8, seed=6)
    episodes = [(0, 40 + k) for k in range(4)]
    here = Rollouts([env])(policy, 1.0, episodes)
    with Rollouts([env], workers=2) as pool:
        rolled = pool(policy, 1.0, episodes)
    assert [i["setting"] for _, _, i in rolled] == [i["setting"] for _, _, i in here]
    assert [i["term"] for _, _, i in rolled] == [i["term"] for _, _, i in here]
    assert all(a.action == b.action and np.array_equal(a.features, b.features)
               for (da, _, _), (db, _, _) in zip(rolled, here, strict=True)
               for a, b in zip(da, db, strict=True))


class _Peaked(Policy):
    """A policy sure of one action below temperature 2 and indifferent above it."""

    def probabilities(self, x: np.ndarray, mask: np.ndarray, temperature: float = 1.0
                      ) -> np.ndarray:
        if temperature >= 2.0:
            return mask / mask.sum()
        p = np.zeros(len(mask))
        p[int(np.flatnonzero(mask)[0])] = 1.0
        return p


def test_propose_draws_past_what_accept_rejects(saturated: tuple[Any, Snapshot]) -> None:
    """`accept` sees each distinct pair once; rejected ones do not count in `k`, so the
    draw goes on (the greedy pair rejected here); with nothing accepted the stream stops
    at `max_attempts` rollouts."""
    program, snap = saturated
    ex = RLExtractor(policy=Policy.init(N_FEATURES, 8, seed=2), target="c", seed=3)
    first = ex.propose(snap, snap.root, ASTSize(), program, 6)
    seen: list[str] = []

    def every_other(p: Any) -> bool:
        seen.append(proposal_key(p.term, p.setting))
        return len(seen) % 2 == 0

    found = ex.propose(snap, snap.root, ASTSize(), program, 3, every_other)
    keys = [proposal_key(p.term, p.setting) for p in found]
    assert len(found) == 3 and len(set(seen)) == len(seen) == 6
    assert keys == seen[1::2] == [proposal_key(p.term, p.setting) for p in first[1::2]]
    assert all(p.decisions for p in found)  # each carries the rollout that made it
    rolls = 0

    def never(p: Any) -> bool:
        nonlocal rolls
        rolls += 1
        return False

    bounded = replace(ex, max_attempts=25)
    assert bounded.propose(snap, snap.root, ASTSize(), program, 3, never) == []
    assert 1 <= rolls <= 25


def test_widening_doubles_after_a_stale_run_and_stops_at_its_cap() -> None:
    heat = Widening(0.5, 3)
    for new in (True, False, False, True, False, False):
        heat.saw(new)
    assert heat.temperature == 0.5  # a new pair resets the run
    heat.saw(False)
    assert heat.temperature == 1.0
    for _ in range(100):
        heat.saw(False)
    assert heat.temperature == 0.5 * MAX_WIDEN


def test_a_peaked_policy_still_fills_its_budget(saturated: tuple[Any, Snapshot],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    program, snap = saturated
    base = Policy.init(N_FEATURES, 8, seed=2)
    peaked = _Peaked(base.params, base.meta)
    ex = RLExtractor(policy=peaked, target="c", seed=3)
    found = ex.propose(snap, snap.root, ASTSize(), program, 4)
    assert len({proposal_key(p.term, p.setting) for p in found}) == 4
    [first] = ex.propose(snap, snap.root, ASTSize(), program, 1)
    assert (found[0].term, found[0].setting) == (first.term, first.setting)
    monkeypatch.setattr("kernelsat.extract.rl.MAX_WIDEN", 1.0)  # no widening: it repeats
    assert len(ex.propose(snap, snap.root, ASTSize(), program, 4)) == 1
