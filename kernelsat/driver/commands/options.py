"""Range-checked numeric options, shared by every command.

Each numeric option states its range once, where it is declared; typer rejects a value
outside it before the command runs (exit 2, with the option's name and the range), and
`--help` shows the range. Floats are also checked for nan, and for inf unless the
option means "no limit" by it.

    from kernelsat.driver.commands.options import float_option, int_option

    def optimize(
        trials: Annotated[int, int_option("Programs measured.")] = 6,
        seconds: Annotated[float, float_option("Wall-clock budget (s).", positive=True)] = 90.0,
    ) -> None: ...
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import typer


def int_option(help: str, *names: str, minimum: int = 1, maximum: int | None = None,
          metavar: str | None = None) -> Any:
    """An int option in `[minimum, maximum]` (default: at least 1)."""
    return typer.Option(*names, help=help, min=minimum, max=maximum, metavar=metavar)


def seed_option(help: str = "Random seed.", *names: str) -> Any:
    """A random seed: any int >= 0 (numpy's generators refuse negative seeds)."""
    return typer.Option(*names, help=help, min=0)


def float_option(help: str, *names: str, minimum: float | None = None, maximum: float | None = None,
         positive: bool = False, allow_inf: bool = False, metavar: str | None = None) -> Any:
    """A float option in `[minimum, maximum]`; with `positive`, also above 0 (typer's
    ranges are closed, so "> 0" is checked here). nan is always refused, inf unless
    `allow_inf` (then it means "no limit")."""
    return typer.Option(*names, help=help, min=minimum, max=maximum, metavar=metavar,
                        callback=_float_check(positive, allow_inf))


def _float_check(positive: bool, allow_inf: bool) -> Callable[[float | None], float | None]:
    def check(value: float | None) -> float | None:
        if value is None:
            return value
        if math.isnan(value):
            raise typer.BadParameter("nan is not allowed; expected a number")
        if math.isinf(value) and not (allow_inf and value > 0):
            raise typer.BadParameter(
                f"{value} is not allowed" + (" (inf means no limit here; -inf is not)"
                                             if allow_inf else "; expected a finite number"))
        if positive and value <= 0:
            raise typer.BadParameter(f"{value} is not positive; expected a number > 0")
        return value

    return check
