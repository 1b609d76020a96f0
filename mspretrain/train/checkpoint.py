"""Checkpoints: RUN/checkpoints/step_XXXXXXXX/{model.ckpt, state.json} and RUN/checkpoints/latest.

A checkpoint is written into `.tmp-step_XXXXXXXX`, every file fsynced, then renamed to its final name;
`latest` (one line: the directory name) is replaced atomically after that, last. A process killed at any
moment therefore leaves `latest` naming a complete checkpoint (or no `latest` at all); stale temporary
directories are removed on the next start. At most keep_max checkpoints are kept (never the latest).

model.ckpt holds the train cell's state parameters (weights, AdamW moments, the optimizer's step,
the loss-scale value and its clean-step counter). When the model is sharded each rank writes
`rank_R/model.ckpt` inside the same directory, and its parallel strategy as `strategy/rank_R.ckpt`
(beside the rank directories: see train.parallel.copy_strategy).

Every file of a checkpoint but state.json has its sha256 and size in state.json's `files`
(`{"model.ckpt": {"sha256": ..., "bytes": ...}}`), recorded before the directory is renamed and
`latest` moves: a resume, `train eval` and the commands that read weights check them first, so a
flipped bit or a truncated file is an error naming the file, never a silent resume. Checkpoints
written before this record load with a warning.

`--resume auto` (`find_resumable`) takes the newest checkpoint that passes these checks and the
checks of its state.json against its contents (`check_state`), whatever `latest` says (missing,
garbage, or one step behind a write killed before it moved), and names each one it passed over. A
checkpoint is never overwritten: a write of a step whose directory exists moves the old one aside.

model.ckpt is written by `write_model_file`, in ms.save_checkpoint's format byte for byte, from a host
copy of the tensors (`host_copy`); its digest is taken of the bytes as they are written (no second
pass over the file). `checkpoint.async` (`BackgroundWriter`): the trainer copies the state at the
step boundary into the file's image in host memory (`ModelImage`: the record heads and the tensors'
bytes in place, a buffer reused by every checkpoint) and the whole write (files, fsyncs, digests,
rename, `latest`, pruning) runs on a background thread while training goes on, one write at a time:
the model file is hashed and written from the image past the page cache (O_DIRECT, where the file
system takes it), paced over 0.8 of the time until the next checkpoint (`Pacer`), by a thread below
the training threads' priority (SCHED_IDLE where it can be undone; on a machine whose cores the
step fills, the write takes the CPU the step leaves idle); a failed write
stops the run at the next step boundary. MindSpore's own `save_checkpoint(async_save="thread")` was not used: it writes
only the file (no fsync, no digest, no rename or `latest` after it), keeps an exception in its thread
(logged, never returned), and is waited for by looking up threads by name.

`on_phase(phase, step)` is called at the moments that matter for crash safety: `model_written` (the
model file is written and fsynced), `before_rename` (temp dir complete, not renamed) and
`before_latest` (renamed, latest not yet updated); the trainer passes train.hooks' callback (a no-op
unless a hooks module replaced it: the kill-and-resume tests SIGKILL, slow down or fail the writer
there).
"""
from __future__ import annotations

import errno
import functools
import hashlib
import json
import mmap
import os
import re
import shutil
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import mindspore as ms
import numpy as np

from mspretrain.common.errors import MspretrainError
from mspretrain.common.files import atomic_write_json, atomic_write_text, fsync_path
from mspretrain.common.fsmode import use_umask

CKPT_DIR = "checkpoints"
LATEST = "latest"
MODEL_FILE = "model.ckpt"
STATE_FILE = "state.json"
RESHARDED = "resharded"       # RUN/resharded/STEP: a resume's files transformed to a new layout (reshard.py)
FILES_KEY = "files"             # state.json: {relative path: {"sha256", "bytes"}} of every other file
_STEP_RE = re.compile(r"^step_(\d{8})$")
_DIGESTS = ".digests-rank_{}.json"     # a sharded write: each rank's digests, merged by the main rank


class CheckpointError(MspretrainError, RuntimeError):
    """A checkpoint that cannot be written or read; the message names the path."""


class HostTensor(NamedTuple):
    """One state tensor in host memory: what model.ckpt records of it."""
    name: str
    dims: list
    dtype: str          # MindSpore's name, e.g. "Float32", as ms.save_checkpoint records it
    data: object        # its bytes: a bytes object or a flat numpy array


# dtypes whose asnumpy() is the tensor's own bytes (a view of them on the host); others (bfloat16)
# are read with get_bytes(), as ms.save_checkpoint does
_NUMPY_DTYPES = {"Float64", "Float32", "Float16", "Int64", "Int32", "Int16", "Int8", "UInt8", "Bool"}


def host_copy(params: dict, copy: bool = True) -> list[HostTensor]:
    """The state parameters' values now, in host memory: the same tensors, in the same order, as
    ms.save_checkpoint of the list would store (pipeline-shared parameters are left out as it does).
    `copy`: a snapshot (the next step changes the parameters in place); without it the arrays may be
    views of the parameters (on CPU asnumpy() is one), valid until the next step. A background write
    takes its snapshot with `ModelImage.fill` instead (the copy goes straight to its place in the file)."""
    from mindspore import Parameter

    out = []
    for name, p in params.items():
        if isinstance(p, Parameter):
            if p.param_info.is_pipeline_shared_param:
                continue
            p.init_data()
        if str(p.dtype) in _NUMPY_DTYPES:
            data = np.ascontiguousarray(p.asnumpy()).reshape(-1)
            if copy:
                data = data.copy()
        else:
            data = p.get_bytes()
        out.append(HostTensor(name, list(p.shape), str(p.dtype), data))
    return out


def _slice_bytes() -> int:
    from mindspore.train.serialization import SLICE_SIZE      # KiB per record of one tensor
    return 1024 * SLICE_SIZE


def write_model_file(path, tensors: "list[HostTensor] | ModelImage", slice_bytes: int | None = None,
                     pace: "Pacer | None" = None) -> dict:
    """Write model.ckpt in ms.save_checkpoint's format, fsync it, and return its {"sha256", "bytes"}.

    The file is a sequence of serialized `Checkpoint` protobuf records (mindspore/train/checkpoint.proto),
    one per tensor slice of up to SLICE_SIZE KiB: byte for byte what ms.save_checkpoint writes for the
    same tensors (tested). Each record's few header bytes are encoded here and the tensor's bytes are
    written straight from the host copy, without the two copies protobuf would make of them. The digest
    is taken of the same bytes as they are written, so it needs no second pass over the file.

    `tensors` a list (a synchronous write: the training thread waits for it): a helper thread hashes
    while the bytes are written and fsynced (hashlib and file writes release the GIL), the shortest
    wall time. A `ModelImage` (a background write's snapshot), or a list with `pace`: the file's bytes
    are hashed and written from the image in PACE_CHUNK pieces past the page cache (`_write_image`),
    at the rate `pace` sets."""
    step = slice_bytes or _slice_bytes()
    if isinstance(tensors, ModelImage) or pace is not None:
        image = tensors if isinstance(tensors, ModelImage) else ModelImage().fill(tensors, step)
        return _write_image(path, image, pace)
    parts = [part for t in tensors for part in _record_parts(t, step)]
    sha, size = hashlib.sha256(), 0
    with ThreadPoolExecutor(1, thread_name_prefix="ckpt-digest") as hasher, open(path, "wb") as f:
        hashed = []
        for part in parts:
            hashed.append(hasher.submit(sha.update, part))     # in order: one worker
            f.write(part)
            size += len(part)
        f.flush()
        os.fsync(f.fileno())
        for h in hashed:
            h.result()
    return {"sha256": sha.hexdigest(), "bytes": size}


PACE_CHUNK = 8 << 20        # bytes hashed and written between two pacing points (a multiple of _ALIGN)
_ALIGN = 4096               # O_DIRECT: buffer address, file offset and length in whole blocks (4 KiB covers all)


def _record_parts(t: HostTensor, step: int):
    """The file's pieces for one tensor: each slice's record head, then the slice's bytes (a view)."""
    view = _bytes_of(t.data)
    for i in range(0, len(view), step):
        content = view[i:i + step]
        yield _record_head(t, len(content))
        yield content


def _bytes_of(data) -> memoryview:
    return memoryview(data).cast("B") if isinstance(data, np.ndarray) else memoryview(data)


class ModelImage:
    """model.ckpt's bytes in host memory: a background write's snapshot (checkpoint.async).

    `fill` copies the tensors to their places in the file, between the record heads, in a page-aligned
    buffer that the next snapshot reuses (the heads are encoded again only when the tensors' names,
    shapes or types change). The write (`_write_image`) then hashes the buffer and hands it to the
    disk past the page cache (O_DIRECT): no copy into the page cache and no writeback of it, the CPU
    a buffered write of the file would take beside the training step (measured: 241 MB buffered, a
    fdatasync per 8 MiB, 130-210 ms of system CPU plus the kernel's writeback; direct 5-7 ms)."""

    def __init__(self):
        self._mem: mmap.mmap | None = None
        self._layout: list | None = None        # (name, dims, dtype, bytes) per tensor, and the slice size
        self._places: list = []                 # per tensor: the (offset, bytes) of each slice's content
        self.size = 0                           # the file's length (the buffer is padded to _ALIGN)

    def fill(self, tensors: list[HostTensor], slice_bytes: int | None = None) -> "ModelImage":
        """Copy `tensors` (e.g. `host_copy(params, copy=False)`: views of the parameters) into the image."""
        step = slice_bytes or _slice_bytes()
        views = [_bytes_of(t.data) for t in tensors]
        layout = [(t.name, list(t.dims), t.dtype, len(v)) for t, v in zip(tensors, views)] + [step]
        if layout != self._layout:
            self._lay_out(tensors, step)
            self._layout = layout
        buf = np.frombuffer(self._mem, np.uint8)
        copies = []         # (to, from) byte arrays, in file order
        for view, places in zip(views, self._places):
            src = np.frombuffer(view, np.uint8)
            done = 0
            for offset, n in places:
                copies.append((buf[offset:offset + n], src[done:done + n]))
                done += n
        _copy_in_parallel(copies, SNAPSHOT_THREADS)
        return self

    def _lay_out(self, tensors, step) -> None:
        heads, places, offset = [], [], 0
        for t in tensors:
            mine, parts = [], _record_parts(t, step)
            for head, content in zip(parts, parts):      # the file's pieces: head, content, head, ...
                heads.append((offset, head))
                mine.append((offset + len(head), len(content)))
                offset += len(head) + len(content)
            places.append(mine)
        padded = max(_ALIGN, -(-offset // _ALIGN) * _ALIGN)
        if self._mem is None or len(self._mem) != padded:
            self._mem = mmap.mmap(-1, padded)        # anonymous: page aligned, zeros
            if hasattr(mmap, "MADV_HUGEPAGE"):       # fewer pages for the copy and the disk's DMA to walk
                self._mem.madvise(mmap.MADV_HUGEPAGE)
        else:
            self._mem[offset:] = bytes(padded - offset)      # the padding stays zeros
        for at, head in heads:
            self._mem[at:at + len(head)] = head
        self._places, self.size = places, offset

    def padded_view(self) -> memoryview:
        """The buffer: the file's bytes, then zeros up to a whole block."""
        return memoryview(self._mem)


SNAPSHOT_THREADS = min(4, os.cpu_count() or 1)     # the training thread waits for the snapshot: every core copies


def _copy_in_parallel(copies: list, threads: int) -> None:
    """np.copyto each (to, from) pair, the bytes split evenly over `threads` threads, the calling one
    included (numpy copies without holding the GIL). The cores are otherwise idle while the training
    thread waits for this (measured, 241 MB on 2 cores: 38 ms on one thread, 24 ms on two)."""
    share = -(-sum(len(to) for to, _ in copies) // max(threads, 1))
    groups, group, left = [], [], share
    for to, src in copies:
        while len(to):
            n = min(left, len(to))
            group.append((to[:n], src[:n]))
            to, src, left = to[n:], src[n:], left - n
            if left == 0:
                groups.append(group)
                group, left = [], share
    if group:
        groups.append(group)

    def run(pairs):
        for to, src in pairs:
            np.copyto(to, src)
    if len(groups) <= 1:
        return run(groups[0] if groups else [])
    with ThreadPoolExecutor(len(groups) - 1, thread_name_prefix="ckpt-snapshot") as pool:
        done = [pool.submit(run, g) for g in groups[1:]]
        run(groups[0])
        for d in done:
            d.result()


def _write_image(path, image: ModelImage, pace: "Pacer | None") -> dict:
    """Hash and write `image` to `path` in PACE_CHUNK pieces, at `pace`'s rate, and fsync it. Written
    past the page cache (O_DIRECT) where the file system takes it: whole blocks from the aligned
    buffer, the last padded and the file then cut to its length; elsewhere a buffered write, each
    piece flushed to the disk before the next (its writeback's CPU spread like the rest)."""
    view, size = image.padded_view(), image.size
    sha = hashlib.sha256()
    fd, direct = _open_for_image(path)
    try:
        if pace is not None:
            pace.begin(size)
        for i in range(0, size, PACE_CHUNK):
            n = min(PACE_CHUNK, size - i)
            sha.update(view[i:i + n])
            if direct:
                direct = _write_direct(fd, view[i:i + -(-n // _ALIGN) * _ALIGN])
            else:
                _write_all(fd, view[i:i + n])
                if pace is not None and not pace.hurry.is_set():
                    os.fdatasync(fd)
            if pace is not None:
                pace.wait(i + n)
        os.ftruncate(fd, size)      # a direct write's padding
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"sha256": sha.hexdigest(), "bytes": size}


def _open_for_image(path) -> tuple[int, bool]:
    """An fd to write `path` from the start, and whether it is O_DIRECT (not every file system
    takes it: EINVAL)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    if hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, flags | os.O_DIRECT, 0o666), True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o666), False


def _write_direct(fd: int, data: memoryview) -> bool:
    """Write whole blocks with O_DIRECT; where the kernel refuses it after all (EINVAL, which writes
    nothing: e.g. a device with larger blocks) the fd drops O_DIRECT and the rest goes through the
    page cache. Whether it is still direct."""
    import fcntl

    while len(data):
        try:
            data = data[os.write(fd, data):]
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
            _write_all(fd, data)
            return False
    return True


def _write_all(fd: int, data: memoryview) -> None:
    while len(data):
        data = data[os.write(fd, data):]


class Pacer:
    """The rate of a background write: `budget_s` seconds for the whole model file, so that the work
    is spread over the steps of that time. `wait(done)` sleeps while the write is ahead of an even
    rate; `hurry` (set when the training thread waits for the write: the next checkpoint, the run's
    end, a rollback, an interrupt) ends every wait at once, so pacing never holds up the run. A write
    slower than its budget (a loaded machine) never waits at all."""

    def __init__(self, budget_s: float, hurry: threading.Event):
        self.budget_s, self.hurry = budget_s, hurry
        self._t0, self._total = 0.0, 1

    def begin(self, total: int) -> None:
        self._t0, self._total = time.monotonic(), max(total, 1)

    def wait(self, done: int) -> None:
        ahead = self._t0 + self.budget_s * done / self._total - time.monotonic()
        if ahead > 0:
            self.hurry.wait(ahead)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _record_head(t: HostTensor, content_len: int) -> bytes:
    """The bytes of Checkpoint{value: [{tag, tensor: {dims, tensor_type, tensor_content}}]} that come
    before tensor_content (proto2: field 1 of each message is length-delimited, key 0x0a; dims are
    unpacked varints, key 0x08; tensor_type key 0x12, tensor_content key 0x1a)."""
    tag, dtype = t.name.encode(), t.dtype.encode()
    tensor_head = (b"".join(b"\x08" + _varint(d) for d in t.dims) + b"\x12" + _varint(len(dtype)) + dtype
                   + b"\x1a" + _varint(content_len))
    tensor_len = len(tensor_head) + content_len
    value_head = b"\x0a" + _varint(len(tag)) + tag + b"\x12" + _varint(tensor_len)
    value_len = len(value_head) + tensor_len
    return b"\x0a" + _varint(value_len) + value_head + tensor_head


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def checkpoints_root(run_dir) -> Path:
    return Path(run_dir) / CKPT_DIR


def list_checkpoints(run_dir) -> list[Path]:
    """Complete (renamed) checkpoint directories, oldest first."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_RE.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir) -> Path | None:
    """The directory `latest` names, checked to be complete; None when there is no `latest`."""
    root = checkpoints_root(run_dir)
    pointer = root / LATEST
    if not pointer.exists():
        return None
    name = _pointer_name(pointer)
    ckpt = root / name if name else None
    if ckpt is None or not (ckpt / STATE_FILE).is_file():
        raise CheckpointError(f"{pointer} names {name or pointer.read_bytes()[:40]!r}, which is not a "
                              f"complete checkpoint directory (`train launch --resume auto` finds the "
                              f"newest complete one; other commands take --checkpoint/--step)")
    return ckpt


def _pointer_name(pointer: Path) -> str | None:
    """The checkpoint name in `latest`, or None when it holds anything else (garbage, binary)."""
    try:
        name = pointer.read_bytes().decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name if _STEP_RE.match(name) else None


def find_resumable(run_dir, warn=None) -> Path | None:
    """The newest checkpoint that passes `check_checkpoint`, for `--resume auto`; None when the run
    has no checkpoint at all (and no `latest`). Each newer one passed over, and a `latest` that is
    missing, garbage or names another, is reported through `warn`. CheckpointError when checkpoints
    exist but none is complete: nothing is changed then."""
    warn = warn or (lambda s: print(s, file=sys.stderr, flush=True))
    root = checkpoints_root(run_dir)
    pointer = root / LATEST
    named = _pointer_name(pointer) if pointer.exists() else None
    passed_over = []
    for ckpt in reversed(list_checkpoints(run_dir)):
        try:
            check_checkpoint(ckpt)
        except CheckpointError as e:
            passed_over.append(str(e))
            continue
        for problem in passed_over:
            warn(f"[train] warning: skipping a damaged checkpoint: {problem}")
        if named != ckpt.name:
            said = ("is missing" if not pointer.exists() else
                    f"names {named}" if named else "does not hold a checkpoint name")
            warn(f"[train] warning: {pointer} {said}; resuming from the newest complete checkpoint, "
                 f"{ckpt.name}")
        return ckpt
    if passed_over or pointer.exists():
        found = "; ".join(passed_over) or f"{pointer} exists but no checkpoint directory does"
        raise CheckpointError(f"no complete checkpoint to resume from in {root}: {found}. "
                              f"Nothing was changed.")
    return None


def repoint_latest(run_dir, ckpt_dir) -> bool:
    """After a resume from `ckpt_dir` of this run: make `latest` name it if it names anything else
    (missing, garbage, a damaged checkpoint). Returns whether it changed."""
    root = checkpoints_root(run_dir)
    ckpt_dir = Path(ckpt_dir)
    if ckpt_dir.parent.resolve() != root.resolve() or not _STEP_RE.match(ckpt_dir.name):
        return False
    pointer = root / LATEST
    if pointer.exists() and _pointer_name(pointer) == ckpt_dir.name:
        return False
    atomic_write_text(pointer, ckpt_dir.name + "\n")
    return True


def check_checkpoint(ckpt_dir, out=None) -> dict:
    """state.json of `ckpt_dir`, after checking it (`check_state`) and every file's digest; or
    CheckpointError naming the file."""
    state = read_state(ckpt_dir)
    check_state(state, ckpt_dir)
    verify_files(ckpt_dir, state, out=out)
    return state


def remove_stale_temps(run_dir) -> None:
    """Temporary directories of a write that never finished (the process was killed)."""
    root = checkpoints_root(run_dir)
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(".tmp-"):
                shutil.rmtree(p) if p.is_dir() else p.unlink()


def write_checkpoint(run_dir, step: int, params: "dict | list | ModelImage", state: dict, keep_max: int,
                     rank: int | None = None, is_main: bool = True, barrier=None,
                     add_files=None, on_phase=None, pace: Pacer | None = None) -> Path:
    """Write checkpoint `step` atomically and publish it as latest. `params`: name -> Parameter, or
    a snapshot of them: their `host_copy`, or a `ModelImage` (a background write). `rank` set: per-rank model file
    (sharded); then every rank calls this, `barrier()` separates the rank writes from the rename.
    `add_files(tmp_dir)`: each rank's extra files (e.g. its parallel strategy), written into the
    temporary directory before the second barrier, so they are published with the checkpoint.
    `on_phase(phase, step)`: see the module docstring. `pace`: a background write's rate (`Pacer`)."""
    root = checkpoints_root(run_dir)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}"
    try:
        if is_main:
            root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
        if barrier:
            barrier()
        model_dir = tmp / f"rank_{rank}" if rank is not None else tmp
        model_dir.mkdir(exist_ok=True)
        model_path = model_dir / MODEL_FILE
        tensors = params if isinstance(params, (list, ModelImage)) else host_copy(params, copy=False)
        digests = {model_path.relative_to(tmp).as_posix(): write_model_file(model_path, tensors, pace=pace)}
        use_umask(model_path, readonly=True)
        if on_phase:
            on_phase("model_written", step)
        fsync_path(model_dir)
        if add_files:
            for path in add_files(tmp) or ():
                fsync_path(path)
                fsync_path(path.parent)
                digests[path.relative_to(tmp).as_posix()] = file_digest(path)
        if rank is not None:        # the main rank merges every rank's digests into state.json
            atomic_write_json(tmp / _DIGESTS.format(rank), digests)
        if barrier:
            barrier()
        if not is_main:
            return final
        if rank is not None:
            digests = _merge_rank_digests(tmp)
        atomic_write_json(tmp / STATE_FILE, {**state, FILES_KEY: dict(sorted(digests.items()))})
        fsync_path(tmp)
        if on_phase:
            on_phase("before_rename", step)
        if final.exists():       # the same step again after a resume from an older (or past a damaged) one
            _move_aside(final)
        os.rename(tmp, final)
        fsync_path(root)
        if on_phase:
            on_phase("before_latest", step)
        atomic_write_text(root / LATEST, final.name + "\n")
    except (OSError, RuntimeError, ValueError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"cannot write checkpoint {final}: {e} (earlier checkpoints are untouched)") from e
    prune(run_dir, keep_max)
    if _remove_resharded(run_dir):       # a resume onto a new layout: its bridge is no longer needed
        print(f"[train] removed {Path(run_dir) / 'resharded'}: {final.name} is this layout's own "
              f"checkpoint", file=sys.stderr, flush=True)
    return final


def _remove_resharded(run_dir) -> bool:
    """Remove RUN/resharded (train/reshard.py: the transformed files a resume on a new layout loaded)
    once the run has a checkpoint of its own; returns whether there was one."""
    path = Path(run_dir) / RESHARDED
    if not path.exists():
        return False
    shutil.rmtree(path)
    return True


class BackgroundWriter:
    """checkpoint.async: runs one checkpoint write at a time on a background thread.

    `start` waits for the write before it (so at most one is in flight, and checkpoints are published
    in step order); `check` (at every step boundary) and `wait` (at the run's end) raise the
    CheckpointError of a write that failed, which stops the run. A process killed during a write
    leaves its temporary directory and the previous `latest`, as a synchronous write would.

    The model file is written at a pace (`Pacer`): over `share` of the time until the next checkpoint
    (`every_steps` times the median interval between the last `check` calls, one per step), so that
    on a machine whose cores the training step fills, the write's CPU is taken a little from each of
    those steps rather than all from the first. 0.8: the thinner the spread the less each step pays
    (a 241 MB write on 2 cores: +40 ms a step over half the interval), and 0.2 of the interval is
    left for a write that runs slow to finish before the next checkpoint waits for it; the price is
    that a checkpoint is complete (and `latest`) later. `wait` lifts the pace (the write then finishes at
    full speed). Without `every_steps`, or before any step was timed, the write is not paced.

    The writing thread also runs below the training threads' priority (`_lower_priority`: SCHED_IDLE,
    or WRITER_NICE nice levels where the process could not take it out of SCHED_IDLE again; Linux
    sets both per thread): MindSpore's CPU kernels split each op over a pool of threads that
    wait for each other, so a writer taking a core from one of them held up the whole op (measured:
    a 241 MB write cost the steps beside it more wall time than the CPU it used); at the lower
    priority it runs in the time the pool leaves idle. `wait` raises the priority back where the
    process may (the training thread is waiting for it then)."""

    def __init__(self, every_steps: int = 0, share: float = 0.8):
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._step: int | None = None
        self.image = ModelImage()   # the snapshot, reused by the next checkpoint once this one is written
        self.every_steps, self.share = every_steps, share
        self._hurry = threading.Event()
        self._ticks: deque = deque(maxlen=33)         # time.monotonic() of the last `check` calls
        self._tid: int | None = None                  # the writing thread's id, once it lowered its priority

    def budget_s(self) -> float:
        """The seconds a write may take: `share` of the time until the next checkpoint (0: no pace)."""
        ticks = list(self._ticks)
        gaps = sorted(b - a for a, b in zip(ticks, ticks[1:]))
        if not gaps or self.every_steps <= 0:
            return 0.0
        return self.share * self.every_steps * gaps[len(gaps) // 2]

    def start(self, step: int, write) -> None:
        """Run `write(pace)` on the background thread (`pace`: the `Pacer` for write_checkpoint)."""
        self.wait()
        self._step = step
        self._hurry.clear()
        self._tid = None
        pace = Pacer(self.budget_s(), self._hurry)

        def run():
            try:
                self._tid = _lower_priority()
                write(pace)
            except BaseException as e:        # handed to the training thread by check / wait
                self._error = e
        self._thread = threading.Thread(target=run, name=f"checkpoint-{step_dir_name(step)}", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """At every step boundary: raise now if the write in the background has failed (returns at
        once otherwise); the time between two calls is a step's, for the pace."""
        self._ticks.append(time.monotonic())
        if self._thread is not None and not self._thread.is_alive():
            self.wait()

    def wait(self) -> None:
        if self._thread is not None:
            self._hurry.set()       # the training thread waits: no more pacing, nor a lower priority
            if self._thread.is_alive() and self._tid is not None:
                _restore_priority(self._tid)
            self._thread.join()
            self._thread = None
        if self._error is not None:
            e, self._error = self._error, None
            detail = str(e) if isinstance(e, CheckpointError) else f"{type(e).__name__}: {e}"
            raise CheckpointError(f"the background write of checkpoint step {self._step} failed, so the run "
                                  f"stops: {detail}") from e


WRITER_NICE = 10        # where SCHED_IDLE cannot be undone: a background write's niceness above the process's


def _lower_priority() -> int | None:
    """Put the calling thread below the training threads (Linux: per thread); its id, or None where
    the platform sets priorities per process only.

    SCHED_IDLE where this process may take a thread out of it again (`_idle_reversible`): the thread
    then runs only on a core no other thread wants, and a kernel-pool thread that wakes preempts it
    at once (at a nice level it may keep the core for a time slice, holding up the pool's op). Where
    it may not (an unprivileged process: RLIMIT_NICE), WRITER_NICE nice levels instead: a thread
    stuck in SCHED_IDLE would crawl on a machine busy with other work while the trainer waits."""
    if not sys.platform.startswith("linux"):
        return None
    tid = threading.get_native_id()
    try:
        if _idle_reversible():
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        else:
            base = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, base + WRITER_NICE))
    except OSError:
        return None
    return tid


def _restore_priority(tid: int) -> None:
    """Give thread `tid` the process's scheduling policy and priority again; without the privilege to
    raise a priority (RLIMIT_NICE, CAP_SYS_NICE) it keeps the lower one and finishes in the CPU time
    left to it (never stuck in SCHED_IDLE: `_lower_priority` uses it only where it can be undone)."""
    try:
        if os.sched_getscheduler(tid) == os.SCHED_IDLE:
            os.sched_setscheduler(tid, os.sched_getscheduler(os.getpid()), os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, os.getpid()))
    except OSError:
        pass


@functools.cache
def _idle_reversible() -> bool:
    """Whether a thread of this process may leave SCHED_IDLE once in it (Linux allows it within
    RLIMIT_NICE or with CAP_SYS_NICE). Probed once on a throwaway thread, which may stay in it."""
    answer = []

    def probe():
        tid = threading.get_native_id()
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(tid, os.sched_getscheduler(os.getpid()), os.sched_param(0))
            answer.append(True)
        except (OSError, AttributeError):       # AttributeError: a Python without SCHED_IDLE
            answer.append(False)
    t = threading.Thread(target=probe, name="checkpoint-priority-probe", daemon=True)
    t.start()
    t.join()
    return bool(answer and answer[0])


def _merge_rank_digests(tmp: Path) -> dict:
    merged = {}
    for part in sorted(tmp.glob(_DIGESTS.format("*"))):
        merged.update(json.loads(part.read_text()))
        part.unlink()
    return merged


def _move_aside(final: Path) -> None:
    """Never overwrite a checkpoint: the existing directory becomes STEP.replaced-N (not listed, not
    pruned; delete it when it is not wanted)."""
    n = 1
    while (aside := final.with_name(f"{final.name}.replaced-{n}")).exists():
        n += 1
    os.rename(final, aside)
    print(f"[train] {final} existed (from before this resume); moved it to {aside.name}",
          file=sys.stderr, flush=True)


def file_digest(path) -> dict:
    """{"sha256", "bytes"} of a file (hashlib reads it in large blocks without holding the GIL)."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {"sha256": digest, "bytes": Path(path).stat().st_size}


def verify_files(ckpt_dir, state: dict, out=None) -> None:
    """Every file state.json lists has its recorded size and sha256; CheckpointError names the first
    that does not. A checkpoint without the record (written by an older trainer) is loaded with a
    warning: its files cannot be checked."""
    ckpt_dir = Path(ckpt_dir)
    files = state.get(FILES_KEY)
    if files is None:
        (out or (lambda s: print(s, file=sys.stderr, flush=True)))(
            f"[train] warning: {ckpt_dir / STATE_FILE} records no file digests (written by an older "
            f"trainer): {ckpt_dir.name}'s files are not verified")
        return
    if not isinstance(files, dict) or not files:
        raise CheckpointError(f"{ckpt_dir / STATE_FILE}: field {FILES_KEY!r} must map file names to "
                              f"digests, got {files!r}")
    for rel, want in sorted(files.items()):
        path = ckpt_dir / rel
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (listed in {ckpt_dir / STATE_FILE})")
        size = path.stat().st_size
        if not isinstance(want, dict) or size != want.get("bytes"):
            raise CheckpointError(f"{path}: {size} bytes, {STATE_FILE} recorded "
                                  f"{want.get('bytes') if isinstance(want, dict) else want!r} "
                                  f"(truncated or replaced)")
        if file_digest(path)["sha256"] != want.get("sha256"):
            raise CheckpointError(f"{path}: sha256 differs from the one {STATE_FILE} recorded when it "
                                  f"was written (the file is damaged or was replaced)")


def check_state(state: dict, ckpt_dir) -> None:
    """state.json's fields have their types and agree with each other and with the directory's name:
    a state edited or damaged by hand is an error naming the field before anything is written."""
    where = Path(ckpt_dir) / STATE_FILE

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise CheckpointError(f"{where}: {what}; this checkpoint cannot be resumed as it is")

    def count(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    step = state.get("step")
    need(count(step), f"field 'step' must be an integer >= 0, got {step!r}")
    m = _STEP_RE.match(Path(ckpt_dir).name)
    need(m is None or int(m.group(1)) == step,
         f"step {step} does not match the directory name {Path(ckpt_dir).name}")
    loader = state.get("loader")
    need(isinstance(loader, dict), f"field 'loader' (the loader state) must be an object, got {loader!r}")
    cursor, batch = loader.get("cursor"), loader.get("global_batch_size")
    need(count(cursor), f"field 'loader.cursor' must be an integer >= 0, got {cursor!r}")
    need(batch is None or (count(batch) and batch > 0),
         f"field 'loader.global_batch_size' must be a positive integer, got {batch!r}")
    need(step == 0 or cursor > 0, f"loader.cursor 0 after {step} steps")
    last = state.get("last_metrics")
    if isinstance(last, dict) and "step" in last:
        need(last["step"] == step, f"last_metrics.step {last['step']!r} != step {step}")
        if "consumed_samples" in last:
            need(last["consumed_samples"] == cursor,
                 f"last_metrics.consumed_samples {last['consumed_samples']!r} != loader.cursor {cursor}")
    need(count(state.get("bad_streak", 0)), f"field 'bad_streak' must be an integer >= 0, got "
                                            f"{state.get('bad_streak')!r}")


def prune(run_dir, keep_max: int) -> None:
    """Remove the oldest checkpoints beyond keep_max; never the one `latest` names."""
    if keep_max <= 0:
        return
    latest = latest_checkpoint(run_dir)
    ckpts = list_checkpoints(run_dir)
    for old in ckpts[:-keep_max]:
        if latest is None or old.name != latest.name:
            shutil.rmtree(old)


def read_state(ckpt_dir) -> dict:
    path = Path(ckpt_dir) / STATE_FILE
    try:
        state = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise CheckpointError(f"{path} not found: {ckpt_dir} is not a complete checkpoint") from None
    except (OSError, ValueError) as e:      # JSONDecodeError and invalid UTF-8 are ValueErrors
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(state).__name__}")
    return state


def load_params(ckpt_dir, params: dict, rank: int | None = None, allow_extra: bool = False,
                verify: bool = True, live: bool = False) -> None:
    """Copy the saved tensors into `params` (name -> Parameter); names and shapes must match exactly
    (`allow_extra`: the file may hold more, e.g. optimizer moments when only weights are wanted).
    `verify`: check the files' digests first (off when `check_checkpoint` has just done it).
    `live`: the parameters belong to a graph that has already run (a spike rollback): they are
    written with an assign op, because a GRAPH_MODE step keeps its own copy of some of them
    (MindSpore 2.10: the optimizer's int32 global_step ignored set_data, so Adam's bias correction
    kept counting from the discarded steps)."""
    path = Path(ckpt_dir) / (f"rank_{rank}" if rank is not None else "") / MODEL_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} not found")
    if verify:
        verify_files(ckpt_dir, read_state(ckpt_dir))
    saved = load_file(path)
    missing = sorted(set(params) - set(saved))
    extra = [] if allow_extra else sorted(set(saved) - set(params))
    if missing or extra:
        raise CheckpointError(f"{path} does not match this model: missing {missing[:5]}, unexpected "
                              f"{extra[:5]} (was it written with another model config?)")
    for name, p in params.items():
        value = saved[name]
        if tuple(value.shape) != tuple(p.shape) or value.dtype != p.dtype:
            raise CheckpointError(f"{path}: {name} is {value.dtype}{tuple(value.shape)}, the model has "
                                  f"{p.dtype}{tuple(p.shape)}")
        if live:
            ms.ops.assign(p, value)
        else:
            p.set_data(value)


def load_file(path) -> dict:
    """ms.load_checkpoint, with a damaged file (empty, truncated, not a checkpoint) as CheckpointError."""
    try:
        return ms.load_checkpoint(str(path))
    except (ValueError, RuntimeError, TypeError, OSError) as e:
        raise CheckpointError(f"{path}: cannot be read as a checkpoint ({str(e).splitlines()[0][:200]})") from None
