"""`train score RUN --input FILE.jsonl --out FILE.jsonl`: per-token log-probabilities and perplexity.

Each input line is {"text": ...} (encoded with the run's tokenizer as EOS + tokens + EOS: EOS is what
precedes and ends a document in training) or {"tokens": [ids]} (scored as given). Every token after
the first is predicted, so a document of n tokens gets n - 1 log-probabilities (natural log), and
perplexity exp(-mean). A document longer than the model's context is scored in consecutive windows of
seq_length predictions, each window restarting its context at its first token.

The log-probabilities come from mspretrain/train/models/llama/model.py's own forward (`Llama`, fp32, GRAPH_MODE), rows
right-padded to seq_length (causal attention: padding never changes earlier positions), built as the
run trained it: with `model.document_mask` / `model.reset_position_ids` on, an EOS inside a line ends a
document as in a packed training sample, so the tokens after it attend only to their own document
(and count positions from 0 again); the first token after an EOS is predicted at the EOS's position, as
in training. Without them (or for a line holding one document) the line is one causal sequence.
"""
from __future__ import annotations

import json
import math

import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.common import dtype as mstype


class TokenLogProbs(nn.Cell):
    """input_ids int32 [B, S+1] -> log p(input_ids[:, t+1] | input_ids[:, :t+1]), fp32 [B, S]; with
    `hits` also whether each next token is a top-1 prediction, bool [B, S]: its logit equals the
    largest, ties included (as val_acc counts, train.step.loss.CausalLMLoss)."""

    def __init__(self, model: nn.Cell, hits: bool = False):
        super().__init__()
        self.model, self.hits = model, hits

    def construct(self, input_ids):
        logits = self.model(input_ids[:, :-1]).astype(mstype.float32)
        labels = input_ids[:, 1:]
        picked = ops.gather_elements(logits, 2, labels.expand_dims(-1)).squeeze(-1)
        log_probs = picked - ops.logsumexp(logits, -1)
        if self.hits:
            return log_probs, picked >= logits.max(-1)
        return log_probs


def windows(ids: list[int], seq_length: int) -> list[list[int]]:
    """Consecutive windows of at most seq_length + 1 tokens, overlapping by one token, so every
    token after the first is predicted exactly once."""
    out, start = [], 0
    while start < len(ids) - 1:
        out.append(ids[start:start + seq_length + 1])
        start += seq_length
    return out


class Scorer:
    def __init__(self, model, seq_length: int, pad_id: int, batch_size: int = 8):
        self.net = TokenLogProbs(model)
        self.seq, self.pad, self.batch = seq_length, pad_id, batch_size

    def score(self, docs: list[list[int]]) -> list[np.ndarray]:
        """Per-document fp32 log-probabilities, one per predicted token."""
        pieces = [(d, w) for d, ids in enumerate(docs) for w in windows(ids, self.seq)]
        parts: list[list[np.ndarray]] = [[] for _ in docs]
        for start in range(0, len(pieces), self.batch):
            chunk = pieces[start:start + self.batch]
            rows = np.full((self.batch, self.seq + 1), self.pad, np.int32)   # one shape: one compile
            for r, (_, w) in enumerate(chunk):
                rows[r, :len(w)] = w
            lp = self.net(Tensor(rows)).asnumpy()
            for r, (d, w) in enumerate(chunk):
                parts[d].append(lp[r, :len(w) - 1])
        return [np.concatenate(p) if p else np.zeros(0, np.float32) for p in parts]


def perplexity(logprobs: np.ndarray) -> float | None:
    if logprobs.size == 0:
        return None
    return math.exp(min(-float(np.mean(logprobs, dtype=np.float64)), 700.0))


def training_args(rm):
    """The run's ModelArgs with its document masking and position reset (they need the EOS id):
    what the model saw in training."""
    from mspretrain.train.runinfo import model_args_of_run

    eos = rm.eos_id if rm.eos_id is not None and rm.eos_id >= 0 else None
    return model_args_of_run(rm.run_dir, eos_id=eos)


def main(run_dir, input_path: str, out_path: str, step: int | None = None, batch_size: int = 8) -> int:
    from mspretrain.train.eval.generate import InputError, RunModel, load_prompts, set_graph_mode
    from mspretrain.train.models import spec as model_spec
    from mspretrain.train.runinfo import set_weights

    set_graph_mode()
    rm = RunModel(run_dir, step)
    recs = load_prompts(input_path)
    docs = []
    for i, rec in enumerate(recs):
        ids = rm.encode(rec, f"{input_path}:{i + 1}: ")
        if "text" in rec and "tokens" not in rec:
            ids = ids + [rm.eos_id]
        bad = [t for t in ids if not 0 <= t < rm.args.vocab_size]
        if bad:
            raise InputError(f"{input_path}:{i + 1}: token id {bad[0]} outside [0, {rm.args.vocab_size})")
        docs.append(ids)
    model = model_spec.get(rm.family).build_model(training_args(rm), 0)
    set_weights(model, rm.weights, str(rm.ckpt_dir))
    scores = Scorer(model, rm.args.seq_length, rm.pad_id, batch_size).score(docs)
    with open(out_path, "w", encoding="utf-8") as f:
        for ids, lp in zip(docs, scores):
            f.write(json.dumps({"num_tokens": len(ids), "logprobs": [float(x) for x in lp],
                                "perplexity": perplexity(lp)}) + "\n")
    print(f"[score] {len(docs)} documents from {input_path} -> {out_path} (checkpoint {rm.ckpt_dir})")
    return 0
