"""The test suite's train.hooks module: TRAIN_HOOKS=train_test_hooks (with tests/train on PYTHONPATH).

TRAIN_TRACE_DIR=DIR: after each step, every rank appends to DIR/rank_R.jsonl the digests of the input
rows it took and of every state parameter it left (weights, optimizer moments), and its loss.
TRAIN_TRACE_FAULT="R:N:crash|hang|kill": rank R raises (blocks forever, SIGKILLs its own process) at
its N-th call of the train step, before running it (calls count on through a spike rollback).
TRAIN_TEST_CKPT_KILL="<phase>:<step>": the process SIGKILLs itself at `phase` of checkpoint `step`
(the writer's model_written | before_rename | before_latest) or of the spike rollback decided after
`step` (rollback_start | rollback_loaded, mspretrain/train/observe/spike.py).
TRAIN_TEST_CKPT_SLOW="<phase>:<step>:<seconds>[,...]": the writer sleeps there (inside a background write).
TRAIN_TEST_CKPT_FAIL="<phase>:<step>": the writer raises OSError there (a disk that fails mid-write).
TRAIN_TEST_CKPT_LOG=FILE: the writer appends {"phase", "step", "time", "thread"} to FILE at each phase
(after any sleep).
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import numpy as np

MODULE = "train_test_hooks"
TRACE_ENV = "TRAIN_TRACE_DIR"
FAULT_ENV = "TRAIN_TRACE_FAULT"
KILL_ENV = "TRAIN_TEST_CKPT_KILL"
SLOW_ENV = "TRAIN_TEST_CKPT_SLOW"
FAIL_ENV = "TRAIN_TEST_CKPT_FAIL"
LOG_ENV = "TRAIN_TEST_CKPT_LOG"
EVAL_KILL_ENV = "TRAIN_TEST_EVAL_KILL"     # N: SIGKILL `train eval` after N result lines and half of one


def env(**values: str) -> dict:
    """Environment for a `python -m mspretrain.train` subprocess that loads these hooks, plus `values`."""
    here = str(Path(__file__).resolve().parent)
    path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)
    return {"TRAIN_HOOKS": MODULE, "PYTHONPATH": path, **values}


def install(hooks) -> None:
    trace, fault = os.environ.get(TRACE_ENV), os.environ.get(FAULT_ENV)
    if trace or fault:
        hooks.wrap_step = lambda step, dist, model: TracedStep(step, dist, model, trace, fault)
    if any(os.environ.get(k) for k in (KILL_ENV, SLOW_ENV, FAIL_ENV, LOG_ENV)):
        hooks.checkpoint_phase = at_phase
        hooks.spike_phase = at_phase
    if os.environ.get(EVAL_KILL_ENV):
        hooks.eval_record = kill_eval_after


def at_phase(phase: str, step: int) -> None:
    here = f"{phase}:{step}"
    for item in filter(None, os.environ.get(SLOW_ENV, "").split(",")):
        where, _, seconds = item.rpartition(":")
        if where == here:
            time.sleep(float(seconds))
    if log := os.environ.get(LOG_ENV):
        import threading
        with open(log, "a") as f:
            f.write(json.dumps({"phase": phase, "step": step, "time": time.time(),
                                "thread": threading.current_thread().name}) + "\n")
    if os.environ.get(FAIL_ENV, "") == here:
        raise OSError(f"{FAIL_ENV}: injected write failure at {here}")
    if os.environ.get(KILL_ENV, "") == here:
        os.kill(os.getpid(), signal.SIGKILL)


def kill_eval_after(f, written: int, line: str) -> None:
    if written >= int(os.environ[EVAL_KILL_ENV]):
        f.write(line[: len(line) // 2])     # a torn line, as a kill mid-write leaves
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)


class TracedStep:
    def __init__(self, step, dist, model, directory: str | None, fault: str | None):
        self._step = step
        self._path = None
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            self._path = Path(directory) / f"rank_{dist.rank}.jsonl"
        self._dist, self._model, self._calls = dist, model, 0
        self._fault = parse_fault(fault) if fault else None

    def __getattr__(self, name):
        return getattr(self._step, name)

    def __call__(self, input_ids, lr):
        self._calls += 1
        if self._fault and self._fault[:2] == (self._dist.rank, self._calls):
            while self._fault[2] == "hang":
                time.sleep(60)
            if self._fault[2] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"{FAULT_ENV}: injected failure on rank {self._dist.rank} at call {self._calls}")
        result = self._step(input_ids, lr)
        if self._path:
            self._write(input_ids, lr, result)
        return result

    def _write(self, input_ids, lr, result) -> None:
        rows = [hashlib.sha1(np.ascontiguousarray(r).tobytes()).hexdigest()[:16] for r in np.asarray(input_ids)]
        params = self._step.state_parameters()
        digest = hashlib.sha256()
        for name in sorted(params):
            digest.update(name.encode())
            digest.update(params[name].asnumpy().tobytes())
        record = {"rank": self._dist.rank, "lr": float(lr), "rows": rows, "state": digest.hexdigest(),
                  "loss": float(result.loss), "grad_norm": float(result.grad_norm)}
        with open(self._path, "a") as f:
            f.write(json.dumps(record) + "\n")


def parse_fault(text: str) -> tuple[int, int, str]:
    try:
        rank, call, kind = text.split(":")
        if kind not in ("crash", "hang", "kill"):
            raise ValueError
        return int(rank), int(call), kind
    except ValueError:
        raise ValueError(f"{FAULT_ENV}={text!r}: expected RANK:CALL:crash|hang|kill") from None
