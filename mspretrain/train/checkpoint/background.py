"""`checkpoint.async`: one checkpoint write at a time on a background thread, paced and below the
training threads' priority.

MindSpore's own `save_checkpoint(async_save="thread")` is not used: it writes only the file (no fsync,
no digest, no rename or `latest` after it), keeps an exception in its thread (logged, never returned),
and is waited for by looking up threads by name.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections import deque


from mspretrain.train.checkpoint.format import CheckpointError, ModelImage, Pacer
from mspretrain.train.checkpoint.layout import step_dir_name


class BackgroundWriter:
    """checkpoint.async: runs one checkpoint write at a time on a background thread.

    `start` waits for the write before it (so at most one is in flight, and checkpoints are published
    in step order); `check` (at every step boundary) and `wait` (at the run's end) raise the
    CheckpointError of a write that failed, which stops the run. A process killed during a write
    leaves its temporary directory and the previous `latest`, as a synchronous write would.

    The model file is written at a pace (`Pacer`): over `share` of the time until the next checkpoint
    (`every_steps` times the median interval between the last `check` calls, one per step), so that
    on a machine whose cores the training step fills, the write's CPU is taken a little from each of
    those steps rather than all from the first. 0.8: the thinner the spread the less each step pays
    (a 241 MB write on 2 cores: +40 ms a step over half the interval), and 0.2 of the interval is
    left for a write that runs slow to finish before the next checkpoint waits for it; the price is
    that a checkpoint is complete (and `latest`) later. `wait` lifts the pace (the write then finishes at
    full speed). Without `every_steps`, or before any step was timed, the write is not paced.

    The writing thread also runs below the training threads' priority (`_lower_priority`: SCHED_IDLE,
    or WRITER_NICE nice levels where the process could not take it out of SCHED_IDLE again; Linux
    sets both per thread): MindSpore's CPU kernels split each op over a pool of threads that
    wait for each other, so a writer taking a core from one of them held up the whole op (measured:
    a 241 MB write cost the steps beside it more wall time than the CPU it used); at the lower
    priority it runs in the time the pool leaves idle. `wait` raises the priority back where the
    process may (the training thread is waiting for it then)."""

    def __init__(self, every_steps: int = 0, share: float = 0.8):
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._step: int | None = None
        self.image = ModelImage()   # the snapshot, reused by the next checkpoint once this one is written
        self.every_steps, self.share = every_steps, share
        self._hurry = threading.Event()
        self._ticks: deque = deque(maxlen=33)         # time.monotonic() of the last `check` calls
        self._tid: int | None = None                  # the writing thread's id, once it lowered its priority

    def budget_s(self) -> float:
        """The seconds a write may take: `share` of the time until the next checkpoint (0: no pace)."""
        ticks = list(self._ticks)
        gaps = sorted(b - a for a, b in zip(ticks, ticks[1:]))
        if not gaps or self.every_steps <= 0:
            return 0.0
        return self.share * self.every_steps * gaps[len(gaps) // 2]

    def start(self, step: int, write) -> None:
        """Run `write(pace)` on the background thread (`pace`: the `Pacer` for write_checkpoint)."""
        self.wait()
        self._step = step
        self._hurry.clear()
        self._tid = None
        pace = Pacer(self.budget_s(), self._hurry)

        def run():
            try:
                self._tid = _lower_priority()
                write(pace)
            except BaseException as e:        # handed to the training thread by check / wait
                self._error = e
        self._thread = threading.Thread(target=run, name=f"checkpoint-{step_dir_name(step)}", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """At every step boundary: raise now if the write in the background has failed (returns at
        once otherwise); the time between two calls is a step's, for the pace."""
        self._ticks.append(time.monotonic())
        if self._thread is not None and not self._thread.is_alive():
            self.wait()

    def wait(self) -> None:
        if self._thread is not None:
            self._hurry.set()       # the training thread waits: no more pacing, nor a lower priority
            if self._thread.is_alive() and self._tid is not None:
                _restore_priority(self._tid)
            self._thread.join()
            self._thread = None
        if self._error is not None:
            e, self._error = self._error, None
            detail = str(e) if isinstance(e, CheckpointError) else f"{type(e).__name__}: {e}"
            raise CheckpointError(f"the background write of checkpoint step {self._step} failed, so the run "
                                  f"stops: {detail}") from e


WRITER_NICE = 10        # where SCHED_IDLE cannot be undone: a background write's niceness above the process's


def _lower_priority() -> int | None:
    """Put the calling thread below the training threads (Linux: per thread); its id, or None where
    the platform sets priorities per process only.

    SCHED_IDLE where this process may take a thread out of it again (`_idle_reversible`): the thread
    then runs only on a core no other thread wants, and a kernel-pool thread that wakes preempts it
    at once (at a nice level it may keep the core for a time slice, holding up the pool's op). Where
    it may not (an unprivileged process: RLIMIT_NICE), WRITER_NICE nice levels instead: a thread
    stuck in SCHED_IDLE would crawl on a machine busy with other work while the trainer waits."""
    if not sys.platform.startswith("linux"):
        return None
    tid = threading.get_native_id()
    try:
        if _idle_reversible():
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        else:
            base = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, min(19, base + WRITER_NICE))
    except OSError:
        return None
    return tid


def _restore_priority(tid: int) -> None:
    """Give thread `tid` the process's scheduling policy and priority again; without the privilege to
    raise a priority (RLIMIT_NICE, CAP_SYS_NICE) it keeps the lower one and finishes in the CPU time
    left to it (never stuck in SCHED_IDLE: `_lower_priority` uses it only where it can be undone)."""
    try:
        if os.sched_getscheduler(tid) == os.SCHED_IDLE:
            os.sched_setscheduler(tid, os.sched_getscheduler(os.getpid()), os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, os.getpid()))
    except OSError:
        pass


@functools.cache
def _idle_reversible() -> bool:
    """Whether a thread of this process may leave SCHED_IDLE once in it (Linux allows it within
    RLIMIT_NICE or with CAP_SYS_NICE). Probed once on a throwaway thread, which may stay in it."""
    answer = []

    def probe():
        tid = threading.get_native_id()
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(tid, os.sched_getscheduler(os.getpid()), os.sched_param(0))
            answer.append(True)
        except (OSError, AttributeError):       # AttributeError: a Python without SCHED_IDLE
            answer.append(False)
    t = threading.Thread(target=probe, name="checkpoint-priority-probe", daemon=True)
    t.start()
    t.join()
    return bool(answer and answer[0])
