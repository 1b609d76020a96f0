"""Corpus readers: jsonl, parquet and plain text, each optionally gzip- or zstd-compressed.

Formats by suffix (before an optional .gz / .zst / .zstd): .jsonl, .ndjson and .json are read as
JSON lines (one object per line), .parquet with pyarrow, anything else as UTF-8 text.
Every reader yields `Document`s and, for anything it cannot turn into a document, a `BadRecord`
naming the file, the 1-based line (or parquet row; 0 for the whole file) and a short stable reason.
Nothing is skipped without a record, except blank lines in jsonl, which hold no record at all.
A damaged compressed stream yields every document decoded before the damage (decompression is
incremental: only the record the damage hits is lost; zstd decodes whole blocks, so there the block
it hits), then one `BadRecord(reason="truncated_compressed" | "corrupt_compressed")` naming the
first line not read whole, then stops. A gzip member that fails its check (CRC or data) cannot be
trusted anywhere, the CRC being at its end: gzip files are checked first (`_gzip_damage`), and the
reader stops at the first line of the damaged member (corrupt_compressed names it).
A record longer than `max_record_bytes` (a jsonl line, a paragraph, a whole text file, a parquet
text value; 0: no cap) is never held whole: the reader reads past it in blocks and yields a
`BadRecord(reason="record_too_long")` naming its first line, so one giant record cannot set the
memory of a build.
"""
from __future__ import annotations

import io
import json
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import zstandard

JSONL_SUFFIXES = {".jsonl", ".json", ".ndjson"}
PARQUET_SUFFIXES = {".parquet"}
COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd"}
TEXT_UNITS = ("file", "paragraph")
ID_SCOPES = ("global", "file")
_CHUNK = 1 << 16
_FEED = 1 << 13        # compressed bytes per decompress call
_PARQUET_BATCH = 1024
_TEXT_CHUNK = 1 << 22


@dataclass(frozen=True)
class InputFile:
    path: Path  # absolute path
    rel: str    # stable name used in doc_ids (relative to the INPUT directory, or the file name)
    # A part of a large file, read as a part of the whole (split_input): a byte range of an
    # uncompressed jsonl file, its lines numbered from first_line + 1, or a range of row groups
    # of an uncompressed parquet file, its rows numbered from first_line + 1. end < 0: the whole.
    start: int = 0
    end: int = -1
    first_line: int = 0


@dataclass(frozen=True)
class Document:
    doc_id: str  # the record's id field where present, else f"{rel}:{line_or_row}"
    text: str    # raw text as read (not cleaned)
    source: str  # InputFile.rel


@dataclass(frozen=True)
class BadRecord:
    file: str    # InputFile.rel
    line: int    # 1-based line (jsonl, text) or row (parquet); 0 for the whole file
    reason: str  # stable code: invalid_json, invalid_utf8, missing_text_field, ...
    detail: str  # human-readable detail


class _Damaged(Exception):
    """A compressed stream ended early or is corrupt; `reason` is the BadRecord code."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


# ---------------------------------------------------------------------------------------- listing

def list_inputs(paths: list[str | Path], left_out: dict | None = None) -> list[InputFile]:
    """The input files under `paths`, in argument order, each directory walked in sorted order.

    Inside a directory, these are left out, and named in `left_out` (a dict, filled in when given:
    {"hidden": [...], "symlinked_dirs": [...], "broken_symlinks": [...], "not_files": [...]}, paths
    as given), which the build reports: names starting with '.' (hidden files and directories,
    such as .git), symlinks to directories (not followed: a link can make a cycle or bring in a
    tree twice; give the target as an INPUT instead), broken symlinks, and what is neither a file
    nor a directory (FIFOs, sockets, devices). A symlink to a file is read. A path given twice is
    listed once.
    """
    found: list[InputFile] = []
    seen: set[Path] = set()
    skipped = {kind: [] for kind in LEFT_OUT}
    for arg in paths:
        root = Path(arg)
        if not root.exists():
            raise FileNotFoundError(f"input path not found: {arg}")
        if not root.is_dir() and not root.is_file():
            raise InputPathError(f"input path is neither a file nor a directory (a FIFO, socket or "
                                 f"device?): {arg}")
        if root.is_dir():
            real_root = root.resolve()
            files = []
            for rel, path, link in sorted(_walk(str(root), "", skipped)):
                files.append((rel, Path(os.path.realpath(path)) if link else real_root / rel))
        else:
            files = [(root.name, root.resolve())]
        for rel, path in files:
            rel = _printable(rel)
            if path not in seen:
                seen.add(path)
                found.append(InputFile(path=path, rel=rel))
    if left_out is not None:
        left_out.update({k: sorted(v) for k, v in skipped.items() if v})
    return found


def _printable(rel: str) -> str:
    """A file name as text: bytes that are not UTF-8 (os gives them as surrogate escapes, which no
    file can hold) written as \\xNN, so doc_ids, the report and the manifest can name the file."""
    try:
        rel.encode("utf-8")
        return rel
    except UnicodeEncodeError:
        return os.fsencode(rel).decode("utf-8", "backslashreplace")


class InputPathError(ValueError):
    """An INPUT argument that cannot be read as a file or walked as a directory."""


LEFT_OUT = ("hidden", "symlinked_dirs", "broken_symlinks", "not_files")


def _walk(top: str, prefix: str, skipped: dict):
    """(relative posix path, path, is a symlink) of the files under `top`; what is left out goes
    into `skipped` (see list_inputs). One scandir per directory: no stat for a regular file, no
    resolve() but for symlinks (a corpus may hold 10^5 files)."""
    with os.scandir(top) as it:
        entries = list(it)
    for e in entries:
        if e.name.startswith("."):
            skipped["hidden"].append(e.path)
            continue
        try:
            if e.is_dir(follow_symlinks=False):
                yield from _walk(e.path, f"{prefix}{e.name}/", skipped)
            elif e.is_file():
                yield f"{prefix}{e.name}", e.path, e.is_symlink()
            elif e.is_symlink() and e.is_dir():
                skipped["symlinked_dirs"].append(e.path)
            elif e.is_symlink() and not os.path.exists(e.path):
                skipped["broken_symlinks"].append(e.path)
            else:
                skipped["not_files"].append(e.path)
        except OSError:   # gone while listed, or a link that cannot be followed
            skipped["broken_symlinks" if e.is_symlink() else "not_files"].append(e.path)


def file_format(path: Path) -> tuple[str, str | None]:
    """(kind, compression): kind is jsonl, parquet or text; compression gzip, zstd or None."""
    suffixes = [s.lower() for s in path.suffixes]
    compression = COMPRESSION_SUFFIXES.get(suffixes[-1]) if suffixes else None
    if compression:
        suffixes = suffixes[:-1]
    last = suffixes[-1] if suffixes else ""
    if last in JSONL_SUFFIXES:
        return "jsonl", compression
    if last in PARQUET_SUFFIXES:
        return "parquet", compression
    return "text", compression


# ---------------------------------------------------------------------------------------- reading

def read_file(inp: InputFile, text_field: str = "text", id_field: str = "id",
              text_unit: str = "file", max_record_bytes: int = 0,
              id_scope: str = "global") -> Iterator[Document | BadRecord]:
    """Documents and bad records of one input file, in file order (see the module docstring).
    id_scope "file": a record's id is namespaced by its file, `REL#ID` (ids that restart in every
    file stay apart); "global": the id as it is (ids must be unique across files)."""
    if text_unit not in TEXT_UNITS:
        raise ValueError(f"text_unit must be one of {TEXT_UNITS}, got {text_unit!r}")
    if id_scope not in ID_SCOPES:
        raise ValueError(f"id_scope must be one of {ID_SCOPES}, got {id_scope!r}")
    id_field = _IdField(id_field)
    id_field.prefix = f"{inp.rel}#" if id_scope == "file" else ""
    kind, compression = file_format(inp.path)
    try:
        raw = open(inp.path, "rb", buffering=_CHUNK)   # _binary peeks at _CHUNK bytes
    except OSError as e:
        yield BadRecord(inp.rel, 0, "unreadable", str(e))
        return
    with raw:
        stream = _decompressed(raw, compression, _gzip_damage(inp.path) if compression == "gzip"
                               else None)
        if inp.end >= 0:
            if kind not in ("jsonl", "parquet") or compression:
                raise ValueError(f"{inp.rel}: parts are for uncompressed jsonl and parquet only")
            if kind == "jsonl":
                yield from _read_jsonl_range(inp, raw, text_field, id_field, max_record_bytes)
            else:
                yield from _read_parquet(inp, stream, None, text_field, id_field, max_record_bytes)
        elif kind != "parquet" and (why := _binary(stream)):
            yield BadRecord(inp.rel, 0, "binary_file", f"{why}; file skipped")
        elif kind == "jsonl":
            yield from _read_jsonl(inp, stream, text_field, id_field, max_record_bytes)
        elif kind == "parquet":
            yield from _read_parquet(inp, stream, compression, text_field, id_field,
                                     max_record_bytes)
        else:
            yield from _read_text(inp, stream, text_unit, max_record_bytes)


def _binary(stream: BinaryIO) -> str | None:
    """Why the stream's first bytes look binary (dataprep.binary), or None. Peeks: reads nothing."""
    from mspretrain.dataprep.binary import HEAD_BYTES, binary_reason
    try:
        return binary_reason(stream.peek(HEAD_BYTES)[:HEAD_BYTES])
    except _Damaged:      # the reader reports the damage itself
        return None


def _decompressed(raw: BinaryIO, compression: str | None, stop=None) -> BinaryIO:
    if compression:
        return io.BufferedReader(_StreamRaw(raw, compression, stop), _CHUNK)
    return raw


def _gzip_damage(path: Path) -> tuple[int, str] | None:
    """(decompressed offset, why) of the first gzip member that fails its check, or None.

    A gzip member's CRC comes at its end, so a flipped byte in a stored (level 0) member, or one
    that still inflates, shows only after every line of the member has been read: nothing of that
    member can be trusted, the lines before the damage included. So gzip files are checked first,
    member by member (one more decompression, no more memory than the reader's), and the reader
    stops at the start of a damaged member. A stream that is only cut short passes here: the
    reader reports it where it ends."""
    offset, start, obj = 0, 0, None
    try:
        with open(path, "rb", buffering=_CHUNK) as f:
            while chunk := f.read(_CHUNK):
                for i in range(0, len(chunk), _FEED):
                    data = chunk[i:i + _FEED]
                    while data:
                        if obj is None or obj.eof:
                            if obj is not None:
                                data = data.lstrip(b"\0")
                                if not data:
                                    break
                            obj, start = zlib.decompressobj(31), offset
                        offset += len(obj.decompress(data))
                        data = obj.unused_data if obj.eof else b""
    except zlib.error as e:
        return start, (f"gzip member from decompressed byte {start} fails its check ({e}): none "
                       f"of its lines can be trusted")
    except OSError:
        return None      # the reader reports what it cannot read
    return None


class _StreamRaw(io.RawIOBase):
    """Decompresses every gzip member or zstd frame of `raw`, incrementally: every byte decoded
    before a damage is delivered first, and only then does the damage raise _Damaged. So the lines
    before a cut or a corrupt spot all reach the reader (gzip.GzipFile would drop the whole
    buffered block around it). Input is fed in small pieces, so that a corrupt spot costs at most
    the output of one piece."""

    def __init__(self, raw: BinaryIO, compression: str, stop: tuple[int, str] | None = None):
        self._raw, self._gzip = raw, compression == "gzip"
        self._stop, self._decoded = stop, 0    # (offset, why): deliver nothing from there on
        self._name = "gzip" if self._gzip else "zstd"
        self._dctx = None if self._gzip else zstandard.ZstdDecompressor()
        self._obj = None                     # decompressor of the current member or frame
        self._pending, self._pos = b"", 0    # decoded bytes not yet delivered
        self._damage: _Damaged | None = None

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        while self._pos == len(self._pending):
            if self._damage is not None:
                raise self._damage
            if not self._fill():
                return 0
        n = min(len(buf), len(self._pending) - self._pos)
        buf[:n] = self._pending[self._pos:self._pos + n]
        self._pos += n
        return n

    def _fill(self) -> bool:
        """Decode one more input chunk into _pending; False at a clean end of the stream."""
        chunk = self._raw.read(_CHUNK)
        if not chunk:
            if self._obj is not None and not self._obj.eof:
                self._damage = _Damaged("truncated_compressed",
                                        f"{self._name} stream ends early (cut short)")
                return True
            return False
        out = []
        for i in range(0, len(chunk), _FEED):
            try:
                self._decode(chunk[i:i + _FEED], out)
            except (zlib.error, zstandard.ZstdError) as e:
                self._damage = _Damaged("corrupt_compressed", f"{self._name} stream is corrupt: {e}")
                break
        self._pending, self._pos = b"".join(out), 0
        if self._stop is not None and self._decoded + len(self._pending) >= self._stop[0]:
            self._pending = self._pending[:self._stop[0] - self._decoded]
            self._damage = _Damaged("corrupt_compressed", self._stop[1])
        self._decoded += len(self._pending)
        return True

    def _decode(self, data: bytes, out: list) -> None:
        while data:
            if self._obj is None or self._obj.eof:   # the next gzip member / zstd frame
                if self._gzip and self._obj is not None:
                    data = data.lstrip(b"\0")       # zero padding after a member (as gzip allows)
                    if not data:
                        return
                self._obj = zlib.decompressobj(31) if self._gzip else self._dctx.decompressobj()
            out.append(self._obj.decompress(data))
            data = self._obj.unused_data if self._obj.eof else b""


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
        while (rest := stream.readline(_CHUNK)) and not rest.endswith(b"\n"):
            n += len(rest)
        yield TooLong(n + len(rest))


def too_long(rel: str, line: int, nbytes: int, cap: int) -> BadRecord:
    return BadRecord(rel, line, "record_too_long",
                     f"{nbytes} bytes, over input.max_record_bytes = {cap}; record skipped")


class _IdField(str):
    """The id field's name, carrying the prefix of the file's ids (read_file's id_scope)."""
    prefix = ""


def _record_id(rec: dict, id_field: str, rel: str, line: int) -> str | None:
    """The id field's value as the doc_id (an integer as its digits: 1 and "1" are one id), or
    REL:LINE for a record without one; None for a value that is no string or integer."""
    value = rec.get(id_field)
    if value is None:
        return f"{rel}:{line}"
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    return getattr(id_field, "prefix", "") + str(value)


def _read_jsonl(inp: InputFile, stream: BinaryIO, text_field: str, id_field: str,
                cap: int = 0) -> Iterator[Document | BadRecord]:
    line, records = 0, 0
    try:
        for raw_line in capped_lines(stream, cap):
            line += 1
            s = (too_long(inp.rel, line, raw_line, cap) if isinstance(raw_line, TooLong)
                 else _decode_line(inp.rel, line, raw_line))
            if isinstance(s, BadRecord):
                records += 1
                yield s
                continue
            if not s.strip():
                continue
            records += 1
            yield _json_record(inp.rel, line, s, text_field, id_field)
    except _Damaged as e:
        yield BadRecord(inp.rel, line + 1, e.reason, e.detail)
        return
    if records == 0:
        yield BadRecord(inp.rel, 0, "empty_file", "no records")


def _read_jsonl_range(inp: InputFile, raw: BinaryIO, text_field: str, id_field: str,
                      cap: int = 0) -> Iterator[Document | BadRecord]:
    """The records of the lines in [inp.start, inp.end) (both at line starts), numbered as in the
    whole file. A part never reports the file empty: split_jsonl only splits large files."""
    raw.seek(inp.start)
    line, pos = inp.first_line, inp.start
    for raw_line in capped_lines(raw, cap):
        if pos >= inp.end:
            break
        line += 1
        if isinstance(raw_line, TooLong):
            pos += raw_line
            yield too_long(inp.rel, line, raw_line, cap)
            continue
        pos += len(raw_line)
        s = _decode_line(inp.rel, line, raw_line)
        if isinstance(s, BadRecord):
            yield s
        elif s.strip():
            yield _json_record(inp.rel, line, s, text_field, id_field)


def split_input(inp: InputFile, part_bytes: int) -> list[InputFile]:
    """A large uncompressed jsonl or parquet file as parts of about part_bytes, in file order (the
    file itself where it cannot or need not be cut: a compressed stream cannot be entered in the
    middle)."""
    kind, compression = file_format(inp.path)
    if compression or inp.path.stat().st_size <= part_bytes:
        return [inp]
    if kind == "jsonl":
        return split_jsonl(inp, part_bytes)
    if kind == "parquet":
        return split_parquet(inp, part_bytes)
    return [inp]


def split_parquet(inp: InputFile, part_bytes: int) -> list[InputFile]:
    """An uncompressed parquet file cut between row groups into parts of about part_bytes of
    compressed data (one row group may be larger), each knowing the rows before it. Reads only
    the file's footer; a file that pyarrow cannot open stays whole, to be reported by its reader."""
    try:
        meta = pq.ParquetFile(inp.path).metadata
    except (pa.ArrowException, OSError):
        return [inp]
    groups = [(meta.row_group(g).num_rows,
               sum(meta.row_group(g).column(c).total_compressed_size
                   for c in range(meta.num_columns))) for g in range(meta.num_row_groups)]
    parts, start, rows, size = [], 0, 0, 0
    for g, (n, nbytes) in enumerate(groups):
        size += nbytes
        if size >= part_bytes or g == len(groups) - 1:
            parts.append(InputFile(inp.path, inp.rel, start, g + 1, rows))
            rows += sum(k for k, _ in groups[start:g + 1])
            start, size = g + 1, 0
    return parts if len(parts) > 1 else [inp]


def split_jsonl(inp: InputFile, part_bytes: int) -> list[InputFile]:
    """An uncompressed jsonl file cut at line starts into parts of about part_bytes (the file itself
    if it is not larger), each knowing the number of lines before it. Reads the file once, in
    blocks (counting newlines is all it does)."""
    kind, compression = file_format(inp.path)
    size = inp.path.stat().st_size
    if kind != "jsonl" or compression or size <= part_bytes:
        return [inp]
    cuts, lines, pos, target = [(0, 0)], 0, 0, part_bytes
    with open(inp.path, "rb") as f:
        while block := f.read(_TEXT_CHUNK):
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


def _json_record(rel: str, line: int, s: str, text_field: str,
                 id_field: str) -> Document | BadRecord:
    try:
        rec = json.loads(s)
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
    doc_id = _record_id(rec, id_field, rel, line)
    if doc_id is None:
        return BadRecord(rel, line, "invalid_id", f"field {id_field!r} is not a string or integer")
    if _SURROGATE_ESCAPE.search(s):   # rare: only then is the (costly) check worth it
        for name, value in ((id_field, doc_id), (text_field, text)):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:
                return BadRecord(rel, line, "invalid_unicode",
                                 f"field {name!r} holds a lone surrogate ({value[e.start]!r}), "
                                 f"which no UTF-8 text can hold")
    return Document(doc_id, text, rel)


# a JSON escape of a UTF-16 surrogate: the only way a lone one gets into a decoded line
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _read_text(inp: InputFile, stream: BinaryIO, text_unit: str,
               cap: int = 0) -> Iterator[Document | BadRecord]:
    """Whole file (text_unit="file") or blank-line separated paragraphs.

    A line that is not UTF-8 gives a BadRecord and is left out of its document.
    """
    if text_unit == "file":
        yield from _read_whole_text(inp, stream, cap)
        return
    parts: list[str] = []
    first, line, produced = 0, 0, False
    size = 0   # bytes of the paragraph so far; over the cap, its parts are dropped as they come
    try:
        for raw_line in capped_lines(stream, cap):
            line += 1
            if isinstance(raw_line, TooLong):
                s = "\0"            # a line too long to hold: it is not blank
            else:
                s = _decode_line(inp.rel, line, raw_line)
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
    except _Damaged as e:
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


def _read_whole_text(inp: InputFile, stream: BinaryIO,
                     cap: int = 0) -> Iterator[Document | BadRecord]:
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
            for raw_line in _split_lines(chunk):
                line += 1
                s = _decode_line(inp.rel, line, raw_line)
                if isinstance(s, BadRecord):
                    yield s
                else:
                    parts.append(s)
    except _Damaged as e:
        yield BadRecord(inp.rel, line + 1, e.reason, e.detail)
        return
    text = "".join(parts)
    if text.strip():
        yield Document(f"{inp.rel}:1", text, inp.rel)
    else:
        yield BadRecord(inp.rel, 0, "empty_file", "no text")


def _decode_line(rel: str, line: int, raw: bytes) -> str | BadRecord:
    """One line as text, or the invalid_utf8 BadRecord that names it."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return BadRecord(rel, line, "invalid_utf8", f"byte {e.start}: {e.reason}")


def _split_lines(chunk: bytes) -> list[bytes]:
    """The lines of `chunk`, split at newline bytes only (as iterating a binary file does)."""
    lines = [x + b"\n" for x in chunk.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def _read_parquet(inp: InputFile, stream: BinaryIO, compression: str | None, text_field: str,
                  id_field: str, cap: int = 0) -> Iterator[Document | BadRecord]:
    """Rows streamed batch by batch; rows are numbered from 1 (0 means the whole file). A part
    (inp.end >= 0) reads its row groups [inp.start, inp.end), numbered as in the whole file."""
    try:
        source = io.BytesIO(stream.read()) if compression else stream
        pf = pq.ParquetFile(source)
    except _Damaged as e:
        yield BadRecord(inp.rel, 0, e.reason, e.detail)
        return
    except (pa.ArrowException, OSError) as e:
        yield BadRecord(inp.rel, 0, "unreadable", f"not a readable parquet file: {e}")
        return
    names = pf.schema_arrow.names
    if text_field not in names:
        yield BadRecord(inp.rel, 0, "missing_text_field", f"no column {text_field!r}")
        return
    text_type = pf.schema_arrow.field(text_field).type
    if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
        yield BadRecord(inp.rel, 0, "text_not_string", f"column {text_field!r} is {text_type}")
        return
    columns = [text_field] + ([id_field] if id_field in names and id_field != text_field else [])
    part = inp.end >= 0
    row = inp.first_line if part else 0
    groups = range(inp.start, inp.end) if part else None
    try:
        for batch in pf.iter_batches(batch_size=_PARQUET_BATCH, row_groups=groups, columns=columns):
            texts = batch.column(0)
            sizes = pc.binary_length(texts).to_numpy(zero_copy_only=False) if cap > 0 else None
            if sizes is not None and (sizes > cap).any():   # null sizes are NaN: never over
                over = sizes > cap
                texts = pc.if_else(pa.array(over), pa.scalar(None, texts.type), texts)
            texts = texts.to_pylist()
            ids = batch.column(1).to_pylist() if len(columns) > 1 else [None] * len(texts)
            for k, (text, rid) in enumerate(zip(texts, ids)):
                row += 1
                if sizes is not None and sizes[k] > cap:
                    yield too_long(inp.rel, row, int(sizes[k]), cap)
                else:
                    yield _parquet_row(inp.rel, row, text, rid, text_field, id_field)
    except (pa.ArrowException, OSError) as e:
        yield BadRecord(inp.rel, row + 1, "unreadable", f"parquet read failed: {e}")
        return
    if row == 0 and not part:    # a part never reports the file empty
        yield BadRecord(inp.rel, 0, "empty_file", "no rows")


def _parquet_row(rel: str, row: int, text, rid, text_field: str,
                 id_field: str) -> Document | BadRecord:
    if text is None:
        return BadRecord(rel, row, "missing_text_field", f"column {text_field!r} is null")
    doc_id = _record_id({id_field: rid}, id_field, rel, row)
    if doc_id is None:
        return BadRecord(rel, row, "invalid_id", f"column {id_field!r} is not a string or integer")
    return Document(doc_id, text, rel)
