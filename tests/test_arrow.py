"""mspretrain.common.arrow: the same arrays, tables and parquet bytes as pyarrow's own conversions,
without importing pandas."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mspretrain.common import arrow

SCHEMA = pa.schema([("doc_id", pa.string()), ("key", pa.binary()), ("bytes", pa.int64()),
                    ("pii", pa.int32()), ("score", pa.float64()), ("big", pa.large_string()),
                    ("ok", pa.bool_())])
ROWS = {"doc_id": ["a", "é\x00ü", "", "日本語 text"],
        "key": [b"\x00\xff", None, b"", b"k"],
        "bytes": [0, 2**40, -1, 7],
        "pii": [0, 3, 2**31 - 1, -2**31],
        "score": [0.5, None, float("nan"), -0.0],
        "big": ["x" * 1000, "", "ß", None],
        "ok": [True, False, None, True]}


def test_tables_equal_pyarrows_and_write_the_same_parquet_bytes(tmp_path):
    ours = arrow.table(ROWS, SCHEMA)
    theirs = pa.table(ROWS, schema=SCHEMA)
    ours.validate(full=True)
    assert ours.schema == theirs.schema
    assert ours.to_pylist() == theirs.to_pylist() or str(ours) == str(theirs)   # NaN != NaN
    for name, table in (("ours", ours), ("theirs", theirs)):
        pq.write_table(table, tmp_path / f"{name}.parquet", compression="zstd")
    assert (tmp_path / "ours.parquet").read_bytes() == (tmp_path / "theirs.parquet").read_bytes()


def test_numpy_columns_round_trip(tmp_path):
    schema = pa.schema([("i", pa.int64()), ("j", pa.int32()), ("f", pa.float64())])
    cols = {"i": np.arange(5, dtype=np.int64) * 2**33, "j": np.arange(5, dtype=np.int64),
            "f": np.linspace(0, 1, 5)}
    t = arrow.table(cols, schema)
    assert t.schema == schema
    pq.write_table(t, tmp_path / "t.parquet")
    back = arrow.read_parquet(tmp_path / "t.parquet")
    for name in cols:
        got = arrow.to_numpy(back.column(name))
        assert got.dtype == {"i": np.int64, "j": np.int32, "f": np.float64}[name]
        np.testing.assert_array_equal(got, cols[name])
    assert arrow.read_parquet(tmp_path / "t.parquet", columns=["f"]).column_names == ["f"]


def test_a_range_read_equals_pyarrows_filtered_read(tmp_path):
    order = np.arange(0, 3000, 3, dtype=np.int64)
    schema = pa.schema([("order", pa.int64()), ("label", pa.int64())])
    path = tmp_path / "t.parquet"
    pq.write_table(arrow.table({"order": order, "label": order // 7}, schema), path,
                   row_group_size=100)
    for lo, hi in ((0, 3000), (299, 301), (300, 301), (301, 303), (1000, 1000), (-5, 1),
                   (2998, 10**9)):
        want = pq.read_table(path, filters=[("order", ">=", lo), ("order", "<", hi)])
        got = arrow.read_parquet(path, where=("order", lo, hi))
        assert got.equals(want), (lo, hi)
        only = arrow.read_parquet(path, ["label"], where=("order", lo, hi))
        assert only.column_names == ["label"]
        assert only.column("label").equals(want.column("label")), (lo, hi)


def test_an_empty_table_writes_the_same_bytes(tmp_path):
    for name, table in (("ours", arrow.empty_table(SCHEMA)), ("theirs", SCHEMA.empty_table())):
        assert table.schema == SCHEMA and table.num_rows == 0
        pq.write_table(table, tmp_path / f"{name}.parquet", compression="zstd")
    assert (tmp_path / "ours.parquet").read_bytes() == (tmp_path / "theirs.parquet").read_bytes()


def test_to_numpy_of_slices_chunks_and_booleans():
    a = arrow.array(np.arange(10, dtype=np.int32), pa.int32())
    np.testing.assert_array_equal(arrow.to_numpy(a.slice(3, 4)), [3, 4, 5, 6])
    chunked = pa.chunked_array([a.slice(0, 2), a.slice(7)])
    np.testing.assert_array_equal(arrow.to_numpy(chunked), [0, 1, 7, 8, 9])
    bits = arrow.array(np.array([1, 0, 1, 1, 0, 0, 1, 0, 1], bool), pa.bool_())
    np.testing.assert_array_equal(arrow.to_numpy(bits.slice(5)), [0, 1, 0, 1])
    assert arrow.to_numpy(a.slice(0, 0)).dtype == np.int32
    with_nulls = arrow.array([1.0, None, 3.0, None, 5.0], pa.float64())
    with pytest.raises(ValueError, match="nulls"):
        arrow.to_numpy(with_nulls)
    np.testing.assert_array_equal(arrow.to_numpy(with_nulls.slice(1), nulls_as=np.nan),
                                  with_nulls.slice(1).to_numpy(zero_copy_only=False))


def test_values_that_do_not_fit_raise():
    with pytest.raises(ValueError):
        arrow.array([2**31], pa.int32())
    with pytest.raises(ValueError):
        arrow.array(np.array([0.5]), pa.int64())
    with pytest.raises(UnicodeEncodeError):
        arrow.array(["\ud800"], pa.string())


def test_no_pandas_is_imported():
    code = ("import sys, numpy as np, pyarrow as pa, pyarrow.parquet as pq\n"
            "from mspretrain.common import arrow\n"
            "from test_arrow import ROWS, SCHEMA\n"
            "import tempfile, os\n"
            "d = tempfile.mkdtemp(); p = os.path.join(d, 't.parquet')\n"
            "t = arrow.table(ROWS, SCHEMA)\n"
            "pq.write_table(t, p)\n"
            "back = arrow.read_parquet(p, ['bytes', 'doc_id'])\n"
            "arrow.to_numpy(back.column('bytes')); back.column('doc_id').to_pylist()\n"
            "arrow.read_parquet(p, ['doc_id'], where=('bytes', 0, 8)); arrow.empty_table(SCHEMA)\n"
            "print('pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=__file__.rsplit("/", 1)[0])
    assert out.stdout.strip() == "False"
