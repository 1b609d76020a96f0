"""model.fused_kernels: validation naming the key, which implementation each layer holds, the plan's
strategies for the fused primitives, and the default keeping today's layers and config bytes. The
kernels themselves are Ascend-only in MindSpore 2.10 (CPU refuses them at kernel selection), so their
numerics are the doctor's "fused kernels" rung (models/fused_check.py compare_with_composed)."""
import pytest

from mspretrain.train.config import ConfigError, load_config
from mspretrain.train.models.fused import check_fused_kernels
from mspretrain.train.models.llama.model import Llama, ModelArgs, model_args
from mspretrain.train.parallel.apply import annotate
from mspretrain.train.parallel.plan import make_plan

ALL = "model.fused_kernels=[rms_norm, rope, swiglu]"


def test_refused_off_ascend_and_unknown_names_named():
    with pytest.raises(ConfigError, match=r"model\.fused_kernels.*needs device Ascend.*model\.fused_kernels=\[\]"):
        check_fused_kernels(["rms_norm"], "CPU")
    with pytest.raises(ConfigError, match="unknown kernel 'layernorm'"):
        check_fused_kernels(["layernorm"], "Ascend")
    with pytest.raises(ConfigError, match="twice"):
        check_fused_kernels(["rope", "rope"], "Ascend")
    cfg = load_config(None, [ALL])
    with pytest.raises(ConfigError, match="model.fused_kernels"):
        model_args(cfg.model, 64, 16, cfg.device)
    from mspretrain.train.switches import check_switches
    with pytest.raises(ConfigError, match="model.fused_kernels"):
        check_switches(cfg)


def test_each_layer_holds_the_implementation_chosen():
    cfg = load_config(None, ["device=Ascend", ALL])
    fused = Llama(model_args(cfg.model, 64, 16, "Ascend", "bf16"), seed=0)
    plain = Llama(ModelArgs(vocab_size=64, seq_length=16), seed=0)
    layer, ref = fused.layers[0], plain.layers[0]
    assert layer.ffn_norm._primitives["rms_norm"].name == "RmsNorm" and "rsqrt" not in layer.ffn_norm._primitives
    assert fused.norm.fused and not ref.ffn_norm.fused and "rsqrt" in ref.ffn_norm._primitives
    assert layer.attention.rotary._primitives["rope"].name == "RotaryPositionEmbedding"
    assert layer.mlp._primitives["swiglu"].name == "Swiglu" and "silu" in ref.mlp._primitives
    # rotate-half mode 0 takes full-width tables: cat(cos, cos) over D, [1, 1, S, D]
    cos = layer.attention.rotary.cos.asnumpy()
    assert cos.shape == (1, 1, 16, 16)
    assert (cos[0, 0, :, :8] == cos[0, 0, :, 8:]).all()
    assert (cos[0, 0, :, :8] == ref.attention.rotary.cos.asnumpy()).all()
    # the same parameters by name and value: a checkpoint loads into either
    assert {p.name: p.asnumpy().tobytes() for p in fused.get_parameters()} == \
        {p.name: p.asnumpy().tobytes() for p in plain.get_parameters()}


def test_plan_shards_the_fused_primitives_as_the_layers_they_replace():
    from mspretrain.train.step.loss import CausalLMLoss
    sets = ["device=Ascend", "model.vocab_size=128", "model.hidden_size=64", "model.num_heads=4",
            "model.num_layers=2", "train.global_batch_size=8", "parallel.data_parallel=2",
            "parallel.model_parallel=2", "parallel.sequence_parallel=true", "precision.dtype=bf16", ALL]
    cfg = load_config(None, sets)
    plan = make_plan(cfg, 4, 128, 16)
    assert plan.op("layers.0.ffn_norm", "rms_norm").in_strategy == ((2, 2, 1), (1,))     # tokens split
    assert plan.op("layers.0.attention.rotary", "rope").in_strategy == ((2, 2, 1, 1), (2, 1, 1, 1), (2, 1, 1, 1))
    assert plan.op("layers.1.mlp", "swiglu").in_strategy == ((2, 1, 1, 2),)
    assert plan.op("layers.1.mlp", "stack").in_strategy == ((2, 1, 1, 2), (2, 1, 1, 2))
    model = Llama(model_args(cfg.model, 128, 16, "Ascend", "bf16", eos_id=2), seed=0)
    done = annotate(plan, model, CausalLMLoss(model, 128, -1))
    assert len(done) == len(plan.ops)
    assert model.layers[0].mlp.swiglu.attrs["in_strategy"] == ((2, 1, 1, 2),)


def test_rope_shape_limits_are_config_errors():
    from mspretrain.train.parallel.plan import validate
    cfg = load_config(None, ["device=Ascend", "model.vocab_size=128", "model.hidden_size=2048",
                             "model.num_heads=1", "train.global_batch_size=2", "precision.dtype=bf16",
                             "model.fused_kernels=[rope]"])
    with pytest.raises(ConfigError, match="model.fused_kernels rope.*head dim 2048"):
        validate(cfg, 1, 128, 16)


def test_default_keeps_todays_config_bytes():
    cfg = load_config(None, [])
    d = cfg.to_dict()
    assert "fused_kernels" not in d["model"] and "overlap" not in d["parallel"] and "exclude" not in d["recompute"]
    assert load_config(None, ["device=Ascend", ALL]).to_dict()["model"]["fused_kernels"] == ["rms_norm", "rope",
                                                                                           "swiglu"]
