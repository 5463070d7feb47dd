"""The RL policy: exact gradients, learning where the cost model is wrong, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.egraph.snapshot import ENode, Snapshot
from kernelsat.extract.rl_env import N_FEATURES, ExtractionEnv, Featurizer
from kernelsat.extract.rl_policy import Adam, Decision, Policy, rollout
from kernelsat.ir import In, Term, postorder
from kernelsat.learning.rl_train import TrainConfig, train_envs
from kernelsat.ops import Op


def _episodes(rng: np.random.Generator, f: int) -> list[tuple[list[Decision], float]]:
    out = []
    for _ in range(3):
        decisions = []
        for _ in range(int(rng.integers(1, 4))):
            k = int(rng.integers(1, 5))
            mask = rng.random(k) < 0.7
            mask[int(rng.integers(k))] = True
            action = int(rng.choice(np.flatnonzero(mask)))
            decisions.append(Decision(rng.normal(size=(k, f)), mask, action))
        out.append((decisions, float(rng.normal())))
    return out


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**16))
def test_gradients_match_finite_differences(seed: int) -> None:
    rng = np.random.default_rng(seed)
    policy = Policy.init(n_features=5, hidden=4, seed=seed)
    policy.params["u"] = rng.normal(size=10) * 0.3
    policy.params["c"] = rng.normal(size=1)
    episodes = _episodes(rng, 5)
    beta, coef = 0.05, 0.5
    grads = policy.gradients(episodes, beta, coef)

    # the advantage is held constant in the policy term: freeze the baseline there
    def loss() -> float:
        frozen = Policy({k: v.copy() for k, v in policy.params.items()})
        total = 0.0
        for decisions, reward in episodes:
            t = len(decisions)
            for d in decisions:
                adv = reward - base.value(d.features, d.mask)
                z, _ = frozen.scores(d.features)
                from kernelsat.extract.rl_policy import masked_softmax

                p = masked_softmax(z, d.mask)
                logp = np.log(np.where(d.mask, p, 1.0))
                ent = -float(np.sum(np.where(d.mask, p * logp, 0.0)))
                v = frozen.value(d.features, d.mask)
                total += (-adv * logp[d.action] - beta * ent + coef * (v - reward) ** 2) / t
        return total / len(episodes)

    base = Policy({k: v.copy() for k, v in policy.params.items()})
    assert abs(loss() - policy.loss(episodes, beta, coef)) < 1e-12
    eps = 1e-6
    for name, value in policy.params.items():
        for idx in np.ndindex(value.shape):
            old = value[idx]
            value[idx] = old + eps
            up = loss()
            value[idx] = old - eps
            down = loss()
            value[idx] = old
            numeric = (up - down) / (2 * eps)
            assert grads[name][idx] == pytest.approx(numeric, rel=1e-4, abs=1e-6), (name, idx)


# -- a synthetic family where the analytic cost model is deliberately wrong ------------


def chain_snapshot(length: int, size: int) -> Snapshot:
    """A chain of `length` classes over one input; each class holds a cheap `neg` and a
    dear `exp` of the class below (both shape-correct). The roofline model prefers
    `neg` everywhere; the synthetic reward below prefers `exp`."""
    x = In("x", (("i", size),))
    nodes = [ENode(Op.IN, x.attrs, ())]
    owner = [0]
    for c in range(1, length + 1):
        for op in (Op.NEG, Op.EXP):
            nodes.append(ENode(op, (), (c - 1,)))
            owner.append(c)
    classes = [[n for n in range(len(nodes)) if owner[n] == c] for c in range(length + 1)]
    return Snapshot(nodes, np.array(owner), classes, [{"i": size}] * (length + 1), length)


def true_reward(term: Term) -> tuple[float, str]:
    """The known reward: the fraction of `exp` choices (what 'measurement' says)."""
    ops = [n.op for n in postorder(term)]
    n = sum(op in (Op.NEG, Op.EXP) for op in ops)
    return sum(op is Op.EXP for op in ops) / max(n, 1), "synthetic"


def synthetic_envs() -> list[ExtractionEnv]:
    from kernelsat.hardware.targets import get_target

    target = get_target("h100")  # fixed figures: the test does not depend on this CPU
    envs = []
    for length, size in ((3, 64), (4, 1024), (5, 256), (6, 4096)):
        snap = chain_snapshot(length, size)
        envs.append(ExtractionEnv(snap, reward_fn=true_reward,
                                  featurize=Featurizer.of(snap, snap.root, target)))
    return envs


def test_the_cost_model_prefers_the_wrong_node() -> None:
    from kernelsat.extract import GreedyTree, roofline_rescore
    from kernelsat.hardware.targets import get_target

    snap = chain_snapshot(4, 1024)
    best = GreedyTree().extract(snap, snap.root, roofline_rescore(get_target("h100")))[0]
    assert true_reward(best.term)[0] == 0.0


def test_training_improves_mean_reward_where_the_cost_model_is_wrong() -> None:
    envs = synthetic_envs()
    policy = Policy.init(N_FEATURES, hidden=16, seed=0)
    cfg = TrainConfig(batch=8, lr=0.02, beta=0.01, seed=0)
    rewards = train_envs(envs, policy, Adam(cfg.lr), cfg, episodes=240)
    first, last = np.mean(rewards[:40]), np.mean(rewards[-40:])
    assert first < 0.7 and last > first + 0.25 and last > 0.85, (first, last)
    # deterministic: the same seed gives the same curve
    again = train_envs(synthetic_envs(), Policy.init(N_FEATURES, hidden=16, seed=0),
                       Adam(cfg.lr), cfg, episodes=240)
    assert again == rewards


def test_checkpoint_round_trip_gives_identical_probabilities(tmp_path) -> None:
    env = synthetic_envs()[1]
    policy = Policy.init(N_FEATURES, hidden=8, seed=3)
    adam = Adam(0.05)
    cfg = TrainConfig(batch=4, seed=1)
    train_envs([env], policy, adam, cfg, episodes=8)
    path = tmp_path / "p.npz"
    policy.save(path, adam.state())
    loaded, extra = Policy.load(path)
    other = Adam(0.05)
    other.restore(extra)
    assert other.t == adam.t
    obs, _ = env.reset()
    while True:
        a = policy.probabilities(obs["features"], obs["mask"])
        b = loaded.probabilities(obs["features"], obs["mask"])
        assert np.array_equal(a, b)
        obs, _, done, _, _ = env.step(int(np.argmax(a)))
        if done:
            break
    d1, r1, _ = rollout(env, policy, np.random.default_rng(5))
    d2, r2, _ = rollout(env, loaded, np.random.default_rng(5))
    assert [d.action for d in d1] == [d.action for d in d2] and r1 == r2
