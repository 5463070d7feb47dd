"""A learned cost model: ranks (program, knob setting) pairs by features of their loop nests.

The analytic schedule model (`kernelsat.hardware.schedule_model`) prices each term of a
kernel from assumed per-cycle figures; it tells big kernels from small ones but ranks
equivalent programs of one spec poorly (bench/results/cost_model.md). This model
learns, from measured times, how much each term really costs, and which features the
analytic model leaves out matter (vector tails, strided accesses, footprints that
outgrow a cache, ...).

Features (`feature_vector`, names in `FEATURE_NAMES`) describe one program under one knob
setting, from every kernel's `KernelFeatures`, each made target-relative so that one model
serves targets it was not trained on: times are the analytic model's seconds (the
target's figures divide the work and traffic), footprints are divided by the cache they
should fit, register tiles by the register file, the arithmetic intensity by the
machine balance (peak flops / memory bandwidth), threads by the cores. Per-kernel values
are weighted by the kernel's share of the analytic time; counts (kernels, parallel
regions) are summed.

The model is linear in the features and fitted to log measured seconds *within a group*
(the rows of one spec: programs and settings measured close in time; or one program's
settings): each group's mean feature and mean log time are subtracted, so the machine's
speed that day, or a spec's size, cancels, and only the ranking inside a group is learned.
It is ridge regression pulled towards the analytic model (`PRIOR`: weight 1 on its log
prediction; with few rows the model is the analytic one), kept as sufficient statistics
(the centred Gram matrix and moment vector, summed over groups), so an update with a
new group is exact and cheap: `update` adds the group's statistics, `fit` solves a
d x d system (d = 41). The
predicted log time is `w . x + b` (`b` the mean residual over every row).

Saved as JSON (`save`, `load`) in the cache folder: `<cache dir>/learned_cost.json`
(`model_path`). `optimize` and the knob search use it when the file exists (ranking the
candidates and knob settings before measuring, see `kernelsat.hardware.knobs.plan`) and
add the groups they measure to it; without the file they behave as before.

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> X = rng.normal(size=(300, len(FEATURE_NAMES)))
>>> y = 2.0 * X[:, 0] - X[:, 3] + np.repeat(rng.normal(0, 9, 50), 6)  # + each group's offset
>>> m = LearnedCost().update([(X[i:i + 6], y[i:i + 6]) for i in range(0, 300, 6)])
>>> [round(float(w), 1) for w in m.weights[[0, 3]]]
[2.0, -1.0]
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kernelsat.cachefile import warn
from kernelsat.hardware.schedule_model import (
    FILL,
    ITEM,
    KernelFeatures,
    cost_terms,
    vector_floats,
)
from kernelsat.hardware.targets import Target

MODEL_FILE = "learned_cost.json"
"""The model's file name in the cache folder."""

FORMAT = "kernelsat-learned-cost-1"
"""The file's format tag; a file of another format (or other feature names) is not used."""

RIDGE = 10.0
"""Ridge penalty pulling the weights towards `PRIOR`, in rows: each feature's penalty is
its centred variance per row times `RIDGE` (scale-free; its weight counts as much as
this many rows agreeing with the prior, so more data means less pull). Chosen by the
held-out evaluation (bench/cost_model.py evaluate --ridge)."""

TINY = 1e-12
"""Seconds added under logarithms (a term that is zero)."""

TERMS = ("compute", "l1", "l2", "l3", "dram", "native", "fork", "launch")
"""The analytic model's terms (`cost_terms`), each a share of the predicted time."""

FEATURE_NAMES: tuple[str, ...] = (
    "log_predicted",  # log analytic seconds of the program
    "log_bound",  # log of the largest single term summed over kernels
    *(f"share_{t}" for t in TERMS),  # each term's share of the summed terms
    "log_kernels",
    "log_regions",  # parallel regions entered (loops' and blocked statements')
    "vector_fraction",  # share of ops in vectorised loops
    "lane_use",  # useful lanes of the vectorised work
    "chain_share",  # serial-chain steps / all ops
    "latency_share",  # latency-bound cycles / compute cycles
    "strided_per_op",  # log1p(strided accesses per op)
    "spills",  # time share of kernels whose register tile spills
    "native_spills",
    "log_recompute",
    "trans_per_flop",  # log1p(transcendental calls * penalty per flop)
    "log_intensity",  # log(flops per DRAM byte / machine balance), clipped
    "log_flops",  # log flops per core-second of peak (work, target-relative)
    "log_dram_over_compulsory",  # DRAM traffic / the compulsory bytes
    "log_l2_over_compulsory",
    "log_l1_over_compulsory",
    "log_reg_over_compulsory",
    "threads_share",  # threads / cores
    "balance",
    "log_parallel_extent_per_thread",
    "register_tile",  # accumulator floats / register file floats
    "inner_footprint_l1",  # log(footprint of the innermost level / L1)
    "levels_over_l1",  # share of loop levels whose footprint outgrows L1 (FILL of it)
    "levels_over_l2",
    "levels_over_llc",
    "log_depth",
    "log_inner_extent_per_lane",  # innermost extent / vector width
    "inner_tail",  # unused lanes of the innermost loop's last vector
    "log_outer_extent",
    "native_share",  # time share of kernels with blocked statements (GEMM, attention)
    "bias",  # 1 (ignored by the within-group fit; kept for the offset's residual)
)


PRIOR = np.array([1.0 if n == "log_predicted" else 0.0 for n in FEATURE_NAMES])
"""The weights the fit is pulled towards: the analytic model's ranking."""


def _log(x: float) -> float:
    return math.log(max(float(x), TINY))


def _kernel_row(f: KernelFeatures, target: Target) -> tuple[float, dict[str, float]]:
    """(analytic seconds, per-kernel features) of one kernel."""
    terms = cost_terms(f, target)
    seconds = (max(terms["compute"], terms["l1"], terms["l2"], terms["l3"], terms["dram"])
               + terms["native"] + terms["fork"] + terms["launch"])
    width = max(f.vector_width, vector_floats(target), 1)
    ops = f.vector_flops + f.scalar_flops + f.chain_ops
    freq = target.frequency_hz
    per_cycle = target.peak_fp32 / max(target.units, 1) / freq
    cycles = max(f.vector_flops / per_cycle + f.scalar_flops * width / per_cycle, 1.0)
    balance_machine = target.peak_fp32 / max(target.mem_bandwidth, 1.0)
    intensity = f.flops / f.dram_bytes if f.dram_bytes else 1e6
    compulsory = max(f.compulsory_bytes, float(ITEM))
    caches = (target.shared_mem_per_unit, target.l2_bytes, target.llc_bytes)
    levels = max(len(f.footprints), 1)
    inner = f.extents[-1] if f.extents else 1
    row = {
        "vector_fraction": f.vector_fraction,
        "lane_use": f.lane_use,
        "chain_share": f.chain_ops / ops if ops else 0.0,
        "latency_share": min(f.latency_cycles / cycles, 10.0),
        "strided_per_op": math.log1p(f.strided_accesses / max(ops, 1.0)),
        "spills": float(f.spills),
        "native_spills": float(f.native_spills),
        "log_recompute": math.log(max(f.recompute, 1e-3)),
        "trans_per_flop": math.log1p(f.transcendentals * target.transcendental_penalty
                                     / max(f.flops, 1.0)),
        "log_intensity": max(-10.0, min(10.0, math.log(max(intensity, 1e-9)
                                                        / balance_machine))),
        "log_dram_over_compulsory": _log(max(f.dram_bytes, f.native_dram_bytes) / compulsory),
        "log_l2_over_compulsory": _log((f.l2_fill_bytes + f.native_l3_bytes) / compulsory
                                       + 1e-3),
        "log_l1_over_compulsory": _log((f.l1_fill_bytes + f.native_l2_bytes) / compulsory
                                       + 1e-3),
        "log_reg_over_compulsory": _log(f.register_bytes / compulsory + 1e-3),
        "threads_share": f.threads / max(target.units, 1),
        "balance": f.balance,
        "log_parallel_extent_per_thread": math.log(max(f.parallel_extent, 1)
                                                   / max(f.threads, 1)),
        "register_tile": f.register_floats / max(target.registers_per_unit, 1),
        "inner_footprint_l1": (_log(f.footprints[-1] / target.shared_mem_per_unit)
                               if f.footprints else _log(ITEM / target.shared_mem_per_unit)),
        "log_depth": math.log1p(len(f.extents)),
        "log_inner_extent_per_lane": math.log(max(inner, 1) / width),
        "inner_tail": 1.0 - inner / (math.ceil(inner / width) * width),
        "log_outer_extent": math.log(max(f.extents[0], 1)) if f.extents else 0.0,
        "native_share": 1.0 if f.native_cycles or f.native_dram_bytes else 0.0,
    }
    for name, cache in zip(("levels_over_l1", "levels_over_l2", "levels_over_llc"), caches,
                           strict=True):
        row[name] = sum(1 for b in f.footprints if b > FILL * cache) / levels
    for t in TERMS:
        row[f"term_{t}"] = terms[t]
    row["flops"] = f.flops
    row["regions"] = f.regions + f.native_regions
    return seconds, row


def feature_vector(kernels: Sequence[KernelFeatures | Mapping[str, Any]], target: Target
                   ) -> np.ndarray:
    """The features (`FEATURE_NAMES` order) of one program under one setting: its
    kernels' features (or their `as_dict` form, as the measurement cache keeps them)."""
    feats = [k if isinstance(k, KernelFeatures) else KernelFeatures.from_dict(k)
             for k in kernels]
    if not feats:
        feats = [KernelFeatures()]
    rows = [_kernel_row(f, target) for f in feats]
    total = sum(s for s, _ in rows)
    weights = [s / total if total > 0 else 1.0 / len(rows) for s, _ in rows]

    def mean(name: str) -> float:
        return float(sum(w * r[name] for w, (_, r) in zip(weights, rows, strict=True)))

    term_sums = {t: sum(r[f"term_{t}"] for _, r in rows) for t in TERMS}
    all_terms = sum(term_sums.values())
    bound = sum(max(r[f"term_{t}"] for t in ("compute", "l1", "l2", "l3", "dram", "native"))
                for _, r in rows)
    flops = sum(r["flops"] for _, r in rows)
    out: dict[str, float] = {
        "log_predicted": _log(total),
        "log_bound": _log(bound),
        **{f"share_{t}": term_sums[t] / all_terms if all_terms else 0.0 for t in TERMS},
        "log_kernels": math.log(len(feats)),
        "log_regions": math.log1p(sum(r["regions"] for _, r in rows)),
        "log_flops": _log(flops / target.peak_fp32 + TINY),
        "bias": 1.0,
    }
    for name in FEATURE_NAMES:
        if name not in out:
            out[name] = mean(name)
    return np.array([out[n] for n in FEATURE_NAMES], dtype=np.float64)


# -- the model ----------------------------------------------------------------------------


Group = tuple[np.ndarray, np.ndarray]
"""One group's rows: features (n x d) and log measured seconds (n)."""


@dataclass
class LearnedCost:
    """Within-group ridge regression of log seconds on `FEATURE_NAMES`, kept as
    sufficient statistics (see the module docstring)."""

    gram: np.ndarray = field(default_factory=lambda: np.zeros((len(FEATURE_NAMES),) * 2))
    moment: np.ndarray = field(default_factory=lambda: np.zeros(len(FEATURE_NAMES)))
    sum_x: np.ndarray = field(default_factory=lambda: np.zeros(len(FEATURE_NAMES)))
    sum_y: float = 0.0
    rows: int = 0
    groups: int = 0
    weights: np.ndarray = field(default_factory=lambda: np.zeros(len(FEATURE_NAMES)))
    offset: float = 0.0
    trained_on: list[str] = field(default_factory=list)  # target fingerprints

    def update(self, groups: Iterable[Group], fingerprint: str = "") -> LearnedCost:
        """Add groups (each: features n x d, log seconds n; groups of one row carry no
        ranking and only move the offset) and refit. Returns self."""
        for x, y in groups:
            x, y = np.atleast_2d(np.asarray(x, float)), np.asarray(y, float).reshape(-1)
            keep = np.isfinite(y) & np.all(np.isfinite(x), axis=1)
            x, y = x[keep], y[keep]
            if len(y) == 0:
                continue
            xc, yc = x - x.mean(axis=0), y - y.mean()
            self.gram += xc.T @ xc
            self.moment += xc.T @ yc
            self.sum_x += x.sum(axis=0)
            self.sum_y += float(y.sum())
            self.rows += len(y)
            self.groups += len(y) > 1
        if fingerprint and fingerprint not in self.trained_on:
            self.trained_on.append(fingerprint)
        return self.fit()

    def fit(self, ridge: float = RIDGE) -> LearnedCost:
        """Solve the ridge system from the statistics: the weights are pulled towards
        `PRIOR` (the analytic model: log seconds = its log prediction), each by `ridge`
        times the feature's centred variance per row (so feature scales do not matter).
        With few rows the model is the analytic one; measured groups correct it."""
        diag = np.diag(self.gram).copy()
        scale = np.where(diag > 1e-12, diag, 1.0) / max(self.rows, 1)
        penalty = ridge * scale + 1e-9 * max(float(diag.max(initial=0.0)), 1.0)
        prior = np.where(diag > 1e-12, PRIOR, 0.0)
        self.weights = np.linalg.solve(self.gram + np.diag(penalty),
                                       self.moment + penalty * prior)
        self.weights[diag <= 1e-12] = 0.0  # a feature constant within every group
        self.offset = ((self.sum_y - float(self.weights @ self.sum_x)) / self.rows
                       if self.rows else 0.0)
        return self

    @property
    def trained(self) -> bool:
        """Whether any group with more than one row was seen."""
        return self.groups > 0

    def score(self, x: np.ndarray) -> np.ndarray:
        """Predicted log seconds of feature rows (n x d) or one row (d)."""
        return np.asarray(x, float) @ self.weights + self.offset

    def seconds(self, kernels: Sequence[KernelFeatures | Mapping[str, Any]], target: Target
                ) -> float:
        """Predicted seconds of one program under one setting (its kernels' features)."""
        return float(math.exp(float(self.score(feature_vector(kernels, target)))))

    # -- the file ---------------------------------------------------------------------

    def as_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "features": list(FEATURE_NAMES),
                "gram": self.gram.tolist(), "moment": self.moment.tolist(),
                "sum_x": self.sum_x.tolist(), "sum_y": self.sum_y, "rows": self.rows,
                "groups": self.groups, "trained_on": list(self.trained_on),
                "weights": dict(zip(FEATURE_NAMES, self.weights.tolist(), strict=True)),
                "offset": self.offset}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> LearnedCost:
        """Inverse of `as_json`; `ModelFileError` for another format or feature list."""
        if data.get("format") != FORMAT:
            raise ModelFileError(f"format {data.get('format')!r}, expected {FORMAT!r}")
        if tuple(data.get("features", ())) != FEATURE_NAMES:
            raise ModelFileError("its feature list differs from this version's "
                                 "(retrain: bench/cost_model.py train)")
        d = len(FEATURE_NAMES)
        try:
            gram = np.array(data["gram"], float).reshape(d, d)
            model = LearnedCost(gram, np.array(data["moment"], float).reshape(d),
                                np.array(data["sum_x"], float).reshape(d),
                                float(data["sum_y"]), int(data["rows"]), int(data["groups"]),
                                trained_on=[str(t) for t in data.get("trained_on", [])])
        except (KeyError, TypeError, ValueError) as e:
            raise ModelFileError(f"malformed: {type(e).__name__}: {e}") from None
        return model.fit()


class ModelFileError(ValueError):
    """A model file that cannot be used (another format, damaged)."""


def model_path(folder: str | Path) -> Path:
    """The model file in a cache folder."""
    return Path(folder) / MODEL_FILE


def load(path: str | Path) -> LearnedCost:
    """Read a model file (`ModelFileError` naming the file when it cannot be used;
    `FileNotFoundError` when it does not exist)."""
    path = Path(path)
    text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ModelFileError(f"{path}:{e.lineno}:{e.colno}: not JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{path}: expected a JSON object")
    try:
        return LearnedCost.from_json(data)
    except ModelFileError as e:
        raise ModelFileError(f"{path}: {e}") from None


def load_if_present(folder: str | Path | None) -> LearnedCost | None:
    """The trained model in a cache folder, or None when there is none, it is unusable
    (a warning names the file) or it has seen no group."""
    if folder is None:
        return None
    path = model_path(folder)
    try:
        model = load(path)
    except FileNotFoundError:
        return None
    except (OSError, ModelFileError) as e:
        warn(f"learned cost model not used: {e}")
        return None
    return model if model.trained else None


def save(model: LearnedCost, path: str | Path) -> None:
    """Write the model atomically (a temporary file renamed over the old one)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".learned_cost.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(model.as_json(), f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def add_measurements(folder: str | Path, groups: Sequence[Group], fingerprint: str) -> bool:
    """Online update: re-read the model file in `folder` (another process may have
    updated it), add `groups` and save. Nothing happens when there is no usable model
    file (without one, behaviour is as before). Returns whether it was updated. Two
    processes updating at the same moment may lose one of the two updates (never the
    file)."""
    model = load_if_present(folder)
    if model is None or not any(len(y) > 1 for _, y in groups):
        return False
    model.update(groups, fingerprint)
    try:
        save(model, model_path(folder))
    except OSError as e:
        warn(f"learned cost model {model_path(folder)} not updated: {e}")
        return False
    return True


__all__ = ["FEATURE_NAMES", "LearnedCost", "ModelFileError", "add_measurements",
           "feature_vector", "load", "load_if_present", "model_path", "save"]
