"""Knob search: pick the fastest legal knob setting of one program on one target.

Knobs are what codegen may choose without changing semantics (tile sizes, vector
width, threads, unrolling). Each kernel lists its own with `knob_space()`: knob name
-> legal values, the first being its default. The search space is the explicit table

    {kernel name: {knob: (value, ...)}}

and a setting picks one value per (kernel, knob). The search, within a budget of
measurements:

1. measures the default setting;
2. measures `n_random` distinct random settings;
3. from the best so far, hill-climbs by coordinate moves (one knob one step up or
   down its value list, the action table `MOVES`), taking the first move that
   improves, until no move improves ("local optimum"), the budget is spent
   ("budget") or every setting has been tried ("space exhausted").

Failed measurements count as infinitely slow. With a lookup (the SQLite cache),
settings measured before cost nothing from the budget.

>>> table = {"k0": {"tile": (8, 16, 32, 64)}}
>>> fake = lambda s: Measurement(abs(s["k0"]["tile"] - 32) + 1.0, 0, 0, 1, 0.0, True)
>>> r = search(table, fake, budget=6, n_random=1, seed=0)
>>> r.best, r.stop_reason in ("local optimum", "space exhausted", "budget")
({'k0': {'tile': 32}}, True)
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from kernelsat.codegen import build as codegen_build
from kernelsat.codegen.lower import Kernel, LoweredProgram
from kernelsat.hardware.cache import MeasureCache
from kernelsat.hardware.measure import TIMING, Measurement, TimingProtocol, measure
from kernelsat.hardware.targets import Target

KnobTable = Mapping[str, Mapping[str, Sequence[Any]]]
"""kernel name -> knob name -> legal values (the first is the default)."""

Setting = dict[str, dict[str, Any]]
"""kernel name -> knob name -> chosen value."""

MOVES: tuple[int, ...] = (+1, -1)
"""Coordinate moves: one step up or down a knob's ordered value list."""


@dataclass(frozen=True)
class Trial:
    """One evaluated setting."""

    setting: Setting
    measurement: Measurement
    cached: bool


@dataclass(frozen=True)
class SearchResult:
    """The best setting found, every trial in order, and why the search stopped."""

    best: Setting
    best_measurement: Measurement | None
    trials: tuple[Trial, ...]
    measured: int
    stop_reason: str


def kernel_name(kernel: Kernel, index: int) -> str:
    """A kernel's name in the knob table: its `name` if it has one, else `k<index>`."""
    name = getattr(kernel, "name", None)
    return str(name) if name else f"k{index}"


IGNORED_BY_BACKEND: dict[str, frozenset[str]] = {
    "c": frozenset({"tpb"}),  # threads per block: CUDA only
    "numpy": frozenset({"tpb", "omp", "vec"}),
    "cuda": frozenset({"omp"}),  # OpenMP: C only
    "hip": frozenset({"omp"}),
}
"""Knobs a backend does not read: searching them would spend measurements on nothing."""


def knob_table(lowered: LoweredProgram, backend: str | None = None
               ) -> dict[str, dict[str, tuple[Any, ...]]]:
    """The knob table of a lowered program (`.kernels`, each with `knob_space()`), less
    the knobs `backend` ignores and knobs with a single legal value."""
    ignored = IGNORED_BY_BACKEND.get(backend or "", frozenset())
    table: dict[str, dict[str, tuple[Any, ...]]] = {}
    for i, kernel in enumerate(lowered.kernels):
        space = kernel.knob_space() if hasattr(kernel, "knob_space") else {}
        knobs = {str(k): tuple(v) for k, v in dict(space).items()
                 if len(tuple(v)) > 1 and str(k) not in ignored}
        if knobs:
            table[kernel_name(kernel, i)] = knobs
    return table


def codegen_knobs(lowered: LoweredProgram, setting: Setting) -> list[dict[str, Any]]:
    """A setting in codegen's form: one knob dict per kernel, in kernel order (knobs not
    in the table are left to codegen's defaults)."""
    return [dict(setting.get(kernel_name(k, i), {})) for i, k in enumerate(lowered.kernels)]


def default_setting(table: KnobTable) -> Setting:
    """Every knob at its first (default) value."""
    return {k: {n: vals[0] for n, vals in knobs.items()} for k, knobs in table.items()}


def is_legal(table: KnobTable, setting: Setting) -> bool:
    """Whether `setting` picks exactly one legal value for every knob of the table."""
    if set(setting) != set(table):
        return False
    return all(set(setting[k]) == set(knobs) and all(setting[k][n] in vals
                                                     for n, vals in knobs.items())
               for k, knobs in table.items())


def space_size(table: KnobTable) -> int:
    """How many settings the table allows."""
    return math.prod(len(v) for knobs in table.values() for v in knobs.values())


def _coordinates(table: KnobTable) -> list[tuple[str, str]]:
    return [(k, n) for k, knobs in table.items() for n in knobs]


def _key(setting: Setting) -> str:
    return json.dumps(setting, sort_keys=True, default=str)


def _random_setting(table: KnobTable, rng: random.Random) -> Setting:
    return {k: {n: rng.choice(list(vals)) for n, vals in knobs.items()}
            for k, knobs in table.items()}


def _neighbours(table: KnobTable, setting: Setting) -> list[Setting]:
    out = []
    for kernel, knob in _coordinates(table):
        values = list(table[kernel][knob])
        at = values.index(setting[kernel][knob])
        for step in MOVES:
            j = at + step
            if 0 <= j < len(values):
                moved = {k: dict(v) for k, v in setting.items()}
                moved[kernel][knob] = values[j]
                out.append(moved)
    return out


def _score(m: Measurement) -> float:
    return m.median if m.ok and math.isfinite(m.median) else math.inf


class _Search:
    """The mutable state of one search (trials, budget); `search` drives it."""

    def __init__(self, evaluate: Callable[[Setting], Measurement],
                 lookup: Callable[[Setting], Measurement | None] | None, budget: int,
                 max_seconds: float = math.inf) -> None:
        self.evaluate, self.lookup, self.budget = evaluate, lookup, budget
        self.deadline = time.monotonic() + max_seconds
        self.trials: list[Trial] = []
        self.seen: dict[str, Measurement] = {}
        self.measured = 0

    def out_of_budget(self) -> bool:
        """Out of settings (cached ones count: a warm cache replays the same search rather
        than extending it), or out of time once something was measured."""
        late = self.measured > 0 and time.monotonic() > self.deadline
        return len(self.trials) >= self.budget or late

    def score(self, setting: Setting) -> float | None:
        """The setting's score, measuring it if needed; None when out of budget."""
        key = _key(setting)
        if key in self.seen:
            return _score(self.seen[key])
        if len(self.trials) >= self.budget:
            return None
        cached = self.lookup(setting) if self.lookup else None
        if cached is None:
            if self.out_of_budget():
                return None
            cached_flag, m = False, self.evaluate(setting)
            self.measured += 1
        else:
            cached_flag, m = True, cached
        self.seen[key] = m
        self.trials.append(Trial(setting, m, cached_flag))
        return _score(m)


def search(
    table: KnobTable,
    evaluate: Callable[[Setting], Measurement],
    *,
    budget: int = 24,
    n_random: int = 8,
    seed: int = 0,
    lookup: Callable[[Setting], Measurement | None] | None = None,
    max_seconds: float = math.inf,
) -> SearchResult:
    """Random + coordinate local search over `table` trying at most `budget` settings
    (from the cache or measured) and, after the first measurement, starting none past
    `max_seconds`."""
    state = _Search(evaluate, lookup, budget, max_seconds)
    rng = random.Random(seed)
    total = space_size(table)
    best = default_setting(table)
    best_score = state.score(best)
    if best_score is None:
        return SearchResult(best, None, (), 0, "budget")
    for _ in range(20 * n_random):  # bounded tries at drawing distinct settings
        if len(state.seen) >= min(1 + n_random, total):
            break
        candidate = _random_setting(table, rng)
        if _key(candidate) in state.seen:
            continue
        s = state.score(candidate)
        if s is None:
            break
        if s < best_score:
            best, best_score = candidate, s
    reason = "local optimum"
    improved = True
    while improved:
        improved = False
        for candidate in _neighbours(table, best):
            s = state.score(candidate)
            if s is None:
                reason = "budget"
                break
            if s < best_score:
                best, best_score, improved = candidate, s, True
                break
        if reason == "budget":
            break
    if reason != "budget" and len(state.seen) >= total:
        reason = "space exhausted"
    best_m = state.seen.get(_key(best))
    return SearchResult(best, best_m, tuple(state.trials), state.measured, reason)


SLOWDOWN_LIMIT = 4.0
"""Knob search stops timing a setting whose run takes this many times the best median."""

ABANDON_FLOOR = 0.005
"""Seconds under which no run is abandoned as too slow: stopping it saves nothing, and a
tiny kernel's time is mostly launch overhead (a 16x64 softmax: 28 us; its candidates
160 us here)."""


def abandon_limit(best: float) -> float:
    """How long one run may take before its program or setting is abandoned, given the
    best median so far (inf when nothing is measured yet)."""
    return max(SLOWDOWN_LIMIT * best, ABANDON_FLOOR)


def tune(
    lowered: LoweredProgram,
    target: Target,
    inputs: Mapping[str, np.ndarray],
    out_shape: tuple[int, ...],
    reference: np.ndarray,
    *,
    program_key: str,
    dtype: str = "float32",
    budget: int = 24,
    n_random: int = 8,
    seed: int = 0,
    cache: MeasureCache | None = None,
    build: Callable[[Any, str, Any], Any] | None = None,
    timing: TimingProtocol = TIMING["bench"],
    measure_kwargs: Mapping[str, Any] | None = None,
    max_seconds: float = math.inf,
) -> SearchResult:
    """Search the knobs of a lowered program on `target`, measuring with `measure`
    under `timing` (`measure_kwargs`: its other options, or timing fields to replace)
    and caching through `cache` (keyed by target fingerprint, `program_key`, setting,
    dtype). `build` defaults to `kernelsat.codegen.build` and receives the setting in
    codegen's form (`codegen_knobs`: one dict per kernel)."""
    if build is None:
        build = codegen_build
    kwargs = dict(measure_kwargs or {})
    build_fn = build
    best = [math.inf]

    def evaluate(setting: Setting) -> Measurement:
        try:
            exe = build_fn(lowered, target.backend, codegen_knobs(lowered, setting))
        except Exception as exc:  # a setting that does not compile is a failed trial
            m = Measurement.failed(f"build failed: {type(exc).__name__}: {exc}")
        else:
            # a setting far slower than the best so far is abandoned after one run
            limit = min(kwargs.get("max_run_seconds", timing.max_run_seconds),
                        abandon_limit(best[0]))
            m = measure(exe, inputs, out_shape, reference, timing,
                        **{**kwargs, "dtype": dtype, "max_run_seconds": limit})
            if m.ok:
                best[0] = min(best[0], m.median)
        if cache is not None:
            cache.put(target.fingerprint, program_key, setting, dtype, m)
        return m

    def lookup(setting: Setting) -> Measurement | None:
        return cache.get(target.fingerprint, program_key, setting, dtype) if cache else None

    table = knob_table(lowered, target.backend)
    return search(table, evaluate, budget=budget, n_random=n_random, seed=seed, lookup=lookup,
                  max_seconds=max_seconds)
