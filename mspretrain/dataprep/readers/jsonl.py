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
            item = (too_long(inp.rel, line, raw_line, cap) if isinstance(raw_line, TooLong)
                    else _line_record(inp.rel, line, raw_line, opts))
            if item is not None:
                records += 1
                yield item
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
        item = _line_record(inp.rel, line, raw_line, opts)
        if item is not None:
            yield item


def _line_record(rel: str, line: int, raw: bytes, opts: ReadOptions) -> Document | BadRecord | None:
    """The record of one line, None for a blank line: what json.loads of the decoded line gives,
    the same values and errors, mostly computed by orjson (twice as fast on a corpus), from the
    line's bytes (no str decoded that orjson would encode again). A line orjson refuses takes the
    way that names what is wrong with it (UTF-8, blank, json's error), or holds what only json
    reads (NaN, Infinity, 1e400, lone surrogate escapes)."""
    by_json = False
    try:
        rec = orjson.loads(raw)        # valid UTF-8 and JSON, and so not blank
    except orjson.JSONDecodeError:
        s = decode_line(rel, line, raw)
        if isinstance(s, BadRecord):
            return s
        if not s.strip():
            return None
        try:
            rec, by_json = json.loads(s), True
        except json.JSONDecodeError as e:
            return BadRecord(rel, line, "invalid_json", f"column {e.colno}: {e.msg}")
    if not by_json and _inexact(rec, opts.text_field, opts.id_field):
        rec = json.loads(raw.decode("utf-8"))
    return _record(rel, line, raw, rec, by_json, opts)


def _inexact(rec, text_field: str, id_field: str) -> bool:
    """Whether orjson may have read a value a build looks at (the record, its text, its id) other
    than json does: orjson reads an integer beyond 64 bits as a float, json as an int."""
    return type(rec) is float or (type(rec) is dict and (type(rec.get(text_field)) is float
                                                         or type(rec.get(id_field)) is float))


def _record(rel: str, line: int, raw: bytes, rec, by_json: bool,
            opts: ReadOptions) -> Document | BadRecord:
    """The Document or BadRecord of a parsed line. `by_json`: parsed by json, which (unlike orjson,
    which refuses the line) lets a lone surrogate escape through."""
    text_field, id_field = opts.text_field, opts.id_field
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
    # only a line json parsed and that holds the escape can have one: only then is the (costly)
    # check worth it
    if by_json and _SURROGATE_ESCAPE.search(raw):
        for name, value in ((id_field, doc_id), (text_field, text)):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                return BadRecord(rel, line, "invalid_unicode",
                                 f"field {name!r} holds a lone surrogate ({value[e.start]!r}), "
                                 f"which no UTF-8 text can hold")
    return Document(doc_id, text, rel)


# a JSON escape of a UTF-16 surrogate: the only way a lone one gets into a decoded line
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
