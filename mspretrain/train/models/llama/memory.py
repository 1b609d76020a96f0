"""Llama's terms of the memory planner (mspretrain/train/memory.py): its parameters per layer and per
pipeline stage, and what one decoder layer, the head and the packed-document tables hold at the step's
peak. Activations are counted tensor by tensor for model.py's layer (what backward keeps): the layer
input, the two RMSNorms (fp32 normalised value + output), q, k, v (grouped KV heads tiled to all
heads), softmax probabilities [heads, S, S] (fp32 and, in 16-bit, their cast) or flash attention's
log-sum-exp, the attention output, the residual, and the SwiGLU's four [S, ffn] tensors; plus the loss
path (logits, exp(logits - max) and the backward working set of three fp32 [B*S, V] gradients).
Recompute drops what its cells hold (full: all but the layer input). Model parallel divides the
per-head and per-ffn tensors; sequence parallel also the per-token ones. On CPU (no buffer reuse,
spec.reuses_memory) every forward and backward intermediate is counted instead.
"""
from __future__ import annotations

from mspretrain.train.models.spec import reuses_memory
from mspretrain.train.models.llama.parallel import ffn_size, kv_heads


# ---------------------------------------------------------------- parameters

def layer_params(cfg) -> tuple[int, int]:
    """(parameters split by model parallel, replicated ones) of one decoder layer."""
    m = cfg.model
    h, hd = m.hidden_size, m.hidden_size // m.num_heads
    attn = h * m.num_heads * hd * 2 + 2 * h * kv_heads(m) * hd
    return attn + 3 * h * ffn_size(m), 2 * h


def count_params(cfg, vocab: int) -> int:
    split, repl = layer_params(cfg)
    h = cfg.model.hidden_size
    head = 0 if cfg.model.tie_embeddings else vocab * h
    return cfg.model.num_layers * (split + repl) + vocab * h + head + h


def stage_params(cfg, vocab: int, stage: int, layers: int) -> float:
    """Parameters held by one device of `stage` with `layers` decoder layers, after model parallel."""
    p, h = cfg.parallel, cfg.model.hidden_size
    mp, last = p.model_parallel, stage == p.pipeline_stage - 1
    split, repl = layer_params(cfg)
    n = layers * (split / mp + repl)
    if stage == 0:
        n += vocab * h / (1 if p.vocab_emb_dp else mp)
    if last:
        n += h + vocab * h / mp         # final norm, LM head (a copy of the table when tied)
    return n



# ---------------------------------------------------------------- activations

def layer_activation_bytes(cfg, seq: int, micro: int, modules: tuple = ()) -> float:
    """Bytes one decoder layer holds at the step's peak, for one micro-batch; `modules`: its
    recomputed cells ("" = the whole layer)."""
    if not reuses_memory(cfg):
        return _layer_all_intermediates(cfg, seq, micro)
    m, p = cfg.model, cfg.parallel
    b = 4 if cfg.precision.dtype == "fp32" else 2
    t = p.model_parallel
    tok = seq * micro                               # tokens per micro-batch
    sp = t if p.sequence_parallel else 1            # per-token tensors split by sequence parallel
    h, f, a = m.hidden_size, ffn_size(m), m.num_heads
    x = tok * h * b / sp
    if "" in modules:
        return x                                    # full recompute: the layer input only
    norm = tok * h * (4 + b) / sp                   # fp32 normalised value + output
    if m.flash_attention and cfg.device == "Ascend":
        scores = a * tok * 4                        # log-sum-exp per head and token
    else:
        scores = a * seq * tok * (4 if b == 4 else 4 + b)   # fp32 softmax output (+ its 16-bit cast)
    attention = (4 * tok * h * b + scores) / t      # q, k, v (tiled), attention output
    mlp = 4 * tok * f * b / t                       # w1 out, w3 out, silu, product
    total = x + x                                   # layer input, residual after attention
    total += 0 if "attention_norm" in modules else norm
    total += 0 if "attention" in modules else attention
    total += 0 if "ffn_norm" in modules else norm
    total += 0 if "mlp" in modules else mlp
    return total


def _layer_all_intermediates(cfg, seq: int, micro: int) -> float:
    """CPU: every intermediate of model.py's layer, forward and backward, counted by hand in
    T = [tokens, hidden], F = [tokens, ffn] (b bytes) and A = fp32 [heads, S, S] per sample.
    Forward 28T + 4F + 4A: two RMSNorms 3T each (square, normalised, weighted); q, k, v and their
    transposes 6T; rotary on q and k 5T each (halves, four products, sub + add, concat); scores,
    scaled, masked, softmax 4A; p @ v, its transpose, wo 3T; two residual adds 2T; SwiGLU w1, w3,
    silu, product 4F, w2 T. Backward 49T + 5F + 5A: SwiGLU 5F + 3T (w2 dx, both product gradients,
    silu grad 2F; w1, w3 dx and their sum); each RMSNorm 8T (two products' gradients, their
    reductions' temporaries, the mean's broadcast, square 2T, the sum) and its residual sum T;
    attention 28T + 5A (wo dx, transpose, dv, dq, dk; each rotary 7.5T: concat split, four product
    gradients, negation, sums, two slice gradients padded to full size and their sum; three transposes,
    three dx and two sums; dprobs, softmax grad 2A, mask, scale)."""
    m = cfg.model
    b = 4 if cfg.precision.dtype == "fp32" else 2
    tok = seq * micro
    t, f, a = tok * m.hidden_size * b, tok * ffn_size(m) * b, m.num_heads * seq * tok * 4
    return (28 + 49) * t + (4 + 5) * f + (4 + 5) * a


def head_activation_bytes(cfg, seq: int, micro: int, vocab: int) -> float:
    """The final norm, the logits and CausalLMLoss's fp32 path (logsumexp keeps exp(logits - max)).
    Ascend/GPU: kept logits (16-bit output + fp32 copy) and the exp, plus the backward working set:
    the logits' gradient from logsumexp, the gather's scattered gradient and their sum (3 fp32 [B*S, V]).
    CPU (no reuse): forward 3 (logits, minus max, exp), backward 9 (the sum's broadcast, exp product,
    the max's mask, cast and product, the gather's zeros and scatter, two sums), and the final norm
    and LM head's [tokens, hidden] tensors 12T (norm 3 + 8, LM head dx 1)."""
    b = 4 if cfg.precision.dtype == "fp32" else 2
    tok = seq * micro
    if not reuses_memory(cfg):
        return tok * vocab * 4 * 12 + tok * cfg.model.hidden_size * b * 12
    t = cfg.parallel.model_parallel
    sp = t if cfg.parallel.sequence_parallel else 1
    kept = (4 if b == 4 else 4 + b) + 4                  # logits (+ fp32 copy), exp(logits - max)
    logits = tok * vocab * (kept + 3 * 4) / t
    return tok * cfg.model.hidden_size * (4 + 2 * b) / sp + logits


def document_activation_bytes(cfg, seq: int, micro: int) -> float:
    """Packed-document masking (mspretrain/train/packing.py), built once per micro-batch from the tokens and read by
    every layer, so held until the last layer's backward (a pipeline stage holds its own copy):
    - the plain attention's mask, bool [B, 1, S, S] (True: masked);
    - or, with the fused kernel (Ascend, 16-bit), the document ends int64 [B * L], L = min(max_documents, S);
    - with position reset, the per-token rotary tables cos and sin, fp32 [B, 1, S, D/2] each.
    CPU (every node output kept): the mask's build adds the per-pair document equality and its
    conjunction with causality (bool [B, S, S] each) and, per token, the EOS flags, document index
    and positions (a few int32 [B, S]); see bench/bench_memory.py --document-mask for the measurement."""
    m = cfg.model
    tok = seq * micro
    total = 0.0
    if m.reset_position_ids:
        total += 2 * tok * (m.hidden_size // m.num_heads // 2) * 4
    if m.document_mask:
        varlen = m.flash_attention and cfg.device == "Ascend" and cfg.precision.dtype != "fp32"
        if varlen:
            total += micro * min(m.max_documents, seq) * 8
        else:
            total += micro * seq * seq * (1 if reuses_memory(cfg) else 3)
    if not reuses_memory(cfg) and (m.document_mask or m.reset_position_ids):
        total += tok * 4 * 6
    return total


def layer_flops(cfg, seq: int) -> dict[str, float]:
    """Forward FLOPs per token of one decoder layer, by recomputable cell ("": the whole layer):
    2 per weight of each matmul, and attention's scores and weighted sum, 2 x 2 x S x hidden, counted
    over the full S x S square (the causal half is not subtracted). Norms and elementwise ops: 0."""
    m = cfg.model
    h, hd = m.hidden_size, m.hidden_size // m.num_heads
    attention = 2 * (h * m.num_heads * hd * 2 + 2 * h * kv_heads(m) * hd) + 4 * seq * h
    mlp = 2 * 3 * h * ffn_size(m)
    return {"": attention + mlp, "attention": attention, "mlp": mlp, "attention_norm": 0.0, "ffn_norm": 0.0}


def head_flops(cfg, vocab: int) -> float:
    """Forward FLOPs per token of the LM head."""
    return 2 * cfg.model.hidden_size * vocab


def largest_weight(cfg) -> int:
    """Elements of the largest weight matrix (what optimizer sharding gathers at once)."""
    h = cfg.model.hidden_size
    return max(h * ffn_size(cfg.model), h * h)
