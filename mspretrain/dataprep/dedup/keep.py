"""Stage 2's keep rule (dedup), in input order: duplicate ids, exact dedup, near dedup.

For each document that passed the quality filters, in input order:
  1. a doc_id seen before (in any earlier document) is a bad record `duplicate_doc_id`: ids must be
     unique for provenance to mean anything;
  2. an exact key (hash of the normalised text) seen before: dropped as `exact` (similarity 1.0);
  3. a MinHash near-duplicate of a kept document (dedup.NearDedup): dropped as `near`; a pair whose
     estimate is near the threshold is settled by the exact Jaccard similarity of the two texts,
     read back from the stage-1 chunk files;
  4. otherwise kept, and indexed for the documents after it.
The first document in input order is always the one kept. Every dropped document becomes one row of
dedup/duplicates.parquet (doc_id, kept_doc_id, kind, similarity). Every document read becomes one
row of documents/attributes.parquet (input order): its language and score, quality score, PII
matches, matched evaluation items and its fate (kept, the filter that dropped it, exact or near),
so that a user can join it with provenance on doc_id and re-filter.

The plan runs this rule once per partition over the documents that share an exact key or an LSH
cell with another (plan/dedup.py `replay` says why that gives the decisions of one pass over the
whole corpus); the documents that share nothing are kept without it.
"""
from __future__ import annotations

from collections.abc import Callable

import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from mspretrain.common import arrow
from mspretrain.dataprep.dedup.detect import DedupConfig, NearDedup

DUPLICATES_FILE = "dedup/duplicates.parquet"
ATTRIBUTES_FILE = "documents/attributes.parquet"
ATTRIBUTES_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()),
                               ("language", pa.string()), ("script", pa.string()),
                               ("language_score", pa.float64()),
                               ("quality", pa.float64()), ("pii", pa.int32()),
                               ("decontam", pa.string()), ("fate", pa.string())])
DUPLICATES_SCHEMA = pa.schema([("doc_id", pa.string()), ("kept_doc_id", pa.string()),
                               ("kind", pa.string()), ("similarity", pa.float64())])


@dataclass
class DedupResult:
    """Stage 2's counts over the whole corpus (the report's)."""
    docs_seen: int = 0
    kept_docs: int = 0
    kept_bytes: int = 0
    train_bytes: int = 0
    exact: list[int] = field(default_factory=lambda: [0, 0])        # docs, bytes dropped
    near: list[int] = field(default_factory=lambda: [0, 0])
    duplicate_ids: list[list] = field(default_factory=list)   # [source, doc_id, first source]


@dataclass
class Decisions:
    """What stage 2 decided for one chunk of stage-1 output."""
    keep: np.ndarray         # bool per row
    duplicates: pa.Table     # its rows of dedup/duplicates.parquet, in input order
    fate: list[str]          # per row: kept, the filter's reason, duplicate_doc_id, exact or near


class DedupPass:
    # the stage-1 columns `consume` reads
    COLUMNS = ["doc_id", "source", "reason", "key", "sig", "bytes_clean", "split"]

    def __init__(self, cfg: DedupConfig, texts: Callable[[int], pa.ChunkedArray] | None = None,
                 spill: Path | None = None, hot_docs: int = 1 << 15):
        """`texts(chunk)`: the text column of the chunk consumed `chunk`-th (0-based), which verify
        near-threshold pairs exactly (without it, the signature estimate decides alone).
        `spill`: a directory for the LSH index's segments (NearDedup) and the seen ids and exact
        keys (SeenStore): memory then holds the signatures and band entries of at most `hot_docs`
        kept documents, whatever the corpus; anything in it is from an earlier try of this stage
        and is removed first. Without it everything stays in memory."""
        self.texts = texts
        if spill is not None:
            shutil.rmtree(spill, ignore_errors=True)
        self.near = NearDedup(cfg, texts_of=self._kept_texts if texts is not None else None,
                              spill=spill, hot_docs=hot_docs)
        self.seen = SeenStore(spill / "seen.sqlite" if spill is not None else None)
        self._texts: dict[int, pa.ChunkedArray] = {}     # a few chunks' texts, read on demand
        self.result = DedupResult()
        self.chunks = 0     # consumed so far: the number `texts` takes

    def consume(self, table: pa.Table, sig_dtype: np.dtype) -> Decisions:
        """One chunk of stage-1 output, in input order.

        Near dedup runs on the whole chunk at once (NearDedup.add_many gives what `add` would, in
        order). A document whose exact key matches an earlier one of the same chunk goes with it
        and is then settled after it: an exact duplicate if that one was kept, otherwise the result
        add_many gave it (the same as `add` in order). So the decisions, and their order in
        duplicates.parquet, do not depend on where the chunk boundaries fall."""
        c = {name: table.column(name).to_pylist()
             for name in ("doc_id", "source", "reason", "key", "sig", "bytes_clean", "split")}
        chunk = self.chunks
        self.chunks += 1
        keep = np.zeros(table.num_rows, bool)
        drops: list[tuple] = []   # (row, doc_id, kept_doc_id, kind, similarity, bytes)
        near_rows, first_row, same_as = [], {}, {}
        earlier_ids = self.seen.known_ids(c["doc_id"])    # doc_id -> the file it came from
        earlier_keys = self.seen.kept_keys(c["key"])
        new_ids: dict[str, int] = {}     # doc_id -> row, the first time it is seen
        for i, doc_id in enumerate(c["doc_id"]):
            if doc_id in earlier_ids or doc_id in new_ids:
                first = earlier_ids[doc_id] if doc_id in earlier_ids else c["source"][new_ids[doc_id]]
                self.result.duplicate_ids.append([c["source"][i], doc_id, first])
                continue
            new_ids[doc_id] = i
            if c["reason"][i]:
                continue
            key = c["key"][i]
            if key in earlier_keys:
                drops.append((i, doc_id, earlier_keys[key], "exact", 1.0, c["bytes_clean"][i]))
                continue
            if key in first_row:
                same_as[i] = first_row[key]
            else:
                first_row[key] = i
            near_rows.append(i)
        if near_rows:
            sigs = np.stack([np.frombuffer(c["sig"][i], sig_dtype) for i in near_rows])
            text = ((lambda j: self._chunk_texts(chunk)[near_rows[j]].as_py())
                    if self.texts is not None else None)
            hits = self.near.add_many([c["doc_id"][i] for i in near_rows], sigs, text)
            for i, hit in zip(near_rows, hits):
                j = same_as.get(i)
                if j is not None and keep[j]:
                    drops.append((i, c["doc_id"][i], c["doc_id"][j], "exact", 1.0, c["bytes_clean"][i]))
                elif hit is None:
                    keep[i] = True
                    self._kept(c["bytes_clean"][i], c["split"][i])
                else:
                    drops.append((i, c["doc_id"][i], hit[0], "near", hit[1], c["bytes_clean"][i]))
        self.seen.add(chunk, new_ids, keep, c["key"], c["source"])
        rows: dict[str, list] = {name: [] for name in DUPLICATES_SCHEMA.names}
        for _, doc_id, kept, kind, sim, nbytes in sorted(drops):
            counts = self.result.exact if kind == "exact" else self.result.near
            counts[0] += 1
            counts[1] += nbytes
            for name, value in zip(DUPLICATES_SCHEMA.names, (doc_id, kept, kind, sim)):
                rows[name].append(value)
        self.result.docs_seen += table.num_rows
        fate = [r or ("kept" if k else "duplicate_doc_id") for r, k in zip(c["reason"], keep)]
        for i, _, _, kind, _, _ in drops:
            fate[i] = kind
        return Decisions(keep, arrow.table(rows, DUPLICATES_SCHEMA), fate)

    def _chunk_texts(self, chunk: int) -> pa.ChunkedArray:
        """The text column of a consumed chunk (the last few read are kept)."""
        if chunk not in self._texts:
            if len(self._texts) >= 4:
                self._texts.pop(next(iter(self._texts)))
            self._texts[chunk] = self.texts(chunk)
        return self._texts[chunk]

    def _kept_texts(self, doc_ids: list[str]) -> list[str]:
        """Texts of kept documents, each chunk they come from read once."""
        where = self.seen.where(doc_ids)
        by_chunk: dict[int, list[str]] = {}
        for d in doc_ids:
            by_chunk.setdefault(where[d][0], []).append(d)
        text = {}
        for chunk, ids in sorted(by_chunk.items()):
            column = self._chunk_texts(chunk)
            text.update((d, column[where[d][1]].as_py()) for d in ids)
        return [text[d] for d in doc_ids]

    def _kept(self, nbytes: int, split: str) -> None:
        r = self.result
        r.kept_docs += 1
        r.kept_bytes += nbytes
        if split == "train":
            r.train_bytes += nbytes

    def finish(self) -> DedupResult:
        return self.result


class SeenStore:
    """Every doc_id seen so far, and the exact key, chunk and row of every kept document, in SQLite: on
    disk under the work dir (its page cache bounded) for a build, so the main process does not grow
    with the corpus; in memory without a path. Queried a chunk at a time."""
    _BATCH = 900    # parameters per query: below every SQLite build's limit

    def __init__(self, path: Path | None):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)    # an earlier try's
        self.db = sqlite3.connect(str(path) if path is not None else ":memory:")
        # scratch state: a killed stage 2 starts again from an empty store, so no journal, no fsync
        self.db.executescript(
            "PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA cache_size=-8192;"
            "CREATE TABLE ids (id TEXT PRIMARY KEY, chunk INTEGER, row INTEGER, source TEXT) "
            "WITHOUT ROWID;"
            "CREATE TABLE keys (key BLOB PRIMARY KEY, doc_id TEXT) WITHOUT ROWID;")

    def _select(self, sql: str, values: list) -> list:
        out = []
        for s in range(0, len(values), self._BATCH):
            part = values[s:s + self._BATCH]
            out += self.db.execute(sql.format(",".join("?" * len(part))), part).fetchall()
        return out

    def known_ids(self, ids: list[str]) -> dict[str, str]:
        """id -> the file of its first document, for the ids seen before."""
        return dict(self._select("SELECT id, source FROM ids WHERE id IN ({})", ids))

    def kept_keys(self, keys: list[bytes]) -> dict[bytes, str]:
        return dict(self._select("SELECT key, doc_id FROM keys WHERE key IN ({})", keys))

    def add(self, chunk: int, new_ids: dict[str, int], keep: np.ndarray, keys: list[bytes],
            sources: list[str]) -> None:
        """The chunk's first-seen ids (doc_id -> row) and their files, with chunk and row for the
        kept ones."""
        self.db.executemany("INSERT INTO ids VALUES (?, ?, ?, ?)",
                            [(d, chunk, r, sources[r]) if keep[r] else (d, None, None, sources[r])
                             for d, r in new_ids.items()])
        self.db.executemany("INSERT OR REPLACE INTO keys VALUES (?, ?)",
                            [(keys[r], d) for d, r in new_ids.items() if keep[r]])

    def where(self, doc_ids: list[str]) -> dict[str, tuple[int, int]]:
        """doc_id -> (chunk, row) of kept documents."""
        return {d: (c, r) for d, c, r in
                self._select("SELECT id, chunk, row FROM ids WHERE id IN ({})", list(set(doc_ids)))}


def attributes_table(table: pa.Table, fate: list[str]) -> pa.Table:
    """The documents/attributes.parquet rows of one chunk of stage-1 output (plan/units.settle_unit)."""
    cols = {n: table.column(n) for n in ATTRIBUTES_SCHEMA.names if n in table.column_names}
    cols["fate"] = fate
    return arrow.table(cols, ATTRIBUTES_SCHEMA)
