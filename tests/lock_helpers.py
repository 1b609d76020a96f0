"""A process holding a directory lock (mspretrain.lock) until it is killed: for the lock tests."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

HOLD = """
import sys, time
from mspretrain.common.lock import {fn}
with {fn}(sys.argv[1], "x"):
    print("locked", flush=True)
    time.sleep(600)
"""


def hold(fn: str, path: Path) -> subprocess.Popen:
    """Another process holding the lock of `path` until it is killed."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(fn=fn), str(path)], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "locked"
    return proc


def kill(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    proc.stdout.close()
