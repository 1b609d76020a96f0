"""Packed samples without cross-document attention: block-causal mask, position reset, EOD loss mask."""
import re
from dataclasses import replace

import numpy as np
import pytest

from mspretrain.train import packing
from mspretrain.train.config import load_config
from mspretrain.train.models.llama.model import ModelArgs

EOS = 2
ARGS = ModelArgs(vocab_size=64, seq_length=16, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                 eos_id=EOS)
MASKED = replace(ARGS, document_mask=True, reset_position_ids=True)


def _two_docs(first_len: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One sample [1, 16]: a first document of `first_len` tokens ending in EOS, then a second one."""
    rng = np.random.default_rng(seed)
    first = np.append(rng.integers(3, 64, first_len - 1), EOS)
    second = rng.integers(3, 64, 16 - first_len)
    return np.concatenate([first, second]).astype(np.int32)[None], second.astype(np.int32)


# ---------------------------------------------------------------- the boundary rules

def test_numpy_boundaries_by_hand():
    t = np.array([[5, 2, 6, 7, 2, 8, 2, 2]], np.int32)
    assert packing.document_ids(t, EOS).tolist() == [[0, 0, 1, 1, 1, 2, 2, 3]]
    assert packing.positions(t, EOS).tolist() == [[0, 1, 0, 1, 2, 0, 1, 0]]
    assert packing.loss_mask(t, EOS).tolist() == [[1, 0, 1, 1, 0, 1, 0, 0]]
    m = packing.block_causal_mask(t, EOS)[0]
    assert m[4].tolist() == [False, False, True, True, True, False, False, False]
    assert m[7].tolist() == [False] * 7 + [True]
    # ends 2, 5, 7 and the sample's end 8 (the EOS in the last slot opens no document): 4 documents
    assert packing.num_documents(t, EOS).tolist() == [4]
    two = np.concatenate([t, np.full((1, 8), 9, np.int32)])
    assert packing.seq_ends(two, EOS, 8).tolist() == [2, 5, 7, 8, 8, 8, 8, 8] + [16] * 8
    # a kernel limit of 3 documents: the third and fourth share the last block; one sample counted
    assert packing.seq_ends(two, EOS, 3).tolist() == [2, 5, 8, 16, 16, 16]
    assert packing.count_over_limit(two, EOS, 3) == 1 and packing.count_over_limit(two, EOS, 4) == 0


def test_graph_boundaries_equal_the_numpy_rules(graph_mode):
    import mindspore as ms
    from mindspore import Tensor

    rng = np.random.default_rng(0)
    t = rng.integers(3, 64, size=(3, 16)).astype(np.int32)
    t[rng.random(t.shape) < 0.25] = EOS
    t[1, :] = EOS                                                   # every token its own document
    t[2, :] = 7                                                     # one document, no EOS
    for limit in (2, 5, 128):
        cell = packing.DocumentBoundaries(EOS, 16, True, True, flash=True, max_documents=limit)
        ends, pos = cell(Tensor(t))
        assert ends.asnumpy().tolist() == packing.seq_ends(t, EOS, limit).tolist()
        assert pos.asnumpy().tolist() == packing.positions(t, EOS).tolist()
    masked, _ = packing.DocumentBoundaries(EOS, 16, True, False)(Tensor(t))
    assert masked.dtype == ms.bool_ and masked.shape == (3, 1, 16, 16)
    np.testing.assert_array_equal(masked.asnumpy(), ~packing.block_causal_mask(t, EOS)[:, None])
    assert packing.count_over_limit(t, EOS, 5) >= 1          # the limits above did cut some sample


@pytest.mark.parametrize("dp", [2, 4])
def test_document_ends_restart_at_each_data_parallel_shard(graph_mode, dp):
    """Under data parallelism the TND kernel of each rank sees its B / dp samples flattened from 0, and
    MindSpore splits the ends by dp without rebasing them: the dp slices of the whole batch's ends must
    equal what each shard computes alone (graph and numpy)."""
    from mindspore import Tensor

    rng = np.random.default_rng(5)
    t = rng.integers(3, 64, size=(4, 16)).astype(np.int32)
    t[rng.random(t.shape) < 0.2] = EOS
    whole = packing.DocumentBoundaries(EOS, 16, True, False, flash=True, max_documents=6)
    whole.data_parallel = dp
    ends = whole(Tensor(t))[0].asnumpy()
    assert ends.tolist() == packing.seq_ends(t, EOS, 6, data_parallel=dp).tolist()
    alone = packing.DocumentBoundaries(EOS, 16, True, False, flash=True, max_documents=6)
    per = 4 // dp
    for shard, part in enumerate(np.split(ends, dp)):
        rows = t[shard * per:(shard + 1) * per]
        assert part.tolist() == alone(Tensor(rows))[0].asnumpy().tolist(), shard
        assert part.tolist() == packing.seq_ends(rows, EOS, 6).tolist()
        assert part[-1] == per * 16 and np.all(np.diff(part) >= 0)
    # one shard: offsets over the whole batch, as before
    assert alone(Tensor(t))[0].asnumpy()[-1] == 4 * 16
    with pytest.raises(ValueError, match="3 data-parallel shards"):
        packing.seq_ends(t, EOS, 6, data_parallel=3)


# ---------------------------------------------------------------- the model

def test_second_document_ignores_the_first_only_with_the_mask(graph_mode):
    from mindspore import Tensor
    from mspretrain.train.models.llama.model import Llama

    a, _ = _two_docs(6, seed=1)
    b = a.copy()
    b[0, :5] = np.random.default_rng(9).integers(3, 64, 5)         # another first document, same length
    for args, isolated in ((replace(ARGS, document_mask=True), True), (MASKED, True), (ARGS, False)):
        model = Llama(args, seed=4)
        la, lb = model(Tensor(a)).asnumpy(), model(Tensor(b)).asnumpy()
        assert not np.array_equal(la[0, :6], lb[0, :6])
        if isolated:
            np.testing.assert_array_equal(la[0, 6:], lb[0, 6:])    # bitwise, every position
        else:
            assert not np.any(np.all(la[0, 6:] == lb[0, 6:], axis=-1))  # every position changed


def test_second_document_equals_the_same_document_alone(graph_mode):
    from mindspore import Tensor
    from mspretrain.train.models.llama.model import Llama

    packed, second = _two_docs(7, seed=2)
    alone = np.concatenate([second, np.full(16 - len(second), 11, np.int32)])[None]
    model = Llama(MASKED, seed=5)
    lp, la = model(Tensor(packed)).asnumpy(), model(Tensor(alone)).asnumpy()
    np.testing.assert_allclose(lp[0, 7:], la[0, :len(second)], rtol=0, atol=1e-5)
    plain = Llama(ARGS, seed=5)                                   # without the mask: not the same
    assert np.abs(plain(Tensor(packed)).asnumpy()[0, 7:] - plain(Tensor(alone)).asnumpy()[0, :9]).max() > 1e-3


def test_eod_loss_ignores_exactly_the_boundary_positions(graph_mode):
    from mindspore import Tensor
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.llama.model import Llama

    ids = np.random.default_rng(3).integers(3, 64, size=(2, 17)).astype(np.int32)
    ids[0, [3, 8, 16]] = EOS          # positions 3 and 8 predict across a boundary; 16 is only a label
    ids[1, [0, 15]] = EOS
    model = Llama(MASKED, seed=6)
    logits = model(Tensor(ids[:, :-1])).asnumpy().astype(np.float64)
    logz = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1)) + logits.max(-1)
    ce = logz - np.take_along_axis(logits, ids[:, 1:, None], -1)[..., 0]
    keep = packing.loss_mask(ids[:, :-1], EOS).astype(bool)
    assert (~keep).sum() == 4 and not keep[0, 3] and not keep[0, 8] and not keep[1, 0] and not keep[1, 15]
    masked = float(CausalLMLoss(model, 64, EOS)(Tensor(ids)).asnumpy())
    assert masked == pytest.approx(ce[keep].mean(), rel=1e-6)     # 28 of 32 positions
    assert abs(masked - ce.mean()) > 1e-4                          # the 4 left out did count


def test_accumulation_stays_exact_with_unequal_loss_tokens(graph_mode):
    """4 micro-batches of 2 with different EOS counts = one batch of 8: the same token mean and update.
    Every micro-batch's loss sum is divided by the whole batch's token count N (train.step.cell); the mean
    of the 4 micro-batch means, what equal weights would train on, is visibly another number."""
    from mindspore import Tensor

    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.llama.model import Llama
    from mspretrain.train.step.optim import build_optimizer
    from mspretrain.train.step.cell import build_train_step
    from trainer_harness import REDUCTION_ORDER_RTOL

    cfg = load_config(None, ["optim.clip_norm=0", "train.accumulate=loop"])

    def make(micro_steps):
        model = Llama(MASKED, seed=11)
        loss_net = CausalLMLoss(model, 64, EOS)
        opt = build_optimizer(loss_net.trainable_params(), cfg.optim)
        return loss_net, build_train_step(loss_net, opt, micro_steps, cfg)

    batch = np.random.default_rng(7).integers(3, 64, size=(8, 17)).astype(np.int32)
    batch[0:2, 2:9] = EOS                       # 14 masked positions in the first micro-batch, none later
    (mean_net, whole), (_, accum) = make(1), make(4)
    means = [float(mean_net(Tensor(batch[i:i + 2])).asnumpy()) for i in range(0, 8, 2)]
    a, b = whole(batch, 1e-3), accum(batch, 1e-3)
    assert a.loss == pytest.approx(b.loss, rel=REDUCTION_ORDER_RTOL)
    assert a.grad_norm == pytest.approx(b.grad_norm, rel=REDUCTION_ORDER_RTOL)
    assert abs(np.mean(means) - a.loss) > 1e-4 * abs(a.loss)     # equal weights: another loss
    wa = {k: p.asnumpy() for k, p in whole.state_parameters().items()}
    for k, p in accum.state_parameters().items():
        np.testing.assert_allclose(p.asnumpy(), wa[k], rtol=1e-4, atol=1e-6, err_msg=k)


def test_tnd_kernel_takes_the_documented_form():
    """the TND flash-attention primitive as MindSpore 2.10's TND restrictions document it:
    sparse_mode 3 (lower triangle), the compressed 2048 x 2048 uint8 mask, next_tokens 0 and
    pre_tokens >= every document's length. Built on CPU (the kernel runs on Ascend only)."""
    from mspretrain.train.models.llama.model import Llama

    args = replace(MASKED, flash_attention=True)
    attention = Llama(args, seed=1).layers[0].attention
    prim = attention.flash_attention_varlen
    from mindspore.common import dtype as mstype
    from mindspore.ops.auto_generate.gen_ops_prim import FlashAttentionScore

    assert prim.input_layout == FlashAttentionScore(head_num=4, input_layout="TND").input_layout   # an enum
    assert prim.sparse_mode == 3 and prim.next_tokens == 0 and prim.pre_tokens >= args.seq_length
    assert attention.fa_mask.shape == (2048, 2048) and attention.fa_mask.dtype == mstype.uint8


def test_config_keys_are_on_in_the_shipped_configs_and_in_the_hash():
    from trainer_harness import REPO

    for name in ("tiny", "llama-1b", "llama-7b", "llama-13b"):
        cfg = load_config(REPO / "configs" / f"{name}.yaml")
        assert cfg.model.document_mask and cfg.model.reset_position_ids and cfg.train.eod_mask_loss
    base = load_config(None).hash()
    for key in ("model.document_mask=false", "model.reset_position_ids=false", "train.eod_mask_loss=false",
                "model.max_documents=64"):
        assert load_config(None, [key]).hash() != base, key


def test_model_args_need_an_eos_id():
    from mspretrain.train.config import ConfigError
    from mspretrain.train.models.llama.model import model_args

    cfg = load_config(None)
    assert model_args(cfg.model, 64, 16, "CPU", "fp32", EOS).document_mask
    assert not model_args(cfg.model, 64, 16, "CPU", "fp32").document_mask      # no dataset: planning only
    with pytest.raises(ConfigError, match="model.document_mask"):
        model_args(cfg.model, 64, 16, "CPU", "fp32", -1)


# ---------------------------------------------------------------- end to end

@pytest.mark.slow
def test_resume_eval_and_accumulation_with_packed_documents(tmp_path):
    """All three on, on a dataset of packed documents, with 4 micro-batches: a run killed with SIGKILL and
    resumed gives bitwise the same losses and validation; `train eval` gives the run's val_loss."""
    from synthetic import make_dataset
    from trainer_harness import exact_view, launch_cmd, records, run, run_killed_at

    data = make_dataset(tmp_path / "data", num_train=128, num_valid=16, seq_length=32, vocab_size=128,
                        seed=4, eos_rate=0.08)
    sets = ("train.steps=12", "checkpoint.every_steps=4", "eval.every_steps=6", "log.every_steps=1",
            "train.micro_batch_size=2")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    r = run(launch_cmd(straight, data, *sets))
    assert r.returncode == 0, r.stderr
    resume = launch_cmd(killed, data, *sets, resume="auto")
    assert run_killed_at(launch_cmd(killed, data, *sets), killed, 6, 0.01, tmp_path / "k.log")
    r = run(resume)
    assert r.returncode == 0, r.stderr
    assert exact_view(killed) == exact_view(straight) and len(exact_view(straight)) == 14

    r = run(launch_cmd(straight, data, *sets, command="eval"))
    assert r.returncode == 0, r.stderr
    val = [x["val_loss"] for x in records(straight) if x.get("eval")][-1]
    assert re.search(r"val_loss (\S+)", r.stdout).group(1) == f"{val:.6f}"


def test_block_mask_reaches_the_layers_as_uint8():
    """the block-causal mask that every layer reads (and that crosses pipeline stages by
    Send/Receive) is uint8, MindFormers' mask type, not bool; each layer casts it back for MaskedFill."""
    import mindspore as ms
    from mindspore import Tensor
    from mindspore.common import dtype as mstype

    from mspretrain.train.models.llama.model import Llama

    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        model = Llama(MASKED, seed=1)
        ids, _ = _two_docs(5, seed=3)
        mask, cos, sin = model.documents(Tensor(ids))
        assert mask.dtype == mstype.uint8 and mask.shape == (1, 1, 16, 16)
        expected = ~packing.block_causal_mask(ids, EOS)        # the graph's mask: True where masked
        np.testing.assert_array_equal(mask.asnumpy().astype(bool), expected.reshape(mask.shape))
    finally:
        ms.set_context(mode=ms.GRAPH_MODE)
