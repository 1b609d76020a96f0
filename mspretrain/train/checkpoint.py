"""Checkpoints: RUN/checkpoints/step_XXXXXXXX/{model.ckpt, state.json} and RUN/checkpoints/latest.

A checkpoint is written into `.tmp-step_XXXXXXXX`, every file fsynced, then renamed to its final name;
`latest` (one line: the directory name) is replaced atomically after that, last. A process killed at any
moment therefore leaves `latest` naming a complete checkpoint (or no `latest` at all); stale temporary
directories are removed on the next start. At most keep_max checkpoints are kept (never the latest).

model.ckpt holds the train cell's state parameters (weights, AdamW moments, the optimizer's step,
the loss-scale value and its clean-step counter). When the model is sharded each rank writes
`rank_R/model.ckpt` inside the same directory, and its parallel strategy as `strategy/rank_R.ckpt`
(beside the rank directories: see train.parallel.copy_strategy).

`on_phase(phase, step)` is called at the two moments that matter for crash safety: `before_rename`
(temp dir complete, not renamed) and `before_latest` (renamed, latest not yet updated); the trainer
passes train.hooks' callback (a no-op unless a hooks module replaced it: the kill-and-resume tests
SIGKILL the writer there).
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import mindspore as ms

from mspretrain.common.files import atomic_write_json, atomic_write_text, fsync_path
from mspretrain.common.fsmode import use_umask

CKPT_DIR = "checkpoints"
LATEST = "latest"
MODEL_FILE = "model.ckpt"
STATE_FILE = "state.json"
_STEP_RE = re.compile(r"^step_(\d{8})$")


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read; the message names the path."""


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def checkpoints_root(run_dir) -> Path:
    return Path(run_dir) / CKPT_DIR


def list_checkpoints(run_dir) -> list[Path]:
    """Complete (renamed) checkpoint directories, oldest first."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_RE.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir) -> Path | None:
    """The directory `latest` names, checked to be complete; None when there is no `latest`."""
    root = checkpoints_root(run_dir)
    pointer = root / LATEST
    if not pointer.exists():
        return None
    name = pointer.read_text().strip()
    ckpt = root / name
    if not _STEP_RE.match(name) or not (ckpt / STATE_FILE).is_file():
        raise CheckpointError(f"{pointer} names {name!r}, which is not a complete checkpoint directory")
    return ckpt


def remove_stale_temps(run_dir) -> None:
    """Temporary directories of a write that never finished (the process was killed)."""
    root = checkpoints_root(run_dir)
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(".tmp-"):
                shutil.rmtree(p) if p.is_dir() else p.unlink()


def write_checkpoint(run_dir, step: int, params: dict, state: dict, keep_max: int,
                     rank: int | None = None, is_main: bool = True, barrier=None,
                     add_files=None, on_phase=None) -> Path:
    """Write checkpoint `step` atomically and publish it as latest. `rank` set: per-rank model file
    (sharded); then every rank calls this, `barrier()` separates the rank writes from the rename.
    `add_files(tmp_dir)`: each rank's extra files (e.g. its parallel strategy), written into the
    temporary directory before the second barrier, so they are published with the checkpoint.
    `on_phase(phase, step)`: see the module docstring."""
    root = checkpoints_root(run_dir)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}"
    try:
        if is_main:
            root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
        if barrier:
            barrier()
        model_dir = tmp / f"rank_{rank}" if rank is not None else tmp
        model_dir.mkdir(exist_ok=True)
        model_path = model_dir / MODEL_FILE
        ms.save_checkpoint([{"name": name, "data": p} for name, p in params.items()], str(model_path))
        use_umask(model_path, readonly=True)    # save_checkpoint makes it owner-only
        fsync_path(model_path)
        if is_main:
            atomic_write_json(tmp / STATE_FILE, state)
        fsync_path(model_dir)
        if add_files:
            for path in add_files(tmp) or ():
                fsync_path(path)
                fsync_path(path.parent)
        if barrier:
            barrier()
        if not is_main:
            return final
        fsync_path(tmp)
        if on_phase:
            on_phase("before_rename", step)
        if final.exists():       # the same step again after a resume from an older checkpoint
            shutil.rmtree(final)
        os.rename(tmp, final)
        fsync_path(root)
        if on_phase:
            on_phase("before_latest", step)
        atomic_write_text(root / LATEST, final.name + "\n")
    except (OSError, RuntimeError, ValueError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"cannot write checkpoint {final}: {e} (earlier checkpoints are untouched)") from e
    prune(run_dir, keep_max)
    return final


def prune(run_dir, keep_max: int) -> None:
    """Remove the oldest checkpoints beyond keep_max; never the one `latest` names."""
    if keep_max <= 0:
        return
    latest = latest_checkpoint(run_dir)
    ckpts = list_checkpoints(run_dir)
    for old in ckpts[:-keep_max]:
        if latest is None or old.name != latest.name:
            shutil.rmtree(old)


def read_state(ckpt_dir) -> dict:
    path = Path(ckpt_dir) / STATE_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} not found: {ckpt_dir} is not a complete checkpoint") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None


def load_params(ckpt_dir, params: dict, rank: int | None = None, allow_extra: bool = False) -> None:
    """Copy the saved tensors into `params` (name -> Parameter); names and shapes must match exactly
    (`allow_extra`: the file may hold more, e.g. optimizer moments when only weights are wanted)."""
    path = Path(ckpt_dir) / (f"rank_{rank}" if rank is not None else "") / MODEL_FILE
    if not path.is_file():
        raise CheckpointError(f"{path} not found")
    saved = ms.load_checkpoint(str(path))
    missing = sorted(set(params) - set(saved))
    extra = [] if allow_extra else sorted(set(saved) - set(params))
    if missing or extra:
        raise CheckpointError(f"{path} does not match this model: missing {missing[:5]}, unexpected "
                              f"{extra[:5]} (was it written with another model config?)")
    for name, p in params.items():
        value = saved[name]
        if tuple(value.shape) != tuple(p.shape) or value.dtype != p.dtype:
            raise CheckpointError(f"{path}: {name} is {value.dtype}{tuple(value.shape)}, the model has "
                                  f"{p.dtype}{tuple(p.shape)}")
        p.set_data(value)


