"""The MindSpore switches a long run may need, each validated against the device (docs/long-runs.md,
docs/performance.md, docs/parallel.md).

- precision.graph_kernel: graph-kernel fusion (`mindspore.set_context(enable_graph_kernel=True)`):
  fuses element-wise and reduction chains into generated kernels on GPU and Ascend. It costs compile
  time (tens of seconds more for a large model) and is not available on CPU.
- parallel.comm_fusion: the all-reduce fusion bucket size in MB for data-parallel gradients
  (`{"allreduce": {"mode": "size", "config": MB}}`): fewer, larger all-reduces; a bucket waits until
  it is full, so a larger bucket overlaps less of the reduction with backward. Needs more than one rank.
- parallel.comm_fusion_allgather / comm_fusion_reducescatter: the same for optimizer sharding's weight
  all-gathers and gradient reduce-scatters (`"allgather"` / `"reducescatter"` groups). Need
  parallel.optimizer_shard.
- parallel.overlap: communication overlapped with computation by the semi-auto compiler, MindSpore
  2.10's parallel_speed_up_json keys (`AutoParallel.transformer_opt(file)`), Ascend only:
  grad_allreduce -> grad_computation_allreduce_overlap (data-parallel gradient all-reduce with backward),
  allgather      -> computation_allgather_overlap (optimizer sharding's weight all-gather with compute),
  matmul_grad    -> grad_matmul_communication_overlap (model-parallel communication with matmul dw),
  recompute      -> recomputation_communication_overlap (model-parallel communication with recompute).
- run.mode: graph (default) | pynative. PyNative runs each operator eagerly, so a model can be stepped
  through with a debugger on a small config; it is several times slower than GRAPH_MODE and is refused
  with parallel jobs here (the step graph's AutoParallel compile needs GRAPH_MODE).
- model.fused_kernels: Ascend kernels inside the model's layers (mspretrain/train/models/fused.py).

On Ascend the fusion groups and the overlap file go onto the AutoParallel cell (`apply_to_auto_parallel`,
from parallel/apply.py): at compile AutoParallel rewrites the parallel context from its own fields
(mindspore/parallel/_utils.py `_init_auto_parallel_context`: `comm_fusion=net._comm_fusion_config`, then
`net.transformer_opt(...)`), so a value set beforehand with set_auto_parallel_context would not hold.
"""
from __future__ import annotations

import json
from pathlib import Path

from mspretrain.train.config import ConfigError

MODES = ("graph", "pynative")
# parallel.overlap name -> MindSpore 2.10's parallel_speed_up_json key (the names 2.10 does not call
# deprecated: its context.py warns on the older recompute_comm_overlap, enable_grad_comm_opt, ...)
OVERLAP = {"grad_allreduce": "grad_computation_allreduce_overlap",
           "allgather": "computation_allgather_overlap",
           "matmul_grad": "grad_matmul_communication_overlap",
           "recompute": "recomputation_communication_overlap"}


def check_switches(cfg) -> None:
    if cfg.run.mode not in MODES:
        raise ConfigError(f"run.mode must be graph or pynative, got {cfg.run.mode!r}")
    p = cfg.parallel
    world = p.data_parallel * p.model_parallel * p.pipeline_stage
    if cfg.run.mode == "pynative" and world > 1:
        raise ConfigError("run.mode=pynative is for a single process (stepping through a small config); "
                          f"this config asks for {world} ranks: use run.mode=graph")
    if cfg.precision.graph_kernel and cfg.device == "CPU":
        raise ConfigError("precision.graph_kernel=true needs device GPU or Ascend: MindSpore 2.10's "
                          "graph-kernel fusion has no CPU backend; set it to false here")
    for key in ("comm_fusion", "comm_fusion_allgather", "comm_fusion_reducescatter"):
        if getattr(p, key) < 0:
            raise ConfigError(f"parallel.{key} must be >= 0 MB (0: MindSpore's default), got {getattr(p, key)!r}")
    if p.comm_fusion and p.data_parallel * p.model_parallel < 2:
        raise ConfigError(f"parallel.comm_fusion={p.comm_fusion} MB fuses all-reduces between "
                          f"ranks, and this config has one (parallel.data_parallel=1): set it to 0")
    for key in ("comm_fusion_allgather", "comm_fusion_reducescatter"):
        if getattr(p, key) and not (p.optimizer_shard and cfg.device == "Ascend"):
            raise ConfigError(f"parallel.{key}={getattr(p, key)} MB fuses optimizer sharding's "
                              f"communication: it needs parallel.optimizer_shard=true on device Ascend "
                              f"(semi-auto parallel); set it to 0 here")
    check_overlap(cfg)
    check_recompute_switches(cfg)
    from mspretrain.train.models.fused import check_fused_kernels
    check_fused_kernels(cfg.model.fused_kernels, cfg.device)
    from mspretrain.train.observe.profile import check_profile_config
    check_profile_config(cfg)


def check_overlap(cfg) -> None:
    """parallel.overlap: known names, each with the communication it overlaps present."""
    p, overlap = cfg.parallel, cfg.parallel.overlap
    if not isinstance(overlap, (list, tuple)):
        raise ConfigError(f"parallel.overlap must be a list of {', '.join(OVERLAP)}, got {overlap!r}")
    for name in overlap:
        if name not in OVERLAP:
            raise ConfigError(f"parallel.overlap: unknown {name!r} (choose from {', '.join(OVERLAP)})")
    if overlap and cfg.device != "Ascend":
        raise ConfigError(f"parallel.overlap={list(overlap)} is a switch of MindSpore's semi-auto parallel "
                          f"compiler (parallel_speed_up_json), which runs on Ascend only: set "
                          f"parallel.overlap=[] on {cfg.device}")
    needs = {"grad_allreduce": (p.data_parallel > 1, "parallel.data_parallel > 1 (a gradient all-reduce)"),
             "allgather": (bool(p.optimizer_shard), "parallel.optimizer_shard=true (weight all-gathers)"),
             "matmul_grad": (p.model_parallel > 1, "parallel.model_parallel > 1 (model-parallel communication)"),
             "recompute": (p.model_parallel > 1 and cfg.recompute.mode != "none",
                           "parallel.model_parallel > 1 and recompute.mode full or select")}
    for name in overlap:
        ok, want = needs[name]
        if not ok:
            raise ConfigError(f"parallel.overlap: {name} overlaps communication this config does not have: "
                              f"it needs {want}; drop {name} from parallel.overlap")


def check_recompute_switches(cfg) -> None:
    """recompute.mp_comm and recompute.optimizer_comm (recompute.exclude is checked on the model:
    parallel/recompute.py)."""
    r, p = cfg.recompute, cfg.parallel
    if not r.mp_comm and (r.mode == "none" or p.model_parallel < 2 or cfg.device != "Ascend"):
        raise ConfigError("recompute.mp_comm=false keeps model-parallel communication out of the recomputed "
                          "cells: it needs recompute.mode full or select with parallel.model_parallel > 1 on "
                          "device Ascend; set recompute.mp_comm=true here")
    if r.optimizer_comm:
        raise ConfigError("recompute.optimizer_comm=true: MindSpore 2.10's Cell.recompute only warns for "
                          "parallel_optimizer_comm_recompute (\"replaced with zero3\") and recomputes nothing; "
                          "set recompute.optimizer_comm=false and parallel.optimizer_level=level3 (weights "
                          "re-gathered before backward) to save that memory")


def comm_fusion_config(cfg) -> dict:
    """The `comm_fusion` dict of the configured buckets ({} when all are MindSpore's default)."""
    p, out = cfg.parallel, {}
    for group, mb in (("allreduce", p.comm_fusion), ("allgather", p.comm_fusion_allgather),
                      ("reducescatter", p.comm_fusion_reducescatter)):
        if mb:
            out[group] = {"mode": "size", "config": int(mb)}
    return out


def speed_up_config(cfg) -> dict:
    """parallel.overlap as MindSpore's parallel_speed_up_json content."""
    return {OVERLAP[name]: True for name in cfg.parallel.overlap}


def apply_switches(cfg) -> None:
    """Set them in MindSpore (after distributed.setup set the mode and the device). The all-reduce
    bucket goes into the parallel context here for CPU/GPU data parallel; on Ascend
    apply_to_auto_parallel sets every group on the AutoParallel cell."""
    import mindspore as ms
    if cfg.run.mode == "pynative":
        ms.set_context(mode=ms.PYNATIVE_MODE)
    if cfg.precision.graph_kernel:
        ms.set_context(enable_graph_kernel=True)
    if cfg.parallel.comm_fusion:
        ms.set_auto_parallel_context(comm_fusion={"allreduce": {"mode": "size",
                                                                "config": int(cfg.parallel.comm_fusion)}})


def apply_to_auto_parallel(cfg, net, speed_up_file: str | Path) -> None:
    """The fusion groups (`AutoParallel.comm_fusion`) and the overlap switches (written to
    `speed_up_file`, `AutoParallel.transformer_opt`) on the semi-auto cell (Ascend)."""
    fusion = comm_fusion_config(cfg)
    if fusion:
        net.comm_fusion(fusion)
    speed_up = speed_up_config(cfg)
    if speed_up:
        path = Path(speed_up_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(speed_up, indent=1, sort_keys=True) + "\n")
        net.transformer_opt(str(path))
