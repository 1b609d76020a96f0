"""InOrderParquet: tables streamed in order give the bytes of one write of their concatenation, and
an interrupted stream leaves no file."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mspretrain.dataprep.write import parquet_stream
from mspretrain.dataprep.write.parquet_stream import InOrderParquet

SCHEMA = pa.schema([("doc_id", pa.string()), ("n", pa.int64())])


def _tables(sizes):
    start = 0
    for n in sizes:   # ids of ~1.5 KB: a row group's column spans several 1 MB data pages
        yield pa.table({"doc_id": [f"d{start + i}-" + "x" * (1500 + (start + i) % 97)
                                   for i in range(n)],
                        "n": np.arange(start, start + n)}, schema=SCHEMA)
        start += n


@pytest.mark.parametrize("sizes", [[], [0, 0], [7], [300, 0, 450, 1, 999, 250], [1000, 1000]])
def test_streamed_file_equals_one_write_of_the_whole(tmp_path, monkeypatch, sizes):
    monkeypatch.setattr(parquet_stream, "ROW_GROUP", 1000)   # row groups cut inside and across tables
    tables = list(_tables(sizes))
    with InOrderParquet(tmp_path / "s.parquet", SCHEMA) as out:
        for t in tables:
            out.add(t)
    whole = pa.concat_tables(tables).combine_chunks() if tables else SCHEMA.empty_table()
    pq.write_table(whole, tmp_path / "w.parquet", compression="zstd", row_group_size=1000)
    assert out.rows == sum(sizes)
    assert (tmp_path / "s.parquet").read_bytes() == (tmp_path / "w.parquet").read_bytes()
    assert pq.ParquetFile(tmp_path / "s.parquet").metadata.num_row_groups == max(1, -(-sum(sizes) // 1000))


def test_an_error_inside_leaves_no_file_and_no_temporary(tmp_path):
    with pytest.raises(RuntimeError, match="stop"):
        with InOrderParquet(tmp_path / "d" / "s.parquet", SCHEMA) as out:
            out.add(next(_tables([5])))
            raise RuntimeError("stop")
    assert list((tmp_path / "d").iterdir()) == []
