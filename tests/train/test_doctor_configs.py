"""`train doctor` on the shipped configs (1B, 7B, 13B) as a user runs it on a machine without Ascend:
the config shrunk keeping its features, its CPU rungs run for real and pass, the rest is skipped
naming Ascend. A file of its own so that these long runs spread over the test workers."""
from __future__ import annotations

import pytest

from mspretrain.train import doctor as doc
from doctor_harness import cell, doctor, row
from trainer_harness import REPO, records

pytestmark = [pytest.mark.slow, pytest.mark.msrun]


def test_doctor_checks_the_users_own_config_llama_7b(tiny_data, tmp_path):
    """`train doctor --config configs/llama-7b.yaml` on CPU: the config shrunk, keeping its features
    (accumulation K > 1, full recompute, document masking, its dp x mp layout with optimizer sharding,
    sequence parallel and vocabulary split, bf16); CPU runs one device and dp=2 with bf16 replaced by
    fp32, and says so; the rest is named and skipped."""
    # the config recomputes nothing (its estimate's advice); full recompute is set to keep it covered
    proc = doctor(tiny_data, tmp_path / "doc", "--set", "recompute.mode=full",
                  config=REPO / "configs" / "llama-7b.yaml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    if doc.ascend_missing():        # this machine: the config's Ascend replaced, said in one line
        said = [x for x in out.splitlines() if "Ascend is not usable here" in x]
        assert len(said) == 1 and "device=CPU, bf16 replaced by fp32" in said[0], out[:3000]
        assert "skipped (needs Ascend)" in said[0]
    for feature in ("accumulation", "recompute full", "document masking", "bf16", "model parallel",
                    "optimizer sharding", "sequence parallel", "vocabulary split"):
        assert feature in out, feature
    for name in ("one device", "dp=2", "accumulation K=2 on 1", "resume+eval", "resume dp=2 on 1"):
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
    assert started.endswith("/one_device") and "train.accumulate=loop" in started
    # K = 2 on one device (the shrunk global batch of 8 in micro-batches of 4) against the reference's
    # loop over 4 micro-batches of 2: the same gradient in another fp32 summation order
    k2 = records(tmp_path / "doc" / "accumulation_K2_on_1")
    for a, b in zip(ref, k2):
        for key in ("loss", "grad_norm", "val_loss"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-6), key


@pytest.mark.parametrize("name", ["llama-1b", "llama-13b"])
def test_doctor_runs_the_cpu_rungs_of_the_shipped_1b_and_13b_configs(tiny_data, tmp_path, name):
    """`train doctor --config configs/llama-{1b,13b}.yaml` as a user runs it on a machine without Ascend:
    the CPU rungs pass (dp=2 within fp32 tolerance of one device, the resumes bitwise or within it), the
    rest is skipped naming Ascend, with the config's features kept (1B: accumulation and select
    recompute; 13B: pipeline stages, which shrink the batch to what this machine's rungs need)."""
    proc = doctor(tiny_data, tmp_path / "doc", config=REPO / "configs" / f"{name}.yaml")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    if doc.ascend_missing():        # this machine: one line says so, with what the shrink replaces
        said = [x for x in out.splitlines() if "Ascend is not usable here" in x]
        assert len(said) == 1 and "running the CPU rungs with device=CPU, bf16 replaced by fp32" in said[0]
        assert "the Ascend rungs are listed as skipped (needs Ascend)" in said[0]
    features = {"llama-1b": ("accumulation", "recompute select", "optimizer sharding"),
                "llama-13b": ("pipeline", "model parallel", "sequence parallel", "vocabulary split")}[name]
    for feature in ("document masking", "bf16", *features):
        assert feature in out, feature
    cpu = ["one device", "dp=2", "resume+eval", "resume dp=2 on 1"]
    if name == "llama-1b":
        cpu.append("accumulation K=2 on 1")
    for rung in cpu:
        assert " ok " in f" {' '.join(row(out, rung))} ", rung
    for rung in ("mp=2", "pp=2 m=2", "pp=2 dp=2", "your layout", "resume mp=2", "resume pp=2", "docmask kernel"):
        assert "skipped" in row(out, rung) and "needs Ascend" in cell(out, rung, "note"), rung
    ref, dp = records(tmp_path / "doc" / "one_device"), records(tmp_path / "doc" / "dp2")
    assert len(ref) == len(dp) > 0
    for a, b in zip(ref, dp):
        if not a.get("eval"):
            assert b["loss"] == pytest.approx(a["loss"], rel=doc.TOLERANCE)
            assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=doc.TOLERANCE)
