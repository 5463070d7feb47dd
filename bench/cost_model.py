"""The learned cost model's data, training and held-out evaluation (issue 19 part 3).

    .venv/bin/python bench/cost_model.py collect  [--cache-dir DIR] [--only NAME ...]
    .venv/bin/python bench/cost_model.py train    [--cache-dir DIR]
    .venv/bin/python bench/cost_model.py evaluate [--cache-dir DIR] [--out FILE]

`collect` measures many (program, knob setting) pairs per spec and stores them, with
their loop-nest features, in the measurement cache of DIR (`<DIR>/measure.sqlite`, the
same cache `optimize --cache-dir DIR` uses; default: kernelsat's cache folder). For each
spec (a subset of specs/, `--only` to choose), at reduced sizes (every parameter above 8
set to the largest of `SIZES` whose program does at most `--max-flops` flops): saturate
and extract as `optimize` does (its extractors and store variants), keep the eager
program and up to `--programs` others the roofline estimate puts within
`PRUNE_FACTOR` of it, and for each the default knob setting, the schedule model's best
and random ones (`--settings` in all, distinct code only). Every executable of one spec
is then timed interleaved (`measure_interleaved`: A B C ... A B C ...), so the machine's
load that minute lands on all of them alike and the ranking within the spec holds on a
noisy machine. A spec already collected (rows tagged with its label in the cache) is
skipped: the command resumes.

`train` fits the model on every collected spec and writes `<DIR>/learned_cost.json`
(`kernelsat.hardware.learned`); `optimize --cache-dir DIR` then uses it. `evaluate`
leaves each spec out in turn (trains on the others, predicts the held-out one) and
writes a Markdown table (default bench/results/cost_model.md): per spec the within-spec
Spearman rank correlation of measured times with the learned model, the schedule model
(`schedule_model.predict`) and the roofline (`cost.estimate` of the lowered program,
one figure for all settings of a program), and the measured slowdown of each model's
top pick against the fastest row; with the load average and the collection dates.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kernelsat.codegen import build
from kernelsat.codegen.lower import LoweredProgram, lower
from kernelsat.driver import pipeline
from kernelsat.driver.jobs import program_key
from kernelsat.driver.pipeline import PRUNE_FACTOR, Options, lowered_estimate
from kernelsat.extract.base import RooflineCost
from kernelsat.hardware.cache import MeasureCache, Sample, knobs_key
from kernelsat.hardware.config import cache_dir as default_cache_dir
from kernelsat.hardware.cost import rank_correlation
from kernelsat.hardware.knobs import (
    Setting,
    codegen_knobs,
    default_setting,
    plan,
    ranking_target,
    setting_features,
)
from kernelsat.hardware.learned import (
    FEATURE_NAMES,
    RIDGE,
    LearnedCost,
    feature_vector,
    model_path,
    save,
)
from kernelsat.hardware.measure import TIMING, measure_interleaved
from kernelsat.hardware.schedule_model import ScheduleModel
from kernelsat.hardware.targets import Target, get_target
from kernelsat.inputs import random_inputs
from kernelsat.interp import evaluate_as
from kernelsat.program import Program
from kernelsat.proofs.library import load_library
from kernelsat.spec import load_spec
from kernelsat.work import term_flops

ROOT = Path(__file__).resolve().parents[1]

SPECS = ("softmax", "layernorm", "rmsnorm", "logsumexp", "l2norm", "variance",
         "batchnorm", "groupnorm", "instancenorm", "cross_entropy", "causal_softmax",
         "matmul_bias_gelu", "swiglu", "mlp2", "attention", "gemv", "rowsum", "rope",
         "scaled_residual", "conv2d_3x3", "act_mish", "global_avgpool",
         "matmul", "bmm", "conv1d", "conv2d_1x1", "conv2d_depthwise", "avgpool2d",
         "maxpool2d", "elementwise", "channel_scale", "rowmean_keepdim", "tril_matmul",
         "attention_packed", "act_softplus", "act_hardswish", "diff1d", "relu6_where",
         "sliding_window_attention", "cat_features")
"""The specs collected by default (a spread of norms, reductions, GEMM epilogues,
attention, convolutions and elementwise chains)."""

SIZES = (512, 384, 256, 192, 128, 96, 64, 48, 32, 16)
"""Sizes tried, largest first, for every spec parameter above 8 (those of at most 8
become 2, as `kernelsat.testing.small_spec` does)."""

TIMING_COLLECT = replace(TIMING["optimize"], min_runs=7, min_seconds=0.05, max_seconds=40.0,
                         max_run_seconds=0.5, warmup=1)
"""Interleaved rounds of one spec: at least 7 runs and 50 ms of each executable, at most
40 s for the spec; an executable whose run takes over 0.5 s is dropped."""


MANY_ROWS = 10
"""Specs with at least this many rows get a mean of their own in the table (a rank
correlation over 4 rows moves in steps of 0.2)."""


@dataclass
class Row:
    lowered: LoweredProgram
    setting: Setting
    features: dict[str, Any]
    exe: Any
    label: str  # the program's key in the cache


def small_program(name: str, max_flops: float) -> tuple[Program, str]:
    """The spec at the largest of `SIZES` under `max_flops`, and its label (name@size)."""
    path = ROOT / "specs" / f"{name}.ks"
    params = load_spec(str(path)).params
    last: tuple[Program, str] | None = None
    for s in SIZES:
        try:
            prog = load_spec(str(path), {k: (2 if int(v) <= 8 else s) for k, v in params.items()})
        except ValueError:
            continue
        last = (prog, f"{name}@{s}")
        if term_flops(prog.term) <= max_flops:
            break
    if last is None:
        raise SystemExit(f"{path}: no size of {SIZES} is accepted")
    return last


def settings_for(lowered: LoweredProgram, target: Target, count: int, seed: int
                 ) -> list[Setting]:
    """The default setting, the schedule model's best ones and random ones (`count` in
    all at most, half ranked, half random)."""
    found = plan(lowered, target, max(count, 1), seed)
    out = [default_setting(found.table)]
    ranked = list(found.ranked or [])
    rng = random.Random(seed)
    randoms = [{k: {n: rng.choice(list(v)) for n, v in knobs.items()}
                for k, knobs in found.table.items()} for _ in range(4 * count)]
    for s in [*ranked[: max(1, count // 2)], *randoms, *ranked[count // 2:]]:
        if len(out) >= count:
            break
        if s not in out:
            out.append(s)
    return out


def collect_spec(name: str, target: Target, cache: MeasureCache, args: argparse.Namespace,
                 library: Any) -> str:
    program, label = small_program(name, args.max_flops)
    run = time.time()  # a spec measured again (--again): only its latest run is used
    opts = Options(target=target, seconds=60.0, sat_seconds=args.sat_seconds,
                   nodes=args.nodes, samples=8, ilp_seconds=3.0, seed=args.seed)
    sat = pipeline.saturate_program(program, library, opts)
    # the candidates optimize proposes (its extractors and store variants)
    cands = pipeline._extract(program, sat, opts, RooflineCost.for_target(target),
                              lambda stage, msg: None, target)
    for c in cands:
        c.estimate = lowered_estimate(c.term, program, target)
    eager = cands[0]
    rest = sorted((c for c in cands[1:] if c.estimate <= PRUNE_FACTOR * eager.estimate),
                  key=lambda c: c.estimate)
    # spread over the estimate's order (the cheapest often tie: fused and partial forms)
    picks = sorted({round(float(i)) for i in np.linspace(0, len(rest) - 1,
                                                         min(len(rest), args.programs - 1))})
    chosen = [eager, *(rest[i] for i in picks)] if rest else [eager]
    rows: list[Row] = []
    seen_sources: set[str] = set()
    for c in chosen:
        try:
            lowered = lower(c.term, program.out_axes)
        except Exception as e:  # a candidate that does not lower is no data
            print(f"  {label}: lowering failed: {type(e).__name__}: {str(e)[:80]}")
            continue
        model = ScheduleModel(lowered, ranking_target(target))
        key = program_key(target, lowered)
        for setting in settings_for(lowered, target, args.settings, args.seed):
            try:
                exe = build(lowered, target.backend, codegen_knobs(lowered, setting),
                            cache_dir=Path(args.cache_dir) / target.backend)
            except Exception as e:  # a setting that does not build is no data
                print(f"  {label}: build failed: {type(e).__name__}: {str(e)[:80]}")
                continue
            if exe.source in seen_sources:
                continue
            seen_sources.add(exe.source)
            feats = setting_features(model, lowered, setting) or {}
            feats.update(spec=label, estimate=c.estimate, methods=c.methods,
                         load=os.getloadavg()[0], run=run)
            rows.append(Row(lowered, setting, feats, exe, key))
    env64 = random_inputs(program, seed=args.seed)
    reference = evaluate_as(program.term, env64, program.out_axes)
    env = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in env64.items()}
    ms = measure_interleaved([r.exe for r in rows], env, tuple(reference.shape), reference,
                             TIMING_COLLECT)
    for r, m in zip(rows, ms, strict=True):
        cache.put(target.fingerprint, r.label, r.setting, "float32", m, features=r.features)
    ok = [m for m in ms if m.ok]
    return (f"{label}: {len(chosen)} programs, {len(rows)} rows, {len(ok)} ok"
            + (f", {min(m.median for m in ok) * 1e3:.3f}-{max(m.median for m in ok) * 1e3:.3f}"
               " ms" if ok else ""))


def collected(samples: Sequence[Sample]) -> dict[str, list[Sample]]:
    """The collected rows by spec label, of each spec's latest collection run only
    (rows of one run were timed interleaved; an older run's were not timed with them)."""
    out: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        if isinstance(s.features, Mapping) and "spec" in s.features:
            out[str(s.features["spec"])].append(s)
    for label, rows in out.items():
        latest = max(float(r.features.get("run", 0.0)) for r in rows)
        out[label] = [r for r in rows if float(r.features.get("run", 0.0)) == latest]
    return out


def collect(args: argparse.Namespace) -> None:
    target = get_target("c")
    names = args.only or list(SPECS)
    library = load_library()
    with MeasureCache(Path(args.cache_dir) / "measure.sqlite", replay=True) as cache:
        done = {label.split("@")[0] for label in collected(cache.samples(target.fingerprint))}
        for name in names:
            if name in done and not args.again:
                print(f"{name}: collected before (skipped; --again to measure again)")
                continue
            t0 = time.monotonic()
            try:
                line = collect_spec(name, target, cache, args, library)
            except Exception as e:  # one spec failing never stops the collection
                line = f"{name}: failed: {type(e).__name__}: {str(e)[:200]}"
            print(f"{line} ({time.monotonic() - t0:.0f} s, load {os.getloadavg()[0]:.1f})",
                  flush=True)


# -- training and evaluation ----------------------------------------------------------------


@dataclass
class SpecData:
    label: str
    x: np.ndarray
    y: np.ndarray  # log measured seconds
    schedule: np.ndarray  # the schedule model's predicted seconds
    roofline: np.ndarray  # the roofline estimate of the lowered program
    programs: int
    load: float
    keys: list[tuple[str, Any]]  # (program key, knob setting) of each row


def spec_data(cache: MeasureCache, target: Target) -> list[SpecData]:
    samples = cache.samples(target.fingerprint)
    out = []
    rt = ranking_target(target)
    for label, rows in sorted(collected(samples).items()):
        rows = [r for r in rows if r.ok and math.isfinite(r.median) and r.median > 0]
        if len(rows) < 2:
            continue
        out.append(SpecData(
            label,
            np.array([feature_vector(r.features["kernels"], rt) for r in rows]),
            np.log([r.median for r in rows]),
            np.array([float(r.features.get("predicted", math.nan)) for r in rows]),
            np.array([float(r.features.get("estimate", math.nan)) for r in rows]),
            len({r.program for r in rows}),
            float(np.mean([float(r.features.get("load", math.nan)) for r in rows])),
            [(r.program, r.knobs) for r in rows]))
    return out


def program_groups(cache: MeasureCache, target: Target) -> list[tuple[np.ndarray, np.ndarray]]:
    """The knob settings of each program the knob search measured in this cache (rows
    with features but no collection tag: `optimize --cache-dir DIR` runs), one group per
    program."""
    rt = ranking_target(target)
    by: dict[str, list[Sample]] = defaultdict(list)
    for s in cache.samples(target.fingerprint):
        if (isinstance(s.features, Mapping) and "spec" not in s.features
                and "kernels" in s.features and s.ok and s.median > 0):
            by[s.program].append(s)
    return [(np.array([feature_vector(r.features["kernels"], rt) for r in rows]),
             np.log([r.median for r in rows])) for rows in by.values() if len(rows) > 1]


def train(args: argparse.Namespace) -> None:
    target = get_target("c")
    with MeasureCache(Path(args.cache_dir) / "measure.sqlite") as cache:
        data = spec_data(cache, target)
        knob_groups = program_groups(cache, target)
    if not data and not knob_groups:
        raise SystemExit(f"no measured rows with features in {args.cache_dir}: run "
                         "`collect` first")
    model = LearnedCost().update([*((d.x, d.y) for d in data), *knob_groups],
                                 target.fingerprint)
    save(model, model_path(args.cache_dir))
    print(f"trained on {len(data)} collected specs and {len(knob_groups)} knob searches, "
          f"{model.rows} rows: {model_path(args.cache_dir)}")


def top_slowdown(pred: np.ndarray, y: np.ndarray) -> float:
    """Measured time of the best-predicted row over the fastest row's (NaN when the
    prediction is the same for every row: no pick)."""
    finite = np.isfinite(pred)
    if not finite.any() or np.ptp(pred[finite]) == 0:
        return math.nan
    pick = int(np.argmin(np.where(finite, pred, np.inf)))
    return float(math.exp(y[pick] - y.min()))


def _same_program(key: str) -> str:
    """A program key less the code generator's version (`program_key`: backend, version,
    lowered key): the same lowered program collected again after codegen changed."""
    backend, _, rest = key.partition(":")
    return f"{backend}:{rest.partition(':')[2]}"


def repeat_rho(held: SpecData, cache: MeasureCache, again: MeasureCache, fingerprint: str
               ) -> tuple[float, int]:
    """Spearman's rho between a spec's times and the same (lowered program, setting)
    rows timed again in another cache (a copy of this one collected again: rows whose
    timestamp or code generator version changed), and how many rows were: how well one
    measurement ranks another, the ceiling for a model."""
    later = {(_same_program(s.program), knobs_key(s.knobs)): s
             for s in again.samples(fingerprint) if s.ok and s.median > 0}
    first, second = [], []
    for y, (program, knobs) in zip(held.y, held.keys, strict=True):
        s = later.get((_same_program(program), knobs_key(knobs)))
        if s is None:
            continue
        before = cache.timestamp(fingerprint, program, knobs, "float32")
        after = again.timestamp(fingerprint, s.program, s.knobs, "float32")
        if s.program != program or after != before:
            first.append(float(y))
            second.append(math.log(s.median))
    return (rank_correlation(first, second) if len(first) >= 4 else math.nan), len(first)


def evaluate(args: argparse.Namespace) -> None:
    target = get_target("c")
    cache = MeasureCache(Path(args.cache_dir) / "measure.sqlite")
    again = MeasureCache(Path(args.repeat) / "measure.sqlite") if args.repeat else None
    data = spec_data(cache, target)
    if len(data) < 2:
        raise SystemExit(f"{len(data)} collected specs in {args.cache_dir}: need 2 or more")
    lines = []
    stats: dict[str, list[float]] = defaultdict(list)
    for held in data:
        model = LearnedCost().update([(d.x, d.y) for d in data if d is not held]
                                     ).fit(args.ridge)
        learned = model.score(held.x)
        times = np.exp(held.y)
        rho = {"learned": rank_correlation(list(learned), list(times)),
               "schedule": rank_correlation(list(held.schedule), list(times)),
               "roofline": rank_correlation(list(held.roofline), list(times))}
        slow = {"learned": top_slowdown(learned, held.y),
                "schedule": top_slowdown(np.log(held.schedule), held.y),
                "roofline": top_slowdown(held.roofline, held.y)}
        for k in rho:
            stats[f"rho_{k}"].append(rho[k])
            stats[f"slow_{k}"].append(slow[k])
        rep, rows = (repeat_rho(held, cache, again, target.fingerprint) if again is not None
                     else (math.nan, 0))
        stats["rho_repeat"].append(rep)
        if len(held.y) >= MANY_ROWS:
            for k in rho:
                stats[f"many_{k}"].append(rho[k])
        lines.append(
            f"| {held.label} | {len(held.y)} | {held.programs} | "
            f"{np.exp(held.y.min()) * 1e3:.3f}-{np.exp(held.y.max()) * 1e3:.3f} | "
            + " | ".join(_fmt(rho[k]) for k in rho) + " | "
            + " | ".join("-" if math.isnan(slow[k]) else f"{slow[k]:.2f}x" for k in slow)
            + f" | {held.load:.1f} | "
            + (f"{_fmt(rep)} ({rows})" if rows else "-") + " |")

    def avg(key: str) -> str:
        v = [x for x in stats[key] if math.isfinite(x)]
        return _fmt(float(np.mean(v))) if v else "-"

    def med(key: str) -> str:
        v = [x for x in stats[key] if math.isfinite(x)]
        return _fmt(float(np.median(v))) if v else "-"

    def geo(key: str) -> str:
        v = [x for x in stats[key] if math.isfinite(x)]
        return f"{math.exp(float(np.mean(np.log(v)))):.2f}x" if v else "-"

    full = LearnedCost().update([(d.x, d.y) for d in data])
    spread = np.sqrt(np.diag(full.gram) / max(full.rows, 1))  # within-group std per feature
    top = sorted(zip(full.weights * spread, range(len(full.weights)), strict=True),
                 key=lambda p: -abs(p[0]))[:10]
    text = "\n".join([
        "# Learned cost model: held-out specs",
        "",
        f"Written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        "`bench/cost_model.py evaluate` on target "
        f"{target.name} ({target.model}, fingerprint {target.fingerprint[:12]}); load "
        f"average now {os.getloadavg()[0]:.1f} (the machine has {os.cpu_count()} cores, "
        "shared with other work; each spec's rows were timed interleaved; the load "
        "column is the 1-minute load average while the spec was collected).",
        "",
        "Leave-one-spec-out: for each spec the model is trained on the other specs' rows "
        "only, then ranks the held-out spec's (program, knob setting) rows. rho: Spearman "
        "rank correlation with the measured times within the spec (1 = same order). "
        "top pick: measured time of the row each model ranks first over the fastest "
        "row's. The schedule model is `schedule_model.predict`; the roofline is "
        "`cost.estimate` of the lowered program (one figure for every setting of a "
        "program: ties; '-' where it gives every row of the spec the same figure). "
        "rho repeat: the same rows timed again in a second collection (another hour, "
        "another load), ranked against the first: the ceiling for any model on this "
        "machine ('-' where not repeated).",
        "",
        "| spec@size | rows | programs | measured ms | rho learned | rho schedule model "
        "| rho roofline | top pick learned | top pick schedule | top pick roofline "
        "| load | rho repeat (rows) |",
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *lines,
        f"| **mean** | {sum(len(d.y) for d in data)} | {sum(d.programs for d in data)} | | "
        f"{avg('rho_learned')} | {avg('rho_schedule')} | {avg('rho_roofline')} | "
        f"{geo('slow_learned')} | {geo('slow_schedule')} | {geo('slow_roofline')} | | "
        f"{avg('rho_repeat')} |",
        f"| **median** | | | | {med('rho_learned')} | {med('rho_schedule')} | "
        f"{med('rho_roofline')} | | | | | {med('rho_repeat')} |",
        f"| **mean, specs of {MANY_ROWS}+ rows** | | {len(stats['many_learned'])} specs | | "
        f"{avg('many_learned')} | {avg('many_schedule')} | {avg('many_roofline')} "
        "| | | | | |",
        "",
        "Largest effects in the model trained on every spec (weight x the feature's "
        "within-group standard deviation: log-time change per standard deviation): "
        + ", ".join(f"{FEATURE_NAMES[i]} {w:+.2f}" for w, i in top) + ".",
        "",
    ])
    cache.close()
    if again is not None:
        again.close()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)


def _fmt(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{x:+.2f}"


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("collect", "train", "evaluate"))
    p.add_argument("--cache-dir", default=str(default_cache_dir()))
    p.add_argument("--only", nargs="*", default=None, help="spec names (default: SPECS)")
    p.add_argument("--programs", type=int, default=6)
    p.add_argument("--settings", type=int, default=4)
    p.add_argument("--max-flops", type=float, default=2e7)
    p.add_argument("--sat-seconds", type=float, default=8.0)
    p.add_argument("--nodes", type=int, default=12_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ridge", type=float, default=RIDGE, help="evaluate: the ridge penalty")
    p.add_argument("--again", action="store_true", help="measure collected specs again")
    p.add_argument("--repeat", default=None, help="evaluate: a copy of the cache folder "
                   "collected again (--again), for the repeatability column")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "cost_model.md"))
    args = p.parse_args(argv)
    {"collect": collect, "train": train, "evaluate": evaluate}[args.command](args)


if __name__ == "__main__":
    main(sys.argv[1:])
