"""Every docstring example in the package runs (imported by its package name)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import kernelsat


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(kernelsat.__path__, "kernelsat."):
        names.append(info.name)
    for sub in ("rewrites", "egraph", "extract", "codegen", "hardware", "proofs"):
        pkg = importlib.import_module(f"kernelsat.{sub}")
        names.append(pkg.__name__)
        names.extend(i.name for i in pkgutil.walk_packages(pkg.__path__, f"kernelsat.{sub}."))
    return sorted(set(names))


@pytest.mark.parametrize("name", _modules())
def test_doctests(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {name}"
