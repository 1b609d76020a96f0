"""Atomic, durable file writes: the one helper every stage uses.

A file is written to a hidden temporary sibling, flushed and fsynced, then renamed over its final name, and
the directory is fsynced: a reader (or a resumed run after SIGKILL or a power cut) sees the old file or
the whole new one, never a torn one. Only the standard library, so the loader's core install has it.
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path


def tmp_sibling(path: str | os.PathLike) -> Path:
    """The temporary name next to `path` (same directory, so the rename is atomic)."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file or a directory (a directory after a rename makes the new entry durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(tmp: str | os.PathLike, path: str | os.PathLike) -> None:
    """Make a finished temporary file durable and give it its final name (then fsync the directory)."""
    fsync_path(tmp)
    os.replace(tmp, path)
    fsync_path(Path(path).parent)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """`with atomic_path(p) as tmp: library.write(..., tmp)`: for writers that want a file name (parquet,
    safetensors); `p` appears complete when the block ends, or not at all."""
    path = Path(path)
    tmp = tmp_sibling(path)
    try:
        yield tmp
        publish(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb", **kw):
    """`with atomic_open(p, "w") as f: ...`: `p` appears complete when the block ends, or not at all."""
    with atomic_path(path) as tmp, open(tmp, mode, **kw) as f:
        yield f


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    with atomic_open(path, "wb") as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj, indent: int = 1) -> None:
    """Sorted keys, UTF-8 kept as is, a final newline: the same object gives the same bytes."""
    atomic_write_text(path, json.dumps(obj, sort_keys=True, ensure_ascii=False, indent=indent) + "\n")


def file_identity(path: str | os.PathLike) -> tuple[int, int, int]:
    """(inode, mtime in ns, size): changes when the file is rewritten, in place or replaced by a
    rename, so a cache keyed by it never serves an older file of the same name."""
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, st.st_size
