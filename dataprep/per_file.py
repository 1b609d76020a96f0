"""Per-input-file counts for the build report: documents read and kept, tokens, and samples that
hold some of the file's text; so a user sees at once which file dominates the dataset.

Everything is read back from the work dir after packing (the stage-1 chunk tables for each document's
source, the dedup keep masks, the stage-4 token arrays) and from the staged provenance, so a resumed
build counts the whole corpus.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

SPLITS = ("train", "valid")


def per_file_counts(work, dedup, files: list[str]) -> dict:
    """{file: {"docs_read", "docs_kept", "tokens", "samples"}} in input order; files that gave no
    document (skipped or empty) are listed with zeros."""
    counts = {f: {"docs_read": 0, "docs_kept": 0, "tokens": 0, "samples": 0} for f in files}
    source_of: dict[str, str] = {}
    for i in range(dedup.num_chunks):
        table = pq.read_table(work.chunk_file(work.docs, i, "parquet"), columns=["doc_id", "source"])
        sources = np.asarray(table.column("source").to_pylist(), dtype=object)
        keep = dedup.keep(i)
        for src, n in zip(*np.unique(sources, return_counts=True)):
            counts.setdefault(src, {"docs_read": 0, "docs_kept": 0, "tokens": 0, "samples": 0})
            counts[src]["docs_read"] += int(n)
            counts[src]["docs_kept"] += int(np.count_nonzero(keep & (sources == src)))
        ids = table.column("doc_id").to_pylist()
        source_of.update((ids[r], sources[r]) for r in np.flatnonzero(keep))
        tokens = work.chunk_file(work.tokens, i, "npz")
        if tokens.is_file():
            with np.load(tokens) as z:
                for s in SPLITS:
                    for r, n in zip(z[f"{s}_rows"].tolist(), z[f"{s}_lens"].tolist()):
                        counts[sources[r]]["tokens"] += n
    for s in SPLITS:
        path = Path(work.staging) / "provenance" / f"{s}.parquet"
        if not path.is_file():
            continue
        prov = pq.read_table(path, columns=["sample_id", "doc_id"])
        pairs = set(zip(prov.column("sample_id").to_pylist(), prov.column("doc_id").to_pylist()))
        seen = {(sid, source_of[d]) for sid, d in pairs if d in source_of}
        for _, src in seen:
            counts[src]["samples"] += 1
    return counts
