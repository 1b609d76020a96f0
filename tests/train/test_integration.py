"""The parallel pieces wired into the trainer: numeric strings in the config, `train plan --world-size` and
`train estimate --seq-length` through the CLI, the strategy file in a sharded checkpoint, the pipeline
wrappers in the session builder, and the device set once, by distributed.setup().

(That nothing sets the device after setup() is checked for real by test_msrun: under msrun, init() gives
rank 1 device id 1, and a second mindspore.set_device there fails with "can not be modified".)
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from mspretrain.train.config import ConfigError, load_config
from mspretrain.train.parallel.distributed import DistInfo, layout
from trainer_harness import REPO, TINY

LLAMA_7B = REPO / "configs" / "llama-7b.yaml"


# ---------------------------------------------------------------- config: numeric strings

def test_numeric_strings_are_numbers(tmp_path):
    # YAML 1.1 reads 1e30 and 1e3 (no dot) as strings
    cfg = load_config(None, ["optim.lr=1e30", "train.steps=1e3", "train.global_batch_size=16.0",
                             "optim.eps='2.5e-9'", "checkpoint.keep_max=' 7 '"])
    assert cfg.optim.lr == 1e30 and cfg.optim.eps == 2.5e-9
    assert (cfg.train.steps, cfg.train.global_batch_size, cfg.checkpoint.keep_max) == (1000, 16, 7)
    assert all(type(v) is int for v in (cfg.train.steps, cfg.train.global_batch_size, cfg.checkpoint.keep_max))
    path = tmp_path / "c.yaml"
    path.write_text("optim: {lr: 1e-3, min_lr: 1e-4}\ntrain: {steps: 2e2}\n")
    from_file = load_config(path)
    assert (from_file.optim.lr, from_file.optim.min_lr, from_file.train.steps) == (1e-3, 1e-4, 200)
    assert from_file.hash() == load_config(None, ["optim.lr=0.001", "optim.min_lr=0.0001",
                                                  "train.steps=200"]).hash()


@pytest.mark.parametrize("item,message", [
    ("train.steps=2.5", "train.steps: expected int, got 2.5"),
    ("train.steps=1e30", "train.steps: expected int, got 1e+30"),       # not exact as an int
    ("optim.lr=fast", "optim.lr: expected float, got 'fast'"),
    ("optim.lr=nan", "optim.lr: expected float, got 'nan'"),
    ("optim.lr=[1]", "optim.lr: expected float, got [1]"),
])
def test_non_numbers_still_name_the_key(item, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, [item])


# ---------------------------------------------------------------- CLI: plan and estimate

def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mspretrain.train", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120)


def test_train_plan_world_size():
    r = cli("plan", "--config", str(LLAMA_7B), "--world-size", "32")
    assert r.returncode == 0, r.stderr
    assert "world 32 = data_parallel 16 x model_parallel 2 x pipeline_stage 1" in r.stdout
    assert "layers.0.attention.wq.matmul" in r.stdout and "((16, 1), (2, 1))" in r.stdout
    r = cli("plan", "--config", str(LLAMA_7B), "--world-size", "16")
    assert r.returncode == 2 and "= 32, but the job has 16 process(es)" in r.stderr and not r.stdout
    r = cli("plan", "--config", str(LLAMA_7B), "--world-size", "16", "--set", "parallel.data_parallel=8")
    assert r.returncode == 0 and "world 16 = data_parallel 8 x model_parallel 2" in r.stdout


def test_train_estimate_seq_length_without_a_dataset():
    base = ("estimate", "--config", str(LLAMA_7B), "--seq-length", "4096", "--set", "model.vocab_size=32000")
    r = cli(*base)
    assert r.returncode == 0, r.stderr
    assert "6.738 B parameters; bf16: 18 bytes/parameter (weights 2 + gradients 4 + fp32 master 4" in r.stdout
    assert "micro-batch 1 x seq 4096" in r.stdout and "fits (" in r.stdout
    assert "cheapest changes" not in r.stdout
    r = cli(*base, "--device-memory", "4GB")
    assert r.returncode == 0, r.stderr
    assert "does NOT fit" in r.stdout and "cheapest changes" in r.stdout and "--set parallel." in r.stdout
    shorter = cli(*base, "--device-memory", "4GB", "--seq-length", "1024")
    assert "micro-batch 1 x seq 1024" in shorter.stdout      # the last --seq-length wins
    r = cli("estimate", "--config", str(LLAMA_7B))
    assert r.returncode == 2 and "--seq-length N with model.vocab_size set" in r.stderr


# ---------------------------------------------------------------- sharded checkpoints: the strategy

def ascend(*sets: str):
    return load_config(None, ["device=Ascend", "model.vocab_size=128", *sets])


def test_sharded_checkpoint_publishes_the_rank_strategy_beside_the_rank_dirs(tmp_path):
    import numpy as np
    from mindspore import Parameter, Tensor

    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train.parallel.apply import strategy_path
    from mspretrain.train.checkpoint.checkpointer import strategy_files

    run_dir = tmp_path / "run"
    cfg = ascend("parallel.model_parallel=2", f"run.dir={run_dir}")
    dist = layout(cfg, 0, 2)
    assert dist.sharded
    single = load_config(None, [])
    assert strategy_files(single, layout(single, 0, 1)) is None        # one process: nothing to add
    plain = load_config(None, ["parallel.data_parallel=2"])
    assert strategy_files(plain, layout(plain, 1, 2)) is None          # data parallel: not sharded
    params = {"w": Parameter(Tensor(np.arange(4, dtype=np.float32)), name="w")}

    # nothing compiled yet (no strategy file): the checkpoint is written all the same
    first = ckpt.write_checkpoint(run_dir, 1, params, {"step": 1}, 5, rank=0, add_files=strategy_files(cfg, dist))
    assert sorted(p.name for p in first.iterdir()) == ["rank_0", "state.json"]

    src = strategy_path(cfg, dist)
    src.parent.mkdir(parents=True)
    src.write_bytes(b"strategy of rank 0")
    final = ckpt.write_checkpoint(run_dir, 2, params, {"step": 2}, 5, rank=0, add_files=strategy_files(cfg, dist))
    assert final == run_dir / "checkpoints" / "step_00000002" and ckpt.latest_checkpoint(run_dir) == final
    assert (final / "strategy" / "rank_0.ckpt").read_bytes() == b"strategy of rank 0"
    assert sorted(p.name for p in (final / "rank_0").iterdir()) == ["model.ckpt"]   # not in the rank dir
    assert not list((run_dir / "checkpoints").glob(".tmp-*"))


# ---------------------------------------------------------------- pipeline wrappers in the session

def test_pipeline_wrappers_identity_without_stages_and_in_the_session_with_them(tiny_data, tmp_path, monkeypatch):
    import mindspore.parallel.auto_parallel as ap
    from mindspore import nn
    from mindspore.parallel.nn import Pipeline, PipelineGradReducer

    from mspretrain.train.parallel.plan import validate

    from mspretrain.train.parallel.apply import pipeline_grad_reducer, pipeline_loss_cell
    from mspretrain.train.step.cell import PipelineAccumulator, TrainStep, TrainStepCell
    from mspretrain.train.assemble import build_session
    from mspretrain.train.parallel.distributed import layout

    one = DistInfo(rank=0, world_size=1, dp_rank=0, dp_size=1, is_main=True, sharded=False)
    flat_cfg = load_config(TINY, ["train.micro_batch_size=4"])
    cell = nn.Dense(2, 2)
    assert pipeline_loss_cell(flat_cfg, cell) is None
    assert isinstance(pipeline_grad_reducer(flat_cfg, cell.trainable_params()), nn.Identity)
    flat = build_session(flat_cfg, 128, 32, one)
    step_cell = flat.train_step.step_cell
    assert isinstance(step_cell, TrainStepCell) and flat.train_step.cell is step_cell   # no wrapper on CPU
    # the step differentiates the token-loss sum over the same model (validation: the mean, loss_net)
    assert step_cell.network is flat.train_step.loss_cell and step_cell.network.reduction == "sum"
    assert step_cell.network.model is flat.loss_net.model and step_cell.loop and step_cell.micro_steps == 2
    assert isinstance(step_cell.grad_reducer, nn.Identity)

    # pp = 2 (an Ascend config; the session is built, not run: pipelines need Ascend and msrun; the
    # rank functions patched so that AutoParallel can be built without init())
    monkeypatch.setattr(ap, "get_rank", lambda *a: 0)
    piped = ["device=Ascend", "parallel.pipeline_stage=2", "parallel.micro_batch_num=2", "model.flash_attention=false",
             "eval.every_steps=0", f"run.dir={tmp_path}"]       # no in-loop validation through pipeline stages
    monkeypatch.setattr(ap, "get_group_size", lambda *a: 2)
    no_shard_cfg = load_config(TINY, piped)
    no_shard = build_session(no_shard_cfg, 128, 32, layout(no_shard_cfg, 0, 2), 2).train_step.step_cell
    assert isinstance(no_shard.grad_reducer, PipelineAccumulator)      # PipelineGradReducer's branch fails
    assert sorted(p.name.split(".", 1)[0] for p in no_shard.grad_reducer.get_parameters()) == \
        ["accu_grads"] * len(no_shard.weights)
    piped_cfg = load_config(TINY, [*piped, "parallel.data_parallel=2", "parallel.optimizer_shard=true"])
    validate(piped_cfg, 4)
    monkeypatch.setattr(ap, "get_group_size", lambda *a: 4)
    piped = build_session(piped_cfg, 128, 32, layout(piped_cfg, 0, 4), 2)
    piped_cell = piped.train_step.step_cell
    assert isinstance(piped_cell.network, Pipeline) and piped_cell.network.network is piped.train_step.loss_cell
    assert piped_cell.network.micro_size == 2 and piped_cell.micro_steps == 2    # loss and grads / 2
    assert not piped_cell.loop and not piped_cell.accumulators
    assert isinstance(piped_cell.grad_reducer, PipelineGradReducer) and piped_cell.grad_reducer.opt_shard
    # the wrapper renames nothing: both layouts' steps hold the same tensors (each stage saves its own)
    assert sorted(TrainStep(piped_cell).state_parameters()) == sorted(flat.train_step.state_parameters())
    assert set(piped.train_step.state_parameters()) < set(flat.train_step.state_parameters())


def test_setup_sets_graph_mode_and_the_device_in_one_process(monkeypatch):
    import mindspore as ms

    from mspretrain.train.parallel import distributed

    for var in ("MS_ROLE", "MS_WORKER_NUM"):
        monkeypatch.delenv(var, raising=False)
    ms.set_context(mode=ms.PYNATIVE_MODE)
    distributed.setup(load_config(None, []), lambda cfg, world: None)
    assert ms.get_context("mode") == ms.GRAPH_MODE and ms.get_context("device_target") == "CPU"


@pytest.mark.slow
def test_sharded_resume_compiles_the_step_before_loading_the_rank_slices(tiny_data, tmp_path, monkeypatch):
    """A sharded rank's tensors only fit the parameters after the compile sliced them: restore() must
    compile first, then load (here on CPU: the compile happens, the load reads rank_R/model.ckpt)."""
    import dataclasses

    from mspretrain.loader import Loader
    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train import assemble
    from mspretrain.train.checkpoint import checkpointer

    cfg = load_config(TINY, [f"data.path={tiny_data}", f"run.dir={tmp_path / 'run'}"])
    one = DistInfo(rank=0, world_size=1, dp_rank=0, dp_size=1, is_main=True, sharded=False)
    with Loader(cfg.data.path, global_batch_size=cfg.train.global_batch_size, seed=cfg.seed, num_workers=0) as ld:
        session = assemble.build_session(cfg, ld.vocab_size, ld.seq_length, one)
        params = session.train_step.state_parameters()
        ckpt.write_checkpoint(tmp_path / "run", 1, params, {"step": 1, "config_hash": cfg.hash(),
                                                            "dataset_fingerprint": ld.fingerprint,
                                                            "loader": ld.state_dict()}, 2, rank=0)
        events = []
        compile_step = session.train_step.compile
        monkeypatch.setattr(session.train_step, "compile",
                            lambda shape: (events.append(("compile", shape)), compile_step(shape))[1])
        load = checkpointer.load_params
        monkeypatch.setattr(checkpointer, "load_params", lambda d, p, rank=None, **kw: (
            events.append(("load", rank)), load(d, p, rank=rank, **kw))[1])
        sharded = dataclasses.replace(one, sharded=True)
        checkpointer.Checkpointer(cfg, sharded).load(session, tmp_path / "run" / "checkpoints" / "step_00000001",
                                                     ld, False)
    assert events == [("compile", (8, 33)), ("load", 0)]
    assert session.train_step.step_cell.compile_cache          # really compiled
