"""Where the plan's tasks keep their intermediates inside the work dir, and the small helpers every task
uses: order keys, partitioning hashes, atomic parquet writes, task markers."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mspretrain.dataprep.config import BuildConfig
from mspretrain.dataprep.records import InputFile
from mspretrain.dataprep.workdir import WorkDir, read_json
from mspretrain.common import arrow
from mspretrain.common.files import atomic_path, atomic_write_json

UNIT_BITS = 40               # order key = (unit << UNIT_BITS) | row within the unit
CHUNK_STRIDE = 1_000_000     # chunk c of unit u is the work dir's chunk u * CHUNK_STRIDE + c
# a labels file: each document's component label (dedup.components, labels.label_round)
LABELS_SCHEMA = pa.schema([("order", pa.int64()), ("label", pa.int64())])


@dataclass(frozen=True)
class Ctx:
    """What every task needs: the config, the work dir and the hooks spec (hooks.py; tests only)."""
    out: str
    cfg: BuildConfig
    partitions: int
    hooks: str = ""

    @property
    def work(self) -> WorkDir:
        return WorkDir(Path(self.out))

    @property
    def plan_dir(self) -> Path:
        return self.work.plan

    def stage_dir(self, stage: str) -> Path:
        d = self.plan_dir / stage
        d.mkdir(parents=True, exist_ok=True)
        return d

    def marker(self, stage: str, name: str) -> Path:
        return self.stage_dir("done") / f"{stage}-{name}.json"


@dataclass(frozen=True)
class Unit:
    index: int
    file: InputFile
    fmt: str = ""   # the format the driver reads the file as: a worker that reads another fails


def chunk_index(unit: int, chunk: int) -> int:
    return unit * CHUNK_STRIDE + chunk


def unit_range(unit: int) -> tuple[int, int]:
    """[lo, hi) of the order keys of a unit's documents."""
    return unit << UNIT_BITS, (unit + 1) << UNIT_BITS


def stable_partition(values: np.ndarray, partitions: int) -> np.ndarray:
    """Partition of each uint64 value: a fixed mix, never Python's per-process hash()."""
    h = values.astype(np.uint64, copy=True)
    h ^= h >> np.uint64(33)
    h *= np.uint64(0xFF51AFD7ED558CCD)
    h ^= h >> np.uint64(33)
    return (h % np.uint64(partitions)).astype(np.int64)


def text_key64(texts: list[str]) -> np.ndarray:
    """A uint64 digest of each string (doc ids), stable across processes and machines."""
    return np.fromiter((int.from_bytes(hashlib.blake2b(t.encode("utf-8", "surrogatepass"),
                                                       digest_size=8).digest(), "little")
                        for t in texts), np.uint64, len(texts))


def bytes_key64(keys: list[bytes]) -> np.ndarray:
    """The first 8 bytes of each (already uniform) exact key as uint64."""
    return np.fromiter((int.from_bytes(k[:8], "little") for k in keys), np.uint64, len(keys))


def write_parquet(path: Path, table: pa.Table, row_group_size: int | None = None) -> None:
    """Write atomically: a retried task overwrites its own file, a killed one leaves no file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="lz4", row_group_size=row_group_size)   # scratch


def read_parquets(paths, columns=None,
                  order_range: tuple[int, int] | None = None) -> pa.Table | None:
    """The rows of every existing file in `paths`, concatenated (None if there are none); with
    `order_range` (lo, hi), only the rows whose order key is in [lo, hi)."""
    tables = [arrow.read_parquet(p, columns, where=("order", *order_range) if order_range else None)
              for p in paths if Path(p).is_file()]
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables) if tables else None


def write_by_unit(stage_dir: Path, part: int, table: pa.Table) -> None:
    """A reduce task's output (sorted by order) cut into one file per work unit it touches, so that
    a per-unit task later reads only its own rows: `unit_files(stage_dir, unit, partitions)`."""
    from mspretrain.dataprep.plan.shuffle import part_file
    units = arrow.to_numpy(table.column("order")) >> UNIT_BITS
    starts = np.flatnonzero(np.r_[True, units[1:] != units[:-1]]) if len(units) else []
    for k, s in enumerate(starts):
        e = starts[k + 1] if k + 1 < len(starts) else len(units)
        write_parquet(part_file(stage_dir, int(units[s]), part), table.slice(s, e - s))


def unit_files(stage_dir: Path, unit: int, partitions: int) -> list[Path]:
    from mspretrain.dataprep.plan.shuffle import part_file
    return [part_file(stage_dir, unit, p) for p in range(partitions)]


def done(path: Path) -> dict | None:
    """The marker of a completed task, or None."""
    return {**read_json(path), "reused": True} if path.is_file() else None


def finish(path: Path, result: dict) -> dict:
    atomic_write_json(path, result)
    return result
