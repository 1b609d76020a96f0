"""`train generate`: greedy and sampled decoding with a KV cache, in MindSpore GRAPH_MODE.

The checkpoint's fp32 weights are fused once for decoding (`Weights`: q with its rotate-half copy in
one matmul, k, its rotated copy and v in another, the MLP's gate and up in a third; RMSNorm weights
and the attention scale folded into the matmul that follows them), because at decode sizes a kernel
launch costs more than its arithmetic. The math is model.py's (RMSNorm in fp32, rotate-half rotary,
grouped KV heads, -1e9 masking); tests/train/test_generate.py checks the logits against `Llama`'s
forward and the greedy tokens against its argmax. Two compiled cells run a batch:
- `Start(tokens [B, L])`: the causal forward over the right-padded prompts (L: the next power of two
  >= the longest prompt, from 16, at most seq_length; one compile per bucket), the first new token, and
  K/V caches of length seq_length, a tuple of per-layer [B, kv_heads, T, head_dim];
- `DecodeChunk`: `steps_per_call` (K, default 8) decode steps in one graph launch, a fixed unrolled
  loop: each feeds every row's last token at its own position, writes its K/V into the cache
  (ops.where on a one-hot, exact), attends to positions <= it, chooses the next token in the graph
  and books it. Finished rows (EOS, max_new_tokens, or the end of the rotary table) are masked: they
  emit pad and stay put, so the last chunk simply runs past the end. State and caches are graph
  outputs fed back as inputs (`mutable`: not recompiled per value); the host reads only each chunk's
  tokens and finished flags.

Greedy (temperature 0) is an argmax. Sampling divides the logits by the temperature, keeps the most
probable tokens until their probability reaches top_p and takes the token where the kept mass's
running sum passes u times the kept mass. u is the n-th draw of numpy's default_rng((seed, prompt
index)) for a row's n-th new token, drawn on the host and passed in per chunk: the same seed gives
the same tokens whatever the batch and whatever K.

A prompt is one document: it is not masked at an EOS inside it (as in a Hugging Face Llama). A prompt
given as text is encoded with the run's tokenizer after an EOS: training packs documents back to back,
each ending in EOS, so EOS is what precedes the start of a document.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mindspore import Parameter, ParameterTuple, Tensor, mutable, nn, ops
from mindspore.common import dtype as mstype
from mindspore.ops.auto_generate.gen_ops_prim import SiLU   # not re-exported by mindspore.ops in 2.10

from mspretrain.common.jsonl import read_json_lines
from mspretrain.train.models.llama.model import ModelArgs, rotary_tables


class InputError(ValueError):
    """A prompt or document that cannot be used; the message names the file and line."""


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


@dataclass
class Sampling:
    max_new_tokens: int = 32
    temperature: float = 0.0        # 0: greedy
    top_p: float = 1.0
    seed: int = 0


class Generator:
    """Batched decoding for a model given by its args and Llama-relative fp32 weights. Every call runs
    `batch_size` rows (unused rows are padding) and `steps_per_call` decode steps per graph launch, so
    each cell compiles once (per greedy/sampled mode); state and caches stay graph outputs fed back as
    inputs, and the host reads only each chunk's tokens and finished flags."""

    def __init__(self, args: ModelArgs, weights: dict, eos_id: int, pad_id: int, batch_size: int = 8,
                 steps_per_call: int = 8):
        self.args, self.eos_id, self.pad_id, self.batch_size = args, eos_id, pad_id, batch_size
        self.steps = steps_per_call
        self.weights = Weights(args, weights)
        self._cells: dict = {}

    def _cell(self, kind, greedy: bool):
        key = (kind, greedy)
        if key not in self._cells:
            self._cells[key] = kind(self.args, self.weights, self.steps, greedy, self.eos_id, self.pad_id)
        return self._cells[key]

    def generate(self, prompts: list[list[int]], s: Sampling) -> list[list[int]]:
        """The new tokens of each prompt (EOS included when it was produced)."""
        if s.temperature < 0 or not 0 < s.top_p <= 1 or s.max_new_tokens < 0:
            raise InputError(f"need temperature >= 0, 0 < top_p <= 1, max_new_tokens >= 0; got "
                             f"{s.temperature}, {s.top_p}, {s.max_new_tokens}")
        out = []
        for start in range(0, len(prompts), self.batch_size):
            out += self._generate(prompts[start:start + self.batch_size], s, start)
        return out

    def _generate(self, prompts: list[list[int]], s: Sampling, first: int) -> list[list[int]]:
        T = self.args.seq_length
        for i, p in enumerate(prompts):
            if not 1 <= len(p) <= T:
                raise InputError(f"prompt {i}: {len(p)} tokens; it must have 1 to {T} (the model's "
                                 f"seq_length)")
            bad = [t for t in p if not 0 <= t < self.args.vocab_size]
            if bad:
                raise InputError(f"prompt {i}: token id {bad[0]} outside the vocabulary [0, {self.args.vocab_size})")
        n, b, k = len(prompts), self.batch_size, self.steps
        if s.max_new_tokens == 0:
            return [[] for _ in range(n)]
        # prefill length: the next power of two from 16 that holds every prompt, at most T
        width = min(T, max(16, 1 << (max(len(p) for p in prompts) - 1).bit_length()))
        tokens = np.full((b, width), self.pad_id, np.int32)
        for i, p in enumerate(prompts):
            tokens[i, :len(p)] = p
        lens = np.array([len(p) for p in prompts] + [1] * (b - n), np.int32)
        # a row can grow to the end of the rotary table: T - len + 1 new tokens (the last is not fed)
        limit = np.minimum(s.max_new_tokens, T - lens + 1).astype(np.int32)
        chunks = -(-(int(limit.max()) - 1) // k)
        # sampling: row i draws the uniform of its n-th new token from stream (seed, prompt index),
        # so a prompt's sample depends neither on its batch neighbours nor on steps_per_call
        greedy = s.temperature == 0
        u = np.zeros((b, 1 + chunks * k), np.float32)
        if not greedy:
            for i in range(n):
                u[i] = np.random.default_rng([s.seed, first + i]).random(u.shape[1])
        temp, top_p = Tensor(np.float32(s.temperature or 1.0)), Tensor(np.float32(s.top_p))
        active = Tensor(np.arange(b) < n)
        state = self._cell(Start, greedy)(Tensor(tokens), Tensor(lens - 1), active, Tensor(limit),
                                          Tensor(u[:, :1]), temp, top_p)
        token, pos, count, done, ks, vs = state
        seqs = [token.asnumpy().reshape(b, 1)]
        chunk, limit_t = self._cell(DecodeChunk, greedy), Tensor(limit)
        for c in range(chunks):
            if done.asnumpy().all():
                break
            # mutable: the caches are graph inputs, not constants (a tuple of tensors would recompile)
            new, token, pos, count, done, ks, vs = chunk(token, pos, count, done, limit_t, mutable(ks), mutable(vs),
                                                         Tensor(u[:, 1 + c * k:1 + (c + 1) * k]), temp, top_p)
            seqs.append(new.asnumpy())
        seq, count = np.concatenate(seqs, 1), count.asnumpy()
        return [seq[i, :count[i]].tolist() for i in range(n)]


# ---------------------------------------------------------------- prompts and the command

def load_prompts(path) -> list[dict]:
    """A jsonl file of {"text": ...} or {"tokens": [ids]} lines; errors name the line."""
    prompts = []
    for n, rec in read_json_lines(path, InputError):
        if not isinstance(rec, dict) or not (isinstance(rec.get("text"), str) or
                                             isinstance(rec.get("tokens"), list)):
            raise InputError(f"{path}:{n}: expected {{\"text\": str}} or {{\"tokens\": [ids]}}")
        if "tokens" in rec and not all(isinstance(t, int) and not isinstance(t, bool)
                                       for t in rec["tokens"]):
            raise InputError(f"{path}:{n}: field 'tokens' must be a list of integers")
        prompts.append(rec)
    return prompts


class RunModel:
    """A run's checkpoint ready for generation and scoring: args, weights, tokenizer, special ids."""

    def __init__(self, run_dir, step: int | None = None):
        from mspretrain.train import runinfo

        self.run_dir = Path(run_dir)
        info = runinfo.read_run(run_dir)
        self.args = runinfo.model_args_of_run(run_dir)
        self.ckpt_dir = runinfo.checkpoint_dir(run_dir, step)
        self.weights = runinfo.model_weights(self.ckpt_dir)
        tok = info["dataset"]["tokenizer"]
        self.eos_id, self.pad_id = tok["eos_id"], tok["pad_id"]
        spm_file = runinfo.run_tokenizer(run_dir)
        self.sp = None
        if spm_file is not None:
            import sentencepiece as spm
            self.sp = spm.SentencePieceProcessor(model_file=str(spm_file))

    def encode(self, rec: dict, where: str = "") -> list[int]:
        if "tokens" in rec:
            return [int(t) for t in rec["tokens"]]
        if self.sp is None:
            raise InputError(f"{where}text given, but {self.run_dir} has no tokenizer.model; give tokens")
        return [self.eos_id] + self.sp.encode(rec["text"])

    def decode(self, ids: list[int]) -> str | None:
        if self.sp is None:
            return None
        return self.sp.decode([t for t in ids if t != self.eos_id])

    def continuation(self, prompt: list[int], new: list[int]) -> str | None:
        """The text `new` adds after `prompt` (decoded together: a piece's leading space survives)."""
        if self.sp is None:
            return None
        head = self.decode(prompt)
        full = self.decode(prompt + new)
        return full[len(head):] if full.startswith(head) else self.decode(new)


def set_graph_mode() -> None:
    import mindspore as ms
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")


def main(run_dir, prompt: str | None, prompts_file: str | None, sampling: Sampling,
         step: int | None = None, out: str | None = None, batch_size: int = 8) -> int:
    set_graph_mode()
    rm = RunModel(run_dir, step)
    recs = [{"text": prompt}] if prompt is not None else load_prompts(prompts_file)
    ids = [rm.encode(r, f"{prompts_file}:{i + 1}: ") for i, r in enumerate(recs)]
    gen = Generator(rm.args, rm.weights, rm.eos_id, rm.pad_id, min(batch_size, len(ids)))
    sink = open(out, "w", encoding="utf-8") if out else sys.stdout
    try:
        for start in range(0, len(ids), batch_size):
            chunk = ids[start:start + batch_size]
            for rec, p, new in zip(recs[start:start + batch_size], chunk,
                                   gen.generate(chunk, sampling)):
                if prompt is not None and not out:
                    text = rm.decode(p + new)
                    print(text if text is not None else " ".join(map(str, p + new)))
                    continue
                line = {**rec, "prompt_tokens": p, "tokens": new, "text_out": rm.continuation(p, new)}
                sink.write(json.dumps(line, ensure_ascii=False) + "\n")
    finally:
        if out:
            sink.close()
    return 0
