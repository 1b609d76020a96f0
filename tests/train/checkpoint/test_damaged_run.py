"""A run, checkpoint or dataset damaged or tampered with: `latest` missing or garbage, a
state.json edited by hand, a flipped bit or a cut in model.ckpt, a second launch on a live run. Each is
found before anything is written, and said in one line naming the file; `--resume auto` falls back
to the newest complete checkpoint, and no checkpoint that exists is overwritten."""
from __future__ import annotations

import json
import shutil
import socket
import sys

import pytest

from lock_helpers import hold, kill
from trainer_harness import exact_view, launch_cmd, records, run

SETS = ("train.steps=20", "checkpoint.every_steps=10", "eval.every_steps=10", "log.every_steps=1")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_data):
    """A finished run of 20 steps: checkpoints step_10 and step_20 (latest), 22 metrics lines."""
    run_dir = tmp_path_factory.mktemp("trained") / "run"
    r = run(launch_cmd(run_dir, tiny_data, *SETS))
    assert r.returncode == 0, r.stderr
    return run_dir


def copy_run(trained, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    return run_dir


def snapshot(run_dir) -> dict:
    """Every file of the run dir but the lock's, by content: what must not change on a refusal."""
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and not p.name.startswith(".lock")}


def ckpt_dir(run_dir, step: int):
    return run_dir / "checkpoints" / f"step_{step:08d}"


def edit_state(run_dir, at_step: int, **changes):
    path = ckpt_dir(run_dir, at_step) / "state.json"
    state = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            state.pop(key)
        else:
            state[key] = value
    path.chmod(0o644)
    path.write_text(json.dumps(state))


def flip_bit(path, at: float = 0.5):
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x10
    path.chmod(0o644)
    path.write_bytes(bytes(data))


# ---------------------------------------------------------------- item 2: `latest` missing or garbage

@pytest.mark.parametrize("latest", [None, b"\x89PNG\r\n\x1a\n\xff\xfe", b"step_0000002\n"])
def test_resume_auto_without_a_usable_latest_takes_the_newest_checkpoint(trained, tmp_path, tiny_data,
                                                                         latest):
    run_dir = copy_run(trained, tmp_path)
    pointer = run_dir / "checkpoints" / "latest"
    pointer.unlink()
    if latest is not None:
        pointer.write_bytes(latest)
    before = snapshot(run_dir)
    before.pop("checkpoints/latest", None)
    r = run(launch_cmd(run_dir, tiny_data, *SETS, resume="auto"))
    assert r.returncode == 0, r.stderr
    assert "already finished at step 20/20" in r.stdout
    assert f"{pointer} " in r.stderr and "resuming from the newest complete checkpoint, step_00000020" \
        in r.stderr
    def kept(files):            # metrics and checkpoints (a resume rewrites run.json, adds events)
        return {k: v for k, v in files.items() if k.startswith("checkpoints/") or k == "metrics.jsonl"}
    assert kept(snapshot(run_dir)) == {**kept(before), "checkpoints/latest": b"step_00000020\n"}
    assert len(records(run_dir)) == 22


def test_resume_auto_with_no_complete_checkpoint_refuses(trained, tmp_path, tiny_data):
    run_dir = copy_run(trained, tmp_path)
    (run_dir / "checkpoints" / "latest").write_bytes(b"\0\0garbage")
    for step in (10, 20):
        (ckpt_dir(run_dir, step) / "model.ckpt").chmod(0o644)
        (ckpt_dir(run_dir, step) / "model.ckpt").write_bytes(b"")
    before = snapshot(run_dir)
    r = run(launch_cmd(run_dir, tiny_data, *SETS, resume="auto"))
    assert r.returncode == 1, r.stderr
    assert "no complete checkpoint to resume from" in r.stderr and "Nothing was changed" in r.stderr
    assert f"{ckpt_dir(run_dir, 20) / 'model.ckpt'}: 0 bytes" in r.stderr
    assert "Traceback" not in r.stderr
    assert snapshot(run_dir) == before


# ---------------------------------------------------------------- item 6: a state.json edited by hand

@pytest.mark.parametrize("changes, message", [
    ({"step": -5}, "field 'step' must be an integer >= 0, got -5"),
    ({"step": "20"}, "field 'step' must be an integer >= 0, got '20'"),
    ({"step": 25, "loader": {"version": 1, "cursor": 8, "dataset_fingerprint": "x", "seed": 1234}},
     "step 25 does not match the directory name step_00000020"),
    ({"loader": None}, "field 'loader' (the loader state) must be an object, got None"),
    ({"loader": {"version": 1, "cursor": 8, "dataset_fingerprint": "x", "seed": 1234, "split": "train",
                 "global_batch_size": 8}},
     "last_metrics.consumed_samples 160 != loader.cursor 8"),
])
def test_a_tampered_state_is_refused_before_anything_is_written(trained, tmp_path, tiny_data, changes,
                                                                message):
    run_dir = copy_run(trained, tmp_path)
    edit_state(run_dir, 20, **changes)
    before = snapshot(run_dir)
    r = run(launch_cmd(run_dir, tiny_data, *SETS, "train.steps=30",
                       resume=str(ckpt_dir(run_dir, 20))))
    assert r.returncode == 1, r.stderr
    assert f"{ckpt_dir(run_dir, 20) / 'state.json'}: {message}" in r.stderr
    assert "Traceback" not in r.stderr
    assert snapshot(run_dir) == before


def test_a_step_beyond_the_optimizers_count_is_refused(trained, tmp_path, tiny_data):
    """A state.json copied over from a later checkpoint: the optimizer counter in model.ckpt tells."""
    run_dir = copy_run(trained, tmp_path)
    ten, twenty = ckpt_dir(run_dir, 10), ckpt_dir(run_dir, 20)
    state = json.loads((ten / "state.json").read_text())
    state["files"] = json.loads((twenty / "state.json").read_text())["files"]
    shutil.rmtree(ten)
    shutil.copytree(twenty, ten)          # step 20's weights under step 10's (self-consistent) state
    (ten / "state.json").chmod(0o644)
    (ten / "state.json").write_text(json.dumps(state))
    before = snapshot(run_dir)
    r = run(launch_cmd(run_dir, tiny_data, *SETS, resume=str(ten)))
    assert r.returncode == 1, r.stderr
    assert "step 10, but its model.ckpt holds 20 optimizer updates" in r.stderr
    assert snapshot(run_dir) == before


@pytest.mark.slow
def test_resume_auto_falls_back_past_a_damaged_checkpoint_and_keeps_it(trained, tmp_path, tiny_data):
    """step_20's state.json says step -5: --resume auto takes step_10, trains 11..20 again bit for bit
    like the first time, and step_20 is moved aside, not overwritten."""
    run_dir = copy_run(trained, tmp_path)
    edit_state(run_dir, 20, step=-5)
    damaged = (ckpt_dir(run_dir, 20) / "state.json").read_bytes()
    r = run(launch_cmd(run_dir, tiny_data, *SETS, resume="auto"))
    assert r.returncode == 0, r.stderr
    assert f"skipping a damaged checkpoint: {ckpt_dir(run_dir, 20) / 'state.json'}: field 'step'" in r.stderr
    assert "resuming from the newest complete checkpoint, step_00000010" in r.stderr
    assert "resuming from" in r.stdout and "step_00000010 at step 10/20" in r.stdout
    aside = run_dir / "checkpoints" / "step_00000020.replaced-1"
    assert (aside / "state.json").read_bytes() == damaged
    assert exact_view(run_dir) == exact_view(trained)
    assert (run_dir / "checkpoints" / "latest").read_text() == "step_00000020\n"


# ---------------------------------------------------------------- item 7: digests of checkpoint files

def test_every_checkpoint_file_has_its_digest_in_state_json(trained):
    import hashlib
    for step in (10, 20):
        d = ckpt_dir(trained, step)
        files = json.loads((d / "state.json").read_text())["files"]
        model = (d / "model.ckpt").read_bytes()
        assert files == {"model.ckpt": {"sha256": hashlib.sha256(model).hexdigest(), "bytes": len(model)}}


@pytest.mark.parametrize("damage, message, commands", [
    (lambda p: flip_bit(p), "sha256 differs from the one state.json recorded", ("launch", "eval", "export")),
    (lambda p: p.write_bytes(p.read_bytes()[:1000]), "1000 bytes, state.json recorded", ("launch",)),
    (lambda p: p.write_bytes(b""), "0 bytes, state.json recorded", ("eval",)),
])
def test_a_damaged_model_file_is_refused_on_resume_and_eval(trained, tmp_path, tiny_data, damage, message,
                                                            commands):
    run_dir = copy_run(trained, tmp_path)
    model = ckpt_dir(run_dir, 20) / "model.ckpt"
    model.chmod(0o644)
    damage(model)
    before = snapshot(run_dir)
    for command in commands:
        if command == "launch":
            cmd = launch_cmd(run_dir, tiny_data, *SETS, "train.steps=30", resume=str(ckpt_dir(run_dir, 20)))
        elif command == "eval":
            cmd = launch_cmd(run_dir, tiny_data, *SETS, command="eval")
        else:
            cmd = [sys.executable, "-m", "mspretrain.train", "export", str(run_dir), "--out", str(tmp_path / "hf")]
        r = run(cmd)
        assert r.returncode == 1, (command, r.stderr)
        assert f"{model}: {message}" in r.stderr and "Traceback" not in r.stderr, (command, r.stderr)
    assert snapshot(run_dir) == before


def test_a_checkpoint_without_digests_loads_with_a_warning(trained, tmp_path, tiny_data):
    run_dir = copy_run(trained, tmp_path)
    edit_state(run_dir, 20, files=None)
    r = run(launch_cmd(run_dir, tiny_data, *SETS, resume="auto"))
    assert r.returncode == 0, r.stderr
    assert "records no file digests (written by an older trainer)" in r.stderr
    assert "already finished at step 20/20" in r.stdout
    # and a cut file in such a checkpoint is still one line naming it
    model = ckpt_dir(run_dir, 20) / "model.ckpt"
    model.chmod(0o644)
    model.write_bytes(model.read_bytes()[:1000])
    r = run(launch_cmd(run_dir, tiny_data, *SETS, command="eval"))
    assert r.returncode == 1, r.stderr
    assert f"{model}: cannot be read as a checkpoint" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------- a live run, a damaged metrics file

def test_a_second_launch_on_a_live_run_names_the_holder(trained, tmp_path, tiny_data):
    run_dir = copy_run(trained, tmp_path)
    holder = hold("run_dir_lock", run_dir)
    try:
        r = run(launch_cmd(run_dir, tiny_data, *SETS))      # a fresh launch, by mistake
        assert r.returncode == 1, r.stderr
        assert f"is in use by another process (pid {holder.pid} on host {socket.gethostname()}" in r.stderr
        assert "delete" not in r.stderr
    finally:
        kill(holder)


def test_invalid_utf8_in_metrics_is_one_line(trained, tmp_path):
    run_dir = copy_run(trained, tmp_path)
    metrics = run_dir / "metrics.jsonl"
    text = metrics.read_bytes()
    compare = [sys.executable, "-m", "mspretrain.train", "compare", str(trained), str(run_dir)]
    metrics.write_bytes(text + b'{"step": 21, "lo\xff\xfe')        # a last line cut by a kill
    r = run(compare)
    assert r.returncode == 0 and "20/20 common steps bitwise equal" in r.stdout, r.stderr
    metrics.write_bytes(text + b"\xff\xfe\n")
    r = run(compare)
    assert r.returncode == 1, r.stderr
    assert f"{metrics}:23: not valid JSON" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------- item 11: a flipped byte in a shard

@pytest.mark.parametrize("workers", [0, 1])
def test_a_flipped_byte_in_a_shard_stops_training_before_a_step(tiny_data, tmp_path, workers):
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    shard = sorted((data / "shards").glob("train-*.mindrecord"))[0]
    shard.chmod(0o644)
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01                    # sizes and headers intact: only the digest sees it
    shard.write_bytes(bytes(raw))
    run_dir = tmp_path / "run"
    r = run(launch_cmd(run_dir, data, *SETS, f"data.num_workers={workers}"))
    assert r.returncode == 1, r.stderr
    assert f"{shard}: sha256 of the shard or its .db index differs from the manifest's" in r.stderr
    assert "Traceback" not in r.stderr and "innermost frames" not in r.stderr
    assert records(run_dir) == []                 # not one step trained on it


# ---------------------------------------------------------------- config slips: one line, exit 2

@pytest.mark.parametrize("setting, message", [
    ("model.num_heads=3", "model.num_heads must be a divisor of model.hidden_size (64), got 3"),
    ("model.num_kv_heads=3", "model.num_kv_heads must be a divisor of model.num_heads (4), or 0, got 3"),
    ("model.hidden_size=0", "model.hidden_size must be >= 1, got 0"),
    ("device=cpu", "device: 'cpu' is not one of CPU, Ascend, GPU (did you mean 'CPU'?)"),
    ("device=GPU", "device: 'GPU' is not usable with this MindSpore installation"),
])
def test_model_and_device_slips_are_one_line(tiny_data, tmp_path, setting, message):
    r = run(launch_cmd(tmp_path / "run", tiny_data, *SETS, setting))
    assert r.returncode == 2, r.stderr
    assert f"train launch: config error: {message}" in r.stderr and "Traceback" not in r.stderr
