"""The training step, as two GRAPH_MODE cells and a small Python driver.

One optimizer step = K micro-steps then one apply:
- `MicroStep(input_ids)`: forward and backward of one micro-batch, the loss scaled by the current loss
  scale; the gradients are added into fp32 accumulators (nn.GradAccumulationCell splits one batch,
  it does not accumulate across calls, so the accumulator is ours).
- `ApplyStep(lr)`: reduce the accumulators across data-parallel ranks (`grad_reducer`, identity in a
  single process), unscale by K * loss_scale, check that every gradient is finite (amp.all_finite:
  NPUGetFloatStatusV2 is Ascend-only), measure the global norm, clip, and update with AdamW unless
  a gradient overflowed; then move the dynamic loss scale and zero the accumulators.

Overflow policy: a non-finite gradient skips the update (weights, moments and the optimizer's step
counter untouched). With fp16 the scale halves (not below `min`) and grows by `factor` after `window`
clean steps; with fp32/bf16 the scale stays 1. Whether a step is *bad* (non-finite loss) is the
trainer's call, not the step's.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mindspore import Parameter, Tensor, amp, nn, ops
from mindspore.common import dtype as mstype

from train.config import ConfigError
from train.model import set_norms_fp32

DTYPES = {"fp32": mstype.float32, "fp16": mstype.float16, "bf16": mstype.bfloat16}
AMP_LEVELS = ("O1", "O2")


def check_precision(cfg) -> None:
    """precision.* against the device, before anything is built."""
    p = cfg.precision
    if p.dtype not in DTYPES:
        raise ConfigError(f"precision.dtype must be one of {', '.join(DTYPES)}, got {p.dtype!r}")
    if p.amp_level not in AMP_LEVELS:
        raise ConfigError(f"precision.amp_level must be O1 or O2, got {p.amp_level!r}")
    if p.dtype == "bf16" and cfg.device != "Ascend":
        raise ConfigError(f"precision.dtype=bf16 needs device Ascend: MindSpore 2.10 has no bf16 kernels on "
                          f"{cfg.device} (e.g. Gather); use precision.dtype=fp16 or fp32 here")
    s = p.loss_scale
    if p.dtype == "fp16" and not (s.init >= s.min > 0 and s.factor > 1 and s.window >= 1):
        raise ConfigError("precision.loss_scale needs init >= min > 0, factor > 1 and window >= 1, got "
                          f"init={s.init}, min={s.min}, factor={s.factor}, window={s.window}")


def apply_precision(model, cfg_precision):
    """Cast `model` for mixed precision; returns the cell to compute with (the master weights stay fp32).

    O1: the weight matmuls (every nn.Dense) in low precision; norms, rotary, softmax, residual stream
    and loss in fp32. (MindSpore's own O1 rewrites the source and cannot parse this model.)
    O2: everything in low precision (auto_mixed_precision O2) except the RMSNorms; logits back to fp32.
    """
    if cfg_precision.dtype == "fp32":
        return model
    dtype = DTYPES[cfg_precision.dtype]
    if cfg_precision.amp_level == "O1":
        for _, cell in model.cells_and_names():
            if isinstance(cell, nn.Dense):
                cell.to_float(dtype)
        return model
    wrapped = amp.auto_mixed_precision(model, "O2", dtype=dtype)
    set_norms_fp32(model)
    return wrapped


def _divide(denom, g):
    return g / denom.astype(g.dtype)


def _multiply(coef, g):
    return g * coef.astype(g.dtype)


def _square_sum(g):
    return ops.reduce_sum(ops.square(g.astype(mstype.float32)))


def _zero(a):
    return ops.assign(a, ops.zeros_like(a))


class Identity(nn.Cell):
    def construct(self, grads):
        return grads


class MicroStep(nn.Cell):
    def __init__(self, loss_net: nn.Cell, weights, accumulators, loss_scale: Parameter,
                 pipeline_reducer: nn.Cell | None = None, micro_weight: Parameter | None = None):
        super().__init__(auto_prefix=False)
        self.micro_weight = micro_weight    # this micro-batch's share of the step's loss tokens, times K
        self.loss_net = loss_net
        self.weights = weights
        self.acc = accumulators
        self.loss_scale = loss_scale
        # pipeline stages: sums the pipeline's own micro-batch gradients (PipelineGradReducer)
        self.pipeline_reducer = Identity() if pipeline_reducer is None else pipeline_reducer
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.hyper_map = ops.HyperMap()

    def construct(self, input_ids):
        loss = self.loss_net(input_ids)
        sens = ops.ones_like(loss) * self.loss_scale.astype(loss.dtype)
        if self.micro_weight is not None:
            sens = sens * self.micro_weight.astype(loss.dtype)
        grads = self.grad(self.loss_net, self.weights)(input_ids, sens)
        grads = self.pipeline_reducer(grads)
        done = self.hyper_map(ops.assign_add, self.acc, grads)
        return ops.depend(loss, done)


class ApplyStep(nn.Cell):
    def __init__(self, optimizer: nn.Optimizer, accumulators, loss_scale: Parameter,
                 good_steps: Parameter, micro_steps: int, clip_norm: float, dynamic: bool,
                 factor: float, window: int, min_scale: float):
        super().__init__(auto_prefix=False)
        self.optimizer = optimizer
        self.acc = accumulators
        self.loss_scale = loss_scale
        self.good_steps = good_steps
        self.grad_reducer = Identity()     # parallel.py puts a data-parallel mean here
        self.micro_steps = float(micro_steps)
        self.clip_norm = float(clip_norm)
        self.dynamic = dynamic
        self.factor, self.window, self.min_scale = float(factor), int(window), float(min_scale)
        self.hyper_map = ops.HyperMap()

    def construct(self, lr):
        scale = self.loss_scale * 1.0                  # the value this step used
        grads = self.grad_reducer(self.acc)
        denom = scale * self.micro_steps
        grads = self.hyper_map(ops.partial(_divide, denom), grads)
        overflow = ops.logical_not(amp.all_finite(grads))
        norm = ops.sqrt(ops.addn(self.hyper_map(_square_sum, grads)))
        if self.clip_norm > 0:
            coef = ops.minimum(self.clip_norm / (norm + 1e-6), 1.0)
            grads = self.hyper_map(ops.partial(_multiply, coef), grads)
        lr = ops.depend(lr, grads)
        ops.assign(self.optimizer.learning_rate, lr)
        if not overflow:
            self.optimizer(grads)
        self.update_scale(overflow)
        zeroed = self.hyper_map(_zero, self.acc)
        return ops.depend(overflow, zeroed), norm, scale

    def update_scale(self, overflow):
        if self.dynamic:
            good = self.good_steps + 1
            grow = good >= self.window
            grown = ops.select(grow, self.loss_scale * self.factor, self.loss_scale)
            shrunk = ops.maximum(self.loss_scale / self.factor, self.min_scale)
            new_scale = ops.select(overflow, shrunk, grown)
            new_good = ops.select(ops.logical_or(overflow, grow), ops.zeros_like(good), good)
            ops.assign(self.loss_scale, new_scale)
            ops.assign(self.good_steps, new_good)


@dataclass
class StepResult:
    loss: float              # mean of the micro-batch losses, fp32, exact
    overflow: bool
    grad_norm: float
    loss_scale: float


class TrainStep:
    """The train cell handed to parallel.parallelize: `micro` and `apply` are the two graphs."""

    def __init__(self, loss_net: nn.Cell, optimizer: nn.Optimizer, micro_steps: int,
                 clip_norm: float, dynamic_scale: bool, scale_cfg, pipeline_reducer: nn.Cell | None = None,
                 token_counter=None):
        self.loss_net, self.optimizer, self.micro_steps = loss_net, optimizer, micro_steps
        # token_counter(micro_batch) -> its loss tokens, when they vary (EOD-masked loss): each micro-step
        # is weighted by its share so that K micro-steps equal one batch (the mean over all its tokens)
        self.token_counter = token_counter if micro_steps > 1 else None
        self.micro_weight = None
        if self.token_counter is not None:
            self.micro_weight = Parameter(Tensor(1.0, mstype.float32), name="micro_weight",
                                          requires_grad=False)
        weights = optimizer.parameters
        self.accumulators = weights.clone(prefix="acc", init="zeros")
        init_scale = scale_cfg.init if dynamic_scale else 1.0
        self.loss_scale = Parameter(Tensor(init_scale, mstype.float32), name="loss_scale",
                                    requires_grad=False)
        self.good_steps = Parameter(Tensor(0, mstype.int32), name="loss_scale_good_steps",
                                    requires_grad=False)
        self.micro = MicroStep(loss_net, weights, self.accumulators, self.loss_scale, pipeline_reducer,
                               self.micro_weight)
        self.apply = ApplyStep(optimizer, self.accumulators, self.loss_scale, self.good_steps,
                               micro_steps, clip_norm, dynamic_scale, scale_cfg.factor,
                               scale_cfg.window, scale_cfg.min)
        for cell in (self.micro, self.apply):
            cell.set_train(True)

    def __call__(self, input_ids: np.ndarray, lr: float) -> StepResult:
        chunks = np.split(input_ids, self.micro_steps)
        weights = self.micro_weights(chunks)
        losses = []
        for chunk, w in zip(chunks, weights):
            if self.micro_weight is not None:
                self.micro_weight.set_data(Tensor(w, mstype.float32))
            losses.append(self.micro(Tensor(chunk)))
        overflow, norm, scale = self.apply(Tensor(lr, mstype.float32))
        loss = np.float32(0.0)
        for value, w in zip(losses, weights):   # fixed order: the mean is bitwise reproducible
            loss = np.float32(loss + w * value.asnumpy())
        loss = np.float32(loss / np.float32(self.micro_steps))
        return StepResult(float(loss), bool(overflow.asnumpy()), float(norm.asnumpy()),
                          float(scale.asnumpy()))

    def micro_weights(self, chunks) -> list[np.float32]:
        """K * n_k / N for micro-batch k of n_k loss tokens out of N; all 1.0 without a counter."""
        if self.token_counter is None:
            return [np.float32(1.0)] * len(chunks)
        counts = [self.token_counter(c) for c in chunks]
        total = sum(counts)
        if total == 0:
            return [np.float32(1.0)] * len(chunks)
        return [np.float32(self.micro_steps * n / total) for n in counts]

    def state_parameters(self) -> dict[str, Parameter]:
        """Everything a checkpoint must hold: weights, AdamW moments and step, loss-scale state.
        The accumulators are zero between steps, so they are not saved."""
        params = {}
        for p in self.apply.get_parameters():
            if not p.name.startswith("acc."):
                params[p.name] = p
        return params
