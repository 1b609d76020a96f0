"""RUN/tensorboard/: every metric of metrics.jsonl as a TensorBoard scalar, written as it happens.

`tensorboard --logdir RUN/tensorboard` (or a parent of several runs) shows loss, val loss, lr, grad
norm, loss scale, tokens/s, MFU, data wait and step time. Tags: the metrics.jsonl key for a step
record (`loss`, `lr`, ...), `eval/<key>` for a validation record. TensorBoard stores float32: each
value is the float32 of the one in metrics.jsonl. A resumed run purges the events after the step it
resumed from, as metrics.jsonl is cut there, so the two always agree.
Needs the `viz` extra (tensorboardX); without it a one-line notice and metrics.jsonl only.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

TB_DIR = "tensorboard"
SKIP = {"step", "eval", "time"}


class TensorBoardMirror:
    def __init__(self, run_dir, resume_step: int):
        try:
            with _torch_hidden():
                from tensorboardX import SummaryWriter
        except ImportError:
            print("[train] tensorboardX not installed (pip install 'mspretrain[viz]'): no "
                  "RUN/tensorboard/ events, metrics.jsonl only", file=sys.stderr, flush=True)
            self._w = None
            return
        kw = {"purge_step": resume_step + 1} if resume_step else {}
        self._w = SummaryWriter(str(Path(run_dir) / TB_DIR), flush_secs=10, **kw)

    def write(self, record: dict) -> None:
        if self._w is None:
            return
        prefix = "eval/" if record.get("eval") else ""
        for key, value in record.items():
            if key in SKIP or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            self._w.add_scalar(prefix + key, float(value), record["step"])

    def close(self) -> None:
        if self._w is not None:
            self._w.close()


@contextmanager
def _torch_hidden():
    """tensorboardX's writer imports torch where it is installed, only to accept torch tensors (2.7 s
    of every training process's start here, each msrun worker's included); the mirror passes floats.
    While tensorboardX loads, `import torch` fails as if torch were absent (which tensorboardX
    handles); torch stays importable afterwards, and one already imported is left alone."""
    if "torch" in sys.modules:
        yield
        return
    sys.modules["torch"] = None     # an ImportError for `import torch`, by the import system's rule
    try:
        yield
    finally:
        del sys.modules["torch"]
