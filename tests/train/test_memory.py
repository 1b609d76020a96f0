"""The memory planner: exact static accounting, what sharding and recompute divide, pipeline
in-flight micro-batches, advice order, and `train estimate` end to end."""
from __future__ import annotations

import re

import pytest

from synthetic import make_dataset
from mspretrain.train.config import ConfigError, load_config
from mspretrain.train.layouts import main
from mspretrain.train.memory import GB, advise, bytes_per_param, estimate, format_estimate, parse_size
from mspretrain.train.models.llama.memory import count_params, head_activation_bytes, layer_activation_bytes

LLAMA_7B = ["device=Ascend", "model.hidden_size=4096", "model.num_layers=32", "model.num_heads=32",
            "model.ffn_size=11008", "model.vocab_size=32000", "train.global_batch_size=64"]
SEQ, VOCAB = 4096, 32000


def cfg_7b(*sets):
    return load_config(None, [*LLAMA_7B, *sets])


def test_7b_mixed_precision_adam_is_18_bytes_per_parameter():
    cfg = cfg_7b("precision.dtype=bf16")
    est = estimate(cfg, SEQ, VOCAB)
    n = count_params(cfg, VOCAB)
    assert n == 6_738_415_616                       # Llama-2-7B's parameter count
    assert est.params_device == n
    # gradients follow the parameters' dtype: the master weights are fp32, so are their gradients
    assert bytes_per_param("bf16").total == bytes_per_param("fp16").total == 18
    assert (est.weights, est.grads, est.optimizer) == (2 * n, 4 * n, 12 * n)
    assert est.static == 18 * n                     # 121.3 GB before activations
    assert 120 * GB < est.static < 123 * GB
    assert bytes_per_param("fp32").total == 16 and bytes_per_param("fp32").master == 0
    with pytest.raises(ConfigError, match="precision.dtype"):
        bytes_per_param("fp8")


def test_model_parallel_divides_projections_not_norms():
    base = estimate(cfg_7b("precision.dtype=bf16"), SEQ, VOCAB)
    mp = estimate(cfg_7b("precision.dtype=bf16", "parallel.model_parallel=8"), SEQ, VOCAB)
    h, layers = 4096, 32
    replicated = layers * 2 * h + h + VOCAB * h     # norms + final norm + data-parallel embedding
    assert mp.params_device == pytest.approx((base.params_device - replicated) / 8 + replicated)
    vocab_split = estimate(cfg_7b("precision.dtype=bf16", "parallel.model_parallel=8",
                                  "parallel.vocab_emb_dp=false"), SEQ, VOCAB)
    assert vocab_split.params_device == pytest.approx(mp.params_device - VOCAB * h * 7 / 8)


def test_optimizer_sharding_levels_divide_what_they_shard():
    base = estimate(cfg_7b("parallel.data_parallel=8"), SEQ, VOCAB)
    l1, l2, l3 = (estimate(cfg_7b("parallel.data_parallel=8", "parallel.optimizer_shard=true",
                                  f"parallel.optimizer_level={lv}"), SEQ, VOCAB)
                  for lv in ("level1", "level2", "level3"))
    assert l1.optimizer == pytest.approx(base.optimizer / 8)
    assert (l1.weights, l1.grads) == (base.weights, base.grads)
    assert l2.grads == pytest.approx(base.grads / 8) and l2.weights == base.weights
    assert l3.weights == pytest.approx(base.weights / 8)
    assert base.activations == l1.activations == l3.activations
    assert base.static > l1.static > l2.static > l3.static


def test_pipeline_keeps_a_stage_of_layers_and_its_micro_batches_in_flight():
    cfg = cfg_7b("parallel.pipeline_stage=4", "parallel.micro_batch_num=8", "parallel.data_parallel=2")
    est = estimate(cfg, SEQ, VOCAB)
    assert len(est.layer_activations) == 8
    assert est.micro_batch == 64 // 2 // 8
    # worst stage: stage 0 holds 4 micro-batches in flight under 1F1B, the last one 1 plus the logits
    assert est.stage == 0 and est.in_flight == 4
    assert est.activations == pytest.approx((sum(est.layer_activations) + est.document_activations) * 4)
    assert est.document_activations > 0                # the packed-document mask, on by default
    one = estimate(cfg_7b("parallel.data_parallel=2"), SEQ, VOCAB)
    assert est.params_device < one.params_device / 3


def test_recompute_lowers_activations_in_order():
    def act(*sets):
        return estimate(cfg_7b("precision.dtype=bf16", "model.flash_attention=false", *sets), SEQ, VOCAB)
    none = act()
    attn = act("recompute.mode=select", "recompute.select={attention: '0-31'}")
    mlp = act("recompute.mode=select", "recompute.select={mlp: '0-31'}")
    half = act("recompute.mode=full", "recompute.full_layers=0-15")
    full = act("recompute.mode=full")
    assert none.activations > attn.activations > full.activations
    assert none.activations > mlp.activations > full.activations
    assert none.activations > half.activations > full.activations
    # full recompute keeps the layer input only: seq * micro * hidden * 2 bytes per layer
    assert full.layer_activations[0] == SEQ * 1 * 4096 * 2 * (64 // 1)
    assert none.static == full.static


def test_layer_activations_scale_with_what_splits_them():
    """Not the formula again: how it must move. Per-token tensors split by sequence parallel, per-head
    and per-ffn ones by model parallel, everything linear in the micro-batch, the scores quadratic in
    the sequence (without flash attention) and linear with it."""
    small = ["device=Ascend", "model.flash_attention=false", "model.hidden_size=64", "model.num_heads=4",
             "model.ffn_size=128"]
    cfg = load_config(None, small)
    s, b = 16, 2
    base = layer_activation_bytes(cfg, s, b)
    tp = load_config(None, [*small, "parallel.model_parallel=2"])
    sp = load_config(None, [*small, "parallel.model_parallel=2", "parallel.sequence_parallel=true"])
    assert layer_activation_bytes(sp, s, b) == pytest.approx(base / 2)
    assert base / 2 < layer_activation_bytes(tp, s, b) < base
    assert layer_activation_bytes(cfg, s, 2 * b) == pytest.approx(2 * base)
    # doubling the sequence doubles the token terms and quadruples the scores: the second difference
    # isolates the scores, which must be the fp32 [heads, S, S] softmax per sample
    f1, f2, f4 = (layer_activation_bytes(cfg, k * s, b) for k in (1, 2, 4))
    assert (f4 - 2 * f2) / 8 == pytest.approx(4 * s * s * b * 4)     # 4 heads, fp32, per sample
    assert f4 - 2 * f2 == pytest.approx(4 * (f2 - 2 * f1))
    flash = load_config(None, [*small[:1], *small[2:]])
    g1, g2 = layer_activation_bytes(flash, s, b), layer_activation_bytes(flash, 2 * s, b)
    assert g2 == pytest.approx(2 * g1)                        # flash attention: no [S, S] tensor kept


def test_advice_is_ordered_by_cost_and_ends_when_it_fits():
    cfg = cfg_7b("precision.dtype=bf16", "parallel.data_parallel=8", "train.micro_batch_size=1")
    advice = advise(cfg, SEQ, VOCAB, 64e9)
    names = [a.change.split(":")[0] for a in advice]
    assert names[:2] == ["select recompute (attention)", "full recompute"]
    assert names[2].startswith("optimizer sharding")
    assert advice[-1].fits and not any(a.fits for a in advice[:-1])
    totals = [a.estimate.total for a in advice]
    assert totals == sorted(totals, reverse=True)
    assert "--set parallel.optimizer_shard=true" in advice[-1].change
    assert advise(cfg, SEQ, VOCAB, 1e15) == []


def test_advice_without_data_parallel_goes_to_pipeline_and_model_parallel():
    # one data-parallel rank: optimizer sharding is impossible, mp/pp cannot be taken from dp either
    cfg = cfg_7b("precision.dtype=bf16", "train.micro_batch_size=1")
    advice = advise(cfg, SEQ, VOCAB, 64e9)
    assert all("optimizer sharding" not in a.change for a in advice)
    assert not advice[-1].fits
    wide = cfg_7b("precision.dtype=bf16", "parallel.data_parallel=8", "train.micro_batch_size=8",
                  "model.flash_attention=false")
    tight = advise(wide, SEQ, VOCAB, 44e9)
    names = [a.change.split(":")[0] for a in tight]
    assert names[-1] == "double model parallel" and tight[-1].fits
    assert "--set parallel.data_parallel=4 --set parallel.model_parallel=2" in tight[-1].change
    totals = [a.estimate.total for a in tight]
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == len(totals)


def test_parse_size():
    assert parse_size("64GB") == 64e9
    assert parse_size("80GiB") == 80 * 2 ** 30
    assert parse_size("512 MB") == 512e6
    assert parse_size("1.5TB") == 1.5e12
    with pytest.raises(ConfigError, match="--device-memory"):
        parse_size("lots")


def test_train_estimate_prints_and_advises(tmp_path, capsys):
    data = make_dataset(tmp_path / "d", num_train=8, num_valid=4, seq_length=32, vocab_size=128)
    cfg = load_config(None, [f"data.path={data}", "train.global_batch_size=4"])
    assert main(cfg, "64GB") == 0
    out = capsys.readouterr().out
    assert "fits" in out and "seq 32" in out and "16 bytes/parameter" in out     # fp32
    assert "cheapest changes" not in out
    big = load_config(None, [f"data.path={data}", *LLAMA_7B[1:], "precision.dtype=bf16",
                             "parallel.data_parallel=8", "device=Ascend"])
    main(big, "10GB")
    out = capsys.readouterr().out
    assert "does NOT fit" in out and "cheapest changes" in out
    with pytest.raises(ConfigError, match="data.path"):
        main(load_config(None, []), "64GB")


def test_format_mentions_every_component():
    cfg = cfg_7b("precision.dtype=bf16", "parallel.pipeline_stage=2", "parallel.micro_batch_num=4")
    text = format_estimate(cfg, estimate(cfg, SEQ, VOCAB), 64e9)
    for word in ("weights", "gradients", "optimizer states", "activations", "communication", "total",
                 "micro-batch(es) in flight", "recompute none", "does NOT fit"):
        assert word in text


def test_estimate_without_a_dataset_takes_seq_length_and_the_configured_vocab(capsys):
    from trainer_harness import REPO

    cfg = load_config(REPO / "configs" / "llama-7b.yaml", ["model.vocab_size=32000"])
    assert main(cfg, "64GB", seq_length=4096) == 0
    out = capsys.readouterr().out
    assert "6.738 B parameters" in out and "seq 4096" in out and "recompute none" in out
    with pytest.raises(ConfigError, match="--seq-length"):
        main(load_config(REPO / "configs" / "llama-7b.yaml"), "64GB", seq_length=4096)


# ---------------------------------------------------------------- what our trainer adds

def test_accumulators_only_with_micro_batches_and_the_update_on_top_of_the_static_bytes():
    cfg = cfg_7b("precision.dtype=bf16", "model.flash_attention=false")
    est = estimate(cfg, SEQ, VOCAB)
    n = count_params(cfg, VOCAB)
    assert est.static == 18 * n
    assert est.accumulators == 0                    # one micro-batch per step: no gradient sums
    accum = estimate(cfg_7b("precision.dtype=bf16", "model.flash_attention=false", "train.micro_batch_size=8"),
                     SEQ, VOCAB)
    assert accum.accumulators == 4 * n              # 64 / 8 = 8 micro-batches: fp32 sums
    assert est.reuse and est.step_temps == 4 * n
    # Ascend reuses backward's freed gradients and activations for the update's buffers
    assert est.trainer == max(0.0, est.step_temps - est.grads - est.activations)
    assert est.total == pytest.approx(est.static + est.activations + est.trainer + est.comm)
    sharded = [estimate(cfg_7b("precision.dtype=bf16", "parallel.data_parallel=8", "parallel.optimizer_shard=true",
                               "train.micro_batch_size=1", f"parallel.optimizer_level={lv}"), SEQ, VOCAB)
               for lv in ("level1", "level2")]
    assert sharded[0].accumulators == pytest.approx(4 * n)          # level1: states only
    assert sharded[1].accumulators == pytest.approx(4 * n / 8)      # level2: with the gradients
    text = format_estimate(cfg, est)
    assert "accumulators" in text and "update" in text


def cpu_cfg(*sets):
    return load_config(None, ["device=CPU", "precision.dtype=fp32", "model.hidden_size=1024", "model.num_layers=4",
                              "model.num_heads=16", "model.vocab_size=8192", "train.global_batch_size=4", *sets])


def test_cpu_keeps_every_buffer_of_the_graph():
    cpu = estimate(cpu_cfg(), 256, 8192)
    ascend = estimate(cpu_cfg("device=Ascend"), 256, 8192)
    n = cpu.params_device
    assert not cpu.reuse and ascend.reuse
    assert cpu.step_temps == 8 * n                  # unscaled + clipped, none reused
    assert estimate(cpu_cfg("optim.clip_norm=0"), 256, 8192).step_temps == 4 * n
    assert estimate(cpu_cfg("train.micro_batch_size=1"), 256, 8192).step_temps == 12 * n   # + zeroing
    assert cpu.trainer == cpu.accumulators + cpu.step_temps
    # every forward and backward intermediate vs what backward keeps: several times more
    assert cpu.activations > 4 * ascend.activations
    # recompute frees nothing on CPU (each graph keeps its buffers), and so is never advised there
    full = estimate(cpu_cfg("recompute.mode=full"), 256, 8192)
    assert full.activations == cpu.activations
    advice = advise(cpu_cfg("parallel.data_parallel=2", "train.global_batch_size=8"), 256, 8192, 1e9)
    assert advice and not any("recompute" in a.change for a in advice)


def test_parameter_count_is_the_real_networks():
    """count_params against the parameters of the real train.models.llama.model.Llama (and its per-layer split
    against the real layer's matrices and norm vectors), untied and tied, with grouped KV heads."""
    import numpy as np

    from mspretrain.train.models.llama.memory import layer_params
    from mspretrain.train.models.llama.model import Llama, model_args

    for sets in ([], ["model.tie_embeddings=true"], ["model.num_kv_heads=2", "model.ffn_size=96"]):
        cfg = load_config(None, ["model.hidden_size=64", "model.num_layers=3", "model.num_heads=4", *sets])
        model = Llama(model_args(cfg.model, 100, 8, "CPU", "fp32"), seed=0)
        real = sum(int(np.prod(p.shape)) for p in model.get_parameters())
        assert count_params(cfg, 100) == real, sets
        layer = [p for p in model.get_parameters() if p.name.startswith("layers.0.")]
        split, replicated = layer_params(cfg)
        assert split == sum(int(np.prod(p.shape)) for p in layer if len(p.shape) == 2)
        assert replicated == sum(int(np.prod(p.shape)) for p in layer if len(p.shape) == 1)


def test_cpu_intermediates_scale_like_a_graph_that_keeps_everything():
    cfg = load_config(None, ["device=CPU", "precision.dtype=fp32", "model.hidden_size=64", "model.num_heads=4",
                             "model.ffn_size=128"])
    s, b = 16, 2
    one = layer_activation_bytes(cfg, s, b)
    assert layer_activation_bytes(cfg, s, 2 * b) == pytest.approx(2 * one)      # linear in the micro-batch
    f1, f2, f4 = (layer_activation_bytes(cfg, k * s, b) for k in (1, 2, 4))
    assert f4 - 2 * f2 == pytest.approx(4 * (f2 - 2 * f1))                      # quadratic through scores
    ascend = load_config(None, ["device=Ascend", "model.flash_attention=false", "precision.dtype=fp32",
                                "model.hidden_size=64", "model.num_heads=4", "model.ffn_size=128"])
    assert one > 3 * layer_activation_bytes(ascend, s, b)     # every intermediate vs what backward keeps
    h1, h2 = head_activation_bytes(cfg, s, b, 100), head_activation_bytes(cfg, s, b, 200)
    assert h2 > h1 and head_activation_bytes(cfg, s, 2 * b, 100) == pytest.approx(2 * h1)


def test_loss_path_is_split_by_model_parallel():
    """The logits and the loss's [B*S, V] tensors are vocabulary-split (the plan shards the head and the
    loss primitives (dp, mp)): model parallel divides the vocabulary terms."""
    cfg = cfg_7b("precision.dtype=bf16", "model.flash_attention=false")
    mp = cfg_7b("precision.dtype=bf16", "parallel.model_parallel=8")
    one, split = head_activation_bytes(cfg, SEQ, 1, VOCAB), head_activation_bytes(mp, SEQ, 1, VOCAB)
    vocab_terms = head_activation_bytes(cfg, SEQ, 1, 2 * VOCAB) - one
    assert vocab_terms > 0.9 * one                  # the logits dominate at vocab 32000
    assert split == pytest.approx(one - vocab_terms * 7 / 8)


@pytest.mark.parametrize("dtype, flash", [("fp32", False), ("bf16", True)])
def test_document_term_is_the_tensors_the_model_builds_for_its_layers(graph_mode, dtype, flash):
    """Ascend/GPU (buffers reused): what packed-document masking keeps for every layer is what
    Llama.documents returns for a micro-batch: the bool mask [B, 1, S, S] (plain attention) or the
    kernel's document ends [B * L] (flash attention, 16-bit), and the rotary tables. Counted here from
    the real tensors, not from the formula."""
    import numpy as np
    from mindspore import Tensor

    from mspretrain.train.memory import estimate
    from mspretrain.train.models.llama.memory import document_activation_bytes
    from mspretrain.train.models.llama.model import Llama, model_args

    seq, micro = 32, 3
    cfg = load_config(None, ["device=Ascend", f"precision.dtype={dtype}", "model.hidden_size=64",
                             "model.num_heads=4", "model.num_layers=2", "model.max_documents=8",
                             "model.vocab_size=64", f"train.global_batch_size={micro}"])
    args = model_args(cfg.model, 64, seq, "Ascend", dtype, eos_id=2)
    assert args.flash_attention == flash and args.document_mask and args.reset_position_ids
    tokens = np.random.default_rng(0).integers(3, 64, size=(micro, seq)).astype(np.int32)
    tokens[:, ::5] = 2
    mask, cos, sin = Llama(args, seed=0).documents(Tensor(tokens))
    assert mask.shape == ((micro * 8,) if flash else (micro, 1, seq, seq))
    assert document_activation_bytes(cfg, seq, micro) == mask.nbytes + cos.nbytes + sin.nbytes
    off = load_config(None, ["device=Ascend", f"precision.dtype={dtype}", "model.hidden_size=64",
                             "model.num_heads=4", "model.num_layers=2", "model.max_documents=8",
                             "model.vocab_size=64", f"train.global_batch_size={micro}",
                             "model.document_mask=false", "model.reset_position_ids=false"])
    assert document_activation_bytes(off, seq, micro) == 0
    on_est, off_est = estimate(cfg, seq, 64), estimate(off, seq, 64)
    assert on_est.activations - off_est.activations == pytest.approx(mask.nbytes + cos.nbytes + sin.nbytes)


def estimate_cli(capsys, *args: str) -> str:
    from mspretrain.train.cli import main as train

    from trainer_harness import REPO

    assert train(["estimate", "--config", str(REPO / "configs" / "tiny.yaml"), "--seq-length", str(SEQ), *args]) == 0
    return capsys.readouterr().out


def small(*sets: str) -> list[str]:
    """A 7B-shaped Ascend config on 8 devices (one node), as `--set` arguments."""
    base = [*LLAMA_7B, "model.num_kv_heads=0", "precision.dtype=bf16", "parallel.data_parallel=8", "parallel.optimizer_shard=true",
            "parallel.sequence_parallel=false", "train.global_batch_size=32", *sets]
    return [a for s in base for a in ("--set", s)]


def test_estimate_times_each_recompute_and_advises_the_fastest_that_fits(capsys):
    """`train estimate` gives memory and modelled step time for none / select / full recompute; with
    memory to spare the config's full recompute is advised away (recompute only costs time)."""
    out = estimate_cli(capsys, *small("recompute.mode=full", "train.micro_batch_size=1"), "--device-memory", "400GB")
    rows = {line.rsplit(")  ", 1)[1]: line for line in out.splitlines() if ")  " in line}
    keys = ("none", "select attention 0-31", "full 0-31")
    times = [float(re.search(r"GB +([0-9.]+) s", rows[k]).group(1)) for k in keys]
    mems = [float(re.search(r"([0-9.]+) GB", rows[k]).group(1)) for k in keys]
    assert times == sorted(times) and mems == sorted(mems, reverse=True) and len(set(times)) == 3
    assert "step time (model)" in out and "not overlapped" in out
    assert "fastest that fits:" in out and "--set recompute.mode=none" in out


def test_the_margin_decides_what_fits(capsys):
    """The same config fits without recompute at margin 0; a 30% margin asks for a recompute layout
    (the fewest first layers that fit), and the verdict line names the margin."""
    sets = small("train.micro_batch_size=4")
    total = estimate(cfg_7b("precision.dtype=bf16", "parallel.data_parallel=8", "parallel.optimizer_shard=true",
                            "train.global_batch_size=32", "train.micro_batch_size=4"), SEQ, VOCAB).total
    device = f"{total * 1.05 / GB:.2f}GB"
    loose = estimate_cli(capsys, *sets, "--device-memory", device, "--margin", "0")
    assert "this config is the fastest layout that fits" in loose and "fits (" in loose
    tight = estimate_cli(capsys, *sets, "--device-memory", device, "--margin", "30%")
    assert "less a" in tight and "30%" in tight and "does NOT fit" in tight
    assert "this config is the fastest" not in tight
    assert re.search(r"--set recompute\.mode=(select|full)|--set train\.micro_batch_size=[12]\b", tight)
    with pytest.raises(ConfigError, match="--margin"):
        main(cfg_7b(), "64GB", seq_length=SEQ, margin="150%")


def test_a_smaller_micro_batch_beats_recompute():
    """Micro-batch 4 fits only with recompute; micro-batch 1 (4x the accumulation) fits without it and
    is modelled faster: the advice is the smaller micro-batch, with no recompute."""
    from mspretrain.train.layouts import evaluate, fastest

    cfg = cfg_7b("precision.dtype=bf16", "parallel.data_parallel=8", "parallel.optimizer_shard=true",
                 "train.global_batch_size=32", "train.micro_batch_size=4", "recompute.mode=full")
    one = cfg_7b("precision.dtype=bf16", "parallel.data_parallel=8", "parallel.optimizer_shard=true",
                 "train.global_batch_size=32", "train.micro_batch_size=1")
    usable = evaluate(one, SEQ, VOCAB).memory * 1.01
    two = cfg_7b("precision.dtype=bf16", "parallel.data_parallel=8", "parallel.optimizer_shard=true",
                 "train.global_batch_size=32", "train.micro_batch_size=2")
    assert not evaluate(two, SEQ, VOCAB).fits(usable)                   # only micro-batch 1 runs without recompute
    assert evaluate(cfg, SEQ, VOCAB).fits(usable)
    best = fastest(cfg, SEQ, VOCAB, usable)
    assert best.cfg.train.micro_batch_size == 1 and best.cfg.recompute.mode == "none"
    assert best.fits(usable) and best.time.total < evaluate(cfg, SEQ, VOCAB).time.total


def test_full_recompute_of_the_first_layers_of_each_stage():
    """With pipeline stages the recompute range is the first N layers of each stage, N the fewest that
    fit; it is a valid recompute.full_layers and costs less time than recomputing every layer."""
    from mspretrain.train.layouts import evaluate, first_layers, least, with_recompute

    cfg = cfg_7b("precision.dtype=bf16", "parallel.pipeline_stage=2", "parallel.micro_batch_num=4",
                 "parallel.data_parallel=4", "train.global_batch_size=16", "model.num_layers=8")
    assert first_layers(cfg, 2) == "0-1,4-5" and first_layers(cfg, 4) == "0-7"
    none, every = (evaluate(with_recompute(cfg, m, 4), SEQ, VOCAB) for m in ("none", "full"))
    usable = every.memory + 0.3 * (none.memory - every.memory)
    found = least(cfg, "full", SEQ, VOCAB, usable)
    layers = found.cfg.recompute.full_layers
    assert found.fits(usable) and layers and layers != "0-7" and "," in layers
    assert found.time.total < every.time.total
    n = len(layers.split(",")[0].split("-"))
    fewer = with_recompute(cfg, "full", int(layers.split(",")[0].split("-")[-1]))   # one layer fewer per stage
    assert n and not evaluate(fewer, SEQ, VOCAB).fits(usable)


def test_estimate_reports_topology_errors_and_warnings(capsys):
    out = estimate_cli(capsys, *small("parallel.model_parallel=8", "parallel.data_parallel=1",
                                      "parallel.optimizer_shard=false"))
    assert "warning: parallel.model_parallel=8 is above 4" in out and "MindFormers" in out
    out = estimate_cli(capsys, *small("parallel.model_parallel=16", "parallel.data_parallel=1",
                                      "parallel.optimizer_shard=false"))
    assert "error: parallel.model_parallel (16) exceeds parallel.devices_per_node (8)" in out
