"""Knob search: legal settings, within budget, cached, with fake executables and timers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.hardware.cache import MeasureCache
from kernelsat.hardware.knobs import (
    default_setting,
    is_legal,
    knob_table,
    search,
    space_size,
    tune,
)
from kernelsat.hardware.measure import Measurement, random_inputs
from kernelsat.hardware.targets import get_target

TABLE = {
    "k0": {"tile": (1, 2, 4, 8, 16, 32, 64), "unroll": (1, 2, 4)},
    "k1": {"vec": (4, 8, 16)},
}


def bowl(setting) -> float:
    """A fake cost with its minimum at tile=16, unroll=2, vec=8."""
    t, u, v = setting["k0"]["tile"], setting["k0"]["unroll"], setting["k1"]["vec"]
    return 1.0 + abs(np.log2(t) - 4) + abs(u - 2) + abs(v - 8) / 4


def fake_measure(setting) -> Measurement:
    c = bowl(setting)
    return Measurement(c, c, c, 1, 0.0, True)


@settings(max_examples=20, deadline=None)
@given(st.integers(1, 30), st.integers(0, 10), st.integers(0, 1000))
def test_legal_and_within_budget(budget: int, n_random: int, seed: int) -> None:
    calls: list[dict] = []

    def evaluate(s):
        calls.append(s)
        return fake_measure(s)

    r = search(TABLE, evaluate, budget=budget, n_random=n_random, seed=seed)
    assert len(calls) <= budget and r.measured == len(calls)
    assert is_legal(TABLE, r.best)
    assert all(is_legal(TABLE, t.setting) for t in r.trials)
    assert r.best_measurement is not None
    assert r.best_measurement.median == min(t.measurement.median for t in r.trials)
    assert r.stop_reason in ("budget", "local optimum", "space exhausted")


def test_finds_the_optimum_with_enough_budget() -> None:
    r = search(TABLE, fake_measure, budget=space_size(TABLE), n_random=4, seed=1)
    assert r.best == {"k0": {"tile": 16, "unroll": 2}, "k1": {"vec": 8}}
    assert r.stop_reason in ("local optimum", "space exhausted")


def test_failed_trials_never_win() -> None:
    def evaluate(s):
        if s["k0"]["tile"] == 16:
            return Measurement.failed("build failed")
        return fake_measure(s)

    r = search(TABLE, evaluate, budget=60, seed=0)
    assert r.best["k0"]["tile"] != 16 and r.best_measurement.ok


def test_empty_table() -> None:
    r = search({}, lambda s: Measurement(1.0, 1.0, 1.0, 1, 0.0, True), budget=5)
    assert r.best == {} and r.measured == 1 and r.stop_reason == "space exhausted"


# -- tune(): a fake lowered program and executables built from knobs ------------------


class FakeKernel:
    def __init__(self, name: str, space: dict) -> None:
        self.name, self._space = name, space

    def knob_space(self) -> dict:
        return self._space


class FakeLowered:
    kernels = (FakeKernel("k0", {**TABLE["k0"], "tpb": (128, 256), "fixed": (1,)}),
               FakeKernel("k1", TABLE["k1"]))


def fake_build(lowered, backend: str, per_kernel):
    assert isinstance(per_kernel, list) and len(per_kernel) == 2  # codegen's form
    cost = bowl({"k0": per_kernel[0], "k1": per_kernel[1]})

    def exe(inputs, out):
        np.multiply(inputs["x"], 2.0, out=out)

    exe.cost = cost  # read by the fake timer below
    built.append(exe)
    return exe


built: list = []


def test_tune_is_cached(tmp_path: Path) -> None:
    target = get_target("cpu")
    inputs = random_inputs({"x": (32,)})
    ref = inputs["x"].astype(np.float64) * 2

    def timer(thunk):
        thunk()
        return built[-1].cost

    kwargs = {"min_runs": 2, "min_seconds": 0.0, "warmup": 0, "flush_cache": False,
              "timer": timer}
    assert knob_table(FakeLowered(), "c") == TABLE  # tpb: CUDA only; fixed: one value
    with MeasureCache(tmp_path / "m.sqlite") as db:
        first = tune(FakeLowered(), target, inputs, (32,), ref, program_key="p", budget=10,
                     cache=db, build=fake_build, measure_kwargs=kwargs)
        assert 0 < first.measured <= 10 and is_legal(TABLE, first.best)
        assert db.stats().rows == first.measured
        again = tune(FakeLowered(), target, inputs, (32,), ref, program_key="p", budget=10,
                     cache=db, build=fake_build, measure_kwargs=kwargs)
        # a warm cache replays the same search (cached settings count against the
        # budget): nothing timed, the same settings, the same choice
        assert again.measured == 0 and all(t.cached for t in again.trials)
        assert [t.setting for t in again.trials] == [t.setting for t in first.trials]
        assert again.best == first.best
        assert again.best_measurement.median == first.best_measurement.median
        assert db.get(target.fingerprint, "p", default_setting(TABLE), "float32") is not None
