"""Measurement throughput: the local backend against Ray with 1 and 2 timing workers.

The same batch of distinct small C programs (`exp(x) * c` over an R x N input, one
constant per job) goes through each backend, every backend starting from a fresh
cache (so each run compiles and times everything): jobs per second, end to end.
Then the overhead per job that Ray adds: the same batch again as near-empty jobs
(knob budget 0 and a warm build cache: each job only lowers, loads its library and
reports), as a batch (where Ray overlaps a job's preparation with the previous one's
run) and one job per `run` call; the difference of the latter between Ray with one
worker and the local backend is what submitting, pickling and collecting one job
costs (a prebuild task plus an actor call, two round trips).

Ray with 2 workers on one machine runs two timers side by side, which a real run
never does (one timer per device); here it shows how dispatch scales, and its
timings disturb each other. One local Ray instance serves both Ray rows; its start
is reported apart. Writes a Markdown table to stdout (and `--out FILE`).

    .venv/bin/python bench/throughput.py [--jobs 8] [-R 64] [-N 256] [--out FILE]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernelsat.driver.jobs import Backend, Job, LocalBackend
from kernelsat.hardware.measure import TimingProtocol
from kernelsat.sexpr import to_sexpr
from kernelsat.spec import parse_spec

SPEC = "kernel k(R={R}, N={N})\nin x[r:R, n:N] f32\nout y[r, n] = exp(x[r, n]) * {c}\n"


def make_jobs(n: int, rows: int, cols: int, knob_budget: int) -> list[Job]:
    """`n` jobs with distinct programs."""
    jobs = []
    for i in range(n):
        p = parse_spec(SPEC.format(R=rows, N=cols, c=i + 2), "<bench>", {})
        spec = to_sexpr(p.term)
        jobs.append(Job(spec, spec, p.out_axes, p.inputs, "c", knob_budget, 0,
                        timing=TimingProtocol(min_runs=5, min_seconds=0.02)))
    return jobs


def timed(backend: Backend, jobs: list[Job]) -> tuple[float, int, int]:
    """(seconds, jobs ok, settings measured) for one batch."""
    start = time.perf_counter()
    results = backend.run(jobs)
    return (time.perf_counter() - start, sum(r.ok for r in results),
            sum(r.measured for r in results))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("-R", type=int, default=64)
    ap.add_argument("-N", type=int, default=256)
    ap.add_argument("--knob-budget", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        import ray
    except ImportError:
        print("Ray is not installed: pip install 'kernelsat[distributed]'", file=sys.stderr)
        return 1
    from kernelsat.driver.ray_backend import RayBackend

    work = make_jobs(args.jobs, args.R, args.N, args.knob_budget)
    empty = make_jobs(args.jobs, args.R, args.N, 0)
    root = Path(tempfile.mkdtemp(prefix="ks-throughput-"))
    configs: list[tuple[str, Callable[[Path], Any]]] = [
        ("local", LocalBackend),  # first: Ray's idle processes must not share its cores
        ("local, compile ahead", lambda d: LocalBackend(d, build_workers=os.cpu_count() or 1)),
        ("ray, 1 worker", lambda d: RayBackend(None, d, max_workers=1)),
        ("ray, 2 workers", lambda d: RayBackend(None, d, workers_per_node=2)),
    ]
    rows, empty_s, latency = [], {}, {}
    ray_start = 0.0
    for name, make in configs:
        if name.startswith("ray") and not ray.is_initialized():
            t0 = time.perf_counter()
            ray.init(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
            ray_start = time.perf_counter() - t0
            time.sleep(5.0)  # let Ray's pre-started workers finish importing
        cache = root / name.replace(" ", "").replace(",", "-")
        backend = make(cache)
        try:
            seconds, ok, measured = timed(backend, work)
            empty_s[name] = timed(backend, empty)[0]  # same cache: the builds are warm
            latency[name] = sum(timed(backend, [j])[0] for j in empty) / len(empty)
        finally:
            backend.close()
        rows.append((name, seconds, ok, measured))
    ray.shutdown()

    n = len(work)
    per_job = latency["ray, 1 worker"] - latency["local"]
    lines = [
        f"`.venv/bin/python bench/throughput.py --jobs {n} -R {args.R} -N {args.N} "
        f"--knob-budget {args.knob_budget}` ({os.cpu_count()} cores; Ray start "
        f"{ray_start:.1f} s, not counted)",
        "",
        "| backend | jobs ok | settings timed | seconds | jobs/s | near-empty jobs/s "
        "| near-empty job alone, ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, seconds, ok, measured in rows:
        lines.append(f"| {name} | {ok}/{n} | {measured} | {seconds:.2f} | {n / seconds:.2f} | "
                     f"{n / empty_s[name]:.1f} | {latency[name] * 1e3:.1f} |")
    lines += ["", f"Overhead per job added by Ray (a near-empty job run alone, 1 worker vs "
              f"local): {per_job * 1e3:.1f} ms"]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
