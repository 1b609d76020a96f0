"""`dataprep verify` passes a good dataset and names every fault planted in a copy of it."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from mspretrain.dataprep.cli import main
from mspretrain.dataprep.write.shards import ShardWriter
from mspretrain.dataprep.verify import verify_dataset
from mspretrain.loader.manifest import SplitInfo, compute_fingerprint, load_manifest, write_manifest


@pytest.fixture
def copy(reference, tmp_path):
    return shutil.copytree(reference, tmp_path / "data")


def test_a_good_dataset_verifies(reference, capsys):
    assert main(["verify", str(reference)]) == 0
    assert "OK" in capsys.readouterr().out


def test_a_corrupted_shard_is_named(copy, capsys):
    shard = copy / "shards" / "train-00000.mindrecord"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert main(["verify", str(copy)]) == 1
    out = capsys.readouterr().out
    assert "train-00000.mindrecord: sha256 differs" in out


def test_a_missing_index_and_a_stray_shard_are_named(copy):
    (copy / "shards" / "valid-00000.mindrecord.db").unlink()
    shutil.copyfile(copy / "shards" / "valid-00000.mindrecord", copy / "shards" / "valid-00009.mindrecord")
    faults = verify_dataset(copy)
    assert any("valid-00000.mindrecord.db: missing" in f for f in faults), faults
    assert any("valid-00009.mindrecord: shard file not listed" in f for f in faults), faults


def test_an_edited_manifest_is_caught(copy):
    d = json.loads((copy / "manifest.json").read_text())
    d["config"]["pack"]["valid_fraction"] = 0.5
    (copy / "manifest.json").write_text(json.dumps(d))
    faults = verify_dataset(copy)
    assert len(faults) == 1 and "manifest.json: fingerprint" in faults[0] and "edited" in faults[0]
    d["splits"]["train"]["num_tokens"] += 65
    d["tokenizer"]["eos_id"] = 7
    (copy / "manifest.json").write_text(json.dumps(d))
    faults = verify_dataset(copy)
    assert any("special ids differ" in f for f in faults), faults
    assert any("split 'train' num_tokens" in f for f in faults), faults


def test_a_swapped_tokenizer_is_named(copy, reference):
    (copy / "tokenizer.model").write_bytes(b"not a model")
    faults = verify_dataset(copy)
    assert any("tokenizer.model: sha256 differs" in f for f in faults), faults


def test_rows_are_checked_even_when_checksums_agree(copy):
    """A shard rewritten with an out-of-range token and a consistent manifest: only the row check
    can see it."""
    m = load_manifest(copy)
    valid = m.split("valid")
    rows = np.full((valid.num_samples, m.seq_length + 1), 5, np.int32)
    rows[-1, 7] = m.tokenizer.vocab_size
    for s in valid.shards:
        (copy / s.file).unlink()
        (copy / f"{s.file}.db").unlink()
    writer = ShardWriter(copy, "valid", m.seq_length, int(m.config["shards"]["max_shard_bytes"]))
    writer.write(rows)
    splits = dict(m.splits, valid=SplitInfo(valid.num_samples, valid.num_tokens, tuple(writer.close())))
    fp = compute_fingerprint(m.seq_length, m.tokenizer.sha256, splits, m.config)
    write_manifest(copy, type(m)(m.format_version, fp, m.seq_length, m.tokenizer, splits, m.config,
                                 m.versions))
    faults = verify_dataset(copy)
    assert len(faults) == 1, faults
    assert f"sample {valid.num_samples - 1} has token ids outside [0, {m.tokenizer.vocab_size})" \
        in faults[0]
