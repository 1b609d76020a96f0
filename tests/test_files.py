"""mspretrain.files: the one atomic write. A failed write leaves the old file and no temporary behind."""
from __future__ import annotations

import json

import pytest

from mspretrain.common.files import atomic_open, atomic_path, atomic_write_json, atomic_write_text


def test_replaces_whole_files(tmp_path):
    path = tmp_path / "state.json"
    atomic_write_json(path, {"b": 1, "a": "é"})
    assert path.read_text(encoding="utf-8") == '{\n "a": "é",\n "b": 1\n}\n'
    atomic_write_text(path, "new\n")
    assert path.read_text() == "new\n"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_an_error_mid_write_keeps_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("old\n")
    with pytest.raises(RuntimeError):
        with atomic_open(path, "w") as f:
            f.write("half of the new")
            raise RuntimeError("killed mid-write")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]


def test_binary_writers_such_as_numpy_and_json_dump_work(tmp_path):
    path = tmp_path / "x.json"
    with atomic_open(path, "w", encoding="utf-8") as f:
        json.dump([1, 2], f)
    assert json.loads(path.read_text()) == [1, 2]


def test_writers_that_want_a_name_get_the_temporary_and_it_is_renamed(tmp_path):
    path = tmp_path / "table.parquet"
    with atomic_path(path) as tmp:
        assert tmp.parent == tmp_path and tmp != path
        tmp.write_bytes(b"PAR1")
        assert not path.exists()        # nothing under the final name until the block ends
    assert path.read_bytes() == b"PAR1"
    with pytest.raises(ValueError):
        with atomic_path(path) as tmp:
            tmp.write_bytes(b"torn")
            raise ValueError("the writer failed")
    assert path.read_bytes() == b"PAR1"
    assert [p.name for p in tmp_path.iterdir()] == ["table.parquet"]
