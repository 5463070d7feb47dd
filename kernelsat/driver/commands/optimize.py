"""`kernelsat optimize`: the main job. Spec in, fastest proved program out.

Everything the run will write is checked before any work starts: the output folder
(`kernelsat.driver.outputs.plan_output_dir`: a new folder, an empty one, or with `--force` a
previous kernelsat output; never anything else) and the cache folder
(`kernelsat.cachefile.check_cache_dir`: not a folder is refused; an unwritable one is
run without, with a warning). Numeric options are range-checked by typer (exit 2).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from kernelsat.driver.commands.backend_options import (
    BackendOption,
    RayAddressOption,
    open_backend,
    usable_cache_dir,
)
from kernelsat.driver.commands.options import float_option, int_option, seed_option
from kernelsat.driver.commands.rules import announce_verification
from kernelsat.driver.commands.spec import ParamsOption, SpecArg, fail, load_or_exit, refuse
from kernelsat.driver.pipeline import OptimizeError, Options
from kernelsat.driver.pipeline import optimize as run
from kernelsat.driver.report import OutputError, plan_output_dir, write_result
from kernelsat.extract import EXTRACTOR_GROUPS
from kernelsat.hardware.targets import get_target
from kernelsat.memory import optimize_estimate, refuse_reason


def _progress_printer(verbose: bool) -> Callable[[str, str], None]:
    """Progress lines on stderr: stage, candidates proved and measured, best so far."""
    start = time.monotonic()

    def progress(stage: str, message: str) -> None:
        if verbose or not message.startswith("done"):
            typer.echo(f"[{time.monotonic() - start:6.1f}s] {stage:>9}: {message}", err=True)

    return progress


def register(app: typer.Typer) -> None:
    """Add `optimize` to the kernelsat CLI."""

    @app.command()
    def optimize(
        spec: SpecArg,
        target: Annotated[str, typer.Option(
            "--target", "-t", help="c, numpy, cuda (the default GPU) or a GPU of "
                                   "`kernelsat targets` (h200 ...).")] = "c",
        params: ParamsOption = None,
        extract: Annotated[
            str,
            typer.Option(help=f"Extractor: {', '.join(EXTRACTOR_GROUPS)} (all: every one but rl)."),
        ] = Options.extract,
        seconds: Annotated[
            float, float_option("Wall-clock budget for the run (s, > 0).", positive=True)
        ] = Options.seconds,
        trials: Annotated[
            int, int_option("Programs measured, eager included (>= 1).")
        ] = Options.trials,
        knob_budget: Annotated[
            int, int_option("Knob settings per program (>= 1).")
        ] = Options.knob_budget,
        iters: Annotated[
            int, int_option("Saturation iterations per stage (>= 1).")
        ] = Options.iters,
        nodes: Annotated[int, int_option("E-node limit (>= 1).")] = Options.nodes,
        sat_seconds: Annotated[
            float, float_option("Saturation time limit (s, > 0).", positive=True)
        ] = Options.sat_seconds,
        samples: Annotated[
            int, int_option("Programs drawn by the sampler (>= 1).")
        ] = Options.samples,
        seed: Annotated[int, seed_option("Seed for sampling and inputs (>= 0).")] = Options.seed,
        out: Annotated[
            Path | None, typer.Option(
                "--out", "-o", help="Output folder (default out/NAME): a new folder, an empty "
                "one, or with --force a previous kernelsat output. Nothing else is touched.")
        ] = None,
        force: Annotated[bool, typer.Option(
            "--force", help="Replace --out if it holds a previous kernelsat output (only the "
            "files kernelsat wrote there).")] = False,
        cache_dir: Annotated[
            Path | None, typer.Option(help="Measurement and build cache folder (default "
                                      "$KERNELSAT_CACHE_DIR or ~/.cache/kernelsat).")
        ] = None,
        fresh: Annotated[bool, typer.Option(
            "--fresh", help="Measure every program afresh: replay no cached timing (the new "
            "timings are still cached).")] = False,
        backend: BackendOption = "local",
        ray_address: RayAddressOption = None,
        verbose: Annotated[bool, typer.Option(
            "--verbose", "-v", help="Also print each stage's end on stderr.")] = False,
    ) -> None:
        """Optimize SPEC for a target: saturate with verified rules, extract candidates,
        prove each (certificates checked by the independent checker), generate code,
        measure, and write the fastest proved program with its certificate and a report.

        Only one kernelsat process times at a time on a machine: a second one says
        "waiting for another kernelsat process to finish timing (pid N)" and waits."""
        program = load_or_exit(spec, params).program
        try:
            Options(target=target).validate()
        except OptimizeError as e:
            refuse(str(e))
        hw = get_target(target, probe=True)  # chosen once, passed down as the record
        announce_verification()
        if hw.kind == "cpu":  # CPU targets run the reference and every candidate here

            too_big = refuse_reason(optimize_estimate(program, hw.backend))
            if too_big:
                fail(f"{program.path}: {too_big}\n  expected smaller sizes "
                     f"(-p K=V over {', '.join(program.params) or 'no parameters'})")
        out_dir = out if out is not None else Path("out") / program.name
        inputs = [Path(program.path)] if Path(program.path).is_file() else []
        try:
            plan = plan_output_dir(out_dir, force=force, protect=inputs)
        except OutputError as e:
            refuse(str(e))
        options: dict[str, Any] = dict(
            extract=extract,
            seconds=seconds,
            trials=trials,
            knob_budget=knob_budget,
            iters=iters,
            nodes=nodes,
            sat_seconds=sat_seconds,
            samples=samples,
            seed=seed,
        )
        try:
            Options(target=hw, **options).validate()
        except OptimizeError as e:
            refuse(str(e))
        with usable_cache_dir(cache_dir) as cache:
            try:
                with open_backend(backend, ray_address, cache, fresh=fresh) as runner:
                    result = run(program, hw, progress=_progress_printer(verbose),
                                 backend=runner, cache_dir=cache, **options)
                    result.notes.extend(getattr(runner, "events", []))
                files = write_result(result, plan)
            except (OptimizeError, OutputError) as e:
                fail(f"error: {e}")
        typer.echo(result.summary())
        typer.echo(f"  wrote {plan.path}/: {', '.join(p.name for p in files)}")
        sys.stdout.flush()
