"""Workers: real processes, errors surface named and never hang, no process outlives the loader."""
import gc
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from mspretrain.loader import Loader, LoaderError, WorkerError
from mspretrain.loader.manifest import load_manifest

from loader_helpers import take


def gone(pids, wait_s=5.0):
    """True once none of `pids` is a live process (zombies count as gone only once reaped)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not any(_exists(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


def _exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_workers_are_real_processes_and_close_reaps_them(dataset):
    ld = Loader(dataset, global_batch_size=8, num_workers=2, prefetch=3)
    next(ld)
    pids = ld.worker_pids
    assert len(pids) == 2 and os.getpid() not in pids and all(_exists(p) for p in pids)
    ld.close()
    assert gone(pids)
    with ld:                                   # usable again after close: a fresh pool, same stream
        assert next(ld)["sample_id"].shape == (8,) and ld.worker_pids != pids
        pids = ld.worker_pids
    assert gone(pids)


def test_garbage_collection_reaps_workers(dataset):
    ld = Loader(dataset, global_batch_size=8, num_workers=2)
    next(ld)
    pids = ld.worker_pids
    del ld
    gc.collect()
    assert gone(pids)


def corrupt_row0(root, shard=2):
    """Make row 0 of a shard claim 256 tokens, keeping the file's size (so only reading finds it)."""
    path = root / f"shards/train-{shard:05d}.mindrecord"
    data = bytearray(path.read_bytes())
    data[16384 + 8:16384 + 12] = b"\x00\x00\x01\x00"
    path.write_bytes(bytes(data))
    return path


def test_worker_exception_names_shard_and_row_and_stops_workers(dataset, tmp_path):
    root = shutil.copytree(dataset, tmp_path / "copy")
    corrupt_row0(root)
    ld = Loader(root, global_batch_size=20, seed=0, num_workers=2, prefetch=4,
                verify_shards=False)         # the decoder's check, behind the shard digests
    pids = []
    with pytest.raises(WorkerError, match=r"train-00002.mindrecord: row 0: 256 tokens, expected 17"):
        for _ in range(15):                    # one epoch: some batch holds that row
            next(ld)
            pids = ld.worker_pids
    assert pids and gone(pids) and ld.worker_pids == []
    cursor = ld.cursor                         # the cursor stopped before the failed batch
    first = load_manifest(root).split("train").shards[2].first_sample
    assert first not in np.concatenate([b["sample_id"] for b in take(
        Loader(root, global_batch_size=20, seed=0, verify_shards=False), cursor // 20)])
    ld.close()


def test_a_killed_worker_raises_instead_of_hanging(dataset):
    ld = Loader(dataset, global_batch_size=8, num_workers=1, prefetch=2)
    next(ld)
    (pid,) = ld.worker_pids
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(LoaderError, match=rf"loader-worker-0 \(pid {pid}\) died with exit code -9"):
        take(ld, 5)                            # at most the already finished batches come out first
    assert gone([pid])
    assert next(ld)["sample_id"].shape == (8,)   # the next call starts a fresh pool
    ld.close()


def test_keyboard_interrupt_while_waiting_leaves_no_worker(dataset):
    ld = Loader(dataset, global_batch_size=8, num_workers=2, prefetch=2)
    next(ld)
    pids = ld.worker_pids
    for p in pids:
        os.kill(p, signal.SIGSTOP)            # workers stall, so the caller must wait ...
    timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))   # ... until Ctrl-C
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            take(ld, 10)
    finally:
        timer.cancel()
    assert gone(pids)
    state = ld.state_dict()                    # consistent: only really taken batches count
    assert state["cursor"] % 8 == 0 and state["cursor"] >= 8
    ld.close()


def test_workers_exit_when_their_parent_is_killed(dataset):
    script = textwrap.dedent(f"""
        import sys, time
        from mspretrain.loader import Loader
        ld = Loader({str(dataset)!r}, global_batch_size=8, num_workers=2)
        next(ld)
        print(*ld.worker_pids, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2 and all(_exists(p) for p in pids)
    finally:
        proc.kill()
        proc.wait()
    assert gone(pids, wait_s=10.0)
