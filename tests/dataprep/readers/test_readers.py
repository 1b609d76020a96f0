"""Readers: every format, plain and compressed, and every kind of bad input."""
import gzip
import json
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from mspretrain.dataprep.readers import BadRecord, Document, InputFile, list_inputs, read_file

ENGLISH = "The quick brown fox jumps over the lazy dog."
CHINESE = "机器学习是人工智能的一个分支。"


def _compress(data: bytes, compression: str) -> bytes:
    if compression == "gz":
        return gzip.compress(data, mtime=0)
    if compression == "zst":
        return zstandard.ZstdCompressor().compress(data)
    return data


def _write(path, data: bytes, compression: str):
    name = path.name + (f".{compression}" if compression else "")
    out = path.with_name(name)
    out.write_bytes(_compress(data, compression))
    return InputFile(out.resolve(), name)


def _read(inp, **kw):
    return list(read_file(inp, **kw))


def _parquet_bytes(table: pa.Table, row_group_size=None) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=row_group_size)
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("compression", ["", "gz", "zst"])
def test_jsonl_ids_from_field_else_rel_and_line(tmp_path, compression):
    lines = [json.dumps({"id": "a1", "text": ENGLISH}), "",
             json.dumps({"text": CHINESE}, ensure_ascii=False), json.dumps({"id": 7, "text": "x"})]
    inp = _write(tmp_path / "docs.jsonl", "\n".join(lines).encode(), compression)
    assert _read(inp) == [Document("a1", ENGLISH, inp.rel),
                          Document(f"{inp.rel}:3", CHINESE, inp.rel),
                          Document("7", "x", inp.rel)]


def test_jsonl_text_and_id_fields_are_configurable(tmp_path):
    inp = _write(tmp_path / "d.jsonl", json.dumps({"key": "k", "body": "hello"}).encode(), "")
    assert _read(inp, text_field="body", id_field="key") == [Document("k", "hello", "d.jsonl")]


@pytest.mark.parametrize("compression", ["", "gz", "zst"])
def test_jsonl_bad_records_are_reported_and_reading_goes_on(tmp_path, compression):
    data = b"\n".join([
        json.dumps({"text": "ok one"}).encode(),
        b'{"text": "unterminated',
        b'{"text": "caf\xe9 latin-1"}',
        json.dumps({"body": "no text field"}).encode(),
        json.dumps({"text": 42}).encode(),
        json.dumps(["not", "an", "object"]).encode(),
        json.dumps({"text": "bad id", "id": [1]}).encode(),
        json.dumps({"text": "ok two"}).encode(),
    ])
    inp = _write(tmp_path / "bad.jsonl", data, compression)
    got = _read(inp)
    assert [(type(r).__name__, getattr(r, "line", None), getattr(r, "reason", None)) for r in got] == [
        ("Document", None, None),
        ("BadRecord", 2, "invalid_json"),
        ("BadRecord", 3, "invalid_utf8"),
        ("BadRecord", 4, "missing_text_field"),
        ("BadRecord", 5, "text_not_string"),
        ("BadRecord", 6, "not_an_object"),
        ("BadRecord", 7, "invalid_id"),
        ("Document", None, None),
    ]
    assert got[-1] == Document(f"{inp.rel}:8", "ok two", inp.rel)
    assert all(r.file == inp.rel for r in got if isinstance(r, BadRecord))


def test_jsonl_records_read_as_json_reads_them(tmp_path):
    """Lines where a faster parser would differ from Python's json (which defines the values):
    integers beyond 64 bits, NaN and 1e400, lone surrogates, repeated keys, trailing garbage."""
    big = 123456789012345678901234567890
    lines = [f'{{"id": {big}, "text": "big id"}}', '{"text": NaN}', '{"text": 1e400}',
             '{"text": 18446744073709551616}', "18446744073709551616", '{"text": "\\ud800"}',
             '{"text": "others ignored", "n": 1e400, "x": NaN, "y": 99999999999999999999}',
             '{"text": "first", "text": "last"}', '{"text": "a"} x', '{"id": 1.5, "text": "t"}']
    inp = _write(tmp_path / "edge.jsonl", "\n".join(lines).encode(), "")
    got = _read(inp)
    assert got[0] == Document(str(big), "big id", inp.rel)
    assert [(r.reason, r.detail) for r in got[1:6]] == [
        ("text_not_string", "field 'text' is a JSON float"),
        ("text_not_string", "field 'text' is a JSON float"),
        ("text_not_string", "field 'text' is a JSON int"),
        ("not_an_object", "a JSON int, not an object"),
        ("invalid_unicode", "field 'text' holds a lone surrogate ('\\ud800'), which no UTF-8 text "
                            "can hold")]
    assert got[6] == Document(f"{inp.rel}:7", "others ignored", inp.rel)
    assert got[7] == Document(f"{inp.rel}:8", "last", inp.rel)
    assert (got[8].reason, got[8].detail) == ("invalid_json", "column 15: Extra data")
    assert got[9].reason == "invalid_id"


def test_jsonl_lines_read_as_by_json_alone():
    """The reader's orjson shortcut against the way every line would go with json alone (decode,
    blank or not, json.loads, every check), on lines mutated at random from a few seeds: the same
    Document or BadRecord for each."""
    import random

    from mspretrain.dataprep.readers import jsonl
    from mspretrain.dataprep.readers.lines import decode_line
    from mspretrain.dataprep.readers.registry import ReadOptions

    def json_alone(raw: bytes, opts):
        s = decode_line("f", 1, raw)
        if isinstance(s, BadRecord) or not s.strip():
            return s if isinstance(s, BadRecord) else None
        try:
            rec = json.loads(s)
        except json.JSONDecodeError as e:
            return BadRecord("f", 1, "invalid_json", f"column {e.colno}: {e.msg}")
        return jsonl._record("f", 1, raw, rec, True, opts)

    seeds = ['{"id": 12, "text": "h\\u00e9llo \\"q\\" \u00e9\\n", "x": [1, 2.5, {"y": null}]}',
             '{"text": "\\ud83d\\ude00 ok", "id": "a-1"}', '{"id": 99999999999999999999, "text": "t"}']
    alphabet = b' \t\r\n{}[]":,.0123456789-+eE\\/ubdnrtfaxlsNI\x00\x1f\x7f\xc3\xa9\xff\x0c'
    rng = random.Random(7)
    opts = ReadOptions()
    for _ in range(4000):
        s = bytearray(rng.choice(seeds).encode())
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(s))
            op = rng.random()
            if op < 0.4:
                del s[i]
            elif op < 0.8:
                s[i:i] = bytes([rng.choice(alphabet)])
            else:
                s[i] = rng.choice(alphabet)
        raw = bytes(s) + b"\n"
        assert jsonl._line_record("f", 1, raw, opts) == json_alone(raw, opts), raw


@pytest.mark.parametrize("compression", ["gz", "zst"])
@pytest.mark.parametrize("kind", ["jsonl", "txt"])
def test_truncated_stream_yields_documents_before_the_damage(tmp_path, compression, kind):
    n = 2000
    if kind == "jsonl":
        data = "\n".join(json.dumps({"text": f"document number {i} " * 5}) for i in range(n))
    else:
        data = "\n\n".join(f"paragraph number {i} " * 5 for i in range(n))
    full = _compress(data.encode(), compression)
    path = tmp_path / f"cut.{kind}.{compression}"
    path.write_bytes(full[:len(full) * 2 // 3])
    got = _read(InputFile(path, path.name), text_unit="paragraph")
    docs = [r for r in got if isinstance(r, Document)]
    assert isinstance(got[-1], BadRecord) and got[-1].reason == "truncated_compressed"
    assert all(isinstance(r, Document) for r in got[:-1])
    assert 0 < len(docs) < n
    # What came before the damage is complete and in order.
    assert [d.text.strip() for d in docs] == [(f"{'document' if kind == 'jsonl' else 'paragraph'} "
                                              f"number {i} " * 5).strip() for i in range(len(docs))]
    assert got[-1].file == path.name
    if kind == "jsonl":  # the damage is in the line after the last complete one
        assert got[-1].line == len(docs) + 1
    else:                # paragraph i starts at line 2i + 1; the one cut short is not a document
        assert got[-1].line >= 2 * len(docs) + 1


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_truncated_text_file_is_no_document(tmp_path, compression):
    full = _compress(b"a line of text\n" * 50_000, compression)
    path = tmp_path / f"cut.txt.{compression}"
    path.write_bytes(full[:len(full) // 2])
    got = _read(InputFile(path, path.name))
    assert [(type(r).__name__, r.reason) for r in got] == [("BadRecord", "truncated_compressed")]


def test_large_text_file_bad_line_numbers_across_chunks(tmp_path):
    lines = [f"line {i}\n".encode() for i in range(1, 900_001)]  # several decoding chunks
    lines[799_999] = b"bad \xff line\n"
    path = tmp_path / "big.txt"
    path.write_bytes(b"".join(lines))
    got = _read(InputFile(path, "big.txt"))
    assert [(r.line, r.reason) for r in got if isinstance(r, BadRecord)] == [(800_000, "invalid_utf8")]
    doc = got[-1]
    assert isinstance(doc, Document) and doc.doc_id == "big.txt:1"
    assert doc.text == b"".join(lines[:799_999] + lines[800_000:]).decode()


def test_corrupt_gzip_is_reported(tmp_path):
    data = bytearray(gzip.compress(b"hello world\n" * 1000, mtime=0))
    data[30:60] = b"\xff" * 30
    path = tmp_path / "broken.txt.gz"
    path.write_bytes(bytes(data))
    got = _read(InputFile(path, path.name))
    assert got[-1].reason in ("corrupt_compressed", "truncated_compressed")


@pytest.mark.parametrize("compression", ["", "gz", "zst"])
@pytest.mark.parametrize("name", ["empty.jsonl", "empty.txt", "empty.parquet"])
def test_empty_files_are_reported(tmp_path, compression, name):
    inp = _write(tmp_path / name, b"", compression)
    got = _read(inp)
    assert len(got) == 1 and got[0].file == inp.rel and got[0].line == 0
    assert got[0].reason == ("unreadable" if name.endswith("parquet") else "empty_file")


@pytest.mark.parametrize("compression", ["", "gz", "zst"])
def test_text_file_is_one_document(tmp_path, compression):
    text = f"{ENGLISH}\n\n{CHINESE}\n"
    inp = _write(tmp_path / "a.md", text.encode(), compression)
    assert _read(inp) == [Document(f"{inp.rel}:1", text, inp.rel)]


@pytest.mark.parametrize("compression", ["", "gz", "zst"])
def test_text_paragraph_mode_ids_are_first_lines(tmp_path, compression):
    text = f"\n{ENGLISH}\nsecond line\n\n\n  \n{CHINESE}\n"
    inp = _write(tmp_path / "b.txt", text.encode(), compression)
    assert _read(inp, text_unit="paragraph") == [
        Document(f"{inp.rel}:2", f"{ENGLISH}\nsecond line\n", inp.rel),
        Document(f"{inp.rel}:7", f"{CHINESE}\n", inp.rel)]


def test_text_invalid_utf8_line_is_reported_and_left_out(tmp_path):
    path = tmp_path / "mixed.txt"
    path.write_bytes(b"good line\nbad \xff\xfe line\nlast line\n")
    got = _read(InputFile(path, "mixed.txt"))
    assert got == [BadRecord("mixed.txt", 2, "invalid_utf8", got[0].detail),
                   Document("mixed.txt:1", "good line\nlast line\n", "mixed.txt")]


def test_whitespace_only_text_is_an_empty_file(tmp_path):
    path = tmp_path / "blank.txt"
    path.write_text(" \n\n\t\n")
    assert [r.reason for r in _read(InputFile(path, "blank.txt"))] == ["empty_file"]
    assert [r.reason for r in _read(InputFile(path, "blank.txt"), text_unit="paragraph")] == [
        "empty_file"]


@pytest.mark.parametrize("compression", ["", "gz", "zst"])
def test_parquet_streams_rows_with_ids(tmp_path, compression):
    texts = [f"row {i} {ENGLISH}" for i in range(2500)] + [CHINESE]
    ids = [f"p{i}" if i % 3 else None for i in range(len(texts))]
    table = pa.table({"id": ids, "text": texts, "other": list(range(len(texts)))})
    inp = _write(tmp_path / "t.parquet", _parquet_bytes(table, row_group_size=1000), compression)
    got = _read(inp)
    assert len(got) == len(texts) and all(isinstance(r, Document) for r in got)
    assert got[1] == Document("p1", texts[1], inp.rel)
    assert got[0].doc_id == f"{inp.rel}:1" and got[2499].doc_id == f"{inp.rel}:2500"
    assert got[-1].text == CHINESE


def test_parquet_without_id_column_nulls_and_wrong_types(tmp_path):
    inp = _write(tmp_path / "n.parquet",
                 _parquet_bytes(pa.table({"text": ["a", None, "c"]})), "")
    got = _read(inp)
    assert got[0] == Document("n.parquet:1", "a", "n.parquet")
    assert (got[1].line, got[1].reason) == (2, "missing_text_field")
    assert got[2] == Document("n.parquet:3", "c", "n.parquet")
    wrong = _write(tmp_path / "w.parquet", _parquet_bytes(pa.table({"text": [1, 2]})), "")
    assert [(r.line, r.reason) for r in _read(wrong)] == [(0, "text_not_string")]
    none = _write(tmp_path / "m.parquet", _parquet_bytes(pa.table({"body": ["x"]})), "")
    assert [(r.line, r.reason) for r in _read(none)] == [(0, "missing_text_field")]


def test_garbage_parquet_is_unreadable(tmp_path):
    inp = _write(tmp_path / "g.parquet", b"PAR1 this is not parquet at all PAR1", "")
    assert [(r.line, r.reason) for r in _read(inp)] == [(0, "unreadable")]


def test_list_inputs_is_sorted_recursive_and_skips_hidden(tmp_path):
    root = tmp_path / "corpus"
    for rel in ["b.txt", "a/z.jsonl", "a/b.parquet", ".hidden.txt", ".git/x.txt", "c/.d/e.txt"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("x")
    single = tmp_path / "single.txt.gz"
    single.write_bytes(gzip.compress(b"x"))
    got = list_inputs([root, str(single), root / "b.txt"])
    assert [f.rel for f in got] == ["a/b.parquet", "a/z.jsonl", "b.txt", "single.txt.gz"]
    assert all(f.path.is_absolute() for f in got)
    assert got == list_inputs([root, single])


def test_list_inputs_names_a_missing_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope/missing.jsonl"):
        list_inputs([tmp_path, tmp_path / "nope" / "missing.jsonl"])


def test_unknown_text_unit_is_rejected(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("x")
    with pytest.raises(ValueError, match="text_unit"):
        _read(InputFile(path, "x.txt"), text_unit="sentence")


def _small_stream(records: list[bytes], compression: str) -> bytes:
    """A few records compressed; zstd flushes a block after each record (as a streaming writer
    does), because zstd can only decode whole blocks."""
    if compression == "gz":
        return gzip.compress(b"".join(records), mtime=0)
    cobj = zstandard.ZstdCompressor().compressobj()
    out = [cobj.compress(r) + cobj.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK) for r in records]
    return b"".join(out) + cobj.flush()


def _decodable_prefix(data: bytes, compression: str) -> bytes:
    obj = (zlib.decompressobj(31) if compression == "gz"
           else zstandard.ZstdDecompressor().decompressobj())
    try:
        return obj.decompress(data)
    except (zlib.error, zstandard.ZstdError):
        return b""


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_small_truncated_stream_loses_only_the_damaged_record(tmp_path, compression):
    records = [json.dumps({"id": f"r{i}", "text": f"{ENGLISH} {i}"}).encode() + b"\n"
               for i in range(6)]
    full = _small_stream(records, compression)
    path = tmp_path / f"small.jsonl.{compression}"
    seen = set()
    for cut in range(1, len(full)):   # every place the file can be cut
        path.write_bytes(full[:cut])
        got = _read(InputFile(path, path.name))
        complete = _decodable_prefix(full[:cut], compression).count(b"\n")
        assert [r.doc_id for r in got[:-1]] == [f"r{i}" for i in range(complete)], cut
        assert (got[-1].reason, got[-1].line) == ("truncated_compressed", complete + 1), cut
        seen.add(complete)
    # Each record is a document as soon as its bytes are in: a cut loses only the record it hits.
    assert seen == set(range(len(records) + 1))


@pytest.mark.parametrize("compression", ["gz", "zst"])
def test_small_truncated_paragraphs_before_the_damage_are_documents(tmp_path, compression):
    paras = [f"{ENGLISH} {i}\nsecond line {i}\n\n".encode() for i in range(4)]
    full = _small_stream(paras, compression)
    path = tmp_path / f"small.txt.{compression}"
    path.write_bytes(full[:len(full) - 12])   # inside the last paragraph's data (or gzip trailer)
    got = _read(InputFile(path, path.name), text_unit="paragraph")
    docs = [r for r in got if isinstance(r, Document)]
    assert [d.doc_id for d in docs][:3] == [f"{path.name}:{3 * i + 1}" for i in range(3)]
    assert got[-1].reason == "truncated_compressed" and len(got) == len(docs) + 1


def _rglob_reference(root):
    """The listing's definition for one directory: Path.rglob, hidden parts out, resolved paths."""
    found = sorted((p.relative_to(root).as_posix(), p) for p in root.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(root).parts))
    return [InputFile(path=p.resolve(), rel=rel) for rel, p in found]


def test_list_inputs_walk_agrees_with_rglob_on_symlinks_and_hidden_names(tmp_path):
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "o.txt").write_text("o")
    (outside / "deep" / "d.txt").write_text("d")
    root = tmp_path / "corpus"
    for rel in ["b.txt", "a/z.jsonl", "a/b/c/x.txt", ".h/x.txt", "a/.y.txt", "m-n.txt", "m/n.txt"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    (root / "link-file.txt").symlink_to(outside / "o.txt")     # listed, at its target's path
    (root / "a" / "again.txt").symlink_to(root / "b.txt")      # the same file as b.txt
    (root / "link-dir").symlink_to(outside / "deep")           # not entered (as rglob)
    (root / "broken.txt").symlink_to(tmp_path / "missing")     # not a file
    (tmp_path / "via").symlink_to(root)                        # the root itself through a link
    for arg in (root, tmp_path / "via"):
        ref = _rglob_reference(arg)
        got = list_inputs([arg])
        rels = [f.rel for f in ref]
        assert "link-file.txt" in rels and "link-dir/d.txt" not in rels and "broken.txt" not in rels
        assert got == [f for i, f in enumerate(ref) if f.path not in {g.path for g in ref[:i]}]
