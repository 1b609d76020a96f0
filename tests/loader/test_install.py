"""`pip install mspretrain` without extras is enough to read shards: no MindSpore, no pyarrow, no
sentencepiece. Checked in a fresh virtual environment that reads a real dataset."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mspretrain.loader import Loader

REPO = Path(__file__).resolve().parents[2]
REPO_FILES = ("pyproject.toml", "README.md", "mspretrain")

READ = """
import importlib.util, json, sys
from mspretrain.loader import Loader
with Loader(sys.argv[1], global_batch_size=8, seed=4, num_workers=1) as ld:
    batches = [next(ld) for _ in range(3)]
    state = ld.state_dict()
print(json.dumps({"ids": [b["sample_id"].tolist() for b in batches], "state": state,
                  "missing": [m for m in ("mindspore", "pyarrow", "sentencepiece", "torch")
                              if importlib.util.find_spec(m) is None]}))
"""


@pytest.mark.slow
def test_the_core_install_reads_a_dataset_without_mindspore(dataset, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in REPO_FILES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(REPO / name, src / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(src)],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-2000:]
    out = subprocess.run([str(venv / "bin" / "python"), "-c", READ, str(dataset)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout)
    assert got["missing"] == ["mindspore", "pyarrow", "sentencepiece", "torch"]
    with Loader(dataset, global_batch_size=8, seed=4) as ld:
        assert got["ids"] == [next(ld)["sample_id"].tolist() for _ in range(3)]
        assert got["state"] == ld.state_dict()
