"""Document boundaries inside packed samples.

`dataprep` packs documents back to back and ends each with EOS, so a sample's boundaries are its EOS
tokens: a token belongs to the document that its next EOS (inclusive) closes. From the model's input
tokens this module derives

- the block-causal attention mask: token i attends to token j only if j <= i and both are in the same
  document (for the plain CPU attention a bool [B, 1, S, S], True where masked: the scores there are
  set to -1e9 by a select, as the plain causal mask does, so it costs no add and no gradient);
- rotary positions that restart at 0 after every EOS;
- the loss mask: the label after an EOS is the first token of an unrelated document, so the position
  holding an EOS predicts nothing (`train.eod_mask_loss`);
- for the Ascend fused kernel (`FlashAttentionScore`, TND layout), the cumulative document ends over
  the flattened batch (`actual_seq_qlen/kvlen`). Their length must be fixed for a static graph, so at
  most `max_documents` documents per sample are separated: the EOS after the (max_documents - 1)-th
  document closes the last separate one, and later documents share one attention block with it.
  `count_over_limit` counts the samples where that happens (the trainer logs it). A sample's unused
  slots repeat its end (zero-length documents), as MindFormers pads `actual_seq_len`.
  Under data parallelism each rank's kernel sees only its own B / dp samples, flattened from 0, and
  MindSpore's parallel pass splits the ends by dp without rebasing them (it rewrites them only when the
  sequence itself is split). So the ends restart at every shard boundary: sample b is offset by
  (b mod B/dp) * S (`data_parallel`, set from the parallel plan), and the dp slices of the whole
  batch's ends are exactly the ends each shard would compute alone.

The graph side (`DocumentBoundaries`) is computed in the model's graph from `input_ids`, so the step's
inputs and the dataset format do not change; it is integer arithmetic, hence deterministic. The numpy
functions are the loader-side reference of the same rules: the trainer counts with them and the tests
check the graph against them.
"""
from __future__ import annotations

import numpy as np
from mindspore import Tensor, nn, ops
from mindspore.common import dtype as mstype


# ---------------------------------------------------------------- numpy (loader side, reference)

def document_ids(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """[B, S] -> [B, S] int32: the index of each token's document within its sample (EOS closes one)."""
    eos = (tokens == eos_id).astype(np.int32)
    return np.cumsum(eos, axis=-1, dtype=np.int32) - eos


def positions(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """[B, S] -> [B, S] int32: the position of each token within its document (0 after every EOS)."""
    s = tokens.shape[-1]
    idx = np.broadcast_to(np.arange(s, dtype=np.int32), tokens.shape)
    after_eos = np.concatenate([np.zeros_like(tokens[..., :1], dtype=bool), tokens[..., :-1] == eos_id], -1)
    start = np.maximum.accumulate(np.where(after_eos, idx, 0), axis=-1)
    return (idx - start).astype(np.int32)


def block_causal_mask(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """[B, S] -> [B, S, S] bool, True where query i may attend to key j."""
    doc = document_ids(tokens, eos_id)
    s = tokens.shape[-1]
    causal = np.tril(np.ones((s, s), dtype=bool))
    return (doc[..., :, None] == doc[..., None, :]) & causal


def loss_mask(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """[B, S] -> [B, S] float32: 0 where the input token is EOS (its label starts another document)."""
    return (tokens != eos_id).astype(np.float32)


def num_documents(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """[B, S] -> [B]: documents (whole or cut) in each sample; an EOS in the last slot opens none."""
    return (tokens[..., :-1] == eos_id).sum(-1) + 1


def count_over_limit(tokens: np.ndarray, eos_id: int, max_documents: int) -> int:
    """Samples with more documents than the fused kernel separates (their tail documents are merged)."""
    return int((num_documents(tokens, eos_id) > max_documents).sum())


def seq_ends(tokens: np.ndarray, eos_id: int, max_documents: int, data_parallel: int = 1) -> np.ndarray:
    """[B, S] -> [B * L] int64 (L = min(max_documents, S)): each sample's document ends, offset by
    b * S over the flattened samples of its data-parallel shard (B / data_parallel consecutive samples),
    non-decreasing within a shard, each sample's list padded with its end; a shard's last = (B / dp) * S."""
    b, s = tokens.shape
    if b % data_parallel:
        raise ValueError(f"a batch of {b} samples does not split over {data_parallel} data-parallel shards")
    limit = min(max_documents, s)
    out = np.empty((b, limit), np.int64)
    for row in range(b):
        ends = np.flatnonzero(tokens[row] == eos_id) + 1
        ends = ends[ends < s][:limit - 1]
        out[row] = np.concatenate([ends, np.full(limit - len(ends), s)])
    return (out + (np.arange(b) % (b // data_parallel))[:, None] * s).reshape(-1)


# ---------------------------------------------------------------- graph side

class DocumentBoundaries(nn.Cell):
    """tokens int32 [B, S] -> (mask, positions).

    mask: the block-causal mask bool [B, 1, S, S], True where query i must not see key j (plain
    attention), or with `flash` the cumulative document ends int64 [B * L] for the TND kernel; None
    when `document_mask` is off.
    positions: int32 [B, S] restarting at each document; None when `reset_positions` is off.
    """

    def __init__(self, eos_id: int, seq_length: int, document_mask: bool, reset_positions: bool,
                 flash: bool = False, max_documents: int = 128):
        super().__init__()
        if eos_id < 0:
            raise ValueError(f"document boundaries need the tokenizer's EOS id, got {eos_id}")
        if max_documents < 1:
            raise ValueError(f"max_documents must be >= 1, got {max_documents}")
        self.eos_id, self.s = int(eos_id), int(seq_length)
        self.document_mask, self.reset_positions, self.flash = document_mask, reset_positions, flash
        self.limit = min(int(max_documents), self.s)
        self.data_parallel = 1      # shards of the batch the kernel runs on (train.parallel.annotate)
        self.idx = Tensor(np.arange(self.s, dtype=np.int32).reshape(1, -1))
        self.future = Tensor(np.triu(np.ones((self.s, self.s), np.bool_), 1))

    def construct(self, tokens):
        eos = ops.equal(tokens, self.eos_id)
        mask = None
        if self.document_mask:
            mask = self.seq_ends(eos) if self.flash else self.masked(eos)
        pos = self.positions(eos) if self.reset_positions else None
        return mask, pos

    def masked(self, eos):
        """bool [B, 1, S, S]: True where key j is in another document than query i, or after it."""
        e = eos.astype(mstype.int32)
        doc = ops.cumsum(e, 1) - e
        other = ops.not_equal(doc.expand_dims(2), doc.expand_dims(1))
        return ops.logical_or(other, self.future).expand_dims(1)

    def positions(self, eos):
        b = eos.shape[0]
        idx = ops.broadcast_to(self.idx, (b, self.s))
        after_eos = ops.concat((ops.zeros_like(eos[:, :1]), eos[:, :-1]), 1)
        start = ops.cummax(ops.select(after_eos, idx, ops.zeros_like(idx)), 1)[0]
        return idx - start

    def seq_ends(self, eos):
        b = eos.shape[0]
        idx = ops.broadcast_to(self.idx, (b, self.s))
        # each EOS before the last slot ends a document; the other slots sort after every real end
        ends = ops.select(ops.logical_and(eos, idx < self.s - 1), idx + 1, ops.full_like(idx, self.s))
        ends = ends.astype(mstype.float32)      # exact below 2**24; topk sorts floats on every device
        last = ops.full((b, 1), self.s, dtype=mstype.float32)
        if self.limit > 1:
            ends = ops.concat((-ops.topk(-ends, self.limit - 1)[0], last), 1)
        else:
            ends = last
        # per data-parallel shard: sample b starts at (b mod B/dp) * S of its shard's flattened tokens
        per_shard = b // self.data_parallel
        offsets = (ops.arange(0, b, 1, dtype=mstype.int32) % per_shard) * self.s
        return (ends + offsets.astype(mstype.float32).reshape(-1, 1)).reshape(-1).astype(mstype.int64)

