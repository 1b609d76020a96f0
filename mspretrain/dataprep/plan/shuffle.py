"""Map side of the plan's shuffles: rows cut into one parquet file per (unit, partition).

Files are written under temporary names and renamed only when the whole unit is done, so a retried
or killed task never leaves a partial partition behind; a task that fails (a full disk) removes its
temporary files at once."""
from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mspretrain.common import arrow
from mspretrain.common.files import publish, tmp_sibling


def part_file(stage_dir: Path, unit: int, part: int) -> Path:
    return stage_dir / f"u{unit:06d}-p{part:04d}.parquet"


def part_files(stage_dir: Path, units: int, part: int) -> list[Path]:
    return [part_file(stage_dir, u, part) for u in range(units)]


class PartitionedWriter:
    """One streaming parquet writer per partition of one unit; a row group per `add`.

    `with PartitionedWriter(...) as w: ...; w.commit()`: a block left without a commit (an error,
    an early return) discards the unit's temporary files."""

    def __init__(self, stage_dir: Path, unit: int, partitions: int, schema: pa.Schema):
        stage_dir.mkdir(parents=True, exist_ok=True)
        self.paths = [part_file(stage_dir, unit, p) for p in range(partitions)]
        self.tmps = [tmp_sibling(p) for p in self.paths]
        self.schema = schema
        self.writers: list[pq.ParquetWriter] = []
        self.committed = False
        try:
            for t in self.tmps:   # scratch files, read once: lz4 costs less CPU than zstd both ways
                self.writers.append(pq.ParquetWriter(t, schema, compression="lz4"))
        except BaseException:
            self.abort()
            raise

    def __enter__(self) -> PartitionedWriter:
        return self

    def __exit__(self, *exc) -> bool:
        if not self.committed:
            self.abort()
        return False

    def add(self, columns: dict, parts: np.ndarray) -> None:
        if not len(parts):
            return
        table = arrow.table(columns, self.schema)
        order = np.argsort(parts, kind="stable")
        sorted_parts = parts[order]
        bounds = np.searchsorted(sorted_parts, np.arange(len(self.writers) + 1))
        table = table.take(arrow.array(order, pa.int64()))
        for p, w in enumerate(self.writers):
            if bounds[p + 1] > bounds[p]:
                w.write_table(table.slice(bounds[p], bounds[p + 1] - bounds[p]))

    def commit(self) -> None:
        for w in self.writers:
            w.close()
        for t, p in zip(self.tmps, self.paths):
            publish(t, p)
        self.committed = True

    def abort(self) -> None:
        """Close every file without raising and remove the temporary ones."""
        for w in self.writers:
            _discard(w)
        for t in self.tmps:
            t.unlink(missing_ok=True)


def _discard(writer: pq.ParquetWriter) -> None:
    """Close a writer whose file may be unwritable (a full disk). Where its close fails, pyarrow's
    __del__ would try it again later and print the error as an ignored exception's traceback."""
    try:
        writer.close()
    except (OSError, pa.ArrowException):
        writer.is_open = False
        if writer.file_handle is not None:
            with contextlib.suppress(OSError, pa.ArrowException):
                writer.file_handle.close()
