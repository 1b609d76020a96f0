"""Does the parallel layout fit the cluster's nodes? Pure checks of the config, the world size and
what msrun's environment says about this worker.

Ranks are laid out model parallel innermost (distributed.py): a model-parallel group is `mp`
consecutive ranks, and msrun puts `--local_worker_num` consecutive ranks on each node. So a group
stays on one node when the node's worker count is a multiple of mp. Its all-reduces (two per layer
forward, two backward) then run over HCCS inside the node instead of RoCE between nodes.

Errors (ConfigError, from `plan.validate`, so `train plan`, `train launch` and the estimate's advice
all refuse them) and warnings (printed by those commands) are found in one place: `problems`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from mspretrain.train.config import ConfigError

# MindFormers' practice on 8-NPU Atlas 800T A2 nodes: tensor parallelism up to 4 within a node; wider
# groups spend more on their per-layer all-reduces than they save, so data/pipeline parallelism (with
# optimizer sharding) is preferred beyond it. A warning, not an error: mp 8 does run.
MP_ADVISED_MAX = 4

LOCAL_WORKERS_ENV = "MSPRETRAIN_LOCAL_WORKERS"   # exported by `train launch` (launch.py) to its workers


@dataclass(frozen=True)
class Problems:
    errors: tuple = ()
    warnings: tuple = ()


def problems(cfg, world_size: int, env=None) -> Problems:
    """Every topology error and warning of cfg in a job of `world_size` processes. `env`: the
    worker's environment (default os.environ); msrun's variables there are checked against the job."""
    env = os.environ if env is None else env
    p = cfg.parallel
    per_node = p.devices_per_node
    if per_node < 1:
        return Problems(errors=(f"parallel.devices_per_node must be >= 1 (devices of one server, 8 on an "
                                f"Atlas 800T A2), got {per_node}",))
    errors = _env_errors(cfg, world_size, env)
    if cfg.device == "CPU":         # processes, not devices: any number per node
        return Problems(errors=tuple(errors))
    errors += _node_errors(p.model_parallel, world_size, per_node)
    warnings = []
    if MP_ADVISED_MAX < p.model_parallel <= per_node:
        warnings.append(
            f"warning: parallel.model_parallel={p.model_parallel} is above {MP_ADVISED_MAX}, the tensor-parallel "
            f"size MindFormers' practice advises within a node: its per-layer all-reduces grow with it; "
            f"prefer model_parallel <= {MP_ADVISED_MAX} with more data parallelism and optimizer sharding "
            f"(`train estimate` compares the step times)")
    return Problems(errors=tuple(errors), warnings=tuple(warnings))


def _node_errors(mp: int, world: int, per_node: int) -> list[str]:
    out = []
    if mp > per_node:
        out.append(f"parallel.model_parallel ({mp}) exceeds parallel.devices_per_node ({per_node}): its "
                   f"per-layer all-reduces would cross nodes; use model_parallel <= {per_node} and pipeline "
                   f"stages or data parallelism across nodes")
    elif world > per_node and per_node % mp:
        out.append(f"parallel.model_parallel ({mp}) must divide parallel.devices_per_node ({per_node}) when "
                   f"the job spans nodes: otherwise a model-parallel group straddles two nodes")
    if world > per_node and world % per_node:
        out.append(f"the job's {world} devices span several nodes of parallel.devices_per_node={per_node}: "
                   f"the world size must be a multiple of {per_node} (whole nodes); change "
                   f"parallel.data_parallel, or set parallel.devices_per_node to the devices each node uses")
    return out


def _env_errors(cfg, world: int, env) -> list[str]:
    """msrun's view of this worker against the config: RANK_SIZE (msrun exports the job's size),
    DEVICE_ID (the worker's local rank, one device each) and the node's worker count."""
    if "MS_WORKER_NUM" not in env:
        return []
    out, per_node, mp = [], cfg.parallel.devices_per_node, cfg.parallel.model_parallel
    size = _int(env, "RANK_SIZE")
    if size is not None and size != world:
        out.append(f"msrun exports RANK_SIZE={size} but the job has {world} processes: a stale RANK_SIZE "
                   f"or rank table in the environment; unset it or launch with matching --nproc/--nnodes")
    local = _int(env, LOCAL_WORKERS_ENV)
    device = _int(env, "DEVICE_ID")
    if cfg.device != "CPU" and device is not None and device >= per_node:
        out.append(f"this worker's DEVICE_ID={device} is outside the {per_node} devices of a node "
                   f"(parallel.devices_per_node): launch at most {per_node} processes per node (--nproc)")
    if local is not None and world > local:
        out += _local_errors(local, per_node, mp, cfg.device)
    return out


def _local_errors(local: int, per_node: int, mp: int, device: str) -> list[str]:
    out = []
    if device != "CPU" and local > per_node:
        out.append(f"--nproc {local} processes per node exceed parallel.devices_per_node ({per_node})")
    if local % mp:
        out.append(f"--nproc {local} processes per node is not a multiple of parallel.model_parallel ({mp}): "
                   f"a model-parallel group would straddle two nodes; use --nproc {per_node} (whole nodes)")
    return out


def _int(env, key: str) -> int | None:
    value = env.get(key)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment {key}={value!r} is not an integer") from None


def check(cfg, world_size: int, env=None) -> tuple:
    """Raise the topology errors (one ConfigError naming every one); return the warnings."""
    found = problems(cfg, world_size, env)
    if found.errors:
        raise ConfigError("; ".join(found.errors))
    return found.warnings
