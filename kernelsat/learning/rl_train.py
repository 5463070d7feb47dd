"""Training the extraction policy from measured, proof-gated rewards.

One training step rolls out a batch of episodes (each on a spec drawn from the
corpus), scores the batch's distinct new programs (prove each with the independent
checker, then time the proved ones one job at a time through the measurement
backend), and applies one REINFORCE-with-baseline update.

With `joint` (the default) an episode is a `JointEnv` one: the program, then its knob
setting, and the pair is timed ONCE at exactly that setting (`Job.retime`: no knob
search); the eager spec is timed at its default setting the same way. Without it, an
episode chooses the program only and the measurement backend's knob search (budget
`knob_budget`) times it. Rewards, from the measured seconds (`TrainConfig.reward`):

- "log-clip" (default): `log(t_eager / t)` clipped to `[-clip, clip]`;
- "rank": `1 - 2 q`, q the share of the spec's other measured pairs (the eager one
  included) faster than this one: +1 for the fastest so far, -1 for the slowest;
- `-clip` (rank: -1) with its reason recorded when the program fails to prove, to
  compile or to match the reference (`JobResult.ok` False), or when the roofline
  estimate of the lowered program is beyond `PRUNE_FACTOR` times the eager program's
  (reason "screened: ..."; not timed, as `optimize` and the evaluation do not time it:
  a recomputing program can run for minutes).

Seconds are memoized per (program, setting) and spec, so a pair is timed once.
`train` is seeded and resumable: the checkpoint holds the parameters, the optimizer
state, the episode count, the random generator's state, and the reward log.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from kernelsat.driver.jobs import LocalBackend
from kernelsat.driver.pipeline import (
    PRUNE_FACTOR,
    Options,
    job_for,
    lowered_estimate,
    prove_term,
)
from kernelsat.egraph.saturate import saturate
from kernelsat.extract.rl import proposal_key
from kernelsat.extract.rl_env import N_FEATURES, ExtractionEnv, Featurizer, upgrade_policy
from kernelsat.extract.rl_joint import JointEnv
from kernelsat.extract.rl_policy import Adam, Decision, Policy
from kernelsat.hardware.knobs import Setting
from kernelsat.hardware.measure import TIMING
from kernelsat.hardware.targets import get_target
from kernelsat.ir import Term
from kernelsat.learning.rl_rollouts import Rollouts
from kernelsat.proofs.library import load_library
from kernelsat.spec import load_spec

PENALTY = -1.0
"""Reward of a program that fails to prove, compile or match the reference under the
default `TrainConfig` (log-clip at 1.0, or rank): as bad as the worst clipped
measurement, so that failing is never preferred to being slow."""

Scorer = Callable[[Sequence[tuple[int, Term, Setting | None]], Sequence[str | None]],
                  list[float]]
"""(env index, finished program, its setting: None for a program-only episode) of one
batch, and each program's proof status when the rollout worker proved it (None: not
yet) -> their rewards."""

type Env = ExtractionEnv | JointEnv
"""A training environment: programs only, or program and schedule."""

REWARDS = ("log-clip", "rank")
"""The reward shapes `TrainConfig.reward` may name."""


@dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of training (all arguments, no environment reads)."""

    batch: int = 8
    lr: float = 0.01
    beta: float = 0.01  # entropy bonus
    value_coef: float = 0.5
    temperature: float = 1.0
    hidden: int = 32
    seed: int = 0
    reward: str = "log-clip"  # one of REWARDS
    clip: float = 1.0  # log-clip's bound: e = 2.7x either way

    def __post_init__(self) -> None:
        if self.reward not in REWARDS:
            raise ValueError(f"reward {self.reward!r}: expected one of {', '.join(REWARDS)}")
        if not self.clip > 0:
            raise ValueError(f"clip {self.clip}: expected a positive bound")

    def shape(self, seconds: float, eager: float, history: Sequence[float]) -> float:
        """The reward of a pair measured at `seconds` (inf: it failed) on a spec whose
        eager program took `eager`, `history` the spec's measured seconds (this one
        included once)."""
        if not (math.isfinite(seconds) and seconds > 0):
            return -1.0 if self.reward == "rank" else -self.clip
        if self.reward == "rank":
            others = [h for h in history if math.isfinite(h)]
            if seconds in others:
                others.remove(seconds)  # the pair itself
            if not others:
                return 0.0
            return 1.0 - 2.0 * sum(h < seconds for h in others) / len(others)
        if not (math.isfinite(eager) and eager > 0):
            return -self.clip
        return max(-self.clip, min(self.clip, math.log(eager / seconds)))


def update(policy: Policy, adam: Adam, batch: Sequence[tuple[Sequence[Decision], float]],
           cfg: TrainConfig) -> None:
    """One REINFORCE-with-baseline step on a batch of finished episodes."""
    adam.step(policy.params, policy.gradients(batch, cfg.beta, cfg.value_coef))


def train_envs(envs: Sequence[Env], policy: Policy, adam: Adam, cfg: TrainConfig,
               episodes: int, *, rng: np.random.Generator | None = None,
               score: Scorer | None = None,
               on_batch: Callable[[int, list[float], list[dict[str, Any]]], None] | None = None,
               start: int = 0, rollouts: Rollouts | None = None) -> list[float]:
    """Train on `envs` for `episodes` episodes (counting from `start`); returns the
    reward of each episode. Without `score`, rewards are the envs' own `reward_fn`.
    `rollouts` rolls a batch out (in parallel workers); default: here, one by one."""
    rng = rng if rng is not None else np.random.default_rng(cfg.seed)
    roll = rollouts if rollouts is not None else Rollouts(envs)
    rewards: list[float] = []
    done = start
    while done < start + episodes:
        n = min(cfg.batch, start + episodes - done)
        picks = [int(rng.integers(len(envs))) for _ in range(n)]
        seeds = [int(s) for s in rng.integers(0, 2**63 - 1, size=n)]
        rolled = roll(policy, cfg.temperature, list(zip(picks, seeds, strict=True)))
        if score is None:
            batch_rewards = [r for _, r, _ in rolled]
        else:
            batch_rewards = score([(i, info["term"], info.get("setting")) for i, (_, _, info)
                                   in zip(picks, rolled, strict=True)],
                                  [info.get("proof") for _, _, info in rolled])
        update(policy, adam, [(d, r) for (d, _, _), r in zip(rolled, batch_rewards,
                                                              strict=True)], cfg)
        rewards.extend(batch_rewards)
        done += n
        if on_batch is not None:
            on_batch(done, batch_rewards, [dict(info, env=i) for i, (_, _, info) in
                                           zip(picks, rolled, strict=True)])
    return rewards


# -- measured rewards -------------------------------------------------------------------


@dataclass
class Outcome:
    """The measured outcome of one (program, setting) pair: its reward under the
    configuration it was first scored with (the log keeps it), how it was obtained,
    and its seconds (what the reward is recomputed from)."""

    reward: float
    reason: str  # "measured", "proof: ...", "measure: ..."
    seconds: float = math.inf


@dataclass
class Task:
    """One training spec: its program, saturated e-graph, environment and reward log."""

    name: str
    program: Any  # kernelsat.program.Program
    saturation: Any
    env: Env
    eager: float = math.inf
    outcomes: dict[str, Outcome] = field(default_factory=dict)  # by `proposal_key`

    @property
    def joint(self) -> bool:
        return isinstance(self.env, JointEnv)

    @property
    def history(self) -> list[float]:
        """Seconds of every pair measured on this spec (the eager one included)."""
        return [o.seconds for o in self.outcomes.values() if o.reason == "measured"]

    @property
    def best_speedup(self) -> float:
        times = [o.seconds for o in self.outcomes.values() if o.reason == "measured"]
        return self.eager / min(times) if times and self.eager < math.inf else math.nan


TRAIN_OPTIONS = Options(knob_budget=1, iters=6, nodes=1500, sat_seconds=4.0, factors=(8, 16),
                        timing=TIMING["train"])
"""How training saturates and measures: the optimize pipeline's settings record with the
trainer's own values (one knob setting, small e-graphs, quick timings of many programs)."""


def settings_record(ms: Options) -> dict[str, Any]:
    """The settings a policy's or an evaluation's numbers depend on, as plain data (kept
    in the checkpoint, and what an evaluation log must match)."""
    return {"target": get_target(ms.target).name, "knob_budget": ms.knob_budget,
            "iters": ms.iters, "nodes": ms.nodes, "sat_seconds": ms.sat_seconds,
            "factors": list(ms.factors), "timing": asdict(ms.timing)}


def make_task(name: str, program: Any, library: Any, ms: Options, joint: bool = False) -> Task:
    """Saturate a spec and build its environment (featurized for `ms.target`): a
    `JointEnv` over program and schedule with `joint`, else programs only."""
    sat = saturate(program.term, library.rules, iters=ms.iters, nodes=ms.nodes,
                   seconds=ms.sat_seconds, factors=ms.factors)
    snap = sat.snapshot
    target = get_target(ms.target)
    env: Env = (JointEnv(snap, out_axes=program.out_axes, target=target, featurize=True)
                if joint else ExtractionEnv(snap, featurize=Featurizer.of(snap, snap.root,
                                                                          target)))
    return Task(name, program, sat, env)


@dataclass
class Prover:
    """Proof statuses of finished programs, memoized: the rollout workers' post hook
    (so it holds only what pickles: programs, snapshots, the rule library)."""

    programs: list[Any]
    snapshots: list[Any]
    library: Any
    memo: dict[tuple[int, str], str] = field(default_factory=dict)

    @staticmethod
    def of(tasks: Sequence[Task], library: Any) -> Prover:
        return Prover([t.program for t in tasks], [t.saturation.snapshot for t in tasks],
                      library)

    def status(self, i: int, term: Term) -> str:
        """"accepted", "eager" or why `term` may not ship (task `i`)."""
        if (i, term.key) not in self.memo:
            self.memo[(i, term.key)] = prove_term(self.programs[i], self.snapshots[i],
                                                  self.library, term)[2]
        return self.memo[(i, term.key)]

    def __call__(self, i: int, term: Term) -> dict[str, Any]:
        return {"proof": self.status(i, term)}


SLOW_LIMIT = 8.0
"""A run taking this many times the spec's eager time is abandoned (the program fails
with the worst reward): on millisecond kernels a random program or schedule can be
10^3 times slower (recomputed reductions, a serial order), and timing it would cost
minutes for a reward that is clipped anyway (log-clip's floor is e times slower)."""

RUN_FLOOR = 0.05
"""Seconds under which no run is abandoned (a limit that short would cut timer noise)."""

Item = tuple[int, Term] | tuple[int, Term, Setting | None]
"""What the oracle scores: (task index, program[, setting]); no setting (or None) on a
program-only task."""


@dataclass
class Oracle:
    """Proof-gated measured rewards for a list of tasks, one job at a time. A joint
    task's pair is timed once at its setting (`Job.retime`); a program-only task's
    program through the backend's knob search."""

    tasks: list[Task]
    library: Any
    backend: Any
    ms: Options
    cfg: TrainConfig = field(default_factory=TrainConfig)
    measurements: int = 0  # jobs sent to the backend
    timed: int = 0  # knob settings actually timed (not cache hits)
    screened: int = 0  # pairs not timed: estimated beyond PRUNE_FACTOR x eager
    prover: Prover = field(init=False)
    _estimates: dict[tuple[int, str], float] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.prover = Prover.of(self.tasks, self.library)

    def estimate(self, i: int, term: Term) -> float:
        """The roofline estimate of task `i`'s program `term`, lowered (memoized)."""
        key = (i, term.key)
        if key not in self._estimates:
            program = self.tasks[i].program
            self._estimates[key] = lowered_estimate(term, program, get_target(self.ms.target))
        return self._estimates[key]

    def screen(self, i: int, term: Term) -> str:
        """Why task `i`'s `term` is not timed ("" when it is): its estimate beyond
        `PRUNE_FACTOR` times the eager program's, as in optimize."""
        eager = self.estimate(i, self.tasks[i].program.term)
        mine = self.estimate(i, term)
        if mine > PRUNE_FACTOR * eager:
            return (f"screened: estimate {mine / eager:.3g}x the eager program's "
                    f"(limit {PRUNE_FACTOR:g}x)")
        return ""

    def _job(self, task: Task, term: Term, setting: Setting | None) -> Any:
        job = job_for(task.program, term, self.ms)
        if math.isfinite(task.eager) and task.eager > 0:  # abandon far slower runs
            limit = min(max(RUN_FLOOR, SLOW_LIMIT * task.eager), job.timing.max_run_seconds)
            job = replace(job, timing=replace(job.timing, max_run_seconds=limit))
        if task.joint:  # one timing at exactly this setting (None: the defaults)
            job = replace(job, retime=json.dumps(setting or {}, sort_keys=True, default=list))
        return job

    def _measure(self, items: list[tuple[Task, Term, Setting | None]]) -> list[Any]:
        if not items:
            return []
        jobs = [self._job(t, term, setting) for t, term, setting in items]
        results = list(self.backend.run(jobs))
        self.measurements += len(jobs)
        self.timed += sum(int(getattr(r, "measured", 0)) for r in results)
        return results

    def ensure_eager(self) -> None:
        todo = [t for t in self.tasks if t.eager == math.inf
                and proposal_key(t.program.term, None) not in t.outcomes]
        for t, r in zip(todo, self._measure([(t, t.program.term, None) for t in todo]),
                        strict=True):
            t.eager = r.median if r.ok else math.inf
            t.outcomes[proposal_key(t.program.term, None)] = Outcome(
                0.0, "measured" if r.ok else f"measure: {r.error[:200]}", r.median)

    def reward(self, task: Task, outcome: Outcome) -> float:
        """The configured reward of a pair's outcome (rank rewards move with the
        spec's history, so they are recomputed each time)."""
        seconds = outcome.seconds if outcome.reason == "measured" else math.inf
        return self.cfg.shape(seconds, task.eager, task.history)

    def __call__(self, items: Sequence[Item], proofs: Sequence[str | None] | None = None
                 ) -> list[float]:
        self.ensure_eager()
        proofs = proofs if proofs is not None else [None] * len(items)
        full = [(it[0], it[1], it[2] if len(it) > 2 else None) for it in items]
        pending: dict[tuple[int, str], tuple[Term, Setting | None]] = {}
        for (i, term, setting), status in zip(full, proofs, strict=True):
            task = self.tasks[i]
            key = proposal_key(term, setting)
            if key in task.outcomes or (i, key) in pending:
                continue
            status = status if status is not None else self.prover.status(i, term)
            screened = self.screen(i, term) if status in ("accepted", "eager") else ""
            if status not in ("accepted", "eager"):
                task.outcomes[key] = Outcome(-self.cfg.clip, f"proof: {status[:200]}")
            elif screened:
                self.screened += 1
                task.outcomes[key] = Outcome(-self.cfg.clip, screened)
            else:
                pending[(i, key)] = (term, setting)
        keys = list(pending)
        results = self._measure([(self.tasks[i], *pending[(i, k)]) for i, k in keys])
        for (i, k), r in zip(keys, results, strict=True):
            task = self.tasks[i]
            if r.ok and r.median > 0:
                task.outcomes[k] = Outcome(0.0, "measured", r.median)
            else:
                task.outcomes[k] = Outcome(-self.cfg.clip, f"measure: {r.error[:200]}")
            task.outcomes[k].reward = self.reward(task, task.outcomes[k])
        return [self.reward(self.tasks[i], self.tasks[i].outcomes[proposal_key(t, st)])
                for i, t, st in full]

    def log_rows(self) -> list[dict[str, Any]]:
        return [{"spec": t.name, "program": k, **asdict(o)}
                for t in self.tasks for k, o in t.outcomes.items()]

    def restore(self, rows: Sequence[dict[str, Any]]) -> None:
        by_name = {t.name: t for t in self.tasks}
        for row in rows:
            task = by_name.get(row["spec"])
            if task is not None:
                key = str(row["program"])
                key = key if "|" in key else f"{key}|{{}}"  # a program-only log's key
                task.outcomes[key] = Outcome(row["reward"], row["reason"],
                                             float(row["seconds"]))
                if (key == proposal_key(task.program.term, None)
                        and row["reason"] == "measured"):
                    task.eager = float(row["seconds"])


def eager_timer(ms: Options, backend: Any) -> Callable[[Any], float]:
    """Seconds of a program's eager term timed once at its default knobs through
    `backend` (inf when it fails): how `corpus --calibrate` checks its sizes."""

    def measure(program: Any) -> float:
        job = replace(job_for(program, program.term, ms), retime="{}")
        (r,) = backend.run([job])
        return float(r.median) if r.ok else math.inf

    return measure


# -- the train command's loop -------------------------------------------------------------


def load_corpus(corpus: Path, library: Any, ms: Options,
                progress: Callable[[str], None], joint: bool = False) -> list[Task]:
    """Every `.ks` spec under `corpus`, saturated (specs that fail are skipped, said why)."""
    tasks = []
    for path in sorted(Path(corpus).glob("*.ks")):
        try:
            tasks.append(make_task(path.stem, load_spec(path), library, ms, joint))
        except Exception as e:
            progress(f"skip {path.name}: {type(e).__name__}: {str(e)[:120]}")
    return tasks


def _write_curve(rows: list[dict[str, float]], out: Path) -> None:
    """The training curve as CSV and PNG beside the checkpoint."""
    csv_path = out.with_suffix(".curve.csv")
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["episode"])
        w.writeheader()
        w.writerows(rows)
    if not rows:
        return
    import matplotlib  # slow to import (~0.5 s), and only for the plot

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after use("Agg"): no display needed

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ep = [r["episode"] for r in rows]
    ax.plot(ep, [r["batch_mean_reward"] for r in rows], alpha=0.4, label="batch mean reward")
    ax.plot(ep, [r["running_mean_reward"] for r in rows], label="running mean reward")
    ax.set_xlabel("episode")
    ax.set_ylabel("reward")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".curve.png"), dpi=100)
    plt.close(fig)


def train(corpus: Path, out: Path, *, episodes: int, ms: Options,
          cfg: TrainConfig, backend: Any = None, resume: bool = False,
          cache_dir: Path | None = None, max_seconds: float = math.inf,
          workers: int = 1, joint: bool = True,
          progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Train (or resume) a policy on the specs in `corpus`; save it to `out`. `workers`
    processes roll out and prove each batch (the measurements stay one at a time).
    `joint`: episodes choose the program and its knob setting (`JointEnv`)."""
    library = load_library()
    backend = backend if backend is not None else LocalBackend(cache_dir)
    started = time.monotonic()
    ms = replace(ms, target=get_target(ms.target))  # resolved once for the whole run
    tasks = load_corpus(corpus, library, ms, progress, joint)
    if not tasks:
        raise ValueError(f"no usable spec in {corpus}")
    progress(f"corpus: {len(tasks)} specs, "
             f"{sum(t.saturation.snapshot.n_nodes for t in tasks)} e-nodes in all, "
             f"saturated in {time.monotonic() - started:.1f}s")
    oracle = Oracle(tasks, library, backend, ms, cfg)
    policy, adam = Policy.init(N_FEATURES, cfg.hidden, cfg.seed), Adam(cfg.lr)
    rng = np.random.default_rng(cfg.seed)
    start, curve = 0, []
    log_path = out.with_suffix(".rewards.jsonl")
    if resume and out.exists():
        policy, extra = Policy.load(out)
        policy = upgrade_policy(policy, extra)  # a first-layout checkpoint
        adam.restore(extra)
        start = int(policy.meta.get("episodes", 0))
        rng.bit_generator.state = json.loads(policy.meta["rng"])
        curve = policy.meta.get("curve", [])
        if log_path.exists():
            oracle.restore([json.loads(x) for x in log_path.read_text().splitlines() if x])
        progress(f"resumed from {out} at episode {start}")
    running = curve[-1]["running_mean_reward"] if curve else 0.0

    def on_batch(done: int, rewards: list[float], infos: list[dict[str, Any]]) -> None:
        nonlocal running
        mean = float(np.mean(rewards))
        running = mean if not curve else 0.9 * running + 0.1 * mean
        best = sorted(((t.best_speedup, t.name) for t in tasks if not math.isnan(t.best_speedup)),
                      reverse=True)[:3]
        curve.append({"episode": done, "batch_mean_reward": mean,
                      "running_mean_reward": running, "measurements": oracle.measurements,
                      "seconds": round(time.monotonic() - started, 1)})
        progress(f"episode {done}: mean reward {mean:+.3f} (running {running:+.3f}), "
                 f"measurements {oracle.measurements} (timed {oracle.timed}), best "
                 + ", ".join(f"{n} {s:.2f}x" for s, n in best))

    # train in chunks so that a long run checkpoints as it goes and respects max_seconds
    chunk = max(cfg.batch * 4, 1)
    done = start
    with Rollouts([t.env for t in tasks], oracle.prover, workers) as rollouts:
        if workers > 1:
            progress(f"rollouts and proofs in {rollouts.workers} worker processes; "
                     "measurements one at a time")
        while done < start + episodes and time.monotonic() - started < max_seconds:
            n = min(chunk, start + episodes - done)
            train_envs([t.env for t in tasks], policy, adam, cfg, n, rng=rng, score=oracle,
                       on_batch=on_batch, start=done, rollouts=rollouts)
            done += n
            _save(policy, adam, out, done, rng, curve, tasks, cfg, ms, corpus, started,
                  oracle, log_path)
    _write_curve(curve, out)
    return {"episodes": done, "measurements": oracle.measurements,
            "seconds": time.monotonic() - started, "checkpoint": str(out)}


def _save(policy: Policy, adam: Adam, out: Path, done: int, rng: np.random.Generator,
          curve: list[dict[str, float]], tasks: list[Task], cfg: TrainConfig,
          ms: Options, corpus: Path, started: float, oracle: Oracle,
          log_path: Path) -> None:
    prior = float(policy.meta.get("train_seconds", 0.0)) if "train_seconds" in policy.meta else 0.0
    policy.meta.update({
        "episodes": done, "rng": json.dumps(rng.bit_generator.state), "curve": curve,
        "config": asdict(cfg), "measure": settings_record(ms), "corpus": str(corpus),
        "joint": all(t.joint for t in tasks),
        "specs": [t.name for t in tasks], "measurements": oracle.measurements,
        "train_seconds": round(max(prior, time.monotonic() - started), 1),
        "best_speedups": {t.name: t.best_speedup for t in tasks},
    })
    policy.save(out, adam.state())
    with open(log_path, "w") as f:
        for row in oracle.log_rows():
            f.write(json.dumps(row, default=str) + "\n")
