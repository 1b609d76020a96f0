"""Mixed precision: the dtypes a config may name, their checks, and how a model is cast to one (O1: the
Dense layers' matmuls; O2: held casts in every planned layer, see Llama.set_compute_dtype).
"""
from __future__ import annotations


from mindspore import nn
from mindspore.common import dtype as mstype

from mspretrain.train.config import ConfigError


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
    mp = cfg.parallel.model_parallel
    if p.amp_level == "O1" and p.dtype != "fp32" and mp > 1:
        # O1's to_float puts casts at each Dense's boundary, which the plan gives no strategy: the
        # compiler lays them out batch-parallel and redistributes around every sliced matmul
        raise ConfigError(f"precision.amp_level=O1 with parallel.model_parallel={mp}: O1's casts carry no "
                          f"parallel strategy; use precision.amp_level=O2 (the model's held casts, sharded "
                          f"by the plan) or parallel.model_parallel=1")
    s = p.loss_scale
    if p.dtype == "fp16" and not (s.init >= s.min > 0 and s.factor > 1 and s.window >= 1):
        raise ConfigError("precision.loss_scale needs init >= min > 0, factor > 1 and window >= 1, got "
                          f"init={s.init}, min={s.min}, factor={s.factor}, window={s.window}")


def apply_precision(model, cfg_precision):
    """Cast `model` for mixed precision; returns the cell to compute with (the master weights stay fp32).

    O1: the weight matmuls (every nn.Dense) in low precision; norms, rotary, softmax, residual stream
    and loss in fp32. (MindSpore's own O1 rewrites the source and cannot parse this model.)
    O2: everything in low precision except the RMSNorms' arithmetic, softmax and the logits (fp32): the
    model's own held casts (Llama.set_compute_dtype), each sharded by the plan, instead of
    auto_mixed_precision's cell-boundary casts, which carry no strategy (docs/parallel.md, "O2's casts").
    """
    if cfg_precision.dtype == "fp32":
        return model
    dtype = DTYPES[cfg_precision.dtype]
    if cfg_precision.amp_level == "O1":
        for _, cell in model.cells_and_names():
            if isinstance(cell, nn.Dense):
                cell.to_float(dtype)
        return model
    model.set_compute_dtype(dtype)
    return model
