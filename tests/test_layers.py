"""The layers (docs/architecture.md, "Layers"): imports go one way, never upward, and
never inside a function to dodge a cycle.

    entry     kernelsat (the public API), kernelsat.cli, kernelsat.__main__
    learning  kernelsat.learning        RL training and evaluation, the corpus
    driver    kernelsat.driver          pipeline, jobs + ship gate, backends, reports, commands
    stages    extract   -> rewrites, egraph, codegen, hardware
              proofs    -> rewrites, egraph
              hardware  -> codegen
              egraph    -> rewrites
              rewrites, codegen
    core      every other kernelsat.<module>: IR, ops, s-expressions, interpreter, specs

Every module of every package pyproject.toml installs is parsed with `ast`, imports inside
functions and under `if TYPE_CHECKING:` included, and each import of a kernelsat module
is an edge from the importing module's unit to the imported one's. A failure names the
importing file:line and the imported module.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

STAGES = ("rewrites", "egraph", "proofs", "codegen", "hardware", "extract")
ENTRY = frozenset({"kernelsat", "kernelsat.cli", "kernelsat.__main__"})

_ALL_STAGES = frozenset({"core", *STAGES})
MAY_IMPORT: dict[str, frozenset[str]] = {
    "core": frozenset({"core"}),
    "rewrites": frozenset({"core", "rewrites"}),
    "egraph": frozenset({"core", "rewrites", "egraph"}),
    "proofs": frozenset({"core", "rewrites", "egraph", "proofs"}),
    "codegen": frozenset({"core", "codegen"}),
    "hardware": frozenset({"core", "codegen", "hardware"}),
    "extract": frozenset({"core", "rewrites", "egraph", "codegen", "hardware", "extract"}),
    "driver": _ALL_STAGES | {"driver"},
    "learning": _ALL_STAGES | {"driver", "learning"},
    "entry": _ALL_STAGES | {"driver", "learning", "entry"},
}
"""Which units each unit may import (its own included)."""

HEAVY = frozenset({"ray", "pycuda", "torch", "matplotlib", "egglog", "z3", "scipy"})
"""Third-party packages a function may import locally (slow to import, or optional), each
such import with a `# reason` comment on its line or the line above."""


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    module: str
    local: bool
    """Inside a function (or lambda)."""
    type_only: bool
    """Under `if TYPE_CHECKING:`."""

    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def unit(module: str) -> str:
    """The layer unit of a kernelsat module name."""
    if module in ENTRY:
        return "entry"
    part = module.split(".")[1]
    if part in ("driver", "learning", *STAGES):
        return part
    return "core"


def packages() -> dict[str, Path]:
    """Every installed package and its folder, from pyproject.toml."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs: dict[str, str] = tool.get("package-dir", {})
    out: dict[str, Path] = {}
    for name in sorted(tool["packages"], key=lambda n: n.count(".")):
        if name in dirs:
            out[name] = ROOT / dirs[name]
        else:  # a subpackage in its parent's folder
            parent, _, last = name.rpartition(".")
            out[name] = (ROOT / dirs[parent] if parent in dirs else out[parent]) / last
    return out


def modules() -> dict[str, Path]:
    """Module name -> file, for every `.py` file of every installed package."""
    out: dict[str, Path] = {}
    for name, folder in packages().items():
        for f in sorted(folder.glob("*.py")):
            out[name if f.stem == "__init__" else f"{name}.{f.stem}"] = f
    return out


MODULES = modules()


def _scopes(tree: ast.AST) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """Every import statement with (inside a function, under `if TYPE_CHECKING:`)."""

    def walk(node: ast.AST, local: bool, typing: bool) -> Iterator[
            tuple[ast.Import | ast.ImportFrom, bool, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, local, typing
            inner = local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            guarded = typing or (isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(
                child.test))
            if isinstance(child, ast.If) and guarded and not typing:
                for stmt in child.body:
                    yield from walk_one(stmt, inner, True)
                for stmt in child.orelse:
                    yield from walk_one(stmt, inner, typing)
            else:
                yield from walk(child, inner, typing)

    def walk_one(stmt: ast.stmt, local: bool, typing: bool) -> Iterator[
            tuple[ast.Import | ast.ImportFrom, bool, bool]]:
        if isinstance(stmt, ast.Import | ast.ImportFrom):
            yield stmt, local, typing
        yield from walk(stmt, local, typing)

    yield from walk(tree, False, False)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The modules an import statement loads (for `from A import b`: `A.b` when that is a
    module, else `A`)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    subs = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in MODULES]
    return subs if len(subs) == len(node.names) else [source, *subs]


def imports() -> list[Import]:
    out: list[Import] = []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for node, local, typing in _scopes(tree):
            for target in _targets(node, name, path.name == "__init__.py"):
                out.append(Import(path, node.lineno, target, local, typing))
    return out


IMPORTS = imports()


def _importer(imp: Import) -> str:
    return next(m for m, p in MODULES.items() if p == imp.path)


def test_the_table_is_a_layering() -> None:
    """Every unit may import itself, and the units form no cycle."""
    for u, allowed in MAY_IMPORT.items():
        assert u in allowed
        for other in allowed - {u}:
            assert u not in MAY_IMPORT[other], f"{u} and {other} may import each other"


def test_every_unit_has_modules() -> None:
    """The table names every unit the installed modules fall in, and no other."""
    assert {unit(m) for m in MODULES} == set(MAY_IMPORT)


def upward(imports: list[Import]) -> list[str]:
    """One line per import against the layers: file:line, the units and the module."""
    return [f"{imp.where()}: {unit(_importer(imp))} imports {imp.module} ({unit(imp.module)})"
            for imp in imports if imp.module in MODULES
            and unit(imp.module) not in MAY_IMPORT[unit(_importer(imp))]]


def test_no_upward_import() -> None:
    bad = upward(IMPORTS)
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


@pytest.mark.parametrize("importer, imported, ok", [
    ("rewrites/library.py", "kernelsat.proofs.verify", False),  # the old cycle
    ("proofs/verify.py", "kernelsat.hardware.config", False),
    ("extract/rl.py", "kernelsat.driver.pipeline", False),
    ("kernelsat/ir.py", "kernelsat.egraph.snapshot", False),
    ("kernelsat/driver/pipeline.py", "kernelsat.learning.rl_train", False),
    ("extract/base.py", "kernelsat.hardware.cost", True),
    ("kernelsat/learning/rl_train.py", "kernelsat.driver.pipeline", True),
])
def test_an_upward_import_is_named(importer: str, imported: str, ok: bool) -> None:
    planted = Import(ROOT / importer, 7, imported, local=False, type_only=False)
    found = upward([planted])
    assert (found == []) is ok
    if not ok:
        assert found[0].startswith(f"{importer}:7: ") and imported in found[0]


def test_imports_name_real_modules() -> None:
    """Every kernelsat import resolves to an installed module (the graph misses nothing)."""
    bad = [f"{imp.where()}: {imp.module}" for imp in IMPORTS
           if imp.module.split(".")[0] == "kernelsat" and imp.module not in MODULES]
    assert not bad, "imports of modules no installed package holds:\n" + "\n".join(bad)


def test_no_import_cycle_between_modules() -> None:
    """Run-time imports (not `if TYPE_CHECKING:` ones) form no cycle between modules."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    first: dict[tuple[str, str], Import] = {}
    for imp in IMPORTS:
        if imp.module in MODULES and not imp.type_only:
            src = _importer(imp)
            if imp.module != src:
                graph[src].add(imp.module)
                first.setdefault((src, imp.module), imp)
    cycles = [c for c in _strongly_connected(graph) if len(c) > 1]
    described = []
    for cycle in cycles:
        members = set(cycle)
        edges = [first[(a, b)] for a in sorted(members) for b in sorted(graph[a] & members)]
        described.append("; ".join(f"{e.where()} imports {e.module}" for e in edges))
    assert not cycles, "import cycles:\n" + "\n".join(described)


def test_no_function_local_import_of_kernelsat() -> None:
    """A kernelsat module is imported at the top of the module: the layers make that safe,
    so an import inside a function would only hide a dependency."""
    bad = [f"{imp.where()}: imports {imp.module} inside a function (move it to the top)"
           for imp in IMPORTS if imp.local and imp.module.split(".")[0] == "kernelsat"]
    assert not bad, "\n".join(bad)


def test_function_local_imports_are_heavy_and_say_why() -> None:
    """Inside a function, only a heavy or optional third-party package, with a one-line
    `# reason` comment on the import's line or the line above."""
    bad = []
    for imp in IMPORTS:
        if not imp.local or imp.module.split(".")[0] == "kernelsat":
            continue
        lines = imp.path.read_text().splitlines()
        here, above = lines[imp.line - 1], lines[imp.line - 2].strip() if imp.line > 1 else ""
        if imp.module.split(".")[0] not in HEAVY:
            bad.append(f"{imp.where()}: {imp.module} is not heavy: import it at the top")
        elif "#" not in here and not above.startswith("#"):
            bad.append(f"{imp.where()}: {imp.module} imported in a function without a # reason")
    assert not bad, "\n".join(bad)


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                out.append(component)
    return out


@pytest.mark.parametrize("graph, cyclic", [
    ({"a": {"b"}, "b": {"c"}, "c": set()}, False),
    ({"a": {"b"}, "b": {"a"}}, True),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, True),
    ({"a": {"a"}}, False),
])
def test_cycle_finder(graph: dict[str, set[str]], cyclic: bool) -> None:
    assert any(len(c) > 1 for c in _strongly_connected(graph)) is cyclic


def test_the_finder_sees_local_and_type_only_imports(tmp_path: Path) -> None:
    code = ("from typing import TYPE_CHECKING\n"
            "import kernelsat.ir\n"
            "if TYPE_CHECKING:\n"
            "    from kernelsat.driver import pipeline\n"
            "def f():\n"
            "    from kernelsat.proofs.checker import check\n"
            "    g = lambda: __import__('x')\n")
    found = [(n.lineno, local, typing) for n, local, typing in _scopes(ast.parse(code))]
    assert found == [(1, False, False), (2, False, False), (4, False, True), (6, True, False)]
    node = ast.parse("from kernelsat.driver import pipeline, Options").body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _targets(node, "kernelsat.x", False) == ["kernelsat.driver",
                                                    "kernelsat.driver.pipeline"]
    rel = ast.parse("from .base import Cost").body[0]
    assert isinstance(rel, ast.ImportFrom)
    assert _targets(rel, "kernelsat.extract", True) == ["kernelsat.extract.base"]


BOUNDARIES = (
    "kernelsat", "kernelsat.driver.pipeline", "kernelsat.driver.jobs",
    "kernelsat.proofs.checker", "kernelsat.proofs.certificate", "kernelsat.proofs.library",
    "kernelsat.proofs.explain", "kernelsat.egraph.saturate", "kernelsat.extract",
    "kernelsat.extract.base", "kernelsat.extract.greedy", "kernelsat.extract.ilp",
    "kernelsat.extract.local", "kernelsat.extract.sample", "kernelsat.extract.online",
    "kernelsat.extract.rl", "kernelsat.codegen",
)
"""The modules whose public functions are where one stage hands over to the next."""

UNTYPED_ON_PURPOSE = {
    "kernelsat.__getattr__": "PEP 562: the lazily loaded public names, typed under TYPE_CHECKING",
    "kernelsat.proofs.certificate.Certificate.to_obj": "a JSON object",
}


def _any_in_public_signatures(module: str, source: str | None = None) -> list[str]:
    """`file:line name param: annotation` for each public function parameter or return
    annotated with `Any` (`**options: Any` pass-throughs excepted)."""
    path = MODULES.get(module, ROOT / "planted.py")
    tree = ast.parse(path.read_text() if source is None else source)
    out: list[str] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef) and not child.name.startswith("_"):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                dunder = child.name.startswith("__") and child.name.endswith("__")
                if child.name.startswith("_") and not dunder:
                    continue
                a = child.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else [])]
                annotated = [(p.arg, p.annotation) for p in params if p.annotation is not None]
                if child.returns is not None:
                    annotated.append(("return", child.returns))
                name = f"{module}.{prefix}{child.name}"
                out.extend(f"{path.relative_to(ROOT)}:{child.lineno} {name} "
                           f"{arg}: {ast.unparse(ann)}" for arg, ann in annotated
                           if _mentions_any(ann) and name not in UNTYPED_ON_PURPOSE)

    visit(tree, "")
    return out


def _mentions_any(annotation: ast.expr) -> bool:
    text = ast.unparse(annotation)
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        annotation = ast.parse(text.strip("'\""), mode="eval").body  # a quoted annotation
    return any((isinstance(n, ast.Name) and n.id == "Any")
               or (isinstance(n, ast.Attribute) and n.attr == "Any") for n in ast.walk(annotation))


def test_stage_boundaries_are_typed() -> None:
    """No `Any` where a stage hands over to the next (the names above excepted)."""
    bad = [line for module in BOUNDARIES for line in _any_in_public_signatures(module)]
    assert not bad, "Any in a stage boundary's public signature:\n" + "\n".join(bad)


def test_the_boundary_check_sees_any() -> None:
    source = ("from typing import Any\n"
              "def run(x: int, y: 'list[Any]', **options: Any) -> int: ...\n"
              "def _private(x: Any) -> Any: ...\n"
              "class Stage:\n"
              "    def hand_over(self) -> dict[str, typing.Any]: ...\n")
    found = _any_in_public_signatures("kernelsat.planted", source)
    assert found == ["planted.py:2 kernelsat.planted.run y: 'list[Any]'",
                     "planted.py:5 kernelsat.planted.Stage.hand_over return: "
                     "dict[str, typing.Any]"]


def test_importing_kernelsat_loads_the_core_not_the_driver() -> None:
    """`import kernelsat` (which every `kernelsat.<module>` import runs first) loads the
    driver, the verifiers and the e-graph engine only when a name that needs them is used."""
    code = ("import json, sys\n"
            "import kernelsat\n"
            "heavy = ('kernelsat.driver', 'kernelsat.learning', 'kernelsat.proofs.verify', 'z3',\n"
            "         'egglog')\n"
            "before = sorted(m for m in sys.modules if m.startswith(heavy))\n"
            "listed = 'optimize' in dir(kernelsat)\n"
            "from kernelsat import optimize, load_library, OutputError\n"
            "after = 'kernelsat.driver.pipeline' in sys.modules\n"
            "print(json.dumps([before, listed, after, optimize.__module__]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120)
    before, listed, after, module = json.loads(out.stdout)
    assert before == [] and listed and after
    assert module == "kernelsat.driver.pipeline"
