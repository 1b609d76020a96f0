"""A disk too small for the checkpoint rotation stops the run before the write, every earlier
checkpoint intact, with a message naming the directory and the bytes needed (a real small tmpfs)."""
import os
import shutil
import subprocess

import pytest

from trainer_harness import launch_cmd, run

pytestmark = pytest.mark.slow


@pytest.fixture
def tmpfs(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def _files(path):
    return {p.relative_to(path): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def test_full_disk_stops_before_the_checkpoint_write(tiny_data, tmpfs):
    run_dir = tmpfs / "run"
    sets = ("eval.every_steps=0", "checkpoint.every_steps=5", "checkpoint.keep_max=3")
    first = run(launch_cmd(run_dir, tiny_data, "train.steps=5", *sets))
    assert first.returncode == 0, first.stderr[-2000:]
    ckpt5 = run_dir / "checkpoints" / "step_00000005"
    size = sum(len(b) for b in _files(ckpt5).values())
    before = _files(run_dir / "checkpoints")
    # something else fills the disk: room for two more checkpoints, not the keep_max + 1 = 4 in all
    free = shutil.disk_usage(tmpfs).free
    with open(tmpfs / "ballast", "wb") as f:
        f.truncate(0)
        os.posix_fallocate(f.fileno(), 0, free - 2 * size)
    second = run(launch_cmd(run_dir, tiny_data, "train.steps=10", *sets, resume="auto"))
    assert second.returncode == 1, second.stderr[-2000:]     # a runtime error
    err = second.stderr.strip().splitlines()[-1]
    assert "not enough disk for the next checkpoint in" in err and str(run_dir / "checkpoints") in err
    assert "bytes needed" in err and "Traceback" not in second.stderr
    assert _files(run_dir / "checkpoints") == before                     # step 5 intact, nothing new
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))
