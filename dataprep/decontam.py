"""Benchmark decontamination: drop documents that contain evaluation text, or cut that text out.

The evaluation files are JSON lines with a `text` field. Texts are split into units: a lower-cased
run of letters and digits (a word of a space-separated language), or one CJK character (Chinese and
Japanese have no spaces, so their n-grams are character n-grams). Every n-gram of `ngram` units of
every evaluation item goes into the index (an item shorter than that is one n-gram of all its
units). A document matches an item when it contains one of the item's n-grams.

Matching is vectorised (`textunits`): the units of a document, their hashes and the hashes of
every window of n units come from a few whole-array numpy passes; a window is looked up in a bitmap
of the index's window hashes, then by binary search, and only those hits are compared exactly
(unit strings against the vocabulary, n-grams against the index). `action: cut` removes the span
from the first to the last unit of each matched run of windows and keeps the rest; `drop` removes
the whole document.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from dataprep import textunits
from mspretrain.jsonl import read_json_lines

ACTIONS = ("drop", "cut")
_UNIT = re.compile(rf"[{textunits.CJK}]|[^\W_]+")
_BITMAP_SLOTS = 64      # bitmap entries per window hash of the index: ~1.5% false hits


class DecontamError(ValueError):
    """A bad evaluation file; the message names the file and line."""


@dataclass(frozen=True)
class DecontamConfig:
    files: tuple[str, ...] = field(default=())   # evaluation sets: JSON lines with `text`
    ngram: int = 13                               # units per n-gram
    action: str = "drop"                          # drop | cut
    text_field: str = "text"

    def __post_init__(self):
        if self.action not in ACTIONS:
            raise ValueError(f"decontam.action must be drop or cut, got {self.action!r}")
        if self.ngram < 1:
            raise ValueError(f"decontam.ngram must be >= 1, got {self.ngram}")


def units(text: str) -> list[str]:
    return [u.lower() for u in _UNIT.findall(text)]


class EvalIndex:
    """The n-grams of a set of evaluation items."""

    def __init__(self, items: list[tuple[str, str]], ngram: int):
        """`items`: (item id, text), e.g. ("eval.jsonl:3", "...")."""
        self.ngram, self.item_ids = ngram, [i for i, _ in items]
        self.vocab: dict[str, int] = {}
        grams: dict[tuple, int] = {}     # n-gram of unit ids -> first item holding it
        windows: dict[int, list[np.ndarray]] = {}
        for number, (_, text) in enumerate(items):
            starts, ends, hashes = textunits.units(text)
            ids = [self.vocab.setdefault(text[a:b].lower(), len(self.vocab))
                   for a, b in zip(starts.tolist(), ends.tolist())]
            if not ids:
                continue
            n = min(ngram, len(ids))
            windows.setdefault(n, []).append(
                textunits.windows(textunits.window_prefix(hashes), n))
            for s in range(len(ids) - n + 1):
                grams.setdefault(tuple(ids[s:s + n]), number)
        self.grams, self.lengths = grams, sorted(windows)
        self.hashes = {n: np.unique(np.concatenate(w)) for n, w in windows.items()}
        total = sum(len(h) for h in self.hashes.values())
        bits = min(max(_BITMAP_SLOTS * total, 1 << 16).bit_length(), 25)
        self._shift = np.uint64(64 - bits)
        self._bitmap = np.zeros(1 << bits, bool)
        for h in self.hashes.values():
            self._bitmap[h >> self._shift] = True

    def _candidates(self, prefix: np.ndarray, n: int) -> np.ndarray:
        """The starts of the windows of n units whose hash is one of the index's."""
        w = textunits.windows(prefix, n)
        maybe = np.flatnonzero(self._bitmap[w >> self._shift])
        if not len(maybe):
            return maybe
        w, table = w[maybe], self.hashes[n]
        pos = np.minimum(np.searchsorted(table, w), len(table) - 1)
        return maybe[table[pos] == w]

    def find(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """(matched item numbers, sorted; character spans of the matches, merged)."""
        if not self.grams:
            return [], []
        starts, ends, hashes = textunits.units(text)
        prefix = textunits.window_prefix(hashes)
        found = [(n, c) for n in self.lengths if len(hashes) >= n
                 for c in [self._candidates(prefix, n)] if len(c)]
        if not found:
            return [], []
        # exact check of the hits only: the strings of their units, then their n-grams
        starts, ends = starts.tolist(), ends.tolist()
        ids = [-1] * len(starts)
        known = np.zeros(len(starts) + 1, np.int64)
        for n, cands in found:
            np.add.at(known, cands, 1)
            np.add.at(known, cands + n, -1)
        get, lower = self.vocab.get, str.lower
        for u in np.flatnonzero(np.cumsum(known[:-1])).tolist():
            ids[u] = get(lower(text[starts[u]:ends[u]]), -1)
        items: set[int] = set()
        unit_spans: list[tuple[int, int]] = []
        for n, cands in found:
            for s in cands.tolist():
                item = self.grams.get(tuple(ids[s:s + n]))
                if item is not None:     # not a hash collision
                    items.add(item)
                    unit_spans.append((s, s + n - 1))
        if not items:
            return [], []
        spans: list[list[int]] = []
        for a, b in sorted(unit_spans):
            start, end = starts[a], ends[b]
            if spans and start <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], end)
            else:
                spans.append([start, end])
        return sorted(items), [tuple(s) for s in spans]


def cut(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` without the character spans."""
    out, pos = [], 0
    for a, b in spans:
        out.append(text[pos:a])
        pos = b
    out.append(text[pos:])
    return "".join(out).strip()


def read_items(path: str, text_field: str = "text") -> list[tuple[str, str]]:
    """(`file:line`, text) of every line of an evaluation file."""
    p = Path(path)
    if not p.is_file():
        raise DecontamError(f"decontam.files: {path} not found")
    items = []
    for line_no, rec in read_json_lines(p, DecontamError):
        if not isinstance(rec, dict) or not isinstance(rec.get(text_field), str):
            raise DecontamError(f"{path}:{line_no}: no string field {text_field!r}")
        items.append((f"{p.name}:{line_no}", rec[text_field]))
    return items


@lru_cache(maxsize=2)
def load_index(files: tuple[str, ...], ngram: int, text_field: str = "text") -> EvalIndex:
    """The index of the evaluation files (built once per process)."""
    return EvalIndex([it for f in files for it in read_items(f, text_field)], ngram)
