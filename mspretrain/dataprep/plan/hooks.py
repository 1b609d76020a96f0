"""Extension points inside the plan's tasks, empty in production.

`DATAPREP_HOOKS=/path/to/hooks.py:ARG` in the driver's environment: the driver hands the value to
every task (task processes do not share its environment), and each task, at its named points, loads
that file once and calls its `reached(point, arg)`. Nothing in the engine branches on a test setting;
the test suite uses this to SIGKILL a task's worker process mid-task, or to hold a task on a node that
is then removed (tests/dataprep/ray_test_hooks.py).
"""
from __future__ import annotations

import functools
import importlib.util
import os

ENV = "DATAPREP_HOOKS"


def from_env() -> str:
    return os.environ.get(ENV, "")


def reached(spec: str, point: str) -> None:
    """Called by the tasks at `point` ("docs", "tokenizer", "tokenize", "write")."""
    if spec:
        path, _, arg = spec.partition(":")
        _load(path).reached(point, arg)


@functools.cache
def _load(path: str):
    spec = importlib.util.spec_from_file_location("dataprep_ray_hooks", path)
    if spec is None:
        raise ImportError(f"{ENV}: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
