"""Where checkpoints live: RUN/checkpoints/step_XXXXXXXX/, the `latest` pointer, pruning, and the names
of the files inside.
"""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from mspretrain.common.errors import MspretrainError
from mspretrain.common.files import atomic_write_text


class CheckpointError(MspretrainError, RuntimeError):
    """A checkpoint that cannot be written or read; the message names the path."""


CKPT_DIR = "checkpoints"


LATEST = "latest"


MODEL_FILE = "model.ckpt"
# checkpoint.format -> the model file's name; a step dir (or each rank_R/) holds exactly one of them
MODEL_FILES = {"ckpt": MODEL_FILE, "safetensors": "model.safetensors"}
FORMATS = tuple(MODEL_FILES)


STATE_FILE = "state.json"
STATE_FORMAT_VERSION = 1        # state.json's layout; a resume refuses a newer one


RESHARDED = "resharded"       # RUN/resharded/STEP: a resume's files transformed to a new layout (reshard.py)


FILES_KEY = "files"             # state.json: {relative path: {"sha256", "bytes"}} of every other file


STEP_RE = re.compile(r"^step_(\d{8})$")


RANK_DIGESTS = ".digests-rank_{}.json"     # a sharded write: each rank's digests, merged by the main rank


def model_file(model_dir) -> Path:
    """The model file of a step dir (or of its rank_R/): model.ckpt or model.safetensors, whichever it
    holds (a run may change checkpoint.format between saves); CheckpointError when it holds both or
    neither."""
    model_dir = Path(model_dir)
    found = [model_dir / name for name in MODEL_FILES.values() if (model_dir / name).is_file()]
    if len(found) == 1:
        return found[0]
    if found:
        raise CheckpointError(f"{model_dir}: holds both {' and '.join(MODEL_FILES.values())}; a checkpoint has "
                              f"one model file (checkpoint.format): remove the one its {STATE_FILE} does not list")
    raise CheckpointError(f"{model_dir}: neither {' nor '.join(MODEL_FILES.values())} found: not a complete "
                          f"checkpoint")


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def checkpoints_root(run_dir) -> Path:
    return Path(run_dir) / CKPT_DIR


def list_checkpoints(run_dir) -> list[Path]:
    """Complete (renamed) checkpoint directories, oldest first."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_RE.match(p.name)) and p.is_dir()]
    return [p for _, p in sorted(found)]


def latest_checkpoint(run_dir) -> Path | None:
    """The directory `latest` names, checked to be complete; None when there is no `latest`."""
    root = checkpoints_root(run_dir)
    pointer = root / LATEST
    if not pointer.exists():
        return None
    name = pointer_name(pointer)
    ckpt = root / name if name else None
    if ckpt is None or not (ckpt / STATE_FILE).is_file():
        raise CheckpointError(f"{pointer} names {name or pointer.read_bytes()[:40]!r}, which is not a "
                              f"complete checkpoint directory (`train launch --resume auto` finds the "
                              f"newest complete one; other commands take --checkpoint/--step)")
    return ckpt


def pointer_name(pointer: Path) -> str | None:
    """The checkpoint name in `latest`, or None when it holds anything else (garbage, binary)."""
    try:
        name = pointer.read_bytes().decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return name if STEP_RE.match(name) else None


def repoint_latest(run_dir, ckpt_dir) -> bool:
    """After a resume from `ckpt_dir` of this run: make `latest` name it if it names anything else
    (missing, garbage, a damaged checkpoint). Returns whether it changed."""
    root = checkpoints_root(run_dir)
    ckpt_dir = Path(ckpt_dir)
    if ckpt_dir.parent.resolve() != root.resolve() or not STEP_RE.match(ckpt_dir.name):
        return False
    pointer = root / LATEST
    if pointer.exists() and pointer_name(pointer) == ckpt_dir.name:
        return False
    atomic_write_text(pointer, ckpt_dir.name + "\n")
    return True


def remove_stale_temps(run_dir) -> None:
    """Temporary directories of a write that never finished (the process was killed)."""
    root = checkpoints_root(run_dir)
    if root.is_dir():
        for p in root.iterdir():
            if p.name.startswith(".tmp-"):
                shutil.rmtree(p) if p.is_dir() else p.unlink()


def move_aside(final: Path) -> None:
    """Never overwrite a checkpoint: the existing directory becomes STEP.replaced-N (not listed, not
    pruned; delete it when it is not wanted)."""
    n = 1
    while (aside := final.with_name(f"{final.name}.replaced-{n}")).exists():
        n += 1
    os.rename(final, aside)
    print(f"[train] {final} existed (from before this resume); moved it to {aside.name}",
          file=sys.stderr, flush=True)


def prune(run_dir, keep_max: int) -> None:
    """Remove the oldest checkpoints beyond keep_max; never the one `latest` names."""
    if keep_max <= 0:
        return
    latest = latest_checkpoint(run_dir)
    ckpts = list_checkpoints(run_dir)
    for old in ckpts[:-keep_max]:
        if latest is None or old.name != latest.name:
            shutil.rmtree(old)
