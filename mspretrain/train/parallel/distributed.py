"""Process-group setup: one process, or one worker of an `msrun` job.

msrun 2.10 starts a scheduler process and N workers, all running the same command line. It exports
MS_WORKER_NUM (the world size), MS_ROLE (MS_SCHED | MS_WORKER), MS_NODE_ID and RANK_ID (the worker's
rank when --node_rank is given or the job is single-node), MS_SCHED_HOST/PORT. In the scheduler,
`mindspore.communication.init()` serves the cluster and exits the process when the job ends, so
`setup()` must run before anything with side effects (run dir, data, logs).

Rank layout (MindSpore's device matrix): pipeline stage outermost, then data parallel, model parallel
innermost: rank = stage * dp * mp + dp_rank * mp + mp_rank. Ranks of one model-parallel group read
the same data slice, so the loader uses dp_rank / dp_size, never rank / world_size.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from mspretrain.train.config import ConfigError



@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    dp_rank: int
    dp_size: int
    is_main: bool
    sharded: bool       # mp > 1, pp > 1 or optimizer sharding: per-rank checkpoints needed

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def under_msrun() -> bool:
    """True inside a process started by msrun (worker or scheduler)."""
    return os.environ.get("MS_ROLE") in ("MS_WORKER", "MS_SCHED") and "MS_WORKER_NUM" in os.environ


def msrun_world_size() -> int:
    value = os.environ.get("MS_WORKER_NUM", "1")
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment MS_WORKER_NUM={value!r} is not an integer") from None


def is_sharded(cfg) -> bool:
    p = cfg.parallel
    return p.model_parallel > 1 or p.pipeline_stage > 1 or bool(p.optimizer_shard)


def layout(cfg, rank: int, world_size: int) -> DistInfo:
    """DistInfo of `rank` in a job of `world_size` processes, after checking dp*mp*pp == world_size."""
    p = cfg.parallel
    for key in ("data_parallel", "model_parallel", "pipeline_stage"):
        if getattr(p, key) < 1:
            raise ConfigError(f"parallel.{key} must be >= 1, got {getattr(p, key)}")
    product = p.data_parallel * p.model_parallel * p.pipeline_stage
    if product != world_size:
        raise ConfigError(
            f"parallel.data_parallel ({p.data_parallel}) * parallel.model_parallel ({p.model_parallel}) "
            f"* parallel.pipeline_stage ({p.pipeline_stage}) = {product}, but the job has {world_size} "
            f"process(es); set parallel.data_parallel={world_size // (p.model_parallel * p.pipeline_stage) or 1}"
            f" or change --nproc")
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside a world of {world_size}")
    mp = p.model_parallel
    dp_rank = (rank % (p.data_parallel * mp)) // mp
    return DistInfo(rank=rank, world_size=world_size, dp_rank=dp_rank, dp_size=p.data_parallel,
                    is_main=rank == 0, sharded=is_sharded(cfg))


def setup(cfg, validate) -> DistInfo:
    """Initialise the process group when under msrun; validate cfg.parallel against the world size.

    Owns the MindSpore device: GRAPH_MODE on cfg.device is set here, once, and nothing may set it
    again. Under msrun `init()` gives each worker device id = its local rank, after which
    `mindspore.set_device` refuses any call ("can not be modified") on every rank but 0.

    One process (no msrun env): rank 0 of 1, no process group (a config asking for more than one
    process is an error: launch with --nproc). Under msrun: `communication.init()`, the plan validated
    (`validate(cfg, world_size)`: train.parallel.plan.validate, passed in so that this module does not
    depend on the plan) and, on CPU/GPU data parallel, the DATA_PARALLEL context with gradients_mean
    set, so that a TrainOneStepCell built afterwards all-reduces (means) its gradients.
    """
    if not under_msrun():
        info = layout(cfg, 0, 1)
        validate(cfg, 1)
        _set_device(cfg)
        return info
    world = msrun_world_size()
    # Check the config before init so a wrong config fails fast in every worker, not at a barrier.
    validate(cfg, world)

    from mindspore.communication import get_group_size, get_rank, init

    _set_device(cfg)        # the target only: init() assigns the device id
    init()                  # the scheduler process never returns from here
    rank, size = get_rank(), get_group_size()
    if size != world:
        raise ConfigError(f"msrun reports MS_WORKER_NUM={world} but the process group has {size} ranks")
    info = layout(cfg, rank, size)
    set_data_parallel_context(cfg, info)
    return info


def set_data_parallel_context(cfg, dist: DistInfo) -> None:
    """CPU/GPU data parallel: DATA_PARALLEL with gradients_mean, before the train cell is built.

    nn.TrainOneStepCell (and subclasses) read it in __init__ to build their DistributedGradReducer.
    Ascend runs go through AutoParallel (train.parallel.apply.wrap) instead and set nothing here.
    """
    if dist.world_size == 1 or cfg.device == "Ascend":
        return
    import mindspore as ms
    from mindspore import ParallelMode

    ms.reset_auto_parallel_context()
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True,
                                 device_num=dist.world_size)


def _set_device(cfg) -> None:
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        ms.set_device(cfg.device)
    except (RuntimeError, ValueError) as e:     # e.g. GPU with a CPU-only MindSpore
        from mspretrain.train.config import ConfigError
        raise ConfigError(f"device: {cfg.device!r} is not usable with this MindSpore installation "
                          f"({str(e).strip().splitlines()[0][:160]})") from None
    set_deterministic(cfg)


def set_deterministic(cfg) -> bool:
    """run.deterministic: MindSpore's deterministic switch, which also exports HCCL_DETERMINISTIC=true
    (and TE_PARALLEL_COMPILER=1), before `communication.init()` so that the world group's
    collectives reduce in a fixed order. Ascend kernels with atomic accumulation and HCCL reductions
    otherwise differ from run to run in the last bits (bitwise resume, `train doctor`'s resume rung).
    CPU kernels are deterministic either way. MindSpore allows one setting per process: a second
    call (tests calling setup twice) leaves the first. Returns whether it set it now."""
    from mindspore.device_manager import DeviceManagerConf

    if DeviceManagerConf.get_instance().is_deterministic_configured():
        return False
    import mindspore as ms

    if cfg.run.deterministic:
        os.environ.setdefault("HCCL_DETERMINISTIC", "true")
    ms.set_deterministic(bool(cfg.run.deterministic))
    return True


def all_reduce_mean(dist: DistInfo, values):
    """Mean over all ranks of a list of floats (e.g. the step loss), as Python floats; identity on one rank.

    Called eagerly between steps (PyNative op on a small tensor), so it costs one small all-reduce.
    """
    if not dist.distributed:
        return [float(v) for v in values]
    import numpy as np
    import mindspore as ms
    from mindspore import ops

    total = ops.AllReduce()(ms.Tensor(np.asarray(values, dtype=np.float32)))
    return [float(np.float32(v) / np.float32(dist.world_size)) for v in total.asnumpy()]


def barrier(dist: DistInfo) -> None:
    """Wait for every rank (e.g. before rank 0 publishes `latest`); no-op on one rank."""
    if not dist.distributed:
        return
    import numpy as np
    import mindspore as ms
    from mindspore import ops

    ops.AllReduce()(ms.Tensor(np.zeros(1, np.float32))).asnumpy()


def all_reduce_sum(dist: DistInfo, value, dtype=None):
    """The sum of `value` over all ranks; `value` itself on one rank. Integers (token counts) are
    summed exactly: MindSpore's CPU AllReduce takes float only, and float32 holds integers exactly up
    to 2**24 only, so a count travels as two float32 parts, n // 4096 and n % 4096 (each sum exact up
    to 2**24 ranks x parts). Floats are summed in float32."""
    if not dist.distributed:
        return value
    import numpy as np
    import mindspore as ms
    from mindspore import ops

    if isinstance(value, (int, np.integer)):
        parts = np.asarray(divmod(int(value), 4096), dtype=np.float32)
        high, low = ops.AllReduce()(ms.Tensor(parts)).asnumpy()
        return int(high) * 4096 + int(low)
    return float(ops.AllReduce()(ms.Tensor(np.asarray([value], dtype=np.float32))).asnumpy()[0])


def all_reduce_weighted_mean(dist: DistInfo, value: float, weight: float) -> float:
    """sum(value * weight) / sum(weight) over all ranks (the loss of a pipeline: weight 1 on the last
    stage's ranks, which alone compute it, 0 elsewhere); `value` itself on one rank."""
    if not dist.distributed:
        return float(value)
    import numpy as np
    import mindspore as ms
    from mindspore import ops

    pair = np.asarray([np.float32(value) * np.float32(weight), weight], dtype=np.float32)
    total = ops.AllReduce()(ms.Tensor(pair)).asnumpy()
    return float(np.float32(total[0]) / np.float32(total[1]))
