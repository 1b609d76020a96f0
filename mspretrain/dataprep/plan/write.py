"""The plan's tasks of stage 5 (write): one task per shard over a fixed range of global samples,
and one provenance task per split. Sample k of a split is tokens [k*L, (k+1)*L) of the split's stream
(every chunk's tokens in input order); the driver turns per-chunk token counts into the spans each
shard reads, so a shard's bytes do not depend on which task or node writes it."""
from __future__ import annotations

import numpy as np

from mspretrain.dataprep.report import summary as reporting
from mspretrain.dataprep.write.pack import PROVENANCE_DIR, ProvenanceStream
from mspretrain.dataprep.plan import hooks
from mspretrain.dataprep.plan.layout import Ctx, done, finish
from mspretrain.dataprep.plan.markers import ProvenanceMarker, WriteMarker
from mspretrain.dataprep.write.shards import ShardWriter
from mspretrain.dataprep.records import SplitTokens


def write_shard(ctx: Ctx, split: str, shard: int, first: int, count: int,
                spans: list[tuple[int, int, int]]) -> dict:
    """Shard `shard` of `split`: samples [first, first + count), from (chunk, start, stop) token
    spans of the chunks' token files."""
    marker = ctx.marker("write", f"{split}-{shard:05d}")
    if (m := done(marker)) is not None:
        return m
    work, L = ctx.work, ctx.cfg.pack.seq_length + 1
    writer = ShardWriter(work.staging, split, ctx.cfg.pack.seq_length,
                         ctx.cfg.shards.max_shard_bytes, first_shard=shard, first_sample=first)
    carry = np.zeros(0, np.int32)   # the tokens of a sample that the next span completes
    written, halfway = 0, False
    for index, start, stop in spans:     # a span at a time: memory holds one chunk's tokens
        with np.load(work.chunk_file(work.tokens, index, "npz")) as z:
            tokens = np.concatenate([carry, z[f"{split}_tokens"][start:stop]])
        full = tokens.size // L
        writer.write(tokens[:full * L].reshape(full, L))
        carry, written = tokens[full * L:], written + full
        if not halfway and written >= count // 2:
            hooks.reached(ctx.hooks, "write")   # a shard file open and half written
            halfway = True
    if written != count or carry.size:
        raise RuntimeError(f"{split} shard {shard}: {written * L + carry.size} tokens for "
                           f"{count} samples")
    (info,) = writer.close()
    return finish(marker, WriteMarker(split=split, shard=info).to_dict())


def write_provenance(ctx: Ctx, split: str, chunks: list[int]) -> dict:
    """provenance/<split>.parquet over every chunk in order, and the split's length histogram bins."""
    marker = ctx.marker("provenance", split)
    if (m := done(marker)) is not None:
        return m
    work = ctx.work
    stream = ProvenanceStream(work.staging / PROVENANCE_DIR / f"{split}.parquet",
                              ctx.cfg.pack.seq_length, quality=bool(ctx.cfg.filters.quality.model))
    bins = np.zeros(0, np.int64)
    for index in chunks:
        with np.load(work.chunk_file(work.tokens, index, "npz")) as z:
            part = SplitTokens.load(z, split, tokens=False)
        lens = part.lens
        if not len(lens):
            continue
        stream.add(lens, part.doc_ids, part.quality)
        bins = reporting.add_bins(bins, reporting.length_bins(lens - 1))
    stream.close()
    return finish(marker, ProvenanceMarker(split=split, length_bins=bins.tolist(),
                                           tokens=stream.stream).to_dict())
