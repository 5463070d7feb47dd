"""A regular install works, not only the editable one in .venv.

Fast checks read pyproject.toml against the folders: every folder that holds package
files is a listed package, every data file matches a package-data pattern. The slow
checks build the wheel from a copy of the working tree (offline: setuptools from the dev
extra, no build isolation), install it into a fresh virtual environment outside the
checkout (its dependencies come from this interpreter's site-packages through a `.pth`
file; the editable kernelsat there is not loaded, as `.pth` files of an added folder are
not run), and use it from an empty folder: `--help`, `--version`, `python -m`, `check`
on a bundled spec, a short `optimize` on the C target and `verify` of its certificate.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
VERSION = PYPROJECT["project"]["version"]

NOT_SHIPPED = {"extract/checkpoints": ("*.curve.csv", "*.curve.png", "*.rewards.jsonl")}
"""Files kept in the repository but not installed: the policy's training records."""

SKIP_DIRS = {"__pycache__"}


def package_dirs() -> dict[str, Path]:
    """Each listed package and its folder (relative to the root): its own package-dir
    entry, else its parent's folder plus its last name (as setuptools resolves it)."""
    mapping = SETUPTOOLS["package-dir"]
    out = {}
    for name in SETUPTOOLS["packages"]:
        parts = name.split(".")
        for k in range(len(parts), 0, -1):
            prefix = ".".join(parts[:k])
            if prefix in mapping:
                out[name] = Path(mapping[prefix], *parts[k:])
                break
        else:
            out[name] = Path(*parts)
    return out


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in (ROOT / folder).iterdir() if p.is_file())


def folders_with_files() -> set[Path]:
    """Every folder under a package root that holds a file (caches and dot-folders aside)."""
    roots = {Path(d) for d in SETUPTOOLS["package-dir"].values() if "/" not in d}
    found = set()
    for root in roots:
        for folder, dirs, files in os.walk(ROOT / root):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(".")]
            if files:
                found.add(Path(folder).relative_to(ROOT))
    return found


def _data_patterns(package: str) -> list[str]:
    data = SETUPTOOLS.get("package-data", {})
    return [*data.get("*", []), *data.get(package, [])]


def expected_wheel_files() -> set[str]:
    """Every file the wheel must hold, as `kernelsat/...` paths: each package's modules
    and the data files its package-data patterns match."""
    out = set()
    for package, folder in package_dirs().items():
        target = package.replace(".", "/")
        for f in _files(folder):
            if f.suffix == ".py" or any(fnmatch.fnmatch(f.name, p)
                                        for p in _data_patterns(package)):
                out.add(f"{target}/{f.name}")
    return out


# -- fast: pyproject.toml against the folders --------------------------------------------


def test_every_folder_holding_files_is_a_listed_package() -> None:
    listed = package_dirs()
    missing = folders_with_files() - set(listed.values())
    assert not missing, f"folders that would not be installed (add to packages): {missing}"
    absent = {n: d for n, d in listed.items() if not (ROOT / d).is_dir()}
    assert not absent, f"listed packages without a folder: {absent}"


def test_every_python_folder_at_the_root_is_installed() -> None:
    roots = {Path(d) for d in SETUPTOOLS["package-dir"].values()}
    packages = {p.parent.relative_to(ROOT) for p in ROOT.glob("*/__init__.py")}
    assert packages <= roots, f"top-level packages not mapped: {packages - roots}"
    assert "kernelsat.driver.commands" in SETUPTOOLS["packages"]


def test_every_data_file_is_declared_or_deliberately_left_out() -> None:
    undeclared = []
    for package, folder in package_dirs().items():
        for f in _files(folder):
            if f.suffix == ".py" or any(fnmatch.fnmatch(f.name, p)
                                        for p in _data_patterns(package)):
                continue
            if any(fnmatch.fnmatch(f.name, p) for p in NOT_SHIPPED.get(folder.as_posix(), ())):
                continue
            undeclared.append(f.relative_to(ROOT).as_posix())
    assert not undeclared, f"files that would not be installed (add to package-data): " \
                           f"{undeclared}"


def test_the_files_the_code_opens_are_declared() -> None:
    wanted = expected_wheel_files()
    for path in ("kernelsat/rewrites/elementwise.rules", "kernelsat/extract/checkpoints/rl_c.npz",
                 "kernelsat/specs/softmax.ks", "kernelsat/py.typed",
                 "kernelsat/driver/commands/optimize.py", "kernelsat/__main__.py"):
        assert path in wanted, path


def test_project_metadata() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert project["authors"] and project["classifiers"]
    assert project["scripts"]["kernelsat"] == "kernelsat.cli:main"


# -- slow: build, install, use -----------------------------------------------------------


def _source_copy(dest: Path) -> Path:
    """The working tree as git sees it (tracked and new, not ignored), or without git
    every file but virtual environments, caches and build output."""
    listed = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True)
    if listed.returncode == 0 and shutil.which("git"):
        for name in listed.stdout.decode().split("\0"):
            src = ROOT / name
            if name and src.is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / name)
    else:
        shutil.copytree(ROOT, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns(
            ".venv*", ".git", "build", "out", "__pycache__", "*.egg-info", ".*_cache"))
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed (pip install -e '.[dev]')")
    src = _source_copy(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                            "--no-build-isolation", "--no-index", "-q", "-w", str(out),
                            str(src)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (found,) = out.glob("kernelsat-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    python = env / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    deps = dict.fromkeys([*site.getsitepackages(), sysconfig.get_paths()["purelib"]])
    Path(purelib, "kernelsat_test_dependencies.pth").write_text("\n".join(deps) + "\n")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                                "--no-deps", "--no-index", "-q", str(wheel)],
                               capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return env


def _env(cache: Path) -> dict[str, str]:
    """This environment minus anything pointing into the checkout or its .venv."""
    from kernelsat.hardware.config import cache_dir

    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSAFEPATH")}
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if ".venv" not in p)
    env["KERNELSAT_CACHE_DIR"] = str(cache)
    cache.mkdir(parents=True, exist_ok=True)
    # the rule verification cache is keyed on the verifier's sources, which the wheel
    # holds unchanged: reusing it only saves the first run's proving
    known = cache_dir() / "rule-verification.json"
    if known.is_file():
        shutil.copy2(known, cache / known.name)
    return env


@pytest.mark.slow
@pytest.mark.xdist_group("packaging")  # one wheel and venv for the three
def test_wheel_holds_every_module_and_data_file(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        info = f"kernelsat-{VERSION}.dist-info"
        metadata = z.read(f"{info}/METADATA").decode()
        entry_points = z.read(f"{info}/entry_points.txt").decode()
    missing = expected_wheel_files() - names
    assert not missing, f"not in the wheel: {sorted(missing)}"
    assert not [n for n in names if n.startswith(("tests/", "bench/", "rewrites/", "specs/"))]
    assert "License-Expression: MIT" in metadata and "kernelsat developers" in metadata
    assert f"{info}/licenses/LICENSE" in names
    assert "kernelsat = kernelsat.cli:main" in entry_points


@pytest.mark.slow
@pytest.mark.xdist_group("packaging")  # one wheel and venv for the three
def test_installed_kernelsat_works_outside_the_checkout(venv: Path, tmp_path: Path) -> None:
    env = _env(tmp_path / "cache")
    work = tmp_path / "work"
    work.mkdir()

    def run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(list(args), cwd=work, env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0, f"{args}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    cli = str(venv / "bin" / "kernelsat")
    python = str(venv / "bin" / "python")
    assert "optimize" in run(cli, "--help").stdout
    assert run(cli, "--version").stdout.strip() == f"kernelsat {VERSION}"
    assert run(python, "-m", "kernelsat", "--version").stdout.strip() == f"kernelsat {VERSION}"

    # every package imports from the venv, and the data files the code opens are there
    probe = f"""
import importlib, json, kernelsat
from kernelsat.driver.commands.spec import bundled_specs
from kernelsat.extract.rl import DEFAULT_CHECKPOINT, load_policy
from kernelsat.rewrites.library import FAMILIES
from kernelsat.proofs.library import load_library
mods = [importlib.import_module(p).__file__ for p in {SETUPTOOLS["packages"]!r}]
load_policy()
print(json.dumps({{"files": [kernelsat.__file__, *mods], "specs": sorted(bundled_specs()),
                  "rules": len(load_library(verified_only=False)),
                  "families": len(FAMILIES), "checkpoint": str(DEFAULT_CHECKPOINT)}}))
"""
    found = json.loads(run(python, "-c", probe).stdout)
    assert all(f.startswith(str(venv)) for f in found["files"] if f), found["files"]
    assert found["specs"] == sorted(p.stem for p in (ROOT / "specs").glob("*.ks"))
    assert found["rules"] > 100 and found["checkpoint"].startswith(str(venv))

    checked = json.loads(run(cli, "check", "softmax", "--json").stdout)
    assert checked[0]["ok"] and checked[0]["path"].startswith(str(venv))

    run(cli, "optimize", "softmax", "-p", "M=8", "-p", "N=16", "-t", "c", "--seconds", "60",
        "--trials", "2", "--knob-budget", "1", "--extract", "greedy", "--out", "out",
        timeout=900)
    assert (work / "out" / "certificate.json").is_file()
    assert "ACCEPTED" in run(cli, "verify", "out/certificate.json").stdout


@pytest.mark.slow
@pytest.mark.xdist_group("packaging")  # one wheel and venv for the three
def test_type_checkers_see_the_public_api_types(venv: Path, tmp_path: Path) -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[dev]')")
    (tmp_path / "use.py").write_text(
        "import kernelsat\n"
        "reveal_type(kernelsat.optimize('k.ks', 'c'))\n"
        "reveal_type(kernelsat.verify('{}'))\n"
        "reveal_type(kernelsat.load_library())\n"
        "reveal_type(kernelsat.parse_spec(''))\n"
        "reveal_type(kernelsat.__version__)\n")
    checked = subprocess.run([sys.executable, "-m", "mypy", "--python-executable",
                              str(venv / "bin" / "python"), "--no-incremental", "use.py"],
                             cwd=tmp_path, env=_env(tmp_path / "cache"), capture_output=True,
                             text=True, timeout=600)
    revealed = [line.split('Revealed type is "')[1].rstrip('"')
                for line in checked.stdout.splitlines() if "Revealed type" in line]
    assert revealed == ["kernelsat.driver.pipeline.Result", "kernelsat.proofs.checker.CheckResult",
                        "kernelsat.rewrites.library.RuleSet", "kernelsat.program.Program",
                        "str"], checked.stdout
