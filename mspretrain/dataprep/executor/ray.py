"""`dataprep build --engine ray`: the stage plan's tasks (plan/run.py) as Ray core tasks, on a
cluster the build joins (run.ray_address) or on a one-machine instance it starts and stops.

Every intermediate lives in the work dir (DIR/.build, on a filesystem every node shares), so the
order in which tasks finish never matters, a task Ray retries overwrites its own files, and a rerun
resumes from the completed tasks' markers."""
from __future__ import annotations

import os
from contextlib import contextmanager

from mspretrain.dataprep.config import BuildConfig
from mspretrain.dataprep.errors import BuildError
from mspretrain.dataprep.executor.base import Executor, task_failed, timed_task
from mspretrain.dataprep.readers import InputFile, this_process_only

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"   # "0": Ray nodes bind to 127.0.0.1


class RayExecutor(Executor):
    """Each task a Ray task of one CPU, retried on a lost worker or node."""

    def check_inputs(self, files: list[InputFile]) -> None:
        if unseen := this_process_only(f.path for f in files):
            raise BuildError(f"input format {', '.join(unseen)} is registered in this process "
                             f"only: Ray workers read the files and cannot see it; register it "
                             f"through a mspretrain.readers entry point (docs/extending.md)")

    def describe(self) -> dict:
        import ray
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        cpus = int(ray.cluster_resources().get("CPU", 0))
        return {"engine": "ray", "where": f"Ray cluster of {len(nodes)} node(s), {cpus} CPUs",
                "nodes": len(nodes), "cpus": cpus}

    def _start(self, fn, calls: list[tuple]) -> list:
        remote = _remote()
        return [remote.remote(fn, *args) for args in calls]

    def _wait(self, handles: list) -> tuple[list, list]:
        import ray
        return ray.wait(handles, num_returns=1)

    def _results(self, name: str, handles: list) -> list[dict]:
        import ray
        from ray.exceptions import RayTaskError
        try:
            return ray.get(handles)
        except RayTaskError as e:
            raise task_failed(name, e.cause) from None


_remotes: dict = {}


def _remote():
    """The remote form of timed_task, made once per connection (each ray.remote exports the
    function to the cluster again)."""
    import ray
    key = ray.get_runtime_context().get_job_id()
    if key not in _remotes:
        _remotes.clear()
        _remotes[key] = ray.remote(num_cpus=1, max_retries=5)(timed_task)
    return _remotes[key]


@contextmanager
def ray_executor(cfg: BuildConfig):
    """Connected to Ray for the whole build (joined, or a local instance started and stopped);
    yields the executor."""
    started = _connect(cfg)
    try:
        yield RayExecutor(cfg.run.progress)
    finally:
        if started:
            import ray
            ray.shutdown()


def _connect(cfg: BuildConfig) -> bool:
    """Join cfg.run.ray_address, or start a local instance bound to 127.0.0.1. True if this call
    connected (and so must disconnect)."""
    if not cfg.run.ray_address:
        # a one-machine instance listens on 127.0.0.1 only: Ray's switch for that is read when
        # ray is first imported (it then takes the loopback address as the node's address)
        os.environ.setdefault(LOOPBACK_ENV, "0")
    try:
        import ray
    except ImportError:
        raise BuildError("--engine ray needs Ray: pip install 'mspretrain[ray]' "
                         "(ray==2.60.0)") from None
    _check_reachable(cfg.run.ray_address)
    if ray.is_initialized():   # a caller (a test, a notebook) connected already: use that
        return False
    common = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        if cfg.run.ray_address:
            ray.init(address=cfg.run.ray_address, **common)
        else:
            ray.init(address="local", num_cpus=cfg.run.ray_cpus or None,
                     _node_ip_address="127.0.0.1", **common)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise BuildError(f"cannot reach the Ray cluster at {cfg.run.ray_address or 'local'}: "
                         f"{e}") from None
    return True


def _check_reachable(address: str) -> None:
    """Fail in seconds on a HOST:PORT nobody listens on (ray.init would retry for minutes)."""
    import socket
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or address.startswith("ray://"):
        return
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as e:
        raise BuildError(f"cannot reach the Ray cluster at {address}: {e}; start it with "
                         f"`ray start --head` (docs/scale-out.md)") from None
