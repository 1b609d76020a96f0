"""Rolling MindRecord writer: one file per shard (shard_num=1), each file plus its .db index kept at or
under a byte cap, samples numbered globally and contiguously across shards.

MindRecord has no size cap of its own and pads every file with a header area and whole pages
(measured with MindSpore 2.10), so the writer sizes the header and pages from the cap and rolls to a new file
once a conservative per-sample bound says the next sample might not fit.
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from pathlib import Path

import numpy as np

from mspretrain.loader.manifest import ShardInfo, mindrecord_schema, sha256_file, shard_file_name
from mspretrain.common.fsmode import use_umask

WRITE_BATCH = 1000           # MindRecord writes fastest with >= 1,000 rows a call
_DB_BASE = 96 * 1024         # SQLite index: fixed part ...
_DB_PER_ROW = 128            # ... and a bound per row (measured ~47 B)
_ROW_OVERHEAD = 64           # raw page entry (sample_id, offsets) per row, bound


def layout_for_cap(max_bytes: int) -> tuple[int, int]:
    """(header_size, page_size) for a file capped at max_bytes: big pages where room allows."""
    page = int(min(32 << 20, max(32 << 10, _pow2_floor(max_bytes // 256))))
    header = int(min(4 << 20, max(16 << 10, _pow2_floor(max_bytes // 512))))
    return header, page


def shard_capacity(max_bytes: int, seq_length: int) -> int:
    """Samples that surely fit under max_bytes, even if MindRecord's compression gains nothing."""
    header, page = layout_for_cap(max_bytes)
    per_sample = 4 * (seq_length + 1) * 65 // 64 + _ROW_OVERHEAD + _DB_PER_ROW
    room = max_bytes - header - 2 * page - _DB_BASE
    return max(0, room // per_sample)


class ShardWriter:
    """Writes samples of one split into DIR/shards/<split>-NNNNN.mindrecord, rolling by size.

    `write(rows)` takes an int32 array [n, seq_length + 1]; `close()` returns the ShardInfo list.
    """

    def __init__(self, root: str | os.PathLike, split: str, seq_length: int, max_bytes: int,
                 first_shard: int = 0, first_sample: int = 0):
        self.root, self.split, self.seq_length, self.max_bytes = Path(root), split, seq_length, max_bytes
        self.capacity = shard_capacity(max_bytes, seq_length)
        if self.capacity < 1:
            raise ValueError(f"max shard size {max_bytes} B cannot hold one sample of "
                             f"{seq_length + 1} tokens; raise --max-shard-bytes")
        self.shards: list[ShardInfo] = []
        self._next_shard, self._next_sample = first_shard, first_sample
        self._writer = None
        self._rows_in_file = 0
        self._pending: list[dict] = []

    def write(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.int32)
        if rows.ndim != 2 or rows.shape[1] != self.seq_length + 1:
            raise ValueError(f"rows must be [n, {self.seq_length + 1}], got {rows.shape}")
        for row in rows:
            if self._writer is None:
                self._open()
            self._pending.append({"input_ids": row, "sample_id": self._next_sample})
            self._next_sample += 1
            self._rows_in_file += 1
            if len(self._pending) >= WRITE_BATCH:
                self._flush()
            if self._rows_in_file >= self.capacity:
                self._finish_file()

    def close(self) -> list[ShardInfo]:
        if self._writer is not None:
            self._finish_file()
        return self.shards

    @contextlib.contextmanager
    def _os_errors(self):
        """MindRecord reports a failed write as a RuntimeError of many lines: an OSError naming
        the shard instead, ENOSPC where the file system has no room for another page."""
        try:
            yield
        except RuntimeError as e:
            path = self.root / self._file
            header, page = layout_for_cap(self.max_bytes)
            free = shutil.disk_usage(self.root).free
            if free < header + 2 * page:
                raise OSError(errno.ENOSPC, f"No space left on device ({free} bytes free)",
                              str(path)) from None
            raise OSError(errno.EIO, f"MindRecord could not write the shard "
                          f"({str(e).strip().splitlines()[0]})", str(path)) from None

    def _open(self) -> None:
        # imported when a process first writes a shard: `import mindspore` loads the whole framework
        # (1-2 CPU-s, ~400 MB), which no other task needs
        from mindspore.mindrecord import FileWriter
        self._file = shard_file_name(self.split, self._next_shard)
        path = self.root / self._file
        path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = FileWriter(str(path), shard_num=1, overwrite=True)
        header, page = layout_for_cap(self.max_bytes)
        self._writer.set_header_size(header)
        self._writer.set_page_size(page)
        self._writer.add_schema(mindrecord_schema(self.seq_length), "packed_tokens")
        self._first = self._next_sample
        self._rows_in_file = 0

    def _flush(self) -> None:
        if self._pending:
            with self._os_errors():
                self._writer.write_raw_data(self._pending)
            self._pending = []

    def _finish_file(self) -> None:
        self._flush()
        with self._os_errors():
            self._writer.commit()
        self._writer = None
        path = self.root / self._file
        use_umask(path, f"{path}.db")     # MindRecord's writer makes them owner-only
        size = path.stat().st_size + Path(f"{path}.db").stat().st_size
        if size > self.max_bytes:   # the bound above is meant to make this impossible
            raise RuntimeError(f"{path}: {size} B exceeds the cap of {self.max_bytes} B")
        self.shards.append(ShardInfo(file=self._file, first_sample=self._first,
                                     num_samples=self._rows_in_file, bytes=size,
                                     sha256=sha256_file(path), db_sha256=sha256_file(f"{path}.db")))
        logging.getLogger(__name__).debug("wrote %s: %d samples, %d B", path, self._rows_in_file, size)
        self._next_shard += 1


def _pow2_floor(n: int) -> int:
    return 1 << max(0, int(n).bit_length() - 1)
