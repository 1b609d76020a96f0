"""Map side of the Ray engine's shuffles: rows cut into one parquet file per (unit, partition).

Files are written under temporary names and renamed only when the whole unit is done, so a retried or
killed task never leaves a partial partition behind."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mspretrain.common.files import publish, tmp_sibling


def part_file(stage_dir: Path, unit: int, part: int) -> Path:
    return stage_dir / f"u{unit:06d}-p{part:04d}.parquet"


def part_files(stage_dir: Path, units: int, part: int) -> list[Path]:
    return [part_file(stage_dir, u, part) for u in range(units)]


class PartitionedWriter:
    """One streaming parquet writer per partition of one unit; a row group per `add`."""

    def __init__(self, stage_dir: Path, unit: int, partitions: int, schema: pa.Schema):
        stage_dir.mkdir(parents=True, exist_ok=True)
        self.paths = [part_file(stage_dir, unit, p) for p in range(partitions)]
        self.tmps = [tmp_sibling(p) for p in self.paths]
        self.schema = schema
        # scratch files, read once: lz4 costs less CPU than zstd both ways
        self.writers = [pq.ParquetWriter(t, schema, compression="lz4") for t in self.tmps]

    def add(self, columns: dict, parts: np.ndarray) -> None:
        if not len(parts):
            return
        table = pa.table(columns, schema=self.schema)
        order = np.argsort(parts, kind="stable")
        sorted_parts = parts[order]
        bounds = np.searchsorted(sorted_parts, np.arange(len(self.writers) + 1))
        table = table.take(pa.array(order))
        for p, w in enumerate(self.writers):
            if bounds[p + 1] > bounds[p]:
                w.write_table(table.slice(bounds[p], bounds[p + 1] - bounds[p]))

    def commit(self) -> None:
        for w in self.writers:
            w.close()
        for t, p in zip(self.tmps, self.paths):
            publish(t, p)
