"""AdamW with parameter groups, and the learning-rate schedule as a pure function of the step."""
from __future__ import annotations

import math

from mindspore import nn


def no_decay(name: str, ndim: int) -> bool:
    """Norm weights and biases (every 1-D parameter) are not decayed."""
    return ndim < 2 or "norm" in name or name.endswith(".bias")


def build_optimizer(params, cfg_optim) -> nn.AdamWeightDecay:
    """nn.AdamWeightDecay over `params` (in model order), weight decay only on matrices."""
    params = list(params)
    decay = [p for p in params if not no_decay(p.name, len(p.shape))]
    keep = [p for p in params if no_decay(p.name, len(p.shape))]
    groups = [{"params": decay, "weight_decay": cfg_optim.weight_decay}]
    if keep:
        groups.append({"params": keep, "weight_decay": 0.0})
    groups.append({"order_params": params})
    return nn.AdamWeightDecay(groups, learning_rate=cfg_optim.lr, beta1=cfg_optim.beta1,
                              beta2=cfg_optim.beta2, eps=cfg_optim.eps)


def lr_at(step: int, cfg_optim, total_steps: int) -> float:
    """Learning rate of optimizer step `step` (1-based): linear warmup to lr over warmup_steps, then a
    cosine to min_lr at total_steps (held after). A pure function, so a resumed run continues exactly."""
    lr, min_lr, warmup = cfg_optim.lr, cfg_optim.min_lr, cfg_optim.warmup_steps
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
