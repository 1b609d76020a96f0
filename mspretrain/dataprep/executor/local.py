"""`dataprep build` (run.engine local): the stage plan's tasks (plan/run.py) in N spawned worker
processes on this machine (`LocalExecutor` over a `WorkerPool`).

- 'spawn' start method: safe although the main process holds threads (and later MindSpore). Formats
  registered in the main process only (readers.register in a script) are loaded into every worker,
  so the workers read each file as the main process would.
- A stage's tasks are all submitted at once (their arguments are small: the outputs are files), and
  their results come back in task order.
- A worker that dies (OOM killer, SIGKILL) breaks the pool: the build stops with WorkerDied instead
  of waiting forever, and a rerun resumes from the completed tasks.
- Workers start together (a barrier), so one that spawned first does not take every task alone, and
  leave on their own if the main process is killed.
- A build that stops early (Ctrl-C, an error) kills its workers, and its exit must not wait on the
  executor's internals, or Python 3.11 can hang for good: the call queue's feeder thread blocks
  writing a task (one larger than a pipe's buffer) to a pipe no worker reads, and the exit
  joins that thread (CPython gh-107219, gh-132969). Only the executor's manager thread unblocks it
  (in `terminate_broken`), and that thread died (InvalidStateError) on a future its caller had
  cancelled: tasks queued behind workers that still start are cancellable. So the futures are never
  cancelled here (the shutdown cancels them in the manager thread), the call queue's exit join is
  cancelled before the workers are killed, and a Ctrl-C never lands inside an executor call, where
  it could leave a lock held (they run in `interrupt.deferred()`). A killed worker loses nothing:
  its outputs are written atomically and a rerun resumes. (Python 3.14 adds
  `ProcessPoolExecutor.kill_workers`.)
- Workers never see Ctrl-C (the main process reports it): they start with SIGINT blocked, so a
  terminal's Ctrl-C to the whole group cannot hit one before it has set SIGINT to be ignored.
"""
from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool

from mspretrain.dataprep import interrupt
from mspretrain.dataprep.executor.base import Executor, task_failed, timed_task
from mspretrain.dataprep.readers import in_process_sources, load_sources

# how often a wait for a worker's result looks for a swallowed Ctrl-C (interrupt.check)
_POLL_S = 0.2


class WorkerDied(RuntimeError):
    pass


_DIED = ("a worker process died (killed, out of memory, or failed to start?); rerun the same "
         "command to resume from the completed tasks")


class LocalExecutor(Executor):
    """The plan's tasks in a WorkerPool's processes, as many at once as it has workers."""

    def __init__(self, pool: "WorkerPool", progress: bool):
        super().__init__(progress)
        self.pool = pool

    def describe(self) -> dict:
        return {"engine": "local", "where": f"{self.pool.workers} worker processes on this machine",
                "workers": self.pool.workers}

    def _start(self, fn, calls: list[tuple]) -> list:
        return [self.pool.submit(timed_task, fn, *args) for args in calls]

    def _wait(self, handles: list) -> tuple[list, list]:
        with interrupt.deferred():     # a Ctrl-C meanwhile is raised when the wait ends
            finished, _ = wait(handles, timeout=_POLL_S, return_when=FIRST_COMPLETED)
        return [h for h in handles if h in finished], [h for h in handles if h not in finished]

    def _results(self, name: str, handles: list) -> list[dict]:
        out = []
        for h in handles:
            try:
                with interrupt.deferred():
                    out.append(h.result())
            except BrokenProcessPool:
                raise WorkerDied(_DIED) from None
            except Exception as e:     # the task's own error, raised in the worker
                raise task_failed(name, e) from None
        return out


class WorkerPool:
    """`with WorkerPool(n) as pool:` starts the workers when the block is entered and stops them
    when it ends (kills them if it ends by an exception). A worker builds what it keeps for a build
    on its first task (plan/worker.py)."""

    def __init__(self, workers: int):
        self.workers = workers
        self._sources = in_process_sources()
        self._pool = None

    def __enter__(self):
        try:
            # a Ctrl-C waits until every started worker is known to the executor (see close)
            with interrupt.deferred(), _sigint_blocked():
                self._start()
        except BaseException:
            self.close(wait=False)
            raise
        return self

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        _start_quiet_resource_tracker()
        ready = ctx.Barrier(self.workers)
        # blocked again: starting multiprocessing's resource tracker (for the barrier's semaphores,
        # in the first pool of a process) unblocks SIGINT in this thread, and the workers spawned
        # next would start with it open: a terminal's Ctrl-C then kills one while it imports, with
        # a traceback ("Fatal Python error: init_import_site")
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        self._pool = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_start_worker,
                                         initargs=(self._sources, os.getpid(), ready))
        # one submit per worker spawns them all now (the executor spawns lazily otherwise, and the
        # barrier needs all of them); not waited for: the main process reads the first chunks
        # while they start, and a worker that fails to start breaks the pool like one that dies
        for _ in range(self.workers):
            self._pool.submit(os.getpid)

    def submit(self, fn, *args):
        """fn(*args) in a worker: its future (a dead worker: WorkerDied)."""
        try:
            with interrupt.deferred():
                return self._pool.submit(fn, *args)
        except BrokenProcessPool:
            raise WorkerDied(_DIED) from None

    def close(self, wait: bool = True) -> None:
        """wait=True: let the workers finish (a build that ended well has nothing left for them).
        wait=False: a build that stops early kills them first (see the module docstring)."""
        if self._pool is None:
            return
        with interrupt.deferred():      # a second Ctrl-C waits until the workers are dead
            if not wait:
                self._kill_workers()
            self._pool.shutdown(wait=wait, cancel_futures=True)

    def _kill_workers(self) -> None:
        # the exit must not join the feeder thread: it may be blocked for good on a pipe that only
        # the killed workers read (cancelled first, so the manager thread never waits for it either)
        if self._pool._call_queue is not None:
            self._pool._call_queue.cancel_join_thread()
        # ProcessPoolExecutor has no public way to stop its processes before Python 3.14
        processes = list((self._pool._processes or {}).values())
        for p in processes:
            try:
                p.kill()
            except (OSError, ValueError):   # already gone, or closed
                pass
        for p in processes:
            with contextlib.suppress(ValueError, AssertionError):
                p.join(timeout=5)

    def __exit__(self, exc_type, exc, tb):
        self.close(wait=exc_type is None)


@contextlib.contextmanager
def _sigint_blocked():
    """SIGINT blocked in this thread: processes started inside inherit the mask (across exec), so
    they start with SIGINT held until `_start_worker` ignores it. The main process loses nothing:
    a SIGINT sent meanwhile is handled by another thread or when the block ends."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _start_quiet_resource_tracker() -> None:
    """multiprocessing's resource tracker (it unlinks the barrier's semaphores if this process dies)
    started without its warnings: a Ctrl-C that lands while an exit handler unlinks a semaphore
    leaves the name registered, and the tracker would then print "resource_tracker: ... No such
    file or directory" under the command's one line, about a semaphore that is already gone."""
    from multiprocessing import resource_tracker
    before = os.environ.get("PYTHONWARNINGS")
    os.environ["PYTHONWARNINGS"] = "ignore:resource_tracker:UserWarning"    # read by the tracker
    try:
        resource_tracker.ensure_running()
    finally:
        if before is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = before


def _start_worker(sources: list[str], parent: int, ready) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # Ctrl-C is the main process's to report
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    load_sources(sources)
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
