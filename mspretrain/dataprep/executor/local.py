"""The build's worker processes: N spawned processes that take chunks in input order and hand results
back in input order, with a bounded number of chunks in flight.

- 'spawn' start method: safe although the main process holds threads (and later MindSpore).
- `map_ordered(fn, tasks)` submits at most `2 * N` tasks ahead of the one being consumed, so memory
  stays bounded by the chunk size however large the corpus, and the main process can do the
  order-dependent work (dedup, packing, writing) while the workers run ahead.
- A worker that dies (OOM killer, SIGKILL) breaks the pool: the build stops with WorkerDied instead
  of waiting forever, and a rerun resumes from the completed chunks.
- Workers start together (a barrier), so one that spawned first does not take every chunk alone, and
  leave on their own if the main process is killed.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from mspretrain.dataprep import interrupt
from mspretrain.dataprep.stages import WorkerSetup, init_worker


class WorkerDied(RuntimeError):
    pass


class WorkerPool:
    def __init__(self, workers: int, setup: WorkerSetup):
        self.workers = workers
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Barrier(workers)
        self._pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_start_worker,
                                         initargs=(setup, os.getpid(), ready))
        # one submit per worker spawns them all now (the executor spawns lazily otherwise, and the
        # barrier needs all of them); not waited for: the main process reads the first chunks
        # while they start, and a worker that fails to start breaks the pool like one that dies
        for _ in range(workers):
            self._pool.submit(os.getpid)

    def map_ordered(self, fn, tasks, idle=None):
        """fn(task) for every task, computed in the workers, yielded in task order. While the next
        result is not ready, `idle()` (if given) does a piece of the main process's own work; it
        returns False when it has none left."""
        pending: deque = deque()
        try:
            for task in tasks:
                pending.append(self._pool.submit(fn, task))
                if len(pending) >= 2 * self.workers:
                    yield _next_result(pending, idle)
            while pending:
                yield _next_result(pending, idle)
        except BrokenProcessPool:
            raise WorkerDied("a worker process died (killed, out of memory, or failed to start?); "
                             "rerun the same command to resume from the completed chunks") from None
        finally:
            for f in pending:
                f.cancel()

    def close(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close(wait=exc_type is None)


def _next_result(pending: deque, idle):
    interrupt.check()     # a Ctrl-C that a library swallowed stops the build here
    while idle is not None and not pending[0].done() and idle():
        pass
    return pending.popleft().result()


def _start_worker(setup: WorkerSetup, parent: int, ready) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the main process's to report
    init_worker(setup)
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    try:
        ready.wait(timeout=60)
    except threading.BrokenBarrierError:
        pass


def _exit_with_parent(parent: int) -> None:
    """A main process killed with SIGKILL cannot stop its workers: they notice and leave."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)
