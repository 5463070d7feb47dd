"""CLI commands of the hardware stage: `kernelsat bench`, `kernelsat targets`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from kernelsat.hardware.targets import GPU_TARGETS, Target, get_target


def _target_line(t: Target) -> str:
    return (f"{t.name:7} {t.model[:34]:34} {t.units:4} units  {t.simd_bits:5} bit  "
            f"FP32 {t.peak_fp32 / 1e12:7.2f} TF  BF16 {t.peak_bf16 / 1e12:7.1f} TF  "
            f"mem {t.mem_bandwidth / 1e9:7.0f} GB/s ({t.bandwidth_source.split(' ')[0]})  "
            f"smem/unit {t.shared_mem_per_unit // 1024} KiB  L2 {t.l2_bytes / 2**20:.0f} MiB  "
            f"LLC {t.llc_bytes / 2**20:.0f} MiB")


def targets(
    as_json: Annotated[bool, typer.Option("--json", help="Print every figure as JSON.")] = False,
    probe: Annotated[bool, typer.Option(
        "--probe", help="Measure the CPU's memory bandwidth now (a triad) and cache it.")] = False,
) -> None:
    """List the targets and their figures (CPU detected; GPUs from datasheets)."""
    rows = [get_target("cpu", probe=probe), *GPU_TARGETS.values()]
    if as_json:
        typer.echo(json.dumps([t.describe() for t in rows], indent=2, default=list))
        return
    for t in rows:
        typer.echo(_target_line(t))
    typer.echo("aliases: c = cpu (C backend), numpy (the CPU through numpy)")


def bench(
    spec: Annotated[Path, typer.Argument(help="The .ks spec file.")],
    target: Annotated[str, typer.Option("--target", "-t", help="c, numpy, h100 ...")] = "c",
    param: Annotated[list[str] | None, typer.Option(
        "--param", "-p", help="Override a size parameter, K=V (repeatable).")] = None,
    program: Annotated[Path | None, typer.Option(
        "--program", help="Time this s-expression program instead of the eager spec.")] = None,
    knobs: Annotated[str, typer.Option(
        help="Codegen knobs as JSON: a list of one dict per kernel (default: its defaults).")
    ] = "null",
    seed: Annotated[int, typer.Option(help="Seed of the random inputs.")] = 0,
    min_runs: Annotated[int, typer.Option(help="At least this many timed runs.")] = 10,
    min_seconds: Annotated[float, typer.Option(help="And at least this much timed work.")] = 0.2,
    warmup: Annotated[int, typer.Option(help="Untimed warm-up runs.")] = 2,
    no_flush: Annotated[bool, typer.Option(
        "--no-flush", help="Do not flush the LLC between runs.")] = False,
    separate_process: Annotated[bool, typer.Option(
        "--separate-process", help="Time in a fresh process.")] = False,
    cache: Annotated[Path | None, typer.Option(
        help="SQLite file to store the measurement in (default: the user cache).")] = None,
) -> None:
    """Time a spec's eager program (or `--program`) on a target: per kernel and total."""
    from kernelsat.hardware.bench import bench_term, format_table
    from kernelsat.hardware.cache import MeasureCache
    from kernelsat.spec import load_spec, parse_params

    try:
        prog = load_spec(spec, parse_params(param))
        tgt = get_target(target)
    except (ValueError, KeyError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    if tgt.kind == "gpu":
        typer.echo(f"error: timing on {tgt.name} needs that GPU; this command times on the "
                   "machine it runs on (use `kernelsat targets` for its figures)", err=True)
        raise typer.Exit(2)
    term = prog.term
    if program is not None:
        from kernelsat.sexpr import parse_term

        term = parse_term(program.read_text(), str(program))
        prog = prog.with_term(term)
    try:
        from kernelsat.inputs import random_inputs

        inputs = random_inputs(prog, seed)
    except ImportError:  # pragma: no cover - the inputs module ships with the spec stage
        from kernelsat.hardware.measure import random_inputs as plain

        inputs = plain({d.name: d.dims for d in prog.inputs}, seed=seed)
    with MeasureCache(cache) as db:
        result = bench_term(term, prog.out_axes, inputs, tgt, knobs=json.loads(knobs), cache=db,
                            min_runs=min_runs, min_seconds=min_seconds, warmup=warmup,
                            flush_cache=not no_flush, separate_process=separate_process)
    typer.echo(f"{prog.name} {' '.join(f'{k}={v}' for k, v in prog.params.items())}")
    typer.echo(format_table(result))
    if not result.measurement.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the kernelsat CLI."""
    app.command("bench")(bench)
    app.command("targets")(targets)
