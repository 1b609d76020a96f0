import numpy as np
import pytest

from mspretrain.train.config import ConfigError, load_config
from mspretrain.train.parallel.recompute import recompute_plan

from trainer_harness import BATCHES, make_step


def plan(*sets, layers=8):
    return recompute_plan(load_config(None, list(sets)).recompute, layers)


def test_plans():
    assert plan() == {}
    assert plan("recompute.mode=full") == {i: ("",) for i in range(8)}
    assert plan("recompute.mode=full", "recompute.full_layers='0-2,7'") == {0: ("",), 1: ("",), 2: ("",), 7: ("",)}
    assert plan("recompute.mode=select", "recompute.select={mlp: '0-1', attention: '1'}") == \
        {0: ("mlp",), 1: ("mlp", "attention")}


@pytest.mark.parametrize("sets,message", [
    (["recompute.mode=full", "recompute.full_layers='0-3,3'"], "layer 3 is listed twice"),
    (["recompute.mode=full", "recompute.full_layers='6-9'"], "outside layers 0-7"),
    (["recompute.mode=full", "recompute.full_layers='3-1'"], "reversed"),
    (["recompute.mode=select", "recompute.select={ffn: '0'}"], "recompute.select.ffn: unknown module"),
    (["recompute.mode=select", "recompute.select={mlp: '0-2,1'}"], "recompute.select.mlp: layer 1"),
    (["recompute.mode=select"], "recompute.select is empty"),
    (["recompute.mode=none", "recompute.full_layers='1'"], "recompute.full_layers is set"),
    (["recompute.mode=full", "recompute.select={mlp: '1'}"], "recompute.select is set"),
    (["recompute.mode=some"], "recompute.mode must be one of"),
])
def test_invalid_plans_are_config_errors(sets, message):
    with pytest.raises(ConfigError, match=message):
        plan(*sets)


@pytest.mark.parametrize("sets,marked", [
    (["recompute.mode=full", "recompute.full_layers='1'"], ["layers.1"]),
    (["recompute.mode=select", "recompute.select={mlp: '0-1', attention: '0'}"],
     ["layers.0.attention", "layers.0.mlp", "layers.1.mlp"]),
])
def test_recompute_is_applied_and_losses_are_bitwise_equal(graph_mode, sets, marked):
    from mspretrain.train.parallel.recompute import recomputed_cells

    _, plain = make_step()
    _, recomputed = make_step(*sets)
    model = recomputed.step_cell.network.model
    assert recomputed_cells(model) == marked
    assert recomputed_cells(plain.step_cell.network.model) == []
    for batch in BATCHES[:3]:
        a, b = plain(batch, 1e-3), recomputed(batch, 1e-3)
        assert a.loss.hex() == b.loss.hex() and a.grad_norm.hex() == b.grad_norm.hex()
    np.testing.assert_array_equal(model.layers[1].mlp.w2.weight.asnumpy(),
                                  plain.step_cell.network.model.layers[1].mlp.w2.weight.asnumpy())


_COMPILE_ONE_STEP = """
import sys
import mindspore as ms
ms.set_context(mode=ms.GRAPH_MODE)
ms.set_device("CPU")
from trainer_harness import BATCHES, make_step
make_step(*sys.argv[1:])[1](BATCHES[0], 1e-3)
"""


def matmuls_in_compiled_step(tmp_path, *sets) -> tuple[int, int]:
    """(MatMul, BatchMatMul) nodes in the step graph (TrainStepCell) MindSpore validated for execution."""
    import os
    import re
    import subprocess
    import sys

    from trainer_harness import REPO

    out = tmp_path / ("ir-" + "-".join(re.sub(r"\W", "", s) for s in sets) or "ir")
    env = dict(os.environ, MS_DEV_SAVE_GRAPHS="1", MS_DEV_DUMP_IR_PASSES="validate",
               MS_DEV_SAVE_GRAPHS_PATH=str(out),
               PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), str(REPO / "tests" / "train")]))
    proc = subprocess.run([sys.executable, "-c", _COMPILE_ONE_STEP, *sets], env=env, cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    graphs = [p.read_text() for p in out.glob("*validate*.ir")]
    micro = [g for g in graphs if "TrainStepCell" in g]
    assert len(micro) == 1, [p.name for p in out.iterdir()]
    return micro[0].count("PrimFunc_MatMul("), micro[0].count("PrimFunc_BatchMatMul(")


@pytest.mark.slow
def test_compiled_graph_recomputes_the_selected_forward(tmp_path):
    """Compile-graph evidence: recompute adds forward matmuls to the backward of exactly what was
    selected (the MLP has only MatMuls; attention's scores and weighted sum are BatchMatMuls)."""
    mm, bmm = matmuls_in_compiled_step(tmp_path)
    full_mm, full_bmm = matmuls_in_compiled_step(tmp_path, "recompute.mode=full")
    mlp_mm, mlp_bmm = matmuls_in_compiled_step(tmp_path, "recompute.mode=select",
                                                     "recompute.select={mlp: '0-1'}")
    assert full_mm > mlp_mm > mm and full_bmm > bmm
    assert mlp_bmm == bmm                      # attention not recomputed
