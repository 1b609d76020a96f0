"""The MindSpore switches a long run may need, each validated against the device (docs/long-runs.md).

- precision.graph_kernel: graph-kernel fusion (`mindspore.set_context(enable_graph_kernel=True)`):
  fuses element-wise and reduction chains into generated kernels on GPU and Ascend. It costs compile
  time (tens of seconds more for a large model) and is not available on CPU.
- parallel.comm_fusion: the all-reduce fusion bucket size in MB for data-parallel gradients
  (`mindspore.set_auto_parallel_context(comm_fusion={"allreduce": {"mode": "size", "config": MB}})`):
  fewer, larger all-reduces; a bucket waits until it is full, so a larger bucket overlaps less of
  the reduction with backward. Needs more than one rank.
- run.mode: graph (default) | pynative. PyNative runs each operator eagerly, so a model can be stepped
  through with a debugger on a small config; it is several times slower than GRAPH_MODE and is refused
  with parallel jobs here (the step graph's AutoParallel compile needs GRAPH_MODE).
"""
from __future__ import annotations

from mspretrain.train.config import ConfigError

MODES = ("graph", "pynative")


def check_switches(cfg) -> None:
    if cfg.run.mode not in MODES:
        raise ConfigError(f"run.mode must be graph or pynative, got {cfg.run.mode!r}")
    world = cfg.parallel.data_parallel * cfg.parallel.model_parallel * cfg.parallel.pipeline_stage
    if cfg.run.mode == "pynative" and world > 1:
        raise ConfigError("run.mode=pynative is for a single process (stepping through a small config); "
                          f"this config asks for {world} ranks: use run.mode=graph")
    if cfg.precision.graph_kernel and cfg.device == "CPU":
        raise ConfigError("precision.graph_kernel=true needs device GPU or Ascend: MindSpore 2.10's "
                          "graph-kernel fusion has no CPU backend; set it to false here")
    if cfg.parallel.comm_fusion < 0:
        raise ConfigError(f"parallel.comm_fusion must be >= 0 MB (0: MindSpore's default), got "
                          f"{cfg.parallel.comm_fusion!r}")
    if cfg.parallel.comm_fusion and cfg.parallel.data_parallel * cfg.parallel.model_parallel < 2:
        raise ConfigError(f"parallel.comm_fusion={cfg.parallel.comm_fusion} MB fuses all-reduces between "
                          f"ranks, and this config has one (parallel.data_parallel=1): set it to 0")
    from mspretrain.train.observe.profile import check_profile_config
    check_profile_config(cfg)


def apply_switches(cfg) -> None:
    """Set them in MindSpore (after distributed.setup set the mode and the device)."""
    import mindspore as ms
    if cfg.run.mode == "pynative":
        ms.set_context(mode=ms.PYNATIVE_MODE)
    if cfg.precision.graph_kernel:
        ms.set_context(enable_graph_kernel=True)
    if cfg.parallel.comm_fusion:
        ms.set_auto_parallel_context(comm_fusion={"allreduce": {"mode": "size",
                                                                "config": int(cfg.parallel.comm_fusion)}})
