"""Ctrl-C that is never lost. Python raises KeyboardInterrupt wherever the main thread happens to be,
and a few places drop it: an exception in importlib's module-lock callback during a lazy import is
printed as "Exception ignored" and discarded, and the build then ran to its end (seen about once in
30 interrupts of a small build). The handler remembers the interrupt, and `check()`, called between
chunks, raises it again until the command has handled it."""
from __future__ import annotations

import signal
import threading

_pending = False


def install() -> None:
    """Ctrl-C raises KeyboardInterrupt, as by default, and is remembered for `check()`. Only from the
    main thread, the one Python delivers signals to (a command run in another thread keeps the
    handler it has)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_interrupt(signum, frame):
        global _pending
        _pending = True
        raise KeyboardInterrupt
    signal.signal(signal.SIGINT, on_interrupt)


def check() -> None:
    """Raise KeyboardInterrupt again if a Ctrl-C was received and not handled yet."""
    if _pending:
        raise KeyboardInterrupt


def handled() -> None:
    global _pending
    _pending = False
