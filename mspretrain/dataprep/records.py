"""What the readers hand to the rest of a build: the file being read (`InputFile`), each document
(`Document`) and each record that could not become one (`BadRecord`).

A document carries no split: the split is a hash of its doc_id under `pack.valid_fraction` and
`pack.split_seed` (stages.split_of), computed once by stage 1, so it depends on the config and
never on how the document was read.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar, Mapping


@dataclass(frozen=True)
class InputFile:
    path: Path  # absolute path
    rel: str    # stable name used in doc_ids (relative to the INPUT directory, or the file name)
    # A part of a large file, read as a part of the whole (readers.split_input): a byte range of an
    # uncompressed jsonl file, its lines numbered from first_line + 1, or a range of row groups
    # of an uncompressed parquet file, its rows numbered from first_line + 1. end < 0: the whole.
    start: int = 0
    end: int = -1
    first_line: int = 0


@dataclass(frozen=True, init=False)
class Document:
    doc_id: str  # the record's id field where present, else f"{rel}:{line_or_row}"
    text: str    # raw text as read (not cleaned)
    source: str  # InputFile.rel
    # What a reader knows of the record besides its text, for steps that want it (no built-in
    # reader fills it, and nothing of it reaches the dataset). Held by the instance only when
    # given: a document without it pickles to the workers as cheaply as its three strings.
    metadata: ClassVar[Mapping] = MappingProxyType({})

    def __init__(self, doc_id: str, text: str, source: str, metadata: Mapping | None = None):
        object.__setattr__(self, "doc_id", doc_id)
        object.__setattr__(self, "text", text)
        object.__setattr__(self, "source", source)
        if metadata:
            object.__setattr__(self, "metadata", dict(metadata))

    def __eq__(self, other):
        return vars(self) == vars(other) if other.__class__ is Document else NotImplemented

    def __hash__(self):
        return hash((self.doc_id, self.text, self.source))


@dataclass(frozen=True)
class BadRecord:
    file: str    # InputFile.rel
    line: int    # 1-based line (jsonl, text) or row (parquet); 0 for the whole file
    reason: str  # stable code: invalid_json, invalid_utf8, missing_text_field, ...
    detail: str  # human-readable detail
