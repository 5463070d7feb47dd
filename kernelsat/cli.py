"""The kernelsat command line (typer). Each stage registers its own commands."""

from __future__ import annotations

import typer

from kernelsat.commands import codegen, egraph, hardware, optimize, proofs, rl, rules, spec

app = typer.Typer(
    name="kernelsat",
    help="kernelsat: a verified kernel superoptimizer. Spec in, fastest proved program out.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for _module in (spec, rules, egraph, proofs, codegen, hardware, optimize, rl):
    _module.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
