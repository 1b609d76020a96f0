"""Bad input loses nothing silently: every bad record is counted per file and reason in the report and
the build goes on; with --strict the first one fails the build, naming file and line."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from dataprep_helpers import run_build, write_messy_corpus

GOOD = ("Debian keeps a record of every file installed by each program, so removing software later "
        "leaves your computer exactly as it was before. Entry {n}.")


@pytest.fixture(scope="module")
def messy(corpus, tmp_path_factory):
    lines = [json.dumps({"id": "good-1", "text": GOOD.format(n=1)}).encode(),
             b'{"id": "broken", "text": "no closing brace"',                    # line 2
             json.dumps({"id": "no-text", "body": "x"}).encode(),               # line 3
             json.dumps({"id": "num", "text": 42}).encode(),                    # line 4
             b'{"id": "latin1", "text": "caf\xe9"}',                            # line 5
             json.dumps({"id": "good-2", "text": GOOD.format(n=2)}).encode()]
    return write_messy_corpus(tmp_path_factory.mktemp("messy"), corpus, GOOD, lines, 3000)


def test_bad_records_are_counted_per_file_and_reason_and_the_build_goes_on(messy, tmp_path):
    out = tmp_path / "data"
    assert run_build([messy], out) == 0
    bad = json.loads((out / "report.json").read_text())["bad_records"]
    a = bad["a.jsonl"]
    assert {k: v[:2] for k, v in a.items()} == {
        "invalid_json": [1, 2], "missing_text_field": [1, 3], "text_not_string": [1, 4],
        "invalid_utf8": [1, 5]}
    assert list(bad["b-empty.txt"]) == ["empty_file"]
    assert list(bad["c-cut.jsonl.gz"]) == ["truncated_compressed"]
    assert "en.txt" not in bad
    report_md = (out / "report.md").read_text()
    assert "| a.jsonl | invalid_json | 1 | 2 |" in report_md
    # the good records around the bad ones, and those before the damage, made it into the dataset
    kept = {r["doc_id"] for s in ("train", "valid")
            for r in pq.read_table(out / "provenance" / f"{s}.parquet").to_pylist()}
    dups = {r["doc_id"] for r in pq.read_table(out / "dedup" / "duplicates.parquet").to_pylist()}
    assert {"good-1", "good-2", "gz-0"} <= kept | dups
    assert {"broken", "no-text", "num", "latin1"}.isdisjoint(kept | dups)


def test_strict_fails_on_the_first_bad_record_naming_file_and_line(messy, tmp_path, capsys):
    out = tmp_path / "data"
    assert run_build([messy], out, "--strict") == 1
    err = capsys.readouterr().err
    assert "a.jsonl:2: invalid_json" in err
    assert not (out / "manifest.json").exists()


def test_strict_names_a_bad_record_before_a_repeated_id_and_else_the_id(tmp_path, capsys):
    """Ids are compared only once every document is read (the Ray engine can do no better), so a bad
    record anywhere is the fault --strict names; without one, the first repeated doc_id."""
    src = tmp_path / "in"
    src.mkdir()
    rec = lambda i, n: json.dumps({"id": i, "text": GOOD.format(n=n)})   # noqa: E731
    (src / "a.jsonl").write_text(rec("x", 1) + "\n" + rec("x", 2) + "\n")          # the id repeats
    (src / "b.jsonl").write_text("\n".join(rec(f"b{n}", n) for n in range(3, 200))
                                 + '\n{"id": "late", "text": \n')                # a bad last line
    assert run_build([src], tmp_path / "both", "--strict") == 1
    assert "b.jsonl:198: invalid_json" in capsys.readouterr().err
    (src / "b.jsonl").write_text("\n".join(rec(f"b{n}", n) for n in range(3, 200)) + "\n")
    assert run_build([src], tmp_path / "ids", "--strict") == 1
    assert "a.jsonl: doc_id 'x' appears twice (--strict)" in capsys.readouterr().err
