"""What a new user meets first in training: a second launch on a busy run dir, extending a run,
metrics without a checkpoint, a dataset that does not fit the checkpoint."""
from __future__ import annotations

from lock_helpers import hold, kill
from trainer_harness import launch_cmd, run


def test_two_train_launches_on_one_run_dir(tmp_path, tiny_data):
    run_dir = tmp_path / "run"
    holder = hold("run_dir_lock", run_dir)
    try:
        r = run(launch_cmd(run_dir, tiny_data, "train.steps=2"))
        assert r.returncode == 2, r.stderr
        assert f"run dir {run_dir} is in use by another process (pid {holder.pid}" in r.stderr
        assert not (run_dir / "metrics.jsonl").exists()
    finally:
        kill(holder)
