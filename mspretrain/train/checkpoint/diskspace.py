"""Disk before it fills: a checkpoint is written only when the disk can hold the whole rotation.

A checkpoint's size is known before it is written: the bytes of its parameters (weights, AdamW
moments, loss-scale state) plus a little for state.json and the file format. The rotation keeps
`checkpoint.keep_max` checkpoints and writes the next one before pruning the oldest, so the disk must
hold keep_max + 1 of them; what the existing checkpoints already occupy counts towards that. When it
cannot, the run stops (CheckpointError: `train launch` exits with its clear-error code, 2) with nothing written, so every earlier checkpoint
stays intact, and the message names the directory and the bytes needed.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

OVERHEAD = 1 << 16      # state.json, the checkpoint format's headers and names (~8 KB for the tiny model)


def checkpoint_bytes(params: dict) -> int:
    """Bytes the checkpoint's tensors take (shape x item size), plus OVERHEAD."""
    return sum(int(np.prod(p.shape, dtype=np.int64)) * _itemsize(p) for p in params.values()) + OVERHEAD


def _itemsize(p) -> int:
    import mindspore as ms
    return {ms.float64: 8, ms.int64: 8, ms.float32: 4, ms.int32: 4, ms.float16: 2, ms.bfloat16: 2,
            ms.int16: 2, ms.int8: 1, ms.uint8: 1, ms.bool_: 1}.get(p.dtype, 4)


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def check_free_space(run_dir, params: dict, keep_max: int) -> None:
    from mspretrain.train import checkpoint as ckpt

    root = ckpt.checkpoints_root(run_dir)
    probe = root if root.exists() else Path(run_dir)
    size = checkpoint_bytes(params)
    kept = ckpt.list_checkpoints(run_dir)[-keep_max:] if root.exists() else []
    held = sum(dir_bytes(p) for p in kept)
    needed = max(size, size * (keep_max + 1) - held)
    free = shutil.disk_usage(probe).free
    if free < needed:
        raise ckpt.CheckpointError(
            f"not enough disk for the next checkpoint in {root}: {needed:,} bytes needed "
            f"({size:,} per checkpoint x (checkpoint.keep_max={keep_max} + 1), less {held:,} held by "
            f"the existing ones), {free:,} free; nothing was written, the existing checkpoints are "
            f"intact. Free space, point run.dir elsewhere, or lower checkpoint.keep_max, then resume")
