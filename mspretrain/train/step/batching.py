"""How a step's batch is cut, from the config: the one place that says it.

A step takes train.global_batch_size samples; each of the parallel.data_parallel ranks takes its
`local_batch`; a rank runs it as `micro_batches` forwards of `micro_batch` samples: the pipeline's
parallel.micro_batch_num with pipeline stages (train.micro_batch_size must then be 0), else local batch /
train.micro_batch_size (gradient accumulation; 0: the whole local batch in one forward).
Fixed by the step graph, which is built for the full batch: a batch-size ramp keeps the count.
"""
from __future__ import annotations

from mspretrain.train.config import ConfigError


def local_batch(cfg, dp_size: int | None = None) -> int:
    """Samples per rank per step; `dp_size`: the data-parallel size (default parallel.data_parallel)."""
    return cfg.train.global_batch_size // (dp_size or cfg.parallel.data_parallel)


def forward_batch(cfg, dp_size: int | None = None) -> int:
    """Samples per rank per forward of the step (train.micro_batch_size, or the whole local batch),
    before pipeline stages cut it into their micro-batches."""
    return cfg.train.micro_batch_size or local_batch(cfg, dp_size)


def micro_batches(cfg, dp_size: int | None = None) -> int:
    """Micro-batches per rank per step: the pipeline's micro_batch_num, or local batch / micro-batch."""
    if cfg.parallel.pipeline_stage > 1:
        return cfg.parallel.micro_batch_num
    return max(1, local_batch(cfg, dp_size) // forward_batch(cfg, dp_size))


def micro_batch(cfg, dp_size: int | None = None) -> int:
    """Samples per rank in one micro-batch (what one forward of a layer holds)."""
    pipeline = cfg.parallel.micro_batch_num if cfg.parallel.pipeline_stage > 1 else 1
    return max(1, forward_batch(cfg, dp_size) // pipeline)


def check_batch(cfg, dp: int) -> None:
    """The batch keys against each other and the data-parallel size, each error naming them."""
    p, t = cfg.parallel, cfg.train
    g = t.global_batch_size
    if g < 1:
        raise ConfigError(f"train.global_batch_size must be >= 1, got {g}")
    if g % (dp * p.micro_batch_num):
        raise ConfigError(f"train.global_batch_size ({g}) must be divisible by parallel.data_parallel ({dp}) "
                          f"* parallel.micro_batch_num ({p.micro_batch_num})")
    if t.micro_batch_size and (g // dp) % t.micro_batch_size:
        raise ConfigError(f"train.global_batch_size ({g}) / parallel.data_parallel ({dp}) = {g // dp} samples "
                          f"per rank must be divisible by train.micro_batch_size ({t.micro_batch_size})")
    if p.pipeline_stage > 1 and t.micro_batch_size and t.micro_batch_size != g // dp:
        raise ConfigError(f"train.micro_batch_size ({t.micro_batch_size}) with parallel.pipeline_stage "
                          f"({p.pipeline_stage}): the pipeline's micro-batches (parallel.micro_batch_num) "
                          f"are the accumulation; set train.micro_batch_size=0")
