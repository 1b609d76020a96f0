"""The loader reads no row of a shard whose bytes are not the ones the manifest vouches for,
and a process forked from the caller leaves the caller's workers alone."""
import os
import shutil

import numpy as np
import pytest

from mspretrain.loader import Loader
from mspretrain.loader.manifest import load_manifest
from mspretrain.loader.mindrecord import ShardError
from mspretrain.loader.workers import WorkerError


def flip_one_byte(root, shard: int) -> str:
    """One bit of one token byte in the middle of a blob page: every structural check still passes."""
    path = root / f"shards/train-{shard:05d}.mindrecord"
    data = bytearray(path.read_bytes())
    at = 16384 + (len(data) - 16384) // 2
    data[at] ^= 0x01
    path.write_bytes(bytes(data))
    return str(path)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_flipped_byte_in_a_shard_stops_the_loader_before_its_rows(dataset, tmp_path, workers):
    root = shutil.copytree(dataset, tmp_path / "copy")
    damaged = flip_one_byte(root, 2)
    info = load_manifest(root).split("train").shards[2]
    rows = set(range(info.first_sample, info.first_sample + info.num_samples))
    seen = []
    ld = Loader(root, global_batch_size=20, seed=0, num_workers=workers, prefetch=4)
    with pytest.raises((ShardError, WorkerError), match=f"{damaged}: sha256 of the shard or its .db index "
                                                        f"differs from the manifest's"):
        for _ in range(15):                      # one epoch
            seen += next(ld)["sample_id"].tolist()
    assert not rows & set(seen)                  # no row of that shard came out
    ld.close()
    # the same bytes are read without a word when the check is off: what it protects against
    with Loader(root, global_batch_size=20, seed=0, verify_shards=False) as ld:
        assert len(np.concatenate([next(ld)["sample_id"] for _ in range(15)])) == 300


def test_a_damaged_index_is_found_too(dataset, tmp_path):
    root = shutil.copytree(dataset, tmp_path / "copy")
    db = root / "shards/train-00001.mindrecord.db"
    data = bytearray(db.read_bytes())
    data[-10] ^= 0x01                             # same size; sqlite may never read that byte
    db.write_bytes(bytes(data))
    with Loader(root, global_batch_size=300, seed=0) as ld, \
            pytest.raises(ShardError, match="train-00001.mindrecord: sha256 of the shard or its .db index"):
        next(ld)


def test_each_shard_is_hashed_once_per_loader(dataset):
    """The digests are checked by whichever process opens a shard first; the others (and workers
    started later, after a state restore) take that result from the shared states."""
    ld = Loader(dataset, global_batch_size=20, seed=0, num_workers=2, prefetch=4)
    check = ld._maker.checks[0]
    n = len(load_manifest(dataset).split("train").shards)
    assert (check._state[:n] == check.UNCHECKED).all()
    for _ in range(15):
        next(ld)
    assert (check._state[:n] == check.GOOD).all()            # set by the workers, seen here
    owners = check._owner[:n].copy()
    assert set(owners) <= set(ld.worker_pids)
    ld.load_state_dict(ld.state_dict())                      # a fresh pool of workers
    next(ld)
    assert (check._owner[:n] == owners).all()                 # nobody hashed again
    ld.close()


def test_a_forked_child_that_exits_leaves_the_parents_workers_running(dataset):
    ld = Loader(dataset, global_batch_size=8, seed=0, num_workers=2, prefetch=2)
    first = next(ld)["sample_id"]
    pid = os.fork()
    if pid == 0:            # the child ends as an interpreter exit does: multiprocessing's exit
        # handler (registered with atexit) runs; only it, since this test process holds the exit
        # handlers of every earlier test too
        import multiprocessing.util
        multiprocessing.util._exit_function()
        os._exit(0)                 # (not SystemExit: pytest would go on running in the child)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    batches = [next(ld)["sample_id"] for _ in range(10)]
    ld.close()
    with Loader(dataset, global_batch_size=8, seed=0) as ref:
        assert np.array_equal(next(ref)["sample_id"], first)
        assert all(np.array_equal(next(ref)["sample_id"], b) for b in batches)
