"""The shared pieces: the manifest contract and the rolling shard writer."""
import json

import pytest

from mspretrain.dataprep.write.shards import ShardWriter, shard_capacity
from mspretrain.loader.manifest import ManifestError, load_manifest
from synthetic import make_dataset


def test_synthetic_dataset_roundtrips_through_the_manifest(tmp_path):
    root = make_dataset(tmp_path / "ds", num_train=300, num_valid=20, seq_length=16,
                        max_shard_bytes=200_000)
    m = load_manifest(root)
    train = m.split("train")
    assert train.num_samples == 300 and len(train.shards) > 1
    assert train.locate(0) == (0, 0)
    last = train.shards[-1]
    assert train.locate(299) == (len(train.shards) - 1, 299 - last.first_sample)
    for s in train.shards:
        assert s.bytes <= 200_000
        assert (root / s.file).is_file() and (root / f"{s.file}.db").is_file()
    with pytest.raises(IndexError):
        train.locate(300)
    with pytest.raises(ManifestError, match="no split 'test'"):
        m.split("test")


def test_shards_are_byte_identical_when_rewritten(tmp_path):
    a = make_dataset(tmp_path / "a", num_train=50, num_valid=5, seq_length=8)
    b = make_dataset(tmp_path / "b", num_train=50, num_valid=5, seq_length=8)
    assert load_manifest(a).fingerprint == load_manifest(b).fingerprint
    for s in load_manifest(a).split("train").shards:
        assert (a / s.file).read_bytes() == (b / s.file).read_bytes()


def test_writer_refuses_a_cap_too_small_for_one_sample(tmp_path):
    assert shard_capacity(10_000, 1024) == 0
    with pytest.raises(ValueError, match="max-shard-bytes"):
        ShardWriter(tmp_path, "train", 1024, 10_000)


def test_manifest_with_a_gap_in_sample_ids_is_rejected(tmp_path):
    root = make_dataset(tmp_path / "ds", num_train=300, num_valid=20, seq_length=16,
                        max_shard_bytes=200_000)
    d = json.loads((root / "manifest.json").read_text())
    d["splits"]["train"]["shards"][1]["first_sample"] += 1
    (root / "manifest.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="starts at"):
        load_manifest(root)
