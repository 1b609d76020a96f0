"""The parallel plan: validation, op strategies, stage map and 1F1B figures (pure functions), and
`annotate` putting the strategies on a real model's primitives (runs on CPU: it only records them)."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from mspretrain.train.config import ConfigError, load_config
from mspretrain.train.parallel.distributed import layout
from mspretrain.train.models.llama.parallel import COLUMN, ROW
from mspretrain.train.parallel.plan import format_plan, make_plan, print_plan, stage_layers, validate
from mspretrain.train.parallel.apply import annotate


def ascend(**parallel):
    sets = ["device=Ascend", "model.vocab_size=128", "model.hidden_size=64", "model.num_heads=4",
            "model.num_layers=4", "train.global_batch_size=16"]
    sets += [f"{k}={v}" for k, v in parallel.items()]
    return load_config(None, sets)


# ---------------------------------------------------------------- validation

@pytest.mark.parametrize("sets, world, keys", [
    ({"parallel.data_parallel": 2}, 4, ["parallel.data_parallel", "parallel.model_parallel",
                                        "parallel.pipeline_stage", "4 process"]),
    ({"parallel.model_parallel": 3, "parallel.data_parallel": 1}, 3, ["model.num_heads", "parallel.model_parallel"]),
    ({"parallel.model_parallel": 2, "model.num_kv_heads": 1}, 2, ["model.num_kv_heads"]),
    ({"parallel.model_parallel": 2, "model.ffn_size": 33}, 2, ["model.ffn_size"]),
    ({"parallel.model_parallel": 2, "model.vocab_size": 127}, 2, ["model.vocab_size"]),
    ({"parallel.pipeline_stage": 8, "parallel.micro_batch_num": 8}, 8,
     ["model.num_layers (4)", "parallel.pipeline_stage (8)"]),
    ({"parallel.pipeline_stage": 2, "parallel.micro_batch_num": 1}, 2, ["parallel.micro_batch_num (1)"]),
    ({"parallel.data_parallel": 2, "parallel.pipeline_stage": 2, "parallel.micro_batch_num": 3}, 4,
     ["train.global_batch_size (16)", "parallel.data_parallel (2)", "parallel.micro_batch_num (3)"]),
    ({"parallel.data_parallel": 2, "train.micro_batch_size": 3}, 2, ["train.micro_batch_size (3)"]),
    ({"parallel.sequence_parallel": True}, 1, ["parallel.sequence_parallel", "model_parallel > 1"]),
    ({"parallel.optimizer_shard": True}, 1, ["parallel.optimizer_shard", "data_parallel > 1"]),
    ({"parallel.data_parallel": 2, "parallel.optimizer_shard": True, "parallel.optimizer_level": "level9"}, 2,
     ["parallel.optimizer_level"]),
    ({"parallel.model_parallel": 2, "model.tie_embeddings": True}, 2,
     ["model.tie_embeddings", "parallel.vocab_emb_dp=false"]),
    ({"parallel.pipeline_stage": 2, "parallel.micro_batch_num": 2, "parallel.stage_offsets": "[1]"}, 2,
     ["parallel.stage_offsets", "one per stage"]),
    ({"parallel.pipeline_stage": 2, "parallel.micro_batch_num": 2, "parallel.stage_offsets": "[1, 0]"}, 2,
     ["parallel.stage_offsets", "sum to 0"]),
    ({"parallel.pipeline_stage": 2, "parallel.micro_batch_num": 2, "parallel.stage_offsets": "[-2, 2]"}, 2,
     ["parallel.stage_offsets", "stage 0 with 0 layers"]),
    ({"parallel.model_parallel": 0}, 1, ["parallel.model_parallel must be >= 1"]),
    # the pipeline's micro-batches are the accumulation: no second level of it inside the step
    ({"parallel.pipeline_stage": 2, "parallel.micro_batch_num": 2, "train.micro_batch_size": 4}, 2,
     ["train.micro_batch_size (4)", "parallel.micro_batch_num", "train.micro_batch_size=0"]),
])
def test_validation_names_the_keys(sets, world, keys):
    cfg = ascend(**sets)
    with pytest.raises(ConfigError) as err:
        validate(cfg, world)
    for key in keys:
        assert key in str(err.value)


def test_cpu_refuses_model_and_pipeline_parallel():
    cfg = load_config(None, ["device=CPU", "parallel.model_parallel=2", "model.vocab_size=128"])
    with pytest.raises(ConfigError, match="Ascend only"):
        validate(cfg, 2)
    cfg = load_config(None, ["device=CPU", "parallel.data_parallel=2"])
    validate(cfg, 2)                    # data parallel is fine on CPU


def test_sequence_length_must_split_with_sequence_parallel():
    cfg = ascend(**{"parallel.model_parallel": 2, "parallel.sequence_parallel": True})
    validate(cfg, 2, seq_length=64)
    with pytest.raises(ConfigError, match="seq_length \\(63\\)"):
        validate(cfg, 2, seq_length=63)


def test_vocab_from_the_dataset_is_checked_when_known():
    cfg = ascend(**{"parallel.model_parallel": 2, "model.vocab_size": 0})
    validate(cfg, 2)                    # unknown yet: not checked
    with pytest.raises(ConfigError, match="model.vocab_size \\(101\\)"):
        validate(cfg, 2, vocab_size=101)


# ---------------------------------------------------------------- rank layout

def test_rank_layout_stage_outermost_model_parallel_innermost():
    cfg = ascend(**{"parallel.data_parallel": 2, "parallel.model_parallel": 2, "parallel.pipeline_stage": 2,
                    "parallel.micro_batch_num": 2})
    dp_ranks = [layout(cfg, r, 8).dp_rank for r in range(8)]
    assert dp_ranks == [0, 0, 1, 1, 0, 0, 1, 1]
    infos = [layout(cfg, r, 8) for r in range(8)]
    assert all(i.dp_size == 2 and i.sharded for i in infos)
    assert [i.is_main for i in infos] == [True] + [False] * 7
    plain = load_config(None, ["parallel.data_parallel=3"])
    assert [layout(plain, r, 3).dp_rank for r in range(3)] == [0, 1, 2]
    assert not layout(plain, 0, 3).sharded
    assert layout(load_config(None, ["parallel.data_parallel=2", "parallel.optimizer_shard=true"]), 0, 2).sharded


# ---------------------------------------------------------------- strategies

@pytest.mark.parametrize("dp, mp, pp", [(1, 1, 1), (8, 1, 1), (2, 4, 1), (1, 2, 2), (2, 2, 2), (1, 4, 4)])
def test_every_projection_is_split_megatron_style(dp, mp, pp):
    cfg = ascend(**{"parallel.data_parallel": dp, "parallel.model_parallel": mp, "parallel.pipeline_stage": pp,
                    "parallel.micro_batch_num": max(pp, 1), "train.global_batch_size": 16 * dp})
    plan = make_plan(cfg)
    assert plan.world_size == dp * mp * pp
    for i in range(4):
        for name in COLUMN:
            o = plan.op(f"layers.{i}.{name}")
            assert (o.kind, o.in_strategy, o.out_strategy) == ("MatMul", ((dp, 1), (mp, 1)), None)
        for name in ROW:
            o = plan.op(f"layers.{i}.{name}")
            assert (o.kind, o.in_strategy, o.out_strategy) == ("MatMul", ((dp, mp), (1, mp)), None)
        for prim in ("qk", "pv"):
            o = plan.op(f"layers.{i}.attention", prim)
            assert (o.kind, o.in_strategy) == ("BatchMatMul", ((dp, mp, 1, 1), (dp, mp, 1, 1)))
        o = plan.op(f"layers.{i}.attention", "softmax")
        assert (o.kind, o.in_strategy) == ("Softmax", ((dp, mp, 1, 1),))
    assert plan.op("output").in_strategy == ((dp, 1), (mp, 1))
    assert plan.op("tok_embeddings", "gather").in_strategy == ((1, 1), (dp,))
    assert plan.dataset_strategy == ((dp, 1),)
    for norm in ("layers.2.attention_norm", "layers.2.ffn_norm", "norm"):
        assert plan.op(norm, "square").in_strategy == ((dp, 1, 1),)
    # position reset (on by default): per-token rotary tables [B, 1, S, D/2], split by batch
    assert plan.op("layers.1.attention.rotary", "mul_cos1").in_strategy == ((dp, mp, 1, 1), (dp, 1, 1, 1))
    shared = make_plan(ascend(**{"parallel.data_parallel": dp, "parallel.model_parallel": mp,
                                 "parallel.pipeline_stage": pp, "parallel.micro_batch_num": max(pp, 1),
                                 "train.global_batch_size": 16 * dp, "model.reset_position_ids": False}))
    assert shared.op("layers.1.attention.rotary", "mul_cos1").in_strategy == ((dp, mp, 1, 1), (1, 1))
    assert plan.op("layers.1.mlp", "gate").in_strategy == ((dp, 1, mp), (dp, 1, mp))
    assert plan.op("loss", "sum_exp").in_strategy == ((dp, mp),)       # logits split by vocabulary
    assert len({(o.module, o.prim) for o in plan.ops}) == len(plan.ops)   # nothing twice


def test_sequence_parallel_reduce_scatters_row_parallel_outputs():
    plan = make_plan(ascend(**{"parallel.data_parallel": 2, "parallel.model_parallel": 4,
                               "parallel.sequence_parallel": True}))
    for name in ROW:
        assert plan.op(f"layers.3.{name}").out_strategy == ((8, 1),)
    assert plan.op("layers.3.attention.wq").out_strategy is None


def test_embedding_split_by_vocab_and_tied_head():
    plan = make_plan(ascend(**{"parallel.model_parallel": 4, "parallel.vocab_emb_dp": False}))
    assert plan.op("tok_embeddings", "gather").in_strategy == ((4, 1), (1,))
    tied = make_plan(ascend(**{"parallel.model_parallel": 2, "parallel.vocab_emb_dp": False,
                               "model.tie_embeddings": True, "parallel.pipeline_stage": 2,
                               "parallel.micro_batch_num": 2}))
    assert tied.op("", "tied_head").in_strategy == ((1, 1), (2, 1))
    with pytest.raises(KeyError):
        tied.op("output")
    assert "output" not in tied.stage_of


def test_optimizer_sharding_level():
    assert make_plan(ascend()).optimizer_level is None
    plan = make_plan(ascend(**{"parallel.data_parallel": 4, "parallel.optimizer_shard": True,
                               "parallel.optimizer_level": "level2"}))
    assert plan.optimizer_level == "level2"


# ---------------------------------------------------------------- stages and 1F1B

@pytest.mark.parametrize("layers, pp, offsets, expected", [
    (4, 1, [], ((0, 1, 2, 3),)),
    (4, 2, [], ((0, 1), (2, 3))),
    (5, 2, [], ((0, 1), (2, 3, 4))),             # remainder never on stage 0
    (7, 3, [], ((0, 1), (2, 3, 4), (5, 6))),
    (8, 3, [], ((0, 1), (2, 3, 4), (5, 6, 7))),
    (8, 4, [-1, 0, 0, 1], ((0,), (1, 2), (3, 4), (5, 6, 7))),
    (6, 2, [1, -1], ((0, 1, 2, 3), (4, 5))),
    (4, 4, [], ((0,), (1,), (2,), (3,))),
])
def test_stage_map(layers, pp, offsets, expected):
    stages = stage_layers(layers, pp, offsets)
    assert stages == expected
    assert [i for s in stages for i in s] == list(range(layers))


def test_plan_stage_of_and_in_flight_and_bubble():
    cfg = ascend(**{"parallel.pipeline_stage": 4, "parallel.micro_batch_num": 8, "model.num_layers": 8,
                    "parallel.stage_offsets": "[-1, 0, 0, 1]"})
    plan = make_plan(cfg)
    assert plan.stage_of["tok_embeddings"] == 0
    assert plan.stage_of["norm"] == plan.stage_of["output"] == 3
    assert [plan.stage_of[f"layers.{i}"] for i in range(8)] == [0, 1, 1, 2, 2, 3, 3, 3]
    assert plan.in_flight == (4, 3, 2, 1)
    assert plan.bubble == pytest.approx(3 / 11)
    few = make_plan(ascend(**{"parallel.pipeline_stage": 4, "parallel.micro_batch_num": 4}))
    assert few.bubble == pytest.approx(3 / 7)
    assert make_plan(ascend()).bubble == 0.0


def test_print_plan(capsys):
    cfg = ascend(**{"parallel.data_parallel": 2, "parallel.model_parallel": 2, "parallel.pipeline_stage": 2,
                    "parallel.micro_batch_num": 4})
    print_plan(cfg)
    out = capsys.readouterr().out
    assert "world 8 = data_parallel 2 x model_parallel 2 x pipeline_stage 2" in out
    assert "bubble (p-1)/(m+p-1) = 0.200" in out
    assert "stage 1: layers 2-3 + norm, output" in out
    assert "layers.0.attention.wo.matmul" in out and "((2, 2), (1, 2))" in out
    assert "layers.1." not in out                      # one layer shown
    for shown in ("layers.0.attention.rotary.split", "layers.0.mlp.silu", "layers.0.residual_ffn",
                  "norm.rsqrt", "loss.one_hot"):
        assert shown in out
    with pytest.raises(ConfigError, match="4 process"):
        print_plan(cfg, world_size=4)
    assert "pipeline: off" in format_plan(make_plan(ascend()))


# ---------------------------------------------------------------- applied to the real model

def _model(tie=False, layers=4, flash=False, kv_heads=0, docs=True):
    """docs: packed-document masking and position reset, on as in the default config."""
    from mspretrain.train.models.llama.model import Llama, ModelArgs
    return Llama(ModelArgs(vocab_size=128, seq_length=16, hidden_size=64, num_layers=layers, num_heads=4,
                           num_kv_heads=kv_heads, tie_embeddings=tie, flash_attention=flash,
                           document_mask=docs, reset_position_ids=docs, eos_id=2 if docs else -1), seed=0)


def _loss(model, eod=-1, hits=False):
    from mspretrain.train.step.loss import CausalLMLoss
    return CausalLMLoss(model, 128, eod, hits=hits)


def test_annotate_sets_every_strategy_and_stage_on_the_model():
    cfg = ascend(**{"parallel.data_parallel": 2, "parallel.model_parallel": 2, "parallel.pipeline_stage": 2,
                    "parallel.micro_batch_num": 2, "parallel.sequence_parallel": True})
    plan = make_plan(cfg)
    model = _model()
    done = annotate(plan, model, _loss(model))
    assert len(done) == len(plan.ops)
    cells = dict(model.cells_and_names())
    for o in plan.ops:
        if o.module == "loss":
            continue
        prim = cells[o.module]._primitives[o.prim]
        assert prim.attrs["in_strategy"] == o.in_strategy
        if o.out_strategy:
            assert prim.attrs["out_strategy"] == o.out_strategy
    assert plan.op("layers.0.ffn_norm", "rsqrt").in_strategy == ((2, 2, 1),)   # sequence parallel: tokens
    assert model.layers[1].pipeline_stage == 0 and model.layers[2].pipeline_stage == 1
    assert model.tok_embeddings.pipeline_stage == 0 and model.output.pipeline_stage == 1


# primitives that cannot take a strategy (Reshape, Shape) and nn.Embedding's, which its construct does
# not call with use_one_hot=False (only `gather` runs)
NO_STRATEGY = {"Reshape", "Shape"}
EMBEDDING_UNUSED = {"expand", "one_hot", "array_mul", "concat"}


@pytest.mark.parametrize("flash, kv_heads, docs, sets", [
    (False, 0, False, {"precision.dtype": "fp32", "model.document_mask": False,
      "model.reset_position_ids": False}),
    (False, 2, True, {"precision.dtype": "fp32", "model.num_kv_heads": 2, "parallel.sequence_parallel": True}),
    (True, 2, False, {"precision.dtype": "bf16", "model.num_kv_heads": 2, "model.document_mask": False,
      "model.reset_position_ids": False}),
    (True, 2, True, {"precision.dtype": "bf16", "model.num_kv_heads": 2}),
])
def test_every_primitive_of_the_model_and_loss_gets_its_strategy_from_the_plan(flash, kv_heads, docs, sets):
    """Walk the real cells: each primitive they hold (flash attention, BNSD or TND with packed documents,
    norms, rotary, SiLU * gate, residual adds, head transposes, the block-causal mask, the loss and
    its EOD mask) has the strategy the plan gives it, none is left to the default batch-parallel layout."""
    cfg = ascend(**{"parallel.data_parallel": 2, "parallel.model_parallel": 2, **sets})
    plan = make_plan(cfg)
    model = _model(flash=flash, kv_heads=kv_heads, docs=docs)
    loss = _loss(model)
    annotate(plan, model, loss)
    planned = {(o.module, o.prim): o for o in plan.ops}
    cells = [(n, c) for n, c in model.cells_and_names()] + [("loss", loss)]
    seen = 0
    for name, cell in cells:
        for attr, prim in cell._primitives.items():
            if prim is None or prim.name in NO_STRATEGY:
                continue
            if type(cell).__name__ == "Embedding" and attr in EMBEDDING_UNUSED:
                continue
            assert (name, attr) in planned, f"{name}.{attr} ({prim.name}) has no strategy in the plan"
            assert prim.attrs["in_strategy"] == planned[(name, attr)].in_strategy, f"{name}.{attr}"
            seen += 1
    assert seen == len(plan.ops)
    attention = model.layers[0].attention
    assert model.boundaries is None or model.boundaries.data_parallel == 2     # per-shard document ends
    assert loss.keep.attrs["in_strategy"] == ((2, 1), ())
    # rotary tables: per token [B, 1, S, D/2] with position reset, else [S, D/2]
    cos_mul = attention.rotary.mul_cos1.attrs["in_strategy"]
    assert cos_mul == (((2, 2, 1, 1), (2, 1, 1, 1)) if docs else ((2, 2, 1, 1), (1, 1)))
    if flash and docs:
        fa = attention.flash_attention_varlen
        # MindSpore stores the layout as its enum: BSH 0, BNSD 1, SBH 2, BSND 3, TND 4
        assert fa.attrs["input_layout"] == 4 and fa.attrs["sparse_mode"] == 3
        assert fa.attrs["in_strategy"] == ((2, 2, 1),) * 3 + ((1, 1), (2,), (2,))
        assert not hasattr(attention, "flash_attention")
        assert fa is not model.layers[1].attention.flash_attention_varlen                 # one per layer
    elif flash:
        fa = attention.flash_attention
        assert fa.name == "FlashAttentionScore" and fa.attrs["in_strategy"] == ((2, 2, 1, 1),) * 3 + ((1, 1),)
        assert attention.flash_attention is not model.layers[1].attention.flash_attention   # one per layer
    else:
        assert attention.mask.attrs["in_strategy"] == ((2, 2, 1, 1), (1, 1), ())
        assert attention.mask_documents.attrs["in_strategy"] == ((2, 2, 1, 1), (2, 1, 1, 1), ())


def test_plan_prints_the_varlen_kernel_and_refuses_too_many_document_ends(capsys):
    cfg = ascend(**{"parallel.data_parallel": 2, "parallel.model_parallel": 2, "precision.dtype": "bf16"})
    print_plan(cfg)
    out = capsys.readouterr().out
    assert "layers.0.attention.flash_attention_varlen" in out
    assert "((2, 2, 1), (2, 2, 1), (2, 2, 1), (1, 1), (2,), (2,))" in out
    assert "layers.0.attention.flash_attention " not in out
    off = ascend(**{"parallel.data_parallel": 2, "precision.dtype": "bf16", "model.document_mask": False})
    assert "flash_attention_varlen" not in format_plan(make_plan(off))
    # 8 samples per rank x 128 documents = 1024 ends: the kernel's limit; 16 x 128 is over it
    assert make_plan(ascend(**{"precision.dtype": "bf16", "train.global_batch_size": 8}))
    too_many = ascend(**{"precision.dtype": "bf16", "train.global_batch_size": 32, "parallel.data_parallel": 2})
    with pytest.raises(ConfigError, match=r"16 samples x model.max_documents 128 = 2048"):
        make_plan(too_many)
    make_plan(ascend(**{"precision.dtype": "bf16", "train.global_batch_size": 32, "parallel.data_parallel": 2,
                        "model.max_documents": 64}))
    validate(ascend(**{"precision.dtype": "bf16", "train.global_batch_size": 32, "parallel.data_parallel": 2}),
             2, seq_length=32)                 # a sequence of 32 has at most 32 documents: 512 ends
    # fp32 or no mask: the plain attention path, no kernel limit
    make_plan(ascend(**{"train.global_batch_size": 64}))
    with pytest.raises(ConfigError, match="model.max_documents must be >= 1"):
        make_plan(ascend(**{"model.max_documents": 0}))


def test_annotate_tied_head_and_refuses_a_model_that_does_not_match():
    tied_cfg = ascend(**{"parallel.model_parallel": 2, "parallel.vocab_emb_dp": False,
                         "model.tie_embeddings": True})
    tied = _model(tie=True)
    annotate(make_plan(tied_cfg), tied, _loss(tied))
    assert tied.tied_head.attrs["in_strategy"] == ((1, 1), (2, 1)) and _model().tied_head is None
    with pytest.raises(RuntimeError, match="loss.inputs not found"):
        annotate(make_plan(tied_cfg), _model(tie=True))          # the plan's loss ops need the loss cell
    # a plan for 4 layers on a 2-layer model: layers.2 is missing
    with pytest.raises(RuntimeError, match="layers.2.attention.wq.matmul not found"):
        annotate(make_plan(ascend(**{"parallel.model_parallel": 2})), _model(layers=2))
    # a tied-head plan on an untied model names the missing primitive
    with pytest.raises(RuntimeError, match="model.tied_head|output"):
        annotate(make_plan(ascend(**{"parallel.model_parallel": 2})), _model(tie=True))


def test_strategy_file_goes_beside_a_sharded_checkpoint_not_in_a_rank_dir(tmp_path):
    from mspretrain.train.parallel.apply import copy_strategy, strategy_path

    cfg = ascend(**{"parallel.model_parallel": 2, "run.dir": str(tmp_path / "run")})
    dist = layout(cfg, 1, 2)
    src = strategy_path(cfg, dist)
    assert src == tmp_path / "run" / "strategy" / "rank_1.ckpt"
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000002"
    assert copy_strategy(cfg, dist, ckpt) is None           # nothing compiled yet
    src.parent.mkdir(parents=True)
    src.write_bytes(b"strategy of rank 1")
    assert copy_strategy(cfg, dist, ckpt) == ckpt / "strategy" / "rank_1.ckpt"
    assert (ckpt / "strategy" / "rank_1.ckpt").read_bytes() == b"strategy of rank 1"
    plain = load_config(None, ["parallel.data_parallel=2", f"run.dir={tmp_path / 'run'}"])
    assert copy_strategy(plain, layout(plain, 1, 2), ckpt / "x") is None   # data parallel: not sharded


def test_setup_in_one_process_and_msrun_detection(monkeypatch):
    from mspretrain.train.parallel import distributed

    for var in ("MS_ROLE", "MS_WORKER_NUM"):
        monkeypatch.delenv(var, raising=False)
    assert not distributed.under_msrun()
    from mspretrain.train.parallel.plan import validate

    info = distributed.setup(load_config(None, []), validate)
    assert info == distributed.DistInfo(rank=0, world_size=1, dp_rank=0, dp_size=1, is_main=True,
                                        sharded=False)
    assert distributed.all_reduce_mean(info, [1.5, 2]) == [1.5, 2.0]
    with pytest.raises(ConfigError, match="1 process"):
        distributed.setup(load_config(None, ["parallel.data_parallel=2"]), validate)
    monkeypatch.setenv("MS_ROLE", "MS_WORKER")
    monkeypatch.setenv("MS_WORKER_NUM", "4")
    assert distributed.under_msrun() and distributed.msrun_world_size() == 4
    monkeypatch.setenv("MS_WORKER_NUM", "four")
    with pytest.raises(ConfigError, match="MS_WORKER_NUM"):
        distributed.msrun_world_size()


@pytest.mark.parametrize("deterministic, hccl, context", [(True, "true", "ON"), (False, None, "OFF")])
def test_setup_sets_the_deterministic_switch_before_communication(deterministic, hccl, context):
    """run.deterministic (default true) sets MindSpore's deterministic switch, which exports
    HCCL_DETERMINISTIC=true, in distributed.setup before communication.init(). A fresh process: the
    switch can be set once per process."""
    import subprocess
    import sys

    code = ("import os\n"
            "from mspretrain.train.parallel import distributed\n"
            "from mspretrain.train.config import load_config\n"
            "from mspretrain.train.parallel.plan import validate\n"
            f"distributed.setup(load_config(None, ['run.deterministic={str(deterministic).lower()}']), validate)\n"
            "import mindspore as ms\n"
            "print(os.environ.get('HCCL_DETERMINISTIC'), ms.get_context('deterministic'))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("HCCL_DETERMINISTIC", "MS_ROLE", "MS_WORKER_NUM")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == [str(hccl), context]
    from mspretrain.train.parallel.distributed import set_deterministic
    assert set_deterministic.__doc__ and load_config(None, []).run.deterministic is True


@pytest.mark.parametrize("tied", [False, True])
def test_each_pipeline_stage_saves_its_own_state_only(graph_mode, tied):
    """with pp=2 a rank's checkpoint state is its stage's weights and their AdamW moments, plus the
    counters and loss scale: the two stages' sets cover the whole state, overlap in the counters only
    (and a tied embedding table, which both ends of the pipeline use)."""
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.step.optim import build_optimizer
    from mspretrain.train.parallel.apply import stage_state_filter
    from mspretrain.train.step.cell import TrainStep, build_train_step

    cfg = ascend(**{"parallel.pipeline_stage": 2, "parallel.micro_batch_num": 2, "eval.every_steps": 0,
                    "model.tie_embeddings": tied, "parallel.vocab_emb_dp": not tied})
    plan = make_plan(cfg, 2)
    model = _model(layers=4, tie=tied)
    loss = CausalLMLoss(model, 128)
    step = build_train_step(loss, build_optimizer(loss.trainable_params(), cfg.optim), 1, cfg)
    everything = set(step.state_parameters())
    owned = []
    for stage in (0, 1):
        kept = TrainStep(step.step_cell, keep_state=stage_state_filter(plan, stage, tied))
        owned.append(set(kept.state_parameters()))
    assert owned[0] | owned[1] == everything
    shared = {"global_step", "learning_rate", "loss_scale", "loss_scale_good_steps"}
    if tied:
        shared |= {n for n in everything if n.endswith("tok_embeddings.embedding_table")}
    assert owned[0] & owned[1] == shared
    assert "model.layers.1.mlp.w2.weight" in owned[0] and "adam_v.model.layers.2.mlp.w2.weight" in owned[1]
    assert "model.norm.weight" in owned[1] and "model.layers.3.attention.wq.weight" not in owned[0]


def test_validation_through_pipeline_stages_is_refused():
    """in-loop validation with pp > 1 would run every layer on every rank with the other stage's
    stale weights: refused with the keys named; with eval.every_steps=0 the plan validates."""
    cfg = ascend(**{"parallel.pipeline_stage": 2, "parallel.micro_batch_num": 2, "eval.every_steps": 5})
    with pytest.raises(ConfigError, match=r"eval.every_steps=5 with parallel.pipeline_stage=2"):
        validate(cfg, 2)
    validate(ascend(**{"parallel.pipeline_stage": 2, "parallel.micro_batch_num": 2, "eval.every_steps": 0}), 2)
    thirteen = load_config(Path(__file__).resolve().parents[3] / "configs" / "llama-13b.yaml", [])
    assert thirteen.parallel.pipeline_stage > 1 and thirteen.eval.every_steps == 0


@pytest.mark.parametrize("config, sets, per_rank", [
    ("tiny.yaml", ["parallel.data_parallel=8", "device=Ascend"], 1),      # `train doctor --nproc 8`
    ("tiny.yaml", ["parallel.data_parallel=2"], 4),
    ("llama-7b.yaml", [], 1),                                             # micro 1 x dp 16
    ("llama-1b.yaml", [], 8),
])
def test_the_eval_batch_is_split_by_data_parallel_once(config, sets, per_rank):
    """every rank feeds the whole eval batch (full_batch on Ascend) and the graph splits it by
    data_parallel once, so each rank's share is its training micro-batch (>= 1), never G/dp/dp."""
    from mspretrain.train.parallel.plan import eval_batch_size

    cfg = load_config(Path(__file__).resolve().parents[3] / "configs" / config, sets)
    dp = cfg.parallel.data_parallel
    batch = eval_batch_size(cfg)
    assert batch % dp == 0 and batch // dp == per_rank
    one = load_config(Path(__file__).resolve().parents[3] / "configs" / config,
                      sets + ["parallel.data_parallel=1", "train.micro_batch_size=0"])
    if not cfg.train.micro_batch_size:          # the same eval batch whatever the layout
        assert eval_batch_size(one) == batch


def test_fault_hook_spec():
    from train_test_hooks import parse_fault

    assert parse_fault("1:3:crash") == (1, 3, "crash")
    assert parse_fault("0:10:hang") == (0, 10, "hang")
    for bad in ("1:3", "1:x:crash", "1:3:explode"):
        with pytest.raises(ValueError, match="TRAIN_TRACE_FAULT"):
            parse_fault(bad)


def test_data_parallel_installs_a_summing_reducer_and_the_overflow_all_reduce(graph_mode):
    """CPU data parallel: each rank's gradient is its share of d(loss sum / global token count), so the
    reducer must sum the shares (a mean would divide the gradient by the world size)."""
    from mindspore import nn

    from mspretrain.train.parallel.apply import GlobalLossStep, check_grad_reduction, parallelize
    from trainer_harness import make_step

    cfg = load_config(None, ["parallel.data_parallel=2"])
    _, step = make_step()
    assert isinstance(step.step_cell.grad_reducer, nn.Identity) and not step.step_cell.reduce_overflow
    one = load_config(None, [])
    assert parallelize(one, layout(one, 0, 1), None, step) is step          # one process: unchanged
    with pytest.raises(RuntimeError, match="built for one rank"):
        parallelize(cfg, layout(cfg, 1, 2), None, step)
    _, step = make_step("parallel.data_parallel=2", dist=layout(cfg, 1, 2))
    reducer = step.step_cell.grad_reducer
    assert isinstance(reducer, nn.DistributedGradReducer) and not reducer.mean
    assert step.step_cell.reduce_overflow and step.step_cell.loss_is_share
    wrapped = parallelize(cfg, layout(cfg, 1, 2), None, step)
    assert isinstance(wrapped, GlobalLossStep) and wrapped.step_cell is step.step_cell
    net = nn.Dense(4, 4)
    with pytest.raises(RuntimeError, match="no DistributedGradReducer"):
        check_grad_reduction(nn.WithLossCell(net, nn.MSELoss()))
    averaging = nn.WithLossCell(net, nn.MSELoss())
    averaging.reducer = nn.DistributedGradReducer(net.trainable_params(), mean=True, degree=2)
    with pytest.raises(RuntimeError, match="means gradients"):
        check_grad_reduction(averaging)


def test_each_mode_sets_its_gradient_context(graph_mode, monkeypatch):
    """gradients_mean only where the framework's reducer needs it. CPU data parallel: the
    DATA_PARALLEL context with gradients_mean=True (what a plain nn.TrainOneStepCell reads; our step
    brings its own summing reducer). One process and Ascend: nothing set here; under semi-auto the
    AutoParallel wrapper keeps gradients_mean False (test_ascend_wrapper_sets_the_expected_context)."""
    import mindspore as ms

    from mspretrain.train.parallel.distributed import set_data_parallel_context

    try:
        for device, world, mode, mean in (("CPU", 2, "data_parallel", True), ("CPU", 1, "stand_alone", False),
                                          ("Ascend", 4, "stand_alone", False)):
            ms.reset_auto_parallel_context()
            cfg = load_config(None, [f"device={device}", f"parallel.data_parallel={world}"])
            set_data_parallel_context(cfg, layout(cfg, 0, world))
            assert ms.get_auto_parallel_context("parallel_mode") == mode, device
            assert ms.get_auto_parallel_context("gradients_mean") is mean, device
    finally:
        ms.reset_auto_parallel_context()


@pytest.mark.parametrize("sets, expect", [
    ({"parallel.data_parallel": 2, "parallel.model_parallel": 2, "parallel.optimizer_shard": True},
     {"_pipeline_stages": 1, "_enable_parallel_optimizer": True, "_optimizer_level": "level1"}),
    ({"parallel.data_parallel": 2, "parallel.pipeline_stage": 2, "parallel.micro_batch_num": 2},
     {"_pipeline_stages": 2, "_enable_parallel_optimizer": False, "_pipeline_scheduler": "1f1b"}),
])
def test_ascend_wrapper_sets_the_expected_context(graph_mode, monkeypatch, tmp_path, sets, expect):
    """With the rank functions patched (no Ascend, no init()), parallelize() on an Ascend config wraps
    the ONE step cell in AutoParallel with the plan's settings, shards the model and the loss, turns
    on the cross-rank overflow flag, and asks for a strategy file that includes the optimizer state."""
    import mindspore.parallel.auto_parallel as ap
    from mindspore.parallel.auto_parallel import AutoParallel

    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.llama.model import Llama, model_args
    from mspretrain.train.step.optim import build_optimizer
    from mspretrain.train.parallel.apply import GlobalLossStep, parallelize, pipeline_loss_cell, reduction
    from mspretrain.train.step.cell import build_train_step

    monkeypatch.setattr(ap, "get_rank", lambda *a: 3)
    monkeypatch.setattr(ap, "get_group_size", lambda *a: 4)
    cfg = ascend(**{**sets, "run.dir": str(tmp_path / "run")})
    world = 4
    dist = layout(cfg, 3, world)
    # the dataset's EOS id, as the trainer passes it: packed-document masking is on by default
    model = Llama(model_args(cfg.model, 128, 16, "Ascend", cfg.precision.dtype, eos_id=2), seed=0)
    loss = CausalLMLoss(model, 128)
    opt = build_optimizer(loss.trainable_params(), cfg.optim)
    piped = pipeline_loss_cell(cfg, loss)
    k = 4 if piped is None else 2
    combine = reduction(cfg, dist, opt.parameters, k, loop=False)
    step = (build_train_step(loss, opt, k, cfg, reduction=combine) if piped is None
            else build_train_step(loss, opt, k, cfg, network=piped, splits_batch=True, reduction=combine))
    wrapped = parallelize(cfg, dist, model, step, loss_cell=loss)
    assert isinstance(wrapped, GlobalLossStep)
    net = wrapped.cell
    assert isinstance(net, AutoParallel) and net.network is step.step_cell        # one graph per step
    assert step.cell is step.step_cell and step.keep_state is None      # the built step is not changed
    # no gradients_mean under semi-auto (MindFormers' gradients_mean: False); loss_repeated_mean on
    assert net._parallel_mode == "semi_auto" and net._gradients_mean is False and net._loss_repeated_mean
    assert net._dataset_strategy_config == ((cfg.parallel.data_parallel, 1),)
    assert net._save_strategy_file_path == str(tmp_path / "run" / "strategy" / "rank_3.ckpt")
    assert net._only_trainable_params is False                 # AdamW moments in the strategy file too
    for key, value in expect.items():
        assert getattr(net, key) == value, key
    assert (wrapped.keep_state is not None) == (cfg.parallel.pipeline_stage > 1)   # stage-own state
    assert step.step_cell.reduce_overflow
    assert loss.one_hot.attrs["in_strategy"][0] == (cfg.parallel.data_parallel, cfg.parallel.model_parallel)
    if piped is None:                                           # Ascend accumulates with GradAccumulation
        from mindspore.parallel.nn import GradAccumulation
        assert isinstance(step.step_cell.network, GradAccumulation) and not step.step_cell.loop


@pytest.mark.parametrize("opt_shard", [False, True])
def test_split_accumulation_on_ascend_reads_accu_grads(graph_mode, opt_shard):
    """with K > 1 split accumulation on Ascend (GradAccumulation), the micro-step mirrors look up
    `accu_grads.<parameter>`: the step's gradient slot holds one fp32 accumulator per trainable
    parameter under exactly that name (PipelineAccumulator), or with optimizer sharding MindSpore's
    PipelineGradReducer(opt_shard=True) (MindFormers' opt-shard branch). Not for K = 1 nor on CPU."""
    from mindspore import nn
    from mindspore.parallel.nn import GradAccumulation, PipelineGradReducer

    from mspretrain.train.parallel.apply import accumulation_grad_reducer
    from mspretrain.train.step.cell import ACCU_PREFIX, PipelineAccumulator
    from trainer_harness import make_step

    sets = {"parallel.data_parallel": 2, "parallel.optimizer_shard": opt_shard}
    cfg = ascend(**sets)
    _, cpu_step = make_step("train.accumulate=split", micro_steps=4)
    weights = cpu_step.step_cell.weights
    reducer = accumulation_grad_reducer(cfg, weights, 4)
    if opt_shard:
        assert isinstance(reducer, PipelineGradReducer) and reducer.opt_shard
    else:
        assert isinstance(reducer, PipelineAccumulator)
    names = [p.name for p in reducer.accu_grads]
    assert names == [f"{ACCU_PREFIX}.{p.name}" for p in weights]
    assert isinstance(accumulation_grad_reducer(cfg, weights, 1), nn.Identity)
    assert isinstance(accumulation_grad_reducer(cfg, weights, 4, loop=True), nn.Identity)
    cpu = load_config(None, ["parallel.data_parallel=2"])
    assert isinstance(accumulation_grad_reducer(cpu, weights, 4), nn.Identity)
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.llama.model import Llama, model_args
    from mspretrain.train.step.optim import build_optimizer
    from mspretrain.train.step.cell import Reduction, build_train_step
    model = Llama(model_args(cfg.model, 128, 16, "Ascend", cfg.precision.dtype, eos_id=2), seed=0)
    loss = CausalLMLoss(model, 128)
    optimizer = build_optimizer(loss.trainable_params(), cfg.optim)
    step = build_train_step(loss, optimizer, 4, cfg,
                            reduction=Reduction(accumulation_grad_reducer(cfg, optimizer.parameters, 4)))
    assert isinstance(step.step_cell.network, GradAccumulation)
    assert isinstance(step.step_cell.grad_reducer, PipelineGradReducer if opt_shard else PipelineAccumulator)
    # the accumulators are no checkpoint state
    assert not [n for n in step.state_parameters() if n.startswith(ACCU_PREFIX)]


def test_the_loss_cell_is_lazy_inline_with_pipeline_stages_only(graph_mode, tmp_path, monkeypatch):
    """pp > 1: the train loss cell (model + loss, the outermost cell that the pipeline calls per
    micro-batch) is a ReusedCausalLMLoss (mindspore.lazy_inline on its __init__, where MindFormers puts
    it: LlamaForCausalLM), with the same parameters; the decoder layers stay plain cells. Never
    elsewhere, because the CPU backend refuses the feature (checked here, so that the rule is revisited
    when that changes)."""
    import inspect

    import numpy as np
    from mindspore import Tensor

    from mspretrain.train.step.loss import CausalLMLoss, ReusedCausalLMLoss
    from mspretrain.train.models.llama.model import DecoderLayer
    from mspretrain.train.parallel.apply import lazy_inline_loss

    pp2 = ascend(**{"parallel.pipeline_stage": 2, "parallel.micro_batch_num": 2})
    assert lazy_inline_loss(pp2) and not lazy_inline_loss(ascend()) and not lazy_inline_loss(load_config(None))
    model = _model(layers=2)
    mean = CausalLMLoss(model, 128)
    lazy, plain = mean.summed(lazy_inline=True), mean.summed()
    assert type(lazy) is ReusedCausalLMLoss and type(plain) is CausalLMLoss and lazy.reduction == "sum"
    assert lazy.cell_init_args.startswith("lazy_inline_ReusedCausalLMLoss")
    assert all(type(layer) is DecoderLayer for layer in model.layers)
    # lazy_inline's rule: construct's parameters have no default values
    assert all(p.default is inspect.Parameter.empty
               for p in inspect.signature(ReusedCausalLMLoss.construct).parameters.values())
    names = lambda m: [p.name for p in m.get_parameters()]
    assert names(lazy) == names(plain) == names(mean)
    ids = Tensor(np.arange(17, dtype=np.int32).reshape(1, 17) % 128)
    monkeypatch.chdir(tmp_path)             # MindSpore writes rank_0/om/analyze_fail.ir where it fails
    with pytest.raises(RuntimeError, match="lazy_inline|ReusedCausalLMLoss"):
        lazy(ids)


# ---------------------------------------------------------------- the compiled graph

# IR nodes that compute nothing, so need no layout: graph plumbing, and StopGradient, which the
# compiler removes after differentiation; Reshape and Shape cannot take a strategy
IR_PLUMBING = {"MakeTuple", "TupleGetItem", "Depend", "Load", "UpdateState", "Return", "StopGradient",
               "Reshape", "Shape"}
_IR_NODE = re.compile(r"^\s+%\d+\([^)]*\) = (?:PrimFunc_)?([A-Z]\w*)\(")


def unplanned_ops(cell, *inputs, dump_dir) -> list:
    """Compile `cell` (GRAPH_MODE) and read MindSpore's IR after the `optimize` pass, where the graph is
    inlined: every operator node that carries no `in_strategy`. A functional op (ops.cumsum, `+`,
    astype, slicing, ...) builds its own primitive there, without one; a held primitive carries the
    strategy that `annotate` set. Returns (operator, source line of the node) pairs."""
    import mindspore as ms

    ms.set_context(save_graphs=1, save_graphs_path=str(dump_dir))
    try:
        cell.compile(*inputs)
    finally:
        ms.set_context(save_graphs=0)
    [ir] = [p for p in Path(dump_dir).glob("*.ir") if re.fullmatch(r"\d+_optimize_\d+\.ir", p.name)]
    found, node = [], None
    for line in ir.read_text().splitlines() + [""]:
        start = _IR_NODE.match(line)
        if start or line.startswith("}") or not line:       # a new node, or the end of the graph
            if node and node[0] not in IR_PLUMBING and "in_strategy" not in node[1]:
                found.append((node[0], node[2]))
            node = [start.group(1), line, ""] if start else None
        elif node is not None:
            node[1] += line
            if line.strip().startswith("# In file") and "site-packages" not in line:
                node[2] = line.strip()[len("# In file "):]   # the innermost call in this repository
    return found


def _documents_cell(model):
    """A cell compiling only Llama.documents (the flash kernel itself runs on Ascend only)."""
    from mindspore import nn

    class Documents(nn.Cell):
        def __init__(self):
            super().__init__()
            self.model = model

        def construct(self, tokens):
            return self.model.documents(tokens)

    return Documents()


@pytest.mark.parametrize("flash", [False, True])
def test_every_op_of_the_compiled_graph_has_its_strategy(graph_mode, tmp_path, flash):
    """The compiled graph, not only the cells' attributes: with packed documents on, the plain model +
    loss (block-causal mask, per-document positions, rotary gathers, GQA) and, for flash attention, the
    TND document ends, have no operator left to MindSpore's default layout."""
    import numpy as np
    from mindspore import Tensor

    sets = {"parallel.data_parallel": 2, "parallel.model_parallel": 2, "model.num_layers": 2}
    if flash:
        sets["precision.dtype"] = "bf16"
    else:
        sets["model.num_kv_heads"] = 2
    plan = make_plan(ascend(**sets))
    model = _model(layers=2, flash=flash, kv_heads=0 if flash else 2)
    loss = _loss(model)
    annotate(plan, model, loss)
    assert any(o.module == "boundaries" for o in plan.ops)
    tokens = np.random.default_rng(0).integers(0, 128, size=(4, 17)).astype(np.int32)
    tokens[:, 5] = 2                                                            # EOS
    if flash:
        assert model.layers[0].attention.varlen
        net, x = _documents_cell(model), Tensor(tokens[:, :16])
    else:
        net, x = loss, Tensor(tokens)
    left = unplanned_ops(net, x, dump_dir=tmp_path)
    assert not left, "operators without a strategy:\n" + "\n".join(f"{op} at {where}" for op, where in left)


@pytest.mark.parametrize("eod", [-1, 2])
def test_validation_accuracy_ops_have_their_strategies_in_the_compiled_graph(graph_mode, tmp_path, eod):
    """val_acc's hits (CausalLMLoss hits=True, the validation cell) come from the loss's reductions over
    the vocabulary: no argmax, nothing that gathers the vocabulary-split logits, every op planned."""
    import numpy as np
    from mindspore import Tensor

    plan = make_plan(ascend(**{"parallel.data_parallel": 2, "parallel.model_parallel": 2,
                               "model.num_layers": 2, "model.num_kv_heads": 2}))
    model = _model(layers=2, kv_heads=2)
    loss = _loss(model, eod, hits=True)
    annotate(plan, model, loss)
    assert loss.is_top.attrs["in_strategy"] == ((2,), ()) and loss.sum_hits.attrs["in_strategy"] == ((2,),)
    tokens = np.random.default_rng(0).integers(0, 128, size=(4, 17)).astype(np.int32)
    tokens[:, 5] = 2                                                            # EOS
    left = unplanned_ops(loss, Tensor(tokens), dump_dir=tmp_path)
    assert not left, "operators without a strategy:\n" + "\n".join(f"{op} at {where}" for op, where in left)


def _cast_nodes(ir_dir) -> int:
    """Cast nodes in the `optimize` IR that carry an in_strategy (held, planned casts)."""
    [ir] = [p for p in Path(ir_dir).glob("*.ir") if re.fullmatch(r"\d+_optimize_\d+\.ir", p.name)]
    text = ir.read_text()
    return sum(1 for node in re.split(r"\n(?=\s+%\d+\()", text)
               if _IR_NODE.match(node) and _IR_NODE.match(node).group(1) == "Cast" and "in_strategy" in node)


@pytest.mark.parametrize("sets, tie", [
    ({"parallel.data_parallel": 2, "parallel.model_parallel": 2}, False),
    ({"parallel.model_parallel": 2, "parallel.sequence_parallel": True, "model.num_kv_heads": 2}, False),
    ({"parallel.data_parallel": 2, "parallel.model_parallel": 2, "parallel.vocab_emb_dp": False,
      "model.tie_embeddings": True}, True),
])
def test_o2_casts_all_have_their_strategies_in_the_compiled_graph(graph_mode, tmp_path, sets, tie):
    """precision O2 as the model's own held casts (step.apply_precision -> Llama.set_compute_dtype):
    every Cast of the compiled fp16 model + loss (fp16 on CPU, which has no bf16; the casts are the same
    primitives) carries the plan's strategy, for mp=2 layouts. The control: the old O2,
    auto_mixed_precision's cell-boundary casts, compiles to Casts with none (the fault)."""
    import numpy as np
    from mindspore import Tensor, amp
    from mindspore.common import dtype as mstype

    from mspretrain.train.models.layers import RMSNorm
    from mspretrain.train.step.precision import apply_precision

    cfg = ascend(**{"model.num_layers": 2, "precision.dtype": "fp16", "model.flash_attention": False, **sets})
    plan = make_plan(cfg)
    tokens = np.random.default_rng(0).integers(0, 128, size=(4, 17)).astype(np.int32)
    tokens[:, 5] = 2                                                            # EOS
    model = _model(tie=tie, layers=2, kv_heads=cfg.model.num_kv_heads)
    loss = _loss(model, 2)
    assert apply_precision(model, cfg.precision) is model and model.compute_dtype == mstype.float16
    annotate(plan, model, loss)
    left = unplanned_ops(loss, Tensor(tokens), dump_dir=tmp_path / "explicit")
    assert not left, "operators without a strategy:\n" + "\n".join(f"{op} at {where}" for op, where in left)
    # the O2 casts are really in the graph (37 here): at least each matmul's weight cast (7 per layer
    # and the head's, or the tied table's), the embeddings' and the logits'
    assert _cast_nodes(tmp_path / "explicit") >= 7 * 2 + 1 + 2

    old = _model(tie=tie, layers=2, kv_heads=cfg.model.num_kv_heads)
    old_loss = _loss(amp.auto_mixed_precision(old, "O2", dtype=mstype.float16), 2)
    for _, cell in old.cells_and_names():
        if isinstance(cell, RMSNorm):
            cell.to_float(mstype.float32)
    annotate(plan, old, old_loss)
    auto = unplanned_ops(old_loss, Tensor(tokens), dump_dir=tmp_path / "auto")
    # 27 untied: each Dense's weight (15) and the head's input, each RMSNorm's input (5), each
    # Attention's and MLP's input (4), the embedding table, _OutputTo32's logits (docs/parallel.md)
    assert {op for op, _ in auto} == {"Cast"} and len(auto) >= 7 * 2 + 5, auto


# ---------------------------------------------------------------- the doctor's replica groups

@pytest.mark.parametrize("dp, mp, pp, opt, expected", [
    # data parallel: every rank holds everything, whole
    (2, 1, 1, False, {"whole": [[0, 1]], "mp": [[0, 1]], "opt": [[0, 1]]}),
    # model parallel alone: the two ranks hold different slices; only whole tensors (norms) are shared
    (1, 2, 1, False, {"whole": [[0, 1]], "mp": [[0], [1]], "opt": [[0], [1]]}),
    # dp 2 x mp 2 (rank = dp_rank * mp + mp_rank): slices shared by the same mp position, 0/2 and 1/3
    (2, 2, 1, False, {"whole": [[0, 1, 2, 3]], "mp": [[0, 2], [1, 3]], "opt": [[0, 2], [1, 3]]}),
    # optimizer sharding: each rank its own slice of a sharded tensor; unsharded ones still shared
    (4, 1, 1, True, {"whole": [[0, 1, 2, 3]], "mp": [[0, 1, 2, 3]], "opt": [[0], [1], [2], [3]]}),
    # two pipeline stages (stage outermost): no group crosses a stage
    (1, 1, 2, False, {"whole": [[0], [1]], "mp": [[0], [1]], "opt": [[0], [1]]}),
    (2, 1, 2, False, {"whole": [[0, 1], [2, 3]], "mp": [[0, 1], [2, 3]], "opt": [[0, 1], [2, 3]]}),
    # all of it: dp 2 x mp 2 x pp 2 with optimizer sharding
    (2, 2, 2, True, {"whole": [[0, 1, 2, 3], [4, 5, 6, 7]], "mp": [[0, 2], [1, 3], [4, 6], [5, 7]],
                     "opt": [[r] for r in range(8)]}),
])
def test_replica_groups_follow_the_device_matrix(dp, mp, pp, opt, expected):
    from mspretrain.train.doctor import replica_groups

    groups = replica_groups(dp, mp, pp, opt)
    assert {k: [list(g) for g in v] for k, v in groups.items()} == expected
    # each class partitions the ranks, and the mp groups agree with the trainer's own layout:
    # the ranks of one group read the same data slice only when they are model-parallel peers
    world = dp * mp * pp
    for cls, class_groups in groups.items():
        assert sorted(r for g in class_groups for r in g) == list(range(world)), cls
    cfg = ascend(**{"parallel.data_parallel": dp, "parallel.model_parallel": mp, "parallel.pipeline_stage": pp,
                    "parallel.micro_batch_num": max(pp, 1)})
    for g in groups["mp"]:
        assert len({layout(cfg, r, world).dp_rank for r in g}) == len(g)        # different data...
        assert len({r % mp for r in g}) == 1                                    # ...the same slice


def test_tensor_classes_from_compiled_layouts_and_digests_per_class():
    """MindSpore's layout list: [dev_matrix, tensor_map, slice_shape, field, uniform, opt_shard_group, ...].
    A moment without its own layout is classed as its weight; a one-ulp change moves one class only."""
    import numpy as np
    from mindspore import Parameter, Tensor

    from mspretrain.train.doctor import state_digests, tensor_class

    assert tensor_class(None) == "whole"
    assert tensor_class([[2, 2], [-1, -1], [8, 8], 0, True, ""]) == "whole"
    assert tensor_class([[2, 2], [0, -1], [4, 8], 0, True, ""]) == "mp"
    assert tensor_class([[2, 2], [0, -1], [2, 8], 0, True, "2-opt-group"]) == "opt"
    w = np.arange(16, dtype=np.float32).reshape(4, 4)
    params = {"model.wq.weight": Parameter(Tensor(w), name="model.wq.weight"),
              "adam_m.model.wq.weight": Parameter(Tensor(w * 0), name="adam_m.model.wq.weight"),
              "model.norm.weight": Parameter(Tensor(w[0]), name="model.norm.weight")}
    layouts = {"model.wq.weight": [[1, 2], [0, -1], [2, 4], 0, True, ""]}
    before = state_digests(params, layouts)
    assert set(before) == {"whole", "mp"}
    moment = np.zeros_like(w)
    moment[0, 0] = np.nextafter(np.float32(0), np.float32(1))                 # the moment, by one ulp
    params["adam_m.model.wq.weight"].set_data(Tensor(moment))
    after = state_digests(params, layouts)
    assert after["mp"] != before["mp"] and after["whole"] == before["whole"]
    assert state_digests(params) == {"whole": state_digests(params)["whole"]}   # no layouts: one class


def test_the_doctor_ladder_carries_each_rungs_layout_for_its_digest_groups():
    """llama-13b (dp 4 x mp 8 x pp 2, optimizer sharding): its own-layout rung compares digests within
    that layout's groups and, having pipeline stages, validates its merged checkpoint; the pp rungs
    do the same; the same-layout resumes rerun the optimizer-sharded, mp and pp rungs on their layouts."""
    from mspretrain.train.doctor import ladder, replica_groups, shrink

    cfg = load_config(Path(__file__).resolve().parents[3] / "configs" / "llama-13b.yaml",
                      ["model.vocab_size=128", "parallel.data_parallel=4", "parallel.model_parallel=8"])
    rungs = {r.name: r for r in ladder(8, shrink(cfg, 8, "Ascend"))}
    own = rungs["your layout"]
    assert own.parallel == (4, 8, 2, True) and own.merged_val and own.nproc == 64
    groups = replica_groups(*own.parallel)
    assert groups["mp"][0] == (0, 8, 16, 24) and groups["whole"][1] == tuple(range(32, 64))
    assert rungs["pp=2 m=2"].parallel == (1, 1, 2, False) and rungs["pp=2 m=2"].merged_val
    assert rungs["pp=2 dp=2"].parallel == (2, 1, 2, False) and rungs["pp=2 dp=2"].merged_val
    assert rungs["mp=2"].parallel == (4, 2, 1, False)
    for name, source in (("resume sharded", "dp=8+opt-shard"), ("resume mp=2", "mp=2"), ("resume pp=2", "pp=2 m=2")):
        resume = rungs[name]
        assert resume.resume_of == source and resume.parallel == rungs[source].parallel, name
    assert not any(r.merged_val for n, r in rungs.items() if n not in ("your layout", "pp=2 m=2", "pp=2 dp=2"))


@pytest.mark.parametrize("sets, world", [
    ({"parallel.model_parallel": 2}, 2),
    ({"parallel.pipeline_stage": 2, "parallel.micro_batch_num": 2, "eval.every_steps": 0}, 2),
    ({"parallel.data_parallel": 2, "parallel.optimizer_shard": True}, 2),
])
def test_in_loop_suite_with_a_sharded_layout_is_refused(sets, world):
    """The in-loop suite runs on the main rank's model in memory: with sliced weights it is refused,
    naming the keys and the way to evaluate the checkpoints instead; unsharded it validates."""
    with pytest.raises(ConfigError) as err:
        validate(ascend(**sets, **{"eval.suite_in_loop": True}), world)
    for key in ("eval.suite_in_loop=true", "parallel.model_parallel", "parallel.pipeline_stage",
                "parallel.optimizer_shard", "eval.suite_in_loop=false", "train eval RUN --tasks"):
        assert key in str(err.value)
    validate(ascend(**sets), world)
    validate(ascend(**{"parallel.data_parallel": 2, "eval.suite_in_loop": True}), 2)
