"""The model file's bytes: ms.save_checkpoint's format (model.ckpt), or safetensors (model.safetensors,
checkpoint.format: safetensors, safetensors_file.py), written from a host copy of the tensors
(`host_copy`) or from a reusable image of the whole file (`ModelImage`, the background write), with its
digest taken of the bytes as they are written, past the page cache where the file system allows.
"""
from __future__ import annotations

import errno
import hashlib
import mmap
import os
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import mindspore as ms
import numpy as np

from mspretrain.train.checkpoint.layout import CheckpointError


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


def model_format(path) -> str:
    """The model file's format, from its name as MindSpore reads it: "safetensors" for *.safetensors,
    else "ckpt"."""
    return "safetensors" if Path(path).suffix == ".safetensors" else "ckpt"


def write_model_file(path, tensors: "list[HostTensor] | ModelImage", slice_bytes: int | None = None,
                     pace: "Pacer | None" = None) -> dict:
    """Write the model file in ms.save_checkpoint's format, fsync it, and return its {"sha256", "bytes"}.
    The format follows `path`'s name (`model_format`); what follows is model.ckpt's (model.safetensors:
    safetensors_file.py).

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
    fmt = model_format(path)
    if isinstance(tensors, ModelImage) or pace is not None:
        image = tensors if isinstance(tensors, ModelImage) else ModelImage().fill(tensors, step, fmt)
        if image.format != fmt:
            raise CheckpointError(f"{path}: the snapshot was laid out as {image.format}, not {fmt}")
        return _write_image(path, image, pace)
    if fmt == "safetensors":
        from mspretrain.train.checkpoint import safetensors_file
        return safetensors_file.write(path, tensors, _bytes_of)
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
    """The model file's bytes in host memory: a background write's snapshot (checkpoint.async).

    `fill` copies the tensors to their places in the file (model.ckpt: between the record heads;
    model.safetensors: after the header, safetensors_file.layout), in a page-aligned
    buffer that the next snapshot reuses (the heads are encoded again only when the tensors' names,
    shapes or types change). The write (`_write_image`) then hashes the buffer and hands it to the
    disk past the page cache (O_DIRECT): no copy into the page cache and no writeback of it, the CPU
    a buffered write of the file would take beside the training step (measured: 241 MB buffered, a
    fdatasync per 8 MiB, 130-210 ms of system CPU plus the kernel's writeback; direct 5-7 ms)."""

    def __init__(self):
        self._mem: mmap.mmap | None = None
        self._layout: list | None = None        # (name, dims, dtype, bytes) per tensor, slice size, format
        self._places: list = []                 # per tensor: the (offset, bytes) of each slice's content
        self.size = 0                           # the file's length (the buffer is padded to _ALIGN)
        self.format = "ckpt"                    # the file's: "ckpt" or "safetensors" (model_format)

    def fill(self, tensors: list[HostTensor], slice_bytes: int | None = None, fmt: str = "ckpt") -> "ModelImage":
        """Copy `tensors` (e.g. `host_copy(params, copy=False)`: views of the parameters) into the image
        of a model file in format `fmt`."""
        step = slice_bytes or _slice_bytes()
        views = [_bytes_of(t.data) for t in tensors]
        layout = [(t.name, list(t.dims), t.dtype, len(v)) for t, v in zip(tensors, views)] + [step, fmt]
        if layout != self._layout:
            self._lay_out(tensors, step, fmt, [len(v) for v in views])
            self._layout, self.format = layout, fmt
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

    def _lay_out(self, tensors, step, fmt, sizes) -> None:
        heads, places, offset = [], [], 0
        if fmt == "safetensors":
            from mspretrain.train.checkpoint import safetensors_file
            head, starts, offset = safetensors_file.layout(tensors, sizes)
            heads, places = [(0, head)], [[(at, n)] for at, n in zip(starts, sizes)]
        else:
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


def file_digest(path) -> dict:
    """{"sha256", "bytes"} of a file (hashlib reads it in large blocks without holding the GIL)."""
    with open(path, "rb") as f:
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    return {"sha256": digest, "bytes": Path(path).stat().st_size}


def load_file(path) -> dict:
    """ms.load_checkpoint in the format of the file's name, with a damaged file (empty, truncated, not
    a checkpoint) as CheckpointError."""
    try:
        return ms.load_checkpoint(str(path), format=model_format(path))
    except (ValueError, RuntimeError, TypeError, OSError, struct.error) as e:
        raise CheckpointError(f"{path}: cannot be read as a checkpoint ({str(e).splitlines()[0][:200]})") from None
