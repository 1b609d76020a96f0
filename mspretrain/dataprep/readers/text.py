"""Plain UTF-8 text, the format of every suffix no other format claims: one document per file
(input.text_unit = file, doc_id REL:1) or per blank-line separated paragraph (doc_id REL:LINE of its
first line). A line that is not UTF-8 is a bad record and left out of its document."""
from __future__ import annotations

from typing import BinaryIO, Iterator

from mspretrain.dataprep.readers.compressed import Damaged
from mspretrain.dataprep.readers.lines import (TooLong, capped_lines, decode_line, split_lines,
                                               too_long)
from mspretrain.dataprep.readers.registry import ReadOptions, register
from mspretrain.dataprep.records import BadRecord, Document, InputFile

_TEXT_CHUNK = 1 << 22   # bytes of whole lines decoded at a time (text_unit = file)


@register(".txt", default=True)
def read_text(inp: InputFile, stream: BinaryIO,
              opts: ReadOptions) -> Iterator[Document | BadRecord]:
    if opts.text_unit == "file":
        yield from _read_whole(inp, stream, opts.max_record_bytes)
    else:
        yield from _read_paragraphs(inp, stream, opts.max_record_bytes)


def _read_paragraphs(inp: InputFile, stream: BinaryIO, cap: int) -> Iterator[Document | BadRecord]:
    parts: list[str] = []
    first, line, produced = 0, 0, False
    size = 0   # bytes of the paragraph so far; over the cap, its parts are dropped as they come
    try:
        for raw_line in capped_lines(stream, cap):
            line += 1
            if isinstance(raw_line, TooLong):
                s = "\0"            # a line too long to hold: it is not blank
            else:
                s = decode_line(inp.rel, line, raw_line)
                if isinstance(s, BadRecord):
                    yield s
                    continue
            if not s.strip():
                if size:
                    yield _paragraph(inp.rel, first, parts, size, cap)
                    produced, parts, size = True, [], 0
                continue
            if not size:
                first = line
            size += raw_line if isinstance(raw_line, TooLong) else len(raw_line)
            if 0 < cap < size:
                parts = []
            else:
                parts.append(s)
    except Damaged as e:
        cut = f"; the paragraph from line {first} is cut short" if size else ""
        yield BadRecord(inp.rel, line + 1, e.reason, e.detail + cut)
        return
    if size:
        yield _paragraph(inp.rel, first, parts, size, cap)
        produced = True
    if not produced:
        yield BadRecord(inp.rel, 0, "empty_file", "no text")


def _paragraph(rel: str, first: int, parts: list[str], size: int, cap: int) -> Document | BadRecord:
    if 0 < cap < size:
        return too_long(rel, first, size, cap)
    return Document(f"{rel}:{first}", "".join(parts), rel)


def _read_whole(inp: InputFile, stream: BinaryIO, cap: int) -> Iterator[Document | BadRecord]:
    """The file as one document, decoded a chunk of whole lines at a time (line by line only in
    a chunk that is not valid UTF-8). A file over the cap is left after the first cap bytes."""
    parts: list[str] = []
    line = size = 0
    try:
        while chunk := stream.read(_TEXT_CHUNK):
            if not chunk.endswith(b"\n"):
                chunk += stream.readline(cap + 1 if cap > 0 else -1)
            size += len(chunk)
            if 0 < cap < size:
                yield BadRecord(inp.rel, 1, "record_too_long",
                                f"the file as one document (input.text_unit = file) is over "
                                f"input.max_record_bytes = {cap}; file skipped")
                return
            try:
                parts.append(chunk.decode("utf-8"))
                line += chunk.count(b"\n")
                continue
            except UnicodeDecodeError:
                pass
            for raw_line in split_lines(chunk):
                line += 1
                s = decode_line(inp.rel, line, raw_line)
                if isinstance(s, BadRecord):
                    yield s
                else:
                    parts.append(s)
    except Damaged as e:
        yield BadRecord(inp.rel, line + 1, e.reason, e.detail)
        return
    text = "".join(parts)
    if text.strip():
        yield Document(f"{inp.rel}:1", text, inp.rel)
    else:
        yield BadRecord(inp.rel, 0, "empty_file", "no text")
