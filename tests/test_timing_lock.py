"""One kernelsat process times at a time on a machine; each timing carries its load probe.

The holder of the lock is another process (a real `flock`); nothing here depends on how
long anything takes: the tests wait for events (a line printed, a thread finished) with
generous timeouts.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from kernelsat.hardware import timing_lock
from kernelsat.hardware.measure import TimingProtocol, measure, random_inputs
from kernelsat.hardware.timing_lock import TimingLock, timing_session

WAIT_S = 300.0  # only ever reached when something is broken

HOLDER = """
import sys
from pathlib import Path
from kernelsat.hardware.timing_lock import TimingLock
lock = TimingLock(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
lock.acquire()
print("held", flush=True)
sys.stdin.readline()
lock.release()
"""


class Holder:
    """Another process holding the timing lock (the machine-wide one if `path` is None)."""

    def __init__(self, path: Path | None = None) -> None:
        args = [sys.executable, "-c", HOLDER, *([str(path)] if path is not None else [])]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until it holds the lock
        assert line.strip() == "held", line

    @property
    def pid(self) -> int:
        return self.proc.pid

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=WAIT_S)

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=WAIT_S)


@pytest.fixture
def holder_factory() -> Iterator[list[Holder]]:
    made: list[Holder] = []
    yield made
    for h in made:
        if h.proc.poll() is None:
            h.kill()


def in_thread(fn) -> tuple[threading.Thread, dict]:
    box: dict = {}

    def run() -> None:
        try:
            box["result"] = fn()
        except BaseException as e:  # re-raised by the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


class Messages:
    """Collects notifications and lets a test wait for one."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.event = threading.Event()

    def __call__(self, line: str) -> None:
        self.lines.append(line)
        self.event.set()


def test_a_second_process_waits_and_names_the_holder(tmp_path: Path,
                                                     holder_factory: list[Holder]) -> None:
    path = tmp_path / "t.lock"
    holder = Holder(path)
    holder_factory.append(holder)
    said = Messages()
    lock = TimingLock(path, notify=said)
    t, box = in_thread(lock.acquire)
    assert said.event.wait(WAIT_S)
    assert said.lines == [
        f"waiting for another kernelsat process to finish timing (pid {holder.pid})"]
    assert t.is_alive() and not lock.held  # still waiting: the holder has not let go
    holder.release()
    t.join(WAIT_S)
    assert not t.is_alive() and "error" not in box and lock.held
    assert path.read_text().strip() == str(os.getpid())  # the new holder is named
    lock.release()
    assert path.read_text() == ""


def test_a_killed_holder_never_blocks_the_next_run(tmp_path: Path,
                                                   holder_factory: list[Holder]) -> None:
    path = tmp_path / "t.lock"
    holder = Holder(path)
    holder_factory.append(holder)
    lock = TimingLock(path, notify=Messages())
    t, _ = in_thread(lock.acquire)
    holder.kill()  # the kernel drops a dead process's flock
    t.join(WAIT_S)
    assert lock.held
    lock.release()


def test_a_planted_symlink_is_not_followed(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    link = tmp_path / "t.lock"
    link.symlink_to(victim)
    lock = TimingLock(link)
    lock.acquire()  # cannot lock: times without it, says so, never writes through the link
    assert not lock.held
    lock.release()
    assert victim.read_text() == "precious\n"
    assert "cannot open the timing lock" in capsys.readouterr().err


def test_a_private_session_probes_once_per_interval(tmp_path: Path) -> None:
    lock = TimingLock(tmp_path / "t.lock")
    probes = iter([1.0, 2.0, 3.0])
    with timing_session(lock=lock, probe=lambda: next(probes)) as session:
        assert lock.held and session.probe() == 1.0
        assert session.probe() == 1.0  # taken again only once PROBE_EVERY_S has passed
    assert not lock.held


def test_the_process_session_nests_and_threads_take_turns() -> None:
    with timing_session() as outer:
        with timing_session() as inner:  # re-entrant: no deadlock on our own lock
            assert inner is outer and outer.lock.held
        assert outer.lock.held
        order: list[str] = []

        def other_thread() -> None:
            with timing_session():
                order.append("thread")

        t = threading.Thread(target=other_thread, daemon=True)
        t.start()
        t.join(0.5)
        order.append("main")  # the thread cannot enter while this one holds the session
    t.join(WAIT_S)
    assert order == ["main", "thread"]
    assert not outer.lock.held


def _exe(inputs, out):
    np.multiply(inputs["x"], 2, out=out)


def _setup() -> tuple[dict[str, np.ndarray], np.ndarray]:
    inputs = random_inputs({"x": (64,)}, seed=0)
    return inputs, inputs["x"].astype(np.float64) * 2


FAST = {"min_runs": 2, "min_seconds": 0.0, "warmup": 1, "flush_cache": False}


def test_measure_waits_for_the_machine_wide_lock(holder_factory: list[Holder],
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    """`measure` is the one door every timing path goes through (local backend, Ray
    timing workers, bench, RL evaluation): it must wait while another process times."""
    holder = Holder()
    holder_factory.append(holder)
    inputs, ref = _setup()
    t, box = in_thread(lambda: measure(_exe, inputs, (64,), ref, **FAST))
    t.join(1.0)  # cannot finish while the holder holds the lock, however long we wait
    assert t.is_alive() and "result" not in box
    holder.release()
    t.join(WAIT_S)
    assert box["result"].ok
    assert f"finish timing (pid {holder.pid})" in capfd.readouterr().err


def test_run_job_waits_too(holder_factory: list[Holder], tmp_path: Path) -> None:
    """`run_job`: what LocalBackend runs, and what each Ray timing worker runs."""
    from kernelsat.driver.jobs import Job, run_job
    from kernelsat.sexpr import to_sexpr
    from kernelsat.spec import parse_spec

    p = parse_spec("kernel k(N=32)\nin x[n:N] f32\nout y[n] = exp(x[n]) * 5\n", "<t>", {})
    spec = to_sexpr(p.term)
    job = Job(spec, spec, p.out_axes, p.inputs, "numpy", 1, 0,
              timing=TimingProtocol(min_runs=2, min_seconds=0.0))
    holder = Holder()
    holder_factory.append(holder)
    t, box = in_thread(lambda: run_job(job, tmp_path))  # an empty cache: it must time
    t.join(1.0)
    assert t.is_alive()
    holder.release()
    t.join(WAIT_S)
    assert box["result"].ok and box["result"].measured == 1, box["result"].error


@pytest.mark.slow
def test_a_separate_timing_process_does_not_deadlock_on_its_parents_lock() -> None:
    from kernelsat.hardware.measure import CodegenRecipe

    inputs, ref = _setup()
    recipe = CodegenRecipe("(mul (In x n:64) (Const 2.0))", ("n",), "numpy")
    m = measure(recipe, inputs, (64,), ref, separate_process=True, timeout_s=WAIT_S, **FAST)
    assert m.ok, m.failure


def test_measurements_carry_the_probe_taken_with_them(monkeypatch: pytest.MonkeyPatch) -> None:
    inputs, ref = _setup()
    monkeypatch.setattr(timing_lock, "_session", None)
    monkeypatch.setenv("KERNELSAT_LOAD_PROBE", "on")
    probed = measure(_exe, inputs, (64,), ref, **FAST)
    assert math.isfinite(probed.probe) and probed.probe > 0
    monkeypatch.setattr(timing_lock, "_session", None)
    monkeypatch.setenv("KERNELSAT_LOAD_PROBE", "off")
    unprobed = measure(_exe, inputs, (64,), ref, **FAST)
    assert math.isnan(unprobed.probe)
    monkeypatch.setattr(timing_lock, "_session", None)


def test_a_failing_probe_only_leaves_the_timing_unprobed(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    def broken() -> float:
        raise OSError("no gcc, no numpy threads")

    with timing_session(lock=TimingLock(tmp_path / "t.lock"), probe=broken) as session:
        assert math.isnan(session.probe())
    assert "load probe failed" in capsys.readouterr().err


def test_optimize_waits_for_another_process_timing_and_says_so(
        tmp_path: Path, holder_factory: list[Holder]) -> None:
    """The reported case: two optimize runs at once. The second one to time waits for
    the first (here a holder standing in for it), names it, and then finishes."""
    spec = tmp_path / "k.ks"
    spec.write_text("kernel k(N=16)\nin x[n:N] f32\nout y[n] = exp(x[n]) * 7\n")
    holder = Holder()
    holder_factory.append(holder)
    args = [sys.executable, "-m", "kernelsat", "optimize", str(spec), "--target", "numpy",
            "--trials", "2", "--knob-budget", "1", "--samples", "2", "--iters", "2",
            "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")]
    run = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert run.stderr is not None
        waiting = f"waiting for another kernelsat process to finish timing (pid {holder.pid})"
        seen = []
        for line in run.stderr:  # progress lines, then the wait
            seen.append(line)
            if waiting in line:
                break
        assert any(waiting in line for line in seen), "".join(seen)
        assert run.poll() is None  # still waiting
        holder.release()
        _, err = run.communicate(timeout=WAIT_S)
        assert run.returncode == 0, "".join(seen) + err
        assert (tmp_path / "out" / "report.json").exists()
    finally:
        if run.poll() is None:
            run.kill()


# -- builds and timings take turns ------------------------------------------------------

BUILDER = """
import sys
from pathlib import Path
from kernelsat.hardware.timing_lock import TimingLock, building
with building(TimingLock(Path(sys.argv[1]))):
    print("held", flush=True)
    sys.stdin.readline()
"""


class Builder(Holder):
    """Another process inside `building()` (a compile in flight) on a private lock."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", BUILDER, str(path)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip() == "held", line


def test_a_timing_waits_for_a_build_in_flight(tmp_path: Path,
                                              holder_factory: list[Holder]) -> None:
    path = tmp_path / "t.lock"
    builder = Builder(path)
    holder_factory.append(builder)
    lock = TimingLock(path)
    t, box = in_thread(lock.acquire)
    t.join(1.0)
    assert t.is_alive()  # cannot time while the other process compiles
    builder.release()
    t.join(WAIT_S)
    assert "error" not in box and lock.held
    lock.release()


def test_a_build_waits_while_a_process_times(tmp_path: Path,
                                             holder_factory: list[Holder]) -> None:
    path = tmp_path / "t.lock"
    holder = Holder(path)
    holder_factory.append(holder)
    order: list[str] = []

    def build() -> None:
        with timing_lock.building(TimingLock(path)):
            order.append("built")

    t, _ = in_thread(build)
    t.join(1.0)
    assert t.is_alive() and order == []
    holder.release()
    t.join(WAIT_S)
    assert order == ["built"]


def test_a_waiting_timing_holds_back_new_builds(tmp_path: Path,
                                                holder_factory: list[Holder]) -> None:
    """Writer preference: once a timing waits for the builds in flight, a build that
    comes later waits for the timing, so a stream of builds cannot starve it."""
    path = tmp_path / "t.lock"
    first = Builder(path)
    holder_factory.append(first)
    lock = TimingLock(path)
    timer, _ = in_thread(lock.acquire)
    timer.join(1.0)
    assert timer.is_alive()  # waiting for `first`
    later: list[str] = []

    def build() -> None:
        with timing_lock.building(TimingLock(path)):
            later.append("built")

    second, _ = in_thread(build)
    second.join(1.0)
    assert second.is_alive() and later == []  # held at the gate by the waiting timing
    first.release()
    timer.join(WAIT_S)
    assert lock.held and later == []  # the timing goes first
    lock.release()
    second.join(WAIT_S)
    assert later == ["built"]


def test_building_inside_this_threads_own_timing_is_a_no_op() -> None:
    """A compile inside the process's own timing session (a recipe built in `measure`)
    and a timing inside a build both proceed: no deadlock on our own locks."""
    with timing_session(), timing_lock.building():
        pass
    done: list[str] = []
    with timing_lock.building(), timing_session():
        done.append("timed")
    assert done == ["timed"]
