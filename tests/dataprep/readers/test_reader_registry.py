"""The readers' registry by suffix, and the worked example of docs/extending.md (a CSV reader, taken
from the page itself): registered in this process it is read by the local engine; named by a
`mspretrain.readers` entry point it is read by the `dataprep` command, its worker processes and
Ray's workers, with the same bytes; a plugin that fails to import, or a format the Ray workers
cannot see, fails the build naming it."""
from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dataprep_helpers import DEMO, REPO, TEST_SETTINGS, dataset_bytes, run_build
from mspretrain.dataprep.readers import (InputFile, file_format, read_file, register, registry,
                                         this_process_only)
from mspretrain.dataprep.records import Document


def _example_source() -> str:
    """The first python block of the section "A new input format" of docs/extending.md."""
    page = (REPO / "docs" / "extending.md").read_text()
    section = page[page.index("## A new input format"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@contextmanager
def _registry_kept():
    """The registry as it was, restored afterwards (a format registered meanwhile is forgotten)."""
    saved = dict(registry._BY_SUFFIX), dict(registry._DEFAULT), dict(registry._plugins)
    try:
        yield
    finally:
        for table, old in zip((registry._BY_SUFFIX, registry._DEFAULT, registry._plugins), saved):
            table.clear()
            table.update(old)


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory) -> Path:
    """The example as an installed package: my_formats/csv_format.py and a dist-info whose entry
    point names it (what `pip install` of a package with that entry point leaves)."""
    root = tmp_path_factory.mktemp("plugin")
    (root / "my_formats").mkdir()
    (root / "my_formats" / "__init__.py").write_text("")
    (root / "my_formats" / "csv_format.py").write_text(_example_source())
    info = root / "my_formats-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-formats\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[mspretrain.readers]\ncsv = my_formats.csv_format\n")
    return root


@pytest.fixture(scope="module")
def csv_corpus(tmp_path_factory) -> Path:
    """a.csv: ids and English paragraphs, row 5 not UTF-8; b.csv.gz: Chinese paragraphs, no id
    column, gzip-compressed and cut short."""
    root = tmp_path_factory.mktemp("csv_corpus")
    en = [p for p in gzip.decompress((DEMO / "debian-reference.en.txt.gz").read_bytes())
          .decode().split("\n\n") if len(p) > 200][:300]
    zh = [p for p in gzip.decompress((DEMO / "debian-reference.zh-cn.txt.gz").read_bytes())
          .decode().split("\n\n") if len(p) > 100][:300]
    head, tail = _csv([["id", "text"]] + [[f"en-{i}", p] for i, p in enumerate(en[:4])]), \
        _csv([f"en-{i}", p] for i, p in enumerate(en[4:], start=4))
    (root / "a.csv").write_bytes(head + b'en-bad,"caf\xe9"\n' + tail)   # row 5: not UTF-8
    whole = gzip.compress(_csv([["text"]] + [[p] for p in zh]), mtime=0)
    (root / "b.csv.gz").write_bytes(whole[: len(whole) * 3 // 4])
    return root


def _csv(rows) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue().encode()


@pytest.fixture(scope="module")
def in_process_build(plugin_dir, csv_corpus, tmp_path_factory) -> Path:
    """The example imported into this process (its @register runs), the corpus built in this
    process by the local engine, and the example forgotten."""
    out = tmp_path_factory.mktemp("in_process") / "data"
    with _registry_kept():
        spec = importlib.util.spec_from_file_location("csv_format_example",
                                                      plugin_dir / "my_formats" / "csv_format.py")
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
        assert run_build([csv_corpus], out, "--workers", "2") == 0
    return out


def _kept_ids(out: Path) -> set[str]:
    """The doc ids of the dataset: kept, or dropped as duplicates."""
    tables = [out / "provenance" / "train.parquet", out / "provenance" / "valid.parquet",
              out / "dedup" / "duplicates.parquet"]
    return {r["doc_id"] for t in tables for r in pq.read_table(t, columns=["doc_id"]).to_pylist()}


def _build(corpus: Path, out: Path, plugins: Path, *extra: str) -> subprocess.CompletedProcess:
    """The `dataprep` command in a fresh process, with `plugins` first on its PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugins), str(REPO),
                                                       os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "mspretrain.dataprep", "build", str(corpus),
                           "--out", str(out), *TEST_SETTINGS, *extra],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def registry_kept():
    with _registry_kept():
        yield


def test_formats_by_suffix_and_conflicts_are_errors(tmp_path, registry_kept):
    assert file_format(Path("a.JSONL.GZ")) == ("jsonl", "gzip")
    assert file_format(Path("x.y.ndjson.zst")) == ("jsonl", "zstd")
    assert file_format(Path("a.parquet")) == ("parquet", None)
    assert file_format(Path("notes.md")) == ("text", None) == file_format(Path("README"))

    @register(".TSV")
    def read_tsv(inp, stream, opts):
        for line, raw in enumerate(stream, start=1):
            yield Document(f"{inp.rel}:{line}", raw.decode().split("\t")[-1], inp.rel)

    assert file_format(Path("t.tsv.zst")) == ("tsv", "zstd")
    path = tmp_path / "t.tsv"
    path.write_bytes(b"1\tone\n2\ttwo\n")
    assert [d.text for d in read_file(InputFile(path, "t.tsv"))] == ["one\n", "two\n"]
    register(".tsv")(read_tsv)     # the same format again (a module imported twice): no error
    with pytest.raises(ValueError, match=r"reader 'other' \(.*read_tsv\): suffix \.tsv is already "
                                         r"read by 'tsv' \(test_reader_registry\..*read_tsv\)"):
        register(".psv", ".tsv", name="other")(read_tsv)
    assert file_format(Path("t.psv")) == ("text", None)    # nothing taken by a refused register
    with pytest.raises(ValueError, match=r"suffix \.jsonl is already read by 'jsonl' "
                                         r"\(mspretrain\.dataprep\.readers\.jsonl\.read_jsonl\)"):
        register(".jsonl", name="jsonl")(read_tsv)     # a built-in is never replaced by its name
    with pytest.raises(ValueError, match="'.gz' is not a format suffix"):
        register(".gz", name="gz")(read_tsv)
    with pytest.raises(ValueError, match="the default format is already read by 'text'"):
        register(default=True, name="other")(read_tsv)
    # registered in this process only: the Ray engine's workers would read .tsv as text
    assert this_process_only([path, tmp_path / "a.jsonl"]) == ["tsv"]


def test_the_example_registered_in_process_is_read_by_the_local_engine(in_process_build):
    out = in_process_build
    bad = json.loads((out / "report.json").read_text())["bad_records"]
    assert {f: sorted(reasons) for f, reasons in bad.items()} == {
        "a.csv": ["invalid_utf8"], "b.csv.gz": ["truncated_compressed"]}
    assert bad["a.csv"]["invalid_utf8"][:2] == [1, 5]
    assert bad["b.csv.gz"]["truncated_compressed"][1] > 150   # the rows before the cut are read
    ids = _kept_ids(out)
    assert {"en-0", "en-3", "en-4", "en-299", "b.csv.gz:1", "b.csv.gz:150"} <= ids
    assert "en-bad" not in ids and "a.csv:1" not in ids   # not read as plain text


@pytest.fixture(scope="module")
def entry_point_build(csv_corpus, plugin_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("entry_point") / "data"
    proc = _build(csv_corpus, out, plugin_dir, "--workers", "2")
    assert proc.returncode == 0, proc.stderr
    return out


def test_the_example_as_an_entry_point_is_read_by_the_dataprep_command(entry_point_build,
                                                                        in_process_build):
    assert dataset_bytes(entry_point_build) == dataset_bytes(in_process_build)


def test_a_plugin_that_fails_to_import_fails_the_build_naming_it(csv_corpus, tmp_path):
    info = tmp_path / "broken-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[mspretrain.readers]\ncsv = no_such_module\n")
    proc = _build(csv_corpus, tmp_path / "data", tmp_path)
    assert proc.returncode == 1
    assert ("reader plugin csv = no_such_module (entry point group mspretrain.readers) failed to "
            "load: ModuleNotFoundError") in proc.stderr
    assert not (tmp_path / "data" / "manifest.json").exists()


@pytest.mark.slow
def test_ray_workers_load_the_entry_point_and_give_the_same_bytes(entry_point_build, csv_corpus,
                                                                  plugin_dir, tmp_path):
    out = tmp_path / "data"
    proc = _build(csv_corpus, out, plugin_dir, "--engine", "ray", "--set", "run.ray_cpus=1")
    assert proc.returncode == 0, proc.stderr
    assert dataset_bytes(out) == dataset_bytes(entry_point_build)
