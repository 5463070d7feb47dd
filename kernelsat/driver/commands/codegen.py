"""CLI commands of the codegen stage: `kernelsat codegen PROGRAM.sexpr`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from kernelsat.codegen import BACKENDS, CodegenError, build, compile_cuda, lower, render
from kernelsat.driver.commands.spec import fail
from kernelsat.hardware.targets import get_target, target_names
from kernelsat.sexpr import read_program

TARGET_HELP = ("loops (the loop nests), or a target: c, numpy, cuda (the default GPU) or a "
               "GPU of `kernelsat targets` (its arch)")


def register(app: typer.Typer) -> None:
    """Add this stage's commands to the kernelsat CLI."""

    @app.command("codegen")
    def codegen(
        program: Annotated[Path, typer.Argument(
            help="A term in s-expression syntax (.sexpr).", show_default=False)],
        target: Annotated[str, typer.Option("--target", "-t", help=TARGET_HELP)] = "loops",
        axes: Annotated[str, typer.Option(
            help="Output layout, e.g. i,n (default: sorted axis names).")] = "",
        knobs: Annotated[str, typer.Option(help="JSON list of per-kernel knob dicts.")] = "",
        nvcc: Annotated[bool, typer.Option(
            help="CUDA: compile for the target's arch with nvcc and show registers.")] = False,
        space: Annotated[bool, typer.Option(
            help="Show each kernel's knob space and stats.")] = False,
    ) -> None:
        """Lower a term to loop nests and print the generated source for a target."""
        try:
            hw = None if target == "loops" else get_target(target)
        except KeyError:
            typer.echo(f"unknown target {target!r} (loops, {', '.join(target_names())})",
                       err=True)
            raise typer.Exit(2) from None
        if hw is not None and hw.backend not in BACKENDS:
            typer.echo(f"target {hw.name}: no {hw.backend} code generation yet "
                       f"(backends: {', '.join(BACKENDS)})", err=True)
            raise typer.Exit(2)
        try:
            term = read_program(program)
            settings = json.loads(knobs) if knobs else None
            lowered = lower(term, tuple(a for a in axes.split(",") if a) or None)
        except OSError as e:
            fail(f"{program}: cannot read: {e.strerror or e}")
        except (ValueError, CodegenError) as e:  # SExprError, bad JSON, unknown axes
            fail(f"{program}: {e}")
        if space:
            for k in lowered.kernels:
                typer.echo(f"kernel {k.index}: stats {tuple(k.stats)}")
                for name, values in k.knob_space().items():
                    typer.echo(f"  {name}: {values}")
        match "loops" if hw is None else hw.backend:
            case "loops":
                nests = lowered.nests(settings)
                typer.echo("\n".join(f"kernel {n.kernel}\n{n}" for n in nests))
            case "c" | "cuda" as backend:
                assert hw is not None
                source = render(lowered, settings, backend, arch=hw.arch)
                typer.echo(source)
                if backend == "cuda" and nvcc:
                    report = compile_cuda(source, hw.arch)
                    typer.echo(f"// nvcc ok={report.ok} {report.skipped}")
                    for name, res in report.kernels.items():
                        typer.echo(f"// {name}: {res}")
                    if not report.ok:
                        raise typer.Exit(1)
            case "numpy":
                typer.echo(build(lowered, "numpy").source)
