"""What the readers hand to the rest of a build: the file being read (`InputFile`), each document
(`Document`) and each record that could not become one (`BadRecord`); and the held-out split of a
document (`SPLITS`, `split_of`) with a split's tokenized documents (`SplitTokens`), which the later
stages and the report hand each other.

A document carries no split: the split is a hash of its doc_id under `pack.valid_fraction` and
`pack.split_seed` (`split_of`), computed once by stage 1, so it depends on the config and never on
how the document was read.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar, Mapping

import numpy as np

SPLITS = ("train", "valid")


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


def split_of(doc_id: str, valid_fraction: float, seed: int) -> str:
    """The held-out split by document: a hash of (seed, doc_id) against valid_fraction. Called once
    per document, by stage 1, which stores it in the chunk's `split` column for every later stage."""
    return "valid" if unit_hash(f"split:{seed}:{doc_id}") < valid_fraction else "train"


def unit_hash(s: str) -> float:
    """A stable hash of `s` mapped to [0, 1)."""
    return int.from_bytes(hashlib.blake2b(s.encode("utf-8"), digest_size=8).digest(), "big") / 2**64


@dataclass
class SplitTokens:
    """The kept documents of one split of one chunk, in input order, tokenized: what stage 5 packs
    and writes to the provenance, with no need to go back to the stage-1 chunk file."""
    tokens: np.ndarray      # int32, flat, EOS after every document
    lens: np.ndarray        # int32, tokens per document, EOS included
    doc_ids: list[str]
    quality: np.ndarray | None = None   # float64 classifier scores, with filters.quality.model

    def arrays(self, split: str) -> dict:
        """The .npz arrays of this split; the ids as UTF-8 bytes and end offsets (numpy's str
        arrays would drop a trailing NUL of an id)."""
        raw = [d.encode("utf-8") for d in self.doc_ids]
        ends = np.cumsum([len(r) for r in raw], dtype=np.int64)
        out = {f"{split}_tokens": self.tokens, f"{split}_lens": self.lens,
               f"{split}_ids": np.frombuffer(b"".join(raw), np.uint8), f"{split}_id_ends": ends}
        if self.quality is not None:
            out[f"{split}_quality"] = self.quality
        return out

    @classmethod
    def load(cls, z, split: str, tokens: bool = True) -> "SplitTokens":
        """The split's record from an open tokens .npz (np.load); `tokens=False` leaves the token
        ids unread (None), for a reader that needs only the lengths and ids."""
        raw, ends = z[f"{split}_ids"].tobytes(), z[f"{split}_id_ends"].tolist()
        ids = [raw[a:b].decode("utf-8") for a, b in zip([0] + ends[:-1], ends)]
        quality = z[f"{split}_quality"] if f"{split}_quality" in z.files else None
        return cls(z[f"{split}_tokens"] if tokens else None, z[f"{split}_lens"], ids, quality)
