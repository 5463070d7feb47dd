"""Rolling out a training batch in parallel worker processes.

A batch is rolled out before any of it is timed. Rolling out the policy and proving the
finished programs (explanation, then the independent checker) time nothing, so they
run in parallel on every core; the batch's measurements then run one job at a time
while the workers wait (two timings at once on two cores corrupt each other).

Every episode has its own seed, drawn by the trainer, so the batch N workers roll out is
the batch one process rolls out: training is reproducible whatever the number of
workers (`tests/test_rl_rollouts.py`). Workers start once (from a clean `forkserver`
process, not a fork of the multi-threaded trainer) and receive the environments and the
post hook, pickled, once; each batch sends them only the policy's parameters and the
(environment, seed) pairs.

>>> Rollouts([], workers=1).workers
1
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kernelsat.extract.rl_env import ExtractionEnv
from kernelsat.extract.rl_policy import Decision, Policy, rollout
from kernelsat.hardware.cpu import detect_cpu
from kernelsat.ir import Term

Episode = tuple[list[Decision], float, dict[str, Any]]
"""One finished episode: its decisions, the environment's terminal reward, its info."""

Post = Callable[[int, Term], dict[str, Any]]
"""(environment index, finished program) -> more info for the episode (computed where the
episode was rolled out, e.g. the program's proof status)."""

_WORKER: dict[str, Any] = {}
"""A worker process's environments and post hook (set once by `_start`)."""


def roll(envs: Sequence[Any], post: Post | None, params: dict[str, np.ndarray],
         temperature: float, episodes: Sequence[tuple[int, int]]) -> list[Episode]:
    """Roll out `(environment index, seed)` episodes under the policy `params`."""
    policy = Policy(params)
    out = []
    for i, seed in episodes:
        decisions, reward, info = rollout(envs[i], policy, np.random.default_rng(seed),
                                          temperature)
        if post is not None:
            info = {**info, **post(i, info["term"])}
        out.append((decisions, reward, info))
    return out


def _start(envs: Sequence[ExtractionEnv], post: Post | None) -> None:
    _WORKER.update(envs=envs, post=post)


def _work(params: dict[str, np.ndarray], temperature: float,
          episodes: list[tuple[int, int]]) -> list[Episode]:
    return roll(_WORKER["envs"], _WORKER["post"], params, temperature, episodes)


def default_workers() -> int:
    """One rollout worker per core this process may use."""
    return max(1, detect_cpu().cores)


class Rollouts:
    """Rolls out batches of episodes on `envs`, in `workers` processes (1: here). The
    environments and `post` must pickle when `workers` > 1.

    Use as a context manager (or call `close`) so the workers exit."""

    def __init__(self, envs: Sequence[Any], post: Post | None = None,
                 workers: int = 1) -> None:
        self.envs, self.post = envs, post
        self.workers = max(1, workers)
        self._pool: Any = None
        if self.workers > 1:
            methods = multiprocessing.get_all_start_methods()
            ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods
                                              else "spawn")
            self._pool = ctx.Pool(self.workers, initializer=_start, initargs=(envs, post))

    def __call__(self, policy: Policy, temperature: float,
                 episodes: Sequence[tuple[int, int]]) -> list[Episode]:
        """The finished episodes, in the order of `episodes`."""
        if self._pool is None or len(episodes) < 2:
            return roll(self.envs, self.post, policy.params, temperature, episodes)
        size = -(-len(episodes) // self.workers)
        chunks = [list(episodes[k:k + size]) for k in range(0, len(episodes), size)]
        parts = self._pool.starmap(_work, [(policy.params, temperature, c) for c in chunks])
        return [e for part in parts for e in part]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __enter__(self) -> Rollouts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
