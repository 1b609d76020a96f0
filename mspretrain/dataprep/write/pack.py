"""Packing: documents back to back into samples of seq_length + 1 tokens (written as MindRecord shards
by plan/write.py, each over a fixed range of samples), with their provenance.

Each document ends in EOS. The documents of a split form one token stream in input order; sample k of
the split is stream[k*(L) : (k+1)*L] with L = seq_length + 1, so sample ids are global and contiguous.
A document may straddle samples; nothing is padded.

Tail: the last, partial sample of each split (fewer than L tokens) is dropped. Its tokens are counted
in the report as `tail_tokens_dropped` (at most seq_length per split), and its documents' pieces do not
appear in the provenance.

Provenance (provenance/<split>.parquet), one row per piece of a document inside a sample:
  sample_id, doc_id, doc_offset (first token of the piece within the document, EOS counted last),
  sample_offset (where the piece starts in the sample), length; with a quality classifier
  (filters.quality.model) also quality, the document's score, so samples can be re-filtered later.
  Row groups hold a fixed number of rows, so the file does not depend on how the build was chunked.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mspretrain.common import arrow

PROVENANCE_DIR = "provenance"
PROVENANCE_SCHEMA = pa.schema([("sample_id", pa.int64()), ("doc_id", pa.string()),
                               ("doc_offset", pa.int32()), ("sample_offset", pa.int32()),
                               ("length", pa.int32())])
QUALITY_FIELD = pa.field("quality", pa.float64())
ROW_GROUP = 1 << 16


def provenance_schema(quality: bool) -> pa.Schema:
    return PROVENANCE_SCHEMA.append(QUALITY_FIELD) if quality else PROVENANCE_SCHEMA


class ProvenanceWriter:
    def __init__(self, path: Path, quality: bool = False):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.schema = provenance_schema(quality)
        self._writer = pq.ParquetWriter(path, self.schema, compression="zstd")
        self._cols: list[dict] = []
        self._rows = 0

    def add(self, cols: dict) -> None:
        n = len(cols["sample_id"])
        if n:
            self._cols.append(cols)
            self._rows += n
        while self._rows >= ROW_GROUP:
            self._flush(ROW_GROUP)

    def close(self) -> None:
        if self._rows:
            self._flush(self._rows)
        self._writer.close()

    def _flush(self, n: int) -> None:
        merged = {k: np.concatenate([c[k] for c in self._cols]) if k != "doc_id"
                  else [d for c in self._cols for d in c[k]] for k in self.schema.names}
        head = {k: v[:n] for k, v in merged.items()}
        self._writer.write_table(arrow.table(head, self.schema), row_group_size=n)
        rest = {k: v[n:] for k, v in merged.items()}
        self._rows -= n
        self._cols = [rest] if self._rows else []


class ProvenanceStream:
    """The provenance of one split's token stream, fed document lengths in input order: rows of
    whole samples are written, those of the partial last sample held back (and dropped at close)."""

    def __init__(self, path: Path, seq_length: int, quality: bool = False):
        self.L = seq_length + 1
        self.writer = ProvenanceWriter(path, quality)
        self._pending: dict | None = None     # provenance rows of the partial sample
        self.stream = 0                       # tokens appended so far

    def add(self, lens: np.ndarray, doc_ids: list[str], quality: np.ndarray | None = None) -> None:
        """Documents appended to the stream: their lengths (EOS included), ids and, when the stream
        has the column, quality scores."""
        if not len(lens):
            return
        pieces = self._pieces(lens, doc_ids, quality if "quality" in self.writer.schema.names else None)
        self.stream += int(lens.astype(np.int64).sum())
        done = self.stream // self.L
        if self._pending is not None:
            pieces = {k: np.concatenate([self._pending[k], v]) if k != "doc_id"
                      else self._pending[k] + v for k, v in pieces.items()}
        cut = int(np.searchsorted(pieces["sample_id"], done))
        self.writer.add({k: v[:cut] for k, v in pieces.items()})
        self._pending = {k: v[cut:] for k, v in pieces.items()}

    def close(self) -> None:
        self.writer.close()

    def _pieces(self, lens: np.ndarray, doc_ids: list[str], quality: np.ndarray | None) -> dict:
        """Provenance rows of the documents `lens` appended at the current end of the stream (with
        their `quality` scores when given)."""
        lens = lens.astype(np.int64)
        ends = self.stream + np.cumsum(lens)
        starts = ends - lens
        first, last = starts // self.L, (ends - 1) // self.L
        counts = last - first + 1
        doc = np.repeat(np.arange(len(lens)), counts)
        sample = first[doc] + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
        lo = np.maximum(starts[doc], sample * self.L)
        hi = np.minimum(ends[doc], (sample + 1) * self.L)
        rows = {"sample_id": sample.astype(np.int64), "doc_id": [doc_ids[i] for i in doc],
                "doc_offset": (lo - starts[doc]).astype(np.int32),
                "sample_offset": (lo - sample * self.L).astype(np.int32),
                "length": (hi - lo).astype(np.int32)}
        if quality is not None:
            rows["quality"] = np.asarray(quality, np.float64)[doc]
        return rows
