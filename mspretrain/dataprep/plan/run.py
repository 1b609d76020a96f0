"""The build's one stage plan (the stages are listed in plan/__init__.py): which tasks run, with
which arguments, in which order of stages. Both executors run exactly this plan (executor/local.py:
worker processes on this machine; executor/ray.py: a Ray cluster), so the dataset's bytes cannot
depend on the engine. The plan holds only per-unit and per-chunk markers (counts, token totals):
O(files + chunks), never documents, signatures or the LSH index."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from mspretrain.dataprep.config import BuildConfig
from mspretrain.dataprep.dedup.keep import DedupResult
from mspretrain.dataprep.errors import BuildError, NoDatasetError, check_ids, stopped
from mspretrain.dataprep.executor.base import Executor
from mspretrain.dataprep.plan import dedup as dedup_tasks
from mspretrain.dataprep.plan import hooks, labels, units as unit_tasks, write
from mspretrain.dataprep.plan.layout import Ctx, Unit
from mspretrain.dataprep.readers import InputFile, file_format, splittable
from mspretrain.dataprep.records import SPLITS
from mspretrain.dataprep.report import failure
from mspretrain.dataprep.tokenizer.sample import sample_fraction
from mspretrain.dataprep.tokenizer.vocab_fit import fit_warning
from mspretrain.dataprep.workdir import WorkDir
from mspretrain.dataprep.write.shards import shard_capacity
from mspretrain.loader.manifest import ShardInfo, SplitInfo


def hash_inputs(stages: Executor, files: list[InputFile]) -> list[str]:
    """sha256 of every input file, one task per file (the manifest records them)."""
    return [r["sha256"] for r in stages.run("hash inputs", _sha256_task, [(f,) for f in files])]


def _sha256_task(inp: InputFile) -> dict:
    from mspretrain.loader.manifest import sha256_file
    try:
        return {"sha256": sha256_file(inp.path)}
    except OSError as e:    # every input is part of the dataset's identity
        raise BuildError(f"{inp.path}: cannot read this input file ({e.strerror or e}); fix its "
                         f"permissions or leave it out") from None


def run_plan(stages: Executor, files: list[InputFile], cfg: BuildConfig, work: WorkDir,
             run: dict):
    """Every stage up to the written shards: (DedupResult, SplitInfo per split, tails, histogram).
    `run` gets the timings, the reused chunks and the executor's account, for the report."""
    ctx = Ctx(str(work.out), cfg, partitions_for(cfg, files), hooks.from_env())
    times = run["time_s"]
    t0 = time.perf_counter()
    units = _docs_stage(stages, ctx, files)
    times["docs"] = _lap(t0)
    dedup, index_spills = _dedup_stages(stages, ctx, units, run)
    times["dedup"] = _lap(t0) - times["docs"]
    attributes = _attributes(stages, ctx, units)
    model = _tokenizer_stage(stages, ctx, units, dedup)
    times["tokenizer"] = _lap(t0) - times["docs"] - times["dedup"]
    tokens, _ = stages.collect(
        stages.submit("tokenize", unit_tasks.tokenize_unit,
                      [(ctx, u["unit"], u["chunks"], str(model)) for u in units]), attributes)
    splits, tails, hist = _write_stage(stages, ctx, tokens)
    times["tokenize+write"] = _lap(t0) - sum(times.values())
    run["chunks_reused"] = {"docs": _chunks_reused(units), "tokenize": _chunks_reused(tokens)}
    run["executor"] = {**stages.describe(), "partitions": ctx.partitions, "units": len(units),
                       "index_spills": index_spills, **stages.summary()}
    return dedup, splits, tails, hist


def _chunks_reused(units: list[dict]) -> int:
    """Chunks a rerun found done: every chunk of a task found done, and within a task redone, the
    chunks whose outputs an earlier try had written (they are read back, not computed again)."""
    return sum(u.get("reused") or c["reused"] for u in units for c in u["chunks"])


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


def _plan(stages: Executor, ctx: Ctx, files: list[InputFile]) -> list[InputFile]:
    """Work units from the sorted inputs: a file each, large uncompressed jsonl files cut into
    parts of about run.ray_unit_bytes at line starts (tasks count the lines) and large parquet
    files between row groups. Depends only on the inputs and that size, never on the cluster."""
    big = [k for k, f in enumerate(files)
           if splittable(f.path) and f.path.stat().st_size > ctx.cfg.run.ray_unit_bytes]
    parts = dict(zip(big, stages.run("plan", unit_tasks.plan_file,
                                     [(ctx, files[k]) for k in big]))) if big else {}
    return [p for k, f in enumerate(files) for p in (parts[k]["parts"] if k in parts else [f])]


def _docs_stage(stages: Executor, ctx: Ctx, files: list[InputFile]) -> list[dict]:
    units = stages.run("docs", unit_tasks.docs_unit,
                       [(ctx, Unit(i, f, file_format(f.path)[0]))
                        for i, f in enumerate(_plan(stages, ctx, files))])
    for m in units:   # the first stop in input order
        if "stop" in m:
            raise stopped(m)
    return units


def _dedup_stages(stages: Executor, ctx: Ctx, units: list[dict],
                  run: dict) -> tuple[DedupResult, int]:
    """The dedup counts, and how often the replays' LSH index went to disk (the report's)."""
    U, P = len(units), ctx.partitions
    parts = [(ctx, p, U) for p in range(P)]
    _, exact, cells = stages.run_many(("ids", dedup_tasks.ids_reduce, parts),
                                      ("exact", dedup_tasks.exact_reduce, parts),
                                      ("cells", dedup_tasks.cells_reduce, parts))
    edges = sum(m["edges"] for m in exact + cells)
    label_files = _components(stages, ctx, edges)
    stages.run("groups", unit_tasks.group_unit,
               [(ctx, u["unit"], u["chunks"], label_files) for u in units])
    sig_dtype = next((u["sig_dtype"] for u in units if u.get("sig_dtype")), "")
    replayed = stages.run("replay", dedup_tasks.replay, [(ctx, p, U, sig_dtype) for p in range(P)])
    settled, _ = stages.run_many(
        ("settle", unit_tasks.settle_unit, [(ctx, u["unit"], u["chunks"]) for u in units]),
        ("duplicates", dedup_tasks.write_duplicates, [(ctx, U)]))
    result = DedupResult(docs_seen=sum(c["rows"] for u in units for c in u["chunks"]))
    for s in settled:
        result.kept_docs += s["kept_docs"]
        result.kept_bytes += s["kept_bytes"]
        result.train_bytes += s["train_bytes"]
        for kind in ("exact", "near"):
            getattr(result, kind)[0] += s[kind][0]
            getattr(result, kind)[1] += s[kind][1]
        result.duplicate_ids += s["duplicate_ids"]
    check_ids(result.duplicate_ids, ctx.cfg.run.strict)
    if result.kept_docs == 0:
        run["docs_read"] = result.docs_seen
        raise NoDatasetError(failure.empty_message(ctx.work, result.docs_seen, ctx.cfg))
    return result, sum(m["frozen"] for m in replayed)


def _attributes(stages: Executor, ctx: Ctx, units: list[dict]) -> dict:
    """documents/attributes.parquet, one task: submitted, so that it runs beside the stages after
    it (collected before the write stage)."""
    return stages.submit("attributes", dedup_tasks.write_attributes, [(ctx, len(units))])


def _components(stages: Executor, ctx: Ctx, edges: int) -> list[str]:
    """Label files of the connected components: one union-find task when the edges fit, else
    min-label rounds until no label changes."""
    if edges <= ctx.cfg.run.ray_union_find_edges:
        stages.run("components", dedup_tasks.components, [(ctx,)])
        return [str(ctx.plan_dir / "labels" / "all.parquet")]
    paths = [str(p) for p in sorted(ctx.stage_dir("edges").glob("*.parquet"))]
    stages.run("adjacency", labels.adjacency_map, [(ctx, i, paths) for i in range(len(paths))])
    rnd = 0
    while True:
        sent = stages.run("labels", labels.label_round,
                          [(ctx, rnd, p, len(paths)) for p in range(ctx.partitions)])
        if not any(m["sent"] for m in sent):
            return [str(p) for p in labels.final_labels(ctx, rnd)]
        rnd += 1


def _tokenizer_stage(stages: Executor, ctx: Ctx, units: list[dict], dedup: DedupResult) -> Path:
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
    pieces = stages.run("sample", unit_tasks.sample_unit,
                        [(ctx, u["unit"], u["chunks"], p) for u in units])
    stats = {"sample_docs": sum(m["sample_docs"] for m in pieces),
             "sample_bytes": sum(m["sample_bytes"] for m in pieces), "fraction": p}
    (r,) = stages.run("tokenizer", unit_tasks.train_tokenizer_task, [(ctx, len(units), stats)])
    if "error" in r:
        raise NoDatasetError(r["error"])
    if r["vocab_size"] != cfg.tokenizer.vocab_size and not r["reused"]:
        print(fit_warning(cfg.tokenizer.vocab_size, r["vocab_size"]), file=sys.stderr, flush=True)
    return model


def _write_stage(stages: Executor, ctx: Ctx, tokens: list[dict]):
    """Shards by fixed sample ranges, provenance per split: (SplitInfo per split, tails, hist)."""
    from mspretrain.dataprep.report import summary as reporting
    cfg = ctx.cfg
    L = cfg.pack.seq_length + 1
    cap = shard_capacity(cfg.shards.max_shard_bytes, cfg.pack.seq_length)
    chunks = [c for u in tokens for c in u["chunks"]]
    index = [c["index"] for c in chunks]
    calls, tails, totals = [], {}, {}
    for split in SPLITS:
        counts = np.array([c["tokens"][split] for c in chunks], np.int64)
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
    written, prov = stages.run_many(
        ("write", write.write_shard, calls),
        ("provenance", write.write_provenance, [(ctx, split, index) for split in SPLITS]))
    splits = {}
    for split in SPLITS:
        shards = tuple(ShardInfo(**w["shard"]) for w in written if w["split"] == split)
        splits[split] = SplitInfo(totals[split], totals[split] * L, shards)
    bins = np.zeros(0, np.int64)
    for m in prov:
        bins = reporting.add_bins(bins, np.asarray(m["length_bins"], np.int64))
    return splits, tails, reporting.histogram_of_bins(bins)
