"""Worker processes that make batches from cursors, with bounded prefetch.

Workers are stateless: each runs its own copy of the BatchMaker (order.py), a pure function from a
cursor to a batch. The caller submits cursors at most `slots` batches ahead and takes results back in
submission order, so the output does not depend on the number of workers or the prefetch depth.

Batches travel through a shared anonymous memory map (one slot per batch in flight, inherited over
fork), not through pipes; each worker's result pipe carries only short "slot ready" or error
messages, each below PIPE_BUF so that the kernel writes it atomically and a worker killed
mid-message can never leave the caller blocked on half a message.

Failure handling: an exception in a worker comes back as a message naming the shard file and row; a
worker that dies (killed, segfault) or a pool that stops answering raises LoaderError in the caller
instead of hanging. Workers ignore SIGINT (the caller handles Ctrl-C and shuts them down) and exit on
their own when their parent process is gone; `close()`, or garbage collection of the pool, stops
and reaps them. A process forked from the caller (os.fork) does not own the workers: multiprocessing
would terminate them when that child exits (they are in its inherited list of children), so a fork
drops them from the child's list.
"""
from __future__ import annotations

import mmap
import multiprocessing as mp
import multiprocessing.process
import os
import signal
import time
import traceback
import weakref
from collections.abc import Callable
from multiprocessing.connection import Connection, wait

import numpy as np

from mspretrain.common.errors import MspretrainError


class LoaderError(MspretrainError, RuntimeError):
    """An error of the loader (bad arguments, bad state, a failed or dead worker)."""


class WorkerError(LoaderError):
    """A worker failed to produce a batch; the message names the shard file and row."""


POLL_S = 0.2
MAX_MESSAGE = 3000          # bytes of error text per message: keeps each message under PIPE_BUF


Layout = dict[str, tuple[tuple[int, ...], np.dtype]]


def _slot_views(buffer: mmap.mmap, layout: Layout, slot: int) -> dict[str, np.ndarray]:
    """Numpy views of slot `slot`: the arrays of `layout`, back to back, 8-byte aligned."""
    views, offset = {}, slot * _slot_bytes(layout)
    for name, (shape, dtype) in layout.items():
        views[name] = np.ndarray(shape, dtype=dtype, buffer=buffer, offset=offset)
        offset += _aligned(int(np.prod(shape)) * dtype.itemsize)
    return views


def _slot_bytes(layout: Layout) -> int:
    return sum(_aligned(int(np.prod(shape)) * dtype.itemsize) for shape, dtype in layout.values())


def _aligned(n: int) -> int:
    return (n + 7) // 8 * 8


def _worker_main(make_batch: Callable[[int], dict], buffer: mmap.mmap, layout: Layout,
                 tasks: Connection, results: Connection, parent_pid: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        if not tasks.poll(1.0):
            if os.getppid() != parent_pid:       # orphaned: the caller died without closing us
                return
            continue
        item = tasks.recv()
        if item is None:
            return
        cursor, slot = item
        try:
            batch = make_batch(cursor)
            for name, view in _slot_views(buffer, layout, slot).items():
                view[...] = batch[name]
            results.send((cursor, None))
        except BaseException as e:               # report everything; the caller decides
            detail = "".join(traceback.format_exception_only(type(e), e)).strip()
            if type(e).__name__ == "ShardError":  # names the file and row: the whole story
                text = detail
            else:
                trace = "".join(traceback.format_tb(e.__traceback__)[-3:])
                text = f"{detail}\n(in worker pid {os.getpid()}; innermost frames:\n{trace})"
            results.send((cursor, text.encode()[:MAX_MESSAGE].decode(errors="ignore")))


class WorkerPool:
    """`num_workers` forked processes running `make_batch(cursor)`, and `slots` shared batch buffers.

    `submit(cursor)` hands a batch to the next worker in turn (at most `slots` outstanding);
    `result(cursor)` returns it (copies). Each worker has its own task and result pipe, so no lock is
    shared between processes and a dead worker cannot block the others.
    """

    def __init__(self, make_batch: Callable[[int], dict], layout: Layout, num_workers: int, slots: int,
                 timeout_s: float):
        ctx = mp.get_context("fork")    # the shared map and the batch maker are inherited, not pickled
        self.timeout_s, self.layout = timeout_s, layout
        self._buffer = mmap.mmap(-1, slots * _slot_bytes(layout))
        task_pipes = [ctx.Pipe(duplex=False) for _ in range(num_workers)]      # (reader, writer)
        result_pipes = [ctx.Pipe(duplex=False) for _ in range(num_workers)]
        self._tasks = [w for _, w in task_pipes]
        self._results = [r for r, _ in result_pipes]
        self._pending: dict[int, int] = {}       # cursor -> slot
        self._done: dict[int, str | None] = {}
        self._free = list(range(slots))
        self._turn = 0
        self.procs = [ctx.Process(target=_worker_main, name=f"loader-worker-{i}", daemon=True,
                                  args=(make_batch, self._buffer, layout, task_pipes[i][0],
                                        result_pipes[i][1], os.getpid()))
                      for i in range(num_workers)]
        self._finalizer = weakref.finalize(self, _shutdown, os.getpid(), self.procs,
                                           self._tasks + self._results, self._buffer)
        for p in self.procs:
            p.start()
        _LIVE_POOLS.add(self)
        for conn in [r for r, _ in task_pipes] + [w for _, w in result_pipes]:
            conn.close()                         # the workers' ends

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def submit(self, cursor: int) -> None:
        if not self._free:
            raise LoaderError("internal: more batches submitted than prefetch slots")
        self._pending[cursor] = slot = self._free.pop()
        self._tasks[self._turn].send((cursor, slot))
        self._turn = (self._turn + 1) % len(self._tasks)

    @property
    def in_flight(self) -> int:
        """Batches submitted and not yet taken back."""
        return len(self._pending)

    def result(self, cursor: int) -> dict[str, np.ndarray]:
        what = f"the batch at cursor {cursor}"
        deadline = time.monotonic() + self.timeout_s
        sentinels = {p.sentinel: p for p in self.procs}
        while cursor not in self._done:
            ready = wait(self._results + list(sentinels), timeout=POLL_S)
            for conn in ready:
                if conn in sentinels:
                    continue
                try:
                    got, error = conn.recv()
                except EOFError:                 # its writer is gone: the worker died
                    worker = self.procs[self._results.index(conn)]
                    worker.join(1.0)
                    raise LoaderError(self._death(worker, what)) from None
                self._done[got] = error
            if cursor in self._done:
                break
            dead = [p for p in self.procs if p.exitcode is not None]
            if dead:
                raise LoaderError(self._death(dead[0], what))
            if time.monotonic() > deadline:
                raise LoaderError(f"no batch from the loader workers in {self.timeout_s:.0f} s "
                                  f"(waiting for {what})")
        error = self._done.pop(cursor)
        slot = self._pending.pop(cursor)
        if error is not None:
            raise WorkerError(f"loader worker failed on {what}: {error}")
        batch = {name: view.copy() for name, view in _slot_views(self._buffer, self.layout, slot).items()}
        self._free.append(slot)
        return batch

    def close(self) -> None:
        self._finalizer()

    @staticmethod
    def _death(worker, what: str) -> str:
        return (f"loader worker {worker.name} (pid {worker.pid}) died with exit code {worker.exitcode} "
                f"while {what} was pending")


_LIVE_POOLS: weakref.WeakSet = weakref.WeakSet()


def _disown_workers_after_fork() -> None:
    """In a child of os.fork: the caller's workers are not this process's children. Left in
    multiprocessing's list, its exit handler would SIGTERM them (they are daemons), breaking the
    caller's Loader with a BrokenPipeError."""
    for pool in list(_LIVE_POOLS):
        for p in pool.procs:
            multiprocessing.process._children.discard(p)


os.register_at_fork(after_in_child=_disown_workers_after_fork)


def _shutdown(owner: int, procs: list, conns: list[Connection], buffer: mmap.mmap) -> None:
    """Stop and reap every worker: ask politely, then SIGTERM, then SIGKILL."""
    if os.getpid() != owner:      # a forked copy of the caller: these workers are not its children
        return
    for p, conn in zip(procs, conns):             # conns starts with the task pipes, in worker order
        if p.is_alive():
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
    deadline = time.monotonic() + 1.0
    for p in procs:
        if p.pid is not None:
            p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.pid is not None and p.is_alive():
            p.terminate()
            _continue(p.pid)     # a stopped process acts on SIGTERM only once continued
            p.join(1.0)
        if p.pid is not None and p.is_alive():
            p.kill()
            p.join(1.0)
    for conn in conns:
        conn.close()
    try:
        buffer.close()
    except BufferError:       # a view is still alive somewhere; the map goes with it
        pass


def _continue(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass
