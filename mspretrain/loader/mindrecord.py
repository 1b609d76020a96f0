"""Random-access reads of contract-1 MindRecord shards with numpy and sqlite3 only (no MindSpore).

A MindRecord data file is an 8-byte little-endian header length, a JSON header (schema, page size,
page list) inside a reserved header area, then fixed-size pages. Its `.db` companion is SQLite: table
INDEXES maps ROW_ID to the byte range of the row's blob inside a blob page, plus indexed scalar
fields (here `sample_id_0`). A row of our schema has one blob field, `input_ids` (int32), which
MindSpore stores compressed: a 4-byte big-endian element count, a bitmap with 2 bits per element
(0: int8, 1: int16, 2: int32, 3: int64), then each element little-endian in that width. Blob rows in
a page are each preceded by their 8-byte little-endian length.

`ShardFile.read(rows)` returns (input_ids [len(rows), L] int32, stored sample ids) in the order asked.
Every structural fact is checked; a mismatch raises ShardError naming the file (and row). With a
`ShardCheck`, a shard's data file and index must also have the sha256 the manifest records before any
row of it is read: the first process of a loader to open the shard hashes it, once per loader.
tests/loader/test_mindrecord.py checks this decoder byte-for-byte against MindSpore's own reader.
"""
from __future__ import annotations

import json
import mmap
import multiprocessing as mp
import os
import sqlite3
import struct
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from mspretrain.common.errors import MspretrainError
from mspretrain.loader.manifest import digest_faults


class ShardError(MspretrainError, RuntimeError):
    """A shard file that is missing, corrupt or not what the manifest says; names file and row."""


_INDEX_QUERY = ("SELECT ROW_ID, PAGE_ID_BLOB, PAGE_OFFSET_BLOB, PAGE_OFFSET_BLOB_END, sample_id_0 "
                "FROM INDEXES WHERE ROW_ID IN ({})")
_SQL_CHUNK = 900          # stay under SQLite's bound-parameter limit
_U64 = struct.Struct("<Q")
# bitmap byte -> the byte widths of its 4 elements (2-bit code k each, first element in the top
# bits, width 2^k)
_SIZES = np.array([[1 << ((b >> s) & 3) for s in (6, 4, 2, 0)] for b in range(256)], dtype=np.int32)


class ShardFile:
    """One opened shard: the data file memory-mapped, its SQLite index open read-only."""

    def __init__(self, path: str | os.PathLike, seq_length: int, num_rows: int):
        self.path = Path(path)
        self.width = seq_length + 1
        self.num_rows = num_rows
        try:
            with open(self.path, "rb") as f:     # the map outlives the descriptor: one fd per shard
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise ShardError(f"{self.path}: cannot map shard ({e})") from None
        try:
            self._parse_header()
            self._db = self._open_index()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for name in ("_db", "_mm"):
            obj = self.__dict__.pop(name, None)
            if obj is not None:
                obj.close()

    def read(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(input_ids [len(rows), L] int32, the sample ids stored with them), in the order asked."""
        parts, sample_ids = self.blobs(rows)
        return decode_rows(parts, self.width, lambda i: f"{self.path}: row {rows[i]}"), sample_ids

    def blobs(self, rows: np.ndarray) -> tuple[list[bytes], np.ndarray]:
        """Each row's compressed input_ids blob, and its stored sample id."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size and (rows.min() < 0 or rows.max() >= self.num_rows):
            bad = rows[(rows < 0) | (rows >= self.num_rows)][0]
            raise ShardError(f"{self.path}: row {bad} out of range [0, {self.num_rows})")
        page, start, end, sample_ids = self._lookup(rows)
        starts = self._header_size + page * self._page_size + start
        return self._gather(rows, starts, end - start), sample_ids

    # -- structure ---------------------------------------------------------------------------------

    def _parse_header(self) -> None:
        mm = self._mm
        if len(mm) < 8:
            raise ShardError(f"{self.path}: too short to be a MindRecord file ({len(mm)} B)")
        (n,) = struct.unpack_from("<Q", mm, 0)
        try:
            header = json.loads(mm[8:8 + n]) if 0 < n < len(mm) else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            header = None
        if not isinstance(header, dict):
            raise ShardError(f"{self.path}: no valid MindRecord JSON header (corrupt file?)")
        try:
            self._header_size, self._page_size = int(header["header_size"]), int(header["page_size"])
            schema = header["schema"][0]
            blob_fields, fields = schema["blob_fields"], schema["schema"]
        except (KeyError, IndexError, TypeError, ValueError) as e:
            raise ShardError(f"{self.path}: MindRecord header lacks {e}") from None
        expected = {"input_ids": {"type": "int32", "shape": [self.width]}, "sample_id": {"type": "int64"}}
        if blob_fields != ["input_ids"] or fields != expected:
            raise ShardError(f"{self.path}: schema {fields} (blobs {blob_fields}) is not the "
                             f"contract-1 schema {expected}")

    def _open_index(self) -> sqlite3.Connection:
        db_path = Path(f"{self.path}.db")
        if not db_path.is_file():
            raise ShardError(f"{db_path}: index file missing")
        try:
            db = sqlite3.connect(f"{db_path.resolve().as_uri()}?mode=ro&immutable=1", uri=True,
                                 check_same_thread=False)
            db.execute("PRAGMA cache_size = -512")        # KiB: many shards stay open at once
            db.execute("SELECT ROW_ID FROM INDEXES LIMIT 1").fetchall()
            return db
        except sqlite3.DatabaseError as e:
            raise ShardError(f"{db_path}: unreadable index ({e})") from None

    def _lookup(self, rows: np.ndarray) -> tuple[np.ndarray, ...]:
        """Page id, start and end offset in the page, stored sample id, for each row (in order)."""
        wanted = np.unique(rows)
        found = []
        try:
            for i in range(0, wanted.size, _SQL_CHUNK):
                chunk = wanted[i:i + _SQL_CHUNK].tolist()
                found += self._db.execute(_INDEX_QUERY.format(",".join("?" * len(chunk))), chunk).fetchall()
        except sqlite3.DatabaseError as e:
            raise ShardError(f"{self.path}.db: index query failed ({e})") from None
        table = np.array(found, dtype=np.int64).reshape(-1, 5)
        table = table[np.argsort(table[:, 0], kind="stable")]
        if table.shape[0] != wanted.size or not np.array_equal(table[:, 0], wanted):
            missing = np.setdiff1d(wanted, table[:, 0])
            what = f"row {missing[0]} missing" if missing.size else "duplicate rows"
            raise ShardError(f"{self.path}.db: {what} in the index")
        at = np.searchsorted(wanted, rows)
        return tuple(table[at, j] for j in range(1, 5))

    # -- data --------------------------------------------------------------------------------------

    def _gather(self, rows: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> list[bytes]:
        """Each row's blob bytes (after its 8-byte length prefix), checked against the file."""
        mm, size = self._mm, len(self._mm)
        parts = []
        for row, s, n in zip(rows.tolist(), starts.tolist(), lengths.tolist()):
            if n < 8 or s < 0 or s + n > size:
                raise ShardError(f"{self.path}: row {row}: blob range [{s}, {s + n}) outside the file "
                                 f"({size} B): truncated or corrupt")
            if _U64.unpack_from(mm, s)[0] != n - 8:
                raise ShardError(f"{self.path}: row {row}: blob length {_U64.unpack_from(mm, s)[0]} "
                                 f"!= index {n - 8} (corrupt)")
            parts.append(mm[s + 8:s + n])
        return parts


def decode_rows(parts: list[bytes], width: int, name: Callable[[int], str]) -> np.ndarray:
    """Decompress blobs of `width` int32 each, all rows at once; `name(i)` names row i in errors."""
    count, bitmap_len = len(parts), (width + 3) // 4
    if count == 0:
        return np.zeros((0, width), dtype=np.int32)
    lengths = np.fromiter(map(len, parts), dtype=np.int64, count=count)
    base = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    blob = b"".join(parts) + bytes(4 + 4 + bitmap_len)        # padding: 4-byte reads never run off
    index_type = np.int32 if len(blob) < 1 << 31 else np.int64
    head = np.frombuffer(blob, dtype=np.uint8)[base[:, None] + np.arange(4 + bitmap_len)]
    n_elems = head[:, :4].astype(np.int64) @ np.array([1 << 24, 1 << 16, 1 << 8, 1])
    bad = np.flatnonzero(n_elems != width)
    if bad.size:
        raise ShardError(f"{name(bad[0])}: {n_elems[bad[0]]} tokens, expected {width} (corrupt)")
    sizes = _SIZES[head[:, 4:]].reshape(count, -1)[:, :width].astype(index_type, copy=False)
    ends = np.cumsum(sizes, axis=1, dtype=index_type)
    bad = np.flatnonzero((4 + bitmap_len + ends[:, -1] != lengths) | (sizes.max(axis=1) > 4))
    if bad.size:                       # an int32 column never needs 8-byte elements
        raise ShardError(f"{name(bad[0])}: compressed blob does not match its bitmap (corrupt)")
    ends -= sizes
    ends += (base + 4 + bitmap_len).astype(index_type)[:, None]     # now each element's offset
    # every element as the 4 little-endian bytes at its offset (an unaligned, 1-byte-strided view),
    # then shifted up and arithmetically back down: keeps its width, sign-extended
    words = np.ndarray((len(blob) - 3,), dtype="<u4", buffer=blob, strides=(1,))[ends]
    shift = (32 - 8 * sizes).astype(np.uint32)
    return (words << shift).view(np.int32) >> shift.view(np.int32)


class ShardCheck:
    """Which shards of a split have had their sha256 checked, shared by a loader's processes.

    Made in the loader's process before its workers fork, so the states live in an anonymous shared
    map: the first process to open a shard claims it (under a lock) and hashes its data file and
    index while the others wait for the outcome; a claimant that died is replaced. A shard is hashed
    once per loader however many workers read it, and workers restarted later (a resume) inherit it.
    """
    UNCHECKED, CLAIMED, GOOD, BAD = 0, 1, 2, 3

    def __init__(self, num_shards: int):
        n = max(1, num_shards)
        self._map = mmap.mmap(-1, 9 * n)
        self._owner = np.ndarray((n,), dtype=np.int64, buffer=self._map)     # the claimant's pid
        self._state = np.ndarray((n,), dtype=np.uint8, buffer=self._map, offset=8 * n)
        self._lock = mp.get_context("fork").Lock()

    def ensure(self, k: int, data: Path, sha256: str, db_sha256: str) -> None:
        """Return once shard `k` is known to match its digests; ShardError if it does not."""
        while not self._claim(k):
            if self._state[k] == self.GOOD:
                return
            if self._state[k] == self.BAD:
                raise ShardError(_mismatch(data))
            time.sleep(0.002)
        try:
            good = not digest_faults(data, sha256, db_sha256)
        except BaseException:
            self._state[k] = self.UNCHECKED
            raise
        self._state[k] = self.GOOD if good else self.BAD
        if not good:
            raise ShardError(_mismatch(data))

    def _claim(self, k: int) -> bool:
        with self._lock:
            state = self._state[k]
            if state == self.UNCHECKED or (state == self.CLAIMED and not _alive(int(self._owner[k]))):
                self._state[k], self._owner[k] = self.CLAIMED, os.getpid()
                return True
        return False


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _mismatch(data: Path) -> str:
    return (f"{data}: sha256 of the shard or its .db index differs from the manifest's (corrupted or "
            f"replaced since the build); no row of it was read. `dataprep verify` checks the whole dataset")


class ShardSet:
    """The shards of one split, opened lazily (per process) and kept open; reads global sample ids.
    `check`: verify each shard's digests before its first read (see ShardCheck)."""

    def __init__(self, root: Path, split_info, seq_length: int, max_open: int = 256,
                 check: ShardCheck | None = None):
        self.root, self.split, self.seq_length, self.max_open = root, split_info, seq_length, max_open
        self.check = check
        self._open: dict[int, ShardFile] = {}
        self._pid = os.getpid()
        self._starts = np.array([s.first_sample for s in split_info.shards], dtype=np.int64)

    def read(self, sample_ids: np.ndarray) -> np.ndarray:
        """input_ids [len(sample_ids), L] int32, in the order asked; checks the stored ids."""
        sample_ids = np.asarray(sample_ids, dtype=np.int64)
        if sample_ids.size and (sample_ids.min() < 0 or sample_ids.max() >= self.split.num_samples):
            raise ShardError(f"{self.root}: sample ids {sample_ids.min()}..{sample_ids.max()} outside "
                             f"[0, {self.split.num_samples})")
        shard_of = np.searchsorted(self._starts, sample_ids, side="right") - 1
        parts: list[bytes] = [b""] * sample_ids.size
        for k in np.unique(shard_of).tolist():
            where = np.flatnonzero(shard_of == k)
            rows = sample_ids[where] - self._starts[k]
            shard = self._shard(k)
            try:
                blobs, stored = shard.blobs(rows)
            except ShardError:
                raise
            except Exception as e:      # unforeseen: still name the file and rows
                raise ShardError(f"{shard.path}: rows {rows[:4].tolist()}...: {type(e).__name__}: {e}") from e
            bad = np.flatnonzero(stored != sample_ids[where])
            if bad.size:
                raise ShardError(f"{shard.path}: row {rows[bad[0]]} holds sample_id {stored[bad[0]]}, "
                                 f"the manifest says {sample_ids[where][bad[0]]}")
            for i, blob in zip(where.tolist(), blobs):
                parts[i] = blob

        def name(i: int) -> str:
            k = int(shard_of[i])
            return f"{self.root / self.split.shards[k].file}: row {sample_ids[i] - self._starts[k]}"
        return decode_rows(parts, self.seq_length + 1, name)

    def close(self) -> None:
        for shard in self._open.values():
            shard.close()
        self._open.clear()

    def _shard(self, k: int) -> ShardFile:
        if os.getpid() != self._pid:        # inherited across fork: never share fds or sqlite handles
            self._open, self._pid = {}, os.getpid()
        shard = self._open.pop(k, None)
        if shard is None:
            if len(self._open) >= self.max_open:
                self._open.pop(next(iter(self._open))).close()
            info = self.split.shards[k]
            _check_size(self.root / info.file, info.bytes)
            if self.check is not None:
                self.check.ensure(k, self.root / info.file, info.sha256, info.db_sha256)
            shard = ShardFile(self.root / info.file, self.seq_length, info.num_samples)
        self._open[k] = shard                # re-insert: dict order is least recently used first
        return shard


def _check_size(path: Path, expected: int) -> None:
    """Data file plus .db must have the manifest's size: catches truncated or swapped files cheaply."""
    try:
        size = path.stat().st_size + Path(f"{path}.db").stat().st_size
    except FileNotFoundError as e:
        raise ShardError(f"{e.filename}: shard file missing") from None
    if size != expected:
        raise ShardError(f"{path}: data + index are {size} B, the manifest says {expected} B "
                         f"(truncated, corrupt or from another build)")
