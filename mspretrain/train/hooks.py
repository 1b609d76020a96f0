"""Extension points around the training loop, empty in production.

`TRAIN_HOOKS=some.module` (an importable module path) makes `load()` import that module and call its
`install(hooks)`, which may replace the callbacks below. Nothing in the trainer branches on a test
setting: it always calls the callbacks, which do nothing unless a module replaced them. The test suite
uses this to trace every rank's steps, inject worker failures, and kill a spike rollback, the checkpoint
writer or an eval at chosen moments (tests/train/train_test_hooks.py).
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Callable

HOOKS_ENV = "TRAIN_HOOKS"


def _same_step(step, dist, model):
    return step


def _nothing(*args) -> None:
    return None


@dataclass
class Hooks:
    # (train step, DistInfo, model) -> the object the loop calls instead of the train step
    wrap_step: Callable = _same_step
    # (phase, step): the checkpoint writer reached `phase` ("model_written", "before_rename",
    # "before_latest"); with checkpoint.async it is called on the background writer thread
    checkpoint_phase: Callable = _nothing
    # (phase, step): a spike rollback decided after `step` reached `phase` ("rollback_start",
    # "rollback_loaded": the checkpoint reloaded and metrics.jsonl cut, the event not yet logged)
    spike_phase: Callable = _nothing
    # (open results file, records written so far, the next line): `train eval` is about to write it
    eval_record: Callable = _nothing


_loaded: Hooks | None = None


def load() -> Hooks:
    """The process's hooks: the defaults, changed by the module TRAIN_HOOKS names (loaded once)."""
    global _loaded
    if _loaded is None:
        hooks = Hooks()
        name = os.environ.get(HOOKS_ENV, "").strip()
        if name:
            try:
                module = importlib.import_module(name)
            except ImportError as e:
                raise ImportError(f"{HOOKS_ENV}={name!r}: cannot import it ({e})") from None
            module.install(hooks)
        _loaded = hooks
    return _loaded
