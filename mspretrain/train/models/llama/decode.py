"""Llama's decoding cells for `train generate` (ModelSpec.decode; the loop that drives them is
mspretrain/train/eval/generate.py's Generator).

The checkpoint's fp32 weights are fused once for decoding (`Weights`: q with its rotate-half copy in
one matmul, k, its rotated copy and v in another, the MLP's gate and up in a third; RMSNorm weights
and the attention scale folded into the matmul that follows them), because at decode sizes a kernel
launch costs more than its arithmetic. The math is model.py's (RMSNorm in fp32, rotate-half rotary,
grouped KV heads, -1e9 masking); tests/train/eval/test_generate.py checks the logits against `Llama`'s
forward and the greedy tokens against its argmax.
- `Start(tokens [B, L])`: the causal forward over the right-padded prompts, the first new token, and
  K/V caches of length seq_length, a tuple of per-layer [B, kv_heads, T, head_dim];
- `DecodeChunk`: `steps` decode steps in one graph launch, a fixed unrolled loop: each feeds every
  row's last token at its own position, writes its K/V into the cache (ops.where on a one-hot, exact),
  attends to positions <= it, chooses the next token in the graph and books it. Finished rows are
  masked: they emit pad and stay put.
"""
from __future__ import annotations

import math

import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.ops.auto_generate.gen_ops_prim import SiLU   # not re-exported by mindspore.ops in 2.10

from mspretrain.train.models.llama.model import ModelArgs, rotary_tables


def _param(x: np.ndarray, name: str) -> Parameter:
    return Parameter(Tensor(np.ascontiguousarray(x, dtype=np.float32)), name=name, requires_grad=False)


def _rotated_rows(w: np.ndarray, heads: int, hd: int) -> np.ndarray:
    """Rows r such that x @ r.T == rotate_half(x @ w.T) in every head: [-second half, first half]."""
    w = w.reshape(heads, hd, -1)
    return np.concatenate([-w[:, hd // 2:], w[:, :hd // 2]], 1).reshape(heads * hd, -1)


class Weights(nn.Cell):
    """The checkpoint's weights, fused for decoding: one matmul for q and its rotated copy, one for k,
    its rotated copy and v, one for the MLP's gate and up projections. Each RMSNorm weight is folded
    into the matmul after it and the attention scale into q (a per-column factor: same math, fewer
    kernels; each kernel launch costs more than its arithmetic at decode sizes)."""

    def __init__(self, args: ModelArgs, w: dict):
        super().__init__()
        nh, kvh, hd = args.num_heads, args.kv_heads, args.head_dim
        scale = np.float32(1.0 / math.sqrt(hd))
        self.emb = _param(w["tok_embeddings.embedding_table"], "emb")
        head = w["tok_embeddings.embedding_table"] if args.tie_embeddings else w["output.weight"]
        self.head = _param(head * w["norm.weight"], "head")
        wq2, wkv3, wo, w13, w2 = [], [], [], [], []
        for i in range(args.num_layers):
            p = f"layers.{i}."
            an, fn = w[p + "attention_norm.weight"], w[p + "ffn_norm.weight"]
            wq, wk = w[p + "attention.wq.weight"] * scale, w[p + "attention.wk.weight"]
            wq2.append(_param(np.concatenate([wq, _rotated_rows(wq, nh, hd)]) * an, f"wq2.{i}"))
            wkv3.append(_param(np.concatenate([wk, _rotated_rows(wk, kvh, hd),
                                               w[p + "attention.wv.weight"]]) * an, f"wkv3.{i}"))
            wo.append(_param(w[p + "attention.wo.weight"], f"wo.{i}"))
            w13.append(_param(np.concatenate([w[p + "mlp.w1.weight"], w[p + "mlp.w3.weight"]]) * fn, f"w13.{i}"))
            w2.append(_param(w[p + "mlp.w2.weight"], f"w2.{i}"))
        self.wq2, self.wkv3, self.wo = ParameterTuple(wq2), ParameterTuple(wkv3), ParameterTuple(wo)
        self.w13, self.w2 = ParameterTuple(w13), ParameterTuple(w2)


class _Decoder(nn.Cell):
    """The math shared by the cells below (model.py's: RMSNorm in fp32, rotate-half rotary, grouped KV
    heads, -1e9 masking), over `Weights`. Caches are tuples of per-layer [B, kv_heads, T, head_dim]."""

    def __init__(self, args: ModelArgs, weights: Weights, steps: int = 1, greedy: bool = True,
                 eos_id: int = -1, pad_id: int = 0):
        super().__init__()
        self.w = weights
        self.nl, self.nh, self.kvh, self.hd = args.num_layers, args.num_heads, args.kv_heads, args.head_dim
        self.rep, self.eps, self.vocab = args.num_heads // args.kv_heads, args.norm_eps, args.vocab_size
        self.steps, self.greedy, self.eos_id, self.pad_id = steps, greedy, eos_id, pad_id
        t = args.seq_length
        cos, sin = rotary_tables(t, args.head_dim, args.rope_theta)
        cos, sin = np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1)     # [T, D]
        self.cos_t, self.sin_t = Tensor(cos.reshape(t, 1, -1)), Tensor(sin.reshape(t, 1, -1))
        # per-position tables already repeated over the heads, for the decode step's flat layout
        self.cos_q, self.sin_q = Tensor(np.tile(cos, (1, self.nh))), Tensor(np.tile(sin, (1, self.nh)))
        self.cos_k, self.sin_k = Tensor(np.tile(cos, (1, self.kvh))), Tensor(np.tile(sin, (1, self.kvh)))
        # row p of each: the decode step at position p writes its K/V where `here` is True and
        # attends to positions <= p (bias 0, else -1e9); one gather each per step
        self.here_t = Tensor(np.eye(t, dtype=np.bool_).reshape(t, 1, t, 1))
        self.bias_t = Tensor(np.triu(np.full((t, t), -1e9, np.float32), 1).reshape(t, 1, 1, t))
        self.t = t
        self.future = Tensor(np.triu(np.full((t, t), -1e9, np.float32), 1))    # prefill's causal bias
        self.mm = ops.MatMul(transpose_b=True)
        self.qk = ops.BatchMatMul(transpose_b=True)
        self.pv = ops.BatchMatMul()
        self.softmax = ops.Softmax(-1)
        self.split2, self.split3 = ops.Split(-1, 2), ops.Split(-1, 3)
        self.silu = SiLU()
        self.argmax = ops.Argmax(-1, mstype.int32)
        self.topk = ops.TopK(sorted=True)
        self.cumsum = ops.CumSum()

    def rms(self, x):
        return x * ops.rsqrt(ops.mean(x * x, -1, keep_dims=True) + self.eps)

    def dense(self, x, w):
        if x.ndim == 2:
            return self.mm(x, w)
        b, s, d = x.shape
        return self.mm(x.reshape(b * s, d), w).reshape(b, s, -1)

    def mlp(self, i, h):
        a, g = self.split2(self.dense(self.rms(h), self.w.w13[i]))
        return h + self.dense(self.silu(a) * g, self.w.w2[i])

    def prefill(self, tokens, last):
        """tokens int32 [B, L] right-padded (L <= T: a bucket of the prompt lengths, one compile per
        bucket), last int32 [B] -> (logits [B, V] at `last`, caches of length T)."""
        b, t = tokens.shape
        h = ops.gather(self.w.emb, tokens, 0)
        cos, sin, future = self.cos_t[:t], self.sin_t[:t], self.future[:t, :t]
        ks, vs = (), ()
        for i in range(self.nl):
            x = self.rms(h)
            q, qr = self.split2(self.dense(x, self.w.wq2[i]))
            k, kr, v = self.split3(self.dense(x, self.w.wkv3[i]))
            q = q.reshape(b, t, self.nh, self.hd) * cos + qr.reshape(b, t, self.nh, self.hd) * sin
            k = k.reshape(b, t, self.kvh, self.hd) * cos + kr.reshape(b, t, self.kvh, self.hd) * sin
            k, v = k.transpose(0, 2, 1, 3), v.reshape(b, t, self.kvh, self.hd).transpose(0, 2, 1, 3)
            if t < self.t:      # the decode steps write positions L .. T-1 before reading them
                ks, vs = ks + (ops.pad(k, (0, 0, 0, self.t - t)),), vs + (ops.pad(v, (0, 0, 0, self.t - t)),)
            else:
                ks, vs = ks + (k,), vs + (v,)
            # the `rep` query heads of a KV head are rows of one matmul against its K (no copies of K/V)
            q = q.transpose(0, 2, 1, 3).reshape(b, self.kvh, self.rep * t, self.hd)
            scores = self.qk(q, k).reshape(b, self.kvh, self.rep, t, t) + future
            o = self.pv(self.softmax(scores).reshape(b, self.kvh, self.rep * t, t), v)   # [B, KV, rep*L, D]
            o = o.reshape(b, self.nh, t, self.hd).transpose(0, 2, 1, 3).reshape(b, t, self.nh * self.hd)
            h = self.mlp(i, h + self.dense(o, self.w.wo[i]))
        pick = ops.one_hot(last, t, Tensor(1.0, mstype.float32), Tensor(0.0, mstype.float32)).expand_dims(1)
        h_last = self.pv(pick, h)[:, 0, :]                                     # [B, D], exact
        return self.mm(self.rms(h_last), self.w.head), ks, vs

    def decode(self, token, pos, ks, vs):
        """One new token per row at its own position: writes its K/V at `pos` (ops.where on a one-hot,
        exact) and attends to positions <= pos. -> (logits [B, V], caches)."""
        b = token.shape[0]
        h = ops.gather(self.w.emb, token, 0)                                   # [B, D]
        cq, sq = ops.gather(self.cos_q, pos, 0), ops.gather(self.sin_q, pos, 0)
        ck, sk = ops.gather(self.cos_k, pos, 0), ops.gather(self.sin_k, pos, 0)
        here, bias = ops.gather(self.here_t, pos, 0), ops.gather(self.bias_t, pos, 0)   # [B,1,T,1], [B,1,1,T]
        nk, nv = (), ()
        for i in range(self.nl):
            x = self.rms(h)
            q, qr = self.split2(self.mm(x, self.w.wq2[i]))
            k, kr, v = self.split3(self.mm(x, self.w.wkv3[i]))
            q, k = q * cq + qr * sq, k * ck + kr * sk
            kc = ops.where(here, k.reshape(b, self.kvh, 1, self.hd), ks[i])
            vc = ops.where(here, v.reshape(b, self.kvh, 1, self.hd), vs[i])
            nk, nv = nk + (kc,), nv + (vc,)
            scores = self.qk(q.reshape(b, self.kvh, self.rep, self.hd), kc) + bias   # [B, KV, rep, T]
            o = self.pv(self.softmax(scores), vc).reshape(b, self.nh * self.hd)
            h = self.mlp(i, h + self.mm(o, self.w.wo[i]))
        return self.mm(self.rms(h), self.w.head), nk, nv

    def choose(self, logits, u, temperature, top_p):
        """Greedy: argmax. Sampled: softmax(logits / temperature), keep the most probable tokens until
        their total reaches top_p, and take the token where the kept mass's running sum passes
        u * (kept mass), u in [0, 1) given per row."""
        if self.greedy:
            return self.argmax(logits)
        probs = self.softmax(logits / temperature)
        p, idx = self.topk(probs, self.vocab)                                  # descending
        cum = self.cumsum(p, -1)
        kept = ops.select((cum - p) < top_p, p, ops.zeros_like(p))             # the first always
        run = self.cumsum(kept, -1)
        below = (run < u.reshape(-1, 1) * run[:, -1:]).astype(mstype.int32).sum(-1)
        n_kept = ((cum - p) < top_p).astype(mstype.int32).sum(-1)
        at = ops.minimum(below, n_kept - 1)
        return ops.gather_elements(idx, 1, at.reshape(-1, 1)).reshape(-1).astype(mstype.int32)

    def advance(self, nxt, pos, count, done, limit):
        """Book one chosen token per row: finished rows emit pad and stay where they are."""
        live = ops.logical_not(done)
        nxt = ops.select(live, nxt, ops.full_like(nxt, self.pad_id))
        step = live.astype(mstype.int32)
        count = count + step
        done = ops.logical_or(done, count >= limit)
        if self.eos_id >= 0:                                  # static: no EOS id, no comparison
            done = ops.logical_or(done, nxt == self.eos_id)   # a finished row's pad is not EOS
        return nxt, pos + step, count, done


class Prefill(_Decoder):
    """tokens int32 [B, L], last int32 [B] -> (logits [B, V] at `last`, K caches, V caches)."""

    def construct(self, tokens, last):
        return self.prefill(tokens, last)


class DecodeStep(_Decoder):
    """token int32 [B], pos int32 [B], K/V caches -> (logits [B, V], caches with position pos written)."""

    def construct(self, token, pos, ks, vs):
        return self.decode(token, pos, ks, vs)


class Start(_Decoder):
    """Prefill and the first token: -> (token, pos, count, done, caches). `active` False marks padding
    rows; `limit` is each row's most new tokens."""

    def construct(self, tokens, last, active, limit, u, temperature, top_p):
        logits, ks, vs = self.prefill(tokens, last)
        nxt = self.choose(logits, u[:, 0], temperature, top_p)
        zeros = ops.zeros_like(last)
        nxt, pos, count, done = self.advance(nxt, last + 1, zeros, ops.logical_not(active), limit)
        return nxt, pos, count, done, ks, vs


class DecodeChunk(_Decoder):
    """`steps` decode steps in one graph launch (a fixed, unrolled loop: one compile): feeds each row's
    last token at its position, chooses the next, books it. -> (tokens [B, steps] with pad after a
    row finished, then the state and caches for the next chunk)."""

    def construct(self, token, pos, count, done, limit, ks, vs, u, temperature, top_p):
        out = ()
        for j in range(self.steps):
            logits, ks, vs = self.decode(token, ops.minimum(pos - 1, self.t - 1), ks, vs)
            nxt = self.choose(logits, u[:, j], temperature, top_p)
            token, pos, count, done = self.advance(nxt, pos, count, done, limit)
            out = out + (token,)
        return ops.stack(out, 1), token, pos, count, done, ks, vs
