"""The Ray backend: measurement jobs spread over a Ray cluster.

One timing actor per device: per GPU on a GPU node (`num_gpus=1`), per machine on a
CPU node (pinned to its node, holding the node's `kernelsat_timer` resource when the
node declares one), so no two timings share a device at once. Compilation runs
beside them as plain Ray tasks on every free core (`prebuild`: the knob settings a
job will try first go into the node's build cache, keyed by source hash), a few jobs
ahead of the timers. Timers need no CPU reservation, so the tasks get every core.

Results land in the driver's SQLite cache, written by the driver only: a worker gets
the driver's replayable rows (`MeasureCache.program_rows`: none taken under load) for
its own target fingerprint, searches through them, and sends
back every row it measured, keyed by that fingerprint; so a measurement is never
attributed to another machine's hardware.

Faults: a result is written to the cache the moment it arrives, so nothing reported
is lost later. A worker that dies mid-job (killed, out of memory) or runs past the
job's `timeout_s` (it is killed) is replaced on the same device, and its job goes
back to the queue for another worker, up to `max_attempts` attempts; a job that
runs out of attempts comes back as a failed `JobResult` whose `error`, `attempts`
and `history` say what happened. Nothing is dropped.

Ray is imported only when a `RayBackend` is made: the package works without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kernelsat.driver.jobs import Job, JobResult, Progress, prebuild, run_job
from kernelsat.hardware.cache import MeasureCache, knobs_key
from kernelsat.hardware.measure import Measurement
from kernelsat.hardware.targets import CPU_BACKENDS, get_target

TIMER_RESOURCE = "kernelsat_timer"
"""A custom resource a CPU node may declare (`ray start --resources '{"kernelsat_timer": 1}'`)
so that timers of several drivers sharing a cluster still never overlap on it."""

START_TIMEOUT_S = 120.0
"""How long a (re)started timing actor may take to report in before its slot is given up."""

Row = tuple[str, str, dict[str, Any], str, Measurement, Any]  # ..., schedule features
"""One measured setting: (target fingerprint, program key, knobs, dtype, measurement)."""


@dataclass(frozen=True)
class FaultPlan:
    """TEST-ONLY fault injection, keyed by `Job.key`; production runs pass None.

    `kill`: the worker kills itself (SIGKILL) `kill_after_s` into the job's first
    attempt, in the middle of measuring it. `hang`: the job never returns, on every
    attempt, as a kernel stuck in an infinite loop would.
    """

    kill: frozenset[str] = frozenset()
    hang: frozenset[str] = frozenset()
    kill_after_s: float = 0.3


@dataclass(frozen=True)
class WorkerInfo:
    """Who a timing actor is: what the driver shows and keys its rows by."""

    name: str
    host: str
    pid: int
    node_id: str
    fingerprint: str
    gpus: tuple[str, ...] = ()
    threads: str = ""  # OMP_NUM_THREADS the kernels run with
    fingerprints: Mapping[str, str] = field(default_factory=dict)
    """This worker's fingerprint for each CPU target name (C and numpy timings differ)."""

    def fingerprint_for(self, job: Job) -> str:
        """The fingerprint this worker's measurements of `job` are keyed by."""
        return self.fingerprints.get(job.target, self.fingerprint)


class RowCache:
    """The worker's view of the measurement cache: the driver's rows for this worker's
    fingerprint and the program at hand, plus a record of every row measured here."""

    def __init__(self, fingerprint: str, program: str,
                 rows: Mapping[tuple[str, str], Measurement]) -> None:
        self.fingerprint, self.program, self.rows = fingerprint, program, dict(rows)
        self.measured: list[Row] = []

    def get(self, fingerprint: str, program: str, knobs: Mapping[str, Any], dtype: str
            ) -> Measurement | None:
        if fingerprint != self.fingerprint or program != self.program:
            return None  # only this worker's own hardware counts
        return self.rows.get((knobs_key(knobs), dtype))

    def put(self, fingerprint: str, program: str, knobs: Mapping[str, Any], dtype: str,
            m: Measurement, features: Mapping[str, Any] | None = None) -> None:
        self.measured.append((fingerprint, program, dict(knobs), dtype, m, features))


class TimingWorker:
    """The body of one timing actor (wrapped with `ray.remote` on use)."""

    def __init__(self, name: str, build_root: str | None, faults: FaultPlan | None) -> None:
        import ray  # optional (kernelsat[distributed]): only the Ray backend needs it


        self.name, self.faults = name, faults
        self.build_root = None if build_root is None else Path(build_root)
        ctx = ray.get_runtime_context()
        gpus = tuple(str(g) for g in ctx.get_accelerator_ids().get("GPU", ()))
        self.info_ = WorkerInfo(name, socket.gethostname(), os.getpid(), ctx.get_node_id(),
                                get_target("cpu").fingerprint, gpus,
                                os.environ.get("OMP_NUM_THREADS", ""),
                                {name: get_target(name).fingerprint for name in CPU_BACKENDS})

    def info(self) -> WorkerInfo:
        return self.info_

    def measure(self, job: Job, program: str, rows: Mapping[tuple[str, str], Measurement],
                attempt: int) -> tuple[JobResult, list[Row]]:
        """Run one job through `run_job`, searching through the driver's rows."""
        self._inject(job, attempt)
        cache = RowCache(self.info_.fingerprint_for(job), program, rows)
        result = run_job(job, self.build_root, worker=self.name, cache=cache)
        return result, cache.measured

    def _inject(self, job: Job, attempt: int) -> None:  # test-only; no-op without a plan
        if self.faults is None:
            return
        if job.key in self.faults.hang:
            time.sleep(10**6)
        if job.key in self.faults.kill and attempt == 1:
            time.sleep(self.faults.kill_after_s)  # the job is in flight: the driver waits on it
            os.kill(os.getpid(), signal.SIGKILL)


def _prebuild_task(job: Job, build_root: str | None) -> tuple[str | None, str, str]:
    """Compile a job's first settings on this node: (program key or None, node, error)."""
    import ray  # optional (kernelsat[distributed]): only the Ray backend needs it

    node = ray.get_runtime_context().get_node_id()
    try:
        return prebuild(job, None if build_root is None else Path(build_root)), node, ""
    except Exception as e:  # the timing worker will report the same failure properly
        return None, node, f"{type(e).__name__}: {e}"


@dataclass
class Slot:
    """One device and the actor timing on it (replaced when it dies)."""

    index: int
    node_id: str
    options: dict[str, Any]
    generation: int = 0
    actor: Any = None
    info: WorkerInfo | None = None
    state: str = "starting"  # starting | idle | busy | dead
    started: float = 0.0
    done: int = 0
    failed: int = 0
    job: int | None = None
    ref: Any = None  # the pending `info()` call while starting

    @property
    def name(self) -> str:
        return f"w{self.index}" if self.generation == 0 else f"w{self.index}.{self.generation}"


@dataclass
class Pending:
    """A job's state in the driver between submission and its final result."""

    index: int
    job: Job
    program: str | None = None  # the cache's program key, once prebuilt
    node: str | None = None  # where it was prebuilt
    attempts: int = 0
    history: list[str] = field(default_factory=list)
    tried_on: set[str] = field(default_factory=set)


def _placements(nodes: Sequence[Mapping[str, Any]], per_node: int | None,
                max_workers: int | None) -> list[tuple[str, dict[str, Any]]]:
    """(node id, actor options) for every timing slot: one per GPU on GPU nodes, one
    per CPU node (or `per_node`, for benchmarks on one machine)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # optional

    out: list[tuple[str, dict[str, Any]]] = []
    for node in nodes:
        if not node.get("Alive", False):
            continue
        res = node.get("Resources", {})
        pin = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        # Ray gives a worker OMP_NUM_THREADS=1 unless told otherwise: the kernels would
        # time single-threaded, unlike the local backend's (all cores, or the user's)
        threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, int(res.get("CPU", 1))))
        env = {"env_vars": {"OMP_NUM_THREADS": threads}}
        gpus = int(res.get("GPU", 0))
        if gpus:
            opts: dict[str, Any] = {"num_gpus": 1, "num_cpus": 0, "scheduling_strategy": pin,
                                    "runtime_env": env}
            out += [(node["NodeID"], opts)] * (per_node or gpus)
            continue
        opts = {"num_cpus": 0, "scheduling_strategy": pin, "runtime_env": env}
        if res.get(TIMER_RESOURCE, 0) >= 1 and (per_node or 1) == 1:
            opts["resources"] = {TIMER_RESOURCE: 1}
        out += [(node["NodeID"], opts)] * (per_node or 1)
    return out[:max_workers] if max_workers else out


class RayBackend:
    """Measures jobs on a Ray cluster (see the module docstring).

    `address`: a running cluster (`"host:6379"`, `"auto"`); None starts a local Ray
    instance, stopped again by `close()`. If Ray is already initialized in this
    process it is used as is and left running. `cache_dir`: the driver's measurement
    cache (`<cache_dir>/measure.sqlite`) and the workers' build folder (the same path
    on every node). `workers_per_node` overrides one timer per device (for benchmarks
    on one machine: timings on a shared device disturb each other; the machine-wide
    timing lock makes timers on one machine take turns). `fresh`: serve the workers no
    cached timing (they measure everything; the rows are still written).
    """

    name = "ray"

    def __init__(self, address: str | None = None, cache_dir: Path | None = None, *,
                 max_attempts: int = 3, workers_per_node: int | None = None,
                 max_workers: int | None = None, lookahead: int | None = None,
                 faults: FaultPlan | None = None, fresh: bool = False) -> None:
        import ray  # optional (kernelsat[distributed]): only the Ray backend needs it

        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self.fresh = fresh
        self.max_attempts, self.lookahead, self.faults = max_attempts, lookahead, faults
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.WARNING)
        self.events: list[str] = []
        self._timer_cls = ray.remote(max_restarts=0)(TimingWorker)
        self._prebuild = ray.remote(num_cpus=1)(_prebuild_task)
        placements = _placements(ray.nodes(), workers_per_node, max_workers)
        if not placements:
            raise RuntimeError("the Ray cluster has no live node to time on")
        self.slots = [Slot(i, node, opts) for i, (node, opts) in enumerate(placements)]
        for s in self.slots:
            self._spawn(s)
        self._await_start()

    # -- actors ------------------------------------------------------------------------

    def _spawn(self, slot: Slot) -> None:
        root = None if self.cache_dir is None else str(self.cache_dir)
        slot.actor = self._timer_cls.options(**slot.options).remote(slot.name, root, self.faults)
        slot.info, slot.state, slot.started = None, "starting", time.monotonic()
        slot.ref = slot.actor.info.remote()

    def _await_start(self) -> None:
        import ray  # optional (kernelsat[distributed]): only the Ray backend needs it

        for s in self.slots:
            self._started(s, ray.wait([s.ref], timeout=START_TIMEOUT_S)[0])

    def _started(self, slot: Slot, ready: list[Any]) -> None:
        import ray  # optional (kernelsat[distributed]): only the Ray backend needs it

        try:
            if not ready:
                raise TimeoutError(f"did not start within {START_TIMEOUT_S:.0f} s")
            slot.info, slot.state = ray.get(ready[0]), "idle"
        except Exception as e:
            slot.state = "dead"
            self.events.append(f"{slot.name} could not start: {type(e).__name__}: {e}")

    def _replace(self, slot: Slot) -> None:
        """Kill the slot's actor and start a new one on the same device (if its node lives)."""
        import ray  # optional (kernelsat[distributed]): only the Ray backend needs it

        with contextlib.suppress(Exception):
            ray.kill(slot.actor, no_restart=True)
        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        if slot.node_id not in alive:
            slot.state = "dead"
            self.events.append(f"{slot.name}: node {slot.node_id[:8]} is gone; slot given up")
            return
        slot.generation += 1
        self._spawn(slot)

    @property
    def workers(self) -> list[WorkerInfo]:
        """The live timing workers."""
        return [s.info for s in self.slots if s.info is not None and s.state != "dead"]

    # -- running -----------------------------------------------------------------------

    def run(self, jobs: Sequence[Job], progress: Progress | None = None) -> list[JobResult]:
        """Measure `jobs`; results in job order, every job accounted for."""
        with MeasureCache(None if self.cache_dir is None
                          else self.cache_dir / "measure.sqlite", replay=not self.fresh) as cache:
            return _Run(self, cache, list(jobs), progress).loop()

    def close(self) -> None:
        """Stop the timing actors, and the local Ray instance if this backend started it."""
        import ray  # optional (kernelsat[distributed]): only the Ray backend needs it

        if not ray.is_initialized():
            return
        for s in self.slots:
            with contextlib.suppress(Exception):
                ray.kill(s.actor, no_restart=True)
            s.state = "dead"
        if self.owns_ray:
            ray.shutdown()

    def __enter__(self) -> RayBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Run:
    """The driver's event loop for one `RayBackend.run` call."""

    def __init__(self, backend: RayBackend, cache: MeasureCache, jobs: list[Job],
                 progress: Progress | None) -> None:
        self.b, self.cache, self.progress = backend, cache, progress
        self.todo = [Pending(i, j) for i, j in enumerate(jobs)]
        self.results: dict[int, JobResult] = {}
        self.prebuilding: dict[Any, Pending] = {}
        self.ready: list[Pending] = []
        self.running: dict[Any, tuple[Pending, Slot, float]] = {}
        live = max(1, sum(s.state != "dead" for s in backend.slots))
        self.lookahead = backend.lookahead or 2 * live
        self.n = len(jobs)

    def loop(self) -> list[JobResult]:
        import ray  # optional (kernelsat[distributed]): only the Ray backend needs it

        n = self.n
        while len(self.results) < n:
            self._prebuild_ahead()
            self._dispatch()
            if not self._live_slots():
                self._fail_all("no live Ray worker left")
                break
            refs = [*self.prebuilding, *self.running, *self._starting_refs()]
            done, _ = ray.wait(refs, num_returns=1, timeout=self._wait_s()) if refs else ([], [])
            for ref in done:
                self._complete(ref)
            self._expire()
        return [self.results[i] for i in range(n)]

    # scheduling

    def _prebuild_ahead(self) -> None:
        root = None if self.b.cache_dir is None else str(self.b.cache_dir)
        while self.todo and len(self.prebuilding) + len(self.ready) < self.lookahead:
            p = self.todo.pop(0)
            self.prebuilding[self.b._prebuild.remote(p.job, root)] = p
            self._show()

    def _dispatch(self) -> None:
        in_flight = {p.program for p, _, _ in self.running.values() if p.program}
        for slot in (s for s in self.b.slots if s.state == "idle"):
            p = self._pick(slot, in_flight)
            if p is None:
                continue
            self.ready.remove(p)
            rows = ({} if p.program is None or slot.info is None
                    else self.cache.program_rows(slot.info.fingerprint_for(p.job), p.program))
            p.attempts += 1
            p.tried_on.add(slot.name)
            ref = slot.actor.measure.remote(p.job, p.program or "", rows, p.attempts)
            self.running[ref] = (p, slot, time.monotonic())
            slot.state, slot.job = "busy", p.index
            if p.program:
                in_flight.add(p.program)
            self._show()

    def _pick(self, slot: Slot, in_flight: set[str]) -> Pending | None:
        """The next ready job for `slot`: not measuring elsewhere under the same program
        key (it would measure twice), preferring jobs not yet tried on this slot's
        device, then jobs prebuilt on its node."""
        free = [p for p in self.ready if p.program is None or p.program not in in_flight]
        if not free:
            return None
        def rank(p: Pending) -> tuple[bool, bool]:
            return (f"w{slot.index}" in {t.split(".")[0] for t in p.tried_on},
                    p.node != slot.node_id)
        return min(free, key=rank)

    # completions

    def _complete(self, ref: Any) -> None:
        import ray  # optional (kernelsat[distributed]): only the Ray backend needs it

        if ref in self.prebuilding:
            p = self.prebuilding.pop(ref)
            with contextlib.suppress(Exception):  # else the timer compiles it itself
                p.program, p.node, _ = ray.get(ref)
            self.ready.append(p)
            return
        if ref in self.running:
            p, slot, _ = self.running.pop(ref)
            slot.job = None
            try:
                result, rows = ray.get(ref)
            except ray.exceptions.RayTaskError as e:  # the worker lives; the call failed
                slot.state = "idle"
                last = (str(e).strip().splitlines() or [type(e).__name__])[-1]
                self._retry(p, slot, f"raised {last[:200]}")
            except Exception as e:  # RayActorError, WorkerCrashedError, OutOfMemoryError
                self._retry(p, slot, f"worker died ({type(e).__name__})")
                self.b._replace(slot)
            else:
                self._record(p, slot, result, rows)
            self._show()
            return
        for slot in self.b.slots:
            if slot.state == "starting" and slot.ref is ref:
                self.b._started(slot, [ref])

    def _record(self, p: Pending, slot: Slot, result: JobResult, rows: list[Row]) -> None:
        for target, program, knobs, dtype, m, features in rows:  # written now: never lost
            self.cache.put(target, program, knobs, dtype, m, features=features)
        slot.state = "idle"
        slot.done += 1
        p.history.append(f"attempt {p.attempts} on {slot.name}: "
                         + ("ok" if result.ok else f"failed: {result.error[:200]}"))
        self.results[p.index] = replace(result, attempts=p.attempts, history=list(p.history))

    def _retry(self, p: Pending, slot: Slot, what: str) -> None:
        slot.failed += 1
        host = f" ({slot.info.host} pid {slot.info.pid})" if slot.info else ""
        p.history.append(f"attempt {p.attempts} on {slot.name}{host}: {what}")
        self.b.events.append(f"job {p.index}: {p.history[-1]}")
        if p.attempts >= self.b.max_attempts:
            self.results[p.index] = self._failure(p, f"{what}; gave up after {p.attempts} "
                                                  "attempts")
        else:
            self.ready.insert(0, p)

    def _failure(self, p: Pending, error: str) -> JobResult:
        return JobResult(p.job.key, False, error=error, worker="ray", attempts=p.attempts,
                         history=list(p.history))

    def _expire(self) -> None:
        """Kill the workers whose job ran past its `timeout_s`; retry those jobs."""
        now = time.monotonic()
        for ref, (p, slot, start) in list(self.running.items()):
            if now - start > p.job.timeout_s:
                del self.running[ref]
                slot.job = None
                self._retry(p, slot, f"timed out after {p.job.timeout_s:g} s (worker killed)")
                self.b._replace(slot)
                self._show()
        for s in self.b.slots:
            if s.state == "starting" and now - s.started > START_TIMEOUT_S:
                self.b._started(s, [])

    def _fail_all(self, why: str) -> None:
        for p in [*self.todo, *self.ready, *self.prebuilding.values()]:
            if p.index not in self.results:
                p.history.append(why)
                self.results[p.index] = self._failure(p, why)
                self.b.events.append(f"job {p.index}: {why}")

    # bookkeeping

    def _live_slots(self) -> list[Slot]:
        return [s for s in self.b.slots if s.state != "dead"]

    def _starting_refs(self) -> list[Any]:
        return [s.ref for s in self.b.slots if s.state == "starting"]

    def _wait_s(self) -> float:
        now = time.monotonic()
        left = [p.job.timeout_s - (now - start) for p, _, start in self.running.values()]
        return max(0.05, min([1.0, *left]))

    def _show(self) -> None:
        if self.progress is None:
            return
        head = (f"queued {len(self.todo) + len(self.ready)}, compiling {len(self.prebuilding)}, "
                f"running {len(self.running)}, done {len(self.results)}/{self.n}")
        per = [f"{s.name}{'@' + s.info.host if s.info else ''}: "
               f"{'job ' + str(s.job) if s.job is not None else s.state} done {s.done}"
               + (f" lost {s.failed}" if s.failed else "") for s in self.b.slots]
        self.progress("measure", head + " | " + " | ".join(per))
