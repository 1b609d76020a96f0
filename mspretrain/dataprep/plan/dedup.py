"""The plan's tasks of stage 2 (dedup): reduce sides of the shuffles, connected components, and the
replay of the local keep rule (dedup_pass.DedupPass, unchanged) over each partition's groups.

Why replaying gives the local result: the local pass drops a document when its exact key equals a
kept document's, or when a kept document shares one of its LSH cells and passes verification. Both
only ever look at documents that share a cell or an exact key with it, so they only look inside its
connected component of the "shares a cell or an exact key" graph. Running DedupPass over whole
components, members in input order, therefore makes every decision the global pass makes; which
component sits in which partition cannot matter. Keeping the smallest id per group would not do:
in a chain a~b~c with a, c dissimilar, the local rule keeps a and c.

Memory per task: a partition's rows (ids, exact, cells, groups: 1/partitions of the corpus's), and
the components task holds the edges (only documents that share a cell or a key with another)."""
from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mspretrain.dataprep.dedup.components import min_labels
from mspretrain.dataprep.dedup.keep import (ATTRIBUTES_FILE, ATTRIBUTES_SCHEMA, DUPLICATES_FILE,
                                 DUPLICATES_SCHEMA, DedupPass)
from mspretrain.dataprep.write.parquet_stream import InOrderParquet
from mspretrain.dataprep.plan.layout import (LABELS_SCHEMA, Ctx, done, finish, read_parquets,
                                             unit_files, write_by_unit, write_parquet)
from mspretrain.dataprep.plan.markers import EdgesMarker, ReplayMarker
from mspretrain.dataprep.plan.shuffle import part_files
from mspretrain.common import arrow
from mspretrain.common.files import atomic_path

EDGES_SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.int64())])
DROPS_SCHEMA = pa.schema([("order", pa.int64()), ("doc_id", pa.string()),
                          ("kept_doc_id", pa.string()), ("kind", pa.string()),
                          ("similarity", pa.float64()), ("bytes", pa.int64())])
DUPIDS_SCHEMA = pa.schema([("order", pa.int64()), ("source", pa.string()), ("doc_id", pa.string()),
                           ("first_source", pa.string())])


def per_partition(stage: str):
    """A reduce task of `stage` over one partition, run once: a retried or resumed call returns the
    marker that the completed run wrote."""
    def wrap(task):
        @functools.wraps(task)
        def run(ctx: Ctx, part: int, *args):
            marker = ctx.marker(stage, f"{part:04d}")
            if (m := done(marker)) is not None:
                return m
            return finish(marker, task(ctx, part, *args))
        return run
    return wrap


def _in_order(ctx: Ctx, stage: str, units: int, part: int) -> pa.Table | None:
    """This partition's rows of a shuffle stage, in input order (None when it got none)."""
    t = read_parquets(part_files(ctx.stage_dir(stage), units, part))
    return None if t is None else t.sort_by("order")


@per_partition("ids")
def ids_reduce(ctx: Ctx, part: int, units: int) -> dict:
    """Documents whose doc_id an earlier document (in input order) already has."""
    t = _in_order(ctx, "ids", units, part)
    rows = {n: [] for n in DUPIDS_SCHEMA.names}
    if t is not None:
        seen: dict[str, str] = {}     # doc_id -> the file of its first document
        for doc_id, order, source in zip(*(t.column(n).to_pylist()
                                           for n in ("doc_id", "order", "source"))):
            if doc_id in seen:
                rows["order"].append(order)
                rows["source"].append(source)
                rows["doc_id"].append(doc_id)
                rows["first_source"].append(seen[doc_id])
            else:
                seen[doc_id] = source
    write_by_unit(ctx.stage_dir("dupids"), part, arrow.table(rows, DUPIDS_SCHEMA))
    return {"part": part, "duplicate_ids": len(rows["order"])}


@per_partition("exact")
def exact_reduce(ctx: Ctx, part: int, units: int) -> dict:
    """Edges from the first document of every exact key to each later one with that key."""
    t = _in_order(ctx, "exact", units, part)
    a, b = [], []
    if t is not None:
        first: dict[bytes, int] = {}
        for key, order in zip(t.column("key").to_pylist(), t.column("order").to_pylist()):
            if key in first:
                a.append(first[key])
                b.append(order)
            else:
                first[key] = order
    write_parquet(ctx.stage_dir("edges") / f"exact-p{part:04d}.parquet",
                  arrow.table({"a": a, "b": b}, EDGES_SCHEMA))
    return EdgesMarker(part=part, edges=len(a)).to_dict()


@per_partition("cells")
def cells_reduce(ctx: Ctx, part: int, units: int) -> dict:
    """Edges from the first document of every LSH cell shared by several to each other one."""
    t = read_parquets(part_files(ctx.stage_dir("cells"), units, part))
    a = b = np.zeros(0, np.int64)
    if t is not None:
        cell = arrow.to_numpy(t.column("cell"))
        order = arrow.to_numpy(t.column("order"))
        idx = np.lexsort((order, cell))
        cell, order = cell[idx], order[idx]
        start = np.r_[True, cell[1:] != cell[:-1]]
        first = np.maximum.accumulate(np.where(start, np.arange(len(cell)), 0))
        linked = ~start & (order != order[first])
        if linked.any():
            pairs = np.unique(np.stack([order[first][linked], order[linked]], axis=1), axis=0)
            a, b = pairs[:, 0], pairs[:, 1]
    write_parquet(ctx.stage_dir("edges") / f"cells-p{part:04d}.parquet",
                  arrow.table({"a": a, "b": b}, EDGES_SCHEMA))
    return EdgesMarker(part=part, edges=int(len(a))).to_dict()


def components(ctx: Ctx) -> dict:
    """Connected components of all edges (one union-find: dedup/components.py), labelled by their
    smallest order key; written as plan/labels/all.parquet sorted by order, row groups small enough
    to skip by range. (Too many edges for one task: labels.py.)"""
    marker = ctx.marker("components", "all")
    if (m := done(marker)) is not None:
        return m
    t = read_parquets(sorted(ctx.stage_dir("edges").glob("*.parquet")))
    nodes = labels = np.zeros(0, np.int64)
    if t is not None:
        a, b = arrow.to_numpy(t.column("a")), arrow.to_numpy(t.column("b"))
        nodes = np.unique(np.concatenate([a, b]))
        # nodes ascend, so the smallest node index of a component is its smallest order key
        labels = nodes[min_labels(len(nodes), np.searchsorted(nodes, a), np.searchsorted(nodes, b))]
    path = ctx.stage_dir("labels") / "all.parquet"
    with atomic_path(path) as tmp:
        pq.write_table(arrow.table({"order": nodes, "label": labels}, LABELS_SCHEMA), tmp,
                       row_group_size=1 << 16)
    return finish(marker, {"docs": int(len(nodes)), "components": int(len(np.unique(labels)))})


@per_partition("replay")
def replay(ctx: Ctx, part: int, units: int, sig_dtype: str) -> dict:
    """The keep rule (DedupPass) over this partition's groups, in input order; writes the drops.

    Unit after unit (each unit's file is in input order, and units follow each other), in slices of
    run.dedup_memory_docs rows: memory holds one slice and the index's documents in memory (the
    rest in segments on disk), whatever the partition's size. A text is read back from its unit's
    file only where a near-threshold pair needs it."""
    cfg, hot = ctx.cfg, ctx.cfg.run.dedup_memory_docs
    dedup = DedupPass(cfg.dedup, texts=lambda k: _slice_texts(*slices[k]), hot_docs=hot,
                      spill=ctx.stage_dir("near") / f"p{part:04d}")
    slices: list[tuple] = []     # (unit file, first row, rows) of each slice consumed
    docs, drops = 0, []
    for path in part_files(ctx.stage_dir("groups"), units, part):
        if not path.is_file():
            continue
        t = arrow.read_parquet(path, ["order"] + DedupPass.COLUMNS)
        for first in range(0, t.num_rows, hot):
            piece = t.slice(first, hot)
            slices.append((path, first, piece.num_rows))
            decided = dedup.consume(piece, np.dtype(sig_dtype or "uint32"))
            dropped = arrow.array(np.flatnonzero(~decided.keep), pa.int64())
            if len(dropped) != decided.duplicates.num_rows:  # every group member: kept or dropped
                raise RuntimeError(f"replay of partition {part}: {len(dropped)} not kept, "
                                   f"{decided.duplicates.num_rows} drops")
            found = decided.duplicates
            drops.append(arrow.table({**{n: found.column(n) for n in found.column_names},
                                      "order": piece.column("order").take(dropped),
                                      "bytes": piece.column("bytes_clean").take(dropped)},
                                     DROPS_SCHEMA))
        docs += t.num_rows
    out = pa.concat_tables(drops) if drops else arrow.empty_table(DROPS_SCHEMA)
    write_by_unit(ctx.stage_dir("drops"), part, out)
    return ReplayMarker(part=part, docs=docs, drops=out.num_rows, frozen=dedup.near.frozen).to_dict()


def _slice_texts(path, first: int, rows: int) -> pa.ChunkedArray:
    return arrow.read_parquet(path, ["text"]).column("text").slice(first, rows)


def write_duplicates(ctx: Ctx, units: int) -> dict:
    """dedup/duplicates.parquet: the drops of every partition in input order, unit by unit."""
    def unit_rows(u: int):
        t = read_parquets(unit_files(ctx.stage_dir("drops"), u, ctx.partitions))
        return t.sort_by("order") if t is not None else None
    return _write_in_order(ctx, "duplicates", DUPLICATES_FILE, DUPLICATES_SCHEMA, units, unit_rows)


def write_attributes(ctx: Ctx, units: int) -> dict:
    """documents/attributes.parquet: every document read, in input order, unit by unit."""
    return _write_in_order(ctx, "attributes", ATTRIBUTES_FILE, ATTRIBUTES_SCHEMA, units,
                           lambda u: read_parquets([ctx.stage_dir("attributes") / f"{u:06d}.parquet"]))


def _write_in_order(ctx: Ctx, name: str, file: str, schema: pa.Schema, units: int, unit_rows) -> dict:
    """Stream the rows of every unit (`unit_rows(u)`, in input order) into one parquet file whose
    bytes equal the local engine's (parquet_stream.InOrderParquet)."""
    marker = ctx.marker(name, "all")
    if (m := done(marker)) is not None:
        return m
    with InOrderParquet(ctx.work.staging / file, schema) as out:
        for u in range(units):
            t = unit_rows(u)
            if t is not None:
                out.add(t)
    return finish(marker, {"rows": out.rows})
