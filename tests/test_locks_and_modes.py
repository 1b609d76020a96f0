"""One process per output directory: a second holder is refused naming the first one's pid, and the
lock of a killed holder is taken over at once (the tests of each tool: dataprep/, train/). Files
MindSpore writes follow the umask."""
from __future__ import annotations

import os
import socket

import pytest

from lock_helpers import hold, kill
from mspretrain.common.lock import LockedError, out_dir_lock


def test_second_holder_is_refused_naming_the_pid_and_a_killed_holder_is_recovered(tmp_path):
    out = tmp_path / "data"
    holder = hold("out_dir_lock", out)
    try:
        with pytest.raises(LockedError, match=rf"pid {holder.pid}\b"):
            with out_dir_lock(out, "--out data"):
                pass
    finally:
        kill(holder)
    with out_dir_lock(out, "--out data") as lock:      # SIGKILLed holder: the kernel freed it
        assert lock.pid_file.read_text().strip() == f"{os.getpid()} {socket.gethostname()}"
    assert not out.exists()                            # the lock lives beside the dir, not in it


def test_files_mindspore_writes_get_the_umask(tmp_path):
    """Shards and checkpoints: 0o666 / 0o444 minus the umask (MindSpore makes them owner-only)."""
    import mindspore as ms
    import numpy as np

    from mspretrain.common.fsmode import current_umask
    from synthetic import make_dataset
    from mspretrain.train import checkpoint as ckpt

    old = os.umask(0o022)
    try:
        assert current_umask() == 0o022
        data = make_dataset(tmp_path / "data", num_train=8, num_valid=2, seq_length=8, vocab_size=32)
        for shard in (data / "shards").iterdir():
            assert shard.stat().st_mode & 0o777 == 0o644, shard
        params = {"w": ms.Parameter(ms.Tensor(np.ones(3, np.float32)), name="w")}
        path = ckpt.write_checkpoint(tmp_path / "run", 1, params, {"step": 1}, keep_max=2)
        assert (path / ckpt.MODEL_FILE).stat().st_mode & 0o777 == 0o444
    finally:
        os.umask(old)
