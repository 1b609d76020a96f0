"""Parquet (.parquet): a row per record, its text in the string column `text_field`, its id in
`id_field` where that column exists; rows streamed batch by batch and numbered from 1 (0 names the
whole file). A large uncompressed file is cut between row groups for the Ray engine
(split_parquet), each part numbering its rows as the whole file does."""
from __future__ import annotations

import io
from typing import BinaryIO, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from mspretrain.common import arrow
from mspretrain.dataprep.readers.compressed import Damaged
from mspretrain.dataprep.readers.lines import too_long
from mspretrain.dataprep.readers.registry import ReadOptions, register
from mspretrain.dataprep.records import BadRecord, Document, InputFile

_BATCH = 1024


def split_parquet(inp: InputFile, part_bytes: int) -> list[InputFile]:
    """An uncompressed parquet file cut between row groups into parts of about part_bytes of
    compressed data (one row group may be larger), each knowing the rows before it. Reads only
    the file's footer; a file that pyarrow cannot open stays whole, to be reported by its reader."""
    try:
        meta = pq.ParquetFile(inp.path).metadata
    except (pa.ArrowException, OSError):
        return [inp]
    groups = [(meta.row_group(g).num_rows,
               sum(meta.row_group(g).column(c).total_compressed_size
                   for c in range(meta.num_columns))) for g in range(meta.num_row_groups)]
    parts, start, rows, size = [], 0, 0, 0
    for g, (n, nbytes) in enumerate(groups):
        size += nbytes
        if size >= part_bytes or g == len(groups) - 1:
            parts.append(InputFile(inp.path, inp.rel, start, g + 1, rows))
            rows += sum(k for k, _ in groups[start:g + 1])
            start, size = g + 1, 0
    return parts if len(parts) > 1 else [inp]


@register(".parquet", split=split_parquet, binary=True)
def read_parquet(inp: InputFile, stream: BinaryIO,
                 opts: ReadOptions) -> Iterator[Document | BadRecord]:
    """A part (inp.end >= 0) reads its row groups [inp.start, inp.end), numbered as in the whole
    file. A compressed file is decompressed into memory first (parquet reads its footer first)."""
    text_field, id_field, cap = opts.text_field, opts.id_field, opts.max_record_bytes
    try:
        pf = pq.ParquetFile(stream if stream.seekable() else io.BytesIO(stream.read()))
    except Damaged as e:
        yield BadRecord(inp.rel, 0, e.reason, e.detail)
        return
    except (pa.ArrowException, OSError) as e:
        yield BadRecord(inp.rel, 0, "unreadable", f"not a readable parquet file: {e}")
        return
    names = pf.schema_arrow.names
    if text_field not in names:
        yield BadRecord(inp.rel, 0, "missing_text_field", f"no column {text_field!r}")
        return
    text_type = pf.schema_arrow.field(text_field).type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
        yield BadRecord(inp.rel, 0, "text_not_string", f"column {text_field!r} is {text_type}")
        return
    columns = [text_field] + ([id_field] if id_field in names and id_field != text_field else [])
    part = inp.end >= 0
    row = inp.first_line if part else 0
    groups = range(inp.start, inp.end) if part else None
    try:
        for batch in pf.iter_batches(batch_size=_BATCH, row_groups=groups, columns=columns):
            texts = batch.column(0)
            sizes = arrow.to_numpy(pc.binary_length(texts), nulls_as=np.nan) if cap > 0 else None
            if sizes is not None and (sizes > cap).any():   # null sizes are NaN: never over
                over = arrow.array(sizes > cap, pa.bool_())
                texts = pc.if_else(over, pa.nulls(len(texts), texts.type), texts)
            texts = texts.to_pylist()
            ids = batch.column(1).to_pylist() if len(columns) > 1 else [None] * len(texts)
            for k, (text, rid) in enumerate(zip(texts, ids)):
                row += 1
                if sizes is not None and sizes[k] > cap:
                    yield too_long(inp.rel, row, int(sizes[k]), cap)
                else:
                    yield _parquet_row(inp.rel, row, text, rid, opts)
    except (pa.ArrowException, OSError) as e:
        yield BadRecord(inp.rel, row + 1, "unreadable", f"parquet read failed: {e}")
        return
    if row == 0 and not part:    # a part never reports the file empty
        yield BadRecord(inp.rel, 0, "empty_file", "no rows")


def _parquet_row(rel: str, row: int, text, rid, opts: ReadOptions) -> Document | BadRecord:
    if text is None:
        return BadRecord(rel, row, "missing_text_field", f"column {opts.text_field!r} is null")
    doc_id = opts.doc_id(rid, rel, row)
    if doc_id is None:
        return BadRecord(rel, row, "invalid_id",
                         f"column {opts.id_field!r} is not a string or integer")
    return Document(doc_id, text, rel)
