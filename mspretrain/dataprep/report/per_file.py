"""Per-input-file counts for the build report: documents read and kept, tokens, and samples that
hold some of the file's text; so a user sees at once which file dominates the dataset.

Everything is read back from the work dir after packing: the stage-1 chunk tables (each document's
source), the dedup keep masks and the stage-4 records (document ids and lengths, in packing order). A
split's documents are packed back to back in chunk order, so a document's place in its split's token
stream, and hence the samples it reaches, follow from the lengths alone. Memory: O(files).
"""
from __future__ import annotations

import numpy as np

from mspretrain.common.arrow import read_parquet
from mspretrain.dataprep.records import SPLITS, SplitTokens


def per_file_counts(work, chunks, files: list[str], manifest) -> dict:
    """{file: {"docs_read", "docs_kept", "tokens", "samples"}} in input order; files that gave no
    document (skipped or empty) are listed with zeros. `chunks`: (chunk index, keep mask) of every
    stage-1 chunk, in input order."""
    counts = {f: _zero() for f in files}
    size = manifest.seq_length + 1
    offset = {s: 0 for s in SPLITS}                  # tokens of the split stream so far
    last_sample = {s: {} for s in SPLITS}            # file -> the last sample counted for it
    for index, keep in chunks:
        table = read_parquet(work.chunk_file(work.docs, index, "parquet"), columns=["doc_id", "source"])
        sources = np.asarray(table.column("source").to_pylist(), dtype=object)
        source_of = dict(zip(table.column("doc_id").to_pylist(), sources.tolist()))
        for src in dict.fromkeys(sources.tolist()):
            c = counts.setdefault(src, _zero())
            mine = sources == src
            c["docs_read"] += int(np.count_nonzero(mine))
            c["docs_kept"] += int(np.count_nonzero(keep & mine))
        path = work.chunk_file(work.tokens, index, "npz")
        if not path.is_file():
            continue
        with np.load(path) as z:
            for s in SPLITS:
                rec = SplitTokens.load(z, s, tokens=False)
                if not rec.doc_ids:
                    continue
                lens = rec.lens.astype(np.int64)
                starts = offset[s] + np.concatenate([[0], np.cumsum(lens)[:-1]])
                offset[s] += int(lens.sum())
                first, last = starts // size, (starts + lens - 1) // size
                cap = manifest.splits[s].num_samples - 1      # the tail past it was dropped
                src_of = np.asarray([source_of[d] for d in rec.doc_ids], dtype=object)
                for src in dict.fromkeys(src_of.tolist()):
                    m = src_of == src
                    counts[src]["tokens"] += int(lens[m].sum())
                    f, l = first[m], np.minimum(last[m], cap)
                    prev = np.concatenate([[last_sample[s].get(src, -1)], l[:-1]])
                    counts[src]["samples"] += int(np.clip(l - np.maximum(f, prev + 1) + 1, 0,
                                                          None).sum())
                    last_sample[s][src] = max(int(l[-1]), last_sample[s].get(src, -1))
    return counts


def _zero() -> dict:
    return {"docs_read": 0, "docs_kept": 0, "tokens": 0, "samples": 0}
