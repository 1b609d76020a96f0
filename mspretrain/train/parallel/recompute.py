"""Activation recompute, applied to the model from outside it.

recompute.mode:
- none:   nothing (recompute.full_layers and recompute.select must be empty);
- full:   `layers[i].recompute()` for the layers in recompute.full_layers ("0-3,8"; empty: all);
- select: `layers[i].<module>.recompute()` for each {module: ranges} in recompute.select.
Invalid ranges (reversed, repeated, out of range), unknown modules and keys of another mode are
ConfigErrors that name the key.
"""
from __future__ import annotations

from mspretrain.train.config import ConfigError, parse_layer_ranges

MODES = ("none", "full", "select")
SELECTABLE = ("attention", "mlp", "attention_norm", "ffn_norm")


def recompute_plan(cfg_recompute, num_layers: int) -> dict[int, tuple[str, ...]]:
    """Layer -> the sub-cells to recompute; ("",) means the whole layer. Pure: validates only."""
    mode, full, select = cfg_recompute.mode, cfg_recompute.full_layers, cfg_recompute.select
    if mode not in MODES:
        raise ConfigError(f"recompute.mode must be one of {', '.join(MODES)}, got {mode!r}")
    if mode != "full" and str(full).strip():
        raise ConfigError(f"recompute.full_layers is set ({full!r}) but recompute.mode is {mode!r}, not 'full'")
    if mode != "select" and select:
        raise ConfigError(f"recompute.select is set ({select!r}) but recompute.mode is {mode!r}, not 'select'")
    if mode == "none":
        return {}
    if mode == "full":
        layers = (parse_layer_ranges(full, num_layers, "recompute.full_layers") if str(full).strip()
                  else list(range(num_layers)))
        return {layer: ("",) for layer in layers}
    if not select:
        raise ConfigError("recompute.mode is 'select' but recompute.select is empty; e.g. {mlp: \"0-7\"}")
    plan: dict[int, list[str]] = {}
    for module, ranges in select.items():
        if module not in SELECTABLE:
            raise ConfigError(f"recompute.select.{module}: unknown module (choose from {', '.join(SELECTABLE)})")
        for layer in parse_layer_ranges(ranges, num_layers, f"recompute.select.{module}"):
            plan.setdefault(layer, []).append(module)
    return {layer: tuple(mods) for layer, mods in sorted(plan.items())}


def apply_recompute(model, cfg_recompute) -> dict[int, tuple[str, ...]]:
    """Call `recompute()` on the planned cells of `model` (a train.models.llama.model.Llama); returns the plan."""
    plan = recompute_plan(cfg_recompute, len(model.layers))
    for layer, modules in plan.items():
        for module in modules:
            cell = model.layers[layer] if module == "" else getattr(model.layers[layer], module)
            cell.recompute()
    return plan


def recomputed_cells(model) -> list[str]:
    """Names of the cells marked for recompute (what MindSpore will recompute in backward)."""
    return [name for name, cell in model.cells_and_names()
            if getattr(cell, "_recompute_cell", None) is not None]
