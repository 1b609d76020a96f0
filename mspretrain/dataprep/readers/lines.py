"""Lines of a binary stream for the line-based readers (jsonl, text): a cap on a line's length that
never holds the long line, and the bad records of a line that is too long or not UTF-8."""
from __future__ import annotations

from typing import BinaryIO, Iterator

from mspretrain.dataprep.readers.compressed import CHUNK
from mspretrain.dataprep.records import BadRecord


class TooLong(int):
    """A line `capped_lines` read past: its length in bytes, newline included."""


def capped_lines(stream: BinaryIO, cap: int) -> Iterator[bytes | TooLong]:
    """The lines of a binary stream, as iterating it gives them; with cap > 0, a line of more than
    `cap` bytes (newline not counted) is read past in blocks, never held whole, and comes as its
    TooLong length instead."""
    if cap <= 0:
        yield from stream
        return
    while raw := stream.readline(cap + 1):
        if len(raw) <= cap or raw.endswith(b"\n"):
            yield raw
            continue
        n = len(raw)
        while (rest := stream.readline(CHUNK)) and not rest.endswith(b"\n"):
            n += len(rest)
        yield TooLong(n + len(rest))


def too_long(rel: str, line: int, nbytes: int, cap: int) -> BadRecord:
    return BadRecord(rel, line, "record_too_long",
                     f"{nbytes} bytes, over input.max_record_bytes = {cap}; record skipped")


def decode_line(rel: str, line: int, raw: bytes) -> str | BadRecord:
    """One line as text, or the invalid_utf8 BadRecord that names it."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return BadRecord(rel, line, "invalid_utf8", f"byte {e.start}: {e.reason}")


def split_lines(chunk: bytes) -> list[bytes]:
    """The lines of `chunk`, split at newline bytes only (as iterating a binary file does)."""
    lines = [x + b"\n" for x in chunk.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]
