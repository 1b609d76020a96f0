"""`train doctor` on CPU: the rungs CPU runs (one device, dp=2 under msrun, resume from the step-2
checkpoint + eval) for real, the Ascend rungs listed as skipped, the replica-group digest comparison
and the pp rung's checkpoint validation on a real run's files, the memory columns, and a failing rung's
exit code and worker log tail."""
from __future__ import annotations

import json
import shutil

import pytest

from mspretrain.train import doctor as doc
from doctor_harness import cell, doctor, row
from trainer_harness import TINY, records

pytestmark = [pytest.mark.slow, pytest.mark.msrun]


@pytest.fixture(scope="module")
def tiny_doctor(tiny_data, tmp_path_factory):
    """One doctor run on configs/tiny.yaml with 2 processes, shared by the tests below."""
    out = tmp_path_factory.mktemp("doctor") / "doc"
    return doctor(tiny_data, out), out


def test_doctor_runs_the_cpu_rungs_and_skips_the_ascend_ones(tiny_doctor):
    proc, work = tiny_doctor
    tmp_path = work.parent
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    for name in ("one device", "dp=2", "resume+eval", "resume dp=2 on 1"):
        assert " ok " in f" {' '.join(row(out, name))} ", name
    ascend = ("mp=2", "dp=2+opt-shard", "pp=2 m=2", "pp=2 dp=2", "1 device, no mask", "bf16+flash",
              "bf16+flash+docmask", "docmask kernel", "resume sharded", "resume mp=2", "resume pp=2",
              "resume mp=2 as dp")
    for name in ascend:
        assert "skipped" in row(out, name) and out.count("needs Ascend") == len(ascend)
    assert "accumulation K=2 on 1" not in out         # tiny.yaml does not accumulate
    assert "Ascend is not usable here" not in out     # a CPU config: nothing replaced
    assert "mp slices merged and split again at --resume" in cell(out, "resume mp=2 as dp", "note")
    # the Ascend-only checks say what they would check
    assert "val loss: step-3 checkpoint merged, on one device; none through stages" in cell(out, "pp=2 m=2", "note")
    assert "compile, then load sliced tensors" in cell(out, "resume sharded", "note")
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
    assert float(cell(out, "dp=2", "max rel diff")) <= 1e-6
    assert "digests equal in groups: whole 1x2" in cell(out, "dp=2", "note")
    # the resume rung started from the step-2 checkpoint: it ran step 3 and the validation only
    resumed = records(tmp_path / "doc" / "resume_eval")
    assert [(r["step"], bool(r.get("eval"))) for r in resumed] == [(3, False), (3, True)]
    assert [r["loss"] for r in resumed if not r.get("eval")] == [dp[2]["loss"]]
    assert resumed[1]["val_loss"] == dp[3]["val_loss"]
    assert "step 3 + eval + every rank's state bitwise = dp=2 rung" in out
    assert (tmp_path / "doc" / "resume_eval" / "logs" / "msrun" / "worker_1.log").is_file()
    # resumed on another layout (one device from the dp=2 checkpoint): step 3 and its validation as the
    # dp=2 rung's, up to fp32 reduction order
    moved = records(tmp_path / "doc" / "resume_dp2_on_1")
    assert [(r["step"], bool(r.get("eval"))) for r in moved] == [(3, False), (3, True)]
    assert moved[0]["loss"] == pytest.approx(dp[2]["loss"], rel=1e-6)
    assert moved[0]["grad_norm"] == pytest.approx(dp[2]["grad_norm"], rel=1e-6)
    assert moved[1]["val_loss"] == pytest.approx(dp[3]["val_loss"], rel=1e-6)
    assert "within tol 1e-06 of the dp=2 rung (another layout)" in cell(out, "resume dp=2 on 1", "note")


def test_doctor_shows_measured_peak_memory_beside_the_estimate(tiny_doctor):
    proc, work = tiny_doctor
    out = proc.stdout
    for name, run_dir in (("one device", "one_device"), ("dp=2", "dp2"), ("resume+eval", "resume_eval")):
        peak, est, ratio = (float(cell(out, name, c)) for c in ("peak MiB", "est MiB", "peak/est"))
        # the peak is rank 0's metrics.jsonl figure (RSS on CPU), the ratio of the two printed columns
        logged = max(r["peak_memory_mb"] for r in records(work / run_dir) if not r.get("eval"))
        assert peak == pytest.approx(logged, abs=0.05) and peak > 0 and est > 0, name
        # the printed figures are rounded to 0.05 MiB (peak, est) and 0.005 (ratio)
        assert ratio == pytest.approx(peak / est, abs=peak / est * (0.05 / peak + 0.05 / est) + 0.005), name
    assert cell(out, "mp=2", "peak MiB") == ""                      # skipped: nothing measured
    assert "RSS" in out and "includes the host runtime" in out and "only indicative" in out


def test_a_replica_whose_state_differs_fails_the_rung(tiny_doctor, tmp_path):
    """The dp=2 rung's real records, then rank 1's state digest after step 2 changed, as a drifted
    replica would leave it: the doctor's check of that rung must fail, naming the group and the call."""
    proc, work = tiny_doctor
    assert proc.returncode == 0
    copy = tmp_path / "doc"
    shutil.copytree(work / "dp2", copy / "dp2", ignore=shutil.ignore_patterns("checkpoints", "logs"))
    rung = doc.Rung("dp=2", 2, (), parallel=(2, 1, 1, False))
    assert doc._check(rung, copy, None, {}), rung.detail               # as written: equal
    trace = copy / "dp2" / "doctor" / "rank_1.jsonl"
    recs = [json.loads(x) for x in trace.read_text().splitlines()]
    assert set(recs[1]["state"]) == {"whole"}                         # CPU: no compiled layouts
    recs[1]["state"]["whole"] = "0" * 64
    trace.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rung = doc.Rung("dp=2", 2, (), parallel=(2, 1, 1, False))
    assert not doc._check(rung, copy, None, {})
    assert "'whole' tensors differ within replica group [0, 1] after step call 2" in rung.detail


def test_a_relayout_resume_that_lost_its_place_fails_the_rung(tiny_doctor, tmp_path):
    """The resumed-on-one-device rung's real records, then its step-3 loss moved as a skipped or repeated
    batch would move it: the check must fail and say by how much."""
    proc, work = tiny_doctor
    assert proc.returncode == 0
    copy = tmp_path / "doc"
    for name in ("dp2", "resume_dp2_on_1"):
        shutil.copytree(work / name, copy / name, ignore=shutil.ignore_patterns("checkpoints", "logs"))
    source = doc.Rung("dp=2", 2, (), status="ok")
    rung = doc.Rung("resume dp=2 on 1", 1, (), resume_of="dp=2", relayout=True)
    assert doc._check(rung, copy, None, {"dp=2": source}), rung.detail
    path = copy / "resume_dp2_on_1" / "metrics.jsonl"
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    recs[0]["loss"] *= 1 + 1e-5
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    rung = doc.Rung("resume dp=2 on 1", 1, (), resume_of="dp=2", relayout=True)
    assert not doc._check(rung, copy, None, {"dp=2": source})
    assert "resumed step 3 loss" in rung.detail and "> 1e-06" in rung.detail


def test_the_pp_rung_validation_path_on_a_full_checkpoint(tiny_doctor, tiny_data):
    """The pp rung validates its step-3 checkpoint on one device (no validation through stages).
    On CPU the merge of a sharded checkpoint cannot run (semi-auto only), so the path after it runs on
    the dp=2 rung's full step-3 checkpoint: its val loss must be that rung's own (the same weights and
    eval batch on one device: fp32 reduction order only)."""
    proc, work = tiny_doctor
    assert proc.returncode == 0
    rung = doc.Rung("dp=2", 2, (), merged_val=True)
    reference = doc.Rung("dp=2 (its own validation)", 2, ())
    reference.val_loss = [r for r in records(work / "dp2") if r.get("eval")][-1]["val_loss"]
    from mspretrain.train.config import load_config

    data = [f"data.path={tiny_data}"]
    sets = [*doc.FLAT, *doc.shrink(load_config(TINY, data), 2, "CPU").sets, *data]    # as run_doctor
    ok, log = doc._check_merged_val(rung, TINY, sets, work, reference)
    assert ok, rung.detail + log
    assert rung.val_loss == pytest.approx(reference.val_loss, rel=doc.TOLERANCE)
    assert "checkpoint merged, one device; none through stages" in rung.detail
    # a reference it does not match (by 10x the tolerance) fails with both figures
    reference.val_loss *= 1 + 10 * doc.TOLERANCE
    assert not doc._judge_val(rung, reference) and "relative difference" in rung.detail


def test_doctor_stops_at_a_failing_rung_with_the_worker_log_tail(tiny_data, tmp_path):
    # a global batch of 3 runs on one device but cannot be split over 2 data-parallel ranks
    proc = doctor(tiny_data, tmp_path / "doc", "train.global_batch_size=3")
    assert proc.returncode == 1
    assert "FAILED" in row(proc.stdout, "dp=2") and "not" in row(proc.stdout, "resume+eval")
    assert "rung 'dp=2' failed" in proc.stderr
    assert "worker_0.log ----" in proc.stderr or "worker_1.log ----" in proc.stderr
    assert "train.global_batch_size (3)" in proc.stderr


def test_an_fp32_ascend_config_shrunk_for_cpu_replaces_only_the_device():
    """configs/tiny.yaml set to device Ascend (fp32, no fused kernels, no communication switches): the
    shrink for CPU replaces nothing but the device, so the one line says only device=CPU. (The doctor's
    runs of Ascend configs on this CPU-only machine: tests/train/test_doctor_configs.py.)"""
    from mspretrain.train.config import load_config

    shrunk = doc.shrink(load_config(TINY, ["device=Ascend"]), 2, "CPU")
    assert shrunk.notes == () and shrunk.precision == "fp32"
    ascend = {r.name for r in doc.ladder(2, shrunk) if r.ascend_only}
    assert {"mp=2", "pp=2 dp=2", "resume mp=2", "resume pp=2", "docmask kernel"} <= ascend


def test_ladder_rungs_for_accumulation_same_layout_resumes_and_pp_by_dp():
    """What `ladder` lists: with accumulation kept, the K=2-on-one-device rung (the device's own mode)
    beside references that loop; same-layout resumes of mp and pp and a pp x dp rung on 4 devices
    (Ascend); without accumulation, no K=2 rung."""
    from trainer_harness import REPO
    from mspretrain.train.config import load_config

    shrunk = doc.shrink(load_config(REPO / "configs" / "llama-7b.yaml", []), 4, "Ascend")
    # 4 x nproc rows; the 32-device layout's own rung cannot run on 4, so its 32 rows are not asked
    assert shrunk.accumulation and shrunk.batch == 16
    rungs = {r.name: r for r in doc.ladder(4, shrunk)}
    k2 = rungs["accumulation K=2 on 1"]
    assert k2.nproc == 1 and not k2.ascend_only and "train.micro_batch_size=8" in k2.sets
    assert not any(s.startswith("train.accumulate=") for s in k2.sets)      # split on Ascend, loop on CPU
    for name in ("one device", "1 device, no mask", "resume dp=4 on 1"):
        assert "train.accumulate=loop" in rungs[name].sets, name
    assert rungs["resume mp=2"].resume_of == "mp=2" and not rungs["resume mp=2"].relayout
    assert rungs["resume mp=2"].sets == rungs["mp=2"].sets and rungs["resume mp=2"].ascend_only
    assert rungs["resume pp=2"].resume_of == "pp=2 m=2" and rungs["resume pp=2"].sets == rungs["pp=2 m=2"].sets
    pp_dp = rungs["pp=2 dp=2"]
    assert (pp_dp.nproc, pp_dp.needs_procs, pp_dp.parallel, pp_dp.ascend_only) == (4, 4, (2, 1, 2, False), True)
    assert pp_dp.merged_val and "parallel.data_parallel=2" in pp_dp.sets
    tiny = doc.shrink(load_config(TINY, []), 2, "CPU")
    assert not tiny.accumulation and "accumulation K=2 on 1" not in {r.name for r in doc.ladder(2, tiny)}
    # a layout that fits the devices keeps its own rows: dp=3 accumulating K=2, 6 per step
    fits = doc.shrink(load_config(REPO / "configs" / "llama-1b.yaml", [
        "parallel.data_parallel=3", "train.global_batch_size=24", "train.micro_batch_size=4"]), 4, "Ascend")
    assert fits.world == 3 and fits.batch == 48     # lcm(4 x 4, 3 x 2)
    big = doc.shrink(load_config(REPO / "configs" / "llama-13b.yaml", []), 2, "CPU")
    assert big.world == 64 and big.batch == 8       # not the 64-device layout's 256 rows


def _write_rung(run_dir, norms, losses=(4.0, 3.9, 3.8)):
    """A rung's files as `train launch` leaves them: metrics.jsonl and one rank's doctor trace."""
    (run_dir / "doctor").mkdir(parents=True)
    steps = [{"step": i + 1, "loss": loss, "grad_norm": n} for i, (loss, n) in enumerate(zip(losses, norms))]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    trace = [{"call": i + 1, "loss": r["loss"], "grad_norm": r["grad_norm"], "state": {"whole": "a"}}
             for i, r in enumerate(steps)]
    (run_dir / "doctor" / "rank_0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trace))


def test_a_rung_whose_grad_norm_is_zero_fails_naming_it_and_its_reference(tmp_path):
    """Accumulation buffers nothing filled give grad norm 0 with the reference's loss: the rung fails,
    and a reference with grad norm 0 fails before anything is compared with it."""
    reference = doc.Rung("one device", 1, (), status="ok", losses=[4.0, 3.9, 3.8], norms=[1.5, 1.4, 1.3])
    rung = doc.Rung("accumulation K=2 on 1", 1, ())
    _write_rung(doc._run_dir(tmp_path, rung), [1.5, 1.4, 1.3])
    assert doc._check(rung, tmp_path, reference, {}), rung.detail       # as written: equal
    _write_rung(doc._run_dir(tmp_path / "zero", rung), [0.0, 0.0, 0.0], [4.0, 4.0, 4.0])
    rung = doc.Rung("accumulation K=2 on 1", 1, ())
    assert not doc._check(rung, tmp_path / "zero", reference, {})
    assert "'accumulation K=2 on 1': step 1 grad norm is 0" in rung.detail
    assert "its reference 'one device' has 1.5" in rung.detail
    first = doc.Rung("one device", 1, ())
    _write_rung(doc._run_dir(tmp_path / "ref", first), [0.0, 0.0, 0.0])
    assert not doc._check(first, tmp_path / "ref", None, {})
    assert "'one device': step 1 grad norm is 0" in first.detail and "it is the reference" in first.detail
