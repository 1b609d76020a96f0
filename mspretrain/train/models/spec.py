"""What a model family gives the trainer, and the registry that finds it by `model.family`.

A family is one folder under mspretrain/train/models/ (llama/ is the built-in one) whose __init__.py
calls `register(ModelSpec(...))`. The trainer, the planners and the converters only ever reach a
family's model through its spec, so a second family touches no trainer file. Only what differs between
families is here; the loss, the optimizer, the step, checkpoints and the data are shared.

A family's model (`build_model`) maps int32 tokens [B, S] to logits [B, S, vocab] and names its
parameters stably: checkpoints, the parallel plan and the HF mapping address them by those names.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType
from typing import Callable


@dataclass(frozen=True)
class ModelSpec:
    name: str                       # the value of model.family
    # (cfg.model, vocab_size, seq_length, device, dtype, eos_id) -> the model's frozen arguments; eos_id
    # None: no dataset (document masking off); what build_model, hf_mapping and decode take
    model_args: Callable
    build_model: Callable           # (args, seed) -> an nn.Cell, fp32, initialised from `seed` only
    # validate(cfg, vocab) and ops(cfg, dp, mp) -> [OpShard] and stage_of(cfg, stages) -> {cell: stage}:
    # the strategies for Primitive.shard of every primitive the model holds (train/parallel.py)
    parallel_plan: ModuleType
    # count_params, stage_params, layer_activation_bytes, head_activation_bytes,
    # document_activation_bytes: the memory planner's model terms (train/memory.py)
    memory_terms: ModuleType
    # hf_name, hf_config, check_hf_config, from_hf: `train export` / `train import` (train/hf.py);
    # None: the family has no Hugging Face counterpart
    hf_mapping: ModuleType | None = None
    decode: Callable | None = None  # () -> the module of Weights, Start, DecodeChunk (train/generate.py)


_REGISTRY: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    """Add a family; registering the same name twice is an error (two folders claiming it)."""
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"model family {spec.name!r} is registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def get(name: str) -> ModelSpec:
    """The spec of family `name`; a built-in family's folder is imported (and so registered) on first
    use, so that importing the trainer does not import every model."""
    if name not in _REGISTRY and name.isidentifier():
        try:
            importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{name}":
                raise
    if name not in _REGISTRY:
        raise KeyError(f"model.family {name!r} is not a registered model family "
                       f"(registered: {', '.join(sorted(_REGISTRY)) or 'none'}; built in: llama)")
    return _REGISTRY[name]


def known(name: str) -> bool:
    try:
        get(name)
    except KeyError:
        return False
    return True


def of(cfg) -> ModelSpec:
    """The spec of the config's model.family."""
    return get(cfg.model.family)
