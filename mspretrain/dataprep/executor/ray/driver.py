"""The driver of `dataprep build --engine ray`: connects to (or starts) Ray, submits each stage's
tasks, shows a tqdm bar per stage, and collects the small markers the tasks return, in task order.

The driver holds only per-unit and per-chunk markers (counts, token totals): O(files + chunks), never
documents, signatures or the LSH index; its peak RSS is measured by bench/bench_dataprep.py."""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from mspretrain.dataprep import interrupt
from mspretrain.dataprep.config import BuildConfig
from mspretrain.dataprep.dedup.keep import DedupResult
from mspretrain.dataprep.errors import BuildError, NoDatasetError, check_ids, stopped
from mspretrain.dataprep.executor.ray import hooks, tasks_dedup, tasks_labels, tasks_units, tasks_write
from mspretrain.dataprep.executor.ray.layout import Ctx, Unit
from mspretrain.dataprep.readers import InputFile, file_format, splittable, this_process_only
from mspretrain.dataprep.write.shards import shard_capacity
from mspretrain.dataprep.stages import SPLITS
from mspretrain.dataprep.tokenizer.sample import sample_fraction
from mspretrain.dataprep.workdir import WorkDir
from mspretrain.loader.manifest import ShardInfo, SplitInfo

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"   # "0": Ray nodes bind to 127.0.0.1


@dataclass
class Stages:
    """Runs stages on Ray and counts their tasks (for the report)."""
    progress: bool
    tasks: dict = field(default_factory=dict)
    reused: dict = field(default_factory=dict)
    seconds: dict = field(default_factory=dict)
    cpu: dict = field(default_factory=dict)

    def run(self, name: str, fn, calls: list[tuple]) -> list[dict]:
        return self.collect(self.submit(name, fn, calls))[0]

    def run_many(self, *stages: tuple) -> list[list[dict]]:
        """Independent stages ((name, fn, calls) each) at once: their tasks share the CPUs, so a
        stage of few tasks does not leave the others idle. Results per stage, in task order."""
        return self.collect(*(self.submit(*s) for s in stages))

    def submit(self, name: str, fn, calls: list[tuple]) -> dict:
        """Start a stage's tasks; `collect` waits for them."""
        remote = _remote(fn)
        return {"name": name, "t0": time.perf_counter(),
                "refs": [remote.remote(fn, *args) for args in calls]}

    def collect(self, *pending: dict) -> list[list[dict]]:
        """Wait for submitted stages (one progress bar), then account for each."""
        import ray
        from ray.exceptions import RayTaskError
        stage_of = {ref: p for p in pending for ref in p["refs"]}
        left = {id(p): len(p["refs"]) for p in pending}
        ended = {id(p): time.perf_counter() for p in pending if not p["refs"]}
        with tqdm(total=len(stage_of), desc="+".join(p["name"] for p in pending), unit="task",
                  disable=not self.progress) as bar:
            waiting = list(stage_of)
            while waiting:
                ready, waiting = ray.wait(waiting, num_returns=1)
                interrupt.check()
                for ref in ready:
                    p = stage_of[ref]
                    left[id(p)] -= 1
                    if not left[id(p)]:
                        ended[id(p)] = time.perf_counter()
                bar.update(len(ready))
        out = []
        for p in pending:
            name = p["name"]
            try:
                results = ray.get(p["refs"])
            except RayTaskError as e:
                raise BuildError(f"stage {name}: {e.cause!r}") from None
            self.seconds[name] = round(self.seconds.get(name, 0) + ended[id(p)] - p["t0"], 3)
            self.cpu[name] = round(self.cpu.get(name, 0) + sum(r["task_cpu_s"] for r in results), 3)
            self.tasks[name] = self.tasks.get(name, 0) + len(results)
            self.reused[name] = self.reused.get(name, 0) + sum(bool(r.get("reused")) for r in results)
            out.append(results)
        return out

    def hash_inputs(self, files: list[InputFile]) -> list[str]:
        """sha256 of every input file, one task per file (the manifest records them)."""
        return [r["sha256"] for r in self.run("hash inputs", _sha256_task, [(f,) for f in files])]


_remotes: dict = {}


def _remote(fn):
    """The remote form of _timed_task, made once per connection (each ray.remote exports the
    function to the cluster again)."""
    import ray
    key = ray.get_runtime_context().get_job_id()
    if key not in _remotes:
        _remotes.clear()
        _remotes[key] = ray.remote(num_cpus=1, max_retries=5)(_timed_task)
    return _remotes[key]


def _sha256_task(inp: InputFile) -> dict:
    from mspretrain.loader.manifest import sha256_file
    return {"sha256": sha256_file(inp.path)}


def _timed_task(fn, *args) -> dict:
    """fn(*args), with the CPU seconds the task took (the report's per-stage CPU time)."""
    t0 = time.process_time()
    result = fn(*args)
    return {**result, "task_cpu_s": time.process_time() - t0}


@contextmanager
def ray_session(cfg: BuildConfig):
    """Connected to Ray for the whole build (joined, or a local instance started and stopped);
    yields the stage runner."""
    started = _connect(cfg)
    try:
        yield Stages(cfg.run.progress)
    finally:
        if started:
            import ray
            ray.shutdown()


def build_stages(stages: Stages, files: list[InputFile], cfg: BuildConfig, work: WorkDir,
                 run: dict):
    """Every stage up to the written shards: (DedupResult, SplitInfo per split, tails, histogram)."""
    import ray
    if unseen := this_process_only(f.path for f in files):
        raise BuildError(f"input format {', '.join(unseen)} is registered in this process only: Ray "
                         f"workers read the files and cannot see it; register it through a "
                         f"mspretrain.readers entry point (docs/extending.md)")
    ctx = Ctx(str(work.out), cfg, partitions_for(cfg, files), hooks.from_env())
    times = run["time_s"]
    t0 = time.perf_counter()
    units = _docs_stage(stages, ctx, files)
    times["docs"] = _lap(t0)
    dedup = _dedup_stages(stages, ctx, units)
    times["dedup"] = _lap(t0) - times["docs"]
    attributes = _attributes(stages, ctx, units)
    model = _tokenizer_stage(stages, ctx, units, dedup)
    times["tokenizer"] = _lap(t0) - times["docs"] - times["dedup"]
    tokens, _ = stages.collect(
        stages.submit("tokenize", tasks_units.tokenize_unit,
                      [(ctx, u["unit"], u["chunks"], str(model)) for u in units]), attributes)
    splits, tails, hist = _write_stage(stages, ctx, tokens)
    times["tokenize+write"] = _lap(t0) - sum(times.values())
    run["chunks_reused"] = {"docs": stages.reused.get("docs", 0),
                            "tokenize": stages.reused.get("tokenize", 0)}
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    run["ray"] = {"nodes": len(nodes), "cpus": int(ray.cluster_resources().get("CPU", 0)),
                  "partitions": ctx.partitions, "units": len(units),
                  "tasks": stages.tasks, "tasks_reused": stages.reused,
                  "stage_s": stages.seconds, "task_cpu_s": stages.cpu}
    return dedup, splits, tails, hist


def partitions_for(cfg: BuildConfig, files: list[InputFile]) -> int:
    """run.ray_partitions, or where it is 0, one per GiB of input (2 to 256): enough reduce tasks to
    spread and few small shuffle files on a small corpus, ~16 at 16 GiB. From the inputs alone, so a
    rerun on another cluster resumes the same partitioning (the bytes never depend on it)."""
    if cfg.run.ray_partitions:
        return cfg.run.ray_partitions
    size = sum(f.path.stat().st_size for f in files)
    return min(256, max(2, -(-size // (1 << 30))))


def _connect(cfg: BuildConfig) -> bool:
    """Join cfg.run.ray_address, or start a local instance bound to 127.0.0.1. True if this call
    connected (and so must disconnect)."""
    if not cfg.run.ray_address:
        # a one-machine instance listens on 127.0.0.1 only: Ray's switch for that is read when
        # ray is first imported (it then takes the loopback address as the node's address)
        os.environ.setdefault(LOOPBACK_ENV, "0")
    try:
        import ray
    except ImportError:
        raise BuildError("--engine ray needs Ray: pip install 'mspretrain[ray]' "
                         "(ray==2.60.0)") from None
    _check_reachable(cfg.run.ray_address)
    if ray.is_initialized():   # a caller (a test, a notebook) connected already: use that
        return False
    common = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        if cfg.run.ray_address:
            ray.init(address=cfg.run.ray_address, **common)
        else:
            ray.init(address="local", num_cpus=cfg.run.ray_cpus or None,
                     _node_ip_address="127.0.0.1", **common)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise BuildError(f"cannot reach the Ray cluster at {cfg.run.ray_address or 'local'}: "
                         f"{e}") from None
    return True


def _check_reachable(address: str) -> None:
    """Fail in seconds on a HOST:PORT nobody listens on (ray.init would retry for minutes)."""
    import socket
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or address.startswith("ray://"):
        return
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as e:
        raise BuildError(f"cannot reach the Ray cluster at {address}: {e}; start it with "
                         f"`ray start --head` (docs/scale-out.md)") from None


def _lap(t0: float) -> float:
    return round(time.perf_counter() - t0, 3)


def _plan(stages: Stages, ctx: Ctx, files: list[InputFile]) -> list[InputFile]:
    """Work units from the sorted inputs: a file each, large uncompressed jsonl files cut into
    parts of about run.ray_unit_bytes at line starts (tasks count the lines) and large parquet
    files between row groups. Depends only on the inputs and that size, never on the cluster."""
    big = [k for k, f in enumerate(files)
           if splittable(f.path) and f.path.stat().st_size > ctx.cfg.run.ray_unit_bytes]
    parts = dict(zip(big, stages.run("plan", tasks_units.plan_file,
                                     [(ctx, files[k]) for k in big]))) if big else {}
    return [p for k, f in enumerate(files) for p in (parts[k]["parts"] if k in parts else [f])]


def _docs_stage(stages: Stages, ctx: Ctx, files: list[InputFile]) -> list[dict]:
    units = stages.run("docs", tasks_units.docs_unit,
                       [(ctx, Unit(i, f, file_format(f.path)[0]))
                        for i, f in enumerate(_plan(stages, ctx, files))])
    for m in units:   # the first stop in input order, as the local build reports it
        if "stop" in m:
            raise stopped(m)
    return units


def _dedup_stages(stages: Stages, ctx: Ctx, units: list[dict]) -> DedupResult:
    U, P = len(units), ctx.partitions
    parts = [(ctx, p, U) for p in range(P)]
    _, exact, cells = stages.run_many(("ids", tasks_dedup.ids_reduce, parts),
                                      ("exact", tasks_dedup.exact_reduce, parts),
                                      ("cells", tasks_dedup.cells_reduce, parts))
    edges = sum(m["edges"] for m in exact + cells)
    label_files = _components(stages, ctx, edges)
    stages.run("groups", tasks_units.group_unit,
               [(ctx, u["unit"], u["chunks"], label_files) for u in units])
    sig_dtype = next((u["sig_dtype"] for u in units if u.get("sig_dtype")), "")
    stages.run("replay", tasks_dedup.replay, [(ctx, p, U, sig_dtype) for p in range(P)])
    settled, _ = stages.run_many(
        ("settle", tasks_units.settle_unit, [(ctx, u["unit"], u["chunks"]) for u in units]),
        ("duplicates", tasks_dedup.write_duplicates, [(ctx, U)]))
    result = DedupResult(chunk_rows=[c["rows"] for u in units for c in u["chunks"]])
    result.docs_seen = sum(result.chunk_rows)
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
        raise NoDatasetError(f"no documents left after filtering and dedup ({result.docs_seen} "
                             f"read); see the filter thresholds in the config")
    return result


def _attributes(stages: Stages, ctx: Ctx, units: list[dict]) -> dict:
    """documents/attributes.parquet, one task: submitted, so that it runs beside the stages after
    it (collected before the write stage)."""
    return stages.submit("attributes", tasks_dedup.write_attributes, [(ctx, len(units))])


def _components(stages: Stages, ctx: Ctx, edges: int) -> list[str]:
    """Label files of the connected components: one union-find task when the edges fit, else
    min-label rounds until no label changes."""
    if edges <= ctx.cfg.run.ray_union_find_edges:
        stages.run("components", tasks_dedup.components, [(ctx,)])
        return [str(ctx.ray_dir / "labels" / "all.parquet")]
    paths = [str(p) for p in sorted(ctx.stage_dir("edges").glob("*.parquet"))]
    stages.run("adjacency", tasks_labels.adjacency_map, [(ctx, i, paths) for i in range(len(paths))])
    rnd = 0
    while True:
        sent = stages.run("labels", tasks_labels.label_round,
                          [(ctx, rnd, p, len(paths)) for p in range(ctx.partitions)])
        if not any(m["sent"] for m in sent):
            return [str(p) for p in tasks_labels.final_labels(ctx, rnd)]
        rnd += 1


def _tokenizer_stage(stages: Stages, ctx: Ctx, units: list[dict], dedup: DedupResult) -> Path:
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
    pieces = stages.run("sample", tasks_units.sample_unit,
                        [(ctx, u["unit"], u["chunks"], p) for u in units])
    stats = {"sample_docs": sum(m["sample_docs"] for m in pieces),
             "sample_bytes": sum(m["sample_bytes"] for m in pieces), "fraction": p}
    (r,) = stages.run("tokenizer", tasks_units.train_tokenizer_task, [(ctx, len(units), stats)])
    if "error" in r:
        raise NoDatasetError(r["error"])
    return model


def _write_stage(stages: Stages, ctx: Ctx, tokens: list[dict]):
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
        ("write", tasks_write.write_shard, calls),
        ("provenance", tasks_write.write_provenance, [(ctx, split, index) for split in SPLITS]))
    splits = {}
    for split in SPLITS:
        shards = tuple(ShardInfo(**w["shard"]) for w in written if w["split"] == split)
        splits[split] = SplitInfo(totals[split], totals[split] * L, shards)
    bins = np.zeros(0, np.int64)
    for m in prov:
        bins = reporting.add_bins(bins, np.asarray(m["length_bins"], np.int64))
    return splits, tails, reporting.histogram_of_bins(bins)
