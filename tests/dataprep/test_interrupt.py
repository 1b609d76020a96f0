"""A Ctrl-C that a library swallows is raised again at the next check, once, until handled."""
from __future__ import annotations

import os
import signal
import time

import pytest

from dataprep import interrupt


def _swallowing_library_call():
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)           # the handler raises here
    except KeyboardInterrupt:   # what importlib's lock callback does with it, in effect
        pass


def test_a_swallowed_interrupt_is_raised_again_until_handled():
    before = signal.getsignal(signal.SIGINT)
    try:
        interrupt.install()
        interrupt.check()                   # nothing pending: no-op
        _swallowing_library_call()
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()               # still pending: every check until handled
        interrupt.handled()
        interrupt.check()
    finally:
        interrupt.handled()
        signal.signal(signal.SIGINT, before)
