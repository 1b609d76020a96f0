"""A Ctrl-C that a library swallows is raised again at the next check while the command runs; the
command's handler and anything pending go away with it."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

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


def test_an_interrupt_while_workers_start_with_tasks_queued_ends_at_once(tmp_path):
    """The hang's mechanism, made certain: workers still starting, 1 MiB tasks queued behind them
    (cancellable futures; a feeder thread blocked on the full pipe), a Ctrl-C. The old pool
    cancelled those futures itself; the executor's manager thread then died on them
    (InvalidStateError, a traceback) and the exit joined the blocked feeder for good, in about a
    third of the tries: six processes at once."""
    from dataprep_helpers import REPO
    child = Path(__file__).parents[1] / "pool_interrupt_child.py"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, str(child)], cwd=tmp_path, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
             for _ in range(6)]
    try:
        for proc in procs:
            try:
                _, err = proc.communicate(timeout=LIMIT_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the interrupted pool did not let its process end in {LIMIT_S} s")
            assert proc.returncode == 130 and err.strip() == "interrupted", (proc.returncode, err)
            assert _group_gone(proc.pid), "worker processes left behind"
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()


# A Ctrl-C at any moment of a build (modules importing, workers spawning and unpickling their
# set-up, chunks in flight, the tokenizer training, shards being written) ends it within seconds
# with one line, signalled to the main process alone (`kill -INT PID`) or to its whole group (a
# terminal's Ctrl-C); the workers die, and a rerun resumes. The build runs from a copy of the
# package with nothing compiled (a fresh clone): its workers take seconds to start, the window in
# which the old pool hung for good (a future cancelled while tasks queued behind the start-up killed
# the executor's manager thread, and the exit joined a feeder thread blocked on a pipe no worker
# read: about one build in three interrupted there). The demo config's 256 KiB chunks are larger
# than a pipe's buffer, so the feeder blocks. Python's own start-up (before any project line runs)
# is test_console.py's.
DELAYS_S = (0.2, 0.5, 0.8, 1.1, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.5)

# a hang never ends; a loaded 2-core machine may need tens of seconds to import and clean up
LIMIT_S = 90


def _fresh_clone(root: Path) -> Path:
    """The package's sources without a single compiled module, as in a fresh clone."""
    from dataprep_helpers import REPO
    shutil.copytree(REPO / "mspretrain", root / "mspretrain",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return root


def _start_build(clone: Path, out: Path) -> subprocess.Popen:
    from dataprep_helpers import REPO
    cmd = [sys.executable, "-m", "mspretrain.dataprep", "build", str(REPO / "demo" / "corpus"),
           "--out", str(out), "--config", str(REPO / "configs" / "dataprep-demo.yaml"), "--no-progress"]
    env = {**os.environ, "PYTHONPATH": str(clone), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.Popen(cmd, cwd=clone, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def _group_gone(pgid: int, timeout: float = 10) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_ctrl_c_at_any_moment_ends_the_build_within_seconds(tmp_path):
    """At each delay two builds start together; one gets SIGINT to its pid, the other to its group.
    Then the most advanced interrupted build is rerun: it resumes and writes the straight build's
    bytes."""
    from dataprep_helpers import REPO, dataset_bytes

    from mspretrain.dataprep.cli import main as dataprep_main
    clone = _fresh_clone(tmp_path / "clone")
    outs = []
    for k, delay in enumerate(DELAYS_S):
        procs = {how: _start_build(clone, tmp_path / f"{how}-{k}" / "data") for how in ("pid", "group")}
        try:
            time.sleep(delay)
            finished = {how for how, proc in procs.items() if proc.poll() is not None}
            for how, send in (("pid", os.kill), ("group", os.killpg)):
                try:
                    send(procs[how].pid, signal.SIGINT)
                except ProcessLookupError:      # it ended between the poll and the signal
                    finished.add(how)
            t0 = time.monotonic()
            for how, proc in procs.items():
                try:
                    _, err = proc.communicate(timeout=max(1.0, LIMIT_S - (time.monotonic() - t0)))
                except subprocess.TimeoutExpired:
                    pytest.fail(f"SIGINT to the {how} at {delay} s: the build did not end in {LIMIT_S} s")
                out = tmp_path / f"{how}-{k}" / "data"
                if how in finished:     # before the signal (a fast machine, the last delays)
                    assert proc.returncode == 0 and (out / "manifest.json").is_file(), err
                    continue
                if proc.returncode == -signal.SIGINT and not err.strip() and \
                        (out / "manifest.json").is_file():
                    continue    # it had ended, in the interpreter's last steps (SIGINT's default back)
                _check_interrupted(proc, err, out, f"{how} {delay} s")
                outs.append(out)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.communicate()
    assert len(outs) >= len(DELAYS_S), "most builds must be interrupted, not finished"

    argv = [str(REPO / "demo" / "corpus"), "--config", str(REPO / "configs" / "dataprep-demo.yaml"),
            "--no-progress"]
    resumed = outs[-1]
    assert dataprep_main(["build", argv[0], "--out", str(resumed), *argv[1:]]) == 0
    assert dataprep_main(["build", argv[0], "--out", str(tmp_path / "straight"), *argv[1:]]) == 0
    assert dataset_bytes(resumed) == dataset_bytes(tmp_path / "straight")


def _check_interrupted(proc, err: str, out: Path, what: str) -> None:
    """An interrupted build: one line, exit 130, no process left (a Ctrl-C is never lost)."""
    assert "Traceback" not in err and "Exception ignored" not in err, (what, err)
    assert _group_gone(proc.pid), f"{what}: worker processes left behind"
    # 130, or killed by SIGINT: CPython exits so when a Ctrl-C hit C code that ran Python source
    # (PyRun_String) even though the exception was handled; the line is printed first
    assert proc.returncode in (130, -signal.SIGINT), (what, proc.returncode, err)
    line = err.strip().splitlines()[-1]
    assert line == "dataprep: interrupted" or line.startswith(
        f"dataprep build: interrupted; the finished work is kept in {out}/.build"), (what, err)


def test_the_resource_tracker_says_nothing_about_a_semaphore_already_gone():
    """A Ctrl-C between an exit handler's unlink of a semaphore and its unregistering leaves a name
    the tracker cannot unlink: the pool's tracker does not print that under the command's line."""
    from dataprep_helpers import REPO
    snippet = ("import os\nfrom multiprocessing import resource_tracker\n{start}\n"
               "resource_tracker.register('/mp-gone-already', 'semaphore')\nos._exit(0)\n")
    quiet = ("from mspretrain.dataprep.executor.local import _start_quiet_resource_tracker\n"
             "_start_quiet_resource_tracker()")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTHONWARNINGS", None)
    for start, says in ((quiet, ""), ("resource_tracker.ensure_running()", "No such file")):
        r = subprocess.run([sys.executable, "-c", snippet.format(start=start)], env=env,
                           capture_output=True, text=True, timeout=60)
        time.sleep(0.5)         # the tracker's warning comes when it sees the pipe close
        assert r.returncode == 0
        assert (says in r.stderr) if says else not r.stderr.strip(), r.stderr
