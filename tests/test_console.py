"""A Ctrl-C at any moment of a console command (`dataprep`, `train`: the installed console scripts)
ends it with one line and exit 130, while its modules import (MindSpore's too) and while it runs.

What runs before the first line of `main()` is CPython's own start-up: the interpreter, `site` (the
.pth files; an editable install's finder alone imports pathlib and re), the console script's import
line: about the first 20-80 ms here. No Python program can guard that window; a Ctrl-C there gets
Python's own message. Those outcomes are told apart by their text (no frame of the project, or
Python killed before its handler was installed) and tolerated; everything later must be clean."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(sys.executable).parent


def _delays(step: float, n: int) -> tuple:
    return tuple(round(step * i, 3) for i in range(n))


def _interrupt(argv: list[str], delay: float, group: bool, cwd: Path) -> tuple[int | None, str]:
    """(exit code, stderr) of the command signalled after `delay` s; (None, "") if it had ended."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}      # this tree, whatever the venv installed
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        time.sleep(delay)
        if proc.poll() is not None:
            return None, ""
        try:
            (os.killpg if group else os.kill)(proc.pid, signal.SIGINT)
        except ProcessLookupError:      # it ended between the poll and the signal
            proc.communicate()
            return None, ""
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return proc.returncode, err


_PROJECT_FRAME = re.compile(r'File "[^"]*/mspretrain/')


def _python_starting(code: int, err: str) -> bool:
    """The Ctrl-C came before a line of the project ran: Python killed before it installed its
    handler (silent), or Python's own traceback without a single frame of the project (site, the
    console script's import line; "Fatal Python error: init_import_site" when it hit site)."""
    if code == -signal.SIGINT and not err.strip():
        return True
    return ("KeyboardInterrupt" in err and not _PROJECT_FRAME.search(err)
            and "interrupted" not in err)


def _check(prog: str, code: int, err: str, what: str) -> bool:
    """True: the command's own one line and exit 130; False: Python's start-up (tolerated)."""
    if _python_starting(code, err):
        return False
    assert "Traceback" not in err and "Exception ignored" not in err, (what, err)
    lines = [x for x in err.splitlines() if x.strip()]
    if code == -signal.SIGINT:
        # the command had ended (its own line said why) and Python was in its last steps, where
        # it restores SIGINT's default action: killed by it, which a shell reports as 130 too
        assert len(lines) == 1 and lines[0].startswith(f"{prog} "), (what, err)
        return True
    assert code == 130, (what, code, err)
    assert len(lines) == 1 and lines[0].startswith(f"{prog}") and "interrupted" in lines[0], (what, err)
    return True


@pytest.mark.slow
@pytest.mark.parametrize("prog, argv, delays", [
    # the first 0.6 s of a build: Python's start-up, the imports (pyarrow...), workers starting
    ("dataprep", ["build", "demo/corpus", "--out", "{tmp}/data", "--config", "configs/dataprep-demo.yaml",
                  "--no-progress"], _delays(0.03, 21)),
    # a command that ends by itself in about 1 s: it imports pydantic, yaml and matplotlib, compares
    # two runs' metrics, draws a plot, then Python exits
    ("train", ["compare", "{runs}/a", "{runs}/b", "--plot", "{tmp}/plot.png"], _delays(0.05, 18)),
])
def test_ctrl_c_in_the_first_moments_of_a_console_command_is_one_line(tmp_path, prog, argv, delays):
    script = SCRIPTS / prog
    assert script.is_file(), f"{script}: the console script is not installed (pip install -e .)"
    runs = tmp_path / "runs"
    for name in ("a", "b"):
        (runs / name).mkdir(parents=True)
        (runs / name / "metrics.jsonl").write_text("".join(
            f'{{"step": {i}, "loss": 1.5, "lr": 0.001, "grad_norm": 1.0}}\n' for i in (1, 2, 3)))
    # On a loaded machine Python's start-up takes longer and more of the given moments fall in it:
    # later moments, at the same spacing, are then tried too, until the command ends by itself
    # before the signal, so that the project's window is always exercised.
    step, want = delays[1], len(delays) // 2
    guarded = 0
    for k in range(3 * len(delays)):
        if k >= len(delays) and guarded >= want:
            break
        delay = round(step * k, 3)
        (tmp_path / str(k)).mkdir(exist_ok=True)
        cmd = [str(script), *(a.format(tmp=tmp_path / str(k), runs=runs) for a in argv)]
        code, err = _interrupt(cmd, delay, group=bool(k % 2), cwd=REPO)
        if code is None or (code == 0 and "Traceback" not in err):
            break                       # it had ended: every later moment is past its window
        guarded += _check(prog, code, err, f"{prog} at {delay} s")
    assert guarded >= want, guarded


@pytest.mark.slow
def test_ctrl_c_while_mindspore_imports_is_one_line(tmp_path):
    """`train launch` imports MindSpore (seconds) before it looks at the data: a Ctrl-C then is
    remembered and ends the command once the import is done, never a half-imported MindSpore."""
    cmd = [str(SCRIPTS / "train"), "launch", "--config", "configs/tiny.yaml",
           "--set", f"data.path={tmp_path}/none", f"run.dir={tmp_path}/run"]
    code, err = _interrupt(cmd, 1.0, group=True, cwd=REPO)
    assert _check("train", code, err, "train launch at 1.0 s"), err
    assert err.strip() == "train launch: interrupted"
    assert not (tmp_path / "run").exists()


def _run_demo(code: str) -> subprocess.CompletedProcess:
    """Run `code`, which defines `command()`, as the console command "demo" run by `console.run`."""
    code += "\nsys.exit(run('demo', lambda: command, exiting=True))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_an_object_left_half_built_by_ctrl_c_adds_nothing_to_the_line():
    """A Ctrl-C inside a library's constructor (matplotlib's pyparsing, mid-import) leaves an object
    whose __del__ fails: the command still ends with its one line, not "Exception ignored in ..."."""
    code = "\n".join([
        "import os, signal, sys",
        "from mspretrain.common.console import run",
        "class Half:",
        "    def __init__(self):",
        "        os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C while it is being built",
        "        self.expr = 1",
        "    def __del__(self):",
        "        self.expr                              # never set: AttributeError",
        "def command():",
        "    Half()",
        "    return 0",
    ])
    r = _run_demo(code)
    assert r.returncode == 130, r.stderr
    assert r.stderr.strip() == "demo: interrupted", r.stderr


def test_a_ctrl_c_a_library_turned_into_its_own_error_is_still_one_line():
    """A KeyboardInterrupt inside `__set_name__` (matplotlib's import) comes out as a RuntimeError
    chained to it: the command still ends with its one line and 130."""
    code = "\n".join([
        "import sys",
        "from mspretrain.common.console import run",
        "def command():",
        "    try:",
        "        raise KeyboardInterrupt",
        "    except KeyboardInterrupt as e:",
        "        raise RuntimeError('Error calling __set_name__') from e",
    ])
    r = _run_demo(code)
    assert r.returncode == 130, r.stderr
    assert r.stderr.strip() == "demo: interrupted", r.stderr


def test_a_ctrl_c_inside_a_library_that_hides_it_is_acted_on_after_the_block():
    """matplotlib's renderer, interrupted mid-draw, raises "ValueError: Invalid bounding box" with no
    trace of the Ctrl-C. Drawing runs under `ctrl_c_deferred`: the draw finishes, then the command
    ends with its one line and 130. The library stands in here as a function that does the same."""
    code = "\n".join([
        "import os, signal, sys, time",
        "from mspretrain.common.console import ctrl_c_deferred, run",
        "def draw():                          # turns a Ctrl-C into an error of its own",
        "    try:",
        "        os.kill(os.getpid(), signal.SIGINT)",
        "        time.sleep(0.2)",
        "    except KeyboardInterrupt:",
        "        hidden = True",
        "    else:",
        "        hidden = False",
        "    if hidden:",
        "        raise ValueError('Invalid bounding box')",
        "    print('drawn', flush=True)",
        "def command():",
        "    with ctrl_c_deferred():",
        "        draw()",
        "    print('after the block')",
        "    return 0",
    ])
    r = _run_demo(code)
    assert r.returncode == 130, (r.returncode, r.stderr)
    assert r.stderr.strip() == "demo: interrupted", r.stderr
    assert r.stdout.split() == ["drawn"], r.stdout
