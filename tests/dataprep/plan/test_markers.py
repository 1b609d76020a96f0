"""The plan's task markers (plan/markers.py) go to dicts and back unchanged, and keep the JSON of the
work dir's done/ files, which a resumed build reads (the work-dir layout is unchanged)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from mspretrain.dataprep.plan.layout import done, finish
from mspretrain.dataprep.plan.markers import (ChunkDocs, ChunkTokens, DocsMarker, EdgesMarker,
                                              HashMarker, PartsMarker, ProvenanceMarker,
                                              ReplayMarker, RoundMarker, SampleMarker,
                                              SettleMarker, TokenizerMarker, TokensMarker,
                                              WriteMarker)
from mspretrain.dataprep.records import InputFile
from mspretrain.loader.manifest import ShardInfo

MARKERS = [
    DocsMarker(unit=3, chunks=[ChunkDocs(index=3_000_000, rows=12, reused=False),
                               ChunkDocs(index=3_000_001, rows=5, reused=True)],
               rows=17, sig_dtype="uint32"),
    DocsMarker(unit=1, stop=["a.jsonl", 3, "invalid_json", "line 3"], stop_kind="strict"),
    SettleMarker(unit=0, kept_docs=4, kept_bytes=90, train_bytes=80, exact=[1, 20], near=[0, 0],
                 duplicate_ids=[["a.jsonl", "7", "b.jsonl"]]),
    SampleMarker(unit=2, sample_docs=3, sample_bytes=300),
    TokenizerMarker(vocab_size=512, reused=False),
    TokenizerMarker(error="the sample is empty"),
    TokensMarker(unit=0, chunks=[ChunkTokens(index=0, tokens={"train": 90, "valid": 7},
                                             reused=False)]),
    WriteMarker(split="train", shard=ShardInfo(file="shards/train-00000.mindrecord",
                                               first_sample=0, num_samples=8, bytes=4096,
                                               sha256="ab" * 32, db_sha256="cd" * 32)),
    ProvenanceMarker(split="valid", length_bins=[0, 2, 5], tokens=97),
    EdgesMarker(part=1, edges=6),
    ReplayMarker(part=0, docs=10, drops=2, frozen=0),
    RoundMarker(changed=3, sent=5),
    PartsMarker(parts=[InputFile(Path("/in/big.jsonl"), "big.jsonl", 0, 100, 0),
                       InputFile(Path("/in/big.jsonl"), "big.jsonl", 100, -1, 9)]),
    HashMarker(sha256="ef" * 32),
]


@pytest.mark.parametrize("marker", MARKERS, ids=lambda m: type(m).__name__)
def test_a_marker_goes_to_a_dict_and_back_unchanged(marker):
    assert type(marker).from_dict(marker.to_dict()) == marker


# the markers a task also stores as JSON (PartsMarker, HashMarker only travel to the plan)
@pytest.mark.parametrize("marker", MARKERS[:-2], ids=lambda m: type(m).__name__)
def test_a_stored_marker_reads_back_from_its_json(marker):
    assert type(marker).from_dict(json.loads(json.dumps(marker.to_dict()))) == marker


def test_the_plan_reads_the_executors_accounting_apart_from_the_marker(tmp_path):
    stored = MARKERS[0].to_dict()
    finish(tmp_path / "m.json", stored)
    again = done(tmp_path / "m.json")           # what a rerun's task returns
    back = DocsMarker.from_dict({**again, "task_cpu_s": 0.25})
    assert back.reused is True and back.chunks == MARKERS[0].chunks
    assert "reused" not in stored and "reused" not in json.loads((tmp_path / "m.json").read_text())


def test_the_stored_json_keeps_the_work_dir_layout(tmp_path):
    """A done/ file written before the markers were dataclasses reads back, and a marker written
    now has the same keys: a build killed under either resumes under the other."""
    before = {"unit": 3, "rows": 17, "sig_dtype": "uint32",
              "chunks": [{"index": 3_000_000, "rows": 12, "reused": False},
                         {"index": 3_000_001, "rows": 5, "reused": True}]}
    assert DocsMarker.from_dict(before) == MARKERS[0]
    assert MARKERS[0].to_dict() == before
    assert TokensMarker.from_dict(MARKERS[6].to_dict()).chunks[0].tokens == {"train": 90, "valid": 7}
    assert MARKERS[7].to_dict()["shard"]["file"] == "shards/train-00000.mindrecord"
    assert set(MARKERS[1].to_dict()) == {"unit", "chunks", "stop", "stop_kind"}
