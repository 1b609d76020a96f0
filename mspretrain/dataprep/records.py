"""What the readers hand to the rest of a build: the file being read (`InputFile`), each document
(`Document`) and each record that could not become one (`BadRecord`).

A document carries no split: the split is a hash of its doc_id under `pack.valid_fraction` and
`pack.split_seed` (stages.split_of), computed once by stage 1, so it depends on the config and
never on how the document was read.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


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


@dataclass(frozen=True)
class Document:
    doc_id: str  # the record's id field where present, else f"{rel}:{line_or_row}"
    text: str    # raw text as read (not cleaned)
    source: str  # InputFile.rel
    # what a reader knows of the record besides its text, for steps that want it; no built-in
    # reader fills it, and nothing of it reaches the dataset
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class BadRecord:
    file: str    # InputFile.rel
    line: int    # 1-based line (jsonl, text) or row (parquet); 0 for the whole file
    reason: str  # stable code: invalid_json, invalid_utf8, missing_text_field, ...
    detail: str  # human-readable detail
