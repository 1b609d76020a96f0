"""input.max_record_bytes: a record over the cap is a counted bad record naming its file:line (or a
--strict failure), never silently dropped or cut, and the reader never holds it whole."""
from __future__ import annotations

import gzip
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mspretrain.dataprep.config import ConfigError, load_build_config, manifest_config
from mspretrain.dataprep.readers import BadRecord, Document, InputFile, capped_lines, read_file
from dataprep_helpers import run_build

CAP = 4000
PROSE = ("Debian keeps a record of every file installed by each program, so removing software later "
         "leaves your computer exactly as it was before. ")


def _jsonl(n_lines: int, long_at: set[int]) -> bytes:
    lines = []
    for i in range(1, n_lines + 1):
        text = PROSE * (60 if i in long_at else 1) + f"Entry {i}."
        lines.append(json.dumps({"id": f"r{i}", "text": text}))
    return ("\n".join(lines) + "\n").encode()


def _records(inp, cap=CAP, **kw):
    return [(type(r).__name__, r.line if isinstance(r, BadRecord) else r.doc_id,
             getattr(r, "reason", "")) for r in read_file(inp, max_record_bytes=cap, **kw)]


@pytest.mark.parametrize("suffix", ["jsonl", "jsonl.gz"])
def test_jsonl_line_over_the_cap_is_a_bad_record_at_its_line(tmp_path, suffix):
    data = _jsonl(5, {2, 4})
    path = tmp_path / f"d.{suffix}"
    path.write_bytes(gzip.compress(data, mtime=0) if suffix.endswith("gz") else data)
    inp = InputFile(path, path.name)
    assert _records(inp) == [("Document", "r1", ""), ("BadRecord", 2, "record_too_long"),
                             ("Document", "r3", ""), ("BadRecord", 4, "record_too_long"),
                             ("Document", "r5", "")]
    bad = [r for r in read_file(inp, max_record_bytes=CAP) if isinstance(r, BadRecord)][0]
    assert str(CAP) in bad.detail and str(len(data.split(b"\n")[1]) + 1) in bad.detail
    # records under the cap are read exactly as without a cap
    uncapped = {d.doc_id: d for d in read_file(inp, max_record_bytes=0)}
    assert len(uncapped) == 5
    assert [d for d in read_file(inp, max_record_bytes=CAP) if isinstance(d, Document)] == \
        [uncapped[k] for k in ("r1", "r3", "r5")]


def test_jsonl_byte_range_parts_apply_the_cap_with_whole_file_line_numbers(tmp_path):
    data = _jsonl(6, {5})
    path = tmp_path / "d.jsonl"
    path.write_bytes(data)
    start = data.index(b"\n", data.index(b'"r3"')) + 1           # lines 4.. in the second part
    part = InputFile(path, "d.jsonl", start=start, end=len(data), first_line=3)
    assert _records(part) == [("Document", "r4", ""), ("BadRecord", 5, "record_too_long"),
                              ("Document", "r6", "")]


def test_paragraph_and_whole_file_text_over_the_cap(tmp_path):
    short = "A short paragraph of plain words.\n"
    long_para = "".join(f"{PROSE}line {i}\n" for i in range(60))     # one paragraph, many lines
    path = tmp_path / "t.txt"
    path.write_text(short + "\n" + long_para + "\n" + short + "\n" + "x" * (3 * CAP) + "\n")
    inp = InputFile(path, "t.txt")
    assert _records(inp, text_unit="paragraph") == [
        ("Document", "t.txt:1", ""), ("BadRecord", 3, "record_too_long"),
        ("Document", "t.txt:64", ""), ("BadRecord", 66, "record_too_long")]
    assert _records(inp, text_unit="file") == [("BadRecord", 1, "record_too_long")]
    assert _records(inp, cap=10 * path.stat().st_size, text_unit="file") == [
        ("Document", "t.txt:1", "")]


def test_parquet_value_over_the_cap_is_a_bad_record_at_its_row(tmp_path):
    texts = [PROSE, PROSE * 60, None, PROSE + "tail"]
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"id": ["a", "b", "c", "d"], "text": texts}), path)
    assert _records(InputFile(path, "p.parquet")) == [
        ("Document", "a", ""), ("BadRecord", 2, "record_too_long"),
        ("BadRecord", 3, "missing_text_field"), ("Document", "d", "")]


class _Recording(io.BufferedReader):
    """A binary stream that remembers the longest piece any read returned."""
    longest = 0

    def readline(self, size=-1):
        line = super().readline(size)
        self.longest = max(self.longest, len(line))
        return line

    def __next__(self):
        line = super().__next__()
        self.longest = max(self.longest, len(line))
        return line


def test_capped_lines_never_holds_a_long_line_whole():
    huge = b"y" * (8 << 20)
    data = b"first\n" + huge + b"\nlast"
    stream = _Recording(io.BytesIO(data))
    got = list(capped_lines(stream, CAP))
    assert got[0] == b"first\n" and got[2] == b"last"
    assert not isinstance(got[1], bytes) and got[1] == len(huge) + 1
    assert stream.longest <= 1 << 16          # read in blocks, never the 8 MB line at once
    stream = _Recording(io.BytesIO(data))
    assert list(capped_lines(stream, 0)) == [b"first\n", huge + b"\n", b"last"]   # no cap
    assert stream.longest == len(huge) + 1


def _corpus(tmp_path):
    root = tmp_path / "in"
    root.mkdir()
    lines = [json.dumps({"id": f"doc-{i}", "text": f"{PROSE * 3}Number {i} of the set, "
                         f"{'with more words ' * (i % 7)}end."}) for i in range(40)]
    lines[6] = json.dumps({"id": "giant", "text": PROSE * 200})       # line 7, ~19 KB
    (root / "a.jsonl").write_text("\n".join(lines) + "\n")
    return root


CAP_SETTINGS = ("--set", "filters.max_chars=6000", "--set", "input.max_record_bytes=8000")


def test_build_counts_and_reports_a_record_over_the_cap(tmp_path):
    root = _corpus(tmp_path)
    out = tmp_path / "data"
    assert run_build([root], out, *CAP_SETTINGS) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["bad_records"]["a.jsonl"]["record_too_long"][:2] == [1, 7]
    assert "| a.jsonl | record_too_long | 1 | 7 |" in (out / "report.md").read_text()
    kept = {r["doc_id"] for s in ("train", "valid")
            for r in pq.read_table(out / "provenance" / f"{s}.parquet").to_pylist()}
    attrs = pq.read_table(out / "documents" / "attributes.parquet").column("doc_id").to_pylist()
    assert "giant" not in attrs and "doc-7" in attrs and "doc-5" in attrs and kept
    assert len(attrs) == 39                   # every other record read


def test_strict_build_fails_naming_the_file_and_line_of_the_record_over_the_cap(tmp_path, capsys):
    out = tmp_path / "data"
    assert run_build([_corpus(tmp_path)], out, *CAP_SETTINGS, "--strict") == 1
    assert "a.jsonl:7: record_too_long" in capsys.readouterr().err
    assert not (out / "manifest.json").exists()


def test_cap_config_is_checked_and_recorded_only_when_changed():
    with pytest.raises(ConfigError, match="input.max_record_bytes"):
        load_build_config(sets=["input.max_record_bytes=1000"])   # under filters.max_chars
    with pytest.raises(ConfigError, match="input.max_record_bytes"):
        load_build_config(sets=["input.max_record_bytes=0"])
    default = manifest_config(load_build_config())
    assert "max_record_bytes" not in default["input"]
    changed = manifest_config(load_build_config(sets=["input.max_record_bytes=64MiB"]))
    assert changed["input"]["max_record_bytes"] == 64 << 20
