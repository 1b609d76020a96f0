"""A run's checkpoints as one object: `find` the checkpoint to resume from, `load` it into a built
session, `save` a step (synchronously, or on the background thread with checkpoint.async), and
`check` / `wait` for a background write. Everything a resume restores and checks is here.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from mspretrain.train import data_check, hooks
from mspretrain.train.checkpoint import policy, reshard
from mspretrain.train.checkpoint.background import BackgroundWriter
from mspretrain.train.checkpoint.format import CheckpointError, host_copy
from mspretrain.train.checkpoint.layout import (LATEST, MODEL_FILE, STATE_FILE, STATE_FORMAT_VERSION,
                                                checkpoints_root, list_checkpoints, model_file)
from mspretrain.train.checkpoint.store import (check_checkpoint, find_resumable, load_params, read_state,
                                               write_checkpoint)
from mspretrain.train.parallel import distributed
from mspretrain.train.parallel.apply import copy_strategy, strategy_path
from mspretrain.train.step import batching


class Checkpointer:
    """The checkpoints of run `cfg.run.dir` as seen by this rank (`dist`)."""

    def __init__(self, cfg, dist):
        self.cfg, self.dist = cfg, dist
        self.run_dir = Path(cfg.run.dir)
        self.writer: BackgroundWriter | None = None      # checkpoint.async, once `start_background` ran

    def find(self, resume: str | None) -> Path | None:
        """The checkpoint to continue from, checked (its state.json against its contents, every file's
        digest), or None to start at step 0; never a start that would overwrite a checkpoint."""
        run_dir = self.run_dir
        if resume is None:
            existing = list_checkpoints(run_dir)
            if existing or (checkpoints_root(run_dir) / LATEST).exists():
                raise policy.ResumeError(f"{run_dir} already has checkpoints (newest: "
                                         f"{existing[-1].name if existing else '?'}); pass --resume auto to "
                                         f"continue it, or set run.dir to a new directory. Nothing was changed.")
            policy.check_fresh_start(run_dir)
            return None
        if resume == "auto":
            return find_resumable(run_dir)
        path = Path(resume)
        if not (path / STATE_FILE).is_file():
            raise policy.ResumeError(f"--resume {resume}: not a checkpoint directory (no {STATE_FILE})")
        check_checkpoint(path)
        return path

    def load(self, session, ckpt_dir: Path, loader, force: bool) -> dict:
        """Load weights, optimizer and loss-scale state and the loader cursor; returns state.json."""
        cfg, dist = self.cfg, self.dist
        state = read_state(ckpt_dir)
        check_state_version(state, ckpt_dir)
        if dist.is_main or not force:   # names the keys that differ; --force prints what it overrides
            policy.check_resume(state, cfg, loader.fingerprint, cfg.data.path or ", ".join(loader.dirs),
                                ckpt_dir, force)
        rank = dist.rank if dist.sharded else None
        if dist.sharded:        # compile first: it slices the parameters the rank's tensors are loaded into
            session.train_step.compile((batching.local_batch(cfg, dist.dp_size), loader.seq_length + 1))
        load_dir = self.resharded(state, ckpt_dir)
        params = session.train_step.state_parameters()
        load_params(load_dir, params, rank=rank, verify=False)    # `find` verified the files
        check_optimizer_step(params, state, ckpt_dir)
        loader.load_state_dict(state["loader"], force=force)
        return state

    def resharded(self, state: dict, ckpt_dir: Path) -> Path:
        """The checkpoint to load on this layout: `ckpt_dir` itself, or its transformation onto this run's
        (dp, mp, pp, optimizer shard) when they differ and either shards the model (reshard.py)."""
        cfg, dist = self.cfg, self.dist
        if "layout" not in state:       # written before layouts were recorded: resumed as then (same or dp)
            return ckpt_dir
        p = reshard.plan(reshard.saved_layout(state), reshard.layout_of(cfg, dist.world_size))
        if p.kind == "same":
            return ckpt_dir
        if dist.is_main:
            print(f"[train] {p.describe()}", flush=True)
        if not p.needs_transform:
            return ckpt_dir
        return reshard.transform(p, ckpt_dir, self.run_dir, dist.rank, strategy_path(cfg, dist).parent,
                                 barrier=(lambda: distributed.barrier(dist)) if dist.distributed else None,
                                 fmt=cfg.checkpoint.format)

    def start_background(self, session) -> None:
        """The main rank's background writer when checkpoint.async is on, its snapshot memory faulted
        in now rather than in the first checkpoint's step. A sharded model's ranks write their parts
        between barriers (collectives), which must not run beside the training step's own: there
        checkpoints stay synchronous (said once)."""
        cfg, dist = self.cfg, self.dist
        if not cfg.checkpoint.async_ or not dist.is_main:
            return
        if dist.sharded:
            print("[train] checkpoint.async: this model is sharded across ranks, whose checkpoint writes "
                  "synchronise with each other; writing checkpoints synchronously", file=sys.stderr, flush=True)
            return
        self.writer = BackgroundWriter(cfg.checkpoint.every_steps)
        self.writer.image.fill(host_copy(session.train_step.state_parameters(), copy=False),
                               fmt=cfg.checkpoint.format)

    def check(self) -> None:
        """Raise the CheckpointError of a background write that failed (at every step boundary)."""
        if self.writer:
            self.writer.check()

    def wait(self) -> None:
        """The background write in flight, finished (the run ends or rolls back with it complete)."""
        if self.writer:
            self.writer.wait()

    def save(self, step: int, session, loader, record: dict, bad_streak: int, extra: dict | None = None) -> None:
        """Checkpoint `step`; with a background writer the state is copied to host memory here and
        written on its thread while training goes on."""
        cfg, dist, run_dir, writer = self.cfg, self.dist, self.run_dir, self.writer
        ts = session.train_step
        state = {
            "format_version": STATE_FORMAT_VERSION,
            "step": step,
            "loader": loader.state_dict(),
            "loss_scale": {"value": float(ts.loss_scale.asnumpy()),
                           "good_steps": int(ts.good_steps.asnumpy()),
                           "dynamic": cfg.precision.dtype == "fp16"},
            "config_hash": cfg.hash(),
            "config": policy.config_record(cfg),
            "dataset": data_check.identity(loader),
            "dataset_fingerprint": loader.fingerprint,
            "consumed": loader.consumed(),      # per source: samples and tokens (train.data)
            "world_size": dist.world_size,
            "layout": reshard.record(reshard.layout_of(cfg, dist.world_size)),   # resume on another
            "bad_streak": bad_streak,
            "last_metrics": record,
            **(extra or {}),        # the spike guard's window and skipped ranges (observe/spike.py)
        }
        on_phase = hooks.load().checkpoint_phase
        if writer is not None:
            writer.wait()       # one write in flight; the free space is counted after the previous one
        if dist.is_main:        # a full disk stops the run before the write, every checkpoint intact
            from mspretrain.train.checkpoint.diskspace import check_free_space
            check_free_space(run_dir, ts.state_parameters(), cfg.checkpoint.keep_max)
        keep, fmt = cfg.checkpoint.keep_max, cfg.checkpoint.format
        if writer is not None:
            # the state at this step, copied into the file's image (the previous write has ended)
            image = writer.image.fill(host_copy(ts.state_parameters(), copy=False), fmt=fmt)
            state = json.loads(json.dumps(state))       # nor may the loop's later changes reach state.json
            writer.start(step, lambda pace: write_checkpoint(run_dir, step, image, state, keep,
                                                             on_phase=on_phase, pace=pace))
        elif dist.sharded:
            write_checkpoint(run_dir, step, ts.state_parameters(), state, keep, rank=dist.rank,
                             is_main=dist.is_main, barrier=lambda: distributed.barrier(dist),
                             add_files=strategy_files(cfg, dist), on_phase=on_phase, fmt=fmt)
        elif dist.is_main:
            write_checkpoint(run_dir, step, ts.state_parameters(), state, keep, on_phase=on_phase, fmt=fmt)


def strategy_files(cfg, dist):
    """The per-rank extra files of a sharded checkpoint: CKPT/strategy/rank_R.ckpt (None if unsharded)."""
    if not dist.sharded:
        return None

    def add(tmp_dir: Path) -> list[Path]:
        copied = copy_strategy(cfg, dist, tmp_dir)
        return [copied] if copied else []
    return add


def check_state_version(state: dict, ckpt_dir) -> None:
    """state.json without format_version is version 0 (same fields, read the same way); a newer
    version than this trainer's is refused."""
    version = state.get("format_version", 0)
    if not isinstance(version, int) or version > STATE_FORMAT_VERSION:
        raise policy.ResumeError(f"{ckpt_dir}: state.json format_version {version!r} is not one this "
                                 f"trainer reads (<= {STATE_FORMAT_VERSION}); resume it with the version "
                                 f"that wrote it")


def check_optimizer_step(params: dict, state: dict, ckpt_dir: Path) -> None:
    """The optimizer's own step counter (in the model file) counts the updates that were not skipped,
    so it can never exceed state.json's step: a step edited upwards or another run's weights."""
    counter = params.get("global_step")
    if counter is None:
        return
    updates = int(np.asarray(counter.asnumpy()).reshape(-1)[0])
    if updates > state["step"]:
        raise CheckpointError(f"{ckpt_dir / STATE_FILE}: step {state['step']}, but its {model_name(ckpt_dir)} "
                              f"holds {updates} optimizer updates; the state does not belong to these weights. "
                              f"Nothing was changed.")


def model_name(ckpt_dir: Path) -> str:
    """The name of `ckpt_dir`'s model file, for messages (model.ckpt when it cannot tell)."""
    try:
        return model_file(ckpt_dir).name
    except CheckpointError:
        return MODEL_FILE
