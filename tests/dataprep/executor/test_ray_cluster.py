"""`dataprep build --engine ray` on a two-node `ray.cluster_utils.Cluster` (both nodes on 127.0.0.1):
the same bytes as the local engine, and a node lost in the middle of the build is survived."""
from __future__ import annotations

import json
import os
import threading
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")   # Ray binds 127.0.0.1 only

import pytest  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from mspretrain.dataprep.plan.hooks import ENV as HOOKS_ENV  # noqa: E402
from ray_test_hooks import env as hooks_env  # noqa: E402
from dataprep_helpers import dataset_bytes, run_build  # noqa: E402

NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False}


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args=dict(NODE))
    c.add_node(**NODE)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def _build(corpus, out, cluster, partitions: int) -> int:
    return run_build([corpus], out, "--engine", "ray", "--ray-address", cluster.address,
                     "--set", f"run.ray_partitions={partitions}", "--set", "run.chunk_bytes=8KiB")


def test_two_nodes_give_the_local_bytes(cluster, corpus, reference, tmp_path):
    out = tmp_path / "data"
    assert _build(corpus, out, cluster, 5) == 0
    assert dataset_bytes(out) == dataset_bytes(reference)
    ray_report = json.loads((out / "report.json").read_text())["executor"]
    assert ray_report["nodes"] == 2 and ray_report["cpus"] == 2


@pytest.mark.slow
def test_a_node_lost_mid_build_is_survived(cluster, corpus, reference, tmp_path, monkeypatch):
    (worker,) = [n for n in cluster.list_all_nodes() if n is not cluster.head_node]
    flag = tmp_path / "held"
    # docs tasks that land on the second node wait there until the node is removed
    monkeypatch.setenv(HOOKS_ENV, hooks_env(f"hold:docs:{flag}:{worker.node_id}"))
    out = tmp_path / "data"
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("rc", _build(corpus, out, cluster, 3)))
    thread.start()
    deadline = time.monotonic() + 120
    while not flag.exists():
        assert thread.is_alive(), f"the build finished without a task on the second node: {result}"
        assert time.monotonic() < deadline, "no docs task reached the second node"
        time.sleep(0.05)
    cluster.remove_node(worker)   # the node dies with the task it was running
    thread.join(timeout=300)
    assert result.get("rc") == 0
    assert dataset_bytes(out) == dataset_bytes(reference)
    assert json.loads((out / "report.json").read_text())["executor"]["nodes"] == 1
