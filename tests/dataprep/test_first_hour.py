"""What a new user meets first: binary files in the input, a missing text field, a vocabulary the
corpus cannot fill, stray files in a finished dataset, and file modes."""
from __future__ import annotations

import json
import shutil
import sys

import pyarrow.parquet as pq
import pytest

from dataprep_helpers import run_build


@pytest.fixture(scope="module")
def with_binary(corpus, tmp_path_factory):
    """The test corpus plus a real executable, once under a binary name and once as notes.txt."""
    root = tmp_path_factory.mktemp("with_binary")
    shutil.copyfile(corpus / "en.txt", root / "en.txt")
    shutil.copyfile(sys.executable, root / "python.bin")
    shutil.copyfile(sys.executable, root / "notes.txt")
    return root


def test_binary_files_are_skipped_whole_and_named(with_binary, tmp_path, capsys):
    out = tmp_path / "data"
    assert run_build([with_binary], out) == 0
    console = capsys.readouterr().out
    report = json.loads((out / "report.json").read_text())
    for name in ("python.bin", "notes.txt"):
        assert list(report["bad_records"][name]) == ["binary_file"]
        assert "ELF" in report["skipped_files"][name]
        assert f"skipped {name}" in console
        assert report["inputs"][name] == {"docs_read": 0, "docs_kept": 0, "tokens": 0, "samples": 0}
    # no fragment of the executables reached the dataset
    sources = {r["doc_id"].split(":")[0] for s in ("train", "valid")
               for r in pq.read_table(out / "provenance" / f"{s}.parquet").to_pylist()}
    assert sources == {"en.txt"}
    en = report["inputs"]["en.txt"]
    assert en["docs_kept"] > 0 and en["samples"] == sum(
        p["samples"] for p in report["stages"]["pack"].values())
    assert en["tokens"] == sum(report["stages"]["tokenize"]["tokens"].values())
    md = (out / "report.md").read_text()
    assert "## Input files" in md and "| notes.txt | 0 | 0 | 0 | 0 |" in md


def test_binary_detection_by_content():
    from mspretrain.dataprep.readers.binary import binary_reason
    assert "ELF" in binary_reason(open(sys.executable, "rb").read(1 << 16))
    assert "NUL" in binary_reason(b"plain text\x00more")
    assert "UTF-8" in binary_reason(bytes(range(128, 256)) * 4)
    assert binary_reason("café crème, naïve résumé\n".encode() * 100) is None
    assert binary_reason("Latin-1 café au lait. ".encode("latin-1") * 50) is None   # a few bad bytes
    assert binary_reason(b"") is None


def test_missing_text_field_is_named_with_the_key_to_set_and_a_report_is_written(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    body = ("Debian keeps a record of every file installed by each program, so removing software "
            "later leaves the computer as it was. Entry {n}, with some more words in it.")
    (corpus / "x.jsonl").write_text("".join(json.dumps({"uid": f"d{n}", "body": body.format(n=n)})
                                            + "\n" for n in range(500)))
    out = tmp_path / "data"
    assert run_build([corpus], out) == 1
    err = capsys.readouterr().err
    assert "500 record(s) in x.jsonl have no 'text' field" in err
    assert "input.text_field" in err
    report = json.loads((out / "report.json").read_text())
    assert report["failed"] and report["bad_records"]["x.jsonl"]["missing_text_field"][0] == 500
    assert "missing_text_field" in (out / "report.md").read_text()
    # the same DIR then builds with the fields set (the failure report does not block it)
    assert run_build([corpus], out, "--text-field", "body", "--id-field", "uid",
                     "--vocab-size", "300", "--seq-length", "16") == 0
    report = json.loads((out / "report.json").read_text())
    assert "failed" not in report and report["inputs"]["x.jsonl"]["docs_read"] == 500
    kept = {r["doc_id"] for r in pq.read_table(out / "provenance" / "train.parquet").to_pylist()}
    assert "d0" in kept or "d1" in kept


def test_a_vocabulary_the_corpus_cannot_fill_is_fitted_with_a_warning(corpus, tmp_path, capsys):
    out = tmp_path / "data"
    assert run_build([corpus / "en.txt"], out, "--vocab-size", "32000") == 0
    err = capsys.readouterr().err
    assert "tokenizer.vocab_size=32000 is more than this corpus can fill" in err
    manifest = json.loads((out / "manifest.json").read_text())
    fitted = manifest["tokenizer"]["vocab_size"]
    assert 100 < fitted < 32000 and f"largest size that works, {fitted}" in err
    report = json.loads((out / "report.json").read_text())
    assert report["tokenizer"] == {"vocab_size": fitted, "type": "unigram",
                                   "vocab_size_requested": 32000}
    # deterministic: the same build again gives the same tokenizer
    again = tmp_path / "again"
    assert run_build([corpus / "en.txt"], again, "--vocab-size", "32000") == 0
    assert (again / "tokenizer.model").read_bytes() == (out / "tokenizer.model").read_bytes()


def test_temporary_files_of_an_interrupted_step_never_reach_the_dataset(corpus, tmp_path,
                                                                         monkeypatch):
    import ray_test_hooks
    from mspretrain.dataprep.workdir import WorkDir
    # what a Ctrl-C during sentencepiece training under another pid leaves behind: written by the
    # tokenizer task's worker just before it trains
    out = tmp_path / "data"
    monkeypatch.setenv("DATAPREP_HOOKS",
                       ray_test_hooks.env(f"litter:tokenizer:{WorkDir(out).staging}"))
    assert run_build([corpus / "en.txt"], out) == 0
    assert not [p for p in out.rglob(".*") if p.is_file()]


def test_verify_fails_on_a_file_the_manifest_does_not_list(reference, tmp_path, capsys):
    from mspretrain.dataprep.cli import main
    data = tmp_path / "data"
    shutil.copytree(reference, data)
    assert main(["verify", str(data)]) == 0
    (data / ".tokenizer.tmp99.vocab").write_text("x")
    (data / "provenance" / "notes.txt").write_text("x")
    capsys.readouterr()
    assert main(["verify", str(data)]) == 1
    out = capsys.readouterr().out
    assert ".tokenizer.tmp99.vocab: file not listed in the manifest" in out
    assert "notes.txt: file not listed in the manifest" in out


def test_two_builds_into_one_out_dir(corpus, tmp_path, capsys):
    from lock_helpers import hold, kill
    out = tmp_path / "data"
    holder = hold("out_dir_lock", out)
    try:
        assert run_build([corpus / "en.txt"], out) == 1
        err = capsys.readouterr().err
        assert f"--out {out} is in use by another process (pid {holder.pid}" in err
        assert not out.exists()
    finally:
        kill(holder)
    assert run_build([corpus / "en.txt"], out) == 0


def test_report_pictures_are_png_files_linked_from_report_md(reference):
    from PIL import Image
    report = json.loads((reference / "report.json").read_text())
    assert report["plots"] == ["report_doc_lengths.png", "report_tokens.png"]
    md = (reference / "report.md").read_text()
    for name in report["plots"]:
        assert f"]({name})" in md
        with Image.open(reference / name) as im:
            assert im.format == "PNG" and im.size == (700, 400)
            colours = im.convert("RGB").getcolors(1 << 16)
            assert colours is not None and len(colours) > 10      # drawn, not blank
    ranks = report["token_rank_frequency"]
    assert ranks[0][0] == 1 and all(a[1] >= b[1] for a, b in zip(ranks, ranks[1:]))


def test_ctrl_c_prints_one_line_without_worker_tracebacks(corpus, tmp_path):
    import os
    import signal
    import subprocess
    import time

    from dataprep_helpers import REPO, TEST_SETTINGS
    out = tmp_path / "data"
    cmd = [sys.executable, "-m", "mspretrain.dataprep", "build", str(corpus), "--out", str(out), *TEST_SETTINGS,
           "--workers", "2", "--set", "run.chunk_bytes=4KiB"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        while not any((out / ".build" / "docs").glob("*.json")) and proc.poll() is None:
            time.sleep(0.02)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)      # what a terminal's Ctrl-C does: the whole group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert f"interrupted; the finished work is kept in {out}/.build; rerun the same command" in err


def test_per_file_counts_agree_with_the_provenance(reference):
    """Samples per input file (from document lengths) == distinct samples the provenance gives."""
    report = json.loads((reference / "report.json").read_text())
    files = set(report["inputs"])

    def file_of(doc_id: str) -> str:
        head = doc_id.rsplit(":", 1)[0]
        return head if head in files else "html.jsonl.zst"      # jsonl records keep their own id

    samples: dict = {}
    for split in ("train", "valid"):
        prov = pq.read_table(reference / "provenance" / f"{split}.parquet").to_pylist()
        for f, _ in {(file_of(r["doc_id"]), r["sample_id"]) for r in prov}:
            samples[f] = samples.get(f, 0) + 1
    assert len(samples) >= 4
    assert {f: c["samples"] for f, c in report["inputs"].items() if c["samples"]} == samples
    st = report["stages"]
    assert sum(c["docs_read"] for c in report["inputs"].values()) == st["read"]["docs"]
    assert sum(c["docs_kept"] for c in report["inputs"].values()) == st["dedup"]["docs_out"]
    assert sum(c["tokens"] for c in report["inputs"].values()) == sum(st["tokenize"]["tokens"].values())


def test_token_plot_ticks_are_short_plain_numbers():
    from mspretrain.dataprep.report.plots import _short
    assert [_short(v) for v in (1, 10, 100, 1e3, 2.5e4, 1e6, 3e9)] == \
        ["1", "10", "100", "1k", "25k", "1M", "3G"]
