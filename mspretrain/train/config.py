"""One typed config tree for the trainer: dataclasses, loaded by the shared config layer
(`mspretrain.config`) from YAML with `--set a.b=v` overrides, validated once at start-up with errors that
name the key.

The key names are the public interface (README, configs/, tests). Add fields; do not rename them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from mspretrain.common.config import ConfigError, load  # noqa: F401 (ConfigError re-exported)


@dataclass
class DataConfig:
    path: str = ""                  # a dataset dir written by `dataprep build`
    split: str = "train"
    valid_split: str = "valid"
    num_workers: int = 1            # loader worker processes
    prefetch: int = 2               # batches in flight per loader


@dataclass
class RunConfig:
    dir: str = "runs/default"


@dataclass
class ModelConfig:
    vocab_size: int = 0             # 0: take it from the dataset's tokenizer
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 0           # 0: same as num_heads (no grouped KV)
    ffn_size: int = 0               # 0: the Llama rule, about 8/3 * hidden_size rounded up to 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    tie_embeddings: bool = False
    flash_attention: bool = True    # MindSpore's fused kernel where the device has it (Ascend)
    # packed samples: documents end with the tokenizer's EOS (mspretrain/train/packing.py)
    document_mask: bool = True      # a token attends only to earlier tokens of its own document
    reset_position_ids: bool = True  # rotary positions restart at 0 after every EOS
    max_documents: int = 128        # documents per sample the Ascend fused kernel separates; later ones
                                    # share the last block (counted as docs_over_limit in metrics)


@dataclass
class TrainConfig:
    steps: int = 100
    global_batch_size: int = 8      # samples per optimizer step, all ranks together
    micro_batch_size: int = 0       # samples per rank per forward; 0: the whole local batch
    accumulate: str = "auto"        # micro-batches in the step graph: loop | split | auto (mspretrain/train/step.py)
    max_bad_steps: int = 3          # consecutive non-finite losses before the run stops
    peak_tflops: float = 0.0        # one device's peak for MFU; 0: measure fp32 matmul here
    eod_mask_loss: bool = True      # no loss where the input token is EOS (its label is another document's)


@dataclass
class OptimConfig:
    lr: float = 3e-4
    warmup_steps: int = 10
    min_lr: float = 3e-5
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    clip_norm: float = 1.0          # 0 disables clipping


@dataclass
class LossScaleConfig:
    init: float = 2.0 ** 16
    factor: float = 2.0
    window: int = 1000              # clean steps before the scale grows again
    min: float = 1.0


@dataclass
class PrecisionConfig:
    dtype: str = "fp32"             # fp32 | fp16 | bf16
    amp_level: str = "O2"           # O1 | O2
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)


@dataclass
class RecomputeConfig:
    mode: str = "none"              # none | full | select
    full_layers: str = ""           # layer ranges, e.g. "0-3,8"; empty with mode=full: every layer
    select: dict = field(default_factory=dict)   # module -> layer ranges, e.g. {mlp: "0-7"}


@dataclass
class CheckpointConfig:
    every_steps: int = 50
    keep_max: int = 3


@dataclass
class EvalConfig:
    every_steps: int = 0            # 0: no periodic validation
    batches: int = 4
    blend: dict = field(default_factory=dict)   # {dataset dir: weight}: evaluate a blend, per source
    prompts: str = ""               # jsonl of {"text"} / {"tokens"}: generation-quality metrics
    gen_tokens: int = 32            # new tokens per prompt (greedy) for those metrics
    suite_in_loop: bool = False     # the periodic eval also runs the suite (per source, bits/byte, ...)
    suite_every_steps: int = 0      # with suite_in_loop: the generation metrics (eval.prompts) only every
                                    # this many steps (a multiple of every_steps); 0: at every eval
    batch_size: int = 0             # rows per forward of `train eval --tasks`; 0: twice the training
                                    # micro-batch (no gradients, so more fit)


@dataclass
class LogConfig:
    every_steps: int = 1


@dataclass
class ParallelConfig:
    data_parallel: int = 1
    model_parallel: int = 1
    pipeline_stage: int = 1
    micro_batch_num: int = 1        # pipeline micro-batches per step
    optimizer_shard: bool = False
    vocab_emb_dp: bool = True       # embedding split by data rather than by vocab
    sequence_parallel: bool = False
    stage_offsets: list = field(default_factory=list)   # extra layers per stage (sum 0)
    optimizer_level: str = "level1"  # with optimizer_shard: AutoParallel.hsdp level1 (weights + states),
                                     # level2 (+ gradients), level3 (+ re-gather before backward)


@dataclass
class Config:
    seed: int = 1234
    device: str = "CPU"             # CPU | Ascend | GPU
    data: DataConfig = field(default_factory=DataConfig)
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    log: LogConfig = field(default_factory=LogConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def hash(self) -> str:
        """Hash of what determines the loss curve; run.dir and logging cadence do not."""
        d = self.to_dict()
        d.pop("run")
        d.pop("log")
        d.pop("checkpoint")     # when state is saved, not what it is
        d.pop("eval")           # validation reads, never trains
        d["data"].pop("path")           # where, not what: the dataset fingerprint is checked apart
        d["data"].pop("num_workers")    # the loader's stream does not depend on these (docs/contracts.md)
        d["data"].pop("prefetch")
        d["train"].pop("peak_tflops")
        d["parallel"].pop("data_parallel")  # elastic resume: same stream (docs/contracts.md), only the reduction order differs
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- loading

def load_config(path: str | Path | None = None, overrides: list[str] | tuple = ()) -> Config:
    """YAML file (optional) plus `a.b=value` overrides (values read as YAML) -> a typed Config."""
    return load(Config, path, overrides)


def parse_layer_ranges(spec: str, num_layers: int, key: str) -> list[int]:
    """"0-3,8" -> [0, 1, 2, 3, 8]; out-of-range, reversed or repeated layers are config errors."""
    layers: list[int] = []
    for part in str(spec).replace(" ", "").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise ConfigError(f"{key}: {part!r} is not a layer or a range like 0-3") from None
        if a > b:
            raise ConfigError(f"{key}: range {part!r} is reversed")
        if a < 0 or b >= num_layers:
            raise ConfigError(f"{key}: {part!r} is outside layers 0-{num_layers - 1}")
        for layer in range(a, b + 1):
            if layer in layers:
                raise ConfigError(f"{key}: layer {layer} is listed twice")
            layers.append(layer)
    return sorted(layers)
