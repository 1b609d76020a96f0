"""recompute.exclude (ops kept inside recomputed cells), recompute.mp_comm and recompute.optimizer_comm:
validation naming the key, the marks MindSpore 2.10 reads, and compile-graph evidence of the exclusion."""
import pytest

from mspretrain.train.config import ConfigError, load_config
from mspretrain.train.parallel.recompute import apply_recompute, excluded_ops, recompute_plan
from mspretrain.train.switches import check_recompute_switches
from test_recompute import matmuls_in_compiled_step
from trainer_harness import ARGS, BATCHES, make_step


def _model():
    from mspretrain.train.models.llama.model import Llama
    return Llama(ARGS, seed=11)


def test_excluded_ops_are_marked_in_every_recomputed_layer():
    cfg = load_config(None, ["recompute.mode=select", "recompute.select={mlp: '0-1', attention: '1'}",
                             "recompute.exclude=[mlp.w1.matmul, attention.wq.matmul]"])
    model = _model()
    apply_recompute(model, cfg.recompute)
    assert sorted(excluded_ops(model)) == ["layers.0.mlp.w1.matmul", "layers.1.attention.wq.matmul",
                                           "layers.1.mlp.w1.matmul"]
    assert model.layers[0].mlp.w1.matmul.attrs["recompute"] is False


@pytest.mark.parametrize("sets, message", [
    (["recompute.exclude=[mlp.w1.matmul]"], "recompute.mode is 'none'"),
    (["recompute.mode=full", "recompute.exclude=[mlp.w9.matmul]"], "is no primitive of a layer"),
    (["recompute.mode=select", "recompute.select={attention: '0'}", "recompute.exclude=[mlp.w1.matmul]"],
     "in no recomputed cell"),
    (["recompute.mode=full", "recompute.exclude=mlp"], "expected a list"),      # the loader's type check
])
def test_invalid_exclusions_name_the_key(sets, message):
    with pytest.raises(ConfigError, match="recompute.exclude") as err:
        cfg = load_config(None, sets)
        recompute_plan(cfg.recompute, 2)
        apply_recompute(_model(), cfg.recompute)
    assert message in str(err.value)


def test_mp_comm_false_marks_the_cells_communication_and_optimizer_comm_is_refused():
    base = ["device=Ascend", "model.num_heads=4", "parallel.model_parallel=2", "recompute.mode=full"]
    cfg = load_config(None, [*base, "recompute.mp_comm=false"])
    check_recompute_switches(cfg)
    model = _model()
    apply_recompute(model, cfg.recompute)
    # Cell.recompute(mp_comm_recompute=False) marks every primitive of the cell (2.10's _mp_comm_recompute)
    assert model.layers[0].attention.wq.matmul.attrs["recompute_comm_op"] is False
    default = _model()
    apply_recompute(default, load_config(None, ["recompute.mode=full"]).recompute)
    assert "recompute_comm_op" not in default.layers[0].attention.wq.matmul.attrs   # today's graph
    for sets in (["recompute.mp_comm=false"], ["device=Ascend", "recompute.mode=full", "recompute.mp_comm=false"]):
        with pytest.raises(ConfigError, match="recompute.mp_comm"):
            check_recompute_switches(load_config(None, sets))
    with pytest.raises(ConfigError, match="recompute.optimizer_comm.*parallel.optimizer_level=level3"):
        check_recompute_switches(load_config(None, [*base, "recompute.optimizer_comm=true"]))


def test_exclusion_keeps_losses_bitwise(graph_mode):
    _, plain = make_step("recompute.mode=select", "recompute.select={mlp: '0-1'}")
    _, kept = make_step("recompute.mode=select", "recompute.select={mlp: '0-1'}", "recompute.exclude=[mlp.w1.matmul]")
    for batch in BATCHES[:2]:
        a, b = plain(batch, 1e-3), kept(batch, 1e-3)
        assert a.loss.hex() == b.loss.hex() and a.grad_norm.hex() == b.grad_norm.hex()


def test_compiled_graph_does_not_recompute_the_excluded_matmul(tmp_path):
    """Selecting the MLP recomputes w1 and w3 in backward (w2's product is the cell's output, kept);
    excluding w1's matmul leaves one fewer MatMul per recomputed layer (2 layers)."""
    mlp, _ = matmuls_in_compiled_step(tmp_path, "recompute.mode=select", "recompute.select={mlp: '0-1'}")
    kept, _ = matmuls_in_compiled_step(tmp_path, "recompute.mode=select", "recompute.select={mlp: '0-1'}",
                                       "recompute.exclude=[mlp.w1.matmul]")
    assert kept == mlp - 2
