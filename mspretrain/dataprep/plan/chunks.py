"""The per-chunk work of a build, which the plan's per-unit tasks (plan/units.py) run chunk by chunk
(stage numbers as in plan/__init__.py), each with the process's Worker (plan/worker.py).

- `read_chunks`: streams a unit's input in order and cuts the documents into chunks of about
  `run.chunk_bytes` of text. The chunk boundaries depend only on the inputs and that size.
- `clean_chunk` (stage 1): every document of a chunk through the step pipeline (steps/pipeline.py:
  normalise, quality filters, language, decontamination, PII, quality classifier), its split, then the exact
  key and MinHash signature of the kept ones; writes .build/docs/NNNNN.parquet and then its marker
  NNNNN.json.
- `tokenize_chunk` (stage 4): encodes the kept documents of a chunk with sentencepiece
  (one document at a time, one thread: the parallelism is across processes), appends EOS to each, and
  writes .build/tokens/NNNNN.npz (a SplitTokens per split: flat token ids, document lengths and
  doc ids), then its marker.
- A document's split is computed once, by `clean_chunk` (the `split` column of its chunk file); every
  later stage reads it from there, and stage 5 takes the doc ids from the tokens file.

A chunk whose marker already exists (written by an earlier try of its task) is read back, not
computed again.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mspretrain.dataprep.dedup.detect import signatures
from mspretrain.dataprep.plan.worker import Worker
from mspretrain.dataprep.steps.pipeline import Pipeline
from mspretrain.dataprep.records import SPLITS, BadRecord, Document, InputFile, SplitTokens, split_of
from mspretrain.dataprep.workdir import read_json
from mspretrain.common import arrow
from mspretrain.common.files import atomic_open, atomic_path, atomic_write_json

# ------------------------------------------------------------------------------ stage 1: reading

@dataclass
class ChunkTask:
    index: int
    docs: list[Document]  # as read, in input order
    bad: list             # (file, line, reason, detail) met while reading this chunk
    stop: str = ""        # "strict" (a bad record) or "error" (a reader failure): `bad[-1]` fails
                          # the build, and this chunk is not written


def read_chunks(files: list[InputFile], text_field: str, id_field: str, text_unit: str,
                chunk_bytes: int, strict: bool, max_record_bytes: int = 0,
                id_scope: str = "global"):
    """ChunkTasks in input order. In strict mode the first bad record ends the stream. An empty
    file still ends in a chunk, so that every unit has one."""
    from mspretrain.dataprep.readers import read_file   # only the docs tasks read
    index, docs, bad, size, files_done = 0, [], [], 0, 0
    for f in files:
        try:
            for item in read_file(f, text_field=text_field, id_field=id_field, text_unit=text_unit,
                                  max_record_bytes=max_record_bytes, id_scope=id_scope):
                if isinstance(item, BadRecord):
                    bad.append((item.file, item.line, item.reason, item.detail))
                    if strict:
                        yield ChunkTask(index, [], bad, stop="strict")
                        return
                    continue
                docs.append(item)
                size += len(item.text)
                if size >= chunk_bytes:
                    yield ChunkTask(index, docs, bad)
                    index, docs, bad, size, files_done = index + 1, [], [], 0, 0
        except Exception as e:   # a reader failure is reported like a bad record, never swallowed
            yield ChunkTask(index, [], bad + [(f.rel, 0, "reader_failed", repr(e))], stop="error")
            return
        files_done += 1
    if docs or bad or files_done:
        yield ChunkTask(index, docs, bad)


# ------------------------------------------------------------------------------ stage 1: cleaning

DOCS_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("reason", pa.string()),
                         ("bytes_in", pa.int64()), ("bytes_clean", pa.int64()),
                         ("key", pa.binary()), ("sig", pa.binary()), ("text", pa.string()),
                         ("language", pa.string()), ("script", pa.string()),
                         ("language_score", pa.float64()),
                         ("quality", pa.float64()), ("pii", pa.int32()),
                         ("decontam", pa.string()), ("split", pa.string())])


def clean_chunk(worker: Worker, task: ChunkTask) -> dict:
    """Stage 1 for one chunk; returns its marker (counts), writing the chunk's outputs first."""
    return clean_chunk_table(worker, task)[0]


def clean_chunk_table(worker: Worker, task: ChunkTask) -> tuple[dict, pa.Table | None]:
    """clean_chunk, and the chunk's table as written (None for a stop or a chunk done earlier), so
    that a caller in the same process goes on without reading the file back."""
    if task.stop:
        return {"index": task.index, "stop": task.bad[-1], "stop_kind": task.stop}, None
    setup, pipeline = worker.setup, worker.pipeline
    marker_path = Path(setup.docs_dir) / f"{task.index:05d}.json"
    if marker_path.is_file():
        return {**read_json(marker_path), "reused": True}, None
    t0 = time.process_time()
    rows = {name: [] for name in DOCS_SCHEMA.names}
    filters = {name: [0, 0] for name in Pipeline.reasons}
    kept_docs = kept_bytes = 0
    stats = {"languages": {}, "pii": {}, "pii_languages": {}, "pii_docs": 0, "decontam": [],
             "decontam_cut": 0}
    decontam = pipeline.step("decontaminate")
    item_ids = decontam.index.item_ids if decontam else []
    results, new = [], []
    for doc in task.docs:
        results.append(pipeline.result(doc.text, new, doc.metadata))
    if new:
        for result, row in zip(new, signatures([r.clean for r in new], setup.dedup)):
            result.sig = row.copy()   # not a view that keeps the chunk's array alive
    sig_dtype = ""
    for doc, result in zip(task.docs, results):
        doc_id, text, reason, attrs = doc.doc_id, doc.text, result.reason, result.attrs
        clean = result.clean
        nbytes = utf8_len(clean)
        _count(stats, doc_id, clean, reason, attrs, setup.decontam.action, item_ids)
        if reason:
            filters.setdefault(reason, [0, 0])
            filters[reason][0] += 1
            filters[reason][1] += nbytes
            clean = ""
        else:
            kept_docs, kept_bytes = kept_docs + 1, kept_bytes + nbytes
            sig_dtype = str(result.sig.dtype)
        for name, value in (("doc_id", doc_id), ("source", doc.source), ("reason", reason),
                            ("bytes_in", utf8_len(text)), ("bytes_clean", nbytes),
                            ("key", result.key), ("text", clean),
                            ("sig", None if reason else result.sig.tobytes()),
                            ("language", attrs["language"]), ("script", attrs["script"]),
                            ("language_score", attrs["language_score"]),
                            ("quality", attrs["quality"]), ("pii", sum(attrs["pii"].values())),
                            ("decontam", ",".join(item_ids[i] for i in attrs["decontam"])),
                            ("split", split_of(doc_id, setup.valid_fraction, setup.split_seed))):
            rows[name].append(value)
    path = Path(setup.docs_dir) / f"{task.index:05d}.parquet"
    table = arrow.table(rows, DOCS_SCHEMA)
    with atomic_path(path) as tmp:
        # scratch, read back once: lz4 is cheaper than zstd both ways, and size does not matter here
        pq.write_table(table, tmp, compression="lz4")
    marker = {
        "index": task.index, "pid": os.getpid(), "cpu_s": round(time.process_time() - t0, 4),
        "docs_in": len(task.docs), "bytes_in": sum(rows["bytes_in"]),
        "bytes_clean": sum(rows["bytes_clean"]), "filters": filters,
        "docs_out": kept_docs, "bytes_out": kept_bytes,
        "bad": aggregate_bad(task.bad),
        "sig_dtype": sig_dtype, **stats,
    }
    atomic_write_json(marker_path, marker)
    return marker, table


def _count(stats: dict, doc_id: str, clean: str, reason: str, attrs: dict, action: str,
           item_ids: list) -> None:
    """Per-chunk counts of the document stages, for the report."""
    lang = stats["languages"].setdefault(attrs["language"], [0, 0, 0.0, 0])
    lang[0] += 1
    lang[1] += utf8_len(clean)
    lang[2] += attrs["language_score"]   # the report gives the mean per language
    lang[3] += attrs.get("language_unplaced", False)   # English CLD2 could not place (langid)
    by_kind = stats["pii_languages"].setdefault(attrs["language"], {}) if attrs["pii"] else {}
    for kind, n in attrs["pii"].items():
        stats["pii"][kind] = stats["pii"].get(kind, 0) + n
        by_kind[kind] = by_kind.get(kind, 0) + n
    stats["pii_docs"] += bool(attrs["pii"])
    for i in attrs["decontam"]:
        stats["decontam"].append([item_ids[i], doc_id])
    if attrs["decontam"] and action == "cut" and not reason:
        stats["decontam_cut"] += 1


def utf8_len(text: str) -> int:
    """len(text.encode("utf-8")), without encoding ASCII text (str.isascii() is O(1))."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def aggregate_bad(bad: list) -> dict:
    """{file: {reason: [count, first line, first detail]}} of (file, line, reason, detail) records."""
    out: dict = {}
    for file, line, reason, detail in bad:
        entry = out.setdefault(file, {}).setdefault(reason, [0, line, detail])
        entry[0] += 1
    return out


# ------------------------------------------------------------------------------ stage 4: tokenizing

def tokenize_chunk(worker: Worker, task: tuple[int, bytes, str]) -> dict:
    """Stage 4 for one chunk: `task` is (index, packed keep mask, tokenizer model path). Writes
    .build/tokens/NNNNN.npz (a SplitTokens per split), then its marker."""
    index, keep_bits, model = task
    setup = worker.setup
    marker_path = Path(setup.tokens_dir) / f"{index:05d}.json"
    if marker_path.is_file():
        return {**read_json(marker_path), "reused": True}
    t0 = time.process_time()
    sp = worker.processor(model)
    scored = bool(setup.filters.quality.model)
    table = arrow.read_parquet(Path(setup.docs_dir) / f"{index:05d}.parquet",
                               columns=["doc_id", "split", "text"] + ["quality"] * scored)
    keep = np.unpackbits(np.frombuffer(keep_bits, np.uint8), count=table.num_rows).astype(bool)
    rows = np.flatnonzero(keep)
    doc_ids = table.column("doc_id").to_pylist()
    splits = table.column("split").to_pylist()
    texts = table.column("text").to_pylist()
    quality = arrow.to_numpy(table.column("quality"), nulls_as=np.nan) if scored else None
    arrays = {}
    marker = {"index": index, "pid": os.getpid(), "tokens": {}, "docs": {}, "bytes": {}}
    for split in SPLITS:
        mine = [int(r) for r in rows if splits[r] == split]
        chunk_texts = [texts[r] for r in mine]
        # one document at a time, straight to int32: a chunk's ids as Python ints take ~35 B a token,
        # and building that list cost a fifth of the encoding (sentencepiece hands its buffer over)
        ids = [sp.encode(t, return_type="numpy") for t in chunk_texts]
        tokens, lens = _with_eos(ids, sp.eos_id())
        part = SplitTokens(tokens, lens, [doc_ids[r] for r in mine],
                           quality[mine] if scored else None)
        arrays.update(part.arrays(split))
        marker["tokens"][split] = int(tokens.size)
        marker["docs"][split] = len(mine)
        marker["bytes"][split] = sum(map(utf8_len, chunk_texts))
    path = Path(setup.tokens_dir) / f"{index:05d}.npz"
    with atomic_open(path) as f:
        np.savez(f, **arrays)
    marker["cpu_s"] = round(time.process_time() - t0, 4)
    atomic_write_json(marker_path, marker)
    return marker


def _with_eos(ids: list[np.ndarray], eos: int) -> tuple[np.ndarray, np.ndarray]:
    """Flat int32 tokens with EOS after every document, and each document's length (EOS included)."""
    lens = np.fromiter((len(x) + 1 for x in ids), np.int32, len(ids))
    tokens = np.full(int(lens.sum()), eos, np.int32)
    ends = np.cumsum(lens, dtype=np.int64)
    for x, end in zip(ids, ends):
        tokens[end - 1 - len(x):end - 1] = x
    return tokens, lens
