"""`python -m mspretrain.train launch / eval / compare` end to end on the tiny config (real subprocesses)."""
import hashlib
import json
import math
import re
import resource
import signal

import pytest

from synthetic import make_dataset
from mspretrain.train.config import load_config
from trainer_harness import TINY, launch_cmd, records, run

SHORT = ("train.steps=12", "checkpoint.every_steps=4", "checkpoint.keep_max=2", "eval.every_steps=6",
         "eval.batches=2")


def tree_digest(root) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_run_dir_metrics_eval_and_resume_guards(tmp_path, tiny_data):
    run_dir = tmp_path / "run"
    r = run(launch_cmd(run_dir, tiny_data, *SHORT))
    assert r.returncode == 0, r.stderr
    recs = records(run_dir)
    steps = [x for x in recs if not x.get("eval")]
    evals = [x for x in recs if x.get("eval")]
    assert [x["step"] for x in steps] == list(range(1, 13)) and [x["step"] for x in evals] == [6, 12]
    for x in steps:
        assert {"loss", "lr", "grad_norm", "loss_scale", "overflow", "tokens_per_s", "mfu",
                "consumed_samples", "data_wait_s"} <= set(x)
        assert x["consumed_samples"] == 8 * x["step"] and 0 < x["mfu"] < 1
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.3                      # it learns
    assert evals[1]["val_ppl"] == pytest.approx(math.exp(evals[1]["val_loss"]))
    assert "step     12/12  loss" in r.stdout
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["latest", "step_00000008", "step_00000012"]
    state = json.loads((run_dir / "checkpoints" / "step_00000012" / "state.json").read_text())
    cfg = load_config(TINY, [f"data.path={tiny_data}", f"run.dir={run_dir}", *SHORT])
    assert state["config_hash"] == cfg.hash() and state["loader"]["cursor"] == 96
    assert state["dataset_fingerprint"] == json.loads((tiny_data / "manifest.json").read_text())["fingerprint"]
    assert state["last_metrics"]["loss"] == steps[-1]["loss"]
    assert state["format_version"] == 1 and not {"lr_schedule", "rng"} & set(state)   # nothing unread

    # eval of the latest checkpoint == the validation the run logged at that step
    r = run(launch_cmd(run_dir, tiny_data, *SHORT, command="eval"))
    assert r.returncode == 0, r.stderr
    assert f"val_loss {evals[1]['val_loss']:.6f}" in r.stdout

    # no --resume in a run dir with checkpoints: an error that changes nothing
    before = tree_digest(run_dir)
    r = run(launch_cmd(run_dir, tiny_data, *SHORT))
    assert r.returncode == 1 and "already has checkpoints" in r.stderr and "--resume auto" in r.stderr
    assert tree_digest(run_dir) == before

    # another config or another dataset: refused unless --force
    r = run(launch_cmd(run_dir, tiny_data, *SHORT, "optim.lr=0.001", resume="auto"))
    assert r.returncode == 1 and "optim.lr 0.003 -> 0.001" in r.stderr and "--force" in r.stderr
    other = make_dataset(tmp_path / "other", num_train=64, num_valid=8, seq_length=32, vocab_size=128, seed=9)
    r = run(launch_cmd(run_dir, other, *SHORT, resume="auto"))
    assert r.returncode == 1 and "dataset fingerprint" in r.stderr
    assert tree_digest(run_dir) == before
    r = run(launch_cmd(run_dir, tiny_data, *SHORT[1:], "train.steps=14", resume="auto", force=True))
    assert r.returncode == 0, r.stderr
    assert [x["step"] for x in records(run_dir) if not x.get("eval")] == list(range(1, 15))


def test_unwritable_run_dir_is_a_clear_error(tmp_path, tiny_data):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    r = run(launch_cmd(blocker / "run", tiny_data, "train.steps=2"))
    assert r.returncode == 1
    assert f"run dir {blocker}/run is not writable" in r.stderr and "Traceback" not in r.stderr


def _limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # write() then fails with EFBIG, as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))


@pytest.mark.slow
def test_failed_checkpoint_write_leaves_earlier_checkpoints_intact(tmp_path, tiny_data):
    """A checkpoint that cannot be written (file size limit: the model file is ~1.4 MB) is a clear
    error; the earlier checkpoints, `latest` and no temporary directory remain."""
    run_dir = tmp_path / "run"
    sets = ("train.steps=8", "checkpoint.every_steps=4", "eval.every_steps=0")
    assert run(launch_cmd(run_dir, tiny_data, *sets)).returncode == 0
    before = tree_digest(run_dir / "checkpoints")
    r = run(launch_cmd(run_dir, tiny_data, *sets[1:], "train.steps=12", resume="auto", force=True),
            preexec_fn=_limit_file_size)
    assert r.returncode == 1, r.stderr
    assert f"cannot write checkpoint {run_dir}/checkpoints/step_00000012" in r.stderr
    assert "File too large" in r.stderr and "earlier checkpoints are untouched" in r.stderr
    assert tree_digest(run_dir / "checkpoints") == before
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_00000008"


def test_divergence_saves_and_stops(tmp_path, tiny_data):
    """lr 1e30 blows the weights up at step 1; from step 2 on the fp32 gradients are not finite (no loss
    scale to blame): bad steps. The run saves a checkpoint at the first bad step, skips their updates and
    stops (exit 3) after train.max_bad_steps in a row."""
    run_dir = tmp_path / "run"
    r = run(launch_cmd(run_dir, tiny_data, "optim.lr=1.0e+30", "optim.warmup_steps=0", "optim.clip_norm=0",
                       "train.max_bad_steps=2", "train.steps=10", "eval.every_steps=0"))
    assert r.returncode == 3, r.stderr
    assert "stopping: 2 consecutive bad steps" in r.stderr
    recs = records(run_dir)
    assert [x["step"] for x in recs] == [1, 2, 3]
    assert math.isfinite(recs[0]["grad_norm"]) and not recs[0]["overflow"]
    assert all(x["overflow"] and not math.isfinite(x["grad_norm"]) for x in recs[1:])
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == \
        ["latest", "step_00000002", "step_00000003"]
    state = json.loads((run_dir / "checkpoints" / "step_00000003" / "state.json").read_text())
    assert state["bad_streak"] == 2


def test_cli_errors_without_mindspore_tracebacks(tmp_path, tiny_data):
    r = run(launch_cmd(tmp_path / "r", tiny_data, "precision.dtype=bf16"))
    assert r.returncode == 2 and "bf16 needs device Ascend" in r.stderr
    r = run(launch_cmd(tmp_path / "r", tiny_data, "recompute.mode=full", "recompute.full_layers='0-5'"))
    assert r.returncode == 2 and "recompute.full_layers" in r.stderr and "outside layers 0-1" in r.stderr
    r = run(launch_cmd(tmp_path / "r", tiny_data, resume=str(tmp_path)))
    assert r.returncode == 1 and "not a checkpoint directory" in r.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("sets,message", [
    (["checkpoint.every_steps=0"], "checkpoint.every_steps must be >= 1, got 0"),
    (["optim.min_lr=1.0"], "optim.min_lr must be in [0, optim.lr]"),
    (["optim.beta2=1.0"], "optim.beta2 must be in [0, 1)"),
    (["train.steps=0"], "train.steps must be >= 1"),
])
def test_loop_config_errors(sets, message):
    from mspretrain.train.config import ConfigError
    from mspretrain.train.trainer import check_loop_config

    with pytest.raises(ConfigError, match=re.escape(message)):
        check_loop_config(load_config(TINY, sets))
