"""The per-chunk work of a build, which the plan's per-unit tasks (plan/units.py) run chunk by chunk
(stage numbers as in plan/__init__.py).

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

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mspretrain.dataprep.dedup.detect import DedupConfig, exact_key, signatures
from mspretrain.dataprep.steps.decontam import DecontamConfig
from mspretrain.dataprep.steps.filters import FILTER_NAMES, FilterConfig
from mspretrain.dataprep.steps.pii import PiiConfig
from mspretrain.dataprep.steps.pipeline import (Decontaminate, LanguageFilter, Pipeline, QualityClassifier,
                                                 RedactPii, build_steps)
from mspretrain.dataprep.records import BadRecord, Document, InputFile
from mspretrain.dataprep.workdir import read_json
from mspretrain.common import arrow
from mspretrain.common.files import atomic_open, atomic_path, atomic_write_json, file_identity

SPLITS = ("train", "valid")


@dataclass(frozen=True)
class WorkerSetup:
    docs_dir: str
    tokens_dir: str
    filters: FilterConfig
    dedup: DedupConfig
    valid_fraction: float
    split_seed: int
    pii: PiiConfig = PiiConfig()
    decontam: DecontamConfig = DecontamConfig()
    # file_identity of each file the stages read (evaluation sets, quality model): a file
    # rewritten under the same name makes another setup (see init_worker)
    files: tuple = ()


class Worker:
    """What one process keeps while it serves a build: its setup, the step pipeline (built on first
    use, so a process that only tokenizes never loads the evaluation sets) and the loaded tokenizer.
    A process that serves another setup (a Ray worker lives across builds) gets a new Worker, so
    nothing cached for the old build survives."""

    def __init__(self, setup: WorkerSetup | None):
        self.setup = setup
        self._pipeline: Pipeline | None = None
        self._sp: dict = {}

    @property
    def pipeline(self) -> Pipeline:
        if self._pipeline is None:
            self._pipeline = pipeline_for(self.setup)
        return self._pipeline

    def processor(self, model: str):
        """The loaded model at `model`, by the file's identity, not only its name: a process that
        lives across builds may see another build's tokenizer written at the same path."""
        key = (model, file_identity(model))
        if key not in self._sp:
            import sentencepiece as spm
            self._sp = {key: spm.SentencePieceProcessor(model_file=model)}
        return self._sp[key]


def pipeline_for(setup: WorkerSetup) -> Pipeline:
    """The document steps of `setup`, as every engine runs them."""
    return Pipeline(build_steps(setup.filters, setup.decontam, setup.pii), exact_key)


_worker: Worker | None = None


def init_worker(setup: WorkerSetup) -> None:
    """Make `setup` the process's (a new Worker when it differs from the one served so far)."""
    global _worker
    if _worker is None or _worker.setup != setup:
        _worker = Worker(setup)


# ------------------------------------------------------------------------------ stage 1: reading

@dataclass
class ChunkTask:
    index: int
    docs: list[Document]  # as read, in input order
    bad: list             # (file, line, reason, detail) met while reading this chunk
    files_done: int       # input files finished while reading this chunk (an empty file still
                          # ends in a chunk, so that every unit has one)
    stop: str = ""        # "strict" (a bad record) or "error" (a reader failure): `bad[-1]` fails
                          # the build, and this chunk is not written


def read_chunks(files: list[InputFile], text_field: str, id_field: str, text_unit: str,
                chunk_bytes: int, strict: bool, max_record_bytes: int = 0,
                id_scope: str = "global"):
    """ChunkTasks in input order. In strict mode the first bad record ends the stream."""
    from mspretrain.dataprep.readers import read_file   # only the docs tasks read
    index, docs, bad, size, files_done = 0, [], [], 0, 0
    for f in files:
        try:
            for item in read_file(f, text_field=text_field, id_field=id_field, text_unit=text_unit,
                                  max_record_bytes=max_record_bytes, id_scope=id_scope):
                if isinstance(item, BadRecord):
                    bad.append((item.file, item.line, item.reason, item.detail))
                    if strict:
                        yield ChunkTask(index, [], bad, files_done, stop="strict")
                        return
                    continue
                docs.append(item)
                size += len(item.text)
                if size >= chunk_bytes:
                    yield ChunkTask(index, docs, bad, files_done)
                    index, docs, bad, size, files_done = index + 1, [], [], 0, 0
        except Exception as e:   # a reader failure is reported like a bad record, never swallowed
            yield ChunkTask(index, [], bad + [(f.rel, 0, "reader_failed", repr(e))], files_done,
                            stop="error")
            return
        files_done += 1
    if docs or bad or files_done:
        yield ChunkTask(index, docs, bad, files_done)


# ------------------------------------------------------------------------------ stage 1: cleaning

DOCS_SCHEMA = pa.schema([("doc_id", pa.string()), ("source", pa.string()), ("reason", pa.string()),
                         ("bytes_in", pa.int64()), ("bytes_clean", pa.int64()),
                         ("key", pa.binary()), ("sig", pa.binary()), ("text", pa.string()),
                         ("language", pa.string()), ("script", pa.string()),
                         ("language_score", pa.float64()),
                         ("quality", pa.float64()), ("pii", pa.int32()),
                         ("decontam", pa.string()), ("split", pa.string())])
# reasons of the document stages after the quality filters, in check order
STAGE_REASONS = (LanguageFilter.reasons + Decontaminate.reasons + RedactPii.reasons
                 + QualityClassifier.reasons)


def clean_chunk(task: ChunkTask) -> dict:
    """Stage 1 for one chunk; returns its marker (counts), writing the chunk's outputs first."""
    return clean_chunk_table(task)[0]


def clean_chunk_table(task: ChunkTask) -> tuple[dict, pa.Table | None]:
    """clean_chunk, and the chunk's table as written (None for a stop or a chunk done earlier), so
    that a caller in the same process goes on without reading the file back."""
    if task.stop:
        return {"index": task.index, "stop": task.bad[-1], "stop_kind": task.stop}, None
    setup, pipeline = _worker.setup, _worker.pipeline
    marker_path = Path(setup.docs_dir) / f"{task.index:05d}.json"
    if marker_path.is_file():
        return {**read_json(marker_path), "reused": True}, None
    t0 = time.process_time()
    rows = {name: [] for name in DOCS_SCHEMA.names}
    filters = {name: [0, 0] for name in FILTER_NAMES + STAGE_REASONS}
    kept_docs = kept_bytes = 0
    stats = {"languages": {}, "pii": {}, "pii_languages": {}, "pii_docs": 0, "decontam": [],
             "decontam_cut": 0}
    decontam = pipeline.step("decontaminate")
    item_ids = decontam.index.item_ids if decontam else []
    results, new = [], []
    for doc in task.docs:
        results.append(pipeline.result(doc.text, new))
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
    lang = stats["languages"].setdefault(attrs["language"], [0, 0, 0.0])
    lang[0] += 1
    lang[1] += utf8_len(clean)
    lang[2] += attrs["language_score"]   # the report gives the mean per language
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


def split_of(doc_id: str, valid_fraction: float, seed: int) -> str:
    """The held-out split by document: a hash of (seed, doc_id) against valid_fraction. Called once
    per document, by stage 1, which stores it in the chunk's `split` column for every later stage."""
    return "valid" if unit_hash(f"split:{seed}:{doc_id}") < valid_fraction else "train"


def unit_hash(s: str) -> float:
    """A stable hash of `s` mapped to [0, 1)."""
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "big") / 2**64


# ------------------------------------------------------------------------------ stage 4: tokenizing

@dataclass
class SplitTokens:
    """The kept documents of one split of one chunk, in input order, tokenized: what stage 5 packs
    and writes to the provenance, with no need to go back to the stage-1 chunk file."""
    tokens: np.ndarray      # int32, flat, EOS after every document
    lens: np.ndarray        # int32, tokens per document, EOS included
    doc_ids: list[str]
    quality: np.ndarray | None = None   # float64 classifier scores, with filters.quality.model

    def arrays(self, split: str) -> dict:
        """The .npz arrays of this split; the ids as UTF-8 bytes and end offsets (numpy's str
        arrays would drop a trailing NUL of an id)."""
        raw = [d.encode("utf-8") for d in self.doc_ids]
        ends = np.cumsum([len(r) for r in raw], dtype=np.int64)
        out = {f"{split}_tokens": self.tokens, f"{split}_lens": self.lens,
               f"{split}_ids": np.frombuffer(b"".join(raw), np.uint8), f"{split}_id_ends": ends}
        if self.quality is not None:
            out[f"{split}_quality"] = self.quality
        return out

    @classmethod
    def load(cls, z, split: str, tokens: bool = True) -> "SplitTokens":
        """The split's record from an open tokens .npz (np.load); `tokens=False` leaves the token
        ids unread (None), for a reader that needs only the lengths and ids."""
        raw, ends = z[f"{split}_ids"].tobytes(), z[f"{split}_id_ends"].tolist()
        ids = [raw[a:b].decode("utf-8") for a, b in zip([0] + ends[:-1], ends)]
        quality = z[f"{split}_quality"] if f"{split}_quality" in z.files else None
        return cls(z[f"{split}_tokens"] if tokens else None, z[f"{split}_lens"], ids, quality)


def tokenize_chunk(task: tuple[int, bytes, str]) -> dict:
    """Stage 4 for one chunk: `task` is (index, packed keep mask, tokenizer model path). Writes
    .build/tokens/NNNNN.npz (a SplitTokens per split), then its marker."""
    index, keep_bits, model = task
    setup = _worker.setup
    marker_path = Path(setup.tokens_dir) / f"{index:05d}.json"
    if marker_path.is_file():
        return {**read_json(marker_path), "reused": True}
    t0 = time.process_time()
    sp = _worker.processor(model)
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


def worker_setup(cfg, work) -> WorkerSetup:
    """What every process running the chunk functions needs, from the build config and its work dir
    (dataprep.config.BuildConfig, dataprep.workdir.WorkDir); both engines use it."""
    files = [*cfg.decontam.files, *([cfg.filters.quality.model] if cfg.filters.quality.model else [])]
    return WorkerSetup(str(work.docs), str(work.tokens), cfg.filters, cfg.dedup,
                       cfg.pack.valid_fraction, cfg.pack.split_seed, cfg.pii, cfg.decontam,
                       tuple(file_identity(f) for f in files))
