"""train.spike on a dataset with a planted garbage window (random tokens after easy rows): `skip`
skips exactly those steps, `rollback` goes back to a checkpoint and jumps over their samples, and both
resume bitwise after SIGKILL (the window's statistics are in the checkpoint)."""
import json
import random
import signal

import pytest

from spike_data import garbage_dataset
from train_test_hooks import FAULT_ENV, KILL_ENV, TRACE_ENV, env as hook_env
from trainer_harness import exact_view, launch_cmd, records, run, run_killed_at

pytestmark = pytest.mark.slow

GARBAGE = (16, 17)       # the steps whose samples are random tokens
BATCH = 8
SETS = ("train.steps=20", "train.spike.warmup=8", "train.spike.window=8", "eval.every_steps=0",
        "optim.lr=1e-2", "optim.warmup_steps=2", "log.every_steps=5")
SKIP = SETS + ("checkpoint.every_steps=5",)
BACK_TO = 12            # the rollback's checkpoint: the newest before GARBAGE[0] (every 6 steps)
ROLLBACK = SETS + ("checkpoint.every_steps=6", "train.spike.action=rollback",
                   "train.spike.max_consecutive=2")


@pytest.fixture(scope="module")
def garbage(tmp_path_factory):
    return garbage_dataset(tmp_path_factory.mktemp("spike") / "data", GARBAGE, batch=BATCH)


def _launch(run_dir, data, sets, resume=None):
    out = run(launch_cmd(run_dir, data, *sets, resume=resume))
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _steps(run_dir):
    return [r for r in records(run_dir) if not r.get("eval")]


@pytest.fixture(scope="module")
def skip_run(garbage, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("skip") / "run"
    _launch(run_dir, garbage, SKIP)
    return run_dir


def test_skip_skips_exactly_the_garbage_steps(skip_run):
    recs = _steps(skip_run)
    assert [r["step"] for r in recs] == list(range(1, 21))
    skipped = [r["step"] for r in recs if r.get("skipped")]
    assert skipped == list(range(GARBAGE[0], GARBAGE[1] + 1))
    for r in recs:
        if r.get("skipped"):
            assert r["skip_reason"] == "loss_spike" and r["loss"] > r["spike_loss_limit"]
    # training continued: the steps after the window learn on from where it stopped
    after = [r["loss"] for r in recs if r["step"] > GARBAGE[1]]
    before = recs[GARBAGE[0] - 2]["loss"]
    assert max(after) < 2 * before


def test_skip_resumes_bitwise_after_sigkill(garbage, skip_run, tmp_path):
    run_dir = tmp_path / "run"
    killed = run_killed_at(launch_cmd(run_dir, garbage, *SKIP), run_dir, GARBAGE[0],
                           random.uniform(0.0, 0.6), tmp_path / "log")
    assert killed
    _launch(run_dir, garbage, SKIP, resume="auto")
    assert exact_view(run_dir) == exact_view(skip_run)
    assert [r["step"] for r in _steps(run_dir) if r.get("skipped")] == list(range(16, 18))


@pytest.fixture(scope="module")
def rollback_run(garbage, tmp_path_factory):
    """The straight rollback run, every call of its train step traced (rows, loss, state digest)."""
    root = tmp_path_factory.mktemp("rollback")
    out = run(launch_cmd(root / "run", garbage, *ROLLBACK), env=hook_env(**{TRACE_ENV: str(root / "trace")}))
    assert out.returncode == 0, out.stderr[-3000:]
    return root / "run", out.stdout, root / "trace" / "rank_0.jsonl"


def test_rollback_goes_back_and_jumps_over_the_samples(rollback_run):
    run_dir, stdout, trace = rollback_run
    calls = [json.loads(x) for x in trace.read_text().splitlines()]
    # the steps after the checkpoint re-run exactly as the first time: same rows, loss, and the same
    # weights, moments and Adam step count after each (a reload that left the graph's own step count
    # at the discarded steps' changed every update from here on)
    first_pass = calls[BACK_TO:GARBAGE[0] - 1]               # steps 13..15, calls 13..15
    replay = calls[GARBAGE[1]:GARBAGE[1] + len(first_pass)]  # steps 13..15, calls 18..20
    assert replay == first_pass
    recs = _steps(run_dir)
    assert [r["step"] for r in recs] == list(range(1, 21))      # one record per step, after the cut
    assert not any(r.get("skipped") for r in recs)               # the garbage was never trained on
    lo, hi = (GARBAGE[0] - 1) * BATCH, GARBAGE[1] * BATCH
    by_step = {r["step"]: r for r in recs}
    assert by_step[GARBAGE[0] - 1]["consumed_samples"] == lo
    assert by_step[GARBAGE[0]]["consumed_samples"] == hi + BATCH      # step 16 read step 18's batch
    events = [json.loads(x) for x in (run_dir / "spikes.jsonl").read_text().splitlines()]
    assert events == [{"step": GARBAGE[1], "rollback": True, "steps": list(GARBAGE), "samples": [lo, hi],
                       "back_to": 12}]
    state = json.loads((run_dir / "checkpoints" / "step_00000020" / "state.json").read_text())
    assert state["spike"]["skipped"] == [{"steps": list(GARBAGE), "samples": [lo, hi], "back_to": 12}]
    assert "rolled back to step_00000012" in stdout
    assert stdout.count("compiling the training graph") == 1        # not again after the rollback
    assert stdout.count("measured peak after step") == 1


# A SIGKILL at each moment of a rollback (GARBAGE (16, 17), max_consecutive 2, checkpoints every 6:
# the decision after step 17 goes back to step 12). The train step's calls count on through the
# rollback: call 18 re-runs step 13, call 24 runs step 19, after checkpoint 18 of the second pass.
AFTER = GARBAGE[1] + 1           # the first call after the rollback

MOMENTS = {
    "before_the_first_skipped_step": {FAULT_ENV: f"0:{GARBAGE[0]}:kill"},
    "between_the_skipped_steps": {FAULT_ENV: f"0:{GARBAGE[1]}:kill"},
    "rollback_decided": {KILL_ENV: f"rollback_start:{GARBAGE[1]}"},
    "checkpoint_reloaded_before_the_event": {KILL_ENV: f"rollback_loaded:{GARBAGE[1]}"},
    "right_after_the_rollback": {FAULT_ENV: f"0:{AFTER}:kill"},
    "after_the_next_checkpoint": {FAULT_ENV: f"0:{AFTER + 19 - BACK_TO - 1}:kill"},
}


@pytest.mark.parametrize("moment", list(MOMENTS))
def test_rollback_resumes_bitwise_after_sigkill(garbage, rollback_run, tmp_path, moment):
    """Killed at one chosen moment of the rollback, resumed with --resume auto: the same losses bit for
    bit as the run never killed, the same rollback event, the same skipped range in the last state."""
    ref = rollback_run[0]
    run_dir = tmp_path / "run"
    out = run(launch_cmd(run_dir, garbage, *ROLLBACK), env=hook_env(**MOMENTS[moment]))
    assert out.returncode == -signal.SIGKILL, out.stderr[-3000:]
    _launch(run_dir, garbage, ROLLBACK, resume="auto")
    assert exact_view(run_dir) == exact_view(ref)
    assert (run_dir / "spikes.jsonl").read_text() == (ref / "spikes.jsonl").read_text()
    last = "checkpoints/step_00000020/state.json"
    assert (json.loads((run_dir / last).read_text())["spike"]
            == json.loads((ref / last).read_text())["spike"])


def test_a_resume_cuts_the_events_back_to_what_its_checkpoint_knows(tmp_path):
    from mspretrain.train.observe.spike import EVENTS_FILE, truncate_events

    known = {"steps": [16, 17], "samples": [120, 136], "back_to": 12}
    later = {"steps": [30, 31], "samples": [232, 248], "back_to": 24}
    lines = [json.dumps({"step": 5, "rollback": False, "steps": [4, 5], "samples": [24, 40],
                         "why": "no checkpoint before the spikes began"}),
             json.dumps({"step": 17, "rollback": True, **known}),
             json.dumps({"step": 31, "rollback": True, **later}),      # after the checkpoint: undone
             json.dumps({"step": 40, "rollback": False, "steps": [39, 40], "samples": [0, 8]}),
             '{"step": 41, "rollb']                                    # torn by a kill
    (tmp_path / EVENTS_FILE).write_text("\n".join(lines) + "\n")
    assert truncate_events(tmp_path, {"skipped": [known]}, 30) == 3
    assert (tmp_path / EVENTS_FILE).read_text() == lines[0] + "\n" + lines[1] + "\n"
    assert truncate_events(tmp_path, {"skipped": [known]}, 30) == 0
    assert truncate_events(tmp_path / "none", None, 0) == 0            # no events file: nothing to do


def test_a_rollback_to_a_checkpoint_of_another_layout_loads_it_resharded(graph_mode, tmp_path):
    """A run resumed on one device from a model-parallel checkpoint that spikes before its first own
    checkpoint rolls back to the old layout's: its slices (rank_0/, rank_1/, strategy files, written in
    MindSpore's formats) are merged onto this layout first, and the step gets back exactly the state
    that checkpoint was made of (a plain load finds no model.ckpt there)."""
    from types import SimpleNamespace

    import numpy as np

    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train.config import load_config
    from mspretrain.train.observe.spike import load_rollback
    from mspretrain.train.parallel.distributed import layout
    from sharded_helpers import shard_checkpoint
    from trainer_harness import BATCHES, make_step, snapshot

    _, step = make_step("optim.clip_norm=0")
    step(BATCHES[0], 1e-2)
    saved = snapshot(step)
    run_dir = tmp_path / "run"
    state = {"step": 1, "loader": {"cursor": 8, "global_batch_size": 8}}
    path = ckpt.write_checkpoint(run_dir, 1, step.state_parameters(), state, 2)
    shard_checkpoint(path)                      # as a model-parallel-2 run left it
    step(BATCHES[1], 1e-2)                      # the spiking steps after it
    assert any(not np.array_equal(saved[k], v) for k, v in snapshot(step).items())
    with pytest.raises(ckpt.CheckpointError):          # the old layout's files, loaded as they are
        ckpt.load_params(path, step.state_parameters(), live=True)
    cfg = load_config(None, [f"run.dir={run_dir}"])
    load_rollback(path, ckpt.read_state(path), SimpleNamespace(train_step=step), cfg, layout(cfg, 0, 1))
    assert all(np.array_equal(saved[k], v) for k, v in snapshot(step).items())


def test_the_in_graph_loss_spike_test_runs_only_where_the_loss_is_computed(graph_mode):
    """Under pipeline stages only the last stage computes the loss; an earlier stage's loss output is
    no loss, so its spike flag must not come from it (the flag is all-reduced: any rank's skips all).
    A loss limit below the loss skips the step on a rank that computes it, and not on one that does not
    (the step is built knowing which); the grad-norm test stays on everywhere. The last stage of a
    pp = 2 layout computes it, the first does not."""
    import math

    from mspretrain.train.config import load_config
    from mspretrain.train.parallel.apply import GlobalLossStep, reduction
    from mspretrain.train.parallel.distributed import layout
    from mspretrain.train.step.cell import Reduction
    from trainer_harness import BATCHES, make_step

    pp2 = load_config(None, ["device=Ascend", "parallel.pipeline_stage=2", "parallel.micro_batch_num=2",
                             "model.num_layers=2", "eval.every_steps=0"])
    weights = make_step()[1].step_cell.weights
    assert reduction(pp2, layout(pp2, 1, 2), weights, 2, loop=False).computes_loss
    assert not reduction(pp2, layout(pp2, 0, 2), weights, 2, loop=False).computes_loss
    dist = layout(load_config(None, []), 0, 1)
    results = {}
    for computes in (True, False):
        _, step = make_step("optim.clip_norm=0", combine=Reduction(computes_loss=computes))
        wrapped = GlobalLossStep(step, dist, computes_loss=computes)
        assert step.step_cell.computes_loss is computes
        step.set_spike_limits(0.0, math.inf)           # every loss is above 0
        results[computes] = wrapped(BATCHES[0], 1e-2).spiked
        step.set_spike_limits(math.inf, 0.0)           # every grad norm is above 0
        assert wrapped(BATCHES[0], 1e-2).spiked
    assert results == {True: True, False: False}
