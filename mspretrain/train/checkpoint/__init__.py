"""Checkpoints: RUN/checkpoints/step_XXXXXXXX/{model.ckpt or model.safetensors, state.json} and
RUN/checkpoints/latest.

A checkpoint is written into `.tmp-step_XXXXXXXX`, every file fsynced, then renamed; `latest` moves
last, atomically. A process killed at any moment leaves `latest` naming a complete checkpoint (or no
`latest`); stale temporary directories go on the next start. state.json records the sha256 and size of
every other file, so a flipped bit or a truncated file is an error naming it, never a silent resume;
`--resume auto` takes the newest checkpoint that passes those checks, whatever `latest` says.

The room, by module: `layout` (names and places), `format` (the model file's bytes, in
ms.save_checkpoint's format; `safetensors_file`: checkpoint.format safetensors), `store` (the atomic
write, the checks, reading back), `background` (`checkpoint.async`), `resume` (what a resume restores),
`policy` (which config changes a resume accepts), `reshard` (a resume on another parallel layout),
`diskspace`. The names below are what the rest of the trainer uses.
"""
from mspretrain.train.checkpoint.background import WRITER_NICE, BackgroundWriter
from mspretrain.train.checkpoint.format import (CheckpointError, HostTensor, ModelImage, Pacer, file_digest,
                                                host_copy, load_file, model_format, write_model_file)
from mspretrain.train.checkpoint.layout import (FILES_KEY, FORMATS, LATEST, MODEL_FILE, MODEL_FILES, RESHARDED,
                                                STATE_FILE, checkpoints_root, latest_checkpoint, list_checkpoints,
                                                model_file, remove_stale_temps, repoint_latest, step_dir_name)
from mspretrain.train.checkpoint.store import (check_checkpoint, find_resumable, load_params, read_state,
                                               verify_files, write_checkpoint)

__all__ = ["BackgroundWriter", "CheckpointError", "FILES_KEY", "FORMATS", "HostTensor", "LATEST", "MODEL_FILE",
           "MODEL_FILES", "ModelImage", "Pacer", "RESHARDED", "STATE_FILE", "WRITER_NICE", "check_checkpoint",
           "checkpoints_root", "file_digest", "find_resumable", "host_copy", "latest_checkpoint",
           "list_checkpoints", "load_file", "load_params", "model_file", "model_format", "read_state",
           "remove_stale_temps", "repoint_latest", "step_dir_name", "verify_files", "write_checkpoint",
           "write_model_file"]
