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

    Every operation is a primitive held here, so that the parallel plan gives each one a strategy
    (train.parallel.apply): all of them work along the sequence of one sample, so only the batch is split.
    Per-sample constants broadcast from [1, S] (or [1, L]) tables instead of being materialised per
    batch, and the per-shard offsets of the document ends are a constant of the batch size.
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
        self.data_parallel = 1      # shards of the batch the kernel runs on (train.parallel.apply.annotate)
        s, limit = self.s, self.limit
        self.is_eos = ops.Equal()
        if (document_mask and not flash) or reset_positions:
            self.cast_eos = ops.Cast()
        if document_mask and not flash:
            self.future = Tensor(np.triu(np.ones((s, s), np.bool_), 1))
            self.count_eos = ops.CumSum(exclusive=True)     # document index: EOS strictly before
            self.other_doc, self.or_future = ops.NotEqual(), ops.LogicalOr()
        if reset_positions:
            self.idx = Tensor(np.arange(s, dtype=np.int32).reshape(1, -1))
            self.drop_last, self.first = ops.StridedSlice(), ops.StridedSlice()
            self.zeros, self.shift = ops.ZerosLike(), ops.Concat(1)
            self.starts, self.last_start, self.positions = ops.Mul(), ops.Cummax(1), ops.Sub()
        if document_mask and flash:
            # an EOS before the last slot ends a document at i + 1; as negated float32 (exact below
            # 2**24) the smallest ends are the largest values, which TopK sorts on every device
            self.not_last = Tensor(np.arange(s).reshape(1, -1) < s - 1)
            self.gap = Tensor((s - 1 - np.arange(s, dtype=np.float32)).reshape(1, -1))
            # TopK's values negated back, except the last slot, which is always the sample's end S
            self.negate_but_last = Tensor(np.append(-np.ones(limit - 1), 0.0).astype(np.float32).reshape(1, -1))
            self.last_end = Tensor(np.append(np.zeros(limit - 1), s).astype(np.float32).reshape(1, -1))
            self.ends_at, self.cast_ends, self.weigh_ends = ops.LogicalAnd(), ops.Cast(), ops.Mul()
            self.negate, self.smallest = ops.Sub(), ops.TopK(sorted=True)
            self.restore, self.close, self.offset = ops.Mul(), ops.Add(), ops.Add()
            self.cast_out = ops.Cast()

    def construct(self, tokens):
        eos = self.is_eos(tokens, self.eos_id)
        e = None
        if (self.document_mask and not self.flash) or self.reset_positions:
            e = self.cast_eos(eos, mstype.int32)
        mask = None
        if self.document_mask:
            mask = self.seq_ends(eos) if self.flash else self.masked(e)
        pos = self.positions_of(e) if self.reset_positions else None
        return mask, pos

    def masked(self, e):
        """bool [B, 1, S, S]: True where key j is in another document than query i, or after it."""
        b, s = e.shape
        doc = self.count_eos(e, 1)
        other = self.other_doc(doc.reshape(b, s, 1), doc.reshape(b, 1, s))
        return self.or_future(other, self.future).reshape(b, 1, s, s)

    def positions_of(self, e):
        """int32 [B, S]: i minus the start of i's document (the slot after the last EOS before i)."""
        b, s = e.shape
        after_eos = self.shift((self.zeros(self.first(e, (0, 0), (b, 1), (1, 1))),
                                self.drop_last(e, (0, 0), (b, s - 1), (1, 1))))
        start = self.last_start(self.starts(after_eos, self.idx))[0]
        return self.positions(self.idx, start)

    def seq_ends(self, eos):
        b = eos.shape[0]
        neg = self.negate(self.weigh_ends(self.cast_ends(self.ends_at(eos, self.not_last), mstype.float32),
                                          self.gap), float(self.s))          # -(i + 1) at an end, else -S
        ends = self.close(self.restore(self.smallest(neg, self.limit)[0], self.negate_but_last), self.last_end)
        # per data-parallel shard: sample b starts at (b mod B/dp) * S of its shard's flattened tokens;
        # a constant [B, 1] that the parallel compiler splits by batch like the ends
        per_shard = b // self.data_parallel
        offsets = Tensor([[float((row % per_shard) * self.s)] for row in range(b)], mstype.float32)
        return self.cast_out(self.offset(ends, offsets), mstype.int64).reshape(-1)
