"""write/shards.py imports MindSpore's MindRecord writer the ordinary way, and only when a process
first writes a shard: importing the writer loads no MindSpore; writing loads the real package (no
stand-in module); the files do not depend on what the process imported before, a process that only
wrote exits cleanly, and MindSpore's own dataset reads the files back in the same process."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_WRITE = """
import importlib.util
import sys
import numpy as np
{first}
from mspretrain.dataprep.write.shards import ShardWriter
print("loaded before writing:", "mindspore" in sys.modules)
w = ShardWriter(sys.argv[1], "train", seq_length=7, max_bytes=1 << 20)
w.write(np.arange(40, dtype=np.int32).reshape(5, 8))
w.write(np.arange(24, dtype=np.int32).reshape(3, 8) * 3)
shards = w.close()
real = [sys.modules[m].__spec__.origin == importlib.util.find_spec(m).origin
        for m in ("mindspore", "mindspore._c_expression", "mindspore.mindrecord")]
print("the real package:", all(real), "mindspore.nn" in sys.modules)
if len(sys.argv) > 2:
    sys.exit(0)       # exit right after writing
import mindspore
import mindspore.dataset as ds
rows = [r["input_ids"].tolist() for r in ds.MindDataset(
    [f"{{sys.argv[1]}}/{{s.file}}" for s in shards], shuffle=False).create_dict_iterator(
    output_numpy=True, num_epochs=1)]
assert rows[0] == list(range(8)) and rows[-1] == [x * 3 for x in range(16, 24)], rows
print("sum:", int((mindspore.Tensor(np.ones(3, np.float32)) + 1).asnumpy().sum()))
"""


def _write(root: Path, first: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", _WRITE.format(first=first), str(root), *args],
                          capture_output=True, text=True, cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0 and "Fatal" not in done.stderr, done.stderr[-2000:]
    return done.stdout


def test_the_writer_loads_the_real_mindspore_when_it_writes_and_the_files_read_back(tmp_path):
    out = _write(tmp_path / "late", "")
    assert "loaded before writing: False" in out         # importing the writer loads nothing
    assert "the real package: True True" in out and "sum: 6" in out
    early = _write(tmp_path / "early", "import mindspore")
    assert "loaded before writing: True" in early and "the real package: True True" in early
    files = sorted(p.relative_to(tmp_path / "early") for p in (tmp_path / "early").rglob("*")
                   if p.is_file())
    assert files and any(f.suffix == ".db" for f in files)
    for f in files:
        assert (tmp_path / "late" / f).read_bytes() == (tmp_path / "early" / f).read_bytes(), f


def test_a_process_that_only_writes_shards_exits_cleanly(tmp_path):
    assert "the real package: True True" in _write(tmp_path, "", "exit")
