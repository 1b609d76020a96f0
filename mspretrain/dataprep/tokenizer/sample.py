"""The tokenizer's training sample: which kept train documents go into it. A document is in when a
hash of its id falls under a fraction, so both engines pick the same documents, chunk by chunk, and
write the same sample file byte for byte."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mspretrain.common.arrow import read_parquet
from mspretrain.dataprep.config import BuildConfig
from mspretrain.dataprep.records import unit_hash


def sample_fraction(cfg: BuildConfig, train_bytes: int) -> float:
    """The share of kept train documents that goes into the tokenizer's training sample."""
    return min(1.0, cfg.tokenizer.sample_bytes / max(1, train_bytes))


def write_chunk_sample(f, docs_file: Path, keep: np.ndarray, p: float) -> tuple[int, int]:
    """Append a chunk's share of the tokenizer sample to `f`, one line a sentence: its kept train
    documents whose hash falls under p. Returns (documents, bytes) written."""
    table = read_parquet(docs_file, columns=["doc_id", "split", "text"])
    ids, splits = table.column("doc_id").to_pylist(), table.column("split").to_pylist()
    texts = table.column("text").to_pylist()
    docs = nbytes = 0
    for r in np.flatnonzero(keep):
        doc_id = ids[r]
        if splits[r] == "train" and unit_hash(f"tokenizer:{doc_id}") < p:
            lines = [s for s in texts[r].split("\n") if s.strip()]
            f.write("\n".join(lines) + "\n")
            docs += 1
            nbytes += len(texts[r].encode("utf-8"))
    return docs, nbytes
