"""`train doctor` on CPU: the rungs CPU runs (one device, dp=2 under msrun, resume from the step-2
checkpoint + eval) for real, the Ascend rungs listed as skipped, and a failing rung's exit code and worker log tail."""
from __future__ import annotations

import sys

import pytest

from trainer_harness import TINY, records, run

pytestmark = [pytest.mark.slow, pytest.mark.msrun]


def doctor(data, out, *sets, config=TINY):
    return run([sys.executable, "-m", "mspretrain.train", "doctor", "--config", str(config), "--set", f"data.path={data}",
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
    for name in ("mp=2", "dp=2+opt-shard", "pp=2 m=2", "1 device, no mask", "bf16+flash", "bf16+flash+docmask",
                 "docmask kernel"):
        assert "skipped" in row(out, name) and out.count("needs Ascend") == 7
    assert "your layout" not in out         # tiny.yaml is one fp32 device: the reference is its layout
    assert "needs Ascend (the reference of bf16+flash)" in out
    # it ran what it says: the same global batch, three steps each, on one and on two processes
    ref, dp = records(tmp_path / "doc" / "one_device"), records(tmp_path / "doc" / "dp2")
    assert [r["step"] for r in ref if not r.get("eval")] == [1, 2, 3]
    assert len(ref) == len(dp) == 4                        # three steps and the validation
    for a, b in zip(ref, dp):           # fp32 reduction order only (test_step.REDUCTION_ORDER_RTOL)
        for key in ("loss", "grad_norm", "val_loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-6), key
    assert float(row(out, "dp=2")[-4]) <= 1e-6            # the max relative difference column
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


def test_doctor_checks_the_users_own_config_llama_7b(tiny_data, tmp_path):
    """`train doctor --config configs/llama-7b.yaml` on CPU: the config shrunk, keeping its features
    (accumulation K > 1, full recompute, document masking, its dp x mp layout with optimizer sharding,
    sequence parallel and vocabulary split, bf16); CPU runs one device and dp=2 with bf16 replaced by
    fp32, and says so; the rest is named and skipped."""
    from trainer_harness import REPO

    proc = doctor(tiny_data, tmp_path / "doc", "--set", "device=CPU", config=REPO / "configs" / "llama-7b.yaml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "bf16 replaced by fp32" in out
    for feature in ("accumulation", "recompute full", "document masking", "bf16", "model parallel",
                    "optimizer sharding", "sequence parallel", "vocabulary split"):
        assert feature in out, feature
    for name in ("one device", "dp=2", "resume+eval"):
        assert " ok " in f" {' '.join(row(out, name))} ", name
    assert "skipped" in row(out, "your layout") and "needs Ascend" in " ".join(row(out, "your layout"))
    ref, dp = records(tmp_path / "doc" / "one_device"), records(tmp_path / "doc" / "dp2")
    for a, b in zip(ref, dp):
        if not a.get("eval"):
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-6)
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-6)
    log = (tmp_path / "doc" / "one_device" / "metrics.jsonl").read_text()
    assert log
    started = [x for x in (proc.stdout).splitlines() if x.startswith("[doctor] one device:")][0]
    assert "train.micro_batch_size=2" in started and 'recompute.full_layers=""' in started
