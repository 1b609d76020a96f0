"""Ascend's fused kernels for the hot-path layers, chosen by `model.fused_kernels` (docs/performance.md).

The model holds the math: each layer (layers.RMSNorm, llama Rotary, llama MLP) computes the same function
either from primitives (the default, every device) or with one MindSpore 2.10 kernel:
- rms_norm: `RmsNorm(eps)(x, gamma) -> (y, rstd)` (mindspore.ops.rms_norm), fp32 in as our norm computes;
- rope:     `RotaryPositionEmbedding()(x, cos, sin, mode=0)`: mode 0 is the rotate-half form our Rotary
            computes, on x [B, N, S, D] (BNSD) with full-width tables cat(cos, cos) [1|B, 1, S, D];
- swiglu:   `Swiglu()(x, dim)`: silu(first half) * second half; our gate w1 is the first half, up w3
            the second, stacked on a new axis [B, S, 2, F] so that F stays split by model parallel.
The three are documented "Supported Platforms: Ascend" and MindSpore 2.10 on CPU refuses each at
kernel selection ("Unsupported op [RmsNorm] on CPU"; checked in GRAPH_MODE), so they are refused
off Ascend. The weights are the same parameters either way: a checkpoint loads into both.
"""
from __future__ import annotations

from mspretrain.train.config import ConfigError

KERNELS = ("rms_norm", "rope", "swiglu")
# RotaryPositionEmbedding's documented BNSD limits (2.10): D < 896 and even, B and N < 1000, and not
# called when B * N > 8 * S with D 32-byte aligned ("performance is poor, this interface cannot be called")
ROPE_MAX_HEAD_DIM = 896
ROPE_MAX_BN = 1000


def check_fused_kernels(fused, device: str) -> tuple[str, ...]:
    """model.fused_kernels validated: known names, once each, on Ascend. Returns them as a tuple."""
    if not isinstance(fused, (list, tuple)):
        raise ConfigError(f"model.fused_kernels must be a list of {', '.join(KERNELS)}, got {fused!r}")
    for name in fused:
        if name not in KERNELS:
            raise ConfigError(f"model.fused_kernels: unknown kernel {name!r} (choose from {', '.join(KERNELS)})")
    if len(set(fused)) != len(fused):
        raise ConfigError(f"model.fused_kernels lists a kernel twice: {list(fused)}")
    if fused and device != "Ascend":
        raise ConfigError(f"model.fused_kernels={list(fused)} needs device Ascend: MindSpore 2.10's RmsNorm, "
                          f"RotaryPositionEmbedding and Swiglu have no {device} kernels; set "
                          f"model.fused_kernels=[] here (the composed layers compute the same function)")
    return tuple(fused)


def check_rope_shape(micro_batch: int, heads_per_rank: int, seq_length: int, head_dim: int) -> None:
    """The fused rotary kernel's documented BNSD limits on one rank's [B, N/mp, S, D]."""
    problems = []
    if head_dim >= ROPE_MAX_HEAD_DIM:
        problems.append(f"head dim {head_dim} >= {ROPE_MAX_HEAD_DIM}")
    if micro_batch >= ROPE_MAX_BN or heads_per_rank >= ROPE_MAX_BN:
        problems.append(f"micro-batch {micro_batch} or heads per rank {heads_per_rank} >= {ROPE_MAX_BN}")
    if seq_length and micro_batch * heads_per_rank > 8 * seq_length:
        problems.append(f"micro-batch x heads per rank = {micro_batch * heads_per_rank} > 8 x seq_length "
                        f"{seq_length}")
    if problems:
        raise ConfigError(f"model.fused_kernels rope: RotaryPositionEmbedding's BNSD layout does not take "
                          f"{'; '.join(problems)}; drop rope from model.fused_kernels")
