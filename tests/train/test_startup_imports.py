"""What a process imports at start: every training process and every msrun launch pays for it
(MindSpore 2.5 s, torch 2.7 s here), so only what it needs."""
from __future__ import annotations

import subprocess
import sys

import pytest


def _imported(code: str) -> set[str]:
    """The top-level modules a fresh interpreter holds after `code`."""
    probe = code + "\nimport sys; print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return set(proc.stdout.split())


def test_the_msrun_launcher_and_the_console_summary_import_no_mindspore(tmp_path):
    """`train launch --nproc N` only starts msrun: the launcher, the config and the console's
    summary (which reads the checkpoints' layout) need no MindSpore; a checkpoint writer does."""
    mods = _imported("import mspretrain.common.config, mspretrain.train.config, mspretrain.train.launch\n"
                     "from mspretrain.train import checkpoint as ckpt, console\n"
                     f"assert ckpt.latest_checkpoint({str(tmp_path)!r}) is None\n"
                     "assert issubclass(ckpt.CheckpointError, RuntimeError)")
    assert "mindspore" not in mods
    assert "mindspore" in _imported("from mspretrain.train import checkpoint as ckpt\nckpt.write_checkpoint")


def test_the_checkpoint_room_lists_what_it_names():
    """Every name of the room's API resolves (each from its own module, on first use) and an
    unknown one is an AttributeError, as for any module."""
    from mspretrain.train import checkpoint as ckpt
    for name in ckpt.__all__:
        assert getattr(ckpt, name) is not None, name
    assert set(ckpt.__all__) <= set(dir(ckpt))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ckpt.nope     # noqa: B018


def test_the_tensorboard_mirror_does_not_import_torch(tmp_path):
    """tensorboardX imports torch where installed (this venv has it, for the PyTorch adapter) only
    to accept torch tensors: the mirror writes floats, so a training process does without torch,
    and torch is still importable after it."""
    pytest.importorskip("tensorboardX")
    pytest.importorskip("torch")
    write = ("from mspretrain.train.observe.tensorboard import TensorBoardMirror\n"
             f"tb = TensorBoardMirror({str(tmp_path)!r}, 0); tb.write({{'step': 1, 'loss': 2.5}}); tb.close()\n")
    mods = _imported(write)
    assert "tensorboardX" in mods and "torch" not in mods
    assert "torch" in _imported(write + "import torch; torch.zeros(1)")
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
