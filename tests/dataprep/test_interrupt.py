"""A Ctrl-C that a library swallows is raised again at the next check while the command runs; the
command's handler and anything pending go away with it."""
from __future__ import annotations

import os
import signal
import time

import pytest

from mspretrain.dataprep import interrupt


def _swallowing_library_call():
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1)           # the handler raises here
    except KeyboardInterrupt:   # what importlib's lock callback does with it, in effect
        pass


def test_a_swallowed_interrupt_is_raised_again_while_the_command_runs():
    before = signal.getsignal(signal.SIGINT)
    with interrupt.catching():
        interrupt.check()                   # nothing pending: no-op
        _swallowing_library_call()
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()               # every check until the command ends
    assert signal.getsignal(signal.SIGINT) is before
    interrupt.check()                       # nothing left over for the next command
    with interrupt.catching():
        interrupt.check()
