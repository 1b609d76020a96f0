"""Running `train doctor` as a user does, and reading its table."""
from __future__ import annotations

import sys

from mspretrain.train import doctor as doc
from trainer_harness import TINY, run


def doctor(data, out, *sets, config=TINY):
    return run([sys.executable, "-m", "mspretrain.train", "doctor", "--config", str(config), "--set", f"data.path={data}",
                *sets, "--out", str(out), "--nproc", "2"], timeout=1200)


def row(stdout: str, name: str) -> list[str]:
    for line in stdout.splitlines():
        if line.startswith(name + " "):
            return line.split()
    raise AssertionError(f"no row {name!r} in:\n{stdout}")


def cell(stdout: str, name: str, column: str) -> str:
    """One cell of the doctor's fixed-width table (doctor.COLUMNS)."""
    start = 0
    for title, width in doc.COLUMNS:
        if title == column:
            break
        start += width + 1
    line = next(x for x in stdout.splitlines() if x.startswith(name + " "))
    return line[start:start + width].strip() if width else line[start:].strip()
