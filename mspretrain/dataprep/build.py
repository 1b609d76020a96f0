"""`dataprep build`: raw corpus files -> a dataset directory (docs/contracts.md).

Stages (worker processes where it is expensive, the main process where order matters). This is the
one numbering of the stages: stages.py, dedup_pass.py, workdir.py and the Ray engine (whose tasks
are named after the stage they belong to) refer to it.
  1. docs      [workers]  read (main, streamed) -> normalise -> quality filters -> exact key -> MinHash,
                          per chunk of documents            (stages.clean_chunk)
  2. dedup     [main]     in input order: duplicate doc_ids, exact dedup, near dedup (LSH); the first
                          document in input order is the one kept            (dedup_pass.DedupPass)
  3. tokenizer [main]     train sentencepiece on a hash-chosen sample of the kept train documents,
                          or copy --tokenizer MODEL                           (tokenizer.py)
  4. tokenize  [workers]  encode kept documents per chunk, EOS after each    (stages.tokenize_chunk)
  5. pack+write [main]    in input order: split streams -> samples of seq_length+1 -> MindRecord
                          shards under the byte cap, provenance              (pack.py)
  6. finish     manifest (fingerprint over config, tokenizer and shard checksums), report, publish.
Stages 2 and 5 consume the worker results in input order while the workers run ahead (workers.py).
With --tokenizer MODEL (no training, so no need to wait for stage 2 to end) and fewer workers than
cores, stages 4 and 5 start during stage 1: while the main process waits for the next stage-1 result,
it tokenizes and packs the chunks stage 2 has settled (tokenize_chunk is pure: the same tokens
whoever runs it), so the workers and the main process work at the same time; the chunks left at the
end of stage 1 go to the workers.

Determinism: everything that decides bytes happens in input order in the main process, and the chunk
boundaries depend only on the inputs and `run.chunk_bytes`; so DIR is the same for any --workers.
report.json / report.md hold timings and worker pids, so they are the one part of DIR that differs
between runs; every other byte (manifest included) is identical.

Resume (workdir.py): per-chunk outputs and stage markers live in DIR/.build/, written atomically.
A rerun of the same command skips every completed chunk and stage and replays the order-dependent
stages from them; the result is byte-identical to an uninterrupted build. DIR/.build is removed on
success. Guards: an unfinished build with a different config, or a DIR holding a different dataset
(or anything else), is an error and nothing is touched; the same command on a finished identical
build says so and succeeds.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from mspretrain.dataprep.report import failure
from mspretrain.dataprep.report import summary as reporting
from mspretrain.dataprep.config import BuildConfig, manifest_config
from mspretrain.dataprep.dedup.detect import describe
from mspretrain.dataprep.dedup.keep import (ATTRIBUTES_FILE, ATTRIBUTES_SCHEMA, DUPLICATES_FILE,
                                 DUPLICATES_SCHEMA, DedupPass, DedupResult)
from mspretrain.dataprep.write.pack import SplitPacker
from mspretrain.dataprep.write.parquet_stream import InOrderParquet
from mspretrain.dataprep.readers import InputPathError, list_inputs
from mspretrain.dataprep.errors import BuildError, NoDatasetError, check_ids, stopped
from mspretrain.dataprep.stages import (SPLITS, SplitTokens, clean_chunk, init_worker, read_chunks,
                             tokenize_chunk, tokenize_chunk_parts, worker_setup)
from mspretrain.dataprep.tokenizer.model import TokenizerError, copy_tokenizer, tokenizer_info
from mspretrain.dataprep.tokenizer.sample import sample_fraction, write_chunk_sample
from mspretrain.dataprep.write.stray import remove_temps
from mspretrain.dataprep.tokenizer.vocab_fit import train_fitted
from mspretrain.dataprep.verify import file_faults
from mspretrain.dataprep.executor.local import WorkerDied, WorkerPool
from mspretrain.dataprep.workdir import WorkDir
from mspretrain.common.arrow import read_parquet
from mspretrain.common.files import atomic_open, atomic_write_json
from mspretrain.loader.manifest import (FORMAT_VERSION, MANIFEST_FILE, Manifest, ManifestError,
                             compute_fingerprint, load_manifest, sha256_file, write_manifest)


@dataclass
class BuildResult:
    out: Path
    manifest: Manifest
    already_built: bool = False
    report: dict = field(default_factory=dict)


def build(inputs: list[str], out: str | os.PathLike, cfg: BuildConfig) -> BuildResult:
    out = Path(out)
    left_out: dict = {}
    try:
        files = list_inputs(inputs, left_out)
    except (FileNotFoundError, InputPathError) as e:
        raise BuildError(str(e)) from None
    if not files:
        raise BuildError(f"no input files found under {', '.join(map(str, inputs))}"
                         f"{_left_out_note(left_out)}")
    if cfg.run.engine == "ray":
        from mspretrain.dataprep.executor.ray.driver import ray_session
        with ray_session(cfg) as stages:
            return _build(out, files, cfg, stages, left_out)
    return _build(out, files, cfg, None, left_out)


def _left_out_note(left_out: dict) -> str:
    if not left_out:
        return ""
    return " (left out: " + ", ".join(f"{len(v)} {k.replace('_', ' ')}"
                                      for k, v in left_out.items()) + ")"


def _build(out: Path, files, cfg: BuildConfig, stages, left_out: dict) -> BuildResult:
    """`stages`: the Ray engine's stage runner (dataprep.ray_engine.driver.Stages), or None.
    `left_out`: what list_inputs left out of the input directories, for the report."""
    config = resolved_config(cfg, files, stages.hash_inputs if stages else None)
    created = not out.exists()
    done = _check_out(out, config, cfg)
    if done is not None:
        return BuildResult(out, done, already_built=True)
    work = WorkDir(out)
    if work.exists():
        _unpublish(out, work)
    else:
        work.create(work_owner(config, cfg))
    run = {"time_s": {}, "chunks_reused": {"docs": 0, "tokenize": 0}, "left_out": left_out}
    if stages is not None:
        from mspretrain.dataprep.executor.ray.driver import build_stages
        try:
            dedup, splits, tails, hist = build_stages(stages, files, cfg, work, run)
            return _finish(out, work, cfg, config, dedup, splits, tails, hist, run)
        except NoDatasetError:
            _remove_work(out, work, created)
            raise
    return _build_local(out, work, files, cfg, config, run, created)


def _build_local(out: Path, work: WorkDir, files, cfg: BuildConfig, config: dict, run: dict,
                 created: bool) -> BuildResult:
    times = run["time_s"]
    try:
        with _worker_pool(cfg, work) as pool:
            # a given tokenizer and a core to spare: stages 4 and 5 start with stage 1 (see the
            # module docstring); with a core per worker, the main process would only slow them
            packing = None
            if cfg.tokenizer.model and cfg.run.workers < len(os.sched_getaffinity(0)):
                model = _timed(times, "tokenizer", _tokenizer_stage, cfg, work, None)
                packing = PackStage(cfg, work, model, run)
            dedup = _timed(times, "docs+dedup", _docs_and_dedup, pool, files, cfg, work, run,
                           packing)
            if packing is None:
                model = _timed(times, "tokenizer", _tokenizer_stage, cfg, work, dedup)
                packing = PackStage(cfg, work, model, run)
            splits, tails, hist = _timed(times, "tokenize+pack+write", _tokenize_and_write,
                                         pool, cfg, dedup, packing)
        return _finish(out, work, cfg, config, dedup, splits, tails, hist, run)
    except WorkerDied as e:
        raise BuildError(str(e)) from None
    except NoDatasetError as e:
        bad = failure.bad_records(work)
        _remove_work(out, work, created)
        failure.write_report(out, str(e), bad, run.get("docs_read"))
        raise


def _remove_work(out: Path, work: WorkDir, created: bool) -> None:
    work.remove()
    if created and not any(out.iterdir()):
        out.rmdir()


# ---------------------------------------------------------------------------------- set-up

# The version of the work dir's intermediate files; bumped when they change, so that a rerun of a
# build killed under an older version is refused with a clear message, not failed mid-stage.
# 2: chunk files hold each document's split, tokens files the doc ids.
WORK_LAYOUT = 2


def work_owner(config: dict, cfg: BuildConfig) -> dict:
    """The build a work dir belongs to (.build/build.json), which a rerun must equal to resume it:
    the config, the chunking, the engine (each engine lays out its intermediate files its own way)
    and the layout of those files (WORK_LAYOUT)."""
    owner = {"config": config, "chunk_bytes": cfg.run.chunk_bytes, "layout": WORK_LAYOUT}
    if cfg.run.engine != "local":
        owner.update(engine=cfg.run.engine, partitions=cfg.run.ray_partitions,
                     unit_bytes=cfg.run.ray_unit_bytes)
    return owner


def resolved_config(cfg: BuildConfig, files, hash_files=None) -> dict:
    """The manifest's config: settings, dedup scheme, tokenizer source and the inputs' checksums
    (`hash_files(files)` -> their sha256s, where given: the Ray engine hashes on the cluster)."""
    config = manifest_config(cfg)
    config["dedup_scheme"] = describe(cfg.dedup)
    if cfg.tokenizer.model:
        config["tokenizer"]["model"] = "sha256:" + sha256_file(cfg.tokenizer.model)
    if hash_files is None:
        bar = tqdm(files, desc="hash inputs", unit="file", disable=not cfg.run.progress,
                   leave=False)
        sums = [_input_sha256(f.path) for f in bar]
    else:
        sums = hash_files(files)
    config["inputs"] = [{"file": f.rel, "bytes": f.path.stat().st_size, "sha256": s}
                        for f, s in zip(files, sums)]
    return config


def _input_sha256(path: Path) -> str:
    """An input file's sha256 (for the manifest), or a BuildError naming a file that cannot be read
    (permissions, an I/O error): every input is part of the dataset's identity."""
    try:
        return sha256_file(path)
    except OSError as e:
        raise BuildError(f"{path}: cannot read this input file ({e.strerror or e}); fix its "
                         f"permissions or leave it out") from None


def _check_out(out: Path, config: dict, cfg: BuildConfig) -> Manifest | None:
    """The finished identical dataset in `out`, None to build/resume, or BuildError."""
    work = WorkDir(out)
    failure.clear_report(out)   # a failed build's report: the next build replaces it
    if (out / MANIFEST_FILE).is_file():
        try:
            manifest = load_manifest(out)
        except ManifestError as e:
            raise BuildError(f"--out {out} holds a damaged dataset ({e}); nothing overwritten") from None
        if manifest.config != config:
            raise BuildError(f"--out {out} already holds a different dataset (fingerprint "
                             f"{manifest.fingerprint[:16]}); nothing overwritten. Choose another "
                             f"--out or delete it.")
        faults = file_faults(out, manifest)
        if faults:
            raise BuildError(f"--out {out} holds this dataset, damaged: {faults[0]}"
                             f"{f' (and {len(faults) - 1} more)' if len(faults) > 1 else ''}; "
                             f"nothing overwritten. `dataprep verify {out}` lists every fault; "
                             f"delete {out} and rerun to build it again")
        _remove_leftovers(work, config)
        return manifest
    if work.exists():
        owner = work.owner()
        if owner.get("layout", 1) != WORK_LAYOUT:
            raise BuildError(f"{work.root} holds an unfinished build of another dataprep version "
                             f"(work dir layout {owner.get('layout', 1)}, this version's is "
                             f"{WORK_LAYOUT}); delete {work.root} and rerun")
        if owner != work_owner(config, cfg):
            raise BuildError(f"{work.root} holds an unfinished build with a different config or "
                             f"inputs; rerun it with its original command, or delete {work.root}")
        return None
    if work.root.is_dir() and [p.name for p in out.iterdir()] == [work.root.name]:
        work.remove_unclaimed()   # killed before build.json was written: empty directories
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BuildError(f"--out {out} exists and is not a dataset built by dataprep; nothing "
                         f"overwritten or deleted. Choose an empty or new directory.")
    return None


def _remove_leftovers(work: WorkDir, config: dict) -> None:
    """The work dir of a build killed after it published its manifest: removed when its owner file
    names this dataset's config (so this tool wrote it), else left alone."""
    try:
        ours = work.owner().get("config") == config
    except (OSError, ValueError, AttributeError):
        ours = False
    if ours:
        work.remove()
    else:
        work.remove_unclaimed()


def _unpublish(out: Path, work: WorkDir) -> None:
    """A build killed while publishing left some outputs in DIR (only the manifest marks a finished
    build): move them back into the staging dir, where the resumed stages expect them."""
    for entry in sorted(out.iterdir()):
        if entry.name != work.root.name and not (work.staging / entry.name).exists():
            os.replace(entry, work.staging / entry.name)


def _worker_pool(cfg: BuildConfig, work: WorkDir) -> WorkerPool:
    setup = worker_setup(cfg, work)
    init_worker(setup)   # the main process runs tokenize_chunk too, while it waits on stage 1
    return WorkerPool(cfg.run.workers, setup)     # started by `with`


def _timed(times: dict, name: str, fn, *args):
    t0 = time.perf_counter()
    result = fn(*args)
    times[name] = round(time.perf_counter() - t0, 3)
    return result


# ---------------------------------------------------------------------------------- stages

def _docs_and_dedup(pool, files, cfg: BuildConfig, work: WorkDir, run: dict,
                    packing: "PackStage | None") -> DedupResult:
    if DedupResult.exists(work.root):
        result = DedupResult.load(work.root)
        run["chunks_reused"]["docs"] = result.num_chunks
        return result
    tasks = read_chunks(files, cfg.input.text_field, cfg.input.id_field, cfg.input.text_unit,
                        cfg.run.chunk_bytes, cfg.run.strict, cfg.input.max_record_bytes,
                        cfg.input.id_scope)
    dedup = DedupPass(cfg.dedup,
                      texts=lambda chunk: read_parquet(work.chunk_file(work.docs, chunk, "parquet"),
                                                       columns=["text"]).column("text"),
                      spill=work.root / "near", hot_docs=cfg.run.dedup_memory_docs)
    bar = tqdm(total=len(files), desc="clean+filter+minhash", unit="file",
               disable=not cfg.run.progress)
    settled: deque = deque()   # (chunk, keep mask): deduplicated, not yet tokenized

    def tokenize_settled() -> bool:
        if not settled:
            return False
        packing.add(*tokenize_chunk_parts(packing.task(*settled.popleft())))
        return True

    with bar, InOrderParquet(work.staging / DUPLICATES_FILE, DUPLICATES_SCHEMA) as duplicates, \
            InOrderParquet(work.staging / ATTRIBUTES_FILE, ATTRIBUTES_SCHEMA) as attributes:
        for marker in pool.map_ordered(clean_chunk, tasks, tokenize_settled if packing else None):
            if "stop" in marker:
                raise stopped(marker)
            table = read_parquet(work.chunk_file(work.docs, marker["index"], "parquet"),
                                 columns=DedupPass.COLUMNS)
            run["chunks_reused"]["docs"] += bool(marker.get("reused"))
            decided = dedup.consume(table, np.dtype(marker["sig_dtype"] or "uint32"))
            duplicates.add(decided.duplicates)
            attributes.add(decided.attributes)
            if packing:
                settled.append((marker["index"], decided.keep))
            bar.update(marker["files_done"])
        result = dedup.finish()
        check_ids(result.duplicate_ids, cfg.run.strict)
        if result.kept_docs == 0:
            run["docs_read"] = result.docs_seen
            raise NoDatasetError(failure.empty_message(work, result.docs_seen, cfg))
    result.save(work.root)
    return result


def _tokenizer_stage(cfg: BuildConfig, work: WorkDir, dedup: DedupResult | None) -> Path:
    model = work.staging / "tokenizer.model"
    try:
        if cfg.tokenizer.model:
            copy_tokenizer(cfg.tokenizer.model, model)
        elif not (work.root / "tokenizer.json").is_file():
            sample = work.root / "tokenizer_sample.txt"
            stats = _write_tokenizer_sample(sample, cfg, work, dedup)
            stats["vocab_size"] = train_fitted(sample, model, cfg.tokenizer)
            atomic_write_json(work.root / "tokenizer.json", stats)
    except TokenizerError as e:
        raise NoDatasetError(str(e)) from None
    return model


def _write_tokenizer_sample(path: Path, cfg: BuildConfig, work: WorkDir,
                            dedup: DedupResult) -> dict:
    """Kept train documents whose hash falls under sample_bytes / train bytes, one line a sentence."""
    p = sample_fraction(cfg, dedup.train_bytes)
    docs = nbytes = 0
    with atomic_open(path, "w", encoding="utf-8") as f:
        for i in tqdm(range(dedup.num_chunks), desc="tokenizer sample", unit="chunk",
                      disable=not cfg.run.progress, leave=False):
            n, b = write_chunk_sample(f, work.chunk_file(work.docs, i, "parquet"), dedup.keep(i), p)
            docs, nbytes = docs + n, nbytes + b
    return {"sample_docs": docs, "sample_bytes": nbytes, "fraction": p}


def _tokenize_and_write(pool, cfg: BuildConfig, dedup: DedupResult, packing: "PackStage"):
    """The chunks not tokenized and packed yet (all of them, unless stage 1 did some), by the workers."""
    tasks = (packing.task(i, dedup.keep(i)) for i in range(packing.next, dedup.num_chunks))
    bar = tqdm(total=dedup.num_chunks, initial=packing.next, desc="tokenize+pack+write",
               unit="chunk", disable=not cfg.run.progress)
    with bar:
        for marker in pool.map_ordered(tokenize_chunk, tasks):
            packing.add(marker)
            bar.update(1)
    return packing.close()


class PackStage:
    """Stages 4-5, in order: chunk after chunk, the tokens of its kept documents into the packers."""

    def __init__(self, cfg: BuildConfig, work: WorkDir, model: Path, run: dict):
        for sub in ("shards", "provenance"):    # this stage is replayed whole after an interruption
            shutil.rmtree(work.staging / sub, ignore_errors=True)
        self.work, self.run, self.model = work, run, str(model)
        self.info = tokenizer_info(model)
        self.packers = {s: SplitPacker(work.staging, s, cfg.pack.seq_length, cfg.shards.max_shard_bytes,
                                       quality=bool(cfg.filters.quality.model)) for s in SPLITS}
        self.next = 0   # the next chunk to pack

    def task(self, index: int, keep: np.ndarray) -> tuple:
        """The tokenize_chunk task of a chunk."""
        return index, np.packbits(keep).tobytes(), self.model

    def add(self, marker: dict, parts: dict | None = None) -> None:
        """Pack the chunk of a tokenize_chunk marker: the next one in input order. `parts`: its
        SplitTokens by split where this process tokenized it, else read from its file."""
        i, work = marker["index"], self.work
        if i != self.next:   # a bug, never bad input: packing out of order would change bytes
            raise RuntimeError(f"chunk {i} packed after chunk {self.next - 1}")
        self.run["chunks_reused"]["tokenize"] += bool(marker.get("reused"))
        if parts is None:
            with np.load(work.chunk_file(work.tokens, i, "npz")) as z:
                parts = {s: SplitTokens.load(z, s) for s in SPLITS}
        for s in SPLITS:
            part = parts[s]
            if part.tokens.size and int(part.tokens.max()) >= self.info.vocab_size:
                raise BuildError(f"chunk {i}: token id {int(part.tokens.max())} >= vocab size "
                                 f"{self.info.vocab_size}; {work.tokens} is damaged: delete it")
            self.packers[s].add(part.tokens, part.lens, part.doc_ids, part.quality)
        self.next += 1

    def close(self):
        """(SplitInfo per split, tail tokens dropped per split, document length histogram)."""
        closed = {s: self.packers[s].close() for s in SPLITS}
        bins = np.zeros(0, np.int64)
        for p in self.packers.values():
            bins = reporting.add_bins(bins, p.length_bins)
        hist = reporting.histogram_of_bins(bins)
        return {s: c[0] for s, c in closed.items()}, {s: c[1] for s, c in closed.items()}, hist


# ---------------------------------------------------------------------------------- finish

def _finish(out: Path, work: WorkDir, cfg: BuildConfig, config: dict, dedup: DedupResult,
            splits: dict, tails: dict, hist: dict, run: dict) -> BuildResult:
    if splits["train"].num_samples == 0:
        raise NoDatasetError(f"the train split holds fewer than seq_length + 1 = "
                             f"{cfg.pack.seq_length + 1} tokens: no sample; lower --seq-length or "
                             f"add text")
    tok = tokenizer_info(work.staging / "tokenizer.model")
    fingerprint = compute_fingerprint(cfg.pack.seq_length, tok.sha256, splits, config)
    manifest = Manifest(format_version=FORMAT_VERSION, fingerprint=fingerprint,
                        seq_length=cfg.pack.seq_length, tokenizer=tok, splits=splits,
                        config=config, versions=library_versions(), root=out)
    report = reporting.build_report(work, cfg, dedup, manifest, tails, hist, run)
    reporting.write_report(work.staging, report)
    remove_temps(work.staging)      # an interrupted step's leftovers never reach the dataset
    for entry in sorted(work.staging.iterdir()):      # publish: move, then the manifest last
        target = out / entry.name
        if target.is_dir():
            shutil.rmtree(target)
        os.replace(entry, target)
    write_manifest(out, manifest)
    work.remove()
    return BuildResult(out, manifest, report=report)


def library_versions() -> dict:
    versions = {"python": platform.python_version()}
    for lib in ("mindspore", "numpy", "sentencepiece", "pycld2", "pyarrow"):
        try:
            versions[lib] = importlib.metadata.version(lib)
        except importlib.metadata.PackageNotFoundError:
            versions[lib] = "absent"
    return versions
