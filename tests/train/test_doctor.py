"""`train doctor` on CPU: the rungs CPU runs (one device, dp=2 under msrun, resume from the step-2
checkpoint + eval) for real, the Ascend rungs listed as skipped, and a failing rung's exit code and worker log tail."""
from __future__ import annotations

import sys

import pytest

from trainer_harness import TINY, records, run

pytestmark = [pytest.mark.slow, pytest.mark.msrun]


def doctor(data, out, *sets):
    return run([sys.executable, "-m", "mspretrain.train", "doctor", "--config", str(TINY), "--set", f"data.path={data}",
                *sets, "--out", str(out), "--nproc", "2"], timeout=1200)


def row(stdout: str, name: str) -> list[str]:
    for line in stdout.splitlines():
        if line.startswith(name + " "):
            return line.split()
    raise AssertionError(f"no row {name!r} in:\n{stdout}")


def test_doctor_runs_the_cpu_rungs_and_skips_the_ascend_ones(tiny_data, tmp_path):
    proc = doctor(tiny_data, tmp_path / "doc")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for name in ("one device", "dp=2", "resume+eval"):
        assert " ok " in f" {' '.join(row(out, name))} ", name
    for name in ("mp=2", "dp=2+opt-shard", "pp=2 m=2", "1 device, no mask", "bf16+flash", "bf16+flash+docmask"):
        assert "skipped" in row(out, name) and out.count("needs Ascend") == 6
    assert "needs Ascend (the reference of bf16+flash)" in out
    # it ran what it says: the same global batch, three steps each, on one and on two processes
    ref, dp = records(tmp_path / "doc" / "one_device"), records(tmp_path / "doc" / "dp2")
    assert [r["step"] for r in ref if not r.get("eval")] == [1, 2, 3]
    assert len(ref) == len(dp) == 4                        # three steps and the validation
    for a, b in zip(ref, dp):           # (validation reads a rank's batch: 8 samples on one device, 4 here)
        for key in ("loss", "grad_norm"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4), key
    assert float(row(out, "dp=2")[-4]) <= 1e-4            # the max relative difference column
    # the resume rung started from the step-2 checkpoint: it ran step 3 and the validation only
    resumed = records(tmp_path / "doc" / "resume_eval")
    assert [(r["step"], bool(r.get("eval"))) for r in resumed] == [(3, False), (3, True)]
    assert [r["loss"] for r in resumed if not r.get("eval")] == [dp[2]["loss"]]
    assert resumed[1]["val_loss"] == dp[3]["val_loss"]
    assert "step 3 + eval bitwise = dp=2 rung" in out
    assert (tmp_path / "doc" / "resume_eval" / "logs" / "msrun" / "worker_1.log").is_file()


def test_doctor_stops_at_a_failing_rung_with_the_worker_log_tail(tiny_data, tmp_path):
    # a global batch of 3 runs on one device but cannot be split over 2 data-parallel ranks
    proc = doctor(tiny_data, tmp_path / "doc", "train.global_batch_size=3")
    assert proc.returncode == 1
    assert "FAILED" in row(proc.stdout, "dp=2") and "not" in row(proc.stdout, "resume+eval")
    assert "rung 'dp=2' failed" in proc.stderr
    assert "worker_0.log ----" in proc.stderr or "worker_1.log ----" in proc.stderr
    assert "train.global_batch_size (3)" in proc.stderr
