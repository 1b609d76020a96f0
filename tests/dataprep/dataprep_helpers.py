"""Helpers shared by the dataprep pipeline tests (a uniquely named module: every tests/ subfolder has
its own conftest.py, and `from conftest import ...` would pick whichever was imported last)."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from mspretrain.dataprep.cli import main as dataprep_main

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo" / "corpus"

# Small on purpose: seq 64, vocab 1200 at coverage 0.995; every test build takes a few seconds.
TEST_SETTINGS = ["--seq-length", "64", "--vocab-size", "1200", "--valid-fraction", "0.1",
                 "--set", "tokenizer.character_coverage=0.995", "--set", "tokenizer.num_threads=1",
                 "--set", "input.text_unit=paragraph", "--set", "run.chunk_bytes=16KiB",
                 "--no-progress"]


def run_build(inputs, out, *extra: str) -> int:
    """`dataprep build` in this process, with the small test settings; returns the exit code."""
    return dataprep_main(["build", *map(str, inputs), "--out", str(out), *TEST_SETTINGS, *extra])


def dataset_bytes(root: Path) -> dict[str, bytes]:
    """Every file of a dataset dir except the report (report.json/md hold timings; report_*.png are
    its pictures), by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in ("report.json", "report.md")
            and not (p.name.startswith("report_") and p.suffix == ".png")}


def tree_snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def write_messy_corpus(root: Path, corpus: Path, good: str, lines: list[bytes], gz_docs: int) -> Path:
    """A corpus with bad input: the demo's en.txt, a.jsonl made of `lines`, an empty b-empty.txt and
    c-cut.jsonl.gz, `gz_docs` records of `good` gzipped and cut in half (a truncated stream)."""
    shutil.copyfile(corpus / "en.txt", root / "en.txt")
    (root / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (root / "b-empty.txt").write_bytes(b"")
    whole = gzip.compress("".join(json.dumps({"id": f"gz-{i}", "text": good.format(n=100 + i)})
                                  + "\n" for i in range(gz_docs)).encode(), mtime=0)
    (root / "c-cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    return root


def sleepy_task(delay: float, value: str) -> dict:
    """A plan-style task for executor tests: sleeps, then returns its value and pid; the values
    "build-error" and "zero" fail the way a reader and a bug would."""
    import os
    import time
    from mspretrain.dataprep.errors import BuildError
    time.sleep(delay)
    if value == "build-error":
        raise BuildError("a.jsonl: line 3 is bad")
    if value == "zero":
        return {"value": 1 / 0}
    return {"value": value, "pid": os.getpid()}


def worker_task(ctx) -> dict:
    """A plan-style task that says which Worker (plan/worker.py) its process gave it."""
    import os
    from mspretrain.dataprep.plan.worker import worker_for
    return {"pid": os.getpid(), "worker": id(worker_for(ctx))}
