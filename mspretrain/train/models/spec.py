"""What a model family gives the trainer, and the registry that finds it by `model.family`.

A family is one folder under mspretrain/train/models/ (llama/ is the built-in one) whose __init__.py
calls `register(ModelSpec(...))`. The trainer, the planners and the converters only ever reach a
family's model through its spec, so a second family touches no trainer file. Only what differs between
families is here; the loss, the optimizer, the step, checkpoints and the data are shared.

A family's model (`build_model`) maps int32 tokens [B, S] to logits [B, S, vocab] and names its
parameters stably: checkpoints, the parallel plan and the HF mapping address them by those names.
Also here, so that a family needs nothing from the trainer's modules: the pieces its parts are made of
(OpShard, HFError, reuses_memory). docs/extending.md has a worked example.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from mspretrain.common.config import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    name: str                       # the value of model.family
    # (cfg.model, vocab_size, seq_length, device, dtype, eos_id) -> the model's frozen arguments; eos_id
    # None: no dataset (document masking off); what build_model, hf_mapping and decode take
    model_args: Callable
    build_model: Callable           # (args, seed) -> an nn.Cell, fp32, initialised from `seed` only
    # the pieces below are modules, or any objects with these functions:
    # validate(cfg, vocab, seq), ops(cfg, dp, mp) -> [OpShard], stage_of(cfg, stages) -> {cell: stage}:
    # the strategy for Primitive.shard of every primitive the model holds (train/parallel.py)
    parallel_plan: object
    # count_params, stage_params, layer_activation_bytes, head_activation_bytes,
    # document_activation_bytes, largest_weight: the memory planner's model terms (train/memory.py)
    memory_terms: object
    # hf_name, hf_config, check_hf_config, from_hf: `train export` / `train import` (train/hf.py);
    # None: the family has no Hugging Face counterpart
    hf_mapping: object | None = None
    decode: Callable | None = None  # () -> the module of Weights, Start, DecodeChunk (train/generate.py)


# ---------------------------------------------------------------- what a family's pieces are made of

@dataclass(frozen=True)
class OpShard:
    """One operator's strategy: `in_strategy` is one tuple per input, as `Primitive.shard` takes it."""
    module: str                 # cell path in the model, e.g. "layers.3.attention.wq" ("" = the model)
    prim: str                   # the primitive's attribute name in that cell, e.g. "matmul"
    kind: str                   # the primitive's name, checked when applied: MatMul, Gather, BatchMatMul
    in_strategy: tuple
    out_strategy: tuple | None = None


class HFError(RuntimeError):
    """A Hugging Face directory that cannot be converted; the message names the file and key."""


def reuses_memory(cfg) -> bool:
    """Ascend/GPU: the graph's memory planner reuses a buffer once its last reader ran, so what counts is
    what backward keeps plus a working set. CPU (MindSpore 2.10): every node of a graph keeps its own
    output buffer for the graph's lifetime (measured in bench_memory.py: a forward-only graph grows by
    the sum of all its intermediates; a while-loop body's exist once; recompute lowers nothing)."""
    return cfg.device != "CPU"


# ---------------------------------------------------------------- the registry

_REGISTRY: dict[str, ModelSpec] = {}


def register(spec: ModelSpec) -> ModelSpec:
    """Add a family; registering the same name twice is an error (two folders claiming it)."""
    if spec.name in _REGISTRY and _REGISTRY[spec.name] is not spec:
        raise ValueError(f"model family {spec.name!r} is registered twice")
    _REGISTRY[spec.name] = spec
    return spec


def get(name: str) -> ModelSpec:
    """The spec of family `name`; a built-in family's folder is imported (and so registered) on first
    use, so that importing the trainer does not import every model. ConfigError when none has it."""
    if name not in _REGISTRY and name.isidentifier():
        try:
            importlib.import_module(f"{__package__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__package__}.{name}":
                raise
    if name not in _REGISTRY:
        raise ConfigError(f"model.family: {name!r} is not a registered model family (registered: "
                          f"{', '.join(sorted(_REGISTRY)) or 'none'}; mspretrain/train/models/, "
                          f"docs/extending.md)")
    return _REGISTRY[name]


def known(name: str) -> bool:
    try:
        get(name)
    except ConfigError:
        return False
    return True


def of(cfg) -> ModelSpec:
    """The spec of the config's model.family."""
    return get(cfg.model.family)
