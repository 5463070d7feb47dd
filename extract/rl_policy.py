"""The extraction policy: a small numpy MLP that scores the candidates of one class,
a linear value baseline, and REINFORCE with that baseline and an entropy bonus.

- scores: `z_i = w2 . tanh(W1^T x_i + b1)` for each candidate row `x_i` (the features
  of `kernelsat.extract.rl_env`); the policy is the softmax of the scores over the
  legal candidates (the mask is exact, so illegal ones get probability 0).
- value: `V(s) = u . [mean_i x_i, max_i x_i] + c` over the legal candidates of the
  step: a per-decision baseline, so each decision of an episode is credited with
  `R - V(s_t)`, the episode's terminal reward minus what was expected at that point.
- loss of one episode of T decisions (minimized):
  `(1/T) sum_t [ -(R - V_t) log pi(a_t|s_t) - beta H(pi(.|s_t)) + c_v (V_t - R)^2 ]`
  with `R - V_t` held constant in the first term. `gradients` is exact; the tests
  compare it with finite differences.

>>> p = Policy.init(n_features=4, hidden=3, seed=0)
>>> x = np.ones((2, 4)); mask = np.array([True, True])
>>> probs = p.probabilities(x, mask)
>>> probs.shape, round(float(probs.sum()), 6)
((2,), 1.0)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

PARAMS = ("W1", "b1", "w2", "u", "c")
"""The parameter arrays of a policy, in a fixed order."""

FORMAT = "kernelsat-rl-policy/1"

TIE = 1e-9
"""Relative gap under which two probabilities count as tied for the greedy choice."""


@dataclass(frozen=True)
class Decision:
    """One recorded decision: the candidates' features, the mask, the action taken."""

    features: np.ndarray  # (k, F)
    mask: np.ndarray  # (k,) bool
    action: int


@dataclass
class Policy:
    """Parameters of the scorer and the value baseline, plus metadata for checkpoints."""

    params: dict[str, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def init(n_features: int, hidden: int = 32, seed: int = 0) -> Policy:
        rng = np.random.default_rng(seed)
        params = {
            "W1": rng.normal(0.0, 1.0 / np.sqrt(n_features), (n_features, hidden)),
            "b1": np.zeros(hidden),
            "w2": rng.normal(0.0, 0.1, hidden),
            "u": np.zeros(2 * n_features),
            "c": np.zeros(1),
        }
        return Policy(params, {"n_features": n_features, "hidden": hidden, "seed": seed})

    @property
    def n_features(self) -> int:
        return int(self.params["W1"].shape[0])

    # forward
    def scores(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(scores z, hidden activations h) of candidate rows `x`."""
        h = np.tanh(x @ self.params["W1"] + self.params["b1"])
        return h @ self.params["w2"], h

    def probabilities(self, x: np.ndarray, mask: np.ndarray, temperature: float = 1.0
                      ) -> np.ndarray:
        z, _ = self.scores(x)
        return masked_softmax(z / max(temperature, 1e-6), mask)

    def value(self, x: np.ndarray, mask: np.ndarray) -> float:
        return float(state_vector(x, mask) @ self.params["u"] + self.params["c"][0])

    def act(self, x: np.ndarray, mask: np.ndarray, rng: np.random.Generator | None,
            temperature: float = 1.0, prefer_first: bool = False) -> int:
        """Sample an action (`rng` given) or take the most probable one (`rng` None).
        With `prefer_first`, of candidates tied to within `TIE`, the first (equal
        scores can come out a last bit apart: the matrix product rounds rows
        differently); without it numpy's argmax, as the shipped checkpoint's greedy
        decisions were recorded."""
        p = self.probabilities(x, mask, temperature)
        if rng is None:
            legal = np.where(mask, p, -1.0)
            if prefer_first:
                return int(np.flatnonzero(legal >= legal.max() * (1.0 - TIE))[0])
            return int(np.argmax(legal))
        return int(rng.choice(len(p), p=p))

    # learning
    def loss(self, episodes: Sequence[tuple[Sequence[Decision], float]], beta: float,
             value_coef: float) -> float:
        """The batch loss (mean over episodes of the per-episode loss above)."""
        total = 0.0
        for decisions, reward in episodes:
            t = max(len(decisions), 1)
            for d in decisions:
                z, _ = self.scores(d.features)
                p = masked_softmax(z, d.mask)
                logp = np.log(np.where(d.mask, p, 1.0))
                v = self.value(d.features, d.mask)
                adv = reward - v
                entropy = -float(np.sum(np.where(d.mask, p * logp, 0.0)))
                total += (-adv * logp[d.action] - beta * entropy
                          + value_coef * (v - reward) ** 2) / t
        return total / max(len(episodes), 1)

    def gradients(self, episodes: Sequence[tuple[Sequence[Decision], float]], beta: float,
                  value_coef: float) -> dict[str, np.ndarray]:
        """Exact gradients of `loss` with the advantage held constant."""
        g = {k: np.zeros_like(v) for k, v in self.params.items()}
        n = max(len(episodes), 1)
        for decisions, reward in episodes:
            t = max(len(decisions), 1) * n
            for d in decisions:
                z, h = self.scores(d.features)
                p = masked_softmax(z, d.mask)
                logp = np.log(np.where(d.mask, p, 1.0))
                s = state_vector(d.features, d.mask)
                v = float(s @ self.params["u"] + self.params["c"][0])
                adv = reward - v
                entropy = -float(np.sum(np.where(d.mask, p * logp, 0.0)))
                onehot = np.zeros_like(p)
                onehot[d.action] = 1.0
                dz = -adv * (onehot - p) + beta * p * (logp + entropy)
                dz = np.where(d.mask, dz, 0.0) / t
                g["w2"] += h.T @ dz
                dpre = np.outer(dz, self.params["w2"]) * (1.0 - h * h)
                g["W1"] += d.features.T @ dpre
                g["b1"] += dpre.sum(axis=0)
                dv = 2.0 * value_coef * (v - reward) / t
                g["u"] += dv * s
                g["c"] += dv
        return g

    # checkpoints
    def save(self, path: str | Path, extra: dict[str, np.ndarray] | None = None) -> None:
        """Write `path` (.npz: parameters and `extra` arrays) and `path`.json (metadata)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {k: self.params[k] for k in PARAMS}
        arrays.update({f"extra_{k}": v for k, v in (extra or {}).items()})
        with open(path, "wb") as f:
            # numpy's stubs match `**arrays` against `allow_pickle: bool` too
            np.savez(f, **cast(dict[str, Any], arrays))
        meta = dict(self.meta, format=FORMAT)
        Path(str(path) + ".json").write_text(json.dumps(meta, indent=1, sort_keys=True,
                                                        default=str))

    @staticmethod
    def load(path: str | Path) -> tuple[Policy, dict[str, np.ndarray]]:
        """(the policy, the extra arrays saved with it)."""
        path = Path(path)
        with np.load(path) as data:
            params = {k: np.array(data[k]) for k in PARAMS}
            extra = {k[6:]: np.array(data[k]) for k in data.files if k.startswith("extra_")}
        meta_path = Path(str(path) + ".json")
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        if meta.get("format", FORMAT) != FORMAT:
            raise ValueError(f"{path}: not a {FORMAT} checkpoint ({meta.get('format')})")
        return Policy(params, meta), extra


def masked_softmax(z: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Softmax of `z` over the entries where `mask` is True (0 elsewhere)."""
    if not mask.any():
        raise ValueError("no legal action")
    top = np.max(z[mask])
    e = np.where(mask, np.exp(np.minimum(z - top, 0.0)), 0.0)
    return e / e.sum()


def state_vector(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The value baseline's input: mean and max of the legal candidates' rows."""
    legal = x[mask]
    return np.concatenate([legal.mean(axis=0), legal.max(axis=0)])


@dataclass
class Adam:
    """The Adam optimizer over a policy's parameter dict (state saved in checkpoints)."""

    lr: float = 0.01
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    t: int = 0
    m: dict[str, np.ndarray] = field(default_factory=dict)
    v: dict[str, np.ndarray] = field(default_factory=dict)

    def step(self, params: dict[str, np.ndarray], grads: dict[str, np.ndarray],
             clip: float = 5.0) -> None:
        norm = float(np.sqrt(sum(float(np.sum(g * g)) for g in grads.values())))
        scale = min(1.0, clip / norm) if norm > 0 else 1.0
        self.t += 1
        for k, g in grads.items():
            g = g * scale
            m = self.m.setdefault(k, np.zeros_like(g))
            v = self.v.setdefault(k, np.zeros_like(g))
            m *= self.b1
            m += (1 - self.b1) * g
            v *= self.b2
            v += (1 - self.b2) * g * g
            mhat = m / (1 - self.b1 ** self.t)
            vhat = v / (1 - self.b2 ** self.t)
            params[k] -= self.lr * mhat / (np.sqrt(vhat) + self.eps)

    def state(self) -> dict[str, np.ndarray]:
        out = {"adam_t": np.array([self.t])}
        out.update({f"adam_m_{k}": v for k, v in self.m.items()})
        out.update({f"adam_v_{k}": v for k, v in self.v.items()})
        return out

    def restore(self, extra: dict[str, np.ndarray]) -> None:
        self.t = int(extra.get("adam_t", np.array([0]))[0])
        self.m = {k[7:]: v for k, v in extra.items() if k.startswith("adam_m_")}
        self.v = {k[7:]: v for k, v in extra.items() if k.startswith("adam_v_")}


def rollout(env: Any, policy: Policy, rng: np.random.Generator | None,
            temperature: float = 1.0) -> tuple[list[Decision], float, dict[str, Any]]:
    """One episode of `env` (an `ExtractionEnv` with a featurizer) under `policy`:
    (the decisions, the terminal reward, the final info)."""
    obs, _ = env.reset()
    decisions: list[Decision] = []
    while True:
        x, mask = obs["features"], obs["mask"]
        a = policy.act(x, mask, rng, temperature, bool(obs.get("prefer_first", False)))
        decisions.append(Decision(x, mask, a))
        obs, reward, done, _, info = env.step(a)
        if done:
            return decisions, float(reward), info
