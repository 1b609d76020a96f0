"""How a step's batch is cut, from the config: the one place that says it.

A step takes train.global_batch_size samples; each of the parallel.data_parallel ranks takes its
`local_batch`; a rank runs it as `micro_batches` forwards of `micro_batch` samples: the pipeline's
parallel.micro_batch_num with pipeline stages (train.micro_batch_size must then be 0), else local batch /
train.micro_batch_size (gradient accumulation; 0: the whole local batch in one forward).
Fixed by the step graph, which is built for the full batch: a batch-size ramp keeps the count.
"""
from __future__ import annotations


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
