"""numpy arrays and Python lists <-> Arrow, and parquet files read, without pandas.

pyarrow imports pandas (where installed) the first time `pa.array`, `pa.table`, `pa.scalar`,
`Array.to_numpy` or `pq.read_table` (through pyarrow.dataset) runs: ~0.35 CPU-s in every process that
calls one, a twentieth of a whole 64 MB build. Arrays built here from their buffers, and tables from
such arrays, hold the same values as pyarrow's own conversions and so write the same parquet bytes.
The local engine and the modules it shares with the Ray engine convert through this one (a test
builds a dataset and finds no pandas in its processes: tests/dataprep/test_build_imports.py); what
still imports pandas: `pa.array`/`pa.table`/`pa.scalar` on Python objects, `take` of a Python list,
`to_numpy`, pyarrow.compute with Python scalars, `Schema.empty_table`, `pq.read_table` and read
filters (pyarrow.dataset).
"""
from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# the fixed-width types the project's schemas use, and their numpy dtypes
_NUMPY = {pa.int8(): np.int8, pa.int16(): np.int16, pa.int32(): np.int32, pa.int64(): np.int64,
          pa.uint8(): np.uint8, pa.uint16(): np.uint16, pa.uint32(): np.uint32,
          pa.uint64(): np.uint64, pa.float32(): np.float32, pa.float64(): np.float64}
# variable-width types: their offsets' dtype, and whether values are str (else bytes)
_VARIABLE = {pa.string(): (np.int32, True), pa.binary(): (np.int32, False),
             pa.large_string(): (np.int64, True), pa.large_binary(): (np.int64, False)}


def array(values, type: pa.DataType) -> pa.Array:
    """An Arrow array of `type` holding `values`: a numpy array or a sequence of Python values,
    None for null (an Arrow array is passed through, cast when its type differs)."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        return values if values.type == type else values.cast(type)
    if type in _VARIABLE:
        return _variable(values, type)
    if type == pa.bool_():
        return _booleans(values)
    if type not in _NUMPY:
        raise TypeError(f"no conversion to Arrow {type} here")
    dtype = np.dtype(_NUMPY[type])
    if isinstance(values, np.ndarray):
        return _fixed(type, _exact(values, dtype), None)
    valid = _validity(values)
    if valid is not None:
        values = [dtype.type(0) if v is None else v for v in values]
    return _fixed(type, _exact(np.asarray(values) if len(values) else np.zeros(0, dtype), dtype),
                  valid)


def table(columns: dict, schema: pa.Schema) -> pa.Table:
    """A table of `schema` from {name: values} (see `array`)."""
    return pa.Table.from_arrays([array(columns[f.name], f.type) for f in schema], schema=schema)


def empty_table(schema: pa.Schema) -> pa.Table:
    """A table of `schema` with no rows (`Schema.empty_table` imports pandas); written, the same
    parquet bytes."""
    return pa.Table.from_batches([], schema=schema)


def to_numpy(values: pa.Array | pa.ChunkedArray, nulls_as=None) -> np.ndarray:
    """The values of a fixed-width or boolean column as numpy (read-only: a view of Arrow's memory
    where the column is one chunk). A null is `nulls_as` (NaN for a float column, as Arrow's own
    to_numpy gives); a column with nulls and no `nulls_as` raises ValueError."""
    if isinstance(values, pa.ChunkedArray):
        values = values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    if values.null_count:
        if nulls_as is None:
            raise ValueError(f"{values.null_count} nulls in a column read as numpy")
        valid = to_numpy(pa.Array.from_buffers(pa.bool_(), len(values),
                                               [None, values.buffers()[0]], offset=values.offset))
        return np.where(valid, to_numpy(_no_validity(values)), nulls_as)
    n, start = len(values), values.offset
    if values.type == pa.bool_():
        if n == 0:
            return np.zeros(0, bool)
        bits = np.frombuffer(values.buffers()[1], np.uint8)
        return np.unpackbits(bits, count=start + n, bitorder="little")[start:].astype(bool)
    dtype = np.dtype(_NUMPY[values.type])
    if n == 0:
        return np.zeros(0, dtype)
    return np.frombuffer(values.buffers()[1], dtype, count=n, offset=start * dtype.itemsize)


def read_parquet(path: str | os.PathLike, columns: Sequence[str] | None = None,
                 where: tuple[str, int, int] | None = None) -> pa.Table:
    """A whole parquet file (only `columns`, where given), as `pq.read_table` reads one file. With
    `where` = (name, lo, hi): only the rows whose value of integer column `name` (no nulls) is in
    [lo, hi), as read filters [(name, ">=", lo), (name, "<", hi)] give; a row group whose statistics
    say it holds none is not read."""
    cols = list(columns) if columns is not None else None
    with pq.ParquetFile(path) as f:
        if where is None:
            return f.read(columns=cols)
        name, lo, hi = where
        groups = [g for g in range(f.metadata.num_row_groups)
                  if _may_hold(f.metadata.row_group(g), name, lo, hi)]
        need = cols if cols is None or name in cols else [*cols, name]
        table = f.read_row_groups(groups, columns=need)
    values = to_numpy(table.column(name))
    table = table.filter(array((values >= lo) & (values < hi), pa.bool_()))
    return table if need is cols else table.select(cols)


# --------------------------------------------------------------------------------- internals

def _may_hold(group: pq.RowGroupMetaData, name: str, lo: int, hi: int) -> bool:
    """Whether a row group may hold a value of column `name` in [lo, hi) (yes without statistics)."""
    for i in range(group.num_columns):
        column = group.column(i)
        if column.path_in_schema == name:
            stats = column.statistics
            if stats is None or not stats.has_min_max:
                return True
            return stats.max >= lo and stats.min < hi
    raise KeyError(f"no column {name!r}")


def _validity(values) -> np.ndarray | None:
    """Arrow's validity bitmap of a sequence with Nones, None when there is none."""
    nulls = [v is None for v in values]
    if not any(nulls):
        return None
    return np.packbits(~np.asarray(nulls), bitorder="little")


def _exact(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`values` as `dtype`, contiguous; a conversion that would change a value (an integer out of
    range, a fraction into an integer) raises, as pyarrow's own does."""
    values = np.asarray(values)
    if values.dtype != dtype:
        converted = values.astype(dtype)
        if values.size and not np.array_equal(converted, values, equal_nan=dtype.kind == "f"):
            raise ValueError(f"values do not fit {dtype} exactly")
        values = converted
    return np.ascontiguousarray(values)


def _no_validity(values: pa.Array) -> pa.Array:
    """The same buffers read without their validity bitmap (the values under nulls are whatever
    the writer left there)."""
    return pa.Array.from_buffers(values.type, len(values), [None, *values.buffers()[1:]],
                                 offset=values.offset)


def _fixed(type: pa.DataType, values: np.ndarray, valid: np.ndarray | None) -> pa.Array:
    return pa.Array.from_buffers(type, len(values),
                                 [None if valid is None else pa.py_buffer(valid),
                                  pa.py_buffer(values)])


def _booleans(values) -> pa.Array:
    valid = None if isinstance(values, np.ndarray) else _validity(values)
    bools = np.asarray([bool(v) for v in values] if valid is not None else values, bool)
    return pa.Array.from_buffers(pa.bool_(), len(bools),
                                 [None if valid is None else pa.py_buffer(valid),
                                  pa.py_buffer(np.packbits(bools, bitorder="little"))])


def _variable(values, type: pa.DataType) -> pa.Array:
    """A string or binary array: every value's UTF-8 (or raw) bytes back to back, and the offsets
    where each begins. A str with a lone surrogate raises UnicodeEncodeError, as in pa.array."""
    offset_dtype, text = _VARIABLE[type]
    valid = _validity(values)
    empty = "" if text else b""
    if valid is not None:
        values = [empty if v is None else v for v in values]
    if text:   # one encode of the joined text; a length per value (ASCII: len, O(1) to tell)
        data = "".join(values).encode("utf-8")
        sizes = [len(v) if v.isascii() else len(v.encode("utf-8")) for v in values]
    else:
        data = b"".join(values)
        sizes = [len(v) for v in values]
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if offsets[-1] > np.iinfo(offset_dtype).max:
        raise ValueError(f"{offsets[-1]} bytes do not fit one Arrow {type} array")
    return pa.Array.from_buffers(type, len(sizes),
                                 [None if valid is None else pa.py_buffer(valid),
                                  pa.py_buffer(offsets.astype(offset_dtype)),
                                  pa.py_buffer(data)])
