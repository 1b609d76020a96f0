"""`dataprep build --engine ray` on one local Ray instance (started once for the module, bound to
127.0.0.1): the same bytes as `--engine local` for several partition and chunk settings, a Ray worker
killed mid-task, the driver killed and the command rerun, a local build resumed on Ray, and bad
input counted as locally."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")   # Ray binds 127.0.0.1 only

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import pytest  # noqa: E402
import ray  # noqa: E402

from mspretrain.dataprep.cli import main as dataprep_main  # noqa: E402
from mspretrain.dataprep.plan.hooks import ENV as HOOKS_ENV  # noqa: E402
from ray_test_hooks import env as hooks_env  # noqa: E402
from dataprep_helpers import (DEMO, REPO, TEST_SETTINGS, dataset_bytes, run_build,  # noqa: E402
                              write_messy_corpus)

DEMO_CONFIG = REPO / "configs" / "dataprep-demo.yaml"


@pytest.fixture(scope="module")
def ray_address():
    ctx = ray.init(address="local", num_cpus=2, _node_ip_address="127.0.0.1",
                   include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ctx.address_info["gcs_address"]
    ray.shutdown()


def _demo_build(out, *extra) -> int:
    return dataprep_main(["build", str(DEMO), "--out", str(out), "--config", str(DEMO_CONFIG),
                          "--no-progress", *extra])


@pytest.fixture(scope="module")
def demo_local(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo-local") / "data"
    assert _demo_build(out) == 0
    return out


def _report(out) -> dict:
    return json.loads((out / "report.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("partitions,chunk,union_find", [(1, "1MiB", True), (3, "64KiB", True),
                                                      (8, "16KiB", False)])
def test_demo_corpus_gives_the_local_bytes_for_any_partitioning(ray_address, demo_local, tmp_path,
                                                                partitions, chunk, union_find):
    out = tmp_path / "data"
    edges = 10**9 if union_find else 0   # 0: components by min-label rounds
    assert _demo_build(out, "--engine", "ray", "--set", f"run.ray_partitions={partitions}",
                       "--set", f"run.chunk_bytes={chunk}",
                       "--set", f"run.ray_union_find_edges={edges}") == 0
    assert dataset_bytes(out) == dataset_bytes(demo_local)   # manifest, shards, .db, provenance, dups
    rep, local = _report(out), _report(demo_local)
    assert rep["stages"] == local["stages"] and rep["bad_records"] == local["bad_records"]
    for key in ("token_length_histogram", "token_rank_frequency", "inputs", "languages", "pii",
                "decontam"):
        assert rep[key] == local[key], key
    for picture in local["plots"]:     # the same data draws the same pixels
        assert (out / picture).read_bytes() == (demo_local / picture).read_bytes(), picture
    assert rep["executor"]["partitions"] == partitions and rep["executor"]["cpus"] == 2
    assert rep["executor"]["tasks"]["replay"] == partitions
    if union_find:
        assert rep["executor"]["tasks"]["components"] == 1 and "labels" not in rep["executor"]["tasks"]
    else:   # several rounds of one task per partition
        assert rep["executor"]["tasks"]["labels"] >= 2 * partitions and "components" not in rep["executor"]["tasks"]
    assert rep["executor"]["tasks"]["docs"] == rep["stages"]["read"]["files"]   # one unit per file
    assert rep["stages"]["dedup"]["near"]["docs"] > 0 and rep["stages"]["dedup"]["exact"]["docs"] > 0


@pytest.mark.parametrize("stage", ["docs", "write"])
def test_a_worker_killed_mid_task_is_retried_and_the_bytes_are_unchanged(ray_address, corpus,
                                                                        reference, tmp_path,
                                                                        monkeypatch, stage):
    flag = tmp_path / "killed"
    monkeypatch.setenv(HOOKS_ENV, hooks_env(f"kill:{stage}:{flag}"))
    out = tmp_path / "data"
    assert run_build([corpus], out, "--engine", "ray", "--set", "run.ray_partitions=2") == 0
    assert flag.exists()   # a task really killed its own worker process (SIGKILL) mid-task
    assert dataset_bytes(out) == dataset_bytes(reference)


@pytest.mark.slow
def test_a_local_build_whose_worker_died_resumes_on_ray(ray_address, corpus, reference, tmp_path,
                                                       monkeypatch):
    """Both engines run one plan over one work dir: what the local build finished, Ray reuses."""
    flag = tmp_path / "killed"
    monkeypatch.setenv(HOOKS_ENV, hooks_env(f"kill:tokenize:{flag}"))
    out = tmp_path / "data"
    assert run_build([corpus], out, "--workers", "2") == 1     # a worker died: stopped, work kept
    assert flag.exists() and (out / ".build").is_dir() and not (out / "manifest.json").exists()
    monkeypatch.delenv(HOOKS_ENV)
    assert run_build([corpus], out, "--engine", "ray", "--ray-address", ray_address) == 0
    ex = _report(out)["executor"]
    assert ex["engine"] == "ray" and ex["tasks_reused"]["docs"] == ex["units"]
    assert ex["tasks_reused"]["settle"] == ex["units"]      # dedup was not redone either
    assert dataset_bytes(out) == dataset_bytes(reference)


def _start_driver(corpus, out, address) -> subprocess.Popen:
    argv = [sys.executable, "-m", "mspretrain.dataprep", "build", str(corpus), "--out", str(out),
            *TEST_SETTINGS, "--engine", "ray", "--ray-address", address,
            "--set", "run.ray_partitions=3", "--set", "run.chunk_bytes=4KiB"]
    return subprocess.Popen(argv, cwd=REPO, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_driver_sigkilled_then_rerun_resumes_from_completed_stages(ray_address, corpus, reference,
                                                                  tmp_path):
    out = tmp_path / "data"
    done = out / ".build" / "plan" / "done"
    proc = _start_driver(corpus, out, ray_address)
    deadline = time.monotonic() + 180
    while not list(done.glob("groups-*.json")) if done.is_dir() else True:
        if proc.poll() is not None:
            pytest.fail(f"build ended before it could be killed: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail("build made no progress")
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists()
    units = len(list(done.glob("docs-*.json")))
    assert units == 5   # every docs task had finished before the groups stage started

    assert run_build([corpus], out, "--engine", "ray", "--ray-address", ray_address,
                     "--set", "run.ray_partitions=3", "--set", "run.chunk_bytes=4KiB") == 0
    assert dataset_bytes(out) == dataset_bytes(reference)
    rep = _report(out)
    reused = rep["executor"]["tasks_reused"]
    assert reused["docs"] == units and reused["ids"] == 3
    assert reused["tokenize"] == 0
    assert rep["stages"] == _report(reference)["stages"]
    assert not (out / ".build").exists()


@pytest.fixture(scope="module")
def messy(corpus, tmp_path_factory):
    """Bad records of several kinds, a duplicated doc id, and an id reused inside one file."""
    good = "Debian keeps a record of every file installed by each program, entry {n}."
    lines = [json.dumps({"id": "good-1", "text": good.format(n=1)}).encode(),
             b'{"id": "broken", "text": "no closing brace"',
             json.dumps({"id": "no-text", "body": "x"}).encode(),
             b'{"id": "latin1", "text": "caf\xe9"}',
             json.dumps({"id": "good-1", "text": good.format(n=3)}).encode(),
             json.dumps({"id": "good-2", "text": good.format(n=2)}).encode()]
    root = write_messy_corpus(tmp_path_factory.mktemp("messy-ray"), corpus, good, lines, 2000)
    (root / "d.jsonl").write_text(json.dumps({"id": "good-2", "text": good.format(n=9)}) + "\n")
    # a larger plain jsonl file, cut into several work units, with bad lines and doc ids by line
    en = [p for p in (corpus / "en.txt").read_text().split("\n\n") if len(p) > 40][:300]
    rows = [json.dumps({"text": p}).encode() if k % 37 else b'{"text": 1' for k, p in enumerate(en)]
    (root / "e.jsonl").write_bytes(b"\n".join(rows) + b"\n\n" + rows[5] + b"\n")
    # a parquet file of many row groups, cut into several units, with null texts (bad rows)
    texts = [None if k % 41 == 3 else p for k, p in enumerate(en[:200])]
    pq.write_table(pa.table({"text": texts}), root / "f.parquet", row_group_size=16)
    return root


@pytest.mark.slow
def test_bad_input_is_counted_as_locally_and_strict_names_file_and_line(ray_address, messy,
                                                                       tmp_path, capsys):
    local, distributed = tmp_path / "local", tmp_path / "ray"
    assert run_build([messy], local) == 0
    assert run_build([messy], distributed, "--engine", "ray", "--set", "run.ray_partitions=3",
                     "--set", "run.ray_unit_bytes=8KiB") == 0
    rep, ref = _report(distributed), _report(local)
    # e.jsonl and f.parquet were cut into parts
    assert rep["executor"]["units"] >= rep["stages"]["read"]["files"] + 2
    assert rep["executor"]["tasks"]["plan"] == 2
    assert rep["bad_records"]["e.jsonl"]["invalid_json"][0] >= 2
    assert rep["bad_records"]["f.parquet"]["missing_text_field"][0] == 5
    assert rep["bad_records"] == ref["bad_records"]
    assert rep["bad_records"]["a.jsonl"]["duplicate_doc_id"][0] == 1
    assert rep["bad_records"]["d.jsonl"]["duplicate_doc_id"][0] == 1
    assert rep["stages"] == ref["stages"] and rep["stages"]["read"]["bad_records"] >= 5
    assert dataset_bytes(distributed) == dataset_bytes(local)
    capsys.readouterr()

    errors = []
    for engine in ("local", "ray"):
        assert run_build([messy], tmp_path / f"strict-{engine}", "--strict", "--engine", engine) == 1
        errors.append(capsys.readouterr().err)
    assert "a.jsonl:2: invalid_json" in errors[0] and errors[0] == errors[1]


@pytest.mark.slow
def test_without_an_address_the_build_starts_its_own_ray_on_loopback_only(corpus, reference,
                                                                          tmp_path):
    import psutil
    out = tmp_path / "data"
    argv = [sys.executable, "-m", "mspretrain.dataprep", "build", str(corpus), "--out", str(out),
            *TEST_SETTINGS, "--engine", "ray", "--set", "run.ray_cpus=1"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"}
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    listening = set()
    while proc.poll() is None:   # every listening socket of the build's process tree, sampled
        try:
            tree = {proc.pid} | {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.Error:
            break
        listening |= {c.laddr.ip for c in psutil.net_connections("inet")
                      if c.status == psutil.CONN_LISTEN and c.pid in tree}
        time.sleep(0.2)
    assert proc.wait() == 0, proc.stderr.read()
    assert listening and listening <= {"127.0.0.1", "::ffff:127.0.0.1"}, listening
    assert dataset_bytes(out) == dataset_bytes(reference)
    assert json.loads((out / "report.json").read_text())["executor"]["cpus"] == 1


def test_an_unreachable_cluster_is_a_clear_error(corpus, tmp_path, capsys):
    out = tmp_path / "data"
    assert run_build([corpus], out, "--engine", "ray", "--ray-address", "127.0.0.1:1") == 1
    assert "cannot reach the Ray cluster at 127.0.0.1:1" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.slow
def test_every_document_stage_gives_the_local_bytes(ray_address, corpus, tmp_path):
    """Quality classifier (its score in the provenance), decontamination by cut, PII and language
    ID on: the Ray build equals the local one byte for byte."""
    from mspretrain.dataprep.steps.quality import train
    paras = [p for p in (corpus / "en.txt").read_text().split("\n\n") if len(p) > 200]
    junk = ["".join(chr(0x41 + (i * 7 + k * 13) % 50) for k in range(300)) for i in range(40)]
    model = tmp_path / "q.bin"
    train(paras[::3], junk, steps=60).save(model)
    evals = tmp_path / "eval.jsonl"
    evals.write_text("".join(json.dumps({"text": " ".join(paras[k].split()[5:45])}) + "\n"
                             for k in (5, 15, 25, 35)))
    sets = ["--set", f"filters.quality.model={model}", "--set", "filters.quality.threshold=0.2",
            "--set", "decontam.action=cut", "--decontaminate", str(evals)]
    local, distributed = tmp_path / "local", tmp_path / "ray"
    assert run_build([corpus], local, *sets) == 0
    assert run_build([corpus], distributed, *sets, "--engine", "ray",
                     "--set", "run.ray_partitions=3") == 0
    assert dataset_bytes(distributed) == dataset_bytes(local)
    rep = _report(local)
    assert rep["decontam"]["docs_cut"] >= 1 and rep["decontam"]["matches"]
    assert "quality" in pq.read_table(local / "provenance" / "train.parquet").schema.names


def test_a_format_registered_in_this_process_only_is_refused_naming_it(ray_address, tmp_path,
                                                                       capsys):
    """Ray workers never import a module the driver's process imported: they would read the file
    as plain text. Such a format fails the build (docs/extending.md: register it by entry point)."""
    from mspretrain.dataprep.readers import register, registry
    from mspretrain.dataprep.records import Document
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.lines").write_text("Debian keeps a record of every file installed by a package.\n")
    saved = dict(registry._BY_SUFFIX)

    @register(".lines")
    def read_lines(inp, stream, opts):
        for line, raw in enumerate(stream, start=1):
            yield Document(f"{inp.rel}:{line}", raw.decode(), inp.rel)
    try:
        assert run_build([src], tmp_path / "data", "--engine", "ray") == 1
    finally:
        registry._BY_SUFFIX.clear()
        registry._BY_SUFFIX.update(saved)
    assert ("input format lines is registered in this process only: Ray workers read the files "
            "and cannot see it; register it through a mspretrain.readers entry point"
            in capsys.readouterr().err)


LINES_PLUGIN = '''
from mspretrain.dataprep.readers import register
from mspretrain.dataprep.records import Document


@register(".lines")
def read_lines(inp, stream, opts):
    for line, raw in enumerate(stream, start=1):
        yield Document(f"{inp.rel}:{line}", raw.decode(), inp.rel)
'''


def test_a_worker_without_the_drivers_reader_plugin_fails_the_build_naming_it(ray_address, corpus,
                                                                              tmp_path, capsys):
    """The driver loads a plugin by entry point, this instance's workers (started before, without
    it on their path) cannot: they would read the file as plain text, so the unit fails instead."""
    from mspretrain.dataprep.readers import registry
    plugin = tmp_path / "plugin"
    (plugin / "lines_plugin-1.0.dist-info").mkdir(parents=True)
    (plugin / "lines_plugin.py").write_text(LINES_PLUGIN)
    (plugin / "lines_plugin-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: lines-plugin\nVersion: 1.0\n")
    (plugin / "lines_plugin-1.0.dist-info" / "entry_points.txt").write_text(
        "[mspretrain.readers]\nlines = lines_plugin\n")
    src = tmp_path / "in"
    src.mkdir()
    (src / "en.txt").write_bytes((corpus / "en.txt").read_bytes())
    (src / "b.lines").write_text("Debian keeps a record of every file installed by a package.\n")
    saved = dict(registry._BY_SUFFIX), dict(registry._plugins)
    sys.path.insert(0, str(plugin))
    registry._plugins.clear()
    try:
        assert run_build([src], tmp_path / "data", "--engine", "ray") == 1
    finally:
        sys.path.remove(str(plugin))
        sys.modules.pop("lines_plugin", None)
        for table, old in zip((registry._BY_SUFFIX, registry._plugins), saved):
            table.clear()
            table.update(old)
    assert ("b.lines:0: reader_missing: read as lines by the driver but as text by a Ray worker"
            in capsys.readouterr().err)
