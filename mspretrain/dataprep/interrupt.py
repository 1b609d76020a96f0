"""Ctrl-C that is never lost, and never lands where it would leave something behind.

Python raises KeyboardInterrupt wherever the main thread happens to be, and a few places drop it: an
exception in importlib's module-lock callback during a lazy import is printed as "Exception ignored"
and discarded, and the build then ran to its end (seen about once in 30 interrupts of a small
build). While a command runs (`catching()`), the handler remembers the interrupt, and `check()`,
called between chunks, raises it again.

A few steps must not be cut in the middle: starting the worker processes (a process started but not
yet recorded by the pool could not be stopped, and the interpreter's exit would wait for it). Inside
`deferred()` the handler only remembers the interrupt; it is raised when the block ends.
"""
from __future__ import annotations

import contextlib
import signal
import threading

_pending = False
_deferring = 0


@contextlib.contextmanager
def catching():
    """Ctrl-C raises KeyboardInterrupt, as by default, and is remembered for `check()` until the
    block ends; the previous handler is restored then. Only in the main thread, the one Python
    delivers signals to (a command run in another thread keeps the handler it has)."""
    global _pending
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_interrupt(signum, frame):
        global _pending
        _pending = True
        if not _deferring:
            raise KeyboardInterrupt

    _pending = False
    before = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
        _pending = False


@contextlib.contextmanager
def deferred():
    """A Ctrl-C inside the block (within `catching()`) is raised when the block ends, not inside it.
    Outside `catching()` (a build called as a library), Python's own handler applies."""
    global _deferring
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    check()


def check() -> None:
    """Raise KeyboardInterrupt again if a Ctrl-C was received (inside `catching()`) and swallowed."""
    if _pending and not _deferring:
        raise KeyboardInterrupt
