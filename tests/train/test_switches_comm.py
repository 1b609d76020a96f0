"""The communication switches: parallel.overlap (MindSpore 2.10's parallel_speed_up_json keys, accepted
by 2.10's own parser), parallel.comm_fusion_allgather / _reducescatter, each refused where the
communication it tunes does not exist, and the shipped 7B/13B configs."""
import json

import pytest

from mspretrain.train.config import ConfigError, load_config
from mspretrain.train.switches import check_switches, comm_fusion_config, speed_up_config

ASCEND = ["device=Ascend", "parallel.data_parallel=4", "parallel.model_parallel=2", "parallel.optimizer_shard=true"]


@pytest.mark.parametrize("sets, message", [
    (["parallel.overlap=[grad_allreduce]", "parallel.data_parallel=2"], "Ascend only"),
    (["device=Ascend", "parallel.overlap=[grad_allreduce]"], "parallel.data_parallel > 1"),
    (["device=Ascend", "parallel.data_parallel=2", "parallel.overlap=[allgather]"], "parallel.optimizer_shard=true"),
    (["device=Ascend", "parallel.data_parallel=2", "parallel.overlap=[matmul_grad]"], "parallel.model_parallel > 1"),
    ([*ASCEND, "parallel.overlap=[recompute]"], "recompute.mode full or select"),
    ([*ASCEND, "parallel.overlap=[mc2]"], "unknown 'mc2'"),
    (["parallel.data_parallel=2", "parallel.comm_fusion_allgather=64"], "parallel.optimizer_shard=true"),
    (["parallel.comm_fusion_reducescatter=-1"], "must be >= 0"),
])
def test_refused_where_the_communication_is_missing(sets, message):
    with pytest.raises(ConfigError, match="parallel\\.(overlap|comm_fusion)") as err:
        check_switches(load_config(None, sets))
    assert message in str(err.value)


def test_the_speed_up_file_is_what_mindspore_2_10_parses(tmp_path):
    cfg = load_config(None, [*ASCEND, "recompute.mode=full", "parallel.comm_fusion=32",
                             "parallel.comm_fusion_allgather=64", "parallel.comm_fusion_reducescatter=16",
                             "parallel.overlap=[grad_allreduce, allgather, matmul_grad, recompute]"])
    check_switches(cfg)
    assert comm_fusion_config(cfg) == {"allreduce": {"mode": "size", "config": 32},
                                       "allgather": {"mode": "size", "config": 64},
                                       "reducescatter": {"mode": "size", "config": 16}}
    speed = speed_up_config(cfg)
    path = tmp_path / "speed_up.json"
    path.write_text(json.dumps(speed))
    # 2.10's own validator of the file AutoParallel.transformer_opt reads: unknown keys or wrong types raise
    from mindspore.context import _context
    _context()._set_speedup_config_path(str(path))
    assert set(speed) == {"grad_computation_allreduce_overlap", "computation_allgather_overlap",
                          "grad_matmul_communication_overlap", "recomputation_communication_overlap"}
    path.write_text(json.dumps({"no_such_overlap": True}))
    with pytest.raises(ValueError, match="no_such_overlap"):
        _context()._set_speedup_config_path(str(path))
    from mindspore.parallel.auto_parallel import AutoParallel
    import inspect
    assert list(inspect.signature(AutoParallel.transformer_opt).parameters) == ["self", "file_path"]
    assert list(inspect.signature(AutoParallel.comm_fusion).parameters) == ["self", "config"]


@pytest.mark.parametrize("name", ["llama-7b", "llama-13b"])
def test_shipped_configs_turn_on_the_ascend_switches_and_the_doctor_replaces_them(name):
    from mspretrain.train import doctor
    from trainer_harness import REPO
    cfg = load_config(REPO / "configs" / f"{name}.yaml", ["model.vocab_size=32000"])
    check_switches(cfg)
    assert cfg.model.fused_kernels == ["rms_norm", "rope", "swiglu"]
    assert cfg.parallel.overlap == ["grad_allreduce", "allgather"]
    shrunk = doctor.shrink(cfg, 2, "CPU")
    assert "model.fused_kernels=[]" in shrunk.sets and "parallel.overlap=[]" in shrunk.sets
    assert any("model.fused_kernels [rms_norm, rope, swiglu] replaced" in n for n in shrunk.notes)
    assert any("parallel.overlap=[grad_allreduce, allgather] dropped" in n for n in shrunk.notes)
    rungs = {r.name: r for r in doctor.ladder(2, shrunk)}
    assert rungs["fused kernels"].ascend_only and rungs["fused kernels"].check == "fused"
    on_ascend = doctor.shrink(cfg, 2, "Ascend")
    assert "parallel.overlap=[grad_allreduce, allgather]" in on_ascend.layout and not on_ascend.notes[1:]
