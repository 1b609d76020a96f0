"""`dataprep build`: raw corpus files -> a dataset directory (docs/contracts.md).

The build is one stage plan (plan/run.py; its stages are listed in plan/__init__.py) run by an
executor: this process (executor/inline.py, run.workers 1), worker processes on this machine
(executor/local.py, run.workers N) or a Ray cluster (executor/ray.py, run.engine ray). The plan's tasks write every intermediate to the work dir and
return small markers; the plan decides every byte, the executor only where a task runs, so DIR is
the same for either engine and any number of workers or nodes.

Determinism: chunk boundaries depend only on the inputs and `run.chunk_bytes`, work units only on
the inputs and `run.ray_unit_bytes`; every order-dependent decision follows input order.
report.json / report.md hold timings and worker pids, so they are the one part of DIR that differs
between runs; every other byte (manifest included) is identical.

Resume (workdir.py): every task's outputs and its marker live in DIR/.build/, written atomically.
A rerun of the same command skips every completed task and redoes the rest; the result is
byte-identical to an uninterrupted build. DIR/.build is removed on success. Guards: an unfinished
build with a different config, or a DIR holding a different dataset (or anything else), is an error
and nothing is touched; the same command on a finished identical build says so and succeeds.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from mspretrain.dataprep.config import BuildConfig, manifest_config
from mspretrain.dataprep.dedup.detect import describe
from mspretrain.dataprep.errors import BuildError, NoDatasetError
from mspretrain.dataprep.executor.base import Executor
from mspretrain.dataprep.executor.inline import InlineExecutor
from mspretrain.dataprep.executor.local import LocalExecutor, WorkerDied, WorkerPool
from mspretrain.dataprep.plan.run import PlanResult, hash_inputs, run_plan
from mspretrain.dataprep.readers import InputPathError, list_inputs
from mspretrain.dataprep.report import failure
from mspretrain.dataprep.report import summary as reporting
from mspretrain.dataprep.tokenizer.model import tokenizer_info
from mspretrain.dataprep.verify import file_faults
from mspretrain.dataprep.workdir import WorkDir
from mspretrain.dataprep.write.stray import remove_temps
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
    try:
        with _executor(cfg) as executor:
            return _build(out, files, cfg, executor, left_out)
    except WorkerDied as e:
        raise BuildError(str(e)) from None


@contextlib.contextmanager
def _executor(cfg: BuildConfig):
    if cfg.run.engine == "ray":
        from mspretrain.dataprep.executor.ray import ray_executor
        with ray_executor(cfg) as executor:
            yield executor
    elif cfg.run.workers == 1:
        yield InlineExecutor(cfg.run.progress)
    else:
        with WorkerPool(cfg.run.workers) as pool:
            yield LocalExecutor(pool, cfg.run.progress)


def _left_out_note(left_out: dict) -> str:
    if not left_out:
        return ""
    return " (left out: " + ", ".join(f"{len(v)} {k.replace('_', ' ')}"
                                      for k, v in left_out.items()) + ")"


def _build(out: Path, files, cfg: BuildConfig, executor: Executor, left_out: dict) -> BuildResult:
    """`left_out`: what list_inputs left out of the input directories, for the report."""
    executor.check_inputs(files)
    config = resolved_config(cfg, files, executor)
    created = not out.exists()
    done = _check_out(out, config, cfg)
    if done is not None:
        return BuildResult(out, done, already_built=True)
    work = WorkDir(out)
    if work.exists():
        _unpublish(out, work)
    else:
        work.create(work_owner(config, cfg))
    try:
        plan = run_plan(executor, files, cfg, work)
        return _finish(out, work, cfg, config, plan, left_out)
    except NoDatasetError as e:
        bad = failure.bad_records(work)
        _remove_work(out, work, created)
        failure.write_report(out, str(e), bad, e.docs_read)
        raise


def _remove_work(out: Path, work: WorkDir, created: bool) -> None:
    work.remove()
    if created and not any(out.iterdir()):
        out.rmdir()


# ---------------------------------------------------------------------------------- set-up

# The version of the work dir's intermediate files; bumped when they change, so that a rerun of a
# build killed under an older version is refused with a clear message, not failed mid-stage.
# 2: chunk files hold each document's split, tokens files the doc ids. 3: one stage plan for both
# engines (plan/).
WORK_LAYOUT = 3


def work_owner(config: dict, cfg: BuildConfig) -> dict:
    """The build a work dir belongs to (.build/build.json), which a rerun must equal to resume it:
    the config, the chunking, the work units and partitions, and the layout of the intermediate
    files (WORK_LAYOUT). Not the engine: a build killed under one resumes under the other."""
    return {"config": config, "chunk_bytes": cfg.run.chunk_bytes, "layout": WORK_LAYOUT,
            "partitions": cfg.run.ray_partitions, "unit_bytes": cfg.run.ray_unit_bytes}


def resolved_config(cfg: BuildConfig, files, executor: Executor) -> dict:
    """The manifest's config: settings, dedup scheme, tokenizer source and the inputs' checksums
    (hashed by the executor's workers)."""
    config = manifest_config(cfg)
    config["dedup_scheme"] = describe(cfg.dedup)
    if cfg.tokenizer.model:
        config["tokenizer"]["model"] = "sha256:" + sha256_file(cfg.tokenizer.model)
    sums = hash_inputs(executor, files)
    config["inputs"] = [{"file": f.rel, "bytes": f.path.stat().st_size, "sha256": s}
                        for f, s in zip(files, sums)]
    return config


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


# ---------------------------------------------------------------------------------- finish

def _finish(out: Path, work: WorkDir, cfg: BuildConfig, config: dict, plan: PlanResult,
            left_out: dict) -> BuildResult:
    splits = plan.splits
    if splits["train"].num_samples == 0:
        raise NoDatasetError(f"the train split holds fewer than seq_length + 1 = "
                             f"{cfg.pack.seq_length + 1} tokens: no sample; lower --seq-length or "
                             f"add text")
    tok = tokenizer_info(work.staging / "tokenizer.model")
    fingerprint = compute_fingerprint(cfg.pack.seq_length, tok.sha256, splits, config)
    manifest = Manifest(format_version=FORMAT_VERSION, fingerprint=fingerprint,
                        seq_length=cfg.pack.seq_length, tokenizer=tok, splits=splits,
                        config=config, versions=library_versions(), root=out)
    report = reporting.build_report(work, cfg, plan, manifest, left_out)
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
