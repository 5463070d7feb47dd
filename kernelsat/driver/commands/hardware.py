"""CLI commands of the hardware stage: `kernelsat bench`, `kernelsat targets`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from kernelsat.driver.commands.backend_options import usable_cache_dir
from kernelsat.driver.commands.options import float_option, int_option, seed_option
from kernelsat.driver.commands.spec import ParamsOption, SpecArg, fail, load_or_exit, refuse
from kernelsat.hardware.bench import bench_term, format_table
from kernelsat.hardware.cache import MeasureCache
from kernelsat.hardware.cpu import detect_cpu
from kernelsat.hardware.measure import TIMING
from kernelsat.hardware.probe import measure_and_cache_figures
from kernelsat.hardware.targets import (
    DEFAULT_GPU,
    GPU_TARGETS,
    ISA_LEVELS,
    Target,
    cpu_key,
    get_target,
    isa_target,
    targets_json,
)
from kernelsat.inputs import random_inputs
from kernelsat.memory import bench_estimate, refuse_reason
from kernelsat.sexpr import read_program


def _target_line(t: Target) -> str:
    return (f"{t.name:7} {t.model[:34]:34} {t.backend:5} {t.arch:7} {t.units:4} units  "
            f"{t.simd_bits:5} bit  "
            f"FP32 {t.peak_fp32 / 1e12:7.2f} TF  BF16 {t.peak_bf16 / 1e12:7.1f} TF  "
            f"mem {t.mem_bandwidth / 1e9:7.0f} GB/s ({t.bandwidth_source.split(' ')[0]})  "
            f"smem/unit {t.shared_mem_per_unit // 1024} KiB  L2 {t.l2_bytes / 2**20:.0f} MiB  "
            f"LLC {t.llc_bytes / 2**20:.0f} MiB")


def targets(
    as_json: Annotated[bool, typer.Option("--json", help="Print every figure as JSON.")] = False,
    probe: Annotated[bool, typer.Option(
        "--probe", help="Measure the CPU's memory bandwidth (triad, read stream) and FP32 "
                        "peak (FMA loop) now; the cache keeps the best figures seen.")] = False,
) -> None:
    """List the targets and their figures (CPU detected; GPUs from datasheets)."""
    if probe:
        measure_and_cache_figures(cpu_key())
    if as_json:
        typer.echo(targets_json())
        return
    isa = [isa_target(name) for name, level in ISA_LEVELS.items()
           if level.requires <= detect_cpu().flags]
    for t in [get_target("cpu"), *isa, *GPU_TARGETS.values()]:
        typer.echo(_target_line(t))
    typer.echo(f"aliases: c = cpu (C backend), numpy (the CPU through numpy), "
               f"cuda = {DEFAULT_GPU} (the default GPU)")


def _knobs(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as e:
        raise typer.BadParameter(
            f"not JSON ({e}); expected a list of one dict per kernel, or null") from None


def _knobs_option(value: str) -> str:
    _knobs(value)
    return value


def bench(
    spec: SpecArg,
    target: Annotated[str, typer.Option("--target", "-t", help="c, numpy, h100 ...")] = "c",
    param: ParamsOption = None,
    program: Annotated[Path | None, typer.Option(
        "--program", help="Time this s-expression program instead of the eager spec.")] = None,
    knobs: Annotated[str, typer.Option(
        help="Codegen knobs as JSON: a list of one dict per kernel (default: its defaults).",
        callback=_knobs_option)] = "null",
    seed: Annotated[int, seed_option("Seed of the random inputs.")] = 0,
    min_runs: Annotated[int, int_option("At least this many timed runs.")
                        ] = TIMING["bench"].min_runs,
    min_seconds: Annotated[float, float_option(
        "And at least this much timed work (s).", minimum=0.0)] = TIMING["bench"].min_seconds,
    warmup: Annotated[int, int_option("Untimed warm-up runs.", minimum=0)
                      ] = TIMING["bench"].warmup,
    no_flush: Annotated[bool, typer.Option(
        "--no-flush", help="Do not flush the LLC between runs.")] = False,
    separate_process: Annotated[bool, typer.Option(
        "--separate-process", help="Time in a fresh process.")] = False,
    cache_dir: Annotated[Path | None, typer.Option(
        "--cache-dir", help="Measurement cache folder (default ~/.cache/kernelsat); the "
                            "measurement is stored in its measure.sqlite.")] = None,
    cache_file: Annotated[Path | None, typer.Option(
        "--cache", hidden=True, help="Old name: the SQLite file itself.")] = None,
) -> None:
    """Time a spec's eager program (or `--program`) on a target: per kernel and total."""
    prog = load_or_exit(spec, param).program
    try:
        tgt = get_target(target)
    except (ValueError, KeyError) as exc:
        refuse(str(exc))
    if tgt.kind == "gpu":
        refuse(f"timing on {tgt.name} needs that GPU; this command times on the machine it "
               "runs on (use `kernelsat targets` for its figures)")
    term = prog.term
    if program is not None:
        try:
            term = read_program(program)
            prog = prog.with_term(term)
        except OSError as e:
            fail(f"{program}: cannot read: {e.strerror or e}")
        except ValueError as e:
            fail(f"{program}: {e}")

    too_big = refuse_reason(bench_estimate(prog, tgt.backend, term))
    if too_big:
        fail(f"{prog.path}: {too_big}\n  expected smaller sizes "
             f"(-p K=V over {', '.join(prog.params) or 'no parameters'})")
    inputs = random_inputs(prog, seed)
    with usable_cache_dir(cache_dir) as folder, MeasureCache(
        cache_file or folder / "measure.sqlite"
    ) as db:
        try:
            timing = replace(TIMING["bench"], min_runs=min_runs, min_seconds=min_seconds,
                             warmup=warmup)
            result = bench_term(term, prog.out_axes, inputs, tgt, knobs=_knobs(knobs),
                                cache=db, timing=timing, flush_cache=not no_flush,
                                separate_process=separate_process)
        except ValueError as e:  # e.g. a reference that overflows on these inputs
            fail(f"{prog.path}: {e}")
    typer.echo(f"{prog.name} {' '.join(f'{k}={v}' for k, v in prog.params.items())}")
    typer.echo(format_table(result))
    if not result.measurement.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the kernelsat CLI."""
    app.command("bench")(bench)
    app.command("targets")(targets)
