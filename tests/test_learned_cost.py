"""The learned cost model (kernelsat.hardware.learned): fitting, the file, the features of
every loop-nest form, its use in the knob search and in optimize."""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernelsat import optimize
from kernelsat.codegen.lower import lower
from kernelsat.hardware.cache import MeasureCache
from kernelsat.hardware.cost import rank_correlation
from kernelsat.hardware.knobs import (
    codegen_knobs,
    learned_seconds,
    plan,
    ranking_target,
    record_measured,
    setting_features,
)
from kernelsat.hardware.learned import (
    FEATURE_NAMES,
    LearnedCost,
    ModelFileError,
    feature_vector,
    load,
    load_if_present,
    model_path,
    save,
)
from kernelsat.hardware.measure import Measurement
from kernelsat.hardware.schedule_model import ScheduleModel, predict
from kernelsat.hardware.targets import get_target
from kernelsat.ir import In, Max, Sum, Term, div, exp, sub
from kernelsat.testing import programs, small_spec

ROOT = Path(__file__).resolve().parents[1]
D = len(FEATURE_NAMES)


def synthetic(seed: int, groups: int, per: int, noise: float = 0.05
              ) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Groups whose log time is a fixed linear function of the features plus a large
    offset of the group (the day's machine speed, the spec's size) and noise."""
    rng = np.random.default_rng(seed)
    true = np.zeros(D)
    true[[0, 3, 7, 12]] = [1.0, -2.0, 0.5, 1.5]
    out = []
    for _ in range(groups):
        x = rng.normal(size=(per, D))
        y = x @ true + rng.normal(0, 50) + rng.normal(0, noise, per)
        out.append((x, y))
    return out, true


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 8))
def test_training_recovers_a_known_ordering_on_held_out_groups(seed: int, per: int) -> None:
    train, _ = synthetic(seed, -(-300 // (per - 1)), per)  # 300 within-group differences
    test, _ = synthetic(seed + 1, 10, 8, noise=0.0)
    model = LearnedCost().update(train)
    for x, y in test:
        s = model.score(x)
        assert rank_correlation(list(s), list(y)) > 0.85
        # every pair whose true times differ by more than 1.5x is ordered right
        for i in range(len(y)):
            for j in range(len(y)):
                if y[i] - y[j] > math.log(1.5):
                    assert s[i] > s[j]


def test_offsets_between_groups_do_not_leak_into_the_ranking() -> None:
    """Two groups whose times differ only by a constant: the within-group fit learns
    nothing from the difference (a feature that only tells groups apart gets weight 0)."""
    x1 = np.zeros((4, D))
    x1[:, 0] = [1, 2, 3, 4]
    x2 = x1.copy()
    x2[:, 1] = 5.0  # constant inside each group, differs between them
    y1 = np.array([1.0, 2, 3, 4])
    model = LearnedCost().update([(x1, y1), (x2, y1 + 100)])
    assert model.weights[1] == 0.0
    assert model.weights[0] > 0.9


def test_update_in_parts_equals_update_at_once() -> None:
    groups, _ = synthetic(3, 12, 5)
    whole = LearnedCost().update(groups)
    parts = LearnedCost().update(groups[:5]).update(groups[5:])
    assert np.allclose(whole.weights, parts.weights)
    assert math.isclose(whole.offset, parts.offset)
    assert (whole.rows, whole.groups) == (parts.rows, parts.groups) == (60, 12)


def test_rows_with_nan_are_left_out_and_single_rows_carry_no_ranking() -> None:
    x = np.ones((3, D))
    model = LearnedCost().update([(x, np.array([1.0, math.nan, 2.0])), (x[:1], np.ones(1))])
    assert model.rows == 3 and model.groups == 1
    assert not LearnedCost().update([(x[:1], np.ones(1))]).trained


def test_save_load_round_trip(tmp_path: Path) -> None:
    groups, _ = synthetic(5, 10, 4)
    model = LearnedCost().update(groups, "fp-1")
    save(model, model_path(tmp_path))
    back = load(model_path(tmp_path))
    assert np.allclose(back.weights, model.weights) and back.offset == pytest.approx(model.offset)
    assert back.trained_on == ["fp-1"] and back.rows == model.rows
    x = groups[0][0]
    assert np.allclose(back.score(x), model.score(x))
    assert load_if_present(tmp_path) is not None


@pytest.mark.parametrize("text, why", [
    ("{not json", "not JSON"),
    ("[1, 2]", "expected a JSON object"),
    (json.dumps({"format": "other"}), "format 'other'"),
    (json.dumps({"format": "kernelsat-learned-cost-1", "features": ["a"]}),
     "feature list differs"),
    (json.dumps({"format": "kernelsat-learned-cost-1", "features": list(FEATURE_NAMES),
                 "gram": [1, 2]}), "malformed"),
])
def test_unusable_model_files_are_named_and_ignored(tmp_path: Path, text: str, why: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    path = model_path(tmp_path)
    path.write_text(text)
    with pytest.raises(ModelFileError, match=why) as info:
        load(path)
    assert str(path) in str(info.value)
    assert load_if_present(tmp_path) is None  # optimize goes on without it
    assert str(path) in capsys.readouterr().err


def test_no_model_file_means_no_model(tmp_path: Path) -> None:
    assert load_if_present(tmp_path) is None
    assert load_if_present(None) is None
    # the online update does nothing without a file (behaviour as before)
    lowered = lower(_softmax(), ("i", "n"))
    assert not record_measured(tmp_path, get_target("c"), [(lowered, None, 1e-3),
                                                          (lowered, None, 2e-3)])
    assert not model_path(tmp_path).exists()


# -- features -----------------------------------------------------------------------------


def _vectors(term: Term, axes: tuple[str, ...]) -> list[np.ndarray]:
    target = ranking_target(get_target("c"))
    lowered = lower(term, axes)
    model = ScheduleModel(lowered, target)
    found = plan(lowered, target, 3)
    out = []
    for setting in [{}, *(found.ranked or [])]:
        per = codegen_knobs(lowered, setting)
        kernels = [model.features(i, k) for i, k in enumerate(per)]
        v = feature_vector(kernels, target)
        assert v.shape == (D,)
        assert np.all(np.isfinite(v)), dict(zip(FEATURE_NAMES, v, strict=True))
        # the analytic prediction is the first feature (log seconds)
        assert v[0] == pytest.approx(math.log(predict(kernels, target)), rel=1e-9, abs=1e-9)
        # the cache's JSON form gives the same vector
        assert np.allclose(feature_vector([k.as_dict() for k in kernels], target), v)
        out.append(v)
    return out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.data())
def test_features_are_finite_for_every_program(term: Term, data: st.DataObject) -> None:
    axes = tuple(data.draw(st.permutations(sorted(term.shape)), label="out_axes"))
    _vectors(term, axes)


@pytest.mark.slow
@pytest.mark.parametrize("spec", sorted(p.stem for p in (ROOT / "specs").glob("*.ks")))
def test_features_are_finite_for_every_bundled_spec(spec: str) -> None:
    program = small_spec(str(ROOT / "specs" / f"{spec}.ks"))
    _vectors(program.term, program.out_axes)


def test_features_for_bundled_nest_forms() -> None:
    """A fast sample of the loop-nest forms: reductions, GEMM, fused attention, a
    convolution (the slow test above covers every bundled spec)."""
    for spec in ("softmax", "matmul", "attention", "conv2d_3x3", "layernorm"):
        program = small_spec(str(ROOT / "specs" / f"{spec}.ks"))
        _vectors(program.term, program.out_axes)


def test_features_are_target_relative() -> None:
    """Doubling every figure of a target and the work (a machine twice the size) leaves
    the shares and footprint ratios alone: what transfers across targets."""
    target = ranking_target(get_target("c"))
    lowered = lower(_softmax(), ("i", "n"))
    model = ScheduleModel(lowered, target)
    kernels = [model.features(i, {}) for i in range(len(lowered.kernels))]
    v = dict(zip(FEATURE_NAMES, feature_vector(kernels, target), strict=True))
    assert 0.0 <= v["vector_fraction"] <= 1.0 and 0.0 <= v["threads_share"] <= 1.0
    assert math.isclose(sum(v[f"share_{t}"] for t in
                            ("compute", "l1", "l2", "l3", "dram", "native", "fork", "launch")),
                        1.0)


# -- integration --------------------------------------------------------------------------


def _softmax(m: int = 64, n: int = 96) -> Term:
    x = In("X", (("i", m), ("n", n)))
    e = exp(sub(x, Max("n", x)))
    return div(e, Sum("n", e))


def _weights_model(name: str, weight: float) -> LearnedCost:
    """A model that ranks by one feature only."""
    model = LearnedCost()
    model.weights = np.zeros(D)
    model.weights[FEATURE_NAMES.index(name)] = weight
    model.groups = model.rows = 1
    return model


def test_plan_ranks_the_pool_by_the_learned_model() -> None:
    """A learned model that prefers what the schedule model calls slowest turns the
    ranking around (within the pool the schedule model proposes)."""
    target = get_target("c")
    program = small_spec(str(ROOT / "specs" / "matmul.ks"), size=64)
    lowered = lower(program.term, program.out_axes)
    plain = plan(lowered, target, 4)
    contrary = plan(lowered, target, 4, learned=_weights_model("log_predicted", -1.0))
    agreeing = plan(lowered, target, 4, learned=_weights_model("log_predicted", 1.0))
    assert plain.ranked and contrary.ranked and agreeing.ranked
    assert plain.predict is not None and contrary.predict is not None
    assert plain.predict(agreeing.ranked[0]) == pytest.approx(plain.predict(plain.ranked[0]))
    assert plain.predict(contrary.ranked[0]) > plain.predict(plain.ranked[0])
    assert contrary.predict(contrary.ranked[0]) <= contrary.predict(contrary.ranked[-1])


def test_learned_seconds_ranks_candidates_and_refuses_the_unmodelled() -> None:
    model = _weights_model("log_kernels", 1.0)
    target = get_target("c")
    one = learned_seconds(_softmax(), ("i", "n"), target, model)
    assert math.isfinite(one) and one > 0
    assert learned_seconds(_softmax(), ("i", "n"), get_target("numpy"), model) == math.inf


def test_online_update_adds_one_group(tmp_path: Path) -> None:
    target = get_target("c")
    groups, _ = synthetic(9, 6, 4)
    save(LearnedCost().update(groups), model_path(tmp_path))
    lowered = lower(_softmax(), ("i", "n"))
    found = plan(lowered, target, 3)
    rows = [(lowered, s, 1e-3 * (k + 1)) for k, s in enumerate(found.ranked or [])]
    assert record_measured(tmp_path, target, [*rows, (lowered, None, math.inf)])
    after = load(model_path(tmp_path))
    assert after.groups == 7 and after.rows == 24 + len(rows)
    assert target.fingerprint in after.trained_on


@pytest.mark.slow
def test_optimize_with_a_model_file(tmp_path: Path) -> None:
    """optimize ranks candidates with the model, measures, ships a proved program and
    adds what it measured to the model file."""
    # a model that agrees with the analytic one (log time = its log prediction), so the
    # settings it ranks first are not abandoned as too slow
    groups = [(x, x[:, 0]) for x, _ in synthetic(11, 6, 4)[0]]
    save(LearnedCost().update(groups), model_path(tmp_path))
    spec = ("kernel k(M=64, N=96)\nin X[i:M, n:N] f32\n"
            "out Y[i, n] = softmax(n: X[i, n])\n")
    # a long time budget: a busy machine's wait for the timing lock must not end the
    # knob search after one setting
    r = optimize(spec, target="c", seconds=900, trials=2, knob_budget=3, cache_dir=tmp_path,
                 extract="greedy")
    assert r.best.proved
    assert any("learned cost model" in n for n in r.notes)
    after = load(model_path(tmp_path))
    assert after.rows >= 26  # the eager program's knob settings were added


# -- bench/cost_model.py (no timing: rows written with made-up times) -----------------------


def _bench() -> Any:
    sys.path.insert(0, str(ROOT / "bench"))
    return importlib.import_module("cost_model")


def _write_rows(cache: MeasureCache, label: str, term: Term, axes: tuple[str, ...],
                run: float, slow_knob: str = "omp") -> int:
    """Every setting the schedule model ranks for `term`, timed as 'the analytic
    prediction, doubled when `slow_knob` is on'."""
    target = get_target("c")
    lowered = lower(term, axes)
    found = plan(lowered, target, 6)
    rows = 0
    for setting in found.ranked or []:
        feats = setting_features(found.model, lowered, setting) or {}
        slow = any(k.get(slow_knob) for k in setting.values())
        seconds = float(feats["predicted"]) * (2.0 if slow else 1.0)
        feats.update(spec=label, estimate=1.0, run=run, load=0.0)
        cache.put(target.fingerprint, f"c:v:{label}", setting, "float32",
                  Measurement(seconds, seconds, seconds, 5, 0.0, True), features=feats)
        rows += 1
    return rows


def test_bench_collected_keeps_each_specs_latest_run(tmp_path: Path) -> None:
    bench = _bench()
    with MeasureCache(tmp_path / "measure.sqlite") as cache:
        _write_rows(cache, "a@1", _softmax(), ("i", "n"), run=1.0)
        # the same spec collected again: other rows (a smaller program), a later run
        n = _write_rows(cache, "a@1", _softmax(32, 48), ("i", "n"), run=2.0)
        got = bench.collected(cache.samples())
    assert list(got) == ["a@1"] and len(got["a@1"]) == n
    assert {s.features["run"] for s in got["a@1"]} == {2.0}


def test_bench_train_and_evaluate_write_the_model_and_the_table(tmp_path: Path) -> None:
    bench = _bench()
    with MeasureCache(tmp_path / "measure.sqlite") as cache:
        for i, (m, n) in enumerate([(64, 96), (128, 64), (32, 256)]):
            _write_rows(cache, f"s{i}@{m}", _softmax(m, n), ("i", "n"), run=1.0)
    bench.main(["train", "--cache-dir", str(tmp_path)])
    assert load(model_path(tmp_path)).groups == 3
    out = tmp_path / "table.md"
    bench.main(["evaluate", "--cache-dir", str(tmp_path), "--out", str(out)])
    text = out.read_text()
    assert all(f"\n| s{i}@" in text for i in range(3))
    assert "| **mean** |" in text and "| **median** |" in text


def test_bench_same_program_ignores_the_codegen_version() -> None:
    bench = _bench()
    assert bench._same_program("c:abc123:deadbeef") == bench._same_program("c:fff000:deadbeef")
    assert bench._same_program("c:abc123:deadbeef") != bench._same_program("c:abc123:beef")
    assert math.isnan(bench.top_slowdown(np.ones(3), np.array([1.0, 2.0, 3.0])))
    assert bench.top_slowdown(np.array([3.0, 1.0, 2.0]), np.log([1.0, 2.0, 4.0])) == 2.0
