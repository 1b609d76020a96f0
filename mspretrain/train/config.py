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
from typing import Annotated

import pydantic

from mspretrain.common.config import ConfigError, load  # noqa: F401 (ConfigError re-exported)


@dataclass
class DataConfig:
    path: str = ""                  # a dataset dir written by `dataprep build`
    blend: dict = field(default_factory=dict)    # {dataset dir: weight}: blended training data (not with path)
    mixture: list = field(default_factory=list)  # [{until_tokens: N, blend: {dir: w}}, ..., {blend: {...}}]:
                                                 # blend weights by phase of consumed tokens (docs/recipes.md)
    split: str = "train"
    valid_split: str = "valid"
    num_workers: int = 1            # loader worker processes
    prefetch: int = 2               # batches in flight per loader


@dataclass
class RunConfig:
    dir: str = "runs/default"
    # MindSpore's deterministic kernels and HCCL_DETERMINISTIC (reductions in a fixed order): the
    # same run gives the same bits on Ascend (bitwise resume); costs speed there (docs/parallel.md)
    deterministic: bool = True
    mode: str = "graph"             # graph | pynative (step-through debugging on a small config)


@dataclass
class ModelConfig:
    family: str = "llama"           # the model family (mspretrain/train/models/: llama)
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
    fused_kernels: list = field(default_factory=list)  # Ascend kernels replacing composed layers: rms_norm,
                                    # rope, swiglu (mspretrain/train/models/fused.py, docs/performance.md)


@dataclass
class RampupConfig:
    """Batch-size ramp-up, Megatron's --rampup-batch-size: from `start` samples per step, up by
    `increment` after every samples / ((global_batch_size - start) / increment) consumed samples, to
    train.global_batch_size once `samples` were consumed. start 0: no ramp."""
    start: int = 0
    increment: int = 0
    samples: int = 0


@dataclass
class SpikeConfig:
    """Loss / grad-norm spike defence (mspretrain/train/observe/spike.py, docs/long-runs.md)."""
    action: str = "skip"            # none | skip | rollback
    window: int = 100               # applied steps of history
    sigma: float = 6.0              # a step above mean + sigma * std of the window is a spike
    warmup: int = 100               # steps before the defence acts
    max_consecutive: int = 5        # rollback: this many skipped steps in a row go back to a checkpoint


@dataclass
class TrainConfig:
    steps: int = 100
    global_batch_size: int = 8      # samples per optimizer step, all ranks together
    micro_batch_size: int = 0       # samples per rank per forward; 0: the whole local batch
    accumulate: str = "auto"        # micro-batches in the step graph: loop | split | auto (mspretrain/train/step/cell.py)
    max_bad_steps: int = 3          # consecutive non-finite losses before the run stops
    peak_tflops: float = 0.0        # one device's peak for MFU; 0: measure fp32 matmul here
    eod_mask_loss: bool = True      # no loss where the input token is EOS (its label is another document's)
    rampup: RampupConfig = field(default_factory=RampupConfig)
    z_loss: float = 0.0             # + z_loss * mean(logsumexp(logits)^2) over the loss tokens; 0: off (docs/long-runs.md)
    spike: SpikeConfig = field(default_factory=SpikeConfig)


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
    name: str = "adamw"             # adamw (bias-corrected, PyTorch) | adamw_nobc (MindSpore AdamWeightDecay)
    schedule: str = "cosine"        # cosine | wsd | linear | constant (mspretrain/train/step/optim.py)
    decay: str = "linear"           # wsd's decay shape: linear | cosine | sqrt
    decay_fraction: float = 0.2     # wsd: the last fraction of train.steps decays
    decay_start_step: int = 0       # wsd: > 0 decays after this step instead (continued training)
    lr_scaling: str = "none"        # during train.rampup: lr x (batch / global_batch_size): none | sqrt | linear


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
    graph_kernel: bool = False      # MindSpore graph-kernel fusion (GPU / Ascend; docs/long-runs.md)


@dataclass
class RecomputeConfig:
    mode: str = "none"              # none | full | select
    full_layers: str = ""           # layer ranges, e.g. "0-3,8"; empty with mode=full: every layer
    select: dict = field(default_factory=dict)   # module -> layer ranges, e.g. {mlp: "0-7"}
    mp_comm: bool = True            # model-parallel communication inside recomputed cells is recomputed too
                                    # (Cell.recompute(mp_comm_recompute=...)); false keeps its outputs
    optimizer_comm: bool = False    # MindFormers' parallel_optimizer_comm_recompute: 2.10 replaced it by
                                    # parallel.optimizer_level=level3 (refused; docs/parallel.md)
    exclude: list = field(default_factory=list)  # ops kept, not recomputed, inside recomputed cells, by their
                                    # path in a layer, e.g. [mlp.w1.matmul] (Primitive.recompute(False))


@dataclass
class CheckpointConfig:
    every_steps: int = 50
    keep_max: int = 3
    # copy the state to host memory at the step and write it on a background thread while training
    # goes on; one write at a time, `latest` moves when it is complete (field async_: a Python keyword)
    async_: Annotated[bool, pydantic.Field(validation_alias=pydantic.AliasChoices("async", "async_"))] = False
    # the model file: ckpt (model.ckpt, ms.save_checkpoint's protobuf) or safetensors (model.safetensors,
    # as ms.save_checkpoint(format="safetensors") and MindFormers 2.x write it)
    format: str = "ckpt"


@dataclass
class EvalConfig:
    every_steps: int = 0            # 0: no periodic validation
    batches: int = 4
    blend: dict[str, float] = field(default_factory=dict)   # {dataset dir: weight}: evaluate a blend
    prompts: str = ""               # jsonl of {"text"} / {"tokens"}: generation-quality metrics
    gen_tokens: int = 32            # new tokens per prompt (greedy) for those metrics
    suite_in_loop: bool = False     # the periodic eval also runs the suite (per source, bits/byte, ...)
    suite_every_steps: int = 0      # with suite_in_loop: the generation metrics (eval.prompts) only every
                                    # this many steps (a multiple of every_steps); 0: at every eval
    batch_size: int = 0             # rows per validation forward (val_loss, the suite, `train eval
                                    # --tasks`); 0: twice the training's micro-batch x data_parallel (no
                                    # gradients, so more fit), or once when the valid split is smaller


@dataclass
class LogConfig:
    every_steps: int = 1
    detail_every_steps: int = 50    # update_ratio (RMS update / RMS weights) every N steps; 0: never


@dataclass
class ProfileConfig:
    """A mindspore.profiler window over steps start_step..stop_step (mspretrain/train/observe/profile.py)."""
    start_step: int = 0             # 0: no profiling
    stop_step: int = 0
    dir: str = ""                   # "": RUN/profile


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
    comm_fusion: int = 0            # all-reduce fusion buckets in MB; 0: MindSpore's default
    comm_fusion_allgather: int = 0  # optimizer sharding's weight all-gathers fused in MB buckets; 0: default
    comm_fusion_reducescatter: int = 0  # optimizer sharding's gradient reduce-scatters in MB buckets; 0: default
    overlap: list = field(default_factory=list)  # communication overlapped with computation (Ascend,
                                    # parallel_speed_up_json): grad_allreduce, allgather, matmul_grad,
                                    # recompute (mspretrain/train/switches.py, docs/parallel.md)
    devices_per_node: int = 8       # devices of one server (Atlas 800T A2: 8 NPUs); model_parallel must fit
                                    # in one, a multi-node job uses whole nodes (train/parallel/topology.py)


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
    profile: ProfileConfig = field(default_factory=ProfileConfig)

    def to_dict(self) -> dict:
        """The config as the keys a user writes (checkpoint.async, not the field's name async_)."""
        d = dataclasses.asdict(self)
        d["checkpoint"]["async"] = d["checkpoint"].pop("async_")
        if d["checkpoint"]["format"] == "ckpt":     # the default, as every run had it before the key:
            d["checkpoint"].pop("format")           # left out, so such a run's records stay the bytes they were
        # Llama is every run's family from before the key existed: left out, so that a Llama run's
        # config hash, checkpoint and run.json are the bytes they were, and older checkpoints resume
        if d["model"]["family"] == "llama":
            d["model"].pop("family")
        # the switches added later, left out at their defaults for the same reason (today's bytes)
        for section, key in SWITCH_KEYS:
            if d[section][key] == getattr(type(getattr(self, section))(), key):
                d[section].pop(key)
        return d

    def hash(self) -> str:
        """Hash of what determines the loss curve; run.dir and logging cadence do not."""
        d = self.to_dict()
        d.pop("run")
        d.pop("log")
        d.pop("checkpoint")     # when state is saved, not what it is
        d.pop("eval")           # validation reads, never trains
        d.pop("profile")        # observing, not training
        d["data"].pop("path")           # where, not what: the dataset fingerprint is checked apart
        d["data"]["blend"] = sorted(d["data"]["blend"].values())   # the weights, not where the data is
        d["data"]["mixture"] = [[m.get("until_tokens") if isinstance(m, dict) else None,
                                 sorted((m.get("blend") or {}).values()) if isinstance(m, dict) else None]
                                for m in d["data"]["mixture"]]
        d["data"].pop("num_workers")    # the loader's stream does not depend on these (docs/contracts.md)
        d["data"].pop("prefetch")
        d["train"].pop("peak_tflops")
        d["parallel"].pop("devices_per_node")   # the cluster's shape, not the training's
        d["parallel"].pop("data_parallel")  # elastic resume: same stream (docs/contracts.md), only the reduction order differs
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


# keys left out of to_dict (so of the config hash) while they hold their defaults
SWITCH_KEYS = (("model", "fused_kernels"), ("recompute", "mp_comm"), ("recompute", "optimizer_comm"),
               ("recompute", "exclude"), ("parallel", "comm_fusion_allgather"),
               ("parallel", "comm_fusion_reducescatter"), ("parallel", "overlap"))


# ---------------------------------------------------------------- loading

DEVICES = ("CPU", "Ascend", "GPU")
CHECKPOINT_FORMATS = ("ckpt", "safetensors")      # the keys of train.checkpoint.layout.MODEL_FILES


def load_config(path: str | Path | None = None, overrides: list[str] | tuple = ()) -> Config:
    """YAML file (optional) plus `a.b=value` overrides (values read as YAML) -> a typed Config,
    with the device and the model's shape checked (errors name the key)."""
    cfg = load(Config, path, overrides)
    check_config(cfg)
    return cfg


def check_config(cfg: Config) -> None:
    """What every command needs before it builds anything: a device MindSpore knows and a model
    whose heads divide its width."""
    if cfg.device not in DEVICES:
        near = [d for d in DEVICES if d.lower() == str(cfg.device).lower()]
        raise ConfigError(f"device: {cfg.device!r} is not one of {', '.join(DEVICES)}"
                          + (f" (did you mean {near[0]!r}?)" if near else ""))
    check_checkpoint_format(cfg)
    m = cfg.model
    rules = [("model.hidden_size", m.hidden_size >= 1, ">= 1"),
             ("model.num_layers", m.num_layers >= 1, ">= 1"),
             ("model.num_heads", m.num_heads >= 1, ">= 1"),
             ("model.num_heads", m.num_heads < 1 or m.hidden_size % m.num_heads == 0,
              f"a divisor of model.hidden_size ({m.hidden_size})"),
             ("model.num_kv_heads", m.num_kv_heads >= 0, ">= 0 (0: same as model.num_heads)"),
             ("model.num_kv_heads", m.num_kv_heads <= 0 or m.num_heads % m.num_kv_heads == 0,
              f"a divisor of model.num_heads ({m.num_heads}), or 0"),
             ("model.vocab_size", m.vocab_size >= 0, ">= 0 (0: the dataset's)"),
             ("model.ffn_size", m.ffn_size >= 0, ">= 0 (0: the Llama rule)"),
             ("model.max_documents", m.max_documents >= 1, ">= 1")]
    for key, ok, want in rules:
        if not ok:
            raise ConfigError(f"{key} must be {want}, got {getattr(m, key.split('.')[1])!r}")


def check_checkpoint_format(cfg: Config) -> None:
    """checkpoint.format is one MindSpore reads (ckpt or safetensors, on every layout: a sharded run
    writes rank_R/model.safetensors, resharded and merged through .ckpt, train/checkpoint/reshard.py)."""
    fmt = cfg.checkpoint.format
    if fmt not in CHECKPOINT_FORMATS:
        raise ConfigError(f"checkpoint.format must be one of {', '.join(CHECKPOINT_FORMATS)}, got {fmt!r}")


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
