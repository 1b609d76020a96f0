"""Each process that runs the plan's chunk functions keeps one Worker (plan/worker.py), which
`worker_for(ctx)` gives every task: the same one while the build's setup stays the same."""
from __future__ import annotations

import os

from dataprep_helpers import worker_task
from mspretrain.dataprep.config import load_build_config
from mspretrain.dataprep.executor.local import LocalExecutor, WorkerPool
from mspretrain.dataprep.plan.layout import Ctx
from mspretrain.dataprep.plan.worker import worker_for


def test_worker_for_gives_a_process_one_worker_per_setup(tmp_path):
    cfg = load_build_config()
    ctx = Ctx(str(tmp_path), cfg, partitions=1)
    first = worker_for(ctx)
    assert worker_for(ctx) is first
    assert worker_for(Ctx(str(tmp_path), cfg, partitions=4)) is first    # not part of the setup
    other = worker_for(Ctx(str(tmp_path), load_build_config(overrides={"pack.split_seed": 9}), 1))
    assert other is not first and other.setup.split_seed == 9
    # one Worker a process: serving the first build again starts afresh, nothing of it was kept
    assert worker_for(ctx) is not first and worker_for(ctx).setup == first.setup


def test_every_task_in_a_worker_process_gets_that_processs_worker(tmp_path):
    ctx = Ctx(str(tmp_path), load_build_config(), partitions=1)
    with WorkerPool(2) as pool:
        results = LocalExecutor(pool, progress=False).run("worker", worker_task, [(ctx,)] * 8)
    workers: dict = {}
    for r in results:
        workers.setdefault(r["pid"], set()).add(r["worker"])
    assert os.getpid() not in workers
    assert all(len(ids) == 1 for ids in workers.values()), workers
