"""The optimizer (AdamW with parameter groups) and the learning-rate schedules, pure functions of the step.

Optimizers (`optim.name`, docs/recipes.md):
- `adamw` (default): AdamW with bias correction, PyTorch's semantics (torch.optim.AdamW), the update
  MindFormers' AdamW and OLMo-core train with:
      p <- p * (1 - lr * wd)
      m <- b1 m + (1 - b1) g ;  v <- b2 v + (1 - b2) g^2
      p <- p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
- `adamw_nobc`: MindSpore's nn.AdamWeightDecay (no bias correction: early steps are ~3x smaller with
  b2 = 0.95), kept for runs started with it.
Both keep their moments as `adam_m.*` / `adam_v.*` and the count of applied updates t as `global_step`:
the train step's parameters, so every checkpoint holds them. Both are called inside the one-graph train
step (step.py), only when no gradient overflowed, so a skipped step leaves t unchanged.

Schedules (`optim.schedule`), each a linear warmup to `lr` over `warmup_steps`, then:
- `cosine`: a cosine to `min_lr` at train.steps;
- `linear`: a straight line to `min_lr` at train.steps;
- `constant`: `lr` to the end;
- `wsd` (warmup-stable-decay): `lr` until the decay start, then a decay (`optim.decay`: linear |
  cosine | sqrt, the last 1 - sqrt(progress)) to `min_lr` at train.steps. The decay starts at
  `optim.decay_start_step` if set (> 0), else after the first (1 - decay_fraction) of train.steps. A
  stable-phase checkpoint can be decayed later: `train launch --resume CKPT --set
  optim.decay_start_step=N --set train.steps=M` trains steps N+1..M exactly as a run configured so from
  the start would (the steps up to N had the stable lr in both).
"""
from __future__ import annotations

import math

from mindspore import nn, ops
from mindspore.common import dtype as mstype

from mspretrain.train.config import ConfigError

OPTIMIZERS = ("adamw", "adamw_nobc")
SCHEDULES = ("cosine", "wsd", "linear", "constant")
DECAYS = ("linear", "cosine", "sqrt")


def no_decay(name: str, ndim: int) -> bool:
    """Norm weights and biases (every 1-D parameter) are not decayed."""
    return ndim < 2 or "norm" in name or name.endswith(".bias")


def _fused_adamw(kernel, beta1, beta2, eps, lr, decay_scale, weight_decay, param, m, v, grad):
    """One parameter's update by MindSpore's AdamWeightDecay kernel (in place: param, m, v), with the
    bias corrections folded into its scalars (AdamW's docstring)."""
    kernel(param, m, v, lr, beta1, beta2, eps, weight_decay * decay_scale, grad.astype(param.dtype))
    return True


class AdamW(nn.AdamWeightDecay):
    """Bias-corrected AdamW (PyTorch semantics) over nn.AdamWeightDecay's state: the same parameter
    groups, moments (adam_m.*, adam_v.*), step counter (global_step) and learning-rate Parameter, so
    optimizer sharding and checkpoints see the same layout as with `adamw_nobc`.

    It runs MindSpore's fused AdamWeightDecay kernel, which updates param, m and v in place in one
    pass and computes  p <- p - lr' * (m / (sqrt(v) + eps') + wd' * p)  on the raw moments. With
        lr' = (lr / (1 - b1^t)) * sqrt(1 - b2^t),  eps' = eps * sqrt(1 - b2^t),
        wd' = wd * (1 - b1^t) / sqrt(1 - b2^t)      (so lr' * wd' = lr * wd)
    that is the update of the module docstring, term for term: lr' * m / (sqrt(v) + eps') =
    (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps). Written out element-wise instead, each
    of its ~10 operations is a parameter-sized temporary the CPU runtime holds for the whole step
    graph (+1.08 GB and a slower step on the 33.9M bench model, bench_train.py --memory-phases). The
    results differ from the element-wise form by fp32 rounding only (the kernel's fused multiply-adds,
    the folded scalars: a few ulp of the update; test_optim's numpy reference bounds both)."""

    def construct(self, gradients):
        weight_decay = self.get_weight_decay()
        lr = self.get_lr()
        self.assignadd(self.global_step, self.global_step_increase_tensor)
        t = ops.depend(self.global_step, lr).astype(mstype.float32)     # updates applied, this one included
        bc1 = 1.0 - ops.pow(self.beta1.reshape(()), t)
        bc2_sqrt = ops.sqrt(1.0 - ops.pow(self.beta2.reshape(()), t))
        lr_t = lr / bc1 * bc2_sqrt
        eps_t = self.eps * bc2_sqrt
        update = ops.partial(_fused_adamw, self.fused_opt, self.beta1, self.beta2, eps_t, lr_t, bc1 / bc2_sqrt)
        if self.is_group:
            result = self.hyper_map(update, weight_decay, self._parameters, self.moments1, self.moments2,
                                    gradients)
        else:
            result = self.hyper_map(ops.partial(update, weight_decay), self._parameters, self.moments1,
                                    self.moments2, gradients)
        if self.use_parallel:
            self.broadcast_params(result)
        return result


def build_optimizer(params, cfg_optim) -> nn.AdamWeightDecay:
    """The optimizer `optim.name` over `params` (in model order), weight decay only on matrices."""
    if cfg_optim.name not in OPTIMIZERS:
        raise ConfigError(f"optim.name must be one of {', '.join(OPTIMIZERS)}, got {cfg_optim.name!r}")
    params = list(params)
    decay = [p for p in params if not no_decay(p.name, len(p.shape))]
    keep = [p for p in params if no_decay(p.name, len(p.shape))]
    groups = [{"params": decay, "weight_decay": cfg_optim.weight_decay}]
    if keep:
        groups.append({"params": keep, "weight_decay": 0.0})
    groups.append({"order_params": params})
    cls = AdamW if cfg_optim.name == "adamw" else nn.AdamWeightDecay
    return cls(groups, learning_rate=cfg_optim.lr, beta1=cfg_optim.beta1, beta2=cfg_optim.beta2,
               eps=cfg_optim.eps)


# ---------------------------------------------------------------- learning-rate schedules

def decay_start(cfg_optim, total_steps: int) -> int:
    """The last step at the stable lr of a WSD schedule (the decay runs over the steps after it)."""
    if cfg_optim.decay_start_step > 0:
        return cfg_optim.decay_start_step
    decay_steps = round(cfg_optim.decay_fraction * total_steps)
    return max(cfg_optim.warmup_steps, total_steps - decay_steps)


def _decayed(lr: float, min_lr: float, progress: float, shape: str) -> float:
    """From lr (progress 0) to min_lr (progress 1) along `shape`."""
    progress = min(1.0, max(0.0, progress))
    if shape == "cosine":
        return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
    if shape == "sqrt":
        return lr - (lr - min_lr) * math.sqrt(progress)
    return lr - (lr - min_lr) * progress


def lr_at(step: int, cfg_optim, total_steps: int) -> float:
    """Learning rate of optimizer step `step` (1-based), `optim.schedule` over `total_steps`: a pure
    function of the step, so a resumed run continues exactly (module docstring)."""
    lr, min_lr, warmup = cfg_optim.lr, cfg_optim.min_lr, cfg_optim.warmup_steps
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    schedule = cfg_optim.schedule
    if schedule == "constant":
        return lr
    if schedule == "wsd":
        start = decay_start(cfg_optim, total_steps)
        if step <= start:
            return lr
        return _decayed(lr, min_lr, (step - start) / max(1, total_steps - start), cfg_optim.decay)
    progress = (step - warmup) / max(1, total_steps - warmup)
    return _decayed(lr, min_lr, progress, "linear" if schedule == "linear" else "cosine")


def check_schedule(cfg_optim, total_steps: int) -> None:
    """optim.schedule / decay / decay_fraction / decay_start_step, with errors naming the key."""
    o = cfg_optim
    if o.schedule not in SCHEDULES:
        raise ConfigError(f"optim.schedule must be one of {', '.join(SCHEDULES)}, got {o.schedule!r}")
    if o.decay not in DECAYS:
        raise ConfigError(f"optim.decay must be one of {', '.join(DECAYS)}, got {o.decay!r}")
    if not 0 <= o.decay_fraction <= 1:
        raise ConfigError(f"optim.decay_fraction must be in [0, 1], got {o.decay_fraction!r}")
    if o.decay_start_step < 0:
        raise ConfigError(f"optim.decay_start_step must be >= 0 (0: from optim.decay_fraction), "
                          f"got {o.decay_start_step!r}")
    if o.decay_start_step > 0:
        if o.schedule != "wsd":
            raise ConfigError(f"optim.decay_start_step={o.decay_start_step} needs optim.schedule=wsd "
                              f"(got {o.schedule!r})")
        if not o.warmup_steps <= o.decay_start_step < total_steps:
            raise ConfigError(f"optim.decay_start_step must be in [optim.warmup_steps, train.steps) = "
                              f"[{o.warmup_steps}, {total_steps}), got {o.decay_start_step}")


def schedule_points(cfg_optim, total_steps: int) -> tuple[list[int], list[float]]:
    """(steps 1..total_steps, their lr): the schedule `train plot --config` draws."""
    steps = list(range(1, total_steps + 1))
    return steps, [lr_at(s, cfg_optim, total_steps) for s in steps]
