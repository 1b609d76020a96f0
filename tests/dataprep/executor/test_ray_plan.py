"""The Ray engine's work units: a large uncompressed jsonl file cut at line starts, or parquet file
cut between row groups, reads, part after part, exactly as the whole file does (documents, ids, bad
records and their line or row numbers)."""
from __future__ import annotations

import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mspretrain.dataprep.readers import InputFile, read_file, split_input, split_jsonl


def _records(inp, cap: int = 0):
    return [(type(r).__name__, *vars(r).values()) for r in read_file(inp, max_record_bytes=cap)]


@pytest.mark.parametrize("part_bytes", [1, 50, 333, 4096, 10**6])
def test_parts_of_a_jsonl_file_read_as_the_whole_file(tmp_path, part_bytes):
    rng = random.Random(part_bytes)
    lines = []
    for i in range(300):
        kind = rng.random()
        if kind < 0.05:
            lines.append(b"")                                     # blank line: no record
        elif kind < 0.1:
            lines.append(b'{"text": "broken')                     # invalid json
        elif kind < 0.13:
            lines.append(b'{"text": "caf\xe9"}')                  # invalid utf-8
        else:
            doc = {"text": "word " * rng.randrange(1, 40) + "\u00e9" * rng.randrange(3)}
            if rng.random() < 0.5:
                doc["id"] = f"doc-{i}"
            lines.append(json.dumps(doc, ensure_ascii=False).encode())
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"\n".join(lines) + (b"\n" if part_bytes % 2 else b""))
    whole = InputFile(path, "big.jsonl")
    parts = split_jsonl(whole, part_bytes)
    size = path.stat().st_size
    if part_bytes >= size:
        assert parts == [whole]
        return
    assert len(parts) > 1 and parts[0].start == 0 and parts[-1].end == size
    assert all(a.end == b.start for a, b in zip(parts, parts[1:]))
    data = path.read_bytes()
    assert all(data[p.start - 1:p.start] == b"\n" for p in parts[1:])   # cut at line starts
    assert [r for p in parts for r in _records(p)] == _records(whole)


@pytest.mark.parametrize("part_bytes", [1, 700, 3000, 10**6])
def test_parts_of_a_parquet_file_read_as_the_whole_file(tmp_path, part_bytes):
    rng = random.Random(part_bytes)
    texts, ids = [], []
    for i in range(500):
        kind = rng.random()
        texts.append(None if kind < 0.04 else "x" * 300 if kind < 0.08        # null, too long
                     else "word " * rng.randrange(1, 30) + "\u4e2d" * rng.randrange(3))
        ids.append(None if rng.random() < 0.5 else f"doc-{i}")
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"id": ids, "text": texts}), path, row_group_size=37)
    whole = InputFile(path, "big.parquet")
    parts = split_input(whole, part_bytes)
    if part_bytes >= path.stat().st_size:
        assert parts == [whole]
        return
    groups = pq.ParquetFile(path).metadata.num_row_groups
    assert len(parts) > 1 and parts[0].start == 0 and parts[-1].end == groups
    assert all(a.end == b.start for a, b in zip(parts, parts[1:]))
    want = _records(whole, 200)
    assert [r for p in parts for r in _records(p, 200)] == want
    # rows past the first part are numbered as in the whole file (in bad records and default ids)
    assert {r[3] for r in want if r[0] == "BadRecord" and r[2] > 37} == {"missing_text_field",
                                                                         "record_too_long"}
    late = next(i for i in range(400, 500) if ids[i] is None and texts[i] and len(texts[i]) < 200)
    assert ("Document", f"big.parquet:{late + 1}", texts[late], "big.parquet") in want


def test_compressed_and_small_files_are_one_unit(tmp_path):
    small = tmp_path / "small.jsonl"
    small.write_text('{"text": "x"}\n')
    gz = tmp_path / "big.jsonl.gz"
    gz.write_bytes(b"\0" * 1000)
    gz_parquet = tmp_path / "big.parquet.gz"
    gz_parquet.write_bytes(b"\0" * 1000)
    for p in (small, gz, gz_parquet):
        inp = InputFile(p, p.name)
        assert split_input(inp, 10) == [inp]
    assert split_jsonl(InputFile(gz, gz.name), 10) == [InputFile(gz, gz.name)]


def test_partitions_come_from_the_input_size_unless_given(tmp_path):
    from mspretrain.dataprep.config import load_build_config
    from mspretrain.dataprep.plan.run import partitions_for

    small = tmp_path / "a.jsonl"
    small.write_bytes(b"x" * 1000)
    big = tmp_path / "b.jsonl"
    with open(big, "wb") as f:          # sparse: 5.5 GiB of size, no disk
        f.truncate(11 << 29)
    files = [InputFile(small.resolve(), "a.jsonl"), InputFile(big.resolve(), "b.jsonl")]
    auto = load_build_config()
    assert partitions_for(auto, files[:1]) == 2          # never fewer than 2 reduce tasks
    assert partitions_for(auto, files) == 6              # one per started GiB
    assert partitions_for(load_build_config(sets=["run.ray_partitions=5"]), files) == 5
