"""The input files of a build: INPUT paths listed in argument order, each directory walked in sorted
order, and what a directory holds that is not read (named, for the report)."""
from __future__ import annotations

import os
from pathlib import Path

from mspretrain.common.errors import MspretrainError
from mspretrain.dataprep.records import InputFile

LEFT_OUT = ("hidden", "symlinked_dirs", "broken_symlinks", "not_files")


class InputPathError(MspretrainError, ValueError):
    """An INPUT argument that cannot be read as a file or walked as a directory."""


def list_inputs(paths: list[str | Path], left_out: dict | None = None) -> list[InputFile]:
    """The input files under `paths`, in argument order, each directory walked in sorted order.

    Inside a directory, these are left out, and named in `left_out` (a dict, filled in when given:
    {"hidden": [...], "symlinked_dirs": [...], "broken_symlinks": [...], "not_files": [...]}, paths
    as given), which the build reports: names starting with '.' (hidden files and directories,
    such as .git), symlinks to directories (not followed: a link can make a cycle or bring in a
    tree twice; give the target as an INPUT instead), broken symlinks, and what is neither a file
    nor a directory (FIFOs, sockets, devices). A symlink to a file is read. A path given twice is
    listed once.
    """
    found: list[InputFile] = []
    seen: set[Path] = set()
    skipped = {kind: [] for kind in LEFT_OUT}
    for arg in paths:
        root = Path(arg)
        if not root.exists():
            raise FileNotFoundError(f"input path not found: {arg}")
        if not root.is_dir() and not root.is_file():
            raise InputPathError(f"input path is neither a file nor a directory (a FIFO, socket or "
                                 f"device?): {arg}")
        if root.is_dir():
            real_root = root.resolve()
            files = []
            for rel, path, link in sorted(_walk(str(root), "", skipped)):
                files.append((rel, Path(os.path.realpath(path)) if link else real_root / rel))
        else:
            files = [(root.name, root.resolve())]
        for rel, path in files:
            rel = _printable(rel)
            if path not in seen:
                seen.add(path)
                found.append(InputFile(path=path, rel=rel))
    if left_out is not None:
        left_out.update({k: sorted(v) for k, v in skipped.items() if v})
    return found


def _printable(rel: str) -> str:
    """A file name as text: bytes that are not UTF-8 (os gives them as surrogate escapes, which no
    file can hold) written as \\xNN, so doc_ids, the report and the manifest can name the file."""
    try:
        rel.encode("utf-8")
        return rel
    except UnicodeEncodeError:
        return os.fsencode(rel).decode("utf-8", "backslashreplace")


def _walk(top: str, prefix: str, skipped: dict):
    """(relative posix path, path, is a symlink) of the files under `top`; what is left out goes
    into `skipped` (see list_inputs). One scandir per directory: no stat for a regular file, no
    resolve() but for symlinks (a corpus may hold 10^5 files)."""
    with os.scandir(top) as it:
        entries = list(it)
    for e in entries:
        if e.name.startswith("."):
            skipped["hidden"].append(e.path)
            continue
        try:
            if e.is_dir(follow_symlinks=False):
                yield from _walk(e.path, f"{prefix}{e.name}/", skipped)
            elif e.is_file():
                yield f"{prefix}{e.name}", e.path, e.is_symlink()
            elif e.is_symlink() and e.is_dir():
                skipped["symlinked_dirs"].append(e.path)
            elif e.is_symlink() and not os.path.exists(e.path):
                skipped["broken_symlinks"].append(e.path)
            else:
                skipped["not_files"].append(e.path)
        except OSError:   # gone while listed, or a link that cannot be followed
            skipped["broken_symlinks" if e.is_symlink() else "not_files"].append(e.path)
