"""A build killed with SIGKILL mid-stage, twice, and rerun with the same command finishes from its
completed chunks and writes the same bytes as an uninterrupted build."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dataprep_helpers import REPO, TEST_SETTINGS, dataset_bytes, run_build

# Smaller chunks than the reference build: many work units to kill in the middle of. The chunk size
# is runtime-only, so the bytes must still equal the reference's.
COMMAND = ["--workers", "1", "--set", "run.chunk_bytes=4KiB"]


def _start(corpus: Path, out: Path, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "mspretrain.dataprep", "build", str(corpus), "--out", str(out),
            *TEST_SETTINGS, *COMMAND, *extra]
    return subprocess.Popen(argv, cwd=REPO, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _kill_when(proc: subprocess.Popen, markers: Path, at_least: int, timeout: float = 120) -> int:
    """SIGKILL the build's whole process tree once `at_least` chunk markers exist; returns the count."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = len(list(markers.glob("[0-9]*.json"))) if markers.is_dir() else 0
        if done >= at_least:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return done
        if proc.poll() is not None:
            pytest.fail(f"build ended before it could be killed: {proc.stderr.read()}")
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail("build made no progress")


@pytest.mark.slow
def test_sigkill_mid_stage_then_rerun_gives_the_same_bytes(corpus, reference, tmp_path):
    out = tmp_path / "data"
    work = out / ".build"
    total = json.loads((reference / "report.json").read_text())["chunks"]

    settled = work / "plan" / "done"     # the plan's task markers: "settle" ends stage 2

    # 1) killed during stage 1 (clean+filter+minhash), a few chunks in
    done = _kill_when(_start(corpus, out), work / "docs", 3)
    docs_done = len(list((work / "docs").glob("[0-9]*.json")))
    assert not (out / "manifest.json").exists() and not list(settled.glob("settle-*"))
    assert 3 <= docs_done == done

    # 2) rerun, killed during stage 4 (tokenize), a few chunks in
    _kill_when(_start(corpus, out), work / "tokens", 3)
    assert list(settled.glob("settle-*")) and not (out / "manifest.json").exists()
    tokens_done = len(list((work / "tokens").glob("[0-9]*.json")))

    # 3) rerun to the end
    proc = _start(corpus, out)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    report = json.loads((out / "report.json").read_text())
    assert report["chunks"] > total                 # 4 KiB chunks: more of them than the reference
    assert report["chunks_reused"]["docs"] == report["chunks"]    # stage 1 and 2 were complete
    assert 3 <= tokens_done <= report["chunks_reused"]["tokenize"] < report["chunks"]
    assert dataset_bytes(out) == dataset_bytes(reference)
    assert not work.exists()


def test_crash_while_publishing_then_rerun_gives_the_same_bytes(corpus, reference, tmp_path,
                                                                 monkeypatch):
    """Killed after moving its outputs into DIR but before the manifest (which marks a finished
    build): the rerun takes them back and finishes."""
    import mspretrain.dataprep.build as build

    def crash(*args):
        raise KeyboardInterrupt("simulated kill before the manifest is written")

    out = tmp_path / "data"
    monkeypatch.setattr(build, "write_manifest", crash)
    assert run_build([corpus], out, "--workers", "1") == 130
    assert (out / "shards").is_dir() and (out / ".build").is_dir()
    assert not (out / "manifest.json").exists()
    monkeypatch.undo()
    assert run_build([corpus], out, "--workers", "1") == 0
    assert dataset_bytes(out) == dataset_bytes(reference)


@pytest.mark.slow
def test_a_killed_worker_stops_the_build_cleanly_and_a_rerun_resumes(corpus, reference, tmp_path):
    import psutil
    out = tmp_path / "data"
    proc = _start(corpus, out, "--workers", "2")   # 1 worker: the tasks run in the build's process
    deadline = time.monotonic() + 120
    while len(list((out / ".build" / "docs").glob("[0-9]*.json"))) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, "build ended too early"
        time.sleep(0.005)
    workers = [p for p in psutil.Process(proc.pid).children() if _is_worker(p)]
    assert len(workers) == 2
    workers[0].send_signal(signal.SIGKILL)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "worker process died" in stderr
    assert not (out / "manifest.json").exists()
    proc = _start(corpus, out)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    assert dataset_bytes(out) == dataset_bytes(reference)


def _is_worker(p) -> bool:
    """A spawned pool worker (not a short-lived helper, e.g. one MindSpore's import runs, that may
    be a zombie or gone by the time it is looked at)."""
    import psutil
    try:
        return "spawn_main" in " ".join(p.cmdline())
    except psutil.Error:
        return False


def _same_data(out: Path, reference: Path) -> None:
    """Shards, provenance and dedup output byte for byte (the manifest differs: its config names
    the given tokenizer)."""
    mine, ref = dataset_bytes(out), dataset_bytes(reference)
    data = [k for k in ref if k.split("/")[0] in ("shards", "provenance", "dedup")]
    assert len(data) >= 4 and all(mine.get(k) == ref[k] for k in data)


@pytest.mark.slow
def test_given_tokenizer_and_a_sigkill_give_the_same_bytes(corpus, reference, tmp_path):
    """With --tokenizer (no training): the same bytes, uninterrupted or killed once some chunks are
    tokenized and rerun."""
    given = ["--tokenizer", str(reference / "tokenizer.model")]
    settings = [a for a in TEST_SETTINGS if a not in ("--vocab-size", "1200")]
    out = tmp_path / "straight"
    argv = [sys.executable, "-m", "mspretrain.dataprep", "build", str(corpus), "--out", str(out),
            *settings, *COMMAND, *given]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    _same_data(out, reference)

    out = tmp_path / "killed"
    argv[argv.index("--out") + 1] = str(out)
    proc = subprocess.Popen(argv, cwd=REPO, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    _kill_when(proc, out / ".build" / "tokens", 3)
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["chunks_reused"]["tokenize"] >= 3
    _same_data(out, reference)
