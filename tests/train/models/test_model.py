import math

import numpy as np
import pytest

from mspretrain.train.config import load_config
from mspretrain.train.models.flops import flops_per_token
from mspretrain.train.models.llama.model import ModelArgs, model_args, rotary_tables

ARGS = ModelArgs(vocab_size=128, seq_length=16, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)


def _weights(model) -> dict:
    return {p.name: p.asnumpy() for p in model.get_parameters()}


def test_names_shapes_and_seeded_init(graph_mode):
    from mspretrain.train.models.llama.model import Llama

    a, b, c = Llama(ARGS, seed=7), Llama(ARGS, seed=7), Llama(ARGS, seed=8)
    wa, wb, wc = _weights(a), _weights(b), _weights(c)
    assert wa["layers.1.attention.wq.weight"].shape == (32, 32)
    assert wa["layers.1.attention.wk.weight"].shape == (16, 32)      # 2 KV heads of 8
    assert wa["layers.0.mlp.w1.weight"].shape == (128, 32)           # 8/3 * 32 rounded up to 64
    assert {"layers.0.attention_norm.weight", "layers.0.ffn_norm.weight", "norm.weight",
            "output.weight", "tok_embeddings.embedding_table"} <= set(wa)
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)             # same seed: same bytes
    assert not np.array_equal(wa["layers.0.mlp.w2.weight"], wc["layers.0.mlp.w2.weight"])
    tied = Llama(ModelArgs(**{**ARGS.__dict__, "tie_embeddings": True}), seed=7)
    assert "output.weight" not in _weights(tied)


def test_causal_and_initial_loss(graph_mode):
    """A token never sees the future: changing the last input token leaves earlier logits unchanged;
    at init the loss is about ln(vocab)."""
    from mindspore import Tensor
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.llama.model import Llama

    model = Llama(ARGS, seed=1)
    ids = np.random.default_rng(0).integers(0, 128, size=(2, 16)).astype(np.int32)
    changed = ids.copy()
    changed[:, -1] = (changed[:, -1] + 1) % 128
    out1, out2 = model(Tensor(ids)).asnumpy(), model(Tensor(changed)).asnumpy()
    assert out1.shape == (2, 16, 128)
    np.testing.assert_array_equal(out1[:, :-1], out2[:, :-1])
    assert not np.allclose(out1[:, -1], out2[:, -1])
    loss = CausalLMLoss(model, 128)(Tensor(np.concatenate([ids, ids[:, :1]], 1))).asnumpy()
    assert abs(float(loss) - math.log(128)) < 0.1


def test_grouped_kv_equals_repeated_heads(graph_mode):
    """Grouped KV attention == full multi-head attention whose K/V heads are the grouped ones repeated."""
    from mindspore import Tensor
    from mspretrain.train.models.llama.model import Llama

    grouped = Llama(ARGS, seed=2)
    full = Llama(ModelArgs(**{**ARGS.__dict__, "num_kv_heads": 0}), seed=2)
    for name, p in full.parameters_and_names():
        w = dict(grouped.parameters_and_names())[name].asnumpy()
        if name.endswith(("attention.wk.weight", "attention.wv.weight")):
            w = np.repeat(w.reshape(2, 8, 32), 2, axis=0).reshape(32, 32)  # kv head h serves q heads 2h, 2h+1
        p.set_data(Tensor(w))
    ids = Tensor(np.arange(32, dtype=np.int32).reshape(2, 16))
    np.testing.assert_allclose(grouped(ids).asnumpy(), full(ids).asnumpy(), rtol=1e-5, atol=1e-6)


def test_rotary_is_a_rotation():
    cos, sin = rotary_tables(16, 8, 10000.0)
    np.testing.assert_allclose(cos ** 2 + sin ** 2, 1.0, rtol=1e-6)
    assert cos[0].tolist() == [1.0] * 4 and sin[0].tolist() == [0.0] * 4


def test_model_args_from_config_and_flops():
    cfg = load_config(None, ["model.hidden_size=64", "model.num_heads=4", "model.flash_attention=true"])
    args = model_args(cfg.model, vocab_size=100, seq_length=32, device="CPU")
    assert args.vocab_size == 100 and args.ffn == 192 and not args.flash_attention   # no FA on CPU
    assert model_args(cfg.model, 100, 32, "Ascend", "bf16").flash_attention
    assert not model_args(cfg.model, 100, 32, "Ascend", "fp32").flash_attention
    n = 1000
    assert flops_per_token(args, n + 100 * 64) == 6 * n + 12 * 2 * 64 * 32


@pytest.mark.parametrize("heads,kv", [(3, 0), (4, 3)])
def test_bad_head_counts(graph_mode, heads, kv):
    from mspretrain.train.models.llama.model import Llama

    with pytest.raises(ValueError, match="multiple of"):
        Llama(ModelArgs(vocab_size=16, seq_length=8, hidden_size=32, num_heads=heads, num_kv_heads=kv), 0)
