"""The timing protocol: bad kernels are rejected, poisoning happens before every run."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelsat.hardware.measure import (
    ERROR_BOUNDS,
    SAMPLE_ELEMENTS,
    TIMING,
    Measurement,
    OutputCheck,
    TimingProtocol,
    _diagnose,
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


class Stubborn:
    """A kernel that runs for `seconds` unless cancelled (as generated C is)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.cancelled = 0

    def __call__(self, inputs, out) -> None:
        import time

        good(inputs, out)
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end and not self.cancelled:
            time.sleep(0.001)

    def cancel(self) -> None:
        self.cancelled += 1


def test_a_run_past_the_limit_is_cancelled_not_waited_for() -> None:
    import time

    inputs, ref = _setup()
    exe = Stubborn(30.0)
    start = time.perf_counter()
    m = measure(exe, inputs, SHAPE, ref, **_fast(max_run_seconds=0.05))
    assert time.perf_counter() - start < 10.0  # not the 30 s of the run
    assert not m.ok and "stopped at the limit" in m.failure and exe.cancelled == 1


def test_a_run_within_the_limit_is_timed_normally() -> None:
    inputs, ref = _setup()
    exe = Stubborn(0.0)
    m = measure(exe, inputs, SHAPE, ref, **_fast(max_run_seconds=5.0))
    assert m.ok and m.runs >= 3 and exe.cancelled == 0


def test_a_run_that_raises_under_the_watchdog_is_a_failure() -> None:
    inputs, ref = _setup()

    class Raising(Stubborn):
        def __call__(self, inputs, out) -> None:
            raise RuntimeError("boom")

    m = measure(Raising(0.0), inputs, SHAPE, ref, **_fast(max_run_seconds=5.0))
    assert not m.ok and "RuntimeError: boom" in m.failure


def test_generated_c_stops_when_cancelled(tmp_path) -> None:
    """A 1536^3 reduction of exps in generated C, one thread (about a second here; 512^3
    ran in 0.05 s once exp vectorized, too short for the watchdog's own overhead),
    measured with a limit of 1/20 of a run: the watchdog's flag stops it within an
    iteration of its outer loops, and the next call runs in full."""
    import time

    from kernelsat.codegen import build, lower
    from kernelsat.spec import parse_spec

    program = parse_spec("kernel mm(N=1536)\nin A[i:N, k:N] f32\nin B[k:N, j:N] f32\n"
                         "out C[i, j] = sum(k: exp(A[i, k] * B[k, j]))\n")
    lowered = lower(program.term, program.out_axes)
    exe = build(lowered, "c", [{"omp": False}], tmp_path)
    assert "if (ks_cancel) continue;" in exe.source
    inputs = random_inputs({"A": (1536, 1536), "B": (1536, 1536)}, seed=1)
    full_out = np.empty((1536, 1536), np.float32)
    start = time.perf_counter()
    exe(inputs, full_out)
    full = time.perf_counter() - start
    start = time.perf_counter()
    m = measure(exe, inputs, (1536, 1536), full_out.astype(np.float64),
                **_fast(max_run_seconds=full / 20))
    stopped = time.perf_counter() - start
    assert not m.ok and "stopped at the limit" in m.failure
    assert stopped < full / 2, (stopped, full)
    again = np.empty((1536, 1536), np.float32)
    exe(inputs, again)  # the flag is cleared by the next call
    np.testing.assert_array_equal(again, full_out)


def test_a_short_outer_loop_over_a_deep_nest_is_cancelled_inside_it(tmp_path) -> None:
    """An outer loop of 2 iterations over a deep nest (about a second an iteration, one
    thread): the flag is also checked in the loops with two loop levels beneath them, so
    a cancel shortly after the start leaves part of the first outer iteration's block
    unwritten (with checks in the outermost loop only, that block was always finished)."""
    import threading
    import time

    from kernelsat.codegen import build, lower
    from kernelsat.spec import parse_spec

    n = 1536
    program = parse_spec(f"kernel bmm(G=2, N={n})\nin A[g:G, i:N, k:N] f32\n"
                         "in B[g:G, k:N, j:N] f32\n"
                         "out C[g, i, j] = sum(k: exp(A[g, i, k] * B[g, k, j]))\n")
    lowered = lower(program.term, program.out_axes)
    exe = build(lowered, "c", [{"omp": False}], tmp_path)
    depths = {len(line) - len(line.lstrip()) for line in exe.source.splitlines()
              if line.strip() == "if (ks_cancel) continue;"}
    assert len(depths) >= 2  # the outermost loop and a deeper one
    inputs = random_inputs({"A": (2, n, n), "B": (2, n, n)}, seed=1)
    out = np.full((2, n, n), np.nan, np.float32)
    run = threading.Thread(target=exe, args=(inputs, out))
    run.start()
    time.sleep(0.05)
    exe.cancel()
    run.join(timeout=60)
    assert not run.is_alive()
    assert np.isnan(out[0]).any() and np.isnan(out[1]).all()


def test_timing_presets_and_overrides() -> None:
    """One record holds every caller's timing settings; keyword overrides replace its
    fields and a name that is no field is refused by name."""
    assert TIMING["bench"] == TimingProtocol()
    assert (TIMING["optimize"].min_runs, TIMING["optimize"].min_seconds) == (5, 0.1)
    assert (TIMING["train"].min_runs, TIMING["train"].min_seconds) == (3, 0.02)
    inputs, ref = _setup()
    m = measure(good, inputs, SHAPE, ref, TIMING["train"], min_seconds=0.0, flush_cache=False)
    assert m.ok and m.runs == TIMING["train"].min_runs
    with pytest.raises(TypeError, match=r"min_run.*the settings are dtype, min_runs"):
        measure(good, inputs, SHAPE, ref, min_run=3)


# -- the blocked output check and the sampled check -------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 70_000), st.integers(0, 2**31 - 1),
       st.sampled_from(["none", "nan", "inf", "zeros", "tiny", "large", "one-wrong"]))
def test_the_blocked_check_agrees_with_the_plain_one(n: int, seed: int, damage: str) -> None:
    """`check_output`'s fast path (blocked, no float64 temporaries) gives the verdict and
    the error of the plain computation (`_diagnose`) on any output, damaged or not."""
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal(n)
    out = ref.astype(np.float32)
    at = int(rng.integers(n))
    match damage:
        case "nan":
            out[at] = np.nan
        case "inf":
            out[at] = -np.inf
        case "zeros":
            out[:] = 0
        case "tiny":
            out += np.float32(1e-6) * rng.standard_normal(n).astype(np.float32)
        case "large":
            out += np.float32(1e-2) * rng.standard_normal(n).astype(np.float32)
        case "one-wrong":
            out[at] += np.float32(10.0)
    fast_rel, fast_failure = check_output(out, ref, "float32")
    plain_rel, plain_failure = _diagnose(out, ref, "float32")
    assert fast_failure == plain_failure
    if math.isfinite(plain_rel):
        assert fast_rel == pytest.approx(plain_rel, rel=1e-9, abs=1e-15)


def test_check_first_compares_the_whole_output_once_then_a_sample() -> None:
    """check="first": an element wrong from the first run on fails (the whole output is
    compared on the first run); a kernel that turns to NaN later fails on the sample."""
    n = 4 * SAMPLE_ELEMENTS
    inputs = random_inputs({"x": (n,)}, seed=0)
    ref = inputs["x"].astype(np.float64) * 2
    off_sample = int(np.setdiff1d(np.arange(n), OutputCheck.make(ref, "float32", "first")
                                  .sample)[0])

    def one_wrong(ins, out):
        np.multiply(ins["x"], 2, out=out)
        out[off_sample] += 100.0

    m = measure(one_wrong, inputs, (n,), ref, **_fast(check="first"))
    assert not m.ok and "warm-up run 0" in m.failure
    calls = [0]

    def later_nan(ins, out):
        calls[0] += 1
        np.multiply(ins["x"], 2, out=out)
        if calls[0] > 2:
            out.fill(np.nan)

    m = measure(later_nan, inputs, (n,), ref, **_fast(check="first"))
    assert not m.ok and "sample" in m.failure
    small, small_ref = _setup()
    with pytest.raises(ValueError, match="unknown output check"):
        measure(good, small, SHAPE, small_ref, **_fast(check="some"))
