"""`dataprep build` end to end on real text: determinism across worker counts, real worker processes,
the dataset contract, provenance, dedup output, shard caps and the guards around --out."""
from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
import sentencepiece as spm

from dataprep_helpers import dataset_bytes, run_build, tree_snapshot
from mspretrain.dataprep.build import WORK_LAYOUT
from mspretrain.dataprep.steps.clean import normalize
from mspretrain.dataprep.inspection import read_sample
from mspretrain.dataprep.readers import Document, list_inputs, read_file
from mspretrain.dataprep.verify import verify_dataset
from mspretrain.dataprep.workdir import WorkDir
from mspretrain.loader.manifest import load_manifest


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 3])
def test_bytes_and_fingerprint_do_not_depend_on_workers_and_workers_are_real(
        corpus, reference, tmp_path, workers):
    out = tmp_path / "data"
    assert run_build([corpus], out, "--workers", str(workers)) == 0
    assert dataset_bytes(out) == dataset_bytes(reference)
    assert load_manifest(out).fingerprint == load_manifest(reference).fingerprint
    report = json.loads((out / "report.json").read_text())
    assert report["chunks"] >= 3 * workers           # enough work units to spread
    for stage in ("docs", "tokenize"):               # every worker process did some of each stage
        assert len(report["worker_pids"][stage]) == workers, report["worker_pids"]
    assert not (out / ".build").exists()
    one = json.loads((reference / "report.json").read_text())    # --workers 1: in the build's process
    assert one["worker_pids"] == {"docs": [os.getpid()], "tokenize": [os.getpid()]}
    assert one["executor"]["where"] == "the build's own process (run.workers 1)"


def test_reference_build_satisfies_the_contract(reference):
    m = load_manifest(reference)
    assert verify_dataset(reference) == []
    assert m.seq_length == 64 and m.tokenizer.vocab_size == 1200
    assert m.tokenizer.pad_id >= 0 and m.tokenizer.eos_id >= 0
    assert m.split("train").num_samples > 100 and m.split("valid").num_samples > 0
    assert m.config["pack"]["seq_length"] == 64 and "run" not in m.config
    scheme = m.config["dedup_scheme"]
    assert scheme["scheme"] and scheme["bands"] * scheme["rows"] <= scheme["num_perm"]
    assert [i["file"] for i in m.config["inputs"]] == [
        "en.txt", "html.jsonl.zst", "licenses/LGPL-2.1.txt.zst", "licenses/LGPL-2.txt.zst",
        "zh.txt.gz"]
    assert set(m.versions) >= {"mindspore", "sentencepiece", "pycld2", "pyarrow", "numpy"}


def test_provenance_rebuilds_every_token_of_a_sample_from_its_documents(corpus, reference):
    """Re-read and re-encode the documents provenance names; the sample's tokens must be theirs."""
    m = load_manifest(reference)
    sp = spm.SentencePieceProcessor(model_file=str(reference / "tokenizer.model"))
    prov = pq.read_table(reference / "provenance" / "train.parquet")
    assert prov.schema.names == ["sample_id", "doc_id", "doc_offset", "sample_offset", "length"]
    prov = prov.to_pylist()     # (no quality column without a quality classifier)
    texts = {d.doc_id: normalize(d.text) for inp in list_inputs([corpus])
             for d in read_file(inp, text_unit="paragraph") if isinstance(d, Document)}
    split = m.split("train")
    for sample in (0, split.num_samples // 2, split.num_samples - 1):
        k, row = split.locate(sample)
        ids, sid = read_sample(m.shard_path(split.shards[k]), row)
        assert sid == sample
        pieces = sorted((r for r in prov if r["sample_id"] == sample),
                        key=lambda r: r["sample_offset"])
        assert sum(r["length"] for r in pieces) == m.seq_length + 1
        for r in pieces:
            doc = sp.encode(texts[r["doc_id"]]) + [m.tokenizer.eos_id]
            want = doc[r["doc_offset"]:r["doc_offset"] + r["length"]]
            assert ids[r["sample_offset"]:r["sample_offset"] + r["length"]].tolist() == want


def test_dedup_output_names_kept_documents_that_are_in_the_dataset(reference):
    dups = pq.read_table(reference / "dedup" / "duplicates.parquet").to_pylist()
    kinds = {d["kind"] for d in dups}
    assert kinds == {"exact", "near"}, kinds       # the corpus holds both, naturally
    for d in dups:
        assert d["doc_id"] != d["kept_doc_id"]
        assert 0.8 <= d["similarity"] <= 1.0
        if d["kind"] == "exact":
            assert d["similarity"] == 1.0
    kept = {r["doc_id"] for name in ("train", "valid")
            for r in pq.read_table(reference / "provenance" / f"{name}.parquet").to_pylist()}
    dropped = {d["doc_id"] for d in dups}
    assert not kept & dropped
    report = json.loads((reference / "report.json").read_text())
    st = report["stages"]
    assert st["dedup"]["exact"]["docs"] == sum(d["kind"] == "exact" for d in dups)
    assert st["dedup"]["docs_out"] == st["dedup"]["docs_in"] - len(dups)
    assert st["filter"]["docs_in"] - st["filter"]["docs_out"] == sum(
        f["docs"] for f in st["filter"]["removed_by"].values())


def test_shards_stay_under_a_small_cap_with_contiguous_sample_ids(corpus, tmp_path):
    out = tmp_path / "data"
    cap = 250_000
    assert run_build([corpus], out, "--max-shard-bytes", "250kB") == 0
    m = load_manifest(out)
    train = m.split("train")
    assert len(train.shards) >= 3
    for s in train.shards:
        size = (out / s.file).stat().st_size + (out / f"{s.file}.db").stat().st_size
        assert size == s.bytes <= cap
    assert verify_dataset(out) == []              # reads every sample_id: contiguous from 0
    last = train.shards[-1]
    ids, sid = read_sample(out / last.file, last.num_samples - 1)
    assert sid == train.num_samples - 1 and ids.dtype == np.int32


def test_rerun_of_a_finished_build_is_a_no_op(corpus, reference, capsys):
    before = tree_snapshot(reference)
    assert run_build([corpus], reference, "--workers", "1") == 0
    assert "already holds this dataset" in capsys.readouterr().out
    assert tree_snapshot(reference) == before


def test_out_holding_a_different_dataset_is_refused_and_untouched(corpus, reference, capsys):
    before = tree_snapshot(reference)
    assert run_build([corpus], reference, "--dedup-threshold", "0.9") == 1
    assert "different dataset" in capsys.readouterr().err
    assert tree_snapshot(reference) == before


def test_unfinished_build_with_another_config_is_refused_and_untouched(corpus, tmp_path, capsys):
    out = tmp_path / "data"
    WorkDir(out).create({"config": {"pack": {"seq_length": 7}}, "chunk_bytes": 1,
                         "layout": WORK_LAYOUT})
    (out / ".build" / "docs" / "00000.json").write_text("{}")
    before = tree_snapshot(out)
    assert run_build([corpus], out) == 1
    assert "unfinished build with a different config" in capsys.readouterr().err
    assert tree_snapshot(out) == before


def test_out_holding_other_files_is_refused(corpus, tmp_path, capsys):
    out = tmp_path / "data"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert run_build([corpus], out) == 1
    assert "not a dataset built by dataprep" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_missing_input_path_is_a_clear_error_and_nothing_is_written(corpus, tmp_path, capsys):
    out = tmp_path / "data"
    assert run_build([corpus, tmp_path / "nope"], out) == 1
    assert "nope" in capsys.readouterr().err
    assert not out.exists()


def test_corpus_empty_after_filtering_is_a_clear_error(corpus, tmp_path, capsys):
    out = tmp_path / "data"
    assert run_build([corpus / "en.txt"], out, "--set", "filters.min_chars=900000") == 1
    err = capsys.readouterr().err
    assert "no documents left after filtering" in err
    # only the failure report is left; a rerun replaces it and starts afresh
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]


def test_too_little_text_for_one_sample_is_a_clear_error(corpus, tmp_path, capsys):
    out = tmp_path / "data"
    assert run_build([corpus / "html.jsonl.zst"], out, "--seq-length", "200000",
                     "--max-shard-bytes", "64MB") == 1
    assert "fewer than seq_length + 1 = 200001 tokens" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]
    assert '"failed": true' in (out / "report.json").read_text()


def test_the_local_executor_returns_results_in_task_order_and_names_a_failed_stage():
    """Tasks that finish out of order come back in task order, counted per stage; a task's own
    BuildError reaches the caller unchanged, any other failure names its stage."""
    from dataprep_helpers import sleepy_task
    from mspretrain.dataprep.errors import BuildError
    from mspretrain.dataprep.executor.local import LocalExecutor, WorkerPool
    with WorkerPool(2) as pool:
        ex = LocalExecutor(pool, progress=False)
        results = ex.run("sleepy", sleepy_task, [(0.6, "a"), (0.0, "b"), (0.3, "c")])
        assert [r["value"] for r in results] == ["a", "b", "c"]
        assert len({r["pid"] for r in results}) == 2       # both workers ran tasks
        assert ex.tasks == {"sleepy": 3} and ex.reused == {"sleepy": 0}
        with pytest.raises(BuildError, match="^a.jsonl: line 3 is bad$"):
            ex.run("reading", sleepy_task, [(0.0, "build-error")])
        with pytest.raises(BuildError, match="^stage sums: ZeroDivisionError"):
            ex.run("sums", sleepy_task, [(0.0, "zero")])


def test_with_eos_puts_each_document_then_eos_back_to_back():
    from mspretrain.dataprep.plan.chunks import _with_eos
    docs = [np.array([5, 6, 7], np.int32), np.zeros(0, np.int32), np.array([9], np.int32)]
    tokens, lens = _with_eos(docs, 2)
    assert tokens.tolist() == [5, 6, 7, 2, 2, 9, 2] and tokens.dtype == np.int32
    assert lens.tolist() == [4, 1, 2]
    tokens, lens = _with_eos([], 2)
    assert tokens.size == 0 and lens.size == 0


def test_pyarrow_uses_malloc_in_build_processes_unless_told_otherwise():
    """pyarrow's own pool keeps freed chunk tables' memory (peak RSS, bench_dataprep.py). The CLI
    chooses malloc; importing the package changes nothing in the caller's process."""
    import os
    import subprocess
    import sys
    code = ("import os, mspretrain.dataprep, mspretrain.dataprep.config; unset = 'ARROW_DEFAULT_MEMORY_POOL' not in os.environ; "
            "from mspretrain.dataprep.cli import main; main(['verify', 'no-such-dir']); "
            "import pyarrow as pa; print(unset, pa.default_memory_pool().backend_name)")
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[-2:] == ["True", "system"]


def test_unfinished_build_of_another_work_layout_is_refused_and_untouched(tmp_path, capsys):
    """A build stopped under an older dataprep (its intermediate files laid out differently) is not
    resumed half-way: the rerun names the layouts and touches nothing."""
    src = tmp_path / "in"
    src.mkdir()
    (src / "bad.jsonl").write_text('{"text": "fine"}\nnot json\n')
    out = tmp_path / "data"
    assert run_build([src], out, "--strict") == 1          # stops in stage 1: the work dir stays
    owner = json.loads((out / ".build" / "build.json").read_text())
    assert owner["layout"] == WORK_LAYOUT
    owner["layout"] = WORK_LAYOUT - 1
    (out / ".build" / "build.json").write_text(json.dumps(owner))
    capsys.readouterr()
    before = tree_snapshot(out)
    assert run_build([src], out, "--strict") == 1
    err = capsys.readouterr().err
    assert f"work dir layout {WORK_LAYOUT - 1}, this version's is {WORK_LAYOUT}" in err
    assert tree_snapshot(out) == before
