"""dataprep.shards imports MindSpore's MindRecord writer without the rest of the framework: the
files are the same bytes as with a full `import mindspore`, and a full import afterwards in the
same process still works (reading the files back with MindSpore's own dataset)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_WRITE = """
import sys
import numpy as np
{first}
from mspretrain.dataprep.write.shards import ShardWriter
w = ShardWriter(sys.argv[1], "train", seq_length=7, max_bytes=1 << 20)
w.write(np.arange(40, dtype=np.int32).reshape(5, 8))
w.write(np.arange(24, dtype=np.int32).reshape(3, 8) * 3)
shards = w.close()
print("framework loaded:", "mindspore.nn" in sys.modules)
if len(sys.argv) > 2:
    sys.exit(0)       # exit with only the writer loaded: no abort in MindSpore's exit hooks
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


def test_the_light_import_writes_the_same_bytes_and_a_full_import_still_works(tmp_path):
    light = _write(tmp_path / "light", "")
    assert "framework loaded: False" in light and "sum: 6" in light
    full = _write(tmp_path / "full", "import mindspore")
    assert "framework loaded: True" in full
    files = sorted(p.relative_to(tmp_path / "full") for p in (tmp_path / "full").rglob("*")
                   if p.is_file())
    assert files and any(f.suffix == ".db" for f in files)
    for f in files:
        assert (tmp_path / "light" / f).read_bytes() == (tmp_path / "full" / f).read_bytes(), f


def test_a_build_process_that_never_loads_the_framework_exits_cleanly(tmp_path):
    assert "framework loaded: False" in _write(tmp_path, "", "exit")


def test_mindrecord_encryption_reaches_the_real_functions_after_the_light_import():
    code = ("from mspretrain.dataprep.write.shards import mindrecord\n"
            "config = mindrecord().config\n"
            "try:\n    config._encrypt()\n"
            "except TypeError as e:\n    print('real:', 'incompatible function arguments' in str(e))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[3])
    assert "real: True" in done.stdout, done.stderr[-2000:]
