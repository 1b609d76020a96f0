"""A document's id and split travel with it through the build: stage 1 computes the split once and
stores it in the chunk file, stage 4 takes it from there and writes the doc ids beside the tokens
(SplitTokens), and stage 5 packs them and writes the provenance from that record alone."""
from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import sentencepiece as spm

from dataprep.dedup import DedupConfig
from dataprep.filters import FILTER_NAMES, FilterConfig
from dataprep.readers import Document
from dataprep.stages import (ChunkTask, SplitTokens, WorkerSetup, clean_chunk, init_worker,
                             split_of, tokenize_chunk)

SENTENCES = ["The package manager keeps a list of installed packages.",
             "A mirror serves the archive over HTTP to every client machine.",
             "Configuration files live under the etc directory of the system.",
             "The kernel loads modules for the hardware it finds at boot."]


def _docs(n: int) -> list[Document]:
    return [Document(f"doc-{i}", f"{SENTENCES[i % 4]} Paragraph {i} of the manual.", "t.jsonl")
            for i in range(n)]


def test_split_tokens_round_trip_keeps_every_id_exactly(tmp_path):
    ids = ["a", "中文:3", "ends-in-nul\x00", "", "x" * 300]
    part = SplitTokens(np.arange(12, dtype=np.int32), np.array([2, 3, 1, 4, 2], np.int32), ids)
    empty = SplitTokens(np.zeros(0, np.int32), np.zeros(0, np.int32), [])
    np.savez(tmp_path / "t.npz", **part.arrays("train"), **empty.arrays("valid"))
    with np.load(tmp_path / "t.npz") as z:   # no pickle: plain arrays only
        back, none = SplitTokens.load(z, "train"), SplitTokens.load(z, "valid", tokens=False)
    assert back.doc_ids == ids
    assert np.array_equal(back.tokens, part.tokens) and np.array_equal(back.lens, part.lens)
    assert none.doc_ids == [] and none.tokens is None and len(none.lens) == 0


def test_stage_1_stores_the_split_and_stage_4_follows_the_stored_column(tmp_path):
    docs_dir, tokens_dir = tmp_path / "docs", tmp_path / "tokens"
    docs_dir.mkdir()
    tokens_dir.mkdir()
    init_worker(WorkerSetup(str(docs_dir), str(tokens_dir),
                            FilterConfig(min_chars=1, disabled=FILTER_NAMES), DedupConfig(),
                            valid_fraction=0.5, split_seed=7))
    docs = _docs(24)
    assert clean_chunk(ChunkTask(0, docs, [], 1))["docs_out"] == len(docs)
    chunk = docs_dir / "00000.parquet"
    table = pq.read_table(chunk)
    stored = table.column("split").to_pylist()
    assert stored == [split_of(d.doc_id, 0.5, 7) for d in docs]
    assert set(stored) == {"train", "valid"}

    # swap every stored split: stage 4 must follow the column, not recompute it from the id
    swapped = pc.if_else(pc.equal(table.column("split"), "train"), "valid", "train")
    pq.write_table(table.set_column(table.schema.get_field_index("split"), "split", swapped), chunk)
    (tmp_path / "sample.txt").write_text("\n".join(d.text for d in docs) + "\n")
    spm.SentencePieceTrainer.train(input=str(tmp_path / "sample.txt"),
                                   model_prefix=str(tmp_path / "m"), vocab_size=80,
                                   hard_vocab_limit=False, minloglevel=2)
    keep = np.ones(len(docs), bool)
    keep[3] = False
    tokenize_chunk((0, np.packbits(keep).tobytes(), str(tmp_path / "m.model")))
    with np.load(tokens_dir / "00000.npz") as z:
        got = {s: SplitTokens.load(z, s) for s in ("train", "valid")}
    for split, other in (("train", "valid"), ("valid", "train")):
        want = [d.doc_id for d, s, k in zip(docs, stored, keep) if s == other and k]
        assert got[split].doc_ids == want
        assert len(got[split].lens) == len(want) and got[split].lens.sum() == got[split].tokens.size
