"""A Llama-style decoder: the math only.

Token embedding, pre-norm blocks of (RMSNorm, causal self-attention with rotary embeddings and optional
grouped KV heads) and (RMSNorm, SwiGLU MLP), a final RMSNorm and an LM head (optionally tied).

Parallel strategies and recompute are applied from outside (mspretrain/train/parallel/apply.py, mspretrain/train/parallel/recompute.py),
so every piece that they address has a stable name: `layers[i].attention` (wq, wk, wv, wo, rotary),
`layers[i].mlp` (w1 gate, w3 up, w2 down), `layers[i].attention_norm`, `layers[i].ffn_norm`,
`tok_embeddings`, `norm`, `output`. Initialisation is numpy, drawn in a fixed order from `seed`,
so two processes build bitwise-identical weights. No dropout: the step is a pure function.
Every primitive that touches an activation is held as a cell attribute (flash attention one per
layer; the norms', rotary's, SiLU * gate's and the residual adds'), so that the plan can
give each one a strategy.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.common import dtype as mstype
# not re-exported by mindspore.ops in 2.10
from mindspore.ops.auto_generate.gen_ops_prim import FlashAttentionScore, RotaryPositionEmbedding, SiLU, Swiglu

from mspretrain.train.models.fused import check_fused_kernels
from mspretrain.train.models.layers import RMSNorm, dense, set_dense_compute_dtype
from mspretrain.train.packing import DocumentBoundaries


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    seq_length: int
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 0           # 0: same as num_heads
    ffn_size: int = 0               # 0: about 8/3 * hidden_size, rounded up to 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    tie_embeddings: bool = False
    flash_attention: bool = False   # only where the fused kernel exists (Ascend)
    document_mask: bool = False     # block-causal attention inside packed samples (mspretrain/train/packing.py)
    reset_position_ids: bool = False  # rotary positions restart at each document
    eos_id: int = -1                # the boundary token; needed by the two above
    max_documents: int = 128        # documents per sample the fused kernel separates
    fused_kernels: tuple = ()       # of rms_norm, rope, swiglu: Ascend kernels (mspretrain/train/models/fused.py)

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def ffn(self) -> int:
        if self.ffn_size:
            return self.ffn_size
        return 64 * math.ceil(8 * self.hidden_size / 3 / 64)


def model_args(cfg_model, vocab_size: int, seq_length: int, device: str, dtype: str = "bf16",
               eos_id: int | None = None) -> ModelArgs:
    """ModelArgs from the `model` config section. The fused flash-attention kernel exists on Ascend
    only, for fp16/bf16 inputs: elsewhere (or in fp32) the plain path runs. Document masking and
    position reset need the dataset's EOS id; without one (eos_id None: no dataset, e.g. planning)
    they are off."""
    docs = eos_id is not None
    if docs and eos_id < 0 and (cfg_model.document_mask or cfg_model.reset_position_ids):
        from mspretrain.train.config import ConfigError
        raise ConfigError(f"model.document_mask / model.reset_position_ids need the tokenizer's EOS id, "
                          f"and the dataset has none (eos_id {eos_id}): set both to false")
    return ModelArgs(
        document_mask=docs and cfg_model.document_mask,
        reset_position_ids=docs and cfg_model.reset_position_ids,
        eos_id=eos_id if docs else -1, max_documents=cfg_model.max_documents,
        vocab_size=cfg_model.vocab_size or vocab_size, seq_length=seq_length,
        hidden_size=cfg_model.hidden_size, num_layers=cfg_model.num_layers,
        num_heads=cfg_model.num_heads, num_kv_heads=cfg_model.num_kv_heads,
        ffn_size=cfg_model.ffn_size, rope_theta=cfg_model.rope_theta, norm_eps=cfg_model.norm_eps,
        init_std=cfg_model.init_std, tie_embeddings=cfg_model.tie_embeddings,
        flash_attention=cfg_model.flash_attention and device == "Ascend" and dtype != "fp32",
        fused_kernels=check_fused_kernels(cfg_model.fused_kernels, device))


def rotary_tables(seq_length: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of position * inverse frequency, each [seq_length, head_dim // 2], fp32."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.outer(np.arange(seq_length, dtype=np.float64), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class Rotary(nn.Cell):
    """Rotary position embedding of [B, heads, S, D] (the rotate-half form: the first and second halves
    of D are a pair). `fused`: the same in Ascend's RotaryPositionEmbedding kernel, mode 0 (rotate-half),
    whose tables are full width, cat(cos, cos) [1 or B, 1, S, D]."""

    def __init__(self, seq_length: int, head_dim: int, theta: float, fused: bool = False):
        super().__init__()
        cos, sin = rotary_tables(seq_length, head_dim, theta)
        self.fused = fused
        self.cast_cos, self.cast_sin = ops.Cast(), ops.Cast()
        if fused:
            full = lambda t: Tensor(np.concatenate([t, t], -1)[None, None])     # noqa: E731
            self.cos, self.sin = full(cos), full(sin)
            self.widen_cos, self.widen_sin = ops.Concat(-1), ops.Concat(-1)      # per-token tables
            self.rope = RotaryPositionEmbedding()
            return
        self.cos, self.sin = Tensor(cos), Tensor(sin)
        self.split = ops.Split(-1, 2)
        self.mul_cos1, self.mul_sin1 = ops.Mul(), ops.Mul()
        self.mul_cos2, self.mul_sin2 = ops.Mul(), ops.Mul()
        self.sub, self.add, self.concat = ops.Sub(), ops.Add(), ops.Concat(-1)

    def construct(self, x, cos=None, sin=None):
        """`cos`/`sin`: per-token tables [B, 1, S, D/2] when positions restart at each document."""
        if self.fused:
            cos = self.cos if cos is None else self.widen_cos((cos, cos))
            sin = self.sin if sin is None else self.widen_sin((sin, sin))
            return self.rope(x, self.cast_cos(cos, x.dtype), self.cast_sin(sin, x.dtype), 0)
        x1, x2 = self.split(x)
        cos = self.cast_cos(self.cos if cos is None else cos, x.dtype)
        sin = self.cast_sin(self.sin if sin is None else sin, x.dtype)
        first = self.sub(self.mul_cos1(x1, cos), self.mul_sin1(x2, sin))
        second = self.add(self.mul_cos2(x2, cos), self.mul_sin2(x1, sin))
        return self.concat((first, second))


class Attention(nn.Cell):
    """Causal self-attention with rotary embeddings and grouped KV heads; layout [B, heads, S, D]."""

    def __init__(self, args: ModelArgs, rng: np.random.Generator, out_std: float):
        super().__init__()
        d, hd = args.hidden_size, args.head_dim
        self.num_heads, self.kv_heads, self.head_dim = args.num_heads, args.kv_heads, hd
        self.wq = dense(rng, d, args.num_heads * hd, args.init_std)
        self.wk = dense(rng, d, self.kv_heads * hd, args.init_std)
        self.wv = dense(rng, d, self.kv_heads * hd, args.init_std)
        self.wo = dense(rng, args.num_heads * hd, d, out_std)
        self.rotary = Rotary(args.seq_length, hd, args.rope_theta, fused="rope" in args.fused_kernels)
        self.scale = 1.0 / math.sqrt(hd)
        self.flash = args.flash_attention
        self.varlen = self.flash and args.document_mask
        s = args.seq_length
        # primitives held as attributes so that train.parallel.apply can shard them by head
        self.to_heads, self.from_heads = ops.Transpose(), ops.Transpose()
        if self.varlen:
            # packed documents: TND layout ([B*S, heads, D]) with each document's end in actual_seq_qlen/
            # kvlen; sparse_mode 3 (right-down causal) applies the compressed mask inside each document.
            # The form 2.10's TND restrictions document: sparse_mode 2 or 3 with the 2048x2048 mask,
            # next_tokens 0, pre_tokens >= the longest document (2.10 calls mode 8, MindFormers'
            # choice, "not implemented yet"; docs/parallel.md)
            self.fa_mask = Tensor(np.triu(np.ones((2048, 2048), np.uint8), 1))
            self.flash_attention_varlen = FlashAttentionScore(head_num=args.num_heads, scale_value=self.scale,
                                                              pre_tokens=2147483647, next_tokens=0,
                                                              input_layout="TND", sparse_mode=3)
        elif self.flash:
            # sparse_mode 2 (left-up causal) takes the compressed 2048x2048 upper-triangle mask; one
            # primitive per layer (not the functional op's cached one) so that it can hold a strategy
            self.fa_mask = Tensor(np.triu(np.ones((2048, 2048), np.uint8), 1))
            self.flash_attention = FlashAttentionScore(head_num=args.num_heads, scale_value=self.scale,
                                                       input_layout="BNSD", sparse_mode=2)
        else:
            self.future = Tensor(np.triu(np.ones((s, s), np.bool_), 1))   # True: j > i, masked
            self.qk = ops.BatchMatMul(transpose_b=True)
            self.cast_scores, self.scale_scores = ops.Cast(), ops.Mul()
            self.mask = ops.MaskedFill()
            self.mask_documents = ops.MaskedFill()   # packed documents: the block-causal mask [B, 1, S, S]
            self.mask_to_bool = ops.Cast()           # it arrives as uint8 (Llama.documents)
            self.softmax = ops.Softmax(-1)
            self.cast_probs = ops.Cast()
            self.pv = ops.BatchMatMul()
            if self.num_heads // self.kv_heads > 1:
                self.repeat_kv = ops.Tile()

    def rope(self, x, cos=None, sin=None):
        return self.rotary(x, cos, sin)

    def construct(self, x, doc=None):
        b, s, _ = x.shape
        mask, cos, sin = (None, None, None) if doc is None else doc   # see Llama.documents
        q = self.to_heads(self.wq(x).reshape(b, s, self.num_heads, self.head_dim), (0, 2, 1, 3))
        k = self.to_heads(self.wk(x).reshape(b, s, self.kv_heads, self.head_dim), (0, 2, 1, 3))
        v = self.to_heads(self.wv(x).reshape(b, s, self.kv_heads, self.head_dim), (0, 2, 1, 3))
        q, k = self.rotary(q, cos, sin), self.rotary(k, cos, sin)
        if self.varlen:
            return self.wo(self.varlen_attention(q, k, v, mask))
        if self.flash:
            out = self.flash_attention(q, k, v, None, None, None, self.fa_mask)[3]
        else:
            out = self.plain_attention(q, k, v, mask)
        out = self.from_heads(out, (0, 2, 1, 3)).reshape(b, s, self.num_heads * self.head_dim)
        return self.wo(out)

    def varlen_attention(self, q, k, v, seq_ends):
        """q [B, N, S, D], k/v [B, Nkv, S, D], seq_ends [B * L] -> [B, S, N * D]: the fused kernel in TND
        layout, causal within each document."""
        b, n, s, d = q.shape
        nkv = k.shape[1]
        q = self.from_heads(q, (0, 2, 1, 3)).reshape(b * s, n, d)
        k = self.from_heads(k, (0, 2, 1, 3)).reshape(b * s, nkv, d)
        v = self.from_heads(v, (0, 2, 1, 3)).reshape(b * s, nkv, d)
        out = self.flash_attention_varlen(q, k, v, None, None, None, self.fa_mask, None, seq_ends, seq_ends)[3]
        return out.reshape(b, s, n * d)

    def plain_attention(self, q, k, v, masked=None):
        rep = self.num_heads // self.kv_heads
        if rep > 1:  # each KV head serves `rep` consecutive query heads
            b, _, s, hd = k.shape
            nkv = self.kv_heads
            k = self.repeat_kv(k.reshape(b, nkv, 1, s, hd), (1, 1, rep, 1, 1)).reshape(b, self.num_heads, s, hd)
            v = self.repeat_kv(v.reshape(b, nkv, 1, s, hd), (1, 1, rep, 1, 1)).reshape(b, self.num_heads, s, hd)
        scores = self.scale_scores(self.cast_scores(self.qk(q, k), mstype.float32), self.scale)
        if masked is None:
            scores = self.mask(scores, self.future, -1e9)
        else:                       # block-causal: causal within each document
            scores = self.mask_documents(scores, self.mask_to_bool(masked, mstype.bool_), -1e9)
        probs = self.cast_probs(self.softmax(scores), v.dtype)
        return self.pv(probs, v)


class MLP(nn.Cell):
    """SwiGLU: w2(silu(w1 x) * w3 x). With the fused kernel (Ascend's Swiglu: silu of the first half times
    the second) the gate and up outputs are stacked [B, S, 2, F], gate first, on a new axis rather than
    concatenated along F, so that F stays split by model parallel; w1 and w3 stay two weights."""

    def __init__(self, args: ModelArgs, rng: np.random.Generator, out_std: float):
        super().__init__()
        self.w1 = dense(rng, args.hidden_size, args.ffn, args.init_std)
        self.w3 = dense(rng, args.hidden_size, args.ffn, args.init_std)
        self.w2 = dense(rng, args.ffn, args.hidden_size, out_std)
        self.fused = "swiglu" in args.fused_kernels
        if self.fused:
            self.expand_gate, self.expand_up = ops.ExpandDims(), ops.ExpandDims()
            self.stack, self.swiglu = ops.Concat(2), Swiglu()
        else:
            self.silu, self.gate = SiLU(), ops.Mul()

    def construct(self, x):
        if self.fused:
            gate_up = self.stack((self.expand_gate(self.w1(x), 2), self.expand_up(self.w3(x), 2)))
            h = self.swiglu(gate_up, 2)
            return self.w2(h.reshape(h.shape[:2] + h.shape[3:]))
        return self.w2(self.gate(self.silu(self.w1(x)), self.w3(x)))


class DecoderLayer(nn.Cell):
    def __init__(self, args: ModelArgs, rng: np.random.Generator, mlp: type = MLP):
        super().__init__()
        out_std = args.init_std / math.sqrt(2 * args.num_layers)  # residual projections, GPT-2 style
        fused_norm = "rms_norm" in args.fused_kernels
        self.attention_norm = RMSNorm(args.hidden_size, args.norm_eps, fused_norm)
        self.attention = Attention(args, rng, out_std)
        self.ffn_norm = RMSNorm(args.hidden_size, args.norm_eps, fused_norm)
        self.mlp = mlp(args, rng, out_std)
        self.residual_attn, self.residual_ffn = ops.Add(), ops.Add()

    def construct(self, x, doc=None):
        h = self.residual_attn(x, self.attention(self.attention_norm(x), doc))
        return self.residual_ffn(h, self.mlp(self.ffn_norm(h)))


class Llama(nn.Cell):
    """tokens int32 [B, S] -> logits [B, S, vocab]. `mlp`: the feed-forward cell class of every layer,
    called as mlp(args, rng, out_std) (a family that differs only there passes its own; docs/extending.md)."""

    def __init__(self, args: ModelArgs, seed: int, mlp: type = MLP):
        super().__init__()
        if args.hidden_size % args.num_heads:
            raise ValueError(f"hidden_size {args.hidden_size} is not a multiple of num_heads {args.num_heads}")
        if args.num_heads % args.kv_heads:
            raise ValueError(f"num_heads {args.num_heads} is not a multiple of num_kv_heads {args.kv_heads}")
        if args.head_dim % 2:
            raise ValueError(f"head dim {args.head_dim} must be even for rotary embeddings")
        self.args = args
        rng = np.random.default_rng(seed)
        emb = rng.normal(0.0, args.init_std, size=(args.vocab_size, args.hidden_size)).astype(np.float32)
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.hidden_size, embedding_table=Tensor(emb))
        self.layers = nn.CellList([DecoderLayer(args, rng, mlp) for _ in range(args.num_layers)])
        self.norm = RMSNorm(args.hidden_size, args.norm_eps, "rms_norm" in args.fused_kernels)
        self.output = None if args.tie_embeddings else dense(rng, args.hidden_size, args.vocab_size,
                                                               args.init_std)
        self.tied_head = ops.MatMul(transpose_b=True) if args.tie_embeddings else None
        self.cast_table = ops.Cast() if args.tie_embeddings else None
        # precision O2 (set_compute_dtype): the embeddings into the compute dtype after the lookup (the
        # table's gradient then sums in fp32), the logits back to fp32; held so that the plan shards them
        self.compute_dtype = None
        self.cast_embeddings, self.cast_logits = ops.Cast(), ops.Cast()
        self.boundaries = None
        if args.document_mask or args.reset_position_ids:
            flash = args.flash_attention and args.document_mask
            self.boundaries = DocumentBoundaries(args.eos_id, args.seq_length, args.document_mask,
                                                 args.reset_position_ids, flash, args.max_documents)
            cos, sin = rotary_tables(args.seq_length, args.head_dim, args.rope_theta)
            self.rope_cos, self.rope_sin = Tensor(cos), Tensor(sin)
            self.gather_cos, self.gather_sin = ops.Gather(), ops.Gather()   # the tables' rows per token
        # the block-causal mask travels to the layers as uint8: with pipeline stages it crosses stages
        # by Send/Receive, and HCCL's type map is not known to take bool (MindFormers' masks are uint8)
        self.block_mask = args.document_mask and not args.flash_attention
        self.mask_to_u8 = ops.Cast() if self.block_mask else None

    def documents(self, tokens):
        """(mask, cos, sin) for every layer: the block-causal mask (or the kernel's document ends) and
        per-token rotary tables [B, 1, S, D/2]; an entry is None where its feature is off."""
        mask, pos = self.boundaries(tokens)
        if mask is not None:
            if self.block_mask:
                mask = self.mask_to_u8(mask, mstype.uint8)
            mask = ops.stop_gradient(mask)      # constants of the input: no backward through them
        if pos is None:
            return mask, None, None
        b, s = pos.shape
        cos = self.gather_cos(self.rope_cos, pos, 0).reshape(b, 1, s, -1)
        sin = self.gather_sin(self.rope_sin, pos, 0).reshape(b, 1, s, -1)
        return mask, ops.stop_gradient(cos), ops.stop_gradient(sin)

    def construct(self, tokens):
        h = self.tok_embeddings(tokens)
        if self.compute_dtype is not None:
            h = self.cast_embeddings(h, self.compute_dtype)
        doc = None if self.boundaries is None else self.documents(tokens)
        for layer in self.layers:
            h = layer(h, doc)
        h = self.norm(h)
        if self.output is None:
            b, s, d = h.shape
            table = self.cast_table(self.tok_embeddings.embedding_table, h.dtype)
            logits = self.tied_head(h.reshape(b * s, d), table).reshape(b, s, -1)
        else:
            logits = self.output(h)
        if self.compute_dtype is not None:
            logits = self.cast_logits(logits, mstype.float32)
        return logits

    def set_compute_dtype(self, dtype) -> None:
        """Precision O2, explicitly: the embeddings, every layer and the head compute in `dtype`
        (fp16/bf16) with the fp32 master weights cast where they are used, the RMSNorms in fp32
        inside (their output back in `dtype`), softmax and the logits in fp32. Each cast is a held
        primitive with a strategy in the plan (MindFormers' compute_dtype), unlike
        auto_mixed_precision's cell-boundary casts, which the parallel pass leaves to its default
        batch-parallel layout (docs/parallel.md). Set before the first compile."""
        self.compute_dtype = dtype
        set_dense_compute_dtype(self, dtype)


__all__ = ["ModelArgs", "model_args", "Llama", "MLP", "DecoderLayer", "Attention", "Rotary", "rotary_tables"]
