"""One decision process over program and schedule: extraction, then one decision per knob.

An episode of `JointEnv` first builds the program exactly as `ExtractionEnv` does (the
same candidates, the same exact mask, the same features with the phase column 0). When
the program is complete it is lowered for the target (`lower(term, out_axes)`), its knob
table read (`knob_table(lowered, backend, target)`: kernel -> knob -> values, the first
the default), and the episode continues with one decision per (kernel, knob)
coordinate, in the table's order: the candidates are that knob's values. The episode
ends with the program and a complete setting (`info["term"]`, `info["setting"]`); the
terminal reward is `reward_fn(term, setting)`.

The schedule mask is exact: a value is legal iff some choice of the coordinates still
open completes a legal setting (`is_legal`, and the space's `allowed` predicate per
kernel when it has one). Knob values are legal one by one today (any value of a
knob's list with any other's), so without `allowed` the mask is the table; with
`allowed` (a predicate over one kernel's complete knob dict) the mask is decided by a
search over the kernel's open coordinates (`tests/test_rl_joint.py` checks it against
brute force).

Schedule features (`N_SCHED` columns, the phase column 1) come from the loop nest and
the schedule model (`kernelsat.hardware.schedule_model`), not from knob or op names: the
model's predicted seconds of the kernel with the candidate value and the choices so
far (undecided knobs at their defaults), relative to the best candidate and to the
default value, the kernel's share of the program's predicted time, the nest's footprints
against L1 and L2, its vector-lane and thread use, register spills, the value's log and
relative position in its list, whether it is the default, and how far the schedule is
decided. Off a modelled backend (numpy, CUDA) the model columns are 0 and the value
columns remain.

>>> from kernelsat.egraph.snapshot import ENode, Snapshot
>>> from kernelsat.ops import Op
>>> import numpy as np
>>> snap = Snapshot(nodes=[ENode(Op.CONST, (2.0,), ())], node_class=np.array([0]),
...                 classes=[[0]], class_shape=[{}], root=0)
>>> env = JointEnv(snap, space=lambda term: ScheduleSpace({"k0": {"tile": (8, 16)}}))
>>> obs, _ = env.reset()
>>> obs, _, done, _, _ = env.step(0)  # the program
>>> env.phase, obs["candidates"].tolist(), done
('schedule', [0, 1], False)
>>> obs, _, done, _, info = env.step(1)
>>> done, info["setting"]
(True, {'k0': {'tile': 16}})
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kernelsat.codegen.lower import lower
from kernelsat.egraph.snapshot import Snapshot
from kernelsat.extract.rl_env import (
    N_FEATURES,
    N_SCHED,
    N_TARGET,
    PHASE,
    ExtractionEnv,
    Featurizer,
)
from kernelsat.hardware.knobs import (
    MODELLED_BACKENDS,
    KnobTable,
    Setting,
    kernel_name,
    knob_table,
    ranking_target,
)
from kernelsat.hardware.schedule_model import KernelFeatures, ScheduleModel
from kernelsat.hardware.targets import Target
from kernelsat.ir import Term

JointRewardFn = Callable[[Term, Setting], tuple[float, str]]
"""A terminal reward: (the finished program, its setting) -> (reward, how obtained)."""

SPACES = 32
"""Schedule spaces a `JointEnv` keeps, most recently used first."""

KernelAllowed = Callable[[str, Mapping[str, Any]], bool]
"""(kernel name, that kernel's complete knob dict) -> whether codegen accepts it."""


@dataclass
class ScheduleSpace:
    """The schedule decisions of one program: its knob table and, when a model prices
    it, the model and the kernel name -> kernel index map."""

    table: KnobTable
    model: ScheduleModel | None = None
    index: Mapping[str, int] = field(default_factory=dict)
    allowed: KernelAllowed | None = None
    error: str = ""  # why the program has no schedule decisions (it did not lower)

    @property
    def coordinates(self) -> list[tuple[str, str]]:
        return [(k, n) for k, knobs in self.table.items() for n in knobs]

    def seconds(self, kernel: str, knobs: Mapping[str, Any]) -> float | None:
        """The model's seconds of `kernel` under `knobs` (None without a model)."""
        if self.model is None or kernel not in self.index:
            return None
        t = self.model.kernel_seconds(self.index[kernel], knobs)
        return t if math.isfinite(t) and t > 0 else None

    def features(self, kernel: str, knobs: Mapping[str, Any]) -> KernelFeatures | None:
        if self.model is None or kernel not in self.index:
            return None
        return self.model.features(self.index[kernel], knobs)


@dataclass(frozen=True)
class LoweredSpace:
    """A program's `ScheduleSpace` on `target`: lowered over `out_axes`, the knob table
    for the target's backend, the schedule model on a modelled backend (picklable, so
    rollout workers can hold it)."""

    out_axes: tuple[str, ...]
    target: Target

    def __call__(self, term: Term) -> ScheduleSpace:
        try:
            lowered = lower(term, self.out_axes)
            table = knob_table(lowered, self.target.backend, self.target)
        except Exception as e:  # a program that does not lower has no schedule to choose
            return ScheduleSpace({}, error=f"{type(e).__name__}: {str(e)[:200]}")
        modelled = (self.target.backend in MODELLED_BACKENDS
                    and all(hasattr(k, "nest") for k in lowered.kernels))
        if not modelled or not table:
            return ScheduleSpace(table)
        index = {kernel_name(k, i): i for i, k in enumerate(lowered.kernels)}
        return ScheduleSpace(table, ScheduleModel(lowered, ranking_target(self.target)), index)


def completions_exist(table: KnobTable, kernel: str, fixed: Mapping[str, Any],
                      allowed: KernelAllowed | None) -> bool:
    """Whether the knobs of `kernel` not in `fixed` can be chosen so that the kernel's
    knob dict is legal (every value in the table, and `allowed`)."""
    knobs = table[kernel]
    if any(n not in knobs or v not in knobs[n] for n, v in fixed.items()):
        return False
    if allowed is None:
        return True
    open_ = [n for n in knobs if n not in fixed]
    for values in itertools.product(*(knobs[n] for n in open_)):
        if allowed(kernel, {**fixed, **dict(zip(open_, values, strict=True))}):
            return True
    return False


class JointEnv:
    """gymnasium-style environment over one snapshot: program decisions (an
    `ExtractionEnv`), then one decision per knob of the lowered program.

    `space(term)` gives the program's `ScheduleSpace` (default: `LoweredSpace(out_axes,
    target)`); `featurize` turns feature rows on (the program rows by the snapshot's
    `Featurizer`, the schedule rows here). Observation as `ExtractionEnv`'s (`class` is
    None in the schedule phase; `coordinate` names the (kernel, knob))."""

    def __init__(self, snapshot: Snapshot, root: int | None = None, *,
                 out_axes: Sequence[str] = (), target: Target | None = None,
                 space: Callable[[Term], ScheduleSpace] | None = None,
                 reward_fn: JointRewardFn | None = None, featurize: bool = False,
                 allow_store: bool = True) -> None:
        if space is None:
            if target is None:
                raise ValueError("JointEnv needs a target or a schedule space")
            space = LoweredSpace(tuple(out_axes), target)
        root = snapshot.root if root is None else root
        self.target = target
        if featurize and target is None:
            raise ValueError("JointEnv's features need a target")
        featurizer = Featurizer.of(snapshot, root, target) if featurize and target else None
        self.target_row = featurizer.target if featurizer is not None else np.zeros(N_TARGET)
        self.featurize = featurize
        self.program = ExtractionEnv(snapshot, root, featurize=featurizer,
                                     allow_store=allow_store)
        self.space_of = space
        self._spaces: OrderedDict[str, ScheduleSpace] = OrderedDict()  # by program key
        self.reward_fn = reward_fn
        self.phase = "program"
        self.term: Term | None = None
        self.space: ScheduleSpace = ScheduleSpace({})
        self.setting: Setting = {}
        self.at = 0  # the coordinate to decide

    @property
    def snapshot(self) -> Snapshot:
        return self.program.snapshot

    @property
    def root(self) -> int:
        return self.program.root

    # gymnasium API
    def reset(self, *, seed: int | None = None, options: Mapping[str, Any] | None = None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
        self.phase, self.term, self.space, self.setting, self.at = (
            "program", None, ScheduleSpace({}), {}, 0)
        obs, info = self.program.reset(seed=seed, options=options)
        return obs, info

    def step(self, action: int) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if self.phase == "program":
            obs, _, done, truncated, info = self.program.step(action)
            if not done:
                return obs, 0.0, False, truncated, info
            self.term, self.program_info = info["term"], info
            self.space = self._space(info["term"])
            self.setting = {k: {} for k in self.space.table}
            self.at, self.phase = 0, "schedule"
        else:
            if self.phase != "schedule":
                raise RuntimeError("the episode is over: call reset()")
            mask = self.action_mask()
            values = self._values()
            if not 0 <= action < len(values) or not mask[action]:
                raise ValueError(f"illegal value index {action} for {self._coordinate()} "
                                 f"(mask {mask.tolist()})")
            kernel, knob = self._coordinate()
            self.setting[kernel][knob] = values[action]
            self.at += 1
        if self.at < len(self.space.coordinates):
            return self.observation(), 0.0, False, False, {}
        return self._finish()

    def _finish(self) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        assert self.term is not None
        self.phase = "done"
        setting = {k: dict(v) for k, v in self.setting.items()}
        info: dict[str, Any] = {**self.program_info, "setting": setting,
                                "coordinates": len(self.space.coordinates)}
        if self.space.error:
            info["lower_error"] = self.space.error
        reward = 0.0
        if self.reward_fn is not None:
            reward, info["reward_source"] = self.reward_fn(self.term, setting)
        return {}, float(reward), True, False, info

    def _space(self, term: Term) -> ScheduleSpace:
        """The program's schedule space, the last `SPACES` kept (lowering and the
        model's memo are reused when an episode ends on a program seen before)."""
        key = term.key
        if key in self._spaces:
            self._spaces.move_to_end(key)
            return self._spaces[key]
        space = self._spaces[key] = self.space_of(term)
        while len(self._spaces) > SPACES:
            self._spaces.popitem(last=False)
        return space

    # the schedule state
    def _coordinate(self) -> tuple[str, str]:
        return self.space.coordinates[self.at]

    def _values(self) -> tuple[Any, ...]:
        kernel, knob = self._coordinate()
        return tuple(self.space.table[kernel][knob])

    def candidates(self) -> np.ndarray:
        if self.phase == "program":
            return self.program.candidates()
        return np.arange(len(self._values()), dtype=np.int64)

    def action_mask(self) -> np.ndarray:
        """Exact legality of each candidate (see the module docstring)."""
        if self.phase == "program":
            return self.program.action_mask()
        kernel, knob = self._coordinate()
        fixed = self.setting[kernel]
        return np.array([completions_exist(self.space.table, kernel, {**fixed, knob: v},
                                           self.space.allowed)
                         for v in self._values()], dtype=bool)

    def observation(self) -> dict[str, Any]:
        if self.phase == "program":
            return self.program.observation()
        # a knob's values are ordered, the default first: greedy ties go to the earlier
        obs: dict[str, Any] = {"class": None, "coordinate": self._coordinate(),
                               "candidates": self.candidates(), "mask": self.action_mask(),
                               "prefer_first": True}
        if self.featurize:
            obs["features"] = self.schedule_rows()
        return obs

    def _knobs_with(self, kernel: str, knob: str, value: Any) -> dict[str, Any]:
        """The kernel's knobs with `value` for `knob`, the choices so far, defaults else."""
        out = {n: vals[0] for n, vals in self.space.table[kernel].items()}
        out.update(self.setting[kernel])
        out[knob] = value
        return out

    def schedule_rows(self) -> np.ndarray:
        """Feature rows of the current coordinate's values (`N_FEATURES` wide)."""
        kernel, knob = self._coordinate()
        values = self._values()
        rows = np.zeros((len(values), N_FEATURES))
        rows[:, PHASE - N_TARGET:PHASE] = self.target_row
        rows[:, PHASE] = 1.0
        sched = rows[:, PHASE + 1:]
        secs = [self.space.seconds(kernel, self._knobs_with(kernel, knob, v)) for v in values]
        priced = [t for t in secs if t is not None]
        others = 0.0
        if priced:
            for k in self.space.table:
                if k != kernel:
                    knobs = {n: vals[0] for n, vals in self.space.table[k].items()}
                    knobs.update(self.setting[k])
                    others += self.space.seconds(k, knobs) or 0.0
        best = min(priced, default=0.0)
        decided = self.at / max(len(self.space.coordinates), 1)
        for i, v in enumerate(values):
            sched[i] = value_columns(v, i, len(values), decided)
            t = secs[i]
            if t is None:
                continue
            f = self.space.features(kernel, self._knobs_with(kernel, knob, v))
            assert f is not None and self.target is not None
            sched[i, :8] = model_columns(t, best, secs[0], others, f, self.target)
            sched[i, -1] = 1.0  # priced by the model
        return rows


def model_columns(t: float, best: float, default: float | None, others: float,
                  f: KernelFeatures, target: Target) -> np.ndarray:
    """The schedule model's columns of one candidate value (its kernel at `t` seconds,
    the best candidate at `best`, the default value at `default`, the program's other
    kernels at `others`)."""
    fp = f.footprints
    inner = fp[-1] if fp else 0.0
    middle = fp[-2] if len(fp) > 1 else inner
    l1 = max(float(target.shared_mem_per_unit), 1.0)
    l2 = max(float(target.l2_bytes), 1.0)
    rel_default = math.log(t / default) if default else 0.0
    return np.array([
        min(math.log(t / best), 5.0) / 5 if best > 0 else 0.0,
        float(t <= best * (1 + 1e-9)),
        max(-5.0, min(5.0, rel_default)) / 5,
        t / (t + others),
        max(-1.0, min(1.0, math.log2((inner + 1.0) / l1) / 8)),
        max(-1.0, min(1.0, math.log2((middle + 1.0) / l2) / 8)),
        f.vector_fraction * f.lane_use,
        min(1.0, f.threads * f.balance / max(target.units, 1)) - 0.5 * float(
            f.spills or f.native_spills),
    ])


def value_columns(value: Any, index: int, count: int, decided: float) -> np.ndarray:
    """The columns every schedule decision has: 8 model columns (0 here, filled by
    `model_columns` on a modelled backend), the value's log and kind, its relative
    position, whether it is the default, the share of the schedule decided, how many
    values the knob has, and whether the model priced it (0 here)."""
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    log = (math.copysign(math.log2(1.0 + abs(float(value))), float(value)) / 10
           if numeric else float(value) if isinstance(value, bool) else 0.0)
    out = np.zeros(N_SCHED)
    out[8:] = [log, float(numeric), index / max(count - 1, 1), float(index == 0), decided,
               math.log2(count) / 4, 0.0]
    return out

