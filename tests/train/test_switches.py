"""The long-run switches and sections are validated with one line naming the key (train launch, exit 2)."""
import pytest

from mspretrain.train.config import ConfigError, load_config
from mspretrain.train.observe.spike import check_spike_config
from mspretrain.train.switches import check_switches
from trainer_harness import launch_cmd, run


@pytest.mark.parametrize("sets, key", [
    (["precision.graph_kernel=true"], "precision.graph_kernel"),
    (["parallel.comm_fusion=25"], "parallel.comm_fusion"),
    (["parallel.comm_fusion=-1"], "parallel.comm_fusion"),
    (["run.mode=eager"], "run.mode"),
    (["run.mode=pynative", "parallel.data_parallel=2"], "run.mode=pynative"),
    (["profile.start_step=5"], "profile.start_step"),
    (["profile.start_step=5", "profile.stop_step=4"], "profile.start_step"),
])
def test_switches_refused_where_the_device_cannot_use_them(sets, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_switches(load_config(None, sets))


def test_switches_accepted_where_they_apply():
    check_switches(load_config(None, ["device=Ascend", "precision.graph_kernel=true"]))
    check_switches(load_config(None, ["parallel.data_parallel=8", "parallel.comm_fusion=32"]))
    check_switches(load_config(None, ["run.mode=pynative", "profile.start_step=3", "profile.stop_step=3"]))


@pytest.mark.parametrize("sets, key", [
    (["train.spike.action=maybe"], "train.spike.action"),
    (["train.spike.window=1"], "train.spike.window"),
    (["train.spike.sigma=0"], "train.spike.sigma"),
    (["train.spike.max_consecutive=0"], "train.spike.max_consecutive"),
    (["train.z_loss=-1"], "train.z_loss"),
])
def test_spike_and_z_loss_keys_checked(sets, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        check_spike_config(load_config(None, sets))


def test_launch_names_the_key_in_one_line(tiny_data, tmp_path):
    out = run(launch_cmd(tmp_path / "run", tiny_data, "precision.graph_kernel=true"))
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith("train launch: config error: precision.graph_kernel")
    assert "Traceback" not in out.stderr
