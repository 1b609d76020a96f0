"""One typed config tree for the trainer: dataclasses, loaded from YAML, `--set a.b=v` overrides,
validated once at start-up with errors that name the key.

The key names are the public interface (README, configs/, tests). Add fields; do not rename them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key."""


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


@dataclass
class TrainConfig:
    steps: int = 100
    global_batch_size: int = 8      # samples per optimizer step, all ranks together
    micro_batch_size: int = 0       # samples per rank per forward; 0: the whole local batch
    accumulate: str = "auto"        # micro-batches in the step graph: loop | split | auto (train/step.py)
    max_bad_steps: int = 3          # consecutive non-finite losses before the run stops
    peak_tflops: float = 0.0        # one device's peak for MFU; 0: measure fp32 matmul here


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
        d["data"].pop("num_workers")    # the loader's stream does not depend on these (contract 2)
        d["data"].pop("prefetch")
        d["train"].pop("peak_tflops")
        d["parallel"].pop("data_parallel")  # elastic resume: same stream (contract 2), only the reduction order differs
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- loading

def load_config(path: str | Path | None = None, overrides: list[str] | tuple = ()) -> Config:
    """YAML file (optional) plus `a.b=value` overrides (values parsed as YAML) -> a typed Config."""
    raw: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} not found")
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. train.steps=100")
        node = raw
        parts = key.strip().split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {item!r}: {p} is not a section")
        node[parts[-1]] = yaml.safe_load(value)
    return build(Config, raw, "")


def build(cls, raw, where: str):
    """Build dataclass `cls` from a mapping, checking every key and type; errors name the key."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise ConfigError(f"unknown key {_join(where, unknown[0])} (known: {', '.join(sorted(names))})")
    kwargs = {}
    for name, value in raw.items():
        kwargs[name] = _coerce(hints[name], value, _join(where, name))
    return cls(**kwargs)


def _coerce(tp, value, key: str):
    if dataclasses.is_dataclass(tp):
        return build(tp, value if value is not None else {}, key)
    origin = typing.get_origin(tp)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        number = _number(value)
        if isinstance(number, int):
            return number
        if isinstance(number, float) and number.is_integer() and abs(number) <= 2 ** 53:
            return int(number)          # 1e3 or 1000.0: exact
    elif tp is float:
        number = _number(value)
        if number is not None:
            return float(number)
    elif tp is str:
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return str(value)
    elif tp is dict or origin is dict:
        if isinstance(value, dict):
            return dict(value)
    elif tp is list or origin is list:
        if isinstance(value, (list, tuple)):
            return list(value)
    elif origin in (typing.Union, types.UnionType):
        return value
    else:
        return value
    raise ConfigError(f"{key}: expected {getattr(tp, '__name__', tp)}, got {value!r}")


def _number(value):
    """An int or float, from a number or a numeric string (YAML 1.1 reads `1e30` as a string), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        for parse in (int, float):
            try:
                number = parse(value.strip())
            except ValueError:
                continue
            return number if math.isfinite(number) else None     # "nan", "inf": not a typo to accept
    return None


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


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
