"""`kernelsat optimize`: the main job. Spec in, fastest proved program out."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from kernelsat.commands.backend_options import BackendOption, RayAddressOption, open_backend
from kernelsat.commands.spec import ParamsOption, SpecArg, fail
from kernelsat.pipeline import Options


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
        target: Annotated[str, typer.Option("--target", "-t", help="c, numpy or cuda.")] = "c",
        params: ParamsOption = None,
        extract: Annotated[
            str, typer.Option(help="Extractor: greedy, ilp, sample, local, rl or all.")
        ] = Options.extract,
        seconds: Annotated[
            float, typer.Option(help="Wall-clock budget for the run.")
        ] = Options.seconds,
        trials: Annotated[
            int, typer.Option(help="Programs measured (eager included).")
        ] = Options.trials,
        knob_budget: Annotated[
            int, typer.Option(help="Knob settings per program.")
        ] = Options.knob_budget,
        iters: Annotated[
            int, typer.Option(help="Saturation iterations per stage.")
        ] = Options.iters,
        nodes: Annotated[int, typer.Option(help="E-node limit.")] = Options.nodes,
        sat_seconds: Annotated[
            float, typer.Option(help="Saturation time limit.")
        ] = Options.sat_seconds,
        samples: Annotated[
            int, typer.Option(help="Programs drawn by the sampler.")
        ] = Options.samples,
        seed: Annotated[int, typer.Option(help="Seed for sampling and inputs.")] = Options.seed,
        out: Annotated[
            Path | None, typer.Option("--out", "-o", help="Output folder (default out/NAME).")
        ] = None,
        cache_dir: Annotated[
            Path | None, typer.Option(help="Measurement and build cache folder.")
        ] = None,
        backend: BackendOption = "local",
        ray_address: RayAddressOption = None,
        verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
    ) -> None:
        """Optimize SPEC for a target: saturate with verified rules, extract candidates,
        prove each (certificates checked by the independent checker), generate code,
        measure, and write the fastest proved program with its certificate and a report."""
        from kernelsat.commands.spec import load_or_exit
        from kernelsat.pipeline import OptimizeError
        from kernelsat.pipeline import optimize as run
        from kernelsat.report import OutputError, prepare_out_dir, write_result

        program = load_or_exit(spec, params).program
        out_dir = out if out is not None else Path("out") / program.name
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
            cache_dir=cache_dir,
        )
        try:
            Options(target=target, **options).validate()
            prepare_out_dir(out_dir)
            with open_backend(backend, ray_address, cache_dir) as runner:
                result = run(
                    program, target, progress=_progress_printer(verbose), backend=runner, **options
                )
                result.notes.extend(getattr(runner, "events", []))
            files = write_result(result, out_dir)
        except (OptimizeError, OutputError) as e:
            fail(f"error: {e}")
        typer.echo(result.summary())
        typer.echo(f"  wrote {out_dir}/: {', '.join(p.name for p in files)}")
        sys.stdout.flush()
