"""Benchmark decontamination: drop documents that contain evaluation text, or cut that text out.

The evaluation files are JSON lines with a `text` field. Texts are split into units: a lower-cased
run of letters and digits (a word of a space-separated language), or one CJK character (Chinese and
Japanese have no spaces, so their n-grams are character n-grams). Every n-gram of `ngram` units of
every evaluation item goes into the index (an item shorter than that is one n-gram of all its
units). A document matches an item when it contains one of the item's n-grams.

Matching is vectorised (`textunits`): the units of a document and their hashes come from a few
whole-array numpy passes. A bitmap of the evaluation units' hashes marks the units that may be
known, a second one the pairs of neighbouring units; only a run of n known units whose n - 1
pairs are known too can be an n-gram of the index, and most documents have none (a text of a few
thousand characters that folds below 256 gets this first look with cheaper keys of its units,
`textunits.byte_keys`, and is hashed only if it passes). The
windows in such runs are hashed from prefix sums and looked up by binary search, and only those
hits are compared exactly (unit strings against the vocabulary, n-grams against the index), so
the result is the plain search's. `action: cut` removes the span from the first to the last unit
of each matched run of windows and keeps the rest; `drop` removes the whole document.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mspretrain.common.errors import MspretrainError
from mspretrain.dataprep.steps import textunits
from mspretrain.common.jsonl import read_json_lines

ACTIONS = ("drop", "cut")
_UNIT = re.compile(rf"[{textunits.CJK}]|[^\W_]+")
_BITMAP_SLOTS = 64      # bitmap slots per evaluation unit: about 1 in 64 unknown units looks known


class DecontamError(MspretrainError, ValueError):
    """A bad evaluation file; the message names the file and line."""


@dataclass(frozen=True)
class DecontamConfig:
    files: tuple[str, ...] = field(default=())   # evaluation sets: JSON lines with `text`
    ngram: int = 13                               # units per n-gram
    action: str = "drop"                          # drop | cut
    text_field: str = "text"                      # the field holding the evaluation text

    def __post_init__(self):
        if self.action not in ACTIONS:
            raise ValueError(f"decontam.action must be drop or cut, got {self.action!r}")
        if self.ngram < 1:
            raise ValueError(f"decontam.ngram must be >= 1, got {self.ngram}")


def units(text: str) -> list[str]:
    """The units of `text`, lower-cased (the definition; find() gets the same from textunits)."""
    return [u.lower() for u in _UNIT.findall(text)]


class EvalIndex:
    """The n-grams of a set of evaluation items."""

    def __init__(self, items: list[tuple[str, str]], ngram: int):
        """`items`: (item id, text), e.g. ("eval.jsonl:3", "...")."""
        self.ngram, self.item_ids = ngram, [i for i, _ in items]
        self.vocab: dict[str, int] = {}
        textunits.code_point_tables()   # built here, once, rather than by the first document
        grams: dict[tuple, int] = {}     # n-gram of unit ids -> first item holding it
        windows: dict[int, list[np.ndarray]] = {}
        unit_hashes: list[np.ndarray] = []
        keys: list[int] = []        # the byte keys of the units, and of their pairs
        key_pairs: list[np.ndarray] = []
        for number, (_, text) in enumerate(items):
            starts, ends, hashes = textunits.units(text)
            ids = [self.vocab.setdefault(text[a:b].lower(), len(self.vocab))
                   for a, b in zip(starts.tolist(), ends.tolist())]
            if not ids:
                continue
            unit_hashes.append(hashes)
            item_keys = [textunits.byte_key(text[a:b])
                         for a, b in zip(starts.tolist(), ends.tolist())]
            keys += [k for k in item_keys if k is not None]
            both = np.array([a is not None and b is not None
                             for a, b in zip(item_keys, item_keys[1:])], bool)
            key_pairs.append(_pairs(np.array([k or 0 for k in item_keys], np.uint64))[both])
            n = min(ngram, len(ids))
            windows.setdefault(n, []).append(
                textunits.windows(textunits.window_prefix(hashes), n))
            for s in range(len(ids) - n + 1):
                grams.setdefault(tuple(ids[s:s + n]), number)
        self.grams, self.lengths = grams, sorted(windows)
        self.hashes = {n: np.unique(np.concatenate(w)) for n, w in windows.items()}
        self._known = _Bitmap(np.unique(np.concatenate(unit_hashes or [np.zeros(0, np.uint64)])))
        self._known_pairs = _Bitmap(np.unique(np.concatenate(
            [_pairs(h) for h in unit_hashes] or [np.zeros(0, np.uint64)])))
        self._key_known = _Bitmap(np.unique(np.array(keys, np.uint64)))
        self._key_pairs = _Bitmap(np.unique(np.concatenate(key_pairs or [np.zeros(0, np.uint64)])))

    def find(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """(matched item numbers, sorted; character spans of the matches, merged)."""
        if not self.grams:
            return [], []
        # a window can match only where all its n units may be known: a run of n in a bitmap
        # (a substring search over its bytes says so at C speed), and all its n - 1 pairs of
        # neighbouring units (common words are known one by one, far fewer of their pairs are).
        # Most documents have neither: first with the byte keys, which cost less than the hashes
        keyed = textunits.byte_keys(text)
        if keyed is not None and not self._may_match(keyed[2], self._key_known, self._key_pairs):
            return [], []
        starts, ends, hashes = textunits.units(text)
        known = self._known.has(hashes)
        if not self._may_match(hashes, self._known, self._known_pairs, known):
            return [], []
        run = np.zeros(len(hashes) + 1, np.int32)
        known.cumsum(out=run[1:])
        found, prefix = [], None
        for n in self.lengths:
            if len(hashes) < n:
                break
            cands = ((run[n:] - run[:-n]) == n).nonzero()[0]
            if len(cands):
                if prefix is None:
                    prefix = textunits.window_prefix(hashes)
                w, table = textunits.windows_at(prefix, cands, n), self.hashes[n]
                cands = cands[table[np.minimum(np.searchsorted(table, w), len(table) - 1)] == w]
                if len(cands):
                    found.append((n, cands))
        if not found:
            return [], []
        return self._exact(text, starts, ends, found)

    def _may_match(self, hashes: np.ndarray, units: "_Bitmap", pairs: "_Bitmap",
                   known: np.ndarray | None = None) -> bool:
        """Whether the units (hashes or keys) hold a run of lengths[0] that may be known, whose
        pairs may be known too."""
        if known is None:
            known = units.has(hashes)
        return (b"\1" * self.lengths[0] in known.tobytes() and
                b"\1" * (self.lengths[0] - 1) in pairs.has(_pairs(hashes)).tobytes())

    def _exact(self, text: str, starts: np.ndarray, ends: np.ndarray,
               found: list[tuple[int, np.ndarray]]) -> tuple[list[int], list[tuple[int, int]]]:
        """find() for the windows whose hashes are the index's: compare the strings of their
        units with the vocabulary, then their n-grams with the index's."""
        m = len(starts)
        cover = np.zeros(m + 1, np.int64)
        for n, cands in found:
            cover += np.bincount(cands, minlength=m + 1) - np.bincount(cands + n, minlength=m + 1)
        used = np.flatnonzero(np.cumsum(cover[:m]))
        # lower-case the text once, where that is the same as unit by unit: no character whose
        # lower case is two (İ) or depends on what follows (Σ)
        low = text.lower() if "\u0130" not in text and "\u03a3" not in text else None
        get = self.vocab.get
        pairs = zip(starts[used].tolist(), ends[used].tolist())
        ids = np.full(m, -1, np.int64)
        ids[used] = ([get(low[a:b], -1) for a, b in pairs] if low is not None else
                     [get(text[a:b].lower(), -1) for a, b in pairs])
        ids = tuple(ids.tolist())
        grams = self.grams.get
        first, last, items = [], [], []
        for n, cands in found:
            item = np.array([grams(ids[s:s + n], -1) for s in cands.tolist()], np.int64)
            ok = item >= 0   # not a hash collision
            if ok.any():
                first.append(cands[ok])
                last.append(cands[ok] + (n - 1))
                items.append(item[ok])
        if not items:
            return [], []
        # merge the spans: sorted by (first unit, last unit), a span starts where the text of a
        # window starts after the end of every window before it
        first, last = np.concatenate(first), np.concatenate(last)
        if len(found) > 1:
            order = np.lexsort((last, first))
            first, last = first[order], last[order]
        a, b = starts[first], ends[last]
        reach = np.maximum.accumulate(b)
        new = np.flatnonzero(a[1:] > reach[:-1]) + 1
        return np.unique(np.concatenate(items)).tolist(), list(zip(a[np.append(0, new)].tolist(),
                                       reach[np.append(new - 1, len(a) - 1)].tolist()))


_PAIR = np.uint64(0x94D049BB133111EB)


def _pairs(hashes: np.ndarray) -> np.ndarray:
    """A hash of each pair of neighbouring units."""
    pairs = hashes[:-1] * _PAIR
    pairs += hashes[1:]
    return pairs


class _Bitmap:
    """A set of 64-bit hashes as a bit per slot (slot: the top bits): `has` may say yes for a
    hash that is not in the set (about 1 in _BITMAP_SLOTS), never no for one that is."""

    def __init__(self, hashes: np.ndarray):
        bits = min(max(_BITMAP_SLOTS * len(hashes), 1 << 12).bit_length(), 28)
        self.shift = np.uint64(64 - bits)
        self.slots = np.zeros(1 << bits, bool)
        self.slots[(hashes >> self.shift).view(np.int64)] = True

    def has(self, hashes: np.ndarray) -> np.ndarray:
        return self.slots.take((hashes >> self.shift).view(np.int64))


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


