"""One process per output directory: a second holder is refused naming the first one's pid, and the
lock of a killed holder is taken over at once (the tests of each tool: dataprep/, train/)."""
from __future__ import annotations

import os

import pytest

from lock_helpers import hold, kill
from mspretrain.lock import LockedError, out_dir_lock


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
        assert lock.pid_file.read_text().strip() == str(os.getpid())
    assert not out.exists()                            # the lock lives beside the dir, not in it
