"""The input formats, by file suffix, and `read_file`, which opens a file, decompresses it and hands
the stream to its format's reader.

A format is one reader function registered for its suffixes, in its own module:

    @register(".jsonl", ".ndjson", ".json", split=split_jsonl)
    def read_jsonl(inp: InputFile, stream: BinaryIO, opts: ReadOptions) -> Iterator[...]:
        ...   # Documents and BadRecords, in file order

The suffix looked up is the last one before an optional .gz / .zst / .zstd, case-insensitive; a
suffix no format claims is read by the default format (plain text). Formats from other packages
register the same way, in a module named by an entry point of the group `mspretrain.readers`:
every process (the build's, a Ray worker) imports those modules before it looks up its first
format, so a format reads the same wherever a file is read (docs/extending.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from mspretrain.common.errors import MspretrainError
from mspretrain.dataprep.readers.binary import HEAD_BYTES, binary_reason
from mspretrain.dataprep.readers.compressed import (CHUNK, COMPRESSION_SUFFIXES, Damaged,
                                                    compression_of, decompressed, gzip_damage)
from mspretrain.dataprep.records import BadRecord, Document, InputFile

TEXT_UNITS = ("file", "paragraph")
ID_SCOPES = ("global", "file")
PLUGIN_GROUP = "mspretrain.readers"


@dataclass(frozen=True)
class ReadOptions:
    """The `input` config a reader follows."""
    text_field: str = "text"      # the field or column holding the text
    id_field: str = "id"          # the field or column whose value is the doc_id, where present
    text_unit: str = "file"       # plain text: one document per file or per paragraph
    max_record_bytes: int = 0     # a longer record is a record_too_long bad record; 0: no cap
    id_prefix: str = ""           # put before every id value (id_scope "file": "REL#")

    def doc_id(self, value, rel: str, line: int) -> str | None:
        """The id field's value as the doc_id (an integer as its digits: 1 and "1" are one id), or
        REL:LINE for a record without one; None for a value that is no string or integer."""
        if value is None:
            return f"{rel}:{line}"
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            return None
        return self.id_prefix + str(value)


Reader = Callable[[InputFile, BinaryIO, ReadOptions], Iterator["Document | BadRecord"]]
Splitter = Callable[[InputFile, int], "list[InputFile]"]


@dataclass(frozen=True)
class Format:
    name: str
    read: Reader      # yields the documents and bad records of the file (or part), in file order
    suffixes: tuple[str, ...]
    # cuts a large uncompressed file into parts of about N bytes, each an InputFile with end >= 0
    # that `read` reads as that part of the whole (the Ray engine's work units); None: never cut
    split: Splitter | None = None
    binary: bool = False   # a binary format: not checked for binary content before reading
    # registered by a built-in module or an entry point's, so in every process that reads files
    # (False: by a module this process imported, which Ray workers never import)
    everywhere: bool = True


_BY_SUFFIX: dict[str, Format] = {}
_DEFAULT: dict[str, Format] = {}      # "" -> the format of unclaimed suffixes


def register(*suffixes: str, split: Splitter | None = None, binary: bool = False,
             default: bool = False, name: str = ""):
    """Decorator: the reader reads files with these suffixes (and, with default=True, every suffix
    no format claims). The format's name is `name`, else the function's without `read_`. A suffix
    already read by another format is an error; the same function registered again under the same
    name (a module imported twice) replaces itself."""
    def add(read: Reader) -> Reader:
        everywhere = _plugins.get("loading", False) or read.__module__.startswith(__package__ + ".")
        fmt = Format(name or read.__name__.removeprefix("read_"), read,
                     tuple(s.lower() for s in suffixes), split, binary, everywhere)
        claims = [(_BY_SUFFIX, s, f"suffix {s}") for s in fmt.suffixes]
        claims += [(_DEFAULT, "", "the default format")] if default else []
        for s in fmt.suffixes:
            if not s.startswith(".") or s in COMPRESSION_SUFFIXES:
                raise ValueError(f"reader {fmt.name!r}: {s!r} is not a format suffix (one like "
                                 f"'.csv'; compression is read before the format)")
        for table, key, what in claims:    # all checked before any is taken
            old = table.get(key)
            if old is not None and (old.name, _where(old)) != (fmt.name, _where(fmt)):
                raise ValueError(f"reader {fmt.name!r} ({_where(fmt)}): {what} is already read "
                                 f"by {old.name!r} ({_where(old)})")
        for table, key, _ in claims:
            table[key] = fmt
        return read
    return add


def _where(fmt: Format) -> str:
    return f"{fmt.read.__module__}.{fmt.read.__qualname__}"


def format_of(path: Path) -> tuple[Format, str | None]:
    """(format, compression) of a file, by its name: compression gzip, zstd or None."""
    load_plugins()
    suffixes, compression = compression_of(path)
    fmt = _BY_SUFFIX.get(suffixes[-1]) if suffixes else None
    return fmt or _DEFAULT[""], compression


def file_format(path: Path) -> tuple[str, str | None]:
    """(format name, compression): jsonl, parquet, text or a plugin's; gzip, zstd or None."""
    fmt, compression = format_of(path)
    return fmt.name, compression


def splittable(path: Path) -> bool:
    """Whether split_input may cut the file into parts (its format splits; not compressed)."""
    fmt, compression = format_of(path)
    return fmt.split is not None and not compression


def this_process_only(paths) -> list[str]:
    """The formats of `paths` registered only in this process (not by an entry point): an engine
    whose workers read the files (Ray) cannot read them (see Format.everywhere)."""
    return sorted({fmt.name for fmt, _ in map(format_of, paths) if not fmt.everywhere})


def in_process_sources() -> list[str]:
    """The source files of the formats registered only in this process, for worker processes on
    this machine to load (`load_sources`): they then read every file as this process would."""
    formats = {*_BY_SUFFIX.values(), *_DEFAULT.values()}
    return sorted({f.read.__code__.co_filename for f in formats if not f.everywhere})


def load_sources(paths: list[str]) -> None:
    """Run each source file once as a module of its own (its @register calls register its formats)."""
    import importlib.util
    load_plugins()
    for k, path in enumerate(paths):
        spec = importlib.util.spec_from_file_location(f"mspretrain_in_process_reader_{k}", path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))


def split_input(inp: InputFile, part_bytes: int) -> list[InputFile]:
    """A large uncompressed file of a format that splits (jsonl, parquet) as parts of about
    part_bytes, in file order; the file itself where it cannot or need not be cut (a compressed
    stream cannot be entered in the middle)."""
    fmt, compression = format_of(inp.path)
    if compression or fmt.split is None or inp.path.stat().st_size <= part_bytes:
        return [inp]
    return fmt.split(inp, part_bytes)


class ReaderPluginError(MspretrainError, RuntimeError):
    """A module named by a `mspretrain.readers` entry point failed to import."""


_plugins: dict = {}    # "done": loaded; "loading": importing them now; "error": why loading failed


def load_plugins() -> None:
    """Import the modules of the `mspretrain.readers` entry points, once per process, in name order
    (their @register calls add their formats); a failure is raised on every later call too."""
    if "done" not in _plugins:
        _plugins.update(done=True, loading=True)
        from importlib.metadata import entry_points
        try:
            for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda e: (e.name, e.value)):
                try:
                    ep.load()
                except Exception as e:
                    _plugins["error"] = ReaderPluginError(
                        f"reader plugin {ep.name} = {ep.value} (entry point group {PLUGIN_GROUP}) "
                        f"failed to load: {type(e).__name__}: {e}")
                    break
        finally:
            _plugins["loading"] = False
    if "error" in _plugins:
        raise _plugins["error"]


def read_file(inp: InputFile, text_field: str = "text", id_field: str = "id",
              text_unit: str = "file", max_record_bytes: int = 0,
              id_scope: str = "global") -> Iterator[Document | BadRecord]:
    """Documents and bad records of one input file (or part), in file order.

    Every reader yields `Document`s and, for anything it cannot turn into a document, a `BadRecord`
    naming the file, the 1-based line (or parquet row; 0 for the whole file) and a short stable
    reason. Nothing is skipped without a record, except blank lines in jsonl, which hold no record.
    A text file whose first bytes look binary (readers.binary) is one `binary_file` record. A
    damaged compressed stream yields every document decoded before the damage, then one record
    (truncated_compressed | corrupt_compressed) naming the first line not read whole
    (readers.compressed). A record longer than `max_record_bytes` (0: no cap) is never held whole:
    it is a `record_too_long` record naming its first line, so one giant record cannot set the
    memory of a build. id_scope "file": a record's id is namespaced by its file, `REL#ID` (ids
    that restart in every file stay apart); "global": the id as it is (ids must be unique across
    files)."""
    if text_unit not in TEXT_UNITS:
        raise ValueError(f"text_unit must be one of {TEXT_UNITS}, got {text_unit!r}")
    if id_scope not in ID_SCOPES:
        raise ValueError(f"id_scope must be one of {ID_SCOPES}, got {id_scope!r}")
    opts = ReadOptions(text_field, id_field, text_unit, max_record_bytes,
                       f"{inp.rel}#" if id_scope == "file" else "")
    fmt, compression = format_of(inp.path)
    if inp.end >= 0 and (fmt.split is None or compression):
        raise ValueError(f"{inp.rel}: parts are for uncompressed files of a format that splits")
    try:
        raw = open(inp.path, "rb", buffering=CHUNK)   # _binary peeks at CHUNK bytes
    except OSError as e:
        yield BadRecord(inp.rel, 0, "unreadable", str(e))
        return
    with raw:
        if inp.end >= 0:   # a part: the reader seeks in the file itself
            yield from fmt.read(inp, raw, opts)
            return
        stream = decompressed(raw, compression, gzip_damage(inp.path) if compression == "gzip"
                              else None)
        if not fmt.binary and (why := _binary(stream)):
            yield BadRecord(inp.rel, 0, "binary_file", f"{why}; file skipped")
        else:
            yield from fmt.read(inp, stream, opts)


def _binary(stream: BinaryIO) -> str | None:
    """Why the stream's first bytes look binary (readers.binary), or None. Peeks: reads nothing."""
    try:
        return binary_reason(stream.peek(HEAD_BYTES)[:HEAD_BYTES])
    except Damaged:      # the reader reports the damage itself
        return None
