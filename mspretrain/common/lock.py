"""One process at a time per output directory: `dataprep build --out DIR` and `train launch` on a run dir.

An OS-level lock (`filelock`, flock on Unix) on a lock file: the kernel drops it when its holder dies,
however it dies, so a lock left by a killed process is never stale. After acquiring, the holder writes
its pid and host name into a sidecar file, which is what the second process names in its error.
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

from filelock import FileLock, Timeout

from mspretrain.common.errors import MspretrainError


class LockedError(MspretrainError, RuntimeError):
    """Another live process holds the lock; the message names its pid and the directory."""


class DirLock:
    """`with DirLock(lock_file, what):` holds the lock or raises LockedError at once (never waits)."""

    def __init__(self, lock_file: str | os.PathLike, what: str):
        self.path = Path(lock_file)
        self.pid_file = self.path.with_name(self.path.name + ".pid")
        self.what = what
        self._lock = FileLock(str(self.path), blocking=False, fallback_to_soft=False)

    def __enter__(self) -> "DirLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except Timeout:
            raise LockedError(f"{self.what} is in use by another process ({self.holder()}, lock "
                              f"{self.path}); wait for it to finish or stop it") from None
        self.pid_file.write_text(f"{os.getpid()} {socket.gethostname()}\n")
        return self

    def __exit__(self, *exc) -> None:
        self.pid_file.unlink(missing_ok=True)
        self._lock.release()

    def holder(self) -> str:
        try:
            pid, _, host = self.pid_file.read_text().strip().partition(" ")
            return f"pid {int(pid)}" + (f" on host {host}" if host else "")
        except (OSError, ValueError):
            return "pid not yet written"


def out_dir_lock(out: str | os.PathLike, what: str) -> DirLock:
    """The lock of a directory that may not exist yet and must stay empty: a hidden sibling file."""
    out = Path(out).absolute()
    return DirLock(out.parent / f".{out.name}.lock", what)


def run_dir_lock(run_dir: str | os.PathLike, what: str) -> DirLock:
    """The lock of a directory the tool owns: a hidden file inside it."""
    return DirLock(Path(run_dir) / ".lock", what)
