"""Activation recompute, applied to the model from outside it.

recompute.mode:
- none:   nothing (recompute.full_layers and recompute.select must be empty);
- full:   `layers[i].recompute()` for the layers in recompute.full_layers ("0-3,8"; empty: all);
- select: `layers[i].<module>.recompute()` for each {module: ranges} in recompute.select.
Invalid ranges (reversed, repeated, out of range), unknown modules and keys of another mode are
ConfigErrors that name the key.

recompute.mp_comm (default true, MindSpore's): false passes `mp_comm_recompute=False` to each
`Cell.recompute`, so the model-parallel communication inside a recomputed cell keeps its output
instead of running again in backward (memory for time; switches.check_recompute_switches).
recompute.exclude (MindFormers' select_recompute_exclude): ops kept, not recomputed, inside recomputed
cells, by their path in a layer (`mlp.w1.matmul`, `attention.flash_attention`; a cell's output, such as mlp.w2's, is kept anyway), each set
`Primitive.recompute(False)`, which MindSpore 2.10 lets override the enclosing cell's recompute (Cell.recompute's
note). An op that is no primitive of the layer, or in no recomputed cell, is a ConfigError.
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
    exclude = cfg_recompute.exclude
    if not isinstance(exclude, (list, tuple)) or not all(isinstance(e, str) and e for e in exclude):
        raise ConfigError(f"recompute.exclude must be a list of op paths in a layer, e.g. [mlp.w1.matmul], "
                          f"got {exclude!r}")
    if exclude and mode == "none":
        raise ConfigError(f"recompute.exclude is set ({list(exclude)!r}) but recompute.mode is 'none': "
                          f"nothing is recomputed to exclude from")
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
    kwargs = {} if cfg_recompute.mp_comm else {"mp_comm_recompute": False}
    for layer, modules in plan.items():
        for module in modules:
            cell = model.layers[layer] if module == "" else getattr(model.layers[layer], module)
            cell.recompute(**kwargs)
    exclude_ops(model, plan, cfg_recompute.exclude)
    return plan


def exclude_ops(model, plan: dict, exclude) -> list[str]:
    """`Primitive.recompute(False)` on each excluded op of every recomputed layer; returns their paths."""
    done = []
    for path in exclude:
        cell_path, _, prim_name = path.rpartition(".")
        cells = dict(model.layers[0].cells_and_names())
        cell = cells.get(cell_path)
        if cell is None or prim_name not in getattr(cell, "_primitives", {}):
            raise ConfigError(f"recompute.exclude: {path!r} is no primitive of a layer (a path like "
                              f"mlp.w1.matmul: cell path, then the primitive's attribute)")
        hit = False
        for layer, modules in plan.items():
            if not any(m == "" or path.startswith(m + ".") for m in modules):
                continue
            prim = dict(model.layers[layer].cells_and_names())[cell_path]._primitives[prim_name]
            prim.recompute(False)
            done.append(f"layers.{layer}.{path}")
            hit = True
        if not hit:
            raise ConfigError(f"recompute.exclude: {path!r} is in no recomputed cell (recompute.mode "
                              f"select recomputes {sorted({m for ms in plan.values() for m in ms})}): "
                              f"drop it from recompute.exclude")
    return done


def excluded_ops(model) -> list[str]:
    """Paths of the primitives marked not to recompute (Primitive.recompute(False))."""
    return [f"{name}.{attr}" if name else attr for name, cell in model.cells_and_names()
            for attr, prim in getattr(cell, "_primitives", {}).items()
            if prim is not None and prim.attrs.get("recompute") is False]


def recomputed_cells(model) -> list[str]:
    """Names of the cells marked for recompute (what MindSpore will recompute in backward)."""
    return [name for name, cell in model.cells_and_names()
            if getattr(cell, "_recompute_cell", None) is not None]
