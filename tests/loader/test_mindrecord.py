"""The numpy MindRecord reader against MindSpore's own reader, and its errors on bad files."""
import json
import shutil

import numpy as np
import pytest

from mspretrain.dataprep.write.shards import ShardWriter
from mspretrain.loader import Loader, ShardError
from mspretrain.loader.manifest import SplitInfo, load_manifest
from mspretrain.loader.mindrecord import ShardFile, ShardSet


EDGES = [0, 1, -1, 127, -128, 128, -129, 255, 256, 32767, -32768, 32768, -32769, 65535, 65536,
         2 ** 31 - 1, -2 ** 31, 100_000, -100_000]


def write_split(root, rows, max_bytes=200_000):
    writer = ShardWriter(root, "train", rows.shape[1] - 1, max_bytes)
    writer.write(rows)
    shards = tuple(writer.close())
    return SplitInfo(len(rows), rows.size, shards)


def test_decoder_matches_mindspore_for_every_integer_width(tmp_path):
    rng = np.random.default_rng(0)
    seq = 20
    rows = rng.choice(EDGES, size=(240, seq + 1)).astype(np.int32)
    rows[:40] = rng.integers(-2 ** 31, 2 ** 31, size=(40, seq + 1), dtype=np.int64)   # wide values
    rows[40:80] = rng.integers(0, 32000, size=(40, seq + 1))                         # int8/int16 mix
    split = write_split(tmp_path, rows)
    assert len(split.shards) > 1
    files = [str(tmp_path / s.file) for s in split.shards]
    import mindspore.dataset as msds
    reference = np.stack([r["input_ids"] for r in msds.MindDataset(files, shuffle=False)
                          .create_dict_iterator(output_numpy=True, num_epochs=1)])
    assert np.array_equal(reference, rows)            # MindSpore reads back what was written
    shards = ShardSet(tmp_path, split, seq)
    order = rng.permutation(len(rows))
    got = shards.read(order)
    assert got.dtype == np.int32 and np.array_equal(got, reference[order])
    assert np.array_equal(shards.read(np.array([5, 5, 5])), reference[[5, 5, 5]])


def test_rows_spread_over_many_pages_match_mindspore(tmp_path):
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 32000, size=(300, 257)).astype(np.int32)
    split = write_split(tmp_path, rows, max_bytes=1 << 20)
    path = tmp_path / split.shards[0].file
    header = path.read_bytes()[8:8 + int.from_bytes(path.read_bytes()[:8], "little")]
    assert sum(p["page_type"] == "BLOB_DATA" for p in json.loads(header)["page"]) > 3
    import mindspore.dataset as msds
    files = [str(tmp_path / s.file) for s in split.shards]
    reference = np.stack([r["input_ids"] for r in msds.MindDataset(files, shuffle=False)
                          .create_dict_iterator(output_numpy=True, num_epochs=1)])
    order = rng.permutation(len(rows))
    assert np.array_equal(ShardSet(tmp_path, split, 256).read(order), reference[order])
    assert np.array_equal(reference, rows)


def test_loader_rows_equal_mindspore_rows(dataset, reference_rows):
    with Loader(dataset, global_batch_size=50, seed=4) as ld:
        for batch in [next(ld) for _ in range(6)]:
            assert np.array_equal(batch["input_ids"], reference_rows[batch["sample_id"]])


def test_few_open_shards_at_a_time_still_read_right(dataset, reference_rows):
    m = load_manifest(dataset)
    shards = ShardSet(dataset, m.split("train"), m.seq_length, max_open=2)
    order = np.random.default_rng(2).permutation(300)
    for batch in np.split(order, 10):          # each batch touches all 4 shards
        assert np.array_equal(shards.read(batch), reference_rows[batch])
        assert len(shards._open) <= 2
    shards.close()


def test_row_out_of_range_names_file(dataset):
    m = load_manifest(dataset)
    info = m.split("train").shards[0]
    shard = ShardFile(m.shard_path(info), m.seq_length, info.num_samples)
    with pytest.raises(ShardError, match=rf"train-00000.mindrecord: row {info.num_samples} out of range"):
        shard.read(np.array([info.num_samples]))
    shard.close()


@pytest.fixture
def copy_of(dataset, tmp_path):
    def make():
        return shutil.copytree(dataset, tmp_path / "copy")
    return make


def test_missing_shard_is_named_at_open(copy_of):
    root = copy_of()
    (root / "shards/train-00001.mindrecord").unlink()
    with pytest.raises(ShardError, match=r"shards/train-00001.mindrecord: shard file missing"):
        Loader(root, global_batch_size=4)


def test_missing_index_is_named_at_open(copy_of):
    root = copy_of()
    (root / "shards/train-00002.mindrecord.db").unlink()
    with pytest.raises(ShardError, match=r"train-00002.mindrecord.db: shard file missing"):
        Loader(root, global_batch_size=4)


def test_truncated_shard_is_named(copy_of):
    root = copy_of()
    path = root / "shards/train-00000.mindrecord"
    path.write_bytes(path.read_bytes()[:17_000])      # header intact, blob page cut short
    with pytest.raises(ShardError, match=r"train-00000.mindrecord: data \+ index are \d+ B, the manifest"):
        read_all(root)
    # without the manifest's size check, the rows past the end are still caught
    info = load_manifest(root).split("train").shards[0]
    shard = ShardFile(path, 16, info.num_samples)
    shard.read(np.arange(5))
    with pytest.raises(ShardError, match=r"train-00000.mindrecord: row \d+: .*truncated or corrupt"):
        shard.read(np.arange(info.num_samples))
    shard.close()


def test_garbage_header_is_named(copy_of):
    root = copy_of()
    path = root / "shards/train-00001.mindrecord"
    path.write_bytes(b"\xff" * 64 + path.read_bytes()[64:])
    with pytest.raises(ShardError, match=r"train-00001.mindrecord: no valid MindRecord JSON header"):
        read_all(root)


def test_corrupt_blob_bytes_are_named(copy_of):
    root = copy_of()
    path = root / "shards/train-00002.mindrecord"
    data = bytearray(path.read_bytes())
    header_size = 16384                               # ShardWriter's layout for this cap
    data[header_size + 8:header_size + 12] = b"\x00\x00\x01\x00"   # row 0's element count
    path.write_bytes(bytes(data))
    first = load_manifest(root).split("train").shards[2].first_sample
    with pytest.raises(ShardError, match=r"train-00002.mindrecord: row 0: 256 tokens, expected 17"):
        ShardSet(root, load_manifest(root).split("train"), 16).read(np.array([first]))


def test_corrupt_index_is_named(copy_of):
    root = copy_of()
    db = root / "shards/train-00003.mindrecord.db"
    db.write_bytes(b"x" * db.stat().st_size)           # same size, so only the content is wrong
    with pytest.raises(ShardError, match=r"train-00003.mindrecord.db: unreadable index"):
        read_all(root)


def read_all(root):
    # the decoder's own checks, behind the shard digests (tests/loader/test_shard_digests.py)
    with Loader(root, global_batch_size=100, seed=0, verify_shards=False) as ld:
        for _ in range(3):
            next(ld)
