"""The training objective, the same for every model family: next-token cross entropy over the logits
of any model that maps int32 tokens [B, S] to logits [B, S, vocab] (ModelSpec.build_model), with the
EOD mask (train.eod_mask_loss), the z-loss (train.z_loss) and the next-token hits of val_acc.
Its primitives are cell attributes, so that the parallel plan's "loss" entries give them strategies."""
from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops
from mindspore.common import dtype as mstype

Z_VALUE = "z_loss_value"        # CausalLMLoss's z-loss reading: not a weight, never checkpointed


class CausalLMLoss(nn.Cell):
    """input_ids [B, S+1] -> mean next-token cross entropy over B*S positions, fp32. With `eod_mask_id`
    (the EOS id, train.eod_mask_loss) the positions holding EOS are left out of the mean.
    `reduction="sum"`: the sum over the kept positions instead (what the train step differentiates and
    divides by the global batch's token count, train.step.cell); `summed()` is that twin over the same model.
    `hits=True` (validation): (loss, hits, tokens), hits the kept positions whose label's logit is the
    largest (ties included), tokens the kept positions, both fp32 sums (exact below 2^24 per forward).

    Written with primitives that each take a strategy (train.parallel.apply), so that the loss runs on
    logits split by vocabulary without gathering them: max, exp-sum and the picked logit are
    reductions over the vocabulary, which the compiler completes with an all-reduce."""

    def __init__(self, model: nn.Cell, vocab_size: int, eod_mask_id: int = -1, reduction: str = "mean",
                 z_loss: float = 0.0, hits: bool = False):
        super().__init__()
        if reduction not in ("mean", "sum"):
            raise ValueError(f"CausalLMLoss reduction must be mean or sum, got {reduction!r}")
        self.reduction = reduction
        self.model = model
        # train.z_loss: + z_loss * logsumexp(logits)^2 per loss token (PaLM's z-loss); the term itself
        # (reduced as the loss is) is kept in z_value for the metrics (train/observe/monitor.py). Absent when off.
        # The "sum" twin (the train step's) adds each forward's term into z_value, so that one reading
        # after the K micro-batches of a split or pipeline step holds all K; its reader zeroes it before
        # the forward (TrainStepCell.zero_z). The "mean" one (validation) holds the last forward's.
        self.z_loss = float(z_loss)
        self.z_adds = reduction == "sum"
        if self.z_loss > 0:
            self.z_value = Parameter(Tensor(0.0, mstype.float32), name=Z_VALUE, requires_grad=False)
        self.vocab_size = vocab_size
        self.eod_mask_id = eod_mask_id
        self.cast = ops.Cast()
        self.max = ops.ReduceMax(keep_dims=True)
        self.shift = ops.Sub()
        self.exp = ops.Exp()
        self.sum_exp = ops.ReduceSum(keep_dims=False)
        self.log = ops.Log()
        self.one_hot = ops.OneHot()
        self.pick = ops.Mul()
        self.sum_picked = ops.ReduceSum(keep_dims=False)
        self.nll = ops.Sub()
        self.mean = ops.ReduceMean(keep_dims=False)
        self.on, self.off = Tensor(1.0, mstype.float32), Tensor(0.0, mstype.float32)
        # train.eod_mask_loss: the mean over the positions whose input is not EOS
        self.keep, self.cast_keep, self.masked = ops.NotEqual(), ops.Cast(), ops.Mul()
        self.sum_masked, self.count_kept = ops.ReduceSum(keep_dims=False), ops.ReduceSum(keep_dims=False)
        self.at_least_one, self.divide = ops.Maximum(), ops.RealDiv()
        self.inputs, self.targets = ops.StridedSlice(), ops.StridedSlice()   # [B, S+1] -> [B, S] twice
        # next-token accuracy without an argmax over a vocabulary that may be split across ranks:
        # `picked` is logit[label] - max(logits), exactly 0 when the label's logit is the largest and
        # < 0 otherwise (a difference of two floats is 0 only when they are equal). Ties count as hits.
        self.hits = hits
        self.is_top, self.cast_hit = ops.GreaterEqual(), ops.Cast()
        self.hit_kept, self.sum_hits = ops.Mul(), ops.ReduceSum(keep_dims=False)

    def construct(self, input_ids):
        b, s1 = input_ids.shape
        tokens = self.inputs(input_ids, (0, 0), (b, s1 - 1), (1, 1))
        labels = self.targets(input_ids, (0, 1), (b, s1), (1, 1)).reshape(-1)
        logits = self.cast(self.model(tokens), mstype.float32).reshape(-1, self.vocab_size)
        top = ops.stop_gradient(self.max(logits, -1))
        shifted = self.shift(logits, top)                     # log-sum-exp without overflow
        logz = self.log(self.sum_exp(self.exp(shifted), -1))
        picked = self.sum_picked(self.pick(shifted, self.one_hot(labels, self.vocab_size, self.on, self.off)), -1)
        nll = self.nll(logz, picked)
        if self.z_loss > 0:
            lse = logz + top.reshape(-1)                      # the true logsumexp, not the shifted one
            z = self.z_loss * lse * lse
            nll = nll + z
        hit = self.cast_hit(self.is_top(picked, 0.0), mstype.float32) if self.hits else None
        if self.eod_mask_id >= 0:
            keep = self.cast_keep(self.keep(tokens, self.eod_mask_id), mstype.float32).reshape(-1)
            kept = self.count_kept(keep, -1)
            count = self.at_least_one(kept, 1.0)
            loss = self.reduce(self.sum_masked(self.masked(nll, keep), -1), count)
            if self.z_loss > 0:
                loss = self.keep_z(loss, self.reduce(self.sum_masked(self.masked(z, keep), -1), count))
            if self.hits:
                return loss, self.sum_hits(self.hit_kept(hit, keep), -1), kept
            return loss
        whole = self.sum_masked if self.reduction == "sum" else self.mean
        loss = whole(nll, -1)
        if self.z_loss > 0:
            loss = self.keep_z(loss, whole(z, -1))
        if self.hits:
            return loss, self.sum_hits(hit, -1), ops.scalar_to_tensor(b * (s1 - 1), mstype.float32)
        return loss

    def reduce(self, total, count):
        """The sum itself (reduction "sum") or the mean over `count` positions."""
        return total if self.reduction == "sum" else self.divide(total, count)

    def keep_z(self, loss, z_term):
        """`loss`, after this forward's z-loss term is written into z_value (added to it by the "sum"
        twin; the loss depends on the write, so whoever reads z_value after the loss sees it)."""
        write = ops.assign_add if self.z_adds else ops.assign
        return ops.depend(loss, write(self.z_value, ops.stop_gradient(z_term)))

    def summed(self, lazy_inline: bool = False) -> "CausalLMLoss":
        """The reduction="sum" loss over the same model (the same Parameters); `lazy_inline`: as a
        ReusedCausalLMLoss (pipeline stages)."""
        cls = ReusedCausalLMLoss if lazy_inline else CausalLMLoss
        return cls(self.model, self.vocab_size, self.eod_mask_id, reduction="sum", z_loss=self.z_loss)


class ReusedCausalLMLoss(CausalLMLoss):
    """The loss cell (model + loss) compiled once as a sub-graph that every micro-batch calls
    (mindspore.lazy_inline), instead of being unrolled micro-batches x layers: with pipeline stages
    (parallel.nn.Pipeline calls it once per micro-batch). On the outermost cell that the accumulation
    calls, where lazy_inline's documentation allows it for gradient accumulation, and where MindFormers
    puts it (LlamaForCausalLM.__init__, its model + loss); its construct takes no default arguments."""

    @ms.lazy_inline
    def __init__(self, model: nn.Cell, vocab_size: int, eod_mask_id: int = -1, reduction: str = "mean",
                 z_loss: float = 0.0):
        super().__init__(model, vocab_size, eod_mask_id, reduction, z_loss)
