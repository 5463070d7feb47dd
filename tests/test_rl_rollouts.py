"""Parallel rollouts: N worker processes roll out (and prove) the batch one process
would, so training is the same whatever the number of workers."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kernelsat.extract.rl_env import N_FEATURES
from kernelsat.extract.rl_policy import Adam, Policy
from kernelsat.learning.rl_rollouts import Rollouts
from kernelsat.learning.rl_train import TrainConfig, train_envs
from tests.test_rl_extractor import CountingBackend
from tests.test_rl_policy import synthetic_envs


def _train(workers: int) -> tuple[list[float], dict[str, np.ndarray]]:
    envs = synthetic_envs()
    policy = Policy.init(N_FEATURES, hidden=8, seed=2)
    cfg = TrainConfig(batch=6, lr=0.02, seed=5)
    with Rollouts(envs, workers=workers) as rollouts:
        rewards = train_envs(envs, policy, Adam(cfg.lr), cfg, episodes=30, rollouts=rollouts)
    return rewards, policy.params


def test_parallel_rollouts_train_exactly_as_one_process_does() -> None:
    serial, p1 = _train(1)
    parallel, p2 = _train(2)
    assert parallel == serial
    assert all(np.array_equal(p1[k], p2[k]) for k in p1)


def where(i: int, term: object) -> dict[str, int]:
    """A post hook that says where it ran (module level: it pickles)."""
    return {"pid": os.getpid(), "env": i}


def test_workers_run_the_post_hook_in_other_processes() -> None:
    envs = synthetic_envs()
    policy = Policy.init(N_FEATURES, hidden=8, seed=0)

    episodes = [(k % len(envs), 100 + k) for k in range(6)]
    with Rollouts(envs, where, workers=2) as pool:
        rolled = pool(policy, 1.0, episodes)
    here = Rollouts(envs, where)(policy, 1.0, episodes)
    assert [info["env"] for _, _, info in rolled] == [i for i, _ in episodes]
    assert {info["pid"] for _, _, info in rolled} - {os.getpid()}  # not all here
    # same programs and decisions as rolled out here
    assert [info["term"] for _, _, info in rolled] == [info["term"] for _, _, info in here]
    assert all(a.action == b.action and np.array_equal(a.features, b.features)
               for (da, _, _), (db, _, _) in zip(rolled, here, strict=True)
               for a, b in zip(da, db, strict=True))


@pytest.mark.slow
def test_train_with_two_workers_matches_one(tmp_path: Path) -> None:
    """The train command's loop with proofs in the workers: same rewards, parameters and
    reward log as in one process; the backend sees each distinct program once."""
    from kernelsat.learning import rl_train
    from kernelsat.learning.corpus import write_corpus

    write_corpus(tmp_path / "corpus", 3, seed=4)
    ms = replace(rl_train.TRAIN_OPTIONS, iters=3, nodes=400, sat_seconds=120.0)
    runs = {}
    for workers in (1, 2):
        backend = CountingBackend()
        out = tmp_path / f"w{workers}" / "p.npz"
        out.parent.mkdir()
        rl_train.train(tmp_path / "corpus", out, episodes=16, ms=ms,
                       cfg=rl_train.TrainConfig(batch=4, hidden=8, seed=1), backend=backend,
                       workers=workers, progress=lambda _: None)
        policy, _ = Policy.load(out)
        runs[workers] = (backend.retimed, policy.params,
                         out.with_suffix(".rewards.jsonl").read_text())
        assert backend.retimed and not backend.jobs  # joint: each pair timed at its setting
    assert runs[1][0] == runs[2][0] and runs[1][2] == runs[2][2]
    assert all(np.array_equal(runs[1][1][k], runs[2][1][k]) for k in runs[1][1])
