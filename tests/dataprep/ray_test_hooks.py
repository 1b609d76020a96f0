"""Faults for the Ray engine tests, installed with DATAPREP_HOOKS=<this file>:<spec>
(see mspretrain/dataprep/plan/hooks.py). Specs:

  kill:POINT:FLAG        the first task to reach POINT creates FLAG and SIGKILLs its own worker
                         process (once: the retry finds FLAG and runs normally)
  hold:POINT:FLAG:NODE   a task reaching POINT on node NODE (hex id) creates FLAG and sleeps until
                         the node is gone; on any other node it only waits 2 s
  litter:POINT:DIR       a task reaching POINT writes .tokenizer.tmp424242.model and .vocab into DIR
                         (what a step killed under another pid leaves behind)
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

HERE = Path(__file__).resolve()


def env(spec: str) -> str:
    """The DATAPREP_HOOKS value that installs this module with `spec`."""
    return f"{HERE}:{spec}"


def reached(point: str, spec: str) -> None:
    kind, at, flag, *rest = spec.split(":")
    if at != point:
        return
    flag = Path(flag)
    if kind == "kill":
        try:
            fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "litter":
        for ext in ("model", "vocab"):
            (flag / f".tokenizer.tmp424242.{ext}").write_bytes(b"partial")
    elif kind == "hold":
        import ray
        if ray.get_runtime_context().get_node_id() != rest[0]:
            time.sleep(2)     # slow the other node down, so the scheduler sends work to this one
            return
        flag.write_text(str(os.getpid()))
        while True:
            time.sleep(1)
