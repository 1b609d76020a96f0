"""What a model family gives the trainer, and the registry that finds it by `model.family`.

A family is one folder under mspretrain/train/models/ (llama/ is the built-in one) whose __init__.py
calls `register(ModelSpec(...))`, or a package installed beside this one that names its ModelSpec
by an entry point of the group `mspretrain.models`. The trainer, the planners and the converters only
ever reach a family's model through its spec, so a second family touches no trainer file. Only what differs between
families is here; the loss, the optimizer, the step, checkpoints and the data are shared.

A family's model (`build_model`) maps int32 tokens [B, S] to logits [B, S, vocab] and names its
parameters stably: checkpoints, the parallel plan and the HF mapping address them by those names.
Also here, so that a family needs nothing from the trainer's modules: the pieces its parts are made of
(OpShard, HFError, reuses_memory); the layers its model is built from are in models/layers.py.
docs/extending.md has a worked example.
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Callable

from mspretrain.common.config import ConfigError
from mspretrain.common.errors import MspretrainError


@dataclass(frozen=True)
class ModelSpec:
    name: str                       # the value of model.family
    # (cfg.model, vocab_size, seq_length, device, dtype, eos_id) -> the model's frozen arguments; eos_id
    # None: no dataset (document masking off); what build_model, hf_mapping and decode take
    model_args: Callable
    # (args, seed) -> an nn.Cell, fp32, initialised from `seed` only; its weight matmuls layers.Dense
    # and its set_compute_dtype(dtype) precision O2's (train/step/cell.py apply_precision)
    build_model: Callable
    # the pieces below are modules, or any objects with these functions:
    # validate(cfg, vocab, seq), ops(cfg, dp, mp) -> [OpShard], stage_of(cfg, stages) -> {cell: stage}:
    # the strategy for Primitive.shard of every primitive the model holds (train/parallel/apply.py)
    parallel_plan: object
    # count_params, stage_params, layer_activation_bytes, head_activation_bytes,
    # document_activation_bytes, largest_weight: the memory planner's model terms (train/memory.py);
    # layer_flops, head_flops: its step-time model's (train/steptime.py)
    memory_terms: object
    # hf_name, hf_config, check_hf_config, from_hf: `train export` / `train import` (train/hf/convert.py);
    # None: the family has no Hugging Face counterpart
    hf_mapping: object | None = None
    decode: Callable | None = None  # () -> the module of Weights, Start, DecodeChunk (train/eval/generate.py)


# ---------------------------------------------------------------- what a family's pieces are made of

@dataclass(frozen=True)
class OpShard:
    """One operator's strategy: `in_strategy` is one tuple per input, as `Primitive.shard` takes it."""
    module: str                 # cell path in the model, e.g. "layers.3.attention.wq" ("" = the model)
    prim: str                   # the primitive's attribute name in that cell, e.g. "matmul"
    kind: str                   # the primitive's name, checked when applied: MatMul, Gather, BatchMatMul
    in_strategy: tuple
    out_strategy: tuple | None = None


class HFError(MspretrainError, RuntimeError):
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
    """The spec of family `name`, found on first use (so that importing the trainer imports no model):
    a built-in family's folder is imported (it registers itself), else the installed entry point of
    that name in the group `mspretrain.models` is loaded. ConfigError when none has it."""
    if name not in _REGISTRY:
        if name in builtin_families():
            importlib.import_module(f"{__package__}.{name}")
        else:
            _load_plugin(name)
    if name not in _REGISTRY:
        raise ConfigError(f"model.family: {name!r} is not a registered model family (known: "
                          f"{', '.join(known_families()) or 'none'}; a folder under "
                          f"mspretrain/train/models/ or an entry point of the group {PLUGIN_GROUP}, "
                          f"docs/extending.md)")
    return _REGISTRY[name]


# ---------------------------------------------------------------- where families come from

PLUGIN_GROUP = "mspretrain.models"     # the entry-point group of families installed beside this package


def builtin_families() -> list[str]:
    """The folders (subpackages) of mspretrain/train/models/, each a family of that name."""
    here = Path(__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.ispkg)


def plugin_families() -> list[str]:
    """The names of the installed `mspretrain.models` entry points (none is loaded)."""
    return sorted({ep.name for ep in entry_points(group=PLUGIN_GROUP)})


def known_families() -> list[str]:
    return sorted(set(_REGISTRY) | set(builtin_families()) | set(plugin_families()))


def _load_plugin(name: str) -> None:
    """Register the family of the entry point `name` (group mspretrain.models), whose object must be a
    ModelSpec of that name, e.g. `myfamily = "mypkg.family:SPEC"`; nothing when none is installed.
    Only that one is imported: the other installed families cost nothing until they are asked for."""
    eps = {ep.value: ep for ep in entry_points(group=PLUGIN_GROUP, name=name)}
    if not eps:
        return
    if len(eps) > 1:
        raise ConfigError(f"model family {name!r} has several entry points in the group {PLUGIN_GROUP} "
                          f"({', '.join(sorted(eps))}): two installed packages claim it")
    ep = next(iter(eps.values()))
    where = f"model family {name!r}: entry point {name} = {ep.value} (group {PLUGIN_GROUP})"
    try:
        obj = ep.load()
    except Exception as e:
        raise ConfigError(f"{where} failed to load: {type(e).__name__}: {e}") from e
    if not isinstance(obj, ModelSpec):
        raise ConfigError(f"{where} is a {type(obj).__name__}, not a "
                          f"mspretrain.train.models.spec.ModelSpec")
    if obj.name != name:
        raise ConfigError(f"{where} is the ModelSpec of {obj.name!r}: the entry point's name and the "
                          f"spec's name must be the same")
    register(obj)


def known(name: str) -> bool:
    try:
        get(name)
    except ConfigError:
        return False
    return True


def of(cfg) -> ModelSpec:
    """The spec of the config's model.family."""
    return get(cfg.model.family)
