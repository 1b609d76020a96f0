"""The build's one stage plan (the stages are listed in plan/__init__.py): which tasks run, with
which arguments, in which order of stages. Both executors run exactly this plan (executor/local.py:
worker processes on this machine; executor/ray.py: a Ray cluster), so the dataset's bytes cannot
depend on the engine. The plan holds only per-unit and per-chunk markers (counts, token totals:
plan/markers.py): O(files + chunks), never documents, signatures or the LSH index."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mspretrain.dataprep.config import BuildConfig
from mspretrain.dataprep.dedup.keep import DedupResult
from mspretrain.dataprep.errors import BuildError, NoDatasetError, check_ids, stopped
from mspretrain.dataprep.executor.base import Executor
from mspretrain.dataprep.plan import dedup as dedup_tasks
from mspretrain.dataprep.plan import hooks, labels, units as unit_tasks, write
from mspretrain.dataprep.plan.layout import Ctx, Unit
from mspretrain.dataprep.plan.markers import (DocsMarker, EdgesMarker, HashMarker, PartsMarker,
                                              ProvenanceMarker, ReplayMarker, RoundMarker,
                                              SampleMarker, SettleMarker, TokenizerMarker,
                                              TokensMarker, WriteMarker)
from mspretrain.dataprep.readers import InputFile, file_format, splittable
from mspretrain.dataprep.records import SPLITS
from mspretrain.dataprep.report import failure
from mspretrain.dataprep.tokenizer.sample import sample_fraction
from mspretrain.dataprep.tokenizer.vocab_fit import fit_warning
from mspretrain.dataprep.workdir import WorkDir
from mspretrain.dataprep.write.shards import shard_capacity
from mspretrain.loader.manifest import SplitInfo


@dataclass(frozen=True)
class PlanResult:
    """What the plan hands the build's finish step: the dedup counts, each split's shards, and for
    the report the rest."""
    dedup: DedupResult
    splits: dict          # split -> SplitInfo
    tails: dict           # split -> tokens after its last whole sample (dropped)
    length_bins: list     # per split: documents per power-of-two token length (summary.length_bins)
    time_s: dict          # wall seconds per group of stages
    chunks_reused: dict   # stage -> chunks a rerun found done (> 0: this run resumed a build)
    executor: dict        # where the tasks ran, tasks per stage


def hash_inputs(executor: Executor, files: list[InputFile]) -> list[str]:
    """sha256 of every input file, one task per file (the manifest records them)."""
    return [HashMarker.from_dict(r).sha256
            for r in executor.run("hash inputs", _sha256_task, [(f,) for f in files])]


def _sha256_task(inp: InputFile) -> dict:
    from mspretrain.loader.manifest import sha256_file
    try:
        return HashMarker(sha256=sha256_file(inp.path)).to_dict()
    except OSError as e:    # every input is part of the dataset's identity
        raise BuildError(f"{inp.path}: cannot read this input file ({e.strerror or e}); fix its "
                         f"permissions or leave it out") from None


def run_plan(executor: Executor, files: list[InputFile], cfg: BuildConfig,
             work: WorkDir) -> PlanResult:
    """Every stage up to the written shards."""
    ctx = Ctx(str(work.out), cfg, partitions_for(cfg, files), hooks.from_env())
    times = {}
    t0 = time.perf_counter()
    units = _docs_stage(executor, ctx, files)
    times["docs"] = _lap(t0)
    dedup, index_spills = _dedup_stages(executor, ctx, units)
    times["dedup"] = _lap(t0) - times["docs"]
    attributes = _attributes(executor, ctx, units)
    model = _tokenizer_stage(executor, ctx, units, dedup)
    times["tokenizer"] = _lap(t0) - times["docs"] - times["dedup"]
    tokens, _ = executor.collect(
        executor.submit("tokenize", unit_tasks.tokenize_unit,
                        [(ctx, u.unit, u.chunks, str(model)) for u in units]), attributes)
    tokens = [TokensMarker.from_dict(m) for m in tokens]
    splits, tails, bins = _write_stage(executor, ctx, tokens)
    times["tokenize+write"] = _lap(t0) - sum(times.values())
    return PlanResult(
        dedup, splits, tails, bins, times,
        chunks_reused={"docs": _chunks_reused(units), "tokenize": _chunks_reused(tokens)},
        executor={**executor.describe(), "partitions": ctx.partitions, "units": len(units),
                  "index_spills": index_spills, **executor.summary()})


def _chunks_reused(units: list[DocsMarker] | list[TokensMarker]) -> int:
    """Chunks a rerun found done: every chunk of a task found done, and within a task redone, the
    chunks whose outputs an earlier try had written (they are read back, not computed again)."""
    return sum(bool(u.reused or c.reused) for u in units for c in u.chunks)
def partitions_for(cfg: BuildConfig, files: list[InputFile]) -> int:
    """run.ray_partitions, or where it is 0, one per GiB of input (2 to 256): enough reduce tasks to
    spread and few small shuffle files on a small corpus, ~16 at 16 GiB. From the inputs alone, so a
    rerun on another cluster resumes the same partitioning (the bytes never depend on it)."""
    if cfg.run.ray_partitions:
        return cfg.run.ray_partitions
    size = sum(f.path.stat().st_size for f in files)
    return min(256, max(2, -(-size // (1 << 30))))


def _lap(t0: float) -> float:
    return round(time.perf_counter() - t0, 3)


def _plan(executor: Executor, ctx: Ctx, files: list[InputFile]) -> list[InputFile]:
    """Work units from the sorted inputs: a file each, large uncompressed jsonl files cut into
    parts of about run.ray_unit_bytes at line starts (tasks count the lines) and large parquet
    files between row groups. Depends only on the inputs and that size, never on the cluster."""
    big = [k for k, f in enumerate(files)
           if splittable(f.path) and f.path.stat().st_size > ctx.cfg.run.ray_unit_bytes]
    parts = dict(zip(big, (PartsMarker.from_dict(m).parts for m in executor.run(
        "plan", unit_tasks.plan_file, [(ctx, files[k]) for k in big])))) if big else {}
    return [p for k, f in enumerate(files) for p in parts.get(k, [f])]


def _docs_stage(executor: Executor, ctx: Ctx, files: list[InputFile]) -> list[DocsMarker]:
    units = [DocsMarker.from_dict(m) for m in executor.run(
        "docs", unit_tasks.docs_unit, [(ctx, Unit(i, f, file_format(f.path)[0]))
                                       for i, f in enumerate(_plan(executor, ctx, files))])]
    for m in units:   # the first stop in input order
        if m.stop:
            raise stopped(m.stop, m.stop_kind)
    return units


def _dedup_stages(executor: Executor, ctx: Ctx,
                  units: list[DocsMarker]) -> tuple[DedupResult, int]:
    """The dedup counts, and how often the replays' LSH index went to disk (the report's)."""
    U, P = len(units), ctx.partitions
    parts = [(ctx, p, U) for p in range(P)]
    _, exact, cells = executor.run_many(("ids", dedup_tasks.ids_reduce, parts),
                                        ("exact", dedup_tasks.exact_reduce, parts),
                                        ("cells", dedup_tasks.cells_reduce, parts))
    edges = sum(EdgesMarker.from_dict(m).edges for m in exact + cells)
    label_files = _components(executor, ctx, edges)
    executor.run("groups", unit_tasks.group_unit,
                 [(ctx, u.unit, u.chunks, label_files) for u in units])
    sig_dtype = next((u.sig_dtype for u in units if u.sig_dtype), "")
    replayed = executor.run("replay", dedup_tasks.replay,
                            [(ctx, p, U, sig_dtype) for p in range(P)])
    settled, _ = executor.run_many(
        ("settle", unit_tasks.settle_unit, [(ctx, u.unit, u.chunks) for u in units]),
        ("duplicates", dedup_tasks.write_duplicates, [(ctx, U)]))
    result = DedupResult(docs_seen=sum(c.rows for u in units for c in u.chunks))
    for s in map(SettleMarker.from_dict, settled):
        result.kept_docs += s.kept_docs
        result.kept_bytes += s.kept_bytes
        result.train_bytes += s.train_bytes
        for kind in ("exact", "near"):
            getattr(result, kind)[0] += getattr(s, kind)[0]
            getattr(result, kind)[1] += getattr(s, kind)[1]
        result.duplicate_ids += s.duplicate_ids
    check_ids(result.duplicate_ids, ctx.cfg.run.strict)
    if result.kept_docs == 0:
        raise NoDatasetError(failure.empty_message(ctx.work, result.docs_seen, ctx.cfg),
                             docs_read=result.docs_seen)
    return result, sum(ReplayMarker.from_dict(m).frozen for m in replayed)


def _attributes(executor: Executor, ctx: Ctx, units: list[DocsMarker]) -> dict:
    """documents/attributes.parquet, one task: submitted, so that it runs beside the stages after
    it (collected before the write stage)."""
    return executor.submit("attributes", dedup_tasks.write_attributes, [(ctx, len(units))])


def _components(executor: Executor, ctx: Ctx, edges: int) -> list[str]:
    """Label files of the connected components: one union-find task when the edges fit, else
    min-label rounds until no label changes."""
    if edges <= ctx.cfg.run.ray_union_find_edges:
        executor.run("components", dedup_tasks.components, [(ctx,)])
        return [str(ctx.plan_dir / "labels" / "all.parquet")]
    paths = [str(p) for p in sorted(ctx.stage_dir("edges").glob("*.parquet"))]
    executor.run("adjacency", labels.adjacency_map, [(ctx, i, paths) for i in range(len(paths))])
    rnd = 0
    while True:
        sent = executor.run("labels", labels.label_round,
                            [(ctx, rnd, p, len(paths)) for p in range(ctx.partitions)])
        if not any(RoundMarker.from_dict(m).sent for m in sent):
            return [str(p) for p in labels.final_labels(ctx, rnd)]
        rnd += 1


def _tokenizer_stage(executor: Executor, ctx: Ctx, units: list[DocsMarker],
                     dedup: DedupResult) -> Path:
    from mspretrain.dataprep.tokenizer.model import TokenizerError, copy_tokenizer
    work, cfg = ctx.work, ctx.cfg
    model = work.staging / "tokenizer.model"
    if cfg.tokenizer.model:
        try:
            copy_tokenizer(cfg.tokenizer.model, model)
        except TokenizerError as e:
            raise NoDatasetError(str(e)) from None
        return model
    if (work.root / "tokenizer.json").is_file():
        return model
    p = sample_fraction(cfg, dedup.train_bytes)
    pieces = [SampleMarker.from_dict(m) for m in executor.run(
        "sample", unit_tasks.sample_unit, [(ctx, u.unit, u.chunks, p) for u in units])]
    stats = {"sample_docs": sum(m.sample_docs for m in pieces),
             "sample_bytes": sum(m.sample_bytes for m in pieces), "fraction": p}
    (r,) = executor.run("tokenizer", unit_tasks.train_tokenizer_task, [(ctx, len(units), stats)])
    r = TokenizerMarker.from_dict(r)
    if r.error is not None:
        raise NoDatasetError(r.error)
    if r.vocab_size != cfg.tokenizer.vocab_size and not r.reused:
        print(fit_warning(cfg.tokenizer.vocab_size, r.vocab_size), file=sys.stderr, flush=True)
    return model


def _write_stage(executor: Executor, ctx: Ctx, tokens: list[TokensMarker]):
    """Shards by fixed sample ranges, provenance per split: (SplitInfo per split, tails, the length
    bins of both splits' documents)."""
    cfg = ctx.cfg
    L = cfg.pack.seq_length + 1
    cap = shard_capacity(cfg.shards.max_shard_bytes, cfg.pack.seq_length)
    chunks = [c for u in tokens for c in u.chunks]
    index = [c.index for c in chunks]
    calls, tails, totals = [], {}, {}
    for split in SPLITS:
        counts = np.array([c.tokens[split] for c in chunks], np.int64)
        ends = np.cumsum(counts)
        starts = ends - counts
        total = int(ends[-1]) if len(ends) else 0
        n = total // L
        tails[split], totals[split] = total - n * L, n
        for shard, first in enumerate(range(0, n, cap)):
            count = min(cap, n - first)
            lo, hi = first * L, (first + count) * L
            ks = range(int(np.searchsorted(ends, lo, "right")), int(np.searchsorted(starts, hi)))
            spans = [(index[k], int(max(lo, starts[k]) - starts[k]), int(min(hi, ends[k]) - starts[k]))
                     for k in ks if ends[k] > starts[k]]
            calls.append((ctx, split, shard, first, count, spans))
    written, prov = executor.run_many(
        ("write", write.write_shard, calls),
        ("provenance", write.write_provenance, [(ctx, split, index) for split in SPLITS]))
    written = [WriteMarker.from_dict(m) for m in written]
    splits = {split: SplitInfo(totals[split], totals[split] * L,
                               tuple(w.shard for w in written if w.split == split))
              for split in SPLITS}
    return splits, tails, [ProvenanceMarker.from_dict(m).length_bins for m in prov]
