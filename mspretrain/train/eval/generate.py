"""`train generate`: greedy and sampled decoding with a KV cache, in MindSpore GRAPH_MODE.

The model family's decoding cells (ModelSpec.decode; Llama's: mspretrain/train/models/llama/decode.py)
run a batch in two compiled cells: `Start(tokens [B, L])`, the causal forward over the right-padded
prompts (L: the next power of two >= the longest prompt, from 16, at most seq_length; one compile per
bucket), the first new token and the K/V caches; and `DecodeChunk`, `steps_per_call` (K, default 8)
decode steps in one graph launch. Finished rows (EOS, max_new_tokens, or the end of the rotary table)
are masked: they emit pad and stay put, so the last chunk simply runs past the end. State and caches
are graph outputs fed back as inputs (`mutable`: not recompiled per value); the host reads only each
chunk's tokens and finished flags.

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
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mindspore import Tensor, mutable

from mspretrain.common.errors import MspretrainError
from mspretrain.common.jsonl import read_json_lines
from mspretrain.train.models import spec as model_spec


class InputError(MspretrainError, ValueError):
    """A prompt or document that cannot be used; the message names the file and line."""


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

    def __init__(self, args, weights: dict, eos_id: int, pad_id: int, batch_size: int = 8,
                 steps_per_call: int = 8, family: str = "llama"):
        self.args, self.eos_id, self.pad_id, self.batch_size = args, eos_id, pad_id, batch_size
        self.steps = steps_per_call
        spec = model_spec.get(family)
        if spec.decode is None:
            raise InputError(f"model.family {family!r} has no decoding cells (ModelSpec.decode)")
        self.cells = spec.decode()          # the family's Weights, Start and DecodeChunk
        self.weights = self.cells.Weights(args, weights)
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
        state = self._cell(self.cells.Start, greedy)(Tensor(tokens), Tensor(lens - 1), active, Tensor(limit),
                                          Tensor(u[:, :1]), temp, top_p)
        token, pos, count, done, ks, vs = state
        seqs = [token.asnumpy().reshape(b, 1)]
        chunk, limit_t = self._cell(self.cells.DecodeChunk, greedy), Tensor(limit)
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
        cfg = runinfo.run_config(run_dir)
        self.family = cfg.model.family
        self.args = runinfo.model_args_of_run(run_dir, cfg)
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
    gen = Generator(rm.args, rm.weights, rm.eos_id, rm.pad_id, min(batch_size, len(ids)), family=rm.family)
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
