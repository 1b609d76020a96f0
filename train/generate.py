"""`train generate`: greedy and sampled decoding with a KV cache, in MindSpore GRAPH_MODE.

Two compiled cells over the same weights as train/model.py (the checkpoint's, in fp32):
- `Prefill(tokens [B, T])`: the full causal forward over the right-padded prompts (T = the model's
  seq_length, one shape, one compile); returns the logits at each row's last prompt token and the
  K/V of every position, [layers, B, kv_heads, T, head_dim];
- `DecodeStep(token [B], pos [B], K, V)`: one new token per row at its own position; writes its K/V
  into the cache at `pos` (ops.where on a one-hot, exact) and attends to positions <= pos.
The math is model.py's (RMSNorm in fp32, rotate-half rotary, grouped KV heads, -1e9 masking);
tests/train/test_generate.py checks the logits against `Llama`'s forward.

Decoding runs in numpy over the fp32 logits: greedy (temperature 0) is an argmax; sampling divides
by the temperature, keeps the smallest set of tokens whose probability reaches top_p and draws with
numpy's default_rng((seed, prompt index)): the same seed gives the same tokens, whatever the batch. A row stops at EOS, after
max_new_tokens, or at the model's seq_length (rotary tables and the cache end there).

A prompt given as text is encoded with the run's tokenizer after an EOS: training packs documents back
to back, each ending in EOS, so EOS is what precedes the start of a document.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype

from mspretrain.jsonl import read_json_lines
from train.model import ModelArgs, rotary_tables


class InputError(ValueError):
    """A prompt or document that cannot be used; the message names the file and line."""


def _param(x: np.ndarray, name: str) -> Parameter:
    return Parameter(Tensor(np.ascontiguousarray(x, dtype=np.float32)), name=name, requires_grad=False)


class _Layer(nn.Cell):
    def __init__(self, w: dict, i: int):
        super().__init__()
        p = f"layers.{i}."
        self.attention_norm = _param(w[p + "attention_norm.weight"], "attention_norm")
        self.wq = _param(w[p + "attention.wq.weight"], "wq")
        self.wk = _param(w[p + "attention.wk.weight"], "wk")
        self.wv = _param(w[p + "attention.wv.weight"], "wv")
        self.wo = _param(w[p + "attention.wo.weight"], "wo")
        self.ffn_norm = _param(w[p + "ffn_norm.weight"], "ffn_norm")
        self.w1 = _param(w[p + "mlp.w1.weight"], "w1")
        self.w2 = _param(w[p + "mlp.w2.weight"], "w2")
        self.w3 = _param(w[p + "mlp.w3.weight"], "w3")


class _Base(nn.Cell):
    """Weights and the shared math of both cells."""

    def __init__(self, args: ModelArgs, w: dict):
        super().__init__()
        self.args = args
        self.nh, self.kvh, self.hd = args.num_heads, args.kv_heads, args.head_dim
        self.rep = args.num_heads // args.kv_heads
        self.eps = args.norm_eps
        self.scale = 1.0 / math.sqrt(args.head_dim)
        self.emb = _param(w["tok_embeddings.embedding_table"], "emb")
        self.layers = nn.CellList([_Layer(w, i) for i in range(args.num_layers)])
        self.norm = _param(w["norm.weight"], "norm")
        self.tied = args.tie_embeddings
        self.head = None if self.tied else _param(w["output.weight"], "head")
        cos, sin = rotary_tables(args.seq_length, args.head_dim, args.rope_theta)
        self.cos, self.sin = Tensor(cos), Tensor(sin)
        self.mm = ops.MatMul(transpose_b=True)
        self.qk = ops.BatchMatMul(transpose_b=True)
        self.pv = ops.BatchMatMul()
        self.softmax = ops.Softmax(-1)

    def dense(self, x, w):
        b, s, d = x.shape
        return self.mm(x.reshape(b * s, d), w).reshape(b, s, -1)

    def rms(self, x, w):
        var = ops.mean(ops.square(x), -1, keep_dims=True)
        return x * ops.rsqrt(var + self.eps) * w

    def rope(self, x, cos, sin):
        half = self.hd // 2
        x1, x2 = x[..., :half], x[..., half:]
        return ops.concat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1)

    def heads(self, x, n):
        b, s, _ = x.shape
        return x.reshape(b, s, n, self.hd).transpose(0, 2, 1, 3)

    def attend(self, q, k, v, masked):
        """q [B,H,Sq,D], k/v [B,KV,Sk,D], masked [.., Sq, Sk] True where not allowed."""
        if self.rep > 1:
            b, _, s, hd = k.shape
            k = ops.tile(k.expand_dims(2), (1, 1, self.rep, 1, 1)).reshape(b, self.nh, s, hd)
            v = ops.tile(v.expand_dims(2), (1, 1, self.rep, 1, 1)).reshape(b, self.nh, s, hd)
        scores = self.qk(q, k) * self.scale
        scores = ops.masked_fill(scores, masked, -1e9)
        out = self.pv(self.softmax(scores), v)
        b, _, s, _ = out.shape
        return out.transpose(0, 2, 1, 3).reshape(b, s, self.nh * self.hd)

    def mlp(self, layer, x):
        return self.dense(ops.silu(self.dense(x, layer.w1)) * self.dense(x, layer.w3), layer.w2)

    def logits(self, h):
        if self.tied:
            return self.dense(self.rms(h, self.norm), self.emb)
        return self.dense(self.rms(h, self.norm), self.head)


class Prefill(_Base):
    """tokens int32 [B, T], last int32 [B] -> (logits [B, V] at `last`, K, V [L, B, KV, T, D])."""

    def __init__(self, args: ModelArgs, w: dict):
        super().__init__(args, w)
        t = args.seq_length
        self.future = Tensor(np.triu(np.ones((t, t), np.bool_), 1))

    def construct(self, tokens, last):
        h = ops.gather(self.emb, tokens, 0)
        ks, vs = [], []
        for layer in self.layers:
            x = self.rms(h, layer.attention_norm)
            q = self.rope(self.heads(self.dense(x, layer.wq), self.nh), self.cos, self.sin)
            k = self.rope(self.heads(self.dense(x, layer.wk), self.kvh), self.cos, self.sin)
            v = self.heads(self.dense(x, layer.wv), self.kvh)
            ks.append(k)
            vs.append(v)
            h = h + self.dense(self.attend(q, k, v, self.future), layer.wo)
            h = h + self.mlp(layer, self.rms(h, layer.ffn_norm))
        pick = ops.one_hot(last, h.shape[1], Tensor(1.0, mstype.float32),
                           Tensor(0.0, mstype.float32)).expand_dims(1)          # [B, 1, T]
        h_last = self.pv(pick, h)                                                # [B, 1, D], exact
        return self.logits(h_last)[:, 0, :], ops.stack(ks), ops.stack(vs)


class DecodeStep(_Base):
    """token int32 [B], pos int32 [B], K, V -> (logits [B, V], K, V with position pos written)."""

    def __init__(self, args: ModelArgs, w: dict):
        super().__init__(args, w)
        self.positions = Tensor(np.arange(args.seq_length, dtype=np.int32))

    def construct(self, token, pos, kcache, vcache):
        b = token.shape[0]
        h = ops.gather(self.emb, token.reshape(b, 1), 0)                        # [B, 1, D]
        cos = ops.gather(self.cos, pos, 0).reshape(b, 1, 1, -1)
        sin = ops.gather(self.sin, pos, 0).reshape(b, 1, 1, -1)
        here = (self.positions.reshape(1, -1) == pos.reshape(-1, 1)).reshape(b, 1, -1, 1)  # [B,1,T,1]
        masked = (self.positions.reshape(1, -1) > pos.reshape(-1, 1)).reshape(b, 1, 1, -1)  # [B,1,1,T]
        ks, vs = [], []
        i = 0
        for layer in self.layers:
            x = self.rms(h, layer.attention_norm)
            q = self.rope(self.heads(self.dense(x, layer.wq), self.nh), cos, sin)
            k = self.rope(self.heads(self.dense(x, layer.wk), self.kvh), cos, sin)
            v = self.heads(self.dense(x, layer.wv), self.kvh)
            kc = ops.where(here, k, kcache[i])
            vc = ops.where(here, v, vcache[i])
            ks.append(kc)
            vs.append(vc)
            h = h + self.dense(self.attend_one(q, kc, vc, masked), layer.wo)
            h = h + self.mlp(layer, self.rms(h, layer.ffn_norm))
            i += 1
        return self.logits(h)[:, 0, :], ops.stack(ks), ops.stack(vs)

    def attend_one(self, q, k, v, masked):
        """One query position: the `rep` query heads of a KV head are rows of one matmul against
        that head's cache (no tiled copy of K/V). q [B,H,1,D], k/v [B,KV,T,D] -> [B,1,H*D]."""
        b = q.shape[0]
        q = q.reshape(b, self.kvh, self.rep, self.hd)                 # head h = kv * rep + r
        scores = self.qk(q, k) * self.scale                           # [B, KV, rep, T]
        scores = ops.masked_fill(scores, masked, -1e9)
        out = self.pv(self.softmax(scores), v)                        # [B, KV, rep, D]
        return out.reshape(b, 1, self.nh * self.hd)


@dataclass
class Sampling:
    max_new_tokens: int = 32
    temperature: float = 0.0        # 0: greedy
    top_p: float = 1.0
    seed: int = 0


class Generator:
    """Batched decoding for a model given by its args and Llama-relative fp32 weights. Every call runs
    `batch_size` rows (unused rows are padding), so the two cells compile once."""

    def __init__(self, args: ModelArgs, weights: dict, eos_id: int, pad_id: int, batch_size: int = 8):
        self.args, self.eos_id, self.pad_id, self.batch_size = args, eos_id, pad_id, batch_size
        self.prefill = Prefill(args, weights)
        self.step = DecodeStep(args, weights)

    def generate(self, prompts: list[list[int]], s: Sampling) -> list[list[int]]:
        """The new tokens of each prompt (EOS included when it was produced)."""
        out = []
        for start in range(0, len(prompts), self.batch_size):
            out += self._generate(prompts[start:start + self.batch_size], s, start)
        return out

    def _generate(self, prompts: list[list[int]], s: Sampling, first: int) -> list[list[int]]:
        if s.temperature < 0 or not 0 < s.top_p <= 1 or s.max_new_tokens < 0:
            raise InputError(f"need temperature >= 0, 0 < top_p <= 1, max_new_tokens >= 0; got "
                             f"{s.temperature}, {s.top_p}, {s.max_new_tokens}")
        T = self.args.seq_length
        for i, p in enumerate(prompts):
            if not 1 <= len(p) <= T:
                raise InputError(f"prompt {i}: {len(p)} tokens; it must have 1 to {T} (the model's "
                                 f"seq_length)")
            bad = [t for t in p if not 0 <= t < self.args.vocab_size]
            if bad:
                raise InputError(f"prompt {i}: token id {bad[0]} outside the vocabulary [0, {self.args.vocab_size})")
        n, b = len(prompts), self.batch_size
        # one stream per prompt, from (seed, prompt index): a prompt's sample does not depend on
        # which other prompts share its batch
        rngs = [np.random.default_rng([s.seed, first + i]) for i in range(b)]
        tokens = np.full((b, T), self.pad_id, np.int32)
        for i, p in enumerate(prompts):
            tokens[i, :len(p)] = p
        pos = np.array([len(p) for p in prompts] + [1] * (b - n), np.int32)
        out: list[list[int]] = [[] for _ in range(b)]
        done = np.arange(b) >= n           # padding rows are done from the start
        if s.max_new_tokens == 0:
            return out[:n]
        logits, kc, vc = self.prefill(Tensor(tokens), Tensor(pos - 1))
        while True:
            nxt = self._choose(logits.asnumpy(), s, rngs, done)
            for i in range(b):
                if not done[i]:
                    out[i].append(int(nxt[i]))
                    done[i] = (nxt[i] == self.eos_id or len(out[i]) >= s.max_new_tokens
                               or pos[i] >= T)
            if done.all():
                return out[:n]
            feed = np.where(done, self.pad_id, nxt).astype(np.int32)
            step_pos = np.minimum(pos, T - 1).astype(np.int32)     # finished rows: any valid slot
            logits, kc, vc = self.step(Tensor(feed), Tensor(step_pos), kc, vc)
            pos = pos + (~done)

    @staticmethod
    def _choose(logits: np.ndarray, s: Sampling, rngs: list, done: np.ndarray) -> np.ndarray:
        if s.temperature == 0:
            return logits.argmax(-1)
        z = logits.astype(np.float64) / s.temperature
        probs = np.exp(z - z.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        picks = np.empty(len(probs), np.int64)
        picks[done] = 0
        for i, p in enumerate(probs):
            if done[i]:
                continue
            order = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[order])
            keep = order[: int(np.searchsorted(cum, s.top_p)) + 1]
            q = p[keep] / p[keep].sum()
            picks[i] = keep[min(int(np.searchsorted(np.cumsum(q), rngs[i].random())), len(keep) - 1)]
        return picks


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
        from train import runinfo

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
