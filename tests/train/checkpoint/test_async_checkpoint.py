"""checkpoint.async: the state is copied at the step boundary and written on a background thread while
training goes on. A real `train launch` SIGKILLed while a background write is in progress (held there
by a test hook that slows the writer) leaves the previous checkpoint as `latest`, and the resumed run
matches a straight synchronous run bit for bit; one write is in flight at a time; the run's end waits
for the last one; a write that fails stops the run with one clear line."""
import json
import os
import signal
import subprocess
import time
from datetime import datetime

import pytest

from mspretrain.train import checkpoint as ckpt
from mspretrain.common.console import FAILED as EXIT_ERROR
from train_test_hooks import FAIL_ENV, LOG_ENV, SLOW_ENV, env as hook_env
from trainer_harness import REPO, exact_view, kill_group, last_step, launch_cmd, records, run

SETS = ("train.steps=20", "checkpoint.every_steps=4", "checkpoint.keep_max=2", "eval.every_steps=10",
        "log.every_steps=1")
ASYNC = SETS + ("checkpoint.async=true",)


@pytest.fixture(scope="module")
def straight(tiny_data, tmp_path_factory):
    """The reference: the same run with synchronous checkpoints, straight through."""
    out = tmp_path_factory.mktemp("async") / "straight"
    r = run(launch_cmd(out, tiny_data, *SETS))
    assert r.returncode == 0, r.stderr
    return out


def _events(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _latest(run_dir) -> str:
    return (run_dir / "checkpoints" / "latest").read_text().strip()


@pytest.mark.slow
def test_killed_during_a_background_write_resumes_bit_for_bit(tmp_path, tiny_data, straight):
    killed, log = tmp_path / "killed", tmp_path / "killed.log"
    # the write of step 12 holds after model.ckpt is written, while training goes on
    env = dict(os.environ, **hook_env(**{SLOW_ENV: "model_written:12:120"}))
    with open(log, "w") as out:
        proc = subprocess.Popen(launch_cmd(killed, tiny_data, *ASYNC), cwd=REPO, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    tmp = killed / "checkpoints" / ".tmp-step_00000012"
    deadline = time.monotonic() + 240
    try:
        while not ((tmp / ckpt.MODEL_FILE).is_file() and last_step(killed) >= 15):
            assert proc.poll() is None, f"the run ended (rc {proc.returncode}): {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.01)
    finally:
        kill_group(proc)
    assert proc.returncode == -signal.SIGKILL
    # training went three steps past the checkpoint while its write was still in progress
    assert last_step(killed) >= 15 and _latest(killed) == "step_00000008"
    assert tmp.is_dir() and not (killed / "checkpoints" / "step_00000012").exists()

    r = run(launch_cmd(killed, tiny_data, *ASYNC, resume="auto"))
    assert r.returncode == 0, r.stderr
    assert "resuming from" in r.stdout and "step_00000008" in r.stdout
    assert exact_view(killed) == exact_view(straight)
    assert len(exact_view(straight)) == 22                  # 20 steps, 2 validations
    assert _latest(killed) == "step_00000020" and not tmp.exists()
    ckpt.check_checkpoint(killed / "checkpoints" / "step_00000020")      # digests recorded and right
    # the same bytes as the synchronous writer's: the state is the same, the file format too
    for name in ("model.ckpt",):
        a = (killed / "checkpoints" / "step_00000020" / name).read_bytes()
        b = (straight / "checkpoints" / "step_00000020" / name).read_bytes()
        assert a == b


@pytest.mark.slow
def test_one_write_in_flight_and_the_end_waits_for_the_last(tmp_path, tiny_data, straight):
    out, events = tmp_path / "run", tmp_path / "events.jsonl"
    slow = "before_latest:4:4,before_latest:20:4"
    r = run(launch_cmd(out, tiny_data, *ASYNC), env=hook_env(**{SLOW_ENV: slow, LOG_ENV: str(events)}))
    assert r.returncode == 0, r.stderr
    ev = {(e["phase"], e["step"]): e for e in _events(events)}
    times = {rec["step"]: datetime.fromisoformat(rec["time"]).timestamp()
             for rec in records(out) if not rec.get("eval")}
    # every phase ran on the background thread, in step order, each write after the previous ended
    assert all(e["thread"].startswith("checkpoint-step_") for e in ev.values())
    order = [(e["step"], e["phase"]) for e in _events(events)]
    assert [s for s, _ in order] == sorted(s for s, _ in order)
    assert ev[("model_written", 8)]["time"] >= ev[("before_latest", 4)]["time"]
    # training went on while step 4's write slept 4 s: steps 5 and 6 were done well before it ended
    assert times[6] + 1 < ev[("before_latest", 4)]["time"]
    # the end waited for step 20's slow write: published, complete, the losses those of a sync run
    assert _latest(out) == "step_00000020"
    ckpt.check_checkpoint(out / "checkpoints" / "step_00000020")
    assert exact_view(out) == exact_view(straight)


@pytest.mark.slow
def test_a_failed_background_write_stops_the_run_with_one_line(tmp_path, tiny_data):
    out = tmp_path / "run"
    r = run(launch_cmd(out, tiny_data, *ASYNC), env=hook_env(**{FAIL_ENV: "before_rename:8"}))
    assert r.returncode == EXIT_ERROR, r.stderr      # a runtime error (mspretrain.train.cli)
    errors = [line for line in r.stderr.splitlines() if "CheckpointError" in line]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    assert "background write of checkpoint step 8 failed" in errors[0]
    assert f"{FAIL_ENV}: injected write failure at before_rename:8" in errors[0]
    assert "earlier checkpoints are untouched" in errors[0]
    # stopped at the first step boundary after the failure, at the latest the next checkpoint's (the
    # write is paced over most of the interval, and that checkpoint waits for it), never writing another;
    # step 4 stays the latest, intact
    assert 8 <= last_step(out) <= 12
    assert _latest(out) == "step_00000004"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step_00000004"]


def test_the_key_is_checkpoint_async_in_files_and_records():
    """`async` is a Python keyword (the field is async_): the key users write, the one the run's records
    hold (run.json, state.json's config) and what they load back are all `checkpoint.async`."""
    from mspretrain.common.config import validate
    from mspretrain.train.config import Config, ConfigError, load_config
    from mspretrain.train.checkpoint.policy import config_record
    from trainer_harness import TINY

    cfg = load_config(TINY, ["checkpoint.async=true"])
    assert cfg.checkpoint.async_ is True and load_config(TINY).checkpoint.async_ is False
    assert cfg.to_dict()["checkpoint"] == {"every_steps": 10, "keep_max": 3, "async": True}
    assert config_record(cfg)["checkpoint.async"] is True
    assert validate(Config, cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match=r"^checkpoint.async: expected bool, got 5$"):
        load_config(TINY, ["checkpoint.async=5"])
    with pytest.raises(ConfigError, match=r"unknown key checkpoint.asyn \(known: async, every_steps, format, keep_max\)"):
        load_config(TINY, ["checkpoint.asyn=true"])
