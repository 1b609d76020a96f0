"""Llama's parallel plan: the Megatron-style strategy of every primitive model.py holds, and which
cells each pipeline stage runs (ModelSpec.parallel_plan). The plan's frame (validation of the layout,
stages, the loss cell's strategies, applying it) is mspretrain/train/parallel/apply.py.

Splits, for `x @ W.T` with W stored [out, in] (nn.Dense, transpose_b=True), x [B*S, H]:
  column-parallel (wq wk wv w1 w3, LM head): x (dp, 1), W (mp, 1)      -> output split on features
  row-parallel (wo w2):                       x (dp, mp), W (1, mp)     -> partial sums, all-reduced
  attention scores, softmax, weighted sum [B, N, S, *]: (dp, mp, 1, 1)  -> N / mp heads per rank
With sequence parallel the row-parallel outputs are reduce-scattered over tokens, out (dp * mp, 1).
Every other primitive on a sharded tensor gets a strategy too, so that no activation falls back to the
default batch-parallel layout (an all-gather of mp-split tensors): the RMSNorms, rotary embedding,
SiLU * gate, residual adds ([B, S, H] split (dp, 1, 1), with sequence parallel (dp, mp, 1)), the head
transposes, flash attention ((dp, mp, 1, 1) for q, k, v; (1, 1) for its compressed mask), the
block-causal mask of packed documents and precision O2's casts (layers.Dense's input and weight casts
split as the matmul's inputs, the embeddings' as the first norm reads them, the logits' (dp, 1, mp)). With packed-document masking on Ascend the kernel runs in TND
layout ([B*S, N, D]): q, k, v (dp, mp, 1), the compressed mask (1, 1), the cumulative document ends
(dp,) each, MindFormers' form.
The fused kernels (model.fused_kernels, models/fused.py) are split as the composed layers they replace:
RmsNorm (x, weight (1,)) as the norm's tokens; RotaryPositionEmbedding (x, cos, sin) by head with the
tables whole (or by batch, per-token tables); Swiglu on the stacked [B, S, 2, F] (dp, 1, 1, mp), the
stack's axis whole and F split as w1 / w3 output it.
"""
from __future__ import annotations

import math

from mspretrain.train.step.batching import micro_batch
from mspretrain.train.config import ConfigError
from mspretrain.train.models.fused import check_rope_shape
from mspretrain.train.models.spec import OpShard

COLUMN = ("attention.wq", "attention.wk", "attention.wv", "mlp.w1", "mlp.w3")
ROW = ("attention.wo", "mlp.w2")


def ffn_size(model_cfg) -> int:
    """The MLP width: model.ffn_size, or the Llama rule 8/3 * hidden rounded up to a multiple of 64."""
    if model_cfg.ffn_size:
        return model_cfg.ffn_size
    return 64 * math.ceil(8 * model_cfg.hidden_size / 3 / 64)


def kv_heads(model_cfg) -> int:
    return model_cfg.num_kv_heads or model_cfg.num_heads


def validate(cfg, vocab_size: int | None, seq_length: int | None) -> None:
    """What the plan needs of the model's sizes; ConfigError names the keys."""
    p, m = cfg.parallel, cfg.model
    mp = p.model_parallel
    divisible = [("model.num_heads", m.num_heads), ("model.num_kv_heads", kv_heads(m)),
                 ("model.ffn_size", ffn_size(m))]
    if vocab_size:
        divisible.append(("model.vocab_size", vocab_size))
    for key, value in divisible:
        if value % mp:
            raise ConfigError(f"{key} ({value}) must be divisible by parallel.model_parallel ({mp})")
    if "rope" in m.fused_kernels:
        check_rope_shape(micro_batch(cfg, p.data_parallel), m.num_heads // mp, seq_length or 0,
                         m.hidden_size // m.num_heads)
    if m.max_documents < 1:
        raise ConfigError(f"model.max_documents must be >= 1, got {m.max_documents}")
    _validate_varlen(cfg, p.data_parallel, seq_length)
    if m.tie_embeddings and mp > 1 and p.vocab_emb_dp:
        raise ConfigError("model.tie_embeddings with parallel.model_parallel > 1 needs "
                          "parallel.vocab_emb_dp=false (the shared weight must be split by vocab, as the "
                          "LM head is)")


def stage_of(cfg, stages: tuple) -> dict:
    """Cell path -> pipeline stage: the embedding first, the final norm and the head last."""
    last = len(stages) - 1
    out = {"tok_embeddings": 0, "norm": last}
    if not cfg.model.tie_embeddings:
        out["output"] = last
    for s, layers in enumerate(stages):
        out.update({f"layers.{i}": s for i in layers})
    return out


def ops(cfg, dp: int, mp: int) -> list:
    """The OpShard of every primitive of the model, in the model's order."""
    m, sp = cfg.model, cfg.parallel.sequence_parallel
    out = [*_embedding_ops(dp, mp, cfg.parallel.vocab_emb_dp),
           # O2: the looked-up embeddings into the compute dtype, split as the first norm reads them
           OpShard("", "cast_embeddings", "Cast", (_tokens(dp, mp, sp),))]
    fused = frozenset(m.fused_kernels)
    for i in range(m.num_layers):
        out += _layer_ops(f"layers.{i}", dp, mp, sp, uses_flash_attention(cfg), kv_heads(m) < m.num_heads,
                          uses_varlen_attention(cfg), bool(m.reset_position_ids), fused)
    out += _boundary_ops(dp, bool(m.document_mask), bool(m.reset_position_ids), uses_varlen_attention(cfg))
    out += _norm_ops("norm", dp, mp, sp, "rms_norm" in fused)
    out += _head_ops(dp, mp, m.tie_embeddings)
    return out


VARLEN_MAX_SEQUENCES = 1024    # FlashAttentionScore TND: at most 1024 entries in actual_seq_qlen (2.10 docs)


def _validate_varlen(cfg, dp: int, seq_length: int | None) -> None:
    """The TND kernel takes at most VARLEN_MAX_SEQUENCES document ends per call: a rank's micro-batch
    times min(model.max_documents, seq_length) entries (unused slots are padded, so they count)."""
    if not uses_varlen_attention(cfg):
        return
    micro = micro_batch(cfg, dp)
    per_sample = min(cfg.model.max_documents, seq_length or cfg.model.max_documents)
    if micro * per_sample > VARLEN_MAX_SEQUENCES:
        raise ConfigError(
            f"flash attention with model.document_mask: a rank's micro-batch of {micro} samples x "
            f"model.max_documents {per_sample} = {micro * per_sample} document ends per kernel call, more "
            f"than FlashAttentionScore's TND layout takes ({VARLEN_MAX_SEQUENCES}); lower model.max_documents "
            f"or the per-rank micro-batch (train.micro_batch_size, train.global_batch_size / "
            f"parallel.data_parallel)")


def _embedding_ops(dp: int, mp: int, vocab_emb_dp: bool) -> list:
    # nn.Embedding: Gather(table [V, H], flat ids [B*S]); the table replicated (data) or split by vocab.
    table = (1, 1) if vocab_emb_dp else (mp, 1)
    return [OpShard("tok_embeddings", "gather", "Gather", (table, (dp,)))]


def uses_flash_attention(cfg) -> bool:
    """The model's rule (train.models.llama.model.model_args): the fused kernel on Ascend, for 16-bit inputs."""
    return bool(cfg.model.flash_attention) and cfg.device == "Ascend" and cfg.precision.dtype != "fp32"


def uses_varlen_attention(cfg) -> bool:
    """Flash attention over packed documents: the TND kernel with per-document ends."""
    return uses_flash_attention(cfg) and bool(cfg.model.document_mask)


def _tokens(dp: int, mp: int, seq_par: bool) -> tuple:
    """[B, S, H] activations between the blocks: split by batch, and by tokens with sequence parallel."""
    return (dp, mp, 1) if seq_par else (dp, 1, 1)


def _norm_ops(prefix: str, dp: int, mp: int, seq_par: bool, fused: bool = False) -> list:
    x = _tokens(dp, mp, seq_par)
    if fused:   # RmsNorm(x, gamma): a row's reduction stays on its rank; gamma whole
        return [OpShard(prefix, "cast_in", "Cast", (x,)), OpShard(prefix, "rms_norm", "RmsNorm", (x, (1,))),
                OpShard(prefix, "cast_out", "Cast", (x,)), OpShard(prefix, "cast_weight", "Cast", ((1,),))]
    return [OpShard(prefix, "cast_in", "Cast", (x,)), OpShard(prefix, "square", "Square", (x,)),
            OpShard(prefix, "mean", "ReduceMean", (x,)), OpShard(prefix, "add_eps", "Add", (x, ())),
            OpShard(prefix, "rsqrt", "Rsqrt", (x,)), OpShard(prefix, "normalize", "Mul", (x, x)),
            OpShard(prefix, "scale", "Mul", (x, (1,))), OpShard(prefix, "cast_out", "Cast", (x,)),
            OpShard(prefix, "cast_weight", "Cast", ((1,),))]


def _dense_ops(prefix: str, x: tuple, w: tuple, out=None) -> list:
    """A Dense layer's matmul and its O2 casts (layers.Dense: the input and the fp32 weight into the
    compute dtype), each cast split as the matmul input it feeds, so that it moves no data."""
    return [OpShard(prefix, "matmul", "MatMul", (x, w), out),
            OpShard(prefix, "cast_x", "Cast", (x,)), OpShard(prefix, "cast_w", "Cast", (w,))]


def _layer_ops(prefix: str, dp: int, mp: int, seq_par: bool, flash: bool = False,
               grouped_kv: bool = False, varlen: bool = False, reset_positions: bool = False,
               fused: frozenset = frozenset()) -> list:
    ops = [o for name in COLUMN for o in _dense_ops(f"{prefix}.{name}", (dp, 1), (mp, 1))]
    # Row-parallel: partial sums all-reduced, or with sequence parallel reduce-scattered on tokens.
    row_out = ((dp * mp, 1),) if seq_par else None
    ops += [o for name in ROW for o in _dense_ops(f"{prefix}.{name}", (dp, mp), (1, mp), row_out)]
    heads = (dp, mp, 1, 1)              # [B, N, S, D]: each rank holds N / mp heads
    att, rot = f"{prefix}.attention", f"{prefix}.attention.rotary"
    ops += [OpShard(att, "to_heads", "Transpose", ((dp, 1, mp, 1),)),       # [B, S, N, D] in
            OpShard(att, "from_heads", "Transpose", (heads,))]
    # the rotary tables: [S, D/2] shared by the batch, or with position reset per token [B, 1, S, D/2]
    table = (dp, 1, 1, 1) if reset_positions else (1, 1)
    if "rope" in fused:
        ops += _fused_rope_ops(rot, heads, reset_positions)
    else:
        ops += _rope_ops(rot, heads, table)
    ops += _attention_ops(att, dp, mp, heads, flash, varlen, grouped_kv)
    ops += _mlp_ops(f"{prefix}.mlp", dp, mp, "swiglu" in fused)
    x = _tokens(dp, mp, seq_par)
    ops += [OpShard(prefix, "residual_attn", "Add", (x, x)), OpShard(prefix, "residual_ffn", "Add", (x, x))]
    ops += _norm_ops(f"{prefix}.attention_norm", dp, mp, seq_par, "rms_norm" in fused)
    ops += _norm_ops(f"{prefix}.ffn_norm", dp, mp, seq_par, "rms_norm" in fused)
    return ops


def _rope_ops(rot: str, heads: tuple, table: tuple) -> list:
    return [OpShard(rot, "split", "Split", (heads,)),
            *[OpShard(rot, name, "Mul", (heads, table)) for name in ("mul_cos1", "mul_sin1", "mul_cos2",
                                                                     "mul_sin2")],
            OpShard(rot, "sub", "Sub", (heads, heads)), OpShard(rot, "add", "Add", (heads, heads)),
            OpShard(rot, "concat", "Concat", (heads, heads)),
            OpShard(rot, "cast_cos", "Cast", (table,)), OpShard(rot, "cast_sin", "Cast", (table,))]


def _fused_rope_ops(rot: str, heads: tuple, reset_positions: bool) -> list:
    """RotaryPositionEmbedding(x [B, N, S, D], cos, sin): x by head; the full-width tables [1, 1, S, D]
    whole, or the per-token ones [B, 1, S, D] (widened from [B, 1, S, D/2]) by batch."""
    table = (heads[0], 1, 1, 1) if reset_positions else (1, 1, 1, 1)
    ops = [OpShard(rot, "rope", "RotaryPositionEmbedding", (heads, table, table)),
           OpShard(rot, "cast_cos", "Cast", (table,)), OpShard(rot, "cast_sin", "Cast", (table,))]
    if reset_positions:
        ops += [OpShard(rot, "widen_cos", "Concat", (table, table)),
                OpShard(rot, "widen_sin", "Concat", (table, table))]
    return ops


def _mlp_ops(mlp: str, dp: int, mp: int, fused: bool) -> list:
    ffn = (dp, 1, mp)                   # [B, S, F] out of the column-parallel w1 / w3
    if fused:                           # stacked [B, S, 2, F]: the new axis whole, F as w1 / w3 split it
        stacked = (dp, 1, 1, mp)
        return [OpShard(mlp, "expand_gate", "ExpandDims", (ffn,)), OpShard(mlp, "expand_up", "ExpandDims", (ffn,)),
                OpShard(mlp, "stack", "Concat", (stacked, stacked)), OpShard(mlp, "swiglu", "Swiglu", (stacked,))]
    return [OpShard(mlp, "silu", "SiLU", (ffn,)), OpShard(mlp, "gate", "Mul", (ffn, ffn))]


def _attention_ops(att: str, dp: int, mp: int, heads: tuple, flash: bool, varlen: bool, grouped_kv: bool) -> list:
    ops = []
    if flash and varlen:
        # TND [B*S, N, D]: tokens by batch shard, heads by mp; the compressed mask whole; the document
        # ends [B * L] by batch shard (each shard's restart at 0: mspretrain/train/packing.py)
        tnd = (dp, mp, 1)
        ops.append(OpShard(att, "flash_attention_varlen", "FlashAttentionScore",
                           (tnd, tnd, tnd, (1, 1), (dp,), (dp,))))
    elif flash:
        # q, k, v by head; the compressed 2048 x 2048 causal mask whole ((1, 1): the kernel's requirement)
        ops.append(OpShard(att, "flash_attention", "FlashAttentionScore", (heads, heads, heads, (1, 1))))
    else:
        ops += [OpShard(att, "qk", "BatchMatMul", (heads, heads)),
                OpShard(att, "cast_scores", "Cast", (heads,)), OpShard(att, "scale_scores", "Mul", (heads, ())),
                OpShard(att, "mask", "MaskedFill", (heads, (1, 1), ())),
                OpShard(att, "mask_documents", "MaskedFill", (heads, (dp, 1, 1, 1), ())),  # [B, 1, S, S]
                OpShard(att, "mask_to_bool", "Cast", ((dp, 1, 1, 1),)),    # the uint8 mask back to bool
                OpShard(att, "softmax", "Softmax", (heads,)), OpShard(att, "cast_probs", "Cast", (heads,)),
                OpShard(att, "pv", "BatchMatMul", (heads, heads))]
        if grouped_kv:
            ops.append(OpShard(att, "repeat_kv", "Tile", ((dp, mp, 1, 1, 1),)))
    return ops


def _boundary_ops(dp: int, document_mask: bool, reset_positions: bool, flash: bool) -> list:
    """Document boundaries of packed samples (train.packing.DocumentBoundaries, module "boundaries")
    from input tokens [B, S]: every op works along one sample's sequence, so only the batch is split;
    the [1, S] / [1, L] / [S, S] constant tables they combine with are whole."""
    if not (document_mask or reset_positions):
        return []
    m, row, whole = "boundaries", (dp, 1), (1, 1)
    ops = [OpShard(m, "is_eos", "Equal", (row, ()))]
    if (document_mask and not flash) or reset_positions:
        ops.append(OpShard(m, "cast_eos", "Cast", (row,)))
    if document_mask and not flash:
        # block-causal mask [B, 1, S, S] from the document index of each token, [B, S, 1] vs [B, 1, S]
        ops += [OpShard(m, "count_eos", "CumSum", (row,)),
                OpShard(m, "other_doc", "NotEqual", ((dp, 1, 1), (dp, 1, 1))),
                OpShard(m, "or_future", "LogicalOr", ((dp, 1, 1), whole)),
                OpShard("", "mask_to_u8", "Cast", ((dp, 1, 1, 1),))]    # uint8 to the layers (stages)
    if document_mask and flash:
        # the TND kernel's document ends [B, L]; the per-shard offsets [B, 1] split like the ends
        ops += [OpShard(m, "ends_at", "LogicalAnd", (row, whole)), OpShard(m, "cast_ends", "Cast", (row,)),
                OpShard(m, "weigh_ends", "Mul", (row, whole)), OpShard(m, "negate", "Sub", (row, ())),
                OpShard(m, "smallest", "TopK", (row,)), OpShard(m, "restore", "Mul", (row, whole)),
                OpShard(m, "close", "Add", (row, whole)), OpShard(m, "offset", "Add", (row, row)),
                OpShard(m, "cast_out", "Cast", (row,))]
    if reset_positions:
        # positions restarting after each EOS: the EOS flags shifted right by one, the last start so far
        ops += [OpShard(m, "first", "StridedSlice", (row,)), OpShard(m, "zeros", "ZerosLike", (row,)),
                OpShard(m, "drop_last", "StridedSlice", (row,)), OpShard(m, "shift", "Concat", (row, row)),
                OpShard(m, "starts", "Mul", (row, whole)), OpShard(m, "last_start", "Cummax", (row,)),
                OpShard(m, "positions", "Sub", (whole, row)),
                # the rotary tables' rows per token (Llama.documents): tables whole, positions by batch
                OpShard("", "gather_cos", "Gather", (whole, row)), OpShard("", "gather_sin", "Gather", (whole, row))]
    return ops


def _head_ops(dp: int, mp: int, tied: bool) -> list:
    # The LM head is column-parallel over the vocabulary: each rank computes V / mp logits; with O2 they
    # go back to fp32 as they are split, [B, S, V] (dp, 1, mp), the loss's own layout
    logits = OpShard("", "cast_logits", "Cast", ((dp, 1, mp),))
    if tied:
        # the embedding table (split by vocabulary: tying needs vocab_emb_dp off) cast to the compute dtype
        return [OpShard("", "cast_table", "Cast", ((mp, 1),)), OpShard("", "tied_head", "MatMul", ((dp, 1), (mp, 1))),
                logits]
    return [*_dense_ops("output", (dp, 1), (mp, 1)), logits]
