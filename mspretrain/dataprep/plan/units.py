"""The plan's tasks that run per work unit (one input file, or a part of a large one): they call the
chunk functions (plan/chunks.py: clean_chunk_table, tokenize_chunk; tokenizer/sample.py:
write_chunk_sample) chunk by chunk, with the process's Worker (plan/worker.py). Each task returns a
small marker dict and writes it last; a task whose marker exists returns it at once (a resumed
build)."""
from __future__ import annotations

import contextlib
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mspretrain.dataprep.dedup.detect import NearDedup
from mspretrain.dataprep.dedup.keep import ATTRIBUTES_SCHEMA, DedupPass, attributes_table
from mspretrain.dataprep.plan import hooks
from mspretrain.dataprep.plan.layout import (UNIT_BITS, Ctx, Unit, bytes_key64, chunk_index, done,
                                        finish, read_parquets, stable_partition,
                                        text_key64, unit_files, unit_range, write_parquet)
from mspretrain.dataprep.plan.shuffle import PartitionedWriter
from mspretrain.dataprep.readers import file_format, split_input
from mspretrain.dataprep.records import InputFile
from mspretrain.dataprep.plan.chunks import clean_chunk_table, read_chunks, tokenize_chunk
from mspretrain.dataprep.plan.markers import (ChunkDocs, ChunkTokens, DocsMarker, PartsMarker,
                                              SampleMarker, SettleMarker, TokenizerMarker,
                                              TokensMarker)
from mspretrain.dataprep.plan.worker import worker_for
from mspretrain.dataprep.workdir import read_json
from mspretrain.common import arrow
from mspretrain.common.files import atomic_open, atomic_write_json

IDS_SCHEMA = pa.schema([("doc_id", pa.string()), ("order", pa.int64()), ("source", pa.string())])
EXACT_SCHEMA = pa.schema([("key", pa.binary()), ("order", pa.int64())])
CELLS_SCHEMA = pa.schema([("cell", pa.uint64()), ("order", pa.int64())])
GROUP_KEYS = [("label", pa.int64()), ("order", pa.int64())]
# what settle_unit reads of a chunk: each document's fate, counts and attribute columns
SETTLE_COLUMNS = ["split", "reason", "bytes_clean"] + [n for n in ATTRIBUTES_SCHEMA.names
                                                        if n not in ("fate", "reason")]


def plan_file(ctx: Ctx, inp: InputFile) -> dict:
    """The parts of one large uncompressed jsonl or parquet file (readers.split_input)."""
    return PartsMarker(parts=split_input(inp, ctx.cfg.run.ray_unit_bytes)).to_dict()


def docs_unit(ctx: Ctx, unit: Unit) -> dict:
    """Read, clean, filter, exact key and MinHash of one unit (clean_chunk per chunk), and the map
    side of the id, exact-key and LSH-cell shuffles."""
    marker = ctx.marker("docs", f"{unit.index:06d}")
    if (m := done(marker)) is not None:
        return m
    if unit.fmt and (fmt := file_format(unit.file.path)[0]) != unit.fmt:
        # a node without the package of a reader plugin: it would read the file another way
        return DocsMarker(unit=unit.index, stop_kind="error",
                          stop=[unit.file.rel, 0, "reader_missing",
                                f"read as {unit.fmt} by the driver but as {fmt} by a Ray worker: "
                                f"install the package of its mspretrain.readers entry point on "
                                f"every node"]).to_dict()
    worker = worker_for(ctx)
    cfg, P, u = ctx.cfg, ctx.partitions, unit.index
    near = NearDedup(cfg.dedup)   # for its band_hashes: the LSH cells the local index uses
    chunks, rows, seen_keys, sig_dtype = [], 0, set(), ""
    with contextlib.ExitStack() as stack:   # left without a commit: the unit's files are removed
        writers = {name: stack.enter_context(PartitionedWriter(ctx.stage_dir(name), u, P, schema))
                   for name, schema in (("ids", IDS_SCHEMA), ("exact", EXACT_SCHEMA),
                                        ("cells", CELLS_SCHEMA))}
        for task in read_chunks([unit.file], cfg.input.text_field, cfg.input.id_field,
                                cfg.input.text_unit, cfg.run.chunk_bytes, cfg.run.strict,
                                cfg.input.max_record_bytes, cfg.input.id_scope):
            task.index = chunk_index(u, task.index)
            m, table = clean_chunk_table(worker, task)
            if "stop" in m:   # strict mode or a reader failure: the driver fails the build
                return DocsMarker(unit=u, stop=m["stop"], stop_kind=m["stop_kind"]).to_dict()
            hooks.reached(ctx.hooks, "docs")
            if table is None:   # written by an earlier try of this task: read it back once
                table = arrow.read_parquet(
                    ctx.work.chunk_file(ctx.work.docs, m["index"], "parquet"),
                    ["doc_id", "source", "reason", "key", "sig"])
            n = table.num_rows
            order = np.arange(rows, rows + n, dtype=np.int64) + (u << UNIT_BITS)
            ids = table.column("doc_id").to_pylist()
            writers["ids"].add({"doc_id": ids, "order": order,
                                "source": table.column("source").to_pylist()},
                               stable_partition(text_key64(ids), P))
            ok = np.array([r == "" for r in table.column("reason").to_pylist()], bool)
            keys = [k for k, good in zip(table.column("key").to_pylist(), ok) if good]
            writers["exact"].add({"key": keys, "order": order[ok]},
                                 stable_partition(bytes_key64(keys), P))
            sig_dtype = m.get("sig_dtype") or sig_dtype
            _map_cells(writers["cells"], near, table, ok, order, seen_keys, sig_dtype, P)
            chunks.append(ChunkDocs(index=m["index"], rows=n, reused=bool(m.get("reused"))))
            rows += n
        for w in writers.values():
            w.commit()
    return finish(marker, DocsMarker(unit=u, chunks=chunks, rows=rows,
                                     sig_dtype=sig_dtype).to_dict())


def _map_cells(writer, near: NearDedup, table, ok, order, seen_keys: set, sig_dtype: str,
               P: int) -> None:
    """(band, band hash) cells of the unit's first document of each exact key: the documents that
    share a cell are the candidates the local LSH index would compare. A later copy of the same
    text has the same cells, and the exact-key shuffle puts it in the same group anyway."""
    rows = []
    for r, (good, key) in enumerate(zip(ok, table.column("key").to_pylist())):
        if good and key not in seen_keys:
            seen_keys.add(key)
            rows.append(r)
    if not rows:
        return
    sig_col = table.column("sig").to_pylist()
    sigs = np.stack([np.frombuffer(sig_col[r], np.dtype(sig_dtype or "uint32")) for r in rows])
    hashes = near.band_hashes(sigs)
    cells = (np.arange(near.bands, dtype=np.uint64) << np.uint64(32)) | hashes.astype(np.uint64)
    cells = cells.reshape(-1)
    orders = np.repeat(order[rows], near.bands)
    writer.add({"cell": cells, "order": orders}, stable_partition(cells, P))


def group_unit(ctx: Ctx, unit: int, chunks: list[ChunkDocs], label_files: list) -> dict:
    """The unit's documents that have a component label (and no duplicate id), with the stage-1
    columns the keep rule reads (the text included: it settles near-threshold pairs), shuffled by
    label."""
    marker = ctx.marker("groups", f"{unit:06d}")
    if (m := done(marker)) is not None:
        return m
    lo, hi = unit_range(unit)
    labels = read_parquets(label_files, order_range=(lo, hi))
    label_of = dict(zip(labels.column("order").to_pylist(), labels.column("label").to_pylist())) \
        if labels is not None else {}
    dup = _dup_orders(ctx, unit)
    schema = pq.read_schema(ctx.work.chunk_file(ctx.work.docs, chunks[0].index, "parquet"))
    columns = [schema.field(n) for n in DedupPass.COLUMNS + ["text"]]
    base, sent = lo, 0
    with PartitionedWriter(ctx.stage_dir("groups"), unit, ctx.partitions,
                           pa.schema(GROUP_KEYS + columns)) as writer:
        for c in chunks:
            order = np.arange(base, base + c.rows, dtype=np.int64)
            rows = [r for r, o in enumerate(order.tolist()) if o in label_of and o not in dup]
            base += c.rows
            if not rows:
                continue
            table = arrow.read_parquet(ctx.work.chunk_file(ctx.work.docs, c.index, "parquet"),
                                       [f.name for f in columns])
            take = arrow.array(rows, pa.int64())
            cols = {n: table.column(n).take(take) for n in table.column_names}
            lab = np.array([label_of[o] for o in order[rows].tolist()], np.int64)
            writer.add({"label": lab, "order": order[rows], **cols},
                       stable_partition(lab.view(np.uint64), ctx.partitions))
            sent += len(rows)
        writer.commit()
    return finish(marker, {"unit": unit, "docs": sent})


def _dup_orders(ctx: Ctx, unit: int) -> set[int]:
    t = read_parquets(unit_files(ctx.stage_dir("dupids"), unit, ctx.partitions), columns=["order"])
    return set(t.column("order").to_pylist()) if t is not None else set()


def settle_unit(ctx: Ctx, unit: int, chunks: list[ChunkDocs]) -> dict:
    """Keep mask per chunk (ray/keep/INDEX.npy), the unit's rows of documents/attributes.parquet
    (ray/attributes) and the unit's dedup counts."""
    marker = ctx.marker("settle", f"{unit:06d}")
    if (m := done(marker)) is not None:
        return m
    lo, hi = unit_range(unit)
    dups = read_parquets(unit_files(ctx.stage_dir("dupids"), unit, ctx.partitions))
    dups = dups.sort_by("order") if dups is not None else None
    drops = read_parquets(unit_files(ctx.stage_dir("drops"), unit, ctx.partitions),
                          columns=["order", "kind", "bytes"])
    dropped = dict(zip(drops.column("order").to_pylist(), drops.column("kind").to_pylist())) \
        if drops is not None else {}
    dup_set = set(dups.column("order").to_pylist()) if dups is not None else set()
    keep_dir = ctx.stage_dir("keep")
    res = {"unit": unit, "kept_docs": 0, "kept_bytes": 0, "train_bytes": 0,
           "exact": [0, 0], "near": [0, 0],
           "duplicate_ids": [list(x) for x in zip(dups.column("source").to_pylist(),
                                                  dups.column("doc_id").to_pylist(),
                                                  dups.column("first_source").to_pylist())]
           if dups is not None else []}
    if drops is not None:
        for kind, nbytes in zip(drops.column("kind").to_pylist(), drops.column("bytes").to_pylist()):
            res[kind][0] += 1
            res[kind][1] += nbytes
    base = lo
    attributes = []
    for c in chunks:
        table = arrow.read_parquet(ctx.work.chunk_file(ctx.work.docs, c.index, "parquet"),
                                   SETTLE_COLUMNS)
        keep = np.zeros(table.num_rows, bool)
        fate = []
        for r, (split, reason, nbytes) in enumerate(zip(*(table.column(n).to_pylist() for n in
                                                          ("split", "reason", "bytes_clean")))):
            o = base + r
            fate.append(reason or ("duplicate_doc_id" if o in dup_set else dropped.get(o, "kept")))
            if fate[-1] != "kept":
                continue
            keep[r] = True
            res["kept_docs"] += 1
            res["kept_bytes"] += nbytes
            if split == "train":
                res["train_bytes"] += nbytes
        base += table.num_rows
        attributes.append(attributes_table(table, fate))
        path = keep_dir / f"{c.index}.npy"
        with atomic_open(path) as f:
            np.save(f, keep)
    write_parquet(ctx.stage_dir("attributes") / f"{unit:06d}.parquet",
                  pa.concat_tables(attributes) if attributes
                  else arrow.empty_table(ATTRIBUTES_SCHEMA))
    return finish(marker, SettleMarker(**res).to_dict())


def keep_mask(ctx: Ctx, index: int) -> np.ndarray:
    return np.load(ctx.plan_dir / "keep" / f"{index}.npy")


def sample_unit(ctx: Ctx, unit: int, chunks: list[ChunkDocs], fraction: float) -> dict:
    """The unit's piece of the tokenizer training sample (ray/sample/uNNNNNN.txt)."""
    from mspretrain.dataprep.tokenizer.sample import write_chunk_sample
    marker = ctx.marker("sample", f"{unit:06d}")
    if (m := done(marker)) is not None:
        return m
    path = ctx.stage_dir("sample") / f"u{unit:06d}.txt"
    docs = nbytes = 0
    with atomic_open(path, "w", encoding="utf-8") as f:
        for c in chunks:
            n, b = write_chunk_sample(f, ctx.work.chunk_file(ctx.work.docs, c.index, "parquet"),
                                      keep_mask(ctx, c.index), fraction)
            docs, nbytes = docs + n, nbytes + b
    return finish(marker, SampleMarker(unit=unit, sample_docs=docs, sample_bytes=nbytes).to_dict())


def train_tokenizer_task(ctx: Ctx, units: int, stats: dict) -> dict:
    """Concatenate the sample pieces in unit order (the local sample file, byte for byte) and train."""
    from mspretrain.dataprep.tokenizer.model import TokenizerError
    from mspretrain.dataprep.tokenizer.vocab_fit import train_fitted
    work = ctx.work
    marker = work.root / "tokenizer.json"
    if marker.is_file():
        return TokenizerMarker(reused=True, vocab_size=read_json(marker)["vocab_size"]).to_dict()
    sample = work.root / "tokenizer_sample.txt"
    with atomic_open(sample) as out:
        for u in range(units):
            with open(ctx.plan_dir / "sample" / f"u{u:06d}.txt", "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    hooks.reached(ctx.hooks, "tokenizer")
    try:
        vocab_size = train_fitted(sample, work.staging / "tokenizer.model", ctx.cfg.tokenizer)
    except TokenizerError as e:
        return TokenizerMarker(error=str(e)).to_dict()
    atomic_write_json(marker, {**stats, "vocab_size": vocab_size})
    return TokenizerMarker(reused=False, vocab_size=vocab_size).to_dict()


def tokenize_unit(ctx: Ctx, unit: int, chunks: list[ChunkDocs], model: str) -> dict:
    """tokenize_chunk for each chunk of the unit; returns token counts per chunk and split."""
    marker = ctx.marker("tokenize", f"{unit:06d}")
    if (m := done(marker)) is not None:
        return m
    worker = worker_for(ctx)
    out = []
    for c in chunks:
        keep = keep_mask(ctx, c.index)
        m = tokenize_chunk(worker, (c.index, np.packbits(keep).tobytes(), model))
        hooks.reached(ctx.hooks, "tokenize")
        out.append(ChunkTokens(index=c.index, tokens=m["tokens"], reused=bool(m.get("reused"))))
    return finish(marker, TokensMarker(unit=unit, chunks=out).to_dict())
