"""The promise: a run killed with SIGKILL at any moment (inside a checkpoint write too) and resumed with
--resume auto gives, for every step, the same loss bit for bit as a run that went straight through."""
import hashlib
import json
import random
import signal
import sys

import numpy as np
import pytest

from mspretrain.loader import Loader
from mspretrain.train.config import load_config
from train_test_hooks import KILL_ENV, TRACE_ENV, env as hook_env
from trainer_harness import TINY, exact_view, launch_cmd, records, run, run_killed_at

COMMON = ("train.steps=30", "checkpoint.every_steps=4", "checkpoint.keep_max=2", "eval.every_steps=10",
          "log.every_steps=1")
CASES = {
    "fp32": COMMON,
    # fp16 with dynamic loss scaling (a high initial scale and a short window, so the run overflows,
    # halves and grows: the scale state must survive the kills), 4 micro-batches, recompute
    "fp16-accum-recompute": COMMON + ("precision.dtype=fp16", "precision.amp_level=O2",
                                      "precision.loss_scale.init=1048576.0", "precision.loss_scale.window=5",
                                      "train.micro_batch_size=2", "recompute.mode=full",
                                      "recompute.full_layers='0-1'"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_killed_and_resumed_run_matches_bit_for_bit(tmp_path, tiny_data, case):
    sets = CASES[case]
    straight = tmp_path / "straight"
    r = run(launch_cmd(straight, tiny_data, *sets))
    assert r.returncode == 0, r.stderr
    killed, log = tmp_path / "killed", tmp_path / "killed.log"
    resume = launch_cmd(killed, tiny_data, *sets, resume="auto")

    # die inside the checkpoint writer at step 12: with the temp dir written but not renamed (fp32),
    # or renamed but `latest` not yet updated (fp16): either way step 8 stays the latest
    phase = "before_rename" if case == "fp32" else "before_latest"
    r = run(launch_cmd(killed, tiny_data, *sets), env=hook_env(**{KILL_ENV: f"{phase}:12"}))
    assert r.returncode == -signal.SIGKILL
    assert (killed / "checkpoints" / "latest").read_text().strip() == "step_00000008"
    left = "step_00000012" if phase == "before_latest" else ".tmp-step_00000012"
    assert (killed / "checkpoints" / left).is_dir()
    # then SIGKILL (main process and loader workers) at random moments
    rng = random.Random(f"promise-{case}")
    kills = 0
    for step in sorted(rng.sample(range(13, 21), 2)):
        kills += run_killed_at(resume, killed, step, rng.uniform(0.0, 0.04), log)
    assert kills >= 1
    r = run(resume)
    assert r.returncode == 0, r.stderr

    ref, got = exact_view(straight), exact_view(killed)
    assert len(ref) == 33 and sum(("eval", True) in x for x in ref) == 3
    assert got == ref
    if case != "fp32":
        assert any(x["overflow"] for x in records(straight))          # the scale state was exercised
    r = run([sys.executable, "-m", "mspretrain.train", "compare", str(straight), str(killed)])
    assert r.returncode == 0 and r.stdout.strip().endswith("30/30 common steps bitwise equal")


@pytest.mark.slow
def test_resume_with_another_final_batch_size_continues_the_stream(tmp_path, tiny_data):
    """train.global_batch_size 8 -> 16 on resume: allowed without --force and logged; the steps after
    the checkpoint take 16 samples each from its cursor, exactly the loader's batches there."""
    run_dir, trace = tmp_path / "run", tmp_path / "trace"
    sets = ("checkpoint.every_steps=4", "eval.every_steps=0", "log.every_steps=1")
    r = run(launch_cmd(run_dir, tiny_data, *sets, "train.steps=4"))
    assert r.returncode == 0, r.stderr
    r = run(launch_cmd(run_dir, tiny_data, *sets, "train.steps=6", "train.global_batch_size=16", resume="auto"),
            env=hook_env(**{TRACE_ENV: str(trace)}))
    assert r.returncode == 0, r.stderr
    assert "train.global_batch_size 8 -> 16: the steps after 4 take 16 samples each, continuing the same " \
           "sample stream at sample 32" in r.stdout
    assert [x["consumed_samples"] for x in records(run_dir) if not x.get("eval")] == [8, 16, 24, 32, 48, 64]
    steps = [json.loads(line) for line in (trace / "rank_0.jsonl").read_text().splitlines()]
    with Loader(str(tiny_data), global_batch_size=16, seed=load_config(TINY).seed) as ld:
        ld.cursor = 32
        assert len(steps) == 2
        for got in steps:
            rows = [hashlib.sha1(np.ascontiguousarray(x).tobytes()).hexdigest()[:16] for x in next(ld)["input_ids"]]
            assert got["rows"] == rows
