"""What a build's processes import: pyarrow imports pandas the first time some of its calls run
(mspretrain.common.arrow), ~0.35 CPU-s a process, so neither the main process nor a worker may
make one of them. Observed from outside: a sitecustomize module, first on the build's PYTHONPATH (and
so in every process it spawns), writes each process's modules when it exits."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from dataprep_helpers import REPO, TEST_SETTINGS

SITECUSTOMIZE = '''
import atexit, json, os, sys

def _record():
    mp = sys.modules.get("multiprocessing")
    name = mp.current_process().name if mp else "MainProcess"
    with open(os.path.join(os.environ["RECORD_MODULES"], f"{os.getpid()}.json"), "w") as f:
        json.dump({"pid": os.getpid(), "process": name, "argv": sys.argv,
                   "modules": sorted(sys.modules)}, f)

atexit.register(_record)
'''
NEVER = ("pandas", "pyarrow.dataset")


def _build(corpus, out, record, workers: int, *extra: str) -> list[dict]:
    """Records of the build's main process and its workers."""
    settings = list(TEST_SETTINGS)
    if "--tokenizer" in extra:      # instead of training one
        i = settings.index("--vocab-size")
        del settings[i:i + 2]
    site = record / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "RECORD_MODULES": str(record),
           "PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "mspretrain.dataprep", "build", str(corpus),
                             "--out", str(out), *settings, "--workers", str(workers), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    seen = [json.loads(p.read_text()) for p in sorted(record.glob("*.json"))]
    assert [r["pid"] for r in seen if r["pid"] == proc.pid], "the main process left no record"
    return [r for r in seen if r["pid"] == proc.pid or r["process"].startswith("SpawnProcess")]


@pytest.mark.slow
def test_no_build_process_imports_pandas(corpus, tmp_path):
    """A build in one process (--workers 1: the tasks run in the build's own) that trains its
    tokenizer, then one given that tokenizer whose tasks run in two worker processes."""
    alone = _build(corpus, tmp_path / "a", tmp_path / "rec-a", 1)
    pooled = _build(corpus, tmp_path / "b", tmp_path / "rec-b", 2,
                    "--tokenizer", str(tmp_path / "a" / "tokenizer.model"))
    for records, kinds in ((alone, ["MainProcess"]),
                           (pooled, ["MainProcess", "SpawnProcess-1", "SpawnProcess-2"])):
        assert sorted(r["process"] for r in records) == kinds
        for r in records:
            assert "pyarrow.parquet" in r["modules"]     # the record is of a process that built
            imported = [m for m in NEVER if m in r["modules"]]
            assert not imported, f"{r['process']} imported {imported}"
