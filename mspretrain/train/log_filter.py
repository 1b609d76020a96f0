"""The console of an msrun job: the trainer's own lines, not MindSpore's log.

msrun and MindSpore log retries, timeouts and topology chatter at WARNING/INFO level (most of the
console of a healthy `--nproc 2` run). Everything msrun prints goes to RUN/logs/msrun/launcher.log;
the console gets only the lines that are not MindSpore log records. On failure the launcher prints
the log tails, so nothing is lost when it matters.
"""
from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

# MindSpore / glog records: "[WARNING] ME(123:456,MainProcess):2026-..." "[INFO] DISTRIBUTED(...)",
# and glog's "W1130 12:00:00.000000 123 file.cc:12] ..."
_MS_LOG = re.compile(r"^\s*(\[(DEBUG|INFO|WARNING|WARN)\]\s|[IWD]\d{4} \d\d:\d\d:\d\d)")

LAUNCHER_LOG = "launcher.log"


def is_framework_noise(line: str) -> bool:
    return bool(_MS_LOG.match(line))


def pump(stream, log_path: Path, console=None, seen: tuple[str, threading.Event] | None = None) -> threading.Thread:
    """Copy every line of `stream` to `log_path`; the lines that are not MindSpore log records also
    to the console; `seen` (text, event): the event is set once a line holds the text. Returns the
    (started) thread; join it after the process exits."""
    console = console or sys.stdout

    def run():
        with open(log_path, "a", encoding="utf-8", errors="replace") as log:
            for raw in iter(stream.readline, b""):
                line = raw.decode("utf-8", errors="replace")
                log.write(line)
                log.flush()
                if seen and seen[0] in line:
                    seen[1].set()
                if not is_framework_noise(line):
                    console.write(line)
                    console.flush()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread
