"""Topology checks: model parallel within a node, whole nodes, msrun's environment against the job,
MindFormers' mp <= 4 as a warning; through `train plan`, validate and the launcher's pre-check."""
from __future__ import annotations

import pytest

from mspretrain.train.config import ConfigError, load_config
from mspretrain.train.parallel.plan import validate
from mspretrain.train.parallel.topology import LOCAL_WORKERS_ENV, problems


def ascend(*sets: str):
    return load_config(None, ["device=Ascend", "model.vocab_size=128", "model.num_heads=16",
                              "model.hidden_size=128", "train.global_batch_size=64", *sets])


def plan_cli(capsys, *sets: str) -> tuple[int, str, str]:
    from mspretrain.train.cli import main as train
    from trainer_harness import REPO

    args = [a for s in ("device=Ascend", "model.vocab_size=128", "model.num_heads=16", "model.num_kv_heads=0",
                        "model.hidden_size=128",
                        "train.global_batch_size=64", *sets) for a in ("--set", s)]
    code = train(["plan", "--config", str(REPO / "configs" / "tiny.yaml"), *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_train_plan_refuses_model_parallel_across_nodes(capsys):
    code, out, err = plan_cli(capsys, "parallel.model_parallel=16")
    assert code == 2 and not out
    assert "parallel.model_parallel (16) exceeds parallel.devices_per_node (8)" in err
    assert "use model_parallel <= 8" in err
    code, out, _ = plan_cli(capsys, "parallel.model_parallel=16", "parallel.devices_per_node=16")
    assert code == 0 and "model_parallel 16" in out          # a 16-device node holds it


def test_train_plan_warns_above_mindformers_mp_and_not_at_it(capsys):
    code, out, _ = plan_cli(capsys, "parallel.model_parallel=8")
    assert code == 0 and "warning: parallel.model_parallel=8 is above 4" in out and "MindFormers" in out
    code, out, _ = plan_cli(capsys, "parallel.model_parallel=4", "parallel.data_parallel=2")
    assert code == 0 and "warning" not in out


def test_a_multi_node_job_uses_whole_nodes(capsys):
    code, _, err = plan_cli(capsys, "parallel.data_parallel=12", "train.global_batch_size=48")
    assert code == 2 and "the world size must be a multiple of 8 (whole nodes)" in err
    assert plan_cli(capsys, "parallel.data_parallel=16")[0] == 0
    assert plan_cli(capsys, "parallel.data_parallel=6", "train.global_batch_size=48")[0] == 0   # one node
    with pytest.raises(ConfigError, match="must divide parallel.devices_per_node"):
        validate(ascend("parallel.devices_per_node=6", "parallel.model_parallel=4", "parallel.data_parallel=3",
                        "train.global_batch_size=48"), 12)
    with pytest.raises(ConfigError, match="parallel.devices_per_node must be >= 1"):
        validate(ascend("parallel.devices_per_node=0"), 1)


def test_cpu_processes_are_not_devices():
    cfg = load_config(None, ["parallel.data_parallel=12", "train.global_batch_size=48"])
    assert problems(cfg, 12, env={}).errors == ()


def test_msrun_environment_against_the_job(monkeypatch):
    cfg = ascend("parallel.model_parallel=4", "parallel.data_parallel=4")
    env = {"MS_WORKER_NUM": "16", "RANK_SIZE": "16", "DEVICE_ID": "3", LOCAL_WORKERS_ENV: "8"}
    assert problems(cfg, 16, env).errors == ()
    assert "RANK_SIZE=32" in " ".join(problems(cfg, 16, {**env, "RANK_SIZE": "32"}).errors)
    assert "DEVICE_ID=9" in " ".join(problems(cfg, 16, {**env, "DEVICE_ID": "9"}).errors)
    odd = " ".join(problems(cfg, 16, {**env, LOCAL_WORKERS_ENV: "6"}).errors)
    assert "--nproc 6 processes per node is not a multiple of parallel.model_parallel (4)" in odd
    monkeypatch.setenv("MS_WORKER_NUM", "16")
    monkeypatch.setenv("RANK_SIZE", "8")
    with pytest.raises(ConfigError, match="RANK_SIZE=8"):        # validate reads the worker's environment
        validate(cfg, 16)


def test_the_launcher_checks_nodes_before_msrun():
    from mspretrain.train.launch import check_nodes

    cfg = ascend("parallel.model_parallel=4", "parallel.data_parallel=4")
    check_nodes(cfg, 8, 2)
    with pytest.raises(ConfigError, match="--nproc 6 processes per node"):
        check_nodes(ascend("parallel.model_parallel=4", "parallel.data_parallel=3", "train.global_batch_size=48"),
                    6, 2)
    with pytest.raises(ConfigError, match="--nproc 16 processes per node exceed"):
        check_nodes(ascend("parallel.model_parallel=4", "parallel.data_parallel=8"), 16, 2)


def test_devices_per_node_is_not_in_the_config_hash():
    assert ascend().hash() == ascend("parallel.devices_per_node=16").hash()
