"""The timing protocol: bad kernels are rejected, poisoning happens before every run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kernelsat.hardware.measure import (
    ERROR_BOUNDS,
    Measurement,
    check_output,
    measure,
    random_inputs,
)

SHAPE = (16, 8)


def _setup(seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    inputs = random_inputs({"x": SHAPE, "y": SHAPE}, seed=seed)
    ref = inputs["x"].astype(np.float64) * inputs["y"].astype(np.float64)
    return inputs, ref


def good(inputs, out):  # module level: picklable for the separate-process test
    np.multiply(inputs["x"], inputs["y"], out=out)


def _fast(**kw):
    return {"min_runs": 3, "min_seconds": 0.0, "warmup": 1, "flush_cache": False, **kw}


def test_good_kernel_passes() -> None:
    inputs, ref = _setup()
    m = measure(good, inputs, SHAPE, ref, **_fast())
    assert m.ok and m.failure == ""
    assert m.runs >= 3 and m.q1 <= m.median <= m.q3
    assert m.rel_err < ERROR_BOUNDS["float32"]


def test_unwritten_outputs_rejected() -> None:
    inputs, ref = _setup()

    def partial(ins, out):
        out[:-1] = ins["x"][:-1] * ins["y"][:-1]  # forgets the last row

    m = measure(partial, inputs, SHAPE, ref, **_fast())
    assert not m.ok and "unwritten" in m.failure
    assert math.isnan(m.median)


def test_zeros_rejected() -> None:
    inputs, ref = _setup()
    m = measure(lambda ins, out: out.fill(0.0), inputs, SHAPE, ref, **_fast())
    assert not m.ok and "zeros" in m.failure


def test_nan_rejected() -> None:
    inputs, ref = _setup()
    m = measure(lambda ins, out: out.fill(np.nan), inputs, SHAPE, ref, **_fast())
    assert not m.ok


def test_inf_rejected() -> None:
    inputs, ref = _setup()
    m = measure(lambda ins, out: out.fill(np.inf), inputs, SHAPE, ref, **_fast())
    assert not m.ok and "infinit" in m.failure


def test_wrong_values_rejected() -> None:
    inputs, ref = _setup()

    def wrong(ins, out):
        np.add(ins["x"], ins["y"], out=out)

    m = measure(wrong, inputs, SHAPE, ref, **_fast())
    assert not m.ok and "relative L2 error" in m.failure


def test_raising_kernel_is_a_failure() -> None:
    inputs, ref = _setup()

    def boom(ins, out):
        raise RuntimeError("segfault-ish")

    m = measure(boom, inputs, SHAPE, ref, **_fast())
    assert not m.ok and "RuntimeError" in m.failure


def test_kernel_that_writes_only_once_is_caught_by_poisoning() -> None:
    """Correct on its first call, then does nothing: only per-run poisoning sees it."""
    inputs, ref = _setup()
    calls = [0]

    def lazy(ins, out):
        if calls[0] == 0:
            np.multiply(ins["x"], ins["y"], out=out)
        calls[0] += 1

    m = measure(lazy, inputs, SHAPE, ref, **_fast())
    assert not m.ok and "unwritten" in m.failure


def test_output_is_poisoned_before_every_run() -> None:
    inputs, ref = _setup()
    seen: list[bool] = []

    def spy(ins, out):
        seen.append(bool(np.all(np.isnan(out))))
        np.multiply(ins["x"], ins["y"], out=out)

    m = measure(spy, inputs, SHAPE, ref, **_fast(min_runs=5, warmup=2))
    assert m.ok and len(seen) == 7 and all(seen)


def test_fake_timer_gives_exact_statistics() -> None:
    inputs, ref = _setup()
    durations = iter([9.0, 1.0, 2.0, 3.0, 4.0, 5.0])  # the first is the warm-up

    def timer(thunk):
        thunk()
        return next(durations)

    m = measure(good, inputs, SHAPE, ref, timer=timer, **_fast(min_runs=5, warmup=1))
    assert m.ok and m.runs == 5
    assert (m.q1, m.median, m.q3) == (2.0, 3.0, 4.0)  # the warm-up's 9.0 is not counted
    assert m.times == (1.0, 2.0, 3.0, 4.0, 5.0)


def test_runs_until_count_and_time() -> None:
    inputs, ref = _setup()

    def timer(thunk):
        thunk()
        return 0.1

    m = measure(good, inputs, SHAPE, ref, timer=timer, **_fast(min_runs=2, min_seconds=0.55))
    assert m.runs == 6  # 6 x 0.1 s >= 0.55 s, and >= 2 runs


def test_flush_runs_before_each_timed_run() -> None:
    inputs, ref = _setup()
    flushes: list[int] = []
    m = measure(good, inputs, SHAPE, ref, flusher=lambda: flushes.append(1),
                **_fast(min_runs=4, warmup=2, flush_cache=True))
    assert m.ok and len(flushes) == m.runs == 4


def test_constant_inputs_refused() -> None:
    inputs = {"x": np.zeros(SHAPE, np.float32), "y": np.ones(SHAPE, np.float32)}
    with pytest.raises(ValueError, match="constant"):
        measure(good, inputs, SHAPE, np.zeros(SHAPE), **_fast())


def test_random_inputs_never_zero() -> None:
    xs = random_inputs({"a": (100, 100), "p": (50,)}, seed=3, positive=frozenset({"p"}))
    assert np.all(xs["a"] != 0) and np.all(xs["p"] >= 0.5)


def test_check_output_bounds_per_dtype() -> None:
    ref = np.linspace(1, 2, 100)
    noisy = ref * (1 + 1e-3)
    assert check_output(noisy.astype(np.float32), ref, "float32")[1] != ""
    assert check_output(noisy.astype(np.float16), ref, "float16")[1] == ""


def test_failed_measurement_shape() -> None:
    m = Measurement.failed("x")
    assert not m.ok and math.isnan(m.median) and math.isnan(m.spread)


@pytest.mark.slow
def test_separate_process() -> None:
    inputs, ref = _setup()
    m = measure(good, inputs, SHAPE, ref, separate_process=True, **_fast())
    assert m.ok and m.runs >= 3


@pytest.mark.slow
def test_separate_process_survives_a_crash() -> None:
    inputs, ref = _setup()
    m = measure(crash, inputs, SHAPE, ref, separate_process=True, **_fast())
    assert not m.ok and "died" in m.failure


def crash(inputs, out):
    import ctypes

    ctypes.string_at(0)  # segfault in the timing process
