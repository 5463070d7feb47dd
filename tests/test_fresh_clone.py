"""From a fresh clone in a temporary folder, the README's two commands set themselves up.

The main-job command runs for real; the test command's set-up is exercised by collecting
(not running) the suite there, so the suite never runs inside itself.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("fresh-clone")]


def _readme_commands() -> tuple[str, str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"<!-- two-commands -->\s*```(?:sh|bash)?\n(.*?)```", text, re.S)
    assert block, "README must hold the two set-up commands after <!-- two-commands -->"
    lines = [
        ln.strip() for ln in block.group(1).splitlines() if ln.strip() and not ln.startswith("#")
    ]
    assert len(lines) == 2, f"README must give exactly two commands, found {lines}"
    return lines[0], lines[1]


def test_readme_gives_exactly_two_commands() -> None:
    main_job, tests = _readme_commands()
    assert main_job.startswith("bin/kernelsat ")
    assert tests.startswith("bin/test")


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_fresh_clone_sets_itself_up_and_runs_the_main_job(tmp_path: Path) -> None:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True)
    if head.returncode:
        pytest.skip("not a git checkout with commits")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    env["PATH"] = ":".join(p for p in env.get("PATH", "").split(":") if ".venv" not in p)
    env["KERNELSAT_CACHE_DIR"] = str(tmp_path / "cache")
    main_job, tests = _readme_commands()
    run = subprocess.run(
        main_job, shell=True, cwd=clone, env=env, capture_output=True, text=True, timeout=1500
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert (clone / ".venv" / "bin" / "python").exists()
    collect = subprocess.run(
        f"{tests} --collect-only -q -n 0 tests/test_ir.py",
        shell=True, cwd=clone, env=env, capture_output=True, text=True, timeout=600,
    )
    assert collect.returncode == 0, collect.stdout[-3000:] + collect.stderr[-3000:]
    assert "test_print_parse_round_trip" in collect.stdout
