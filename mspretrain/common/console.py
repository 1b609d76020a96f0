"""The outermost layer of the console commands (`dataprep`, `train`, and their `python -m` forms):
their exit codes, and a Ctrl-C at any moment from the first line of `main()` on ends the command with
one line and exit 130.

- While the command's modules import, a KeyboardInterrupt would print Python's traceback (numpy even
  turns it into an ImportError), and importlib can drop one: a Ctrl-C is only remembered then, and
  acted on as soon as the imports are done.
- While the command runs, Ctrl-C is a KeyboardInterrupt as usual (each command says what it kept).
- While the interpreter exits after a console command (its exit handlers join threads and flush
  queues), a KeyboardInterrupt would print "Exception ignored ...": a Ctrl-C then ends the process
  at once, its output flushed.

What runs before `main()` is Python's own start-up (site, the console script's import line): the CLI
modules import nothing at module level, so that window is the interpreter's alone.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys

from mspretrain.common.errors import MspretrainError

OK = 0
FAILED = 1          # a runtime error: the data, a file, the disk, another process (one line, named)
USAGE = 2           # a usage error: a flag, a config key or value (argparse's code too)
INTERRUPTED = 130   # Ctrl-C (128 + SIGINT, as a shell reports it)


class UsageError(MspretrainError, ValueError):
    """The command line or the config asks for something that cannot work, whatever the files hold
    (a flag, a config key or value): exit 2. Everything a command finds wrong in the files, the run,
    the dataset, the disk or another process is a runtime error: exit 1."""


def runtime_error_line(e: BaseException) -> str:
    """One line for a runtime error: an OSError's reason and file, else the error's type and text."""
    if isinstance(e, OSError) and e.strerror:
        return f"{e.strerror}: {e.filename}" if e.filename else e.strerror
    return f"{type(e).__name__}: {e}"


def run(prog: str, load, exiting: bool, interrupted=None, held=None) -> int:
    """`load()` imports what the command needs (and parses its arguments); it returns a function that
    runs the command and returns its exit code. `interrupted()` gives the line a Ctrl-C prints when
    the command did not print its own (default: "PROG: interrupted"). `exiting`: the command is the
    process's (a console script, `python -m`), which ends when it returns. `held`: what
    `mspretrain.hold_ctrl_c()` returned on the first line of the caller's `main` (this
    module's import would be a window otherwise)."""
    if held is None:
        from mspretrain import hold_ctrl_c
        held = hold_ctrl_c()
    previous, hit = held
    if previous is None:        # not the main thread, or Ctrl-C is ignored (nohup, a background job)
        return load()()
    try:
        command = load()
    finally:
        quiet = exiting and previous is signal.default_int_handler
        signal.signal(signal.SIGINT, _raise_quietly if quiet else previous)
    late: list = []
    code, left = None, previous
    try:
        try:
            if hit:
                raise KeyboardInterrupt
            code = command()
        except KeyboardInterrupt:
            pass
        except Exception as e:      # a Ctrl-C that a library turned into its own error (an import
            if not _from_ctrl_c(e):     # in __set_name__ gives RuntimeError, numpy an ImportError)
                raise
        finally:    # the command is over: a Ctrl-C from here on cannot raise in the middle of this
            left = signal.getsignal(signal.SIGINT)
            signal.signal(signal.SIGINT, lambda signum, frame: late.append(signum))
        if code is None:
            code = INTERRUPTED
            print("\n" + (interrupted() if interrupted else f"{prog}: interrupted"), file=sys.stderr)
        elif late and exiting and left is not signal.SIG_IGN:
            code = INTERRUPTED
            print(f"\n{prog}: interrupted", file=sys.stderr)
    finally:
        if not exiting:
            signal.signal(signal.SIGINT, previous)
        elif left is signal.SIG_IGN:    # the command chose to ignore a second Ctrl-C (train launch)
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        else:
            _end_at_once_on_interrupt(prog, quiet=code == INTERRUPTED or code is None)
    return code


@contextlib.contextmanager
def ctrl_c_deferred():
    """A Ctrl-C inside the block is acted on when the block ends, by the handler that was there
    before it. For short work in C code that an interrupt leaves broken: matplotlib's renderer turns
    it into an error of its own ("ValueError: Invalid bounding box"), and its ft2font, interrupted
    mid-import, aborts the process at exit (a C++ static freeing a Python object too late)."""
    from mspretrain import hold_ctrl_c
    previous, hit = hold_ctrl_c()
    if previous is None:        # not ours to arrange (another thread, SIGINT ignored)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if hit and callable(previous):
        previous(signal.SIGINT, None)


def _from_ctrl_c(e: BaseException) -> bool:
    """`e` was raised while handling a KeyboardInterrupt, or because of one."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _raise_quietly(signum, frame):
    """Ctrl-C while a console command runs: a KeyboardInterrupt, as usual. The process is then on
    its way out, and what the interrupt left half-built (a library's object, mid-import) can fail in
    its __del__: those secondary errors are not printed around the command's own line."""
    sys.unraisablehook = lambda unraisable: None
    raise KeyboardInterrupt


def _end_at_once_on_interrupt(prog: str, quiet: bool) -> None:
    """The command has returned: a Ctrl-C from here on ends the process at once (exit 130), with
    one line unless the command already said it was interrupted."""
    line = b"" if quiet else f"\n{prog}: interrupted\n".encode()

    def end(signum, frame):
        if line:
            os.write(2, line)
        os._exit(INTERRUPTED)

    signal.signal(signal.SIGINT, end)
    for stream in (sys.stdout, sys.stderr):     # what os._exit would lose
        try:
            stream.flush()
        except (OSError, ValueError):   # a closed pipe or stream: nothing more to say there
            pass
