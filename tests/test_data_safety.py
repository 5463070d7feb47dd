"""kernelsat never deletes what it did not write: `--out` and the output folder.

Every refusal must come before any work (the pipeline is replaced by a function that
fails the test if it is called), leave the file system exactly as it was, exit 2 with
a message and no traceback.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from kernelsat.cli import app
from kernelsat.driver.outputs import (
    MARKER,
    OutputError,
    commit_output_dir,
    plan_output_dir,
    plan_output_file,
    read_marker,
)

SPEC = "kernel k(N=16)\nin x[n:N] f32\nout y[n] = exp(x[n]) * 2\n"
SMALL = ["--target", "numpy", "--trials", "2", "--knob-budget", "1", "--samples", "2",
         "--seconds", "30", "--iters", "2"]


def snapshot(root: Path) -> dict[str, tuple[int, bytes | str]]:
    """Every entry under `root` (not following links): mode and content or link target."""
    out: dict[str, tuple[int, bytes | str]] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            st_ = p.lstat()
            if stat.S_ISLNK(st_.st_mode):
                out[str(p.relative_to(root))] = (st_.st_mode, os.readlink(p))
            elif stat.S_ISREG(st_.st_mode):
                out[str(p.relative_to(root))] = (st_.st_mode, p.read_bytes())
            else:
                out[str(p.relative_to(root))] = (st_.st_mode, b"")
    return out


@pytest.fixture
def no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any call into the pipeline fails the test: refusals must come first."""

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the pipeline ran although the output was refused")

    monkeypatch.setattr("kernelsat.driver.pipeline.optimize", forbidden)


def refused(argv: list[str], root: Path, *, code: int = 2) -> str:
    before = snapshot(root)
    res = CliRunner().invoke(app, argv)
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert snapshot(root) == before, "a refused run changed the file system"
    return res.output


def test_victim_folder_with_files_and_the_spec_is_untouched(tmp_path: Path, no_work) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "thesis.tex").write_text("years of work\n")
    (victim / "k.ks").write_text(SPEC)
    os.chmod(victim, 0o751)
    out = refused(["optimize", str(victim / "k.ks"), "--out", str(victim)], tmp_path)
    assert "input of this run" in out
    # the same folder without the spec inside: still not a kernelsat output
    (victim / "k.ks").unlink()
    spec = tmp_path / "k.ks"
    spec.write_text(SPEC)
    out = refused(["optimize", str(spec), "--out", str(victim)], tmp_path)
    assert "not a kernelsat output" in out
    out = refused(["optimize", str(spec), "--out", str(victim), "--force"], tmp_path)
    assert "not a kernelsat output" in out
    assert stat.S_IMODE(victim.stat().st_mode) == 0o751


@pytest.mark.parametrize("where", [".", "..", "./", "sub/..", "{cwd}", "{home}", "/"])
def test_current_folder_parents_home_and_root_are_refused(
        where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_work) -> None:
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    spec = work / "k.ks"
    spec.write_text(SPEC)
    monkeypatch.chdir(work)
    target = where.replace("{cwd}", str(work)).replace("{home}", str(Path.home()))
    out = refused(["optimize", str(spec), "--out", target], tmp_path)
    assert "refusing" in out


def test_out_pointing_at_a_file_is_refused(tmp_path: Path, no_work) -> None:
    spec = tmp_path / "k.ks"
    spec.write_text(SPEC)
    blocker = tmp_path / "report.txt"
    blocker.write_text("mine\n")
    out = refused(["optimize", str(spec), "--out", str(blocker), "--force"], tmp_path)
    assert "not a folder" in out
    out = refused(["optimize", str(spec), "--out", str(blocker / "x")], tmp_path)
    assert "cannot write" in out


def test_symbolic_links_are_never_followed(tmp_path: Path, no_work) -> None:
    spec = tmp_path / "k.ks"
    spec.write_text(SPEC)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # even a folder that looks like a kernelsat output is not reached through a link
    (elsewhere / MARKER).write_text(json.dumps({"files": ["a.txt"]}))
    (elsewhere / "a.txt").write_text("x")
    link = tmp_path / "out"
    link.symlink_to(elsewhere)
    out = refused(["optimize", str(spec), "--out", str(link), "--force"], tmp_path)
    assert "symbolic link" in out
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    out = refused(["optimize", str(spec), "--out", str(dangling)], tmp_path)
    assert "symbolic link" in out
    assert not (tmp_path / "nowhere").exists()


def test_a_marked_folder_is_replaced_only_with_force(tmp_path: Path) -> None:
    spec = tmp_path / "k.ks"
    spec.write_text(SPEC)
    out = tmp_path / "result"
    cache = ["--cache-dir", str(tmp_path / "cache")]
    res = CliRunner().invoke(app, ["optimize", str(spec), "--out", str(out), *SMALL, *cache])
    assert res.exit_code == 0, res.output
    assert read_marker(out) == {p.name for p in out.iterdir()}
    os.chmod(out, 0o750)
    first = snapshot(tmp_path)
    res = CliRunner().invoke(app, ["optimize", str(spec), "--out", str(out), *SMALL, *cache])
    assert res.exit_code == 2 and "--force" in res.output
    assert snapshot(tmp_path) == first
    res = CliRunner().invoke(app, ["optimize", str(spec), "--out", str(out), "--force", *SMALL,
                                   *cache])
    assert res.exit_code == 0, res.output
    assert (out / "report.json").exists() and stat.S_IMODE(out.stat().st_mode) == 0o750
    # nothing left beside it: no temporary or old folders
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "k.ks", "result"]
    # a file the user added to the output folder makes --force refuse too
    (out / "my-notes.md").write_text("mine\n")
    res = CliRunner().invoke(app, ["optimize", str(spec), "--out", str(out), "--force", *SMALL,
                                   *cache])
    assert res.exit_code == 2 and "my-notes.md" in res.output
    assert (out / "my-notes.md").read_text() == "mine\n"


# -- the library level ---------------------------------------------------------------------


def test_a_new_folder_gets_the_default_mode_not_mkdtemps(tmp_path: Path) -> None:
    plan = plan_output_dir(tmp_path / "a" / "b")
    commit_output_dir(plan, {"x.txt": "1"})
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE((tmp_path / "a" / "b").stat().st_mode) == 0o777 & ~mask


def test_an_empty_existing_folder_is_written_into_with_its_mode(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    os.chmod(empty, 0o705)
    commit_output_dir(plan_output_dir(empty), {"x.txt": "1"})
    assert stat.S_IMODE(empty.stat().st_mode) == 0o705
    assert (empty / "x.txt").read_text() == "1"


def test_a_folder_changed_during_the_run_is_left_alone(tmp_path: Path) -> None:
    out = tmp_path / "out"
    commit_output_dir(plan_output_dir(out), {"a.txt": "1"})
    plan = plan_output_dir(out, force=True)
    (out / "late.txt").write_text("written while kernelsat ran\n")
    with pytest.raises(OutputError, match="changed"):
        commit_output_dir(plan, {"a.txt": "2"})
    assert (out / "late.txt").exists() and (out / "a.txt").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    new = tmp_path / "new"
    plan = plan_output_dir(new)
    new.mkdir()
    (new / "theirs").write_text("x")
    with pytest.raises(OutputError, match="appeared"):
        commit_output_dir(plan, {"a.txt": "1"})
    assert [p.name for p in new.iterdir()] == ["theirs"]


def test_a_failing_writer_leaves_the_old_output_and_no_temporary_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    commit_output_dir(plan_output_dir(out), {"a.txt": "old"})

    def boom(path: Path) -> None:
        raise RuntimeError("plot failed")

    with pytest.raises(RuntimeError):
        commit_output_dir(plan_output_dir(out, force=True), {"a.txt": "new", "p.png": boom})
    assert (out / "a.txt").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@given(st.lists(st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"),
                        max_size=12), max_size=4))
def test_a_forged_marker_never_licenses_other_names(names: list[str]) -> None:
    """A marker listing paths (with /, .., empty names) is not a marker: the folder is
    then refused whatever it holds."""
    import tempfile

    with tempfile.TemporaryDirectory() as root:
        out = Path(root) / "out"
        out.mkdir()
        (out / "user.txt").write_text("mine")
        (out / MARKER).write_text(json.dumps({"files": names}))
        listed = read_marker(out)
        if listed is not None:
            assert all("/" not in n and n not in ("", ".", "..") for n in listed)
        if listed is None or "user.txt" not in listed:
            with pytest.raises(OutputError):
                plan_output_dir(out, force=True)
        assert (out / "user.txt").read_text() == "mine"


def test_output_files_refuse_folders_links_inputs_and_existing_files(tmp_path: Path) -> None:
    spec = tmp_path / "k.ks"
    spec.write_text(SPEC)
    with pytest.raises(OutputError, match="input"):
        plan_output_file(spec, force=True, protect=[spec])
    with pytest.raises(OutputError, match="folder"):
        plan_output_file(tmp_path, force=True)
    link = tmp_path / "l.json"
    link.symlink_to(spec)
    with pytest.raises(OutputError, match="symbolic link"):
        plan_output_file(link, force=True)
    existing = tmp_path / "c.json"
    existing.write_text("{}")
    with pytest.raises(OutputError, match="--force"):
        plan_output_file(existing)
    assert plan_output_file(existing, force=True) == existing
    assert plan_output_file(tmp_path / "new" / "c.json") == tmp_path / "new" / "c.json"


def test_prove_never_writes_its_certificate_over_an_input_or_a_folder(tmp_path: Path) -> None:
    spec = tmp_path / "k.ks"
    spec.write_text(SPEC)
    program = tmp_path / "p.sexpr"
    program.write_text("(mul (exp (In x n:16)) (Const 2.0))\n")
    folder = tmp_path / "certs"
    folder.mkdir()
    for out in (spec, program, folder):
        before = snapshot(tmp_path)
        res = CliRunner().invoke(app, ["prove", str(spec), str(program), "--out", str(out)])
        assert res.exit_code != 0
        assert "refusing" in res.output or "is a folder" in res.output
        assert "Traceback" not in res.output
        assert snapshot(tmp_path) == before
    res = CliRunner().invoke(app, ["prove", str(spec), str(program), "--out",
                                   str(tmp_path / "new" / "c.json")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "new" / "c.json").is_file()


def test_saturate_never_writes_over_its_spec(tmp_path: Path) -> None:
    spec = tmp_path / "k.ks"
    spec.write_text(SPEC)
    for option in ("--json-out", "--dot"):
        res = CliRunner().invoke(app, ["saturate", str(spec), option, str(spec)])
        assert res.exit_code != 0 and f"{option} " in res.output and "input" in res.output
        assert spec.read_text() == SPEC
    same = str(tmp_path / "e.out")
    res = CliRunner().invoke(app, ["saturate", str(spec), "--json-out", same, "--dot", same])
    assert res.exit_code != 0 and "same file" in res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.ks"]


def test_corpus_never_writes_over_a_users_files(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    mine = victim / "corpus_000_contraction.ks"  # the name the generator writes first
    mine.write_text("mine")
    res = CliRunner().invoke(app, ["corpus", str(victim), "--count", "3"])
    assert res.exit_code == 2 and "not a kernelsat output" in res.output, res.output
    assert mine.read_text() == "mine" and sorted(victim.iterdir()) == [mine]
    res = CliRunner().invoke(app, ["corpus", str(victim), "--count", "3", "--force"])
    assert res.exit_code == 2 and mine.read_text() == "mine"
    fresh = tmp_path / "fresh"
    assert CliRunner().invoke(app, ["corpus", str(fresh), "--count", "3"]).exit_code == 0
    assert len(list(fresh.glob("*.ks"))) == 3
    res = CliRunner().invoke(app, ["corpus", str(fresh), "--count", "2", "--force"])
    assert res.exit_code == 0 and len(list(fresh.glob("*.ks"))) == 2
