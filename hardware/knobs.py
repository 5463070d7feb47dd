"""Knob search: pick the fastest legal knob setting of one program on one target.

Knobs are what codegen may choose without changing semantics (tile sizes, vector
width, threads, unrolling). Each kernel lists its own with `knob_space()`: knob name
-> legal values, the first being its default. The search space is the explicit table

    {kernel name: {knob: (value, ...)}}

and a setting picks one value per (kernel, knob). The search, within a budget of
measurements:

1. measures the default setting, then `n_random` distinct random settings; or, with
   a model ranking (`ranked`: `tune` ranks with the schedule cost model,
   `kernelsat.hardware.schedule_model`), the best-predicted setting, the default (a
   default far slower is abandoned after one run) and the next best-predicted ones, up
   to `RANKED_SHARE` of the budget (with a learned cost model beside the cache,
   `kernelsat.hardware.learned`, the schedule model's best `LEARNED_POOL` x budget
   settings re-ranked by it; the settings `tune` measures are then added to it);
3. from the best so far, hill-climbs by coordinate moves (one knob one step up or
   down its value list, the action table `MOVES`; with a `predict`ion, best-predicted
   move first and moves predicted `MODEL_PRUNE` times slower than the best prediction
   left out), taking the first move that improves, until no move improves ("local
   optimum"), the budget is spent ("budget") or every setting has been tried ("space
   exhausted").

The ranking (`rank_settings`) prices each kernel's settings separately (the model is a
sum over kernels): a kernel space of at most `ENUMERATE` settings is enumerated, a
larger one sampled (`SAMPLE` settings, seeded) and refined by coordinate descent on the
model; the program's best-predicted settings are then the k best sums.

Failed measurements count as infinitely slow. With a lookup (the SQLite cache),
settings measured before cost nothing from the budget.

>>> table = {"k0": {"tile": (8, 16, 32, 64)}}
>>> fake = lambda s: Measurement(abs(s["k0"]["tile"] - 32) + 1.0, 0, 0, 1, 0.0, True)
>>> r = search(table, fake, budget=6, n_random=1, seed=0)
>>> r.best, r.stop_reason in ("local optimum", "space exhausted", "budget")
({'k0': {'tile': 32}}, True)
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kernelsat.codegen import build as codegen_build
from kernelsat.codegen.cuda import gpu_first
from kernelsat.codegen.lower import Kernel, LoweredProgram, lower
from kernelsat.hardware.cache import MeasureCache
from kernelsat.hardware.learned import (
    LearnedCost,
    add_measurements,
    feature_vector,
    load_if_present,
)
from kernelsat.hardware.measure import TIMING, Measurement, TimingProtocol, measure
from kernelsat.hardware.schedule_model import ScheduleModel, vector_floats
from kernelsat.hardware.targets import ASSUMED_BANDWIDTH_PER_CORE, Target
from kernelsat.ir import Term

KnobTable = Mapping[str, Mapping[str, Sequence[Any]]]
"""kernel name -> knob name -> legal values (the first is the default)."""

Setting = dict[str, dict[str, Any]]
"""kernel name -> knob name -> chosen value."""

MOVES: tuple[int, ...] = (+1, -1)
"""Coordinate moves: one step up or down a knob's ordered value list."""

RANKED_SHARE = 0.75
"""Share of the budget spent on the model's best-predicted settings (the default
included) before coordinate moves: a budget of 3 measures the default and the model's
two best; 30 measures 23 ranked settings and then moves."""

MODEL_PRUNE = 4.0
"""Coordinate moves predicted this many times slower than the best prediction among
the measured settings are not measured."""

ENUMERATE = 512
"""A kernel's knob space up to this size is priced whole by the model."""

SAMPLE = 128
"""Settings of a larger kernel space priced at random (seeded), before model descent."""

NEAR_DEFAULT = 0.01
"""Settings the model prices alike are ranked nearer the default first: each knob away
from its default adds this share to the prediction (the defaults are measured choices;
the model's ties are its blind spots)."""

DESCENT_STARTS = 3
"""Best samples from which coordinate descent on the model continues."""

VECTOR_WIDTH_KNOBS = frozenset({"vw"})
"""Knobs that pick an explicit SIMD width in floats: values wider than the target's
vectors are dropped from the table."""


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


BACKEND_PREFIXES: dict[str, str] = {"cuda": "cuda.", "hip": "cuda."}
"""Knobs named `<prefix>...` are read by that backend only (`cuda.bm`: a CUDA tile)."""

IGNORED_BY_BACKEND: dict[str, frozenset[str]] = {
    "c": frozenset({"tpb"}),  # threads per block: CUDA only
    "numpy": frozenset({"tpb", "omp", "vec", "nt", "psum", "welford"}),
    # OpenMP, the CPU GEMM's and the CPU fused attention's register/cache tiles: C only
    # (CUDA reads `gemm`/`flash` and its own `cuda.*` tiles; codegen/cuda.py)
    "cuda": frozenset({"omp", "mr", "nr", "kc", "mc", "nc", "vw", "par", "rowvec", "kacc",
                       "eacc", "keys", "pack", "nt", "psum"}),
    "hip": frozenset({"omp", "nt", "psum"}),
}
"""Knobs a backend does not read: searching them would spend measurements on nothing."""


def _fits_simd(knob: str, values: Sequence[Any], target: Target | None) -> tuple[Any, ...]:
    """A vector-width knob's values no wider than the target's vectors (the narrowest
    value when none fits); any other knob's values unchanged."""
    if target is None or knob not in VECTOR_WIDTH_KNOBS or target.kind != "cpu":
        return tuple(values)
    width = vector_floats(target)
    fit = tuple(v for v in values if isinstance(v, int) and v <= width)
    return fit or (min(values),)


def knob_table(lowered: LoweredProgram, backend: str | None = None,
               target: Target | None = None) -> dict[str, dict[str, tuple[Any, ...]]]:
    """The knob table of a lowered program (`.kernels`, each with `knob_space()`), less
    the knobs `backend` ignores, vector widths wider than `target`'s SIMD (a CPU
    target given) and knobs with a single legal value. Each knob's first value is its
    default: the kernel's own (chosen for a CPU), or on the cuda backend the GPU's
    (`codegen.cuda.gpu_first`: one element a lane, no kept row)."""
    ignored = IGNORED_BY_BACKEND.get(backend or "", frozenset())
    table: dict[str, dict[str, tuple[Any, ...]]] = {}
    for i, kernel in enumerate(lowered.kernels):
        space = kernel.knob_space() if hasattr(kernel, "knob_space") else {}
        fitted = {str(k): _fits_simd(str(k), tuple(v), target) for k, v in dict(space).items()}
        defaults = {str(k): next(iter(v)) for k, v in dict(space).items() if tuple(v)}
        # a knob narrowed to one value other than codegen's default must still be passed
        foreign = [p for b, p in BACKEND_PREFIXES.items() if b != backend
                   and p != BACKEND_PREFIXES.get(backend or "")] if backend else []
        knobs = {k: v for k, v in fitted.items() if k not in ignored
                 and not any(k.startswith(p) for p in foreign)
                 and (len(v) > 1 or (v and v[0] != defaults.get(k)))}
        if backend == "cuda":  # the GPU's untimed defaults first (`cuda_defaults`)
            knobs = {k: gpu_first(k, v) for k, v in knobs.items()}
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


def random_setting(table: KnobTable, rng: random.Random) -> Setting:
    """Every knob of `table` at a value drawn uniformly from its legal values."""
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


def _moves(table: KnobTable, setting: Setting, predict: Callable[[Setting], float] | None,
           measured: Sequence[Setting]) -> list[Setting]:
    """Coordinate moves from `setting`: in `MOVES` order, or with a prediction the
    best-predicted first, less those predicted `MODEL_PRUNE` times slower than the best
    prediction among the `measured` settings."""
    moves = _neighbours(table, setting)
    if predict is None:
        return moves
    priced = [(predict(m), i, m) for i, m in enumerate(moves)]
    floor = min((predict(m) for m in measured), default=math.inf)
    return [m for p, _, m in sorted(priced, key=lambda x: (x[0], x[1]))
            if not p > MODEL_PRUNE * floor]


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

    def seen_settings(self) -> list[Setting]:
        return [t.setting for t in self.trials]


def search(
    table: KnobTable,
    evaluate: Callable[[Setting], Measurement],
    *,
    budget: int = 24,
    n_random: int = 8,
    seed: int = 0,
    lookup: Callable[[Setting], Measurement | None] | None = None,
    max_seconds: float = math.inf,
    ranked: Sequence[Setting] | None = None,
    predict: Callable[[Setting], float] | None = None,
) -> SearchResult:
    """Ranked (or random) + coordinate local search over `table` trying at most `budget`
    settings (from the cache or measured) and, after the first measurement, starting
    none past `max_seconds`. `ranked`: settings best-predicted first, measured instead
    of random ones; `predict`: predicted seconds of a setting, ordering and pruning the
    coordinate moves (see the module docstring)."""
    state = _Search(evaluate, lookup, budget, max_seconds)
    rng = random.Random(seed)
    total = space_size(table)
    default = default_setting(table)
    if ranked:
        # the model's first choice, then the default (its run is abandoned early when far
        # slower), then the next best-predicted settings
        first: Setting = ranked[0]
        draws: Sequence[Setting] | None = [default, *ranked[1:]]
        wanted, tries = max(2, math.ceil(RANKED_SHARE * budget)), len(ranked)
    else:
        first, draws, wanted, tries = default, None, 1 + n_random, 20 * n_random
    best = first
    best_score = state.score(best)
    if best_score is None:
        return SearchResult(best, None, (), 0, "budget")
    for i in range(tries):  # bounded tries at drawing distinct settings
        if len(state.seen) >= min(wanted, total):
            break
        candidate = draws[i] if draws is not None else random_setting(table, rng)
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
        for candidate in _moves(table, best, predict, list(state.seen_settings())):
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


# -- model ranking --------------------------------------------------------------------


KernelCost = Callable[[str, Mapping[str, Any]], float]
"""Predicted seconds of one kernel (by its table name) under one knob dict."""


def _kernel_candidates(knobs: Mapping[str, Sequence[Any]], cost: Callable[[dict[str, Any]], float],
                       rng: random.Random, identity: Callable[[dict[str, Any]], Any] | None
                       ) -> list[tuple[float, dict[str, Any]]]:
    """One kernel's settings priced by `cost`, cheapest first: all of a space of at most
    `ENUMERATE`, else `SAMPLE` seeded draws (the default among them) refined by
    coordinate descent on the model from the `DESCENT_STARTS` cheapest, and every
    setting one knob away from the default (descent only takes strict gains, so a
    change the model prices like a farther setting is otherwise never priced, and the
    `NEAR_DEFAULT` preference never sees it). Settings with
    one `identity` (the same code) appear once, the first priced."""
    names = list(knobs)
    size = math.prod(len(v) for v in knobs.values())
    priced: dict[str, tuple[float, dict[str, Any]]] = {}

    def price(setting: dict[str, Any]) -> float:
        key = _key(setting)
        if key not in priced:
            priced[key] = (cost(setting), setting)
        return priced[key][0]

    if size <= ENUMERATE:
        for values in itertools.product(*(knobs[n] for n in names)):
            price(dict(zip(names, values, strict=True)))
    else:
        default = {n: knobs[n][0] for n in names}
        price(default)
        for n in names:  # every one-knob change of the default (`nt` alone, a tile alone)
            for v in knobs[n]:
                price({**default, n: v})
        for _ in range(SAMPLE):
            price({n: rng.choice(list(knobs[n])) for n in names})
        starts = sorted(priced.values(), key=lambda p: p[0])[:DESCENT_STARTS]
        for _, start in starts:
            here, here_cost = start, price(start)
            moved = True
            while moved:
                moved = False
                for n in names:
                    legal = list(knobs[n])
                    at = legal.index(here[n])
                    for j in (at - 1, at + 1):
                        if 0 <= j < len(legal):
                            other = {**here, n: legal[j]}
                            c = price(other)
                            if c < here_cost:
                                here, here_cost, moved = other, c, True
    default = {n: knobs[n][0] for n in names}

    def rank(p: tuple[float, dict[str, Any]]) -> tuple[float, str]:
        away = sum(1 for n in names if p[1][n] != default[n])
        return p[0] * (1.0 + NEAR_DEFAULT * away), _key(p[1])

    ordered = sorted(priced.values(), key=rank)
    if identity is None:
        return ordered
    seen: set[Any] = set()
    out = []
    for p in ordered:
        ident = identity(p[1])
        if ident not in seen:
            seen.add(ident)
            out.append(p)
    return out


def rank_settings(table: KnobTable, cost: KernelCost, *, limit: int, seed: int = 0,
                  identity: Callable[[str, Mapping[str, Any]], Any] | None = None
                  ) -> list[tuple[float, Setting]]:
    """The `limit` best-predicted settings of `table` with their predicted seconds,
    cheapest first. The prediction is a sum over kernels, so each kernel's settings are
    priced alone (`_kernel_candidates`) and the best sums are drawn from a heap.

    >>> t = {"a": {"x": (1, 2, 3)}, "b": {"y": (1, 2)}}
    >>> [p for p, _ in rank_settings(t, lambda k, s: float(sum(s.values())), limit=3)]
    [2.0, 3.0, 3.0]
    """
    rng = random.Random(seed)
    kernels = list(table)
    lists = [_kernel_candidates(
        table[k], lambda s, k=k: cost(k, s), rng,  # type: ignore[misc]
        None if identity is None else (lambda s, k=k: identity(k, s)))  # type: ignore[misc]
        for k in kernels]
    if not kernels:
        return [(0.0, {})]
    start = (0,) * len(kernels)

    def total(pos: tuple[int, ...]) -> float:
        return sum(lists[i][p][0] for i, p in enumerate(pos))

    heap = [(total(start), start)]
    seen = {start}
    out: list[tuple[float, Setting]] = []
    while heap and len(out) < limit:
        value, pos = heapq.heappop(heap)
        out.append((value, {k: dict(lists[i][p][1]) for i, (k, p) in
                            enumerate(zip(kernels, pos, strict=True))}))
        for i in range(len(kernels)):
            if pos[i] + 1 < len(lists[i]):
                nxt = (*pos[:i], pos[i] + 1, *pos[i + 1:])
                if nxt not in seen:
                    seen.add(nxt)
                    heapq.heappush(heap, (total(nxt), nxt))
    return out


@dataclass(frozen=True)
class Plan:
    """What `tune` searches: the knob table, the model's ranking and its prediction."""

    table: dict[str, dict[str, tuple[Any, ...]]]
    ranked: list[Setting] | None
    predict: Callable[[Setting], float] | None
    model: ScheduleModel | None


MODELLED_BACKENDS = frozenset({"c"})
"""Backends whose code the schedule model describes (loop nests compiled for a CPU)."""


def ranking_target(target: Target) -> Target:
    """`target` with only the figures its fingerprint stands for: a measured CPU memory
    bandwidth (left out of the fingerprint, re-probed at will, different in a process
    whose cache folder has none) is replaced by the assumed per-core figure, so that
    the ranking, and with it a warm cache's replay of a search, is the same wherever
    the fingerprint is."""
    if target.kind != "cpu" or target.bandwidth_source == "datasheet":
        return target
    return replace(target, mem_bandwidth=ASSUMED_BANDWIDTH_PER_CORE * target.units)


def plan(lowered: LoweredProgram, target: Target, budget: int, seed: int = 0,
         use_model: bool = True, learned: LearnedCost | None = None) -> Plan:
    """The knob table of `lowered` on `target` and, for a modelled backend, the settings
    ranked by the schedule model (`budget` of them) and the model's prediction. With a
    `learned` cost model (`kernelsat.hardware.learned`), the schedule model's best
    `LEARNED_POOL` x `budget` settings are ranked again by it, and its prediction
    orders the coordinate moves."""
    table = knob_table(lowered, target.backend, target)
    modelled = all(hasattr(k, "nest") for k in lowered.kernels)  # loop nests to read
    if not use_model or target.backend not in MODELLED_BACKENDS or not table or not modelled:
        return Plan(table, None, None, None)
    model = ScheduleModel(lowered, ranking_target(target))
    index = {kernel_name(k, i): i for i, k in enumerate(lowered.kernels)}

    def kernel_cost(name: str, knobs: Mapping[str, Any]) -> float:
        return model.kernel_seconds(index[name], knobs)

    def predict(setting: Setting) -> float:
        return sum(kernel_cost(k, v) for k, v in setting.items())

    def identity(name: str, knobs: Mapping[str, Any]) -> Any:
        return model.identity(index[name], knobs)

    pool = max(budget, 1) * (LEARNED_POOL if learned is not None else 1)
    ranked = rank_settings(table, kernel_cost, limit=pool, seed=seed, identity=identity)
    if learned is not None:
        return _learned_plan(lowered, target, budget, learned, table, [s for _, s in ranked],
                             model)
    return Plan(table, [s for _, s in ranked], predict, model)


# -- the learned cost model (kernelsat.hardware.learned) -----------------------------------

LEARNED_POOL = 8
"""With a learned model, the schedule model's best `LEARNED_POOL` times the budget
settings are ranked again by the learned model (which prices whole settings, so it
re-ranks a pool rather than enumerating)."""


def _setting_vector(model: ScheduleModel, lowered: LoweredProgram, setting: Setting | None
                    ) -> np.ndarray:
    per = codegen_knobs(lowered, setting or {})
    return feature_vector([model.features(i, k) for i, k in enumerate(per)], model.target)


def _learned_plan(lowered: LoweredProgram, target: Target, budget: int, learned: LearnedCost,
                  table: dict[str, dict[str, tuple[Any, ...]]], pool: list[Setting],
                  model: ScheduleModel) -> Plan:
    """`plan` with a learned model: `pool` ranked by it, its prediction for the moves."""

    def predict(setting: Setting) -> float:
        return float(np.exp(learned.score(_setting_vector(model, lowered, setting))))

    ranked = sorted(pool, key=predict)[: max(budget, 1)]  # stable: ties keep the pool's order
    return Plan(table, ranked, predict, model)


def program_vector(program: Term | LoweredProgram, out_axes: Sequence[str], target: Target,
                    setting: Setting | None) -> np.ndarray:
    """The learned model's features of a program (a term lowered over `out_axes`, or a
    lowered program) at `setting` (None: its defaults)."""
    lowered = (program if isinstance(program, LoweredProgram)
               else lower(program, tuple(out_axes)))
    return _setting_vector(ScheduleModel(lowered, ranking_target(target)), lowered, setting)


def learned_seconds(term: Term, out_axes: Sequence[str], target: Target,
                    learned: LearnedCost) -> float:
    """The learned model's seconds for a program at its default knob setting (inf when
    it does not lower or its backend is not modelled): how `optimize` ranks candidates
    when a model file exists."""
    if target.backend not in MODELLED_BACKENDS:
        return math.inf
    try:
        return float(np.exp(learned.score(program_vector(term, out_axes, target, None))))
    except Exception:  # a program that does not lower is ranked last, never fatal
        return math.inf


def record_measured(folder: Any, target: Target,
                    measured: Sequence[tuple[Term | LoweredProgram, Setting | None, float]],
                    out_axes: Sequence[str] = ()) -> bool:
    """Online update of the learned model in cache folder `folder` (none there: nothing
    happens) with one group: measured (program, setting, seconds) rows of one spec or
    one program, close in time. A program is a term (lowered over `out_axes`) or a
    lowered program. Returns whether the model file was updated."""
    if folder is None or target.backend not in MODELLED_BACKENDS:
        return False
    rows, times = [], []
    for program, setting, seconds in measured:
        if not (math.isfinite(seconds) and seconds > 0):
            continue
        try:
            rows.append(program_vector(program, out_axes, target, setting))
        except Exception:  # a program whose features fail is left out of the update
            continue
        times.append(math.log(seconds))
    if len(rows) < 2:
        return False
    return add_measurements(folder, [(np.array(rows), np.array(times))], target.fingerprint)


def learned_model(cache: Any) -> LearnedCost | None:
    """The learned model beside a measurement cache (in its folder), if one is there."""
    path = getattr(cache, "path", None)
    return load_if_present(path.parent) if path is not None else None


def kernel_features_of(lowered: LoweredProgram, target: Target,
                       per_kernel: Sequence[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The model's features of a setting in codegen's form (one knob dict per kernel,
    None for a kernel's defaults) and its prediction; None off the modelled backends."""
    if target.backend not in MODELLED_BACKENDS:
        return None
    model = ScheduleModel(lowered, ranking_target(target))
    knobs = [dict(k or {}) for k in per_kernel]
    return {"kernels": [model.features(i, k).as_dict() for i, k in enumerate(knobs)],
            "predicted": sum(model.kernel_seconds(i, k) for i, k in enumerate(knobs))}


def setting_features(model: ScheduleModel | None, lowered: LoweredProgram, setting: Setting
                     ) -> dict[str, Any] | None:
    """The model's features of every kernel under `setting` and its prediction (what
    the measurement cache keeps beside each timing), or None without a model."""
    if model is None:
        return None
    per = codegen_knobs(lowered, setting)
    feats = [model.features(i, knobs) for i, knobs in enumerate(per)]
    return {"kernels": [f.as_dict() for f in feats],
            "predicted": sum(model.kernel_seconds(i, k) for i, k in enumerate(per))}


SLOWDOWN_LIMIT = 4.0
"""Knob search stops timing a setting whose run takes this many times the best median."""

ABANDON_FLOOR = 0.005
"""Seconds under which no run is abandoned as too slow: stopping it saves nothing, and a
tiny kernel's time is mostly launch overhead (a 16x64 softmax: 28 us; its candidates
160 us here)."""


PREDICTION_LIMIT = 50.0
"""With a model, one run may also take at most this many times the setting's predicted
seconds (never less than `PREDICTION_FLOOR`): a bound before anything is measured
(the model's predictions run 1-5x under the measured times)."""

PREDICTION_FLOOR = 1.0
"""Seconds under which the model's bound never stops a run."""


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
    use_model: bool = True,
) -> SearchResult:
    """Search the knobs of a lowered program on `target` (ranked by the schedule model
    unless `use_model` is False, see `plan`), measuring with `measure`
    under `timing` (`measure_kwargs`: its other options, or timing fields to replace)
    and caching through `cache` (keyed by target fingerprint, `program_key`, setting,
    dtype). `build` defaults to `kernelsat.codegen.build` and receives the setting in
    codegen's form (`codegen_knobs`: one dict per kernel)."""
    if build is None:
        build = codegen_build
    kwargs = dict(measure_kwargs or {})
    build_fn = build
    best = [math.inf]
    learned = learned_model(cache) if use_model else None
    found = plan(lowered, target, budget, seed, use_model, learned)

    def evaluate(setting: Setting) -> Measurement:
        try:
            exe = build_fn(lowered, target.backend, codegen_knobs(lowered, setting))
        except Exception as exc:  # a setting that does not compile is a failed trial
            m = Measurement.failed(f"build failed: {type(exc).__name__}: {exc}")
        else:
            # a setting far slower than the best so far (or than the model predicts) is
            # abandoned after one run
            limit = min(kwargs.get("max_run_seconds", timing.max_run_seconds),
                        abandon_limit(best[0]))
            if found.predict is not None:
                limit = min(limit, max(PREDICTION_LIMIT * found.predict(setting),
                                       PREDICTION_FLOOR))
            m = measure(exe, inputs, out_shape, reference, timing,
                        **{**kwargs, "dtype": dtype, "max_run_seconds": limit})
            if m.ok:
                best[0] = min(best[0], m.median)
        if cache is not None:
            cache.put(target.fingerprint, program_key, setting, dtype, m,
                      features=setting_features(found.model, lowered, setting))
        return m

    def lookup(setting: Setting) -> Measurement | None:
        return cache.get(target.fingerprint, program_key, setting, dtype) if cache else None

    result = search(found.table, evaluate, budget=budget, n_random=n_random, seed=seed,
                    lookup=lookup, max_seconds=max_seconds, ranked=found.ranked,
                    predict=found.predict)
    if learned is not None:  # online update with the settings measured here (one group)
        record_measured(cache.path.parent if cache is not None else None, target,
                        [(lowered, t.setting, t.measurement.median) for t in result.trials
                         if not t.cached and t.measurement.ok])
    return result
