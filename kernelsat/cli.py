"""The kernelsat command line (typer): the entry layer, above the driver and learning.
Each stage's commands (`kernelsat.driver.commands`) and the learning commands
(`kernelsat.learning.commands`) register themselves on `app`.

`kernelsat --version`, `python -m kernelsat` and shell completion
(`kernelsat --install-completion`) work as in any typer program.
"""

from __future__ import annotations

from typing import Annotated

import typer

from kernelsat import __version__
from kernelsat.driver.commands import (
    codegen,
    egraph,
    extract,
    hardware,
    optimize,
    proofs,
    rules,
    spec,
)
from kernelsat.learning import commands as rl

app = typer.Typer(
    name="kernelsat",
    help="kernelsat: a verified kernel superoptimizer. Spec in, fastest proved program out.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"kernelsat {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[bool, typer.Option(
        "--version", help="Print the version and exit.", callback=_print_version,
        is_eager=True)] = False,
) -> None:
    """kernelsat: a verified kernel superoptimizer. Spec in, fastest proved program out."""


for _module in (spec, rules, egraph, extract, proofs, codegen, hardware, optimize, rl):
    _module.register(app)


def main() -> None:
    """The `kernelsat` console script (also `python -m kernelsat`)."""
    app(prog_name="kernelsat")


if __name__ == "__main__":
    main()
