"""JSON lines (.jsonl, .ndjson, .json): one object per line, its text in `text_field`, its id in
`id_field` where present. Blank lines hold no record; a file with none is `empty_file`. A large
uncompressed file is cut at line starts for the Ray engine (split_jsonl), each part numbering its
lines as the whole file does."""
from __future__ import annotations

import json
import re
from typing import BinaryIO, Iterator

import orjson

from mspretrain.dataprep.readers.compressed import Damaged
from mspretrain.dataprep.readers.lines import TooLong, capped_lines, decode_line, too_long
from mspretrain.dataprep.readers.registry import ReadOptions, file_format, register
from mspretrain.dataprep.records import BadRecord, Document, InputFile

_SCAN_BLOCK = 1 << 22   # bytes per read while split_jsonl counts lines


def split_jsonl(inp: InputFile, part_bytes: int) -> list[InputFile]:
    """An uncompressed jsonl file cut at line starts into parts of about part_bytes (the file itself
    if it is not larger), each knowing the number of lines before it. Reads the file once, in
    blocks (counting newlines is all it does)."""
    size = inp.path.stat().st_size
    if file_format(inp.path) != ("jsonl", None) or size <= part_bytes:
        return [inp]
    cuts, lines, pos, target = [(0, 0)], 0, 0, part_bytes
    with open(inp.path, "rb") as f:
        while block := f.read(_SCAN_BLOCK):
            while pos + len(block) > target:   # the first line start at or after target
                i = block.find(b"\n", max(0, target - 1 - pos))
                if i < 0:
                    break
                cut = pos + i + 1
                if cut < size:
                    cuts.append((cut, lines + block.count(b"\n", 0, i + 1)))
                target = cut + part_bytes
            lines += block.count(b"\n")
            pos += len(block)
    if len(cuts) == 1:   # one long line: nothing to cut
        return [inp]
    bounds = [c for c, _ in cuts] + [size]
    return [InputFile(inp.path, inp.rel, start, bounds[k + 1], first)
            for k, (start, first) in enumerate(cuts)]


@register(".jsonl", ".ndjson", ".json", split=split_jsonl)
def read_jsonl(inp: InputFile, stream: BinaryIO,
               opts: ReadOptions) -> Iterator[Document | BadRecord]:
    if inp.end >= 0:
        yield from _read_range(inp, stream, opts)
        return
    cap, line, records = opts.max_record_bytes, 0, 0
    try:
        for raw_line in capped_lines(stream, cap):
            line += 1
            s = (too_long(inp.rel, line, raw_line, cap) if isinstance(raw_line, TooLong)
                 else decode_line(inp.rel, line, raw_line))
            if isinstance(s, BadRecord):
                records += 1
                yield s
                continue
            if not s.strip():
                continue
            records += 1
            yield _json_record(inp.rel, line, s, opts)
    except Damaged as e:
        yield BadRecord(inp.rel, line + 1, e.reason, e.detail)
        return
    if records == 0:
        yield BadRecord(inp.rel, 0, "empty_file", "no records")


def _read_range(inp: InputFile, raw: BinaryIO, opts: ReadOptions) -> Iterator[Document | BadRecord]:
    """The records of the lines in [inp.start, inp.end) (both at line starts), numbered as in the
    whole file. A part never reports the file empty: split_jsonl only splits large files."""
    raw.seek(inp.start)
    cap, line, pos = opts.max_record_bytes, inp.first_line, inp.start
    for raw_line in capped_lines(raw, cap):
        if pos >= inp.end:
            break
        line += 1
        if isinstance(raw_line, TooLong):
            pos += raw_line
            yield too_long(inp.rel, line, raw_line, cap)
            continue
        pos += len(raw_line)
        s = decode_line(inp.rel, line, raw_line)
        if isinstance(s, BadRecord):
            yield s
        elif s.strip():
            yield _json_record(inp.rel, line, s, opts)


def _json_record(rel: str, line: int, s: str, opts: ReadOptions) -> Document | BadRecord:
    text_field, id_field = opts.text_field, opts.id_field
    try:
        rec, by_json = _loads(s, text_field, id_field)
    except json.JSONDecodeError as e:
        return BadRecord(rel, line, "invalid_json", f"column {e.colno}: {e.msg}")
    if not isinstance(rec, dict):
        return BadRecord(rel, line, "not_an_object", f"a JSON {type(rec).__name__}, not an object")
    if text_field not in rec:
        return BadRecord(rel, line, "missing_text_field", f"no field {text_field!r}")
    text = rec[text_field]
    if not isinstance(text, str):
        return BadRecord(rel, line, "text_not_string",
                         f"field {text_field!r} is a JSON {type(text).__name__}")
    doc_id = opts.doc_id(rec.get(id_field), rel, line)
    if doc_id is None:
        return BadRecord(rel, line, "invalid_id", f"field {id_field!r} is not a string or integer")
    # only json lets a lone surrogate escape through (orjson refuses the line), and only a line
    # that holds the escape can have one: only then is the (costly) check worth it
    if by_json and _SURROGATE_ESCAPE.search(s):
        for name, value in ((id_field, doc_id), (text_field, text)):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                return BadRecord(rel, line, "invalid_unicode",
                                 f"field {name!r} holds a lone surrogate ({value[e.start]!r}), "
                                 f"which no UTF-8 text can hold")
    return Document(doc_id, text, rel)


def _loads(s: str, text_field: str, id_field: str) -> tuple[object, bool]:
    """(json.loads(s), whether json parsed it): the same values and errors, mostly computed by
    orjson (twice as fast on a corpus). Where they differ, json decides: orjson refuses what json
    accepts beyond the standard (NaN, Infinity, 1e400, lone surrogate escapes), and reads an
    integer beyond 64 bits as a float, which matters only where a build looks: the record itself,
    its text and its id."""
    try:
        rec = orjson.loads(s)
    except orjson.JSONDecodeError:
        return json.loads(s), True   # json's own error (line and column), or what only json reads
    if type(rec) is float or (type(rec) is dict and (type(rec.get(text_field)) is float
                                                     or type(rec.get(id_field)) is float)):
        return json.loads(s), False  # orjson read it: it holds no lone surrogate
    return rec, False


# a JSON escape of a UTF-16 surrogate: the only way a lone one gets into a decoded line
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
