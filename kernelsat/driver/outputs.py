"""Writing output folders and files without ever deleting what kernelsat did not write.

An output folder is written whole into a fresh temporary folder beside its destination
and renamed into place at the end, so a failed run never leaves half an output. Every
output folder holds a marker file, `.kernelsat-output`, listing the files kernelsat
wrote there. The destination may be:

- a new path (its parent is created), or an empty folder (its mode is kept);
- with `force`, a folder holding a previous kernelsat output: its marker lists every
  entry in it. The old folder is moved aside, the new one renamed in, and only the
  files the marker lists are deleted; the folder's mode is kept.

Anything else is refused before any work starts (`plan_output_dir` raises
`OutputError`): an existing folder without the marker or holding other files, a file,
a symbolic link, the current folder or one above it, the home folder, a folder
holding the input being processed.

>>> import tempfile
>>> root = Path(tempfile.mkdtemp())
>>> plan = plan_output_dir(root / "out")
>>> written = commit_output_dir(plan, {"a.txt": "hello\\n"})
>>> sorted(p.name for p in (root / "out").iterdir())
['.kernelsat-output', 'a.txt']
>>> try:
...     plan_output_dir(root / "out")
... except OutputError as e:
...     print(type(e).__name__, str(e).split(" ", 2)[2])
OutputError holds a previous kernelsat output; pass --force to replace it
>>> _ = commit_output_dir(plan_output_dir(root / "out", force=True), {"b.txt": "new\\n"})
>>> sorted(p.name for p in (root / "out").iterdir())
['.kernelsat-output', 'b.txt']
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from kernelsat.cachefile import warn

MARKER = ".kernelsat-output"
"""The file every kernelsat output folder holds: JSON with the names kernelsat wrote."""

Writer = Callable[[Path], None]
"""Writes one file at the given path (for content that is not text, e.g. a PNG)."""


class OutputError(OSError):
    """The output cannot be written where asked (the message says why and what to do)."""


@dataclass(frozen=True)
class OutputPlan:
    """Where an output folder goes, checked before any work (see `plan_output_dir`)."""

    path: Path  # the destination: its parent resolved, its own name as given
    replace: bool  # an existing folder (empty, or a marked previous output) is replaced
    mode: int  # the folder's permission bits: the existing folder's, else mkdir's default
    old_files: frozenset[str] = frozenset()  # what the marker of the replaced folder lists

    @property
    def parent(self) -> Path:
        return self.path.parent


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o777 & ~mask


def _is_within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def read_marker(folder: Path) -> frozenset[str] | None:
    """The names a kernelsat output folder's marker lists, or None if `folder` has no
    valid marker (missing, a link, not JSON, not a list of plain names)."""
    marker = folder / MARKER
    try:
        if not stat.S_ISREG(marker.lstat().st_mode):
            return None
        data = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, list) or not all(
        isinstance(f, str) and f and "/" not in f and f not in (".", "..") for f in files
    ):
        return None
    return frozenset(files) | {MARKER}


def _protected(path: Path, protect: Iterable[Path]) -> str:
    """Why `path` (resolved) may never be an output folder, or ""."""
    here = Path.cwd().resolve()
    if _is_within(here, path):
        return "it is the current folder or a folder above it"
    home = Path.home().resolve()
    if _is_within(home, path):
        return "it is the home folder or a folder above it"
    for p in protect:
        p = Path(p).resolve()
        if p == path:
            return "it is an input of this run"
        if _is_within(p, path):
            return f"it holds {p}, an input of this run"
    return ""


def plan_output_dir(out_dir: str | Path, *, force: bool = False,
                    protect: Iterable[Path] = ()) -> OutputPlan:
    """Check that `out_dir` may be written (see the module docstring) and create its
    parent; raise `OutputError` saying why not. Does nothing else to the file system.
    `protect`: inputs of the run (the spec file) that the folder must not contain."""
    given = Path(out_dir)
    if given.name in ("", ".", ".."):
        raise OutputError(f"--out {given}: refusing to write into the current folder or a "
                          "folder above it; name a new folder")
    parent = given.parent.resolve()
    path = parent / given.name
    why = _protected(path, protect)
    if why:
        raise OutputError(f"--out {given}: refusing to write there: {why}")
    try:
        st = path.lstat()
    except FileNotFoundError:
        st = None
    except OSError as e:  # a part of the path is a file, a folder we may not read ...
        raise OutputError(f"cannot write the output folder {given}: {e.strerror or e}"
                          ) from None
    plan = OutputPlan(path, False, _umask_mode())
    if st is not None:
        plan = _plan_replace(given, path, st, force)
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=f".{path.name}.probe-", dir=parent)
        os.rmdir(probe)
    except OSError as e:
        raise OutputError(f"cannot write the output folder {given}: {e.strerror or e}") from None
    return plan


def _plan_replace(given: Path, path: Path, st: os.stat_result, force: bool) -> OutputPlan:
    if stat.S_ISLNK(st.st_mode):
        raise OutputError(f"--out {given} is a symbolic link: refusing to follow it; name a "
                          "new folder")
    if not stat.S_ISDIR(st.st_mode):
        raise OutputError(f"--out {given} exists and is not a folder: refusing to replace it")
    mode = stat.S_IMODE(st.st_mode)
    try:
        entries = {e.name for e in os.scandir(path)}
    except OSError as e:
        raise OutputError(f"--out {given}: cannot read the folder: {e.strerror or e}") from None
    if not entries:
        return OutputPlan(path, True, mode)
    listed = read_marker(path)
    if listed is None:
        raise OutputError(f"--out {given} is a folder that is not empty and not a kernelsat "
                          f"output (no {MARKER} marker): refusing to touch it; name a new "
                          "folder")
    foreign = sorted(entries - listed)
    if foreign:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise OutputError(f"--out {given} holds files kernelsat did not write ({shown}): "
                          "refusing to replace it; move them away or name a new folder")
    if not force:
        raise OutputError(f"--out {given} holds a previous kernelsat output; pass --force "
                          "to replace it")
    return OutputPlan(path, True, mode, frozenset(entries))


def _write_marker(folder: Path, names: Iterable[str]) -> None:
    data = {"written_by": "kernelsat", "files": sorted({*names, MARKER})}
    (folder / MARKER).write_text(json.dumps(data, indent=1) + "\n")


def commit_output_dir(plan: OutputPlan, files: Mapping[str, str | bytes | Writer]) -> list[Path]:
    """Write `files` (name -> text, bytes or a function writing the file) with the marker
    into a temporary folder beside `plan.path`, then move it into place. Returns the
    paths written. Raises `OutputError` when the destination changed since the plan
    (it is re-checked just before the swap)."""
    bad = [n for n in files if not n or "/" in n or n in (".", "..", MARKER)]
    if bad:
        raise ValueError(f"not a plain output file name: {bad}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{plan.path.name}.tmp-", dir=plan.parent))
    try:
        for name, content in files.items():
            target = tmp / name
            if isinstance(content, str):
                target.write_text(content)
            elif isinstance(content, bytes):
                target.write_bytes(content)
            else:
                content(target)
        _write_marker(tmp, files)
        os.chmod(tmp, plan.mode)
        _swap(plan, tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # our own temporary folder, nothing else
        raise
    return sorted(plan.path / n for n in [*files, MARKER])


def _swap(plan: OutputPlan, tmp: Path) -> None:
    if not plan.replace:
        if os.path.lexists(plan.path):
            raise OutputError(f"{plan.path} appeared while kernelsat was running: left as is; "
                              f"the output is in {tmp}")
        os.rename(tmp, plan.path)
        return
    # re-check: the folder must still hold nothing but what the plan saw
    st = plan.path.lstat()
    entries = {e.name for e in os.scandir(plan.path)} if stat.S_ISDIR(st.st_mode) else None
    if entries is None or stat.S_ISLNK(st.st_mode) or not entries <= plan.old_files:
        raise OutputError(f"{plan.path} changed while kernelsat was running: left as is")
    if not entries:
        os.rename(tmp, plan.path)  # rename over an empty folder
        return
    aside = Path(tempfile.mkdtemp(prefix=f".{plan.path.name}.old-", dir=plan.parent))
    old = aside / plan.path.name
    os.rename(plan.path, old)
    os.rename(tmp, plan.path)
    _remove_listed(old, plan.old_files)
    try:
        os.rmdir(aside)
    except OSError:  # something unlisted appeared in the old folder: kept, never deleted
        warn(f"the previous output held files kernelsat did not write: kept in {old}")


def _remove_listed(folder: Path, names: frozenset[str]) -> None:
    """Delete exactly the listed plain files of `folder`, then the folder if empty."""
    for name in names:
        p = folder / name
        with contextlib.suppress(OSError):
            if stat.S_ISREG(p.lstat().st_mode):
                p.unlink()
    with contextlib.suppress(OSError):
        folder.rmdir()


def plan_output_file(out: str | Path, *, force: bool = False, protect: Iterable[Path] = (),
                     option: str = "--out") -> Path:
    """Check, before any work, that the file `out` may be written: not a folder, not a
    symbolic link, not an input of the run (`protect`); an existing file only with
    `force`. Creates the parent folder. Returns the destination path. `option`: the
    command-line option named in the messages."""
    given = Path(out)
    if given.name in ("", ".", ".."):
        raise OutputError(f"{option} {given}: name a file")
    path = given.parent.resolve() / given.name
    for p in protect:
        if Path(p).resolve() == path:
            raise OutputError(f"{option} {given} is an input of this run: refusing to overwrite it")
    if os.path.islink(path):
        raise OutputError(f"{option} {given} is a symbolic link: refusing to follow it")
    if path.is_dir():
        raise OutputError(f"{option} {given} is a folder: name a file")
    if path.exists() and not force:
        raise OutputError(f"{option} {given} exists; pass --force to replace it")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputError(f"cannot write {given}: {e.strerror or e}") from None
    if not os.access(path.parent, os.W_OK):
        raise OutputError(f"cannot write {given}: its folder is not writable")
    return path


def write_file_atomically(path: Path, content: str | bytes) -> None:
    """Write `content` to a temporary file beside `path`, then rename it into place
    (an existing file's permission bits are kept)."""
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(content.encode() if isinstance(content, str) else content)
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            mode = 0o666 & _umask_mode()
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
