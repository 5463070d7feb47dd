"""The `kernelsat` console script's entry point (`kernelsat.cli:main` in pyproject.toml);
the command line itself is `kernelsat.driver.cli`."""

from kernelsat.driver.cli import app, main

__all__ = ["app", "main"]
