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
`diskspace`. The names below are what the rest of the trainer uses; each is imported from its module
on first use, so that what needs only the layout (the msrun launcher, `train plan`, the console's
summary) does not import MindSpore (2.5 s) through `format`.
"""
from __future__ import annotations

import importlib

_MODULE_OF = {
    "background": ("WRITER_NICE", "BackgroundWriter"),
    "format": ("HostTensor", "ModelImage", "Pacer", "file_digest", "host_copy", "load_file",
               "model_format", "write_model_file"),
    "layout": ("CheckpointError", "FILES_KEY", "FORMATS", "LATEST", "MODEL_FILE", "MODEL_FILES", "RESHARDED",
               "STATE_FILE", "checkpoints_root", "latest_checkpoint", "list_checkpoints", "model_file", "remove_stale_temps",
               "repoint_latest", "step_dir_name"),
    "store": ("check_checkpoint", "find_resumable", "load_params", "read_state", "verify_files",
              "write_checkpoint"),
}
_NAMES = {name: module for module, names in _MODULE_OF.items() for name in names}
__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name not in _NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    globals()[name] = value         # the next lookup is a plain one
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
