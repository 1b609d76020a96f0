"""Connected components by min-label rounds, for when the edges are too many for one union-find task
(run.ray_union_find_edges): each partition of the nodes keeps its nodes' labels and adjacency, and
every round sends the labels that changed to the neighbours' partitions; a node takes the smallest
label it hears. Labels converge to the smallest order key of each component (what the union-find
task gives) after at most diameter + 1 rounds. Memory per task: one partition's adjacency and labels.
Each round's files are named by (round, partition), so a rerun reuses completed rounds."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from mspretrain.dataprep.plan.layout import (LABELS_SCHEMA, Ctx, done, finish, read_parquets,
                                             stable_partition, write_parquet)
from mspretrain.dataprep.plan.markers import RoundMarker
from mspretrain.dataprep.plan.shuffle import PartitionedWriter, part_files
from mspretrain.common import arrow

ADJ_SCHEMA = pa.schema([("src", pa.int64()), ("dst", pa.int64())])
MSG_SCHEMA = pa.schema([("node", pa.int64()), ("label", pa.int64())])


def adjacency_map(ctx: Ctx, edge_file: int, paths: list[str]) -> dict:
    """Both directions of one edge file's edges, cut by the source node's partition."""
    marker = ctx.marker("adjacency", f"{edge_file:04d}")
    if (m := done(marker)) is not None:
        return m
    t = read_parquets(paths[edge_file:edge_file + 1])
    with PartitionedWriter(ctx.stage_dir("adjacency"), edge_file, ctx.partitions,
                           ADJ_SCHEMA) as writer:
        if t is not None:
            a, b = arrow.to_numpy(t.column("a")), arrow.to_numpy(t.column("b"))
            src, dst = np.concatenate([a, b]), np.concatenate([b, a])
            writer.add({"src": src, "dst": dst},
                       stable_partition(src.view(np.uint64), ctx.partitions))
        writer.commit()
    return finish(marker, {"edges": 0 if t is None else t.num_rows})


def label_round(ctx: Ctx, rnd: int, part: int, edge_files: int) -> dict:
    """Round `rnd` for one node partition: take the smallest label heard, send the changed ones."""
    marker = ctx.marker("labels", f"r{rnd:04d}-p{part:04d}")
    if (m := done(marker)) is not None:
        return m
    adj = read_parquets(part_files(ctx.stage_dir("adjacency"), edge_files, part))
    src = arrow.to_numpy(adj.column("src")) if adj is not None else np.zeros(0, np.int64)
    dst = arrow.to_numpy(adj.column("dst")) if adj is not None else np.zeros(0, np.int64)
    nodes = np.unique(src)
    if rnd == 0:
        labels, changed = nodes.copy(), np.ones(len(nodes), bool)
    else:
        labels = arrow.to_numpy(arrow.read_parquet(_labels_file(ctx, rnd - 1, part), ["label"])
                                .column("label")).copy()
        msgs = read_parquets(part_files(ctx.stage_dir(f"messages/r{rnd - 1:04d}"),
                                        ctx.partitions, part))
        heard = labels.copy()
        if msgs is not None:
            idx = np.searchsorted(nodes, arrow.to_numpy(msgs.column("node")))
            np.minimum.at(heard, idx, arrow.to_numpy(msgs.column("label")))
        changed = heard < labels
        labels = heard
    write_parquet(_labels_file(ctx, rnd, part),
                  arrow.table({"order": nodes, "label": labels}, LABELS_SCHEMA),
                  row_group_size=1 << 16)   # read by order range, per work unit
    # tell the neighbours of every node whose label changed
    send = changed[np.searchsorted(nodes, src)] if len(src) else np.zeros(0, bool)
    with PartitionedWriter(ctx.stage_dir(f"messages/r{rnd:04d}"), part, ctx.partitions,
                           MSG_SCHEMA) as writer:
        if send.any():
            lab = labels[np.searchsorted(nodes, src[send])]
            writer.add({"node": dst[send], "label": lab},
                       stable_partition(dst[send].view(np.uint64), ctx.partitions))
        writer.commit()
    return finish(marker, RoundMarker(changed=int(changed.sum()), sent=int(send.sum())).to_dict())


def _labels_file(ctx: Ctx, rnd: int, part: int):
    return ctx.stage_dir(f"rounds/r{rnd:04d}") / f"p{part:04d}.parquet"


def final_labels(ctx: Ctx, rnd: int) -> list:
    return [_labels_file(ctx, rnd, p) for p in range(ctx.partitions)]
