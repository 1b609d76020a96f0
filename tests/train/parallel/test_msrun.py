"""Data parallelism with real msrun processes on CPU: `train launch --nproc 2`.

Every run loads the test hooks with TRAIN_TRACE_DIR set, so each rank writes, per step, the digests of
the input rows it took and of its whole state (weights, AdamW moments) after the step
(train_test_hooks.TracedStep).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from train_test_hooks import env as hook_env
from trainer_harness import REDUCTION_ORDER_RTOL, REPO, exact_view, last_step, launch_cmd, records, run

pytestmark = [pytest.mark.slow, pytest.mark.msrun]

STEPS = 8
# validation at step 4 and 8: under dp every rank evaluates the same full eval batch
COMMON = (f"train.steps={STEPS}", "checkpoint.every_steps=2", "checkpoint.keep_max=10", "eval.every_steps=4")
DP2 = ("parallel.data_parallel=2",)
# One device vs dp=2 on the same global batch, EOD loss mask on (configs/tiny.yaml) and EOS in the data:
# both divide the summed token losses by the global batch's token count, so they differ only by fp32
# reduction order: the two ranks' partial gradient sums added by the all-reduce, where one device adds
# the same terms in one running sum. The derivation of the bound is trainer_harness.REDUCTION_ORDER_RTOL's
# (16 u, u = 2**-24): 1e-6. Steps after the first see weights that differ by those last bits, and AdamW
# divides each update by sqrt(v): early steps keep the difference small; step 1 is the strict check.


@pytest.fixture(scope="module")
def docs_data(tmp_path_factory):
    """docs_dataset with EOS at 8 % of the positions: token counts differ between the ranks' halves."""
    from synthetic import make_dataset
    return make_dataset(tmp_path_factory.mktemp("docs_data"), num_train=256, num_valid=32, seq_length=32,
                        vocab_size=128, seed=3, eos_rate=0.08)


def train(run_dir: Path, data: Path, nproc: int, *sets: str, resume: str | None = None,
          env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = launch_cmd(run_dir, data, *COMMON, *sets, resume=resume)
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    env = hook_env(TRAIN_TRACE_DIR=str(run_dir / "trace"), **(env or {}))
    return run(cmd, env=env, timeout=timeout)


def trace(run_dir: Path, rank: int) -> list[dict]:
    path = run_dir / "trace" / f"rank_{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(run_dir) if not r.get("eval")}


def ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def single(docs_data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single") / "run"
    ok(train(run_dir, docs_data, 1))
    return run_dir


@pytest.fixture(scope="module")
def dp2(docs_data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dp2") / "run"
    proc = train(run_dir, docs_data, 2, *DP2)
    ok(proc)
    assert "msrun --worker_num=2 --local_worker_num=2" in proc.stdout     # the command it ran
    # MindSpore's log records stay in RUN/logs/msrun/ on success; the trainer's lines reach the console
    console = (proc.stdout + proc.stderr).splitlines()
    assert not [x for x in console if "[WARNING]" in x or "[INFO]" in x], console
    assert any(x.startswith(f"step {STEPS:>6}/{STEPS}") for x in console)
    assert (run_dir / "logs" / "msrun" / "launcher.log").is_file()
    return run_dir


def test_dp2_weights_identical_on_both_ranks_and_loss_matches_one_process(single, dp2):
    one, r0, r1 = trace(single, 0), trace(dp2, 0), trace(dp2, 1)
    assert len(one) == len(r0) == len(r1) == STEPS
    for step, (a, b, c) in enumerate(zip(one, r0, r1), start=1):
        assert b["state"] == c["state"], f"ranks diverged at step {step}"
        assert len(b["rows"]) == len(c["rows"]) == len(a["rows"]) // 2
        assert b["rows"] + c["rows"] == a["rows"], f"step {step}: not the same global batch"
        assert b["loss"] == c["loss"] == pytest.approx(a["loss"], rel=4 * REDUCTION_ORDER_RTOL)
    ref, got = records(single), records(dp2)
    steps = [r for r in got if not r.get("eval")]
    assert [r["step"] for r in steps] == list(range(1, STEPS + 1))
    first, first_ref = steps[0], ref[0]
    assert first["loss"] == pytest.approx(first_ref["loss"], rel=REDUCTION_ORDER_RTOL)
    assert first["grad_norm"] == pytest.approx(first_ref["grad_norm"], rel=REDUCTION_ORDER_RTOL)
    for a, b in zip(ref, got):
        assert a["step"] == b["step"] and bool(a.get("eval")) == bool(b.get("eval"))
        if b.get("eval"):       # the same eval batches whatever dp: the same val loss
            assert b["val_loss"] == pytest.approx(a["val_loss"], rel=4 * REDUCTION_ORDER_RTOL)
            continue
        assert b["loss"] == pytest.approx(a["loss"], rel=4 * REDUCTION_ORDER_RTOL)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=4 * REDUCTION_ORDER_RTOL)
        assert b["consumed_samples"] == a["consumed_samples"]
    assert [r["step"] for r in got if r.get("eval")] == [4, 8]


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every process under it (msrun starts workers in new sessions)."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    for p in [psutil.Process(proc.pid), *family] if proc.poll() is None else family:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    psutil.wait_procs(family, timeout=30)


def test_dp2_resume_after_sigkill_is_bitwise_exact(docs_data, dp2, tmp_path):
    run_dir = tmp_path / "run"
    cmd = launch_cmd(run_dir, docs_data, *COMMON, *DP2) + ["--nproc", "2"]
    log = open(tmp_path / "killed.log", "w")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, **hook_env(TRAIN_TRACE_DIR=str(run_dir / "trace"))))
    try:
        deadline = time.monotonic() + 240
        while last_step(run_dir) < 5 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert last_step(run_dir) >= 5, (tmp_path / "killed.log").read_text()[-3000:]
    finally:
        kill_tree(proc)
    assert last_step(run_dir) < STEPS, "the run finished before the kill"
    ok(train(run_dir, docs_data, 2, *DP2, resume="auto"))
    assert exact_view(run_dir) == exact_view(dp2)           # every step's loss, bitwise
    assert trace(run_dir, 0)[-1]["state"] == trace(dp2, 0)[-1]["state"]   # weights + moments, bitwise


def elastic(docs_data, tmp_path, source: Path, nproc: int, *sets: str) -> Path:
    """Resume `source`'s step-4 checkpoint with `nproc` processes in a new run dir."""
    run_dir = tmp_path / "run"
    ok(train(run_dir, docs_data, nproc, *sets, resume=str(source / "checkpoints" / "step_00000004")))
    return run_dir


def test_elastic_resume_2_to_1_continues_the_same_stream(docs_data, single, dp2, tmp_path):
    run_dir = elastic(docs_data, tmp_path, dp2, 1)
    resumed = trace(run_dir, 0)
    assert [t["rows"] for t in resumed] == [t["rows"] for t in trace(single, 0)[4:]]
    got, ref = losses(run_dir), losses(dp2)
    assert sorted(got) == [5, 6, 7, 8]
    for step in got:                    # optimizer state carried over: the curve continues
        assert got[step] == pytest.approx(ref[step], rel=1e-5, abs=1e-6)
    steps = lambda d: [r for r in records(d) if not r.get("eval")]       # (validation records between)
    assert steps(run_dir)[0]["consumed_samples"] == steps(dp2)[4]["consumed_samples"]


def test_elastic_resume_1_to_2_continues_the_same_stream(docs_data, single, dp2, tmp_path):
    run_dir = elastic(docs_data, tmp_path, single, 2, *DP2)
    r0, r1 = trace(run_dir, 0), trace(run_dir, 1)
    assert [a["rows"] + b["rows"] for a, b in zip(r0, r1)] == [t["rows"] for t in trace(single, 0)[4:]]
    assert [a["state"] for a in r0] == [b["state"] for b in r1]
    got, ref = losses(run_dir), losses(single)
    assert sorted(got) == [5, 6, 7, 8]
    for step in got:
        assert got[step] == pytest.approx(ref[step], rel=1e-5, abs=1e-6)


def test_worker_crash_shows_its_log_tail_and_fails(docs_data, tmp_path):
    run_dir = tmp_path / "run"
    proc = train(run_dir, docs_data, 2, *DP2, env={"TRAIN_TRACE_FAULT": "1:3:crash"}, timeout=240)
    assert proc.returncode != 0
    assert "the job failed" in proc.stderr
    assert f"last 40 lines of {run_dir / 'logs' / 'msrun' / 'worker_1.log'}" in proc.stderr
    assert "injected failure on rank 1 at call 3" in proc.stderr
    # stopped when msrun saw the worker fail, not after its scheduler timed the dead worker out (30 s)
    assert "timed out node" not in (run_dir / "logs" / "msrun" / "scheduler.log").read_text()
    assert not any("train launch" in " ".join(p.info["cmdline"] or []) and str(run_dir) in
                   " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"]))


def test_bad_config_fails_every_worker_fast(docs_data, tmp_path):
    run_dir = tmp_path / "run"
    proc = train(run_dir, docs_data, 2, "parallel.data_parallel=3", timeout=240)
    assert proc.returncode != 0
    assert "parallel.data_parallel (3)" in proc.stderr and "2 process(es)" in proc.stderr
