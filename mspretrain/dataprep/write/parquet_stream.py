"""One parquet file written from tables that arrive in order, with the bytes one `pq.write_table` of
their concatenation (as one contiguous table) gives: rows are buffered only up to a row group, so memory does not grow with the
file. Both engines write dedup/duplicates.parquet and documents/attributes.parquet this way, chunk by
chunk (local) or unit by unit (Ray), and their files are byte-identical."""
from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from mspretrain.common import arrow
from mspretrain.common.files import atomic_path

ROW_GROUP = 1 << 20   # pyarrow's default row group size for write_table


class InOrderParquet:
    """`with InOrderParquet(path, schema) as out: out.add(table) ...`: `path` appears complete when the
    block ends without an error, or not at all."""

    def __init__(self, path: Path, schema: pa.Schema, compression: str = "zstd"):
        self.path, self.schema, self.compression = Path(path), schema, compression
        self.rows = 0                       # rows added so far
        self._pending: list[pa.Table] = []  # fewer than ROW_GROUP rows
        self._buffered = 0

    def __enter__(self) -> "InOrderParquet":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._stack = ExitStack()
        tmp = self._stack.enter_context(atomic_path(self.path))
        self._writer = self._stack.enter_context(
            pq.ParquetWriter(tmp, self.schema, compression=self.compression))
        return self

    def add(self, table: pa.Table) -> None:
        if not table.num_rows:
            return
        self._pending.append(table.select(self.schema.names).cast(self.schema))
        self._buffered += table.num_rows
        self.rows += table.num_rows
        while self._buffered >= ROW_GROUP:
            merged = self._merged()
            self._writer.write_table(merged.slice(0, ROW_GROUP))
            self._pending, self._buffered = [merged.slice(ROW_GROUP)], self._buffered - ROW_GROUP

    def __exit__(self, *exc) -> bool:
        if exc[0] is None and (self._buffered or self.rows == 0):
            self._writer.write_table(self._merged())
        return self._stack.__exit__(*exc)

    def _merged(self) -> pa.Table:
        """The buffered rows as one contiguous table: the writer cuts data pages per array chunk,
        so the bytes must not depend on how the rows arrived."""
        if not self._pending:
            return arrow.empty_table(self.schema)
        return pa.concat_tables(self._pending).combine_chunks()
