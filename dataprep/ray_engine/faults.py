"""Fault injection for the tests of the Ray engine: a real SIGKILL of the worker process running a
task, or a task held until its node is removed. Off unless the driver's environment sets
DATAPREP_RAY_FAULT (the driver passes it to the tasks, whose processes do not share its environment):

  kill:STAGE:FLAG        the first task of STAGE to get here creates FLAG and kills its own process
                         (once: a retry finds FLAG and runs normally)
  hold:STAGE:FLAG:NODE   a task of STAGE on node NODE (hex node id) creates FLAG and sleeps until the
                         node is gone
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

ENV = "DATAPREP_RAY_FAULT"


def inject(spec: str, stage: str) -> None:
    if not spec:
        return
    kind, at, flag, *rest = spec.split(":")
    if at != stage:
        return
    flag = Path(flag)
    if kind == "kill":
        try:
            fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "hold":
        import ray
        if ray.get_runtime_context().get_node_id() != rest[0]:
            return
        flag.write_text(str(os.getpid()))
        while True:
            time.sleep(1)
