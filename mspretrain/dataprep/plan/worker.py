"""What a process keeps while it runs a build's chunk functions (plan/chunks.py): its `Worker`, which
`worker_for(ctx)` gives every task of that process. A worker is a spawned process of the local
executor, a Ray worker, or the build's own process (run.workers 1); each builds its Worker on its
first task and keeps it while it serves the same build."""
from __future__ import annotations

import functools
from dataclasses import dataclass

from mspretrain.dataprep.dedup.detect import DedupConfig, exact_key
from mspretrain.dataprep.plan.layout import Ctx
from mspretrain.dataprep.steps.decontam import DecontamConfig
from mspretrain.dataprep.steps.filters import FilterConfig
from mspretrain.dataprep.steps.pii import PiiConfig
from mspretrain.dataprep.steps.pipeline import Pipeline, build_steps
from mspretrain.common.files import file_identity


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
    # rewritten under the same name makes another setup, and so another Worker
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


def worker_for(ctx: Ctx) -> Worker:
    """This process's Worker for the build of `ctx`: the same one for every task while the setup
    stays the same, a new one when it changes."""
    return _serving(worker_setup(ctx.cfg, ctx.work))


@functools.lru_cache(maxsize=1)   # one Worker per process: the setup it serves now
def _serving(setup: WorkerSetup) -> Worker:
    return Worker(setup)


def worker_setup(cfg, work) -> WorkerSetup:
    """What every process running the chunk functions needs, from the build config and its work dir
    (dataprep.config.BuildConfig, dataprep.workdir.WorkDir)."""
    files = [*cfg.decontam.files, *([cfg.filters.quality.model] if cfg.filters.quality.model else [])]
    return WorkerSetup(str(work.docs), str(work.tokens), cfg.filters, cfg.dedup,
                       cfg.pack.valid_fraction, cfg.pack.split_seed, cfg.pii, cfg.decontam,
                       tuple(file_identity(f) for f in files))


def pipeline_for(setup: WorkerSetup) -> Pipeline:
    """The document steps of `setup`, as every engine runs them."""
    return Pipeline(build_steps(setup.filters, setup.decontam, setup.pii), exact_key)
