"""Evaluation of a sharded checkpoint (Ascend model/pipeline parallelism or optimizer sharding writes
rank_R/model.ckpt slices + strategy files): merged onto one device by train.checkpoint.reshard.merged_to_one_device
with MindSpore's checkpoint transformation, then scored like a full one. The sharded checkpoints here are
written by hand in MindSpore's formats (tests/train/sharded_helpers.py): CPU cannot compile a sharded
graph, but the transformation itself runs on CPU, so `train eval RUN --tasks` and `train eval --config`
run end to end on them. What stays Ascend-only: the strategy files a real semi-auto compile writes.
(The in-loop suite of a sharded layout is refused at config validation: tests/train/parallel.)"""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from hf_helpers import jsonl, train_cmd
from sharded_helpers import shard_checkpoint, write_strategy
from trainer_harness import TINY, run


@pytest.fixture(scope="module")
def sharded_run(spm_run, tmp_path_factory):
    """A copy of spm_run whose step-20 checkpoint is model parallel 2 (rank_0/, rank_1/, strategy/)."""
    from mspretrain.train.runinfo import checkpoint_dir

    copy = tmp_path_factory.mktemp("sharded") / "run"
    shutil.copytree(spm_run, copy, ignore=shutil.ignore_patterns("eval"))
    full = shard_checkpoint(checkpoint_dir(copy, 20))
    return copy, full


def test_merge_joins_the_slices_bitwise_and_is_kept(sharded_run):
    import mindspore as ms
    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train.checkpoint.reshard import is_sharded_checkpoint, merged_to_one_device
    from mspretrain.train.runinfo import checkpoint_dir

    run_dir, full = sharded_run
    src = checkpoint_dir(run_dir, 20)
    assert is_sharded_checkpoint(src) and not is_sharded_checkpoint(checkpoint_dir(run_dir, 10))
    split = [k for k, v in full.items() if v.ndim == 2]
    assert "model.output.weight" in split or any("output" in k for k in split)
    out = merged_to_one_device(src)
    assert out == src / "merged"
    merged = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(out / ckpt.MODEL_FILE)).items()}
    assert sorted(merged) == sorted(full)
    for k in full:
        assert merged[k].dtype == full[k].dtype and merged[k].tobytes() == full[k].tobytes(), k
    stamp = (out / ckpt.MODEL_FILE).stat().st_mtime_ns
    assert merged_to_one_device(src) == out and (out / ckpt.MODEL_FILE).stat().st_mtime_ns == stamp  # kept
    assert merged_to_one_device(checkpoint_dir(run_dir, 10)) == checkpoint_dir(run_dir, 10)        # full

    # a cache that fails its digest (damaged, or made before merges recorded one) is merged again
    good = (out / ckpt.MODEL_FILE).read_bytes()
    for spoil in (lambda: (out / ckpt.MODEL_FILE).write_bytes(good[:-1] + bytes([good[-1] ^ 1])),
                  lambda: (out / (ckpt.MODEL_FILE + ".digest.json")).unlink()):
        spoil()
        assert merged_to_one_device(src) == out and (out / ckpt.MODEL_FILE).read_bytes() == good


def test_tasks_on_a_sharded_checkpoint_equal_the_full_ones(spm_run, sharded_run, tmp_path):
    """`train eval RUN --tasks`: the same per-item log-likelihoods, bitwise, as on the full checkpoint."""
    from mspretrain.train.eval.tasks import main as tasks

    run_dir, _ = sharded_run
    task = tmp_path / "t.jsonl"
    items = [{"context": "The package", "choices": [" is installed", " manager", " the"], "gold": 0},
             {"context": "Debian", "choices": [" GNU/Linux", " reference", " apt"], "gold": 1}]
    task.write_text("".join(json.dumps(i) + "\n" for i in items))
    for r in (spm_run, run_dir):
        assert tasks(r, [str(task)], step=20, batch_size=4) == 0
    got = [sorted(jsonl(p), key=lambda x: x["i"]) for r in (spm_run, run_dir)
           for p in (r / "eval").glob("step_00000020-*-task-t-*.jsonl")]
    assert len(got) == 2 and len(got[0]) == len(items) and got[0] == got[1]


def test_train_eval_config_on_a_sharded_checkpoint(spm_run, spm_data, sharded_run):
    """`train eval --config`: val_loss and val_acc of the merged checkpoint equal the full one's."""
    run_dir, _ = sharded_run
    outs = []
    for r in (spm_run, run_dir):
        p = run(train_cmd("eval", r, spm_data))
        assert p.returncode == 0, p.stderr[-3000:]
        outs.append(re.search(r"val_loss (\S+)  val_ppl \S+  val_acc (\S+)", p.stdout).groups())
    assert outs[0] == outs[1]
    assert (run_dir / "checkpoints" / "step_00000020" / "merged" / "model.ckpt").is_file()


def test_merge_plan_from_the_layout_or_the_strategy_files(tmp_path):
    """The recorded layout says whether pipeline stages are merged first; a checkpoint without one:
    identical strategy files (no stages) or differing ones (one stage each)."""
    from mspretrain.train.checkpoint import CheckpointError
    from mspretrain.train.checkpoint.reshard import merge_plan

    same, staged = tmp_path / "same", tmp_path / "staged"
    for r in range(2):
        write_strategy(same / f"rank_{r}.ckpt", 0, {"w": ([2], [0, -1])})
        write_strategy(staged / f"rank_{r}.ckpt", r, {f"w{r}": ([1], [-1, -1])})
    assert not merge_plan({}, same).merge_src_stages
    assert merge_plan({}, staged).merge_src_stages
    pp = {"layout": {"dp": 2, "mp": 1, "pp": 2}}
    assert merge_plan(pp, same).merge_src_stages            # the record wins over the files
    assert not merge_plan({"layout": {"dp": 1, "mp": 4}}, staged).merge_src_stages
    with pytest.raises(CheckpointError, match="shards nothing"):
        merge_plan({"layout": {"dp": 4}}, same)


def test_pipeline_stages_merge_onto_one_device(tmp_path):
    """Two pipeline stages, each rank holding its stage's tensors: merged into one file."""
    import mindspore as ms
    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train.checkpoint.reshard import merged_to_one_device

    full = {"w": np.arange(24, dtype=np.float32).reshape(6, 4), "b": np.arange(3, dtype=np.float32)}
    files = {}
    for r, name in enumerate(("w", "b")):
        write_strategy(tmp_path / "strategy" / f"rank_{r}.ckpt", r, {name: ([1], [-1] * full[name].ndim)})
        (tmp_path / f"rank_{r}").mkdir()
        ms.save_checkpoint([{"name": name, "data": ms.Tensor(full[name])}], str(tmp_path / f"rank_{r}" / "model.ckpt"))
    files = {str(p.relative_to(tmp_path)): ckpt.file_digest(p) for p in tmp_path.rglob("*.ckpt")}
    (tmp_path / ckpt.STATE_FILE).write_text(json.dumps({"step": 1, "files": files,
                                                        "layout": {"dp": 1, "mp": 1, "pp": 2}}))
    (tmp_path / "merged.partial").mkdir()          # a merge killed before: started again
    out = merged_to_one_device(tmp_path)
    got = {k: v.asnumpy() for k, v in ms.load_checkpoint(str(out / ckpt.MODEL_FILE)).items()}
    assert sorted(got) == ["b", "w"] and all((got[k] == full[k]).all() for k in full)
    assert not (tmp_path / "merged.partial").exists()


def test_in_loop_mode_per_step():
    """Which evals run the suite: every eval step, on the main rank only."""
    from mspretrain.train.config import load_config
    from mspretrain.train.eval.suite import in_loop_mode

    cfg = load_config(TINY, ["eval.suite_in_loop=true", "eval.every_steps=5", "checkpoint.every_steps=10",
                             "train.steps=25"])
    assert {s for s in range(1, 26) if in_loop_mode(cfg, True, s)} == {5, 10, 15, 20, 25}
    assert not any(in_loop_mode(cfg, False, s) for s in range(1, 26))
    off = load_config(TINY, ["eval.every_steps=5"])
    assert not any(in_loop_mode(off, True, s) for s in range(1, 26))
