"""Benchmark decontamination: drop documents that contain evaluation text, or cut that text out.

The evaluation files are JSON lines with a `text` field. Texts are split into units: a lower-cased
run of letters and digits (a word of a space-separated language), or one CJK character (Chinese and
Japanese have no spaces, so their n-grams are character n-grams). Every n-gram of `ngram` units of
every evaluation item goes into the index (an item shorter than that is one n-gram of all its
units). A document matches an item when it contains one of the item's n-grams.

Matching is vectorised: document units become ids of the evaluation vocabulary (-1 for a unit no
item has), the windows are hashed with a polynomial hash in numpy and looked up by binary search, and
only hits are compared exactly. `action: cut` removes the span from the first to the last unit of
each matched run of windows and keeps the rest; `drop` removes the whole document.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import repeat
from pathlib import Path

import numpy as np

from mspretrain.jsonl import read_json_lines

ACTIONS = ("drop", "cut")
_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_UNIT = re.compile(rf"[{_CJK}]|[^\W_]+")
# the same units in a text without CJK characters, without the alternation (twice as fast)
_HAS_CJK = re.compile(f"[{_CJK}]")
_WORD = re.compile(r"[^\W_]+")
_MULT = np.uint64(0x9E3779B97F4A7C15)
# ASCII text: letters and digits lower-cased, everything else a space, so that bytes.split() gives
# exactly the units _UNIT finds (on ASCII, [^\W_] is [A-Za-z0-9]) at C speed
_ASCII_UNITS = bytes(c + 32 if 65 <= c <= 90 else c if chr(c).isalnum() and c < 128 else 32
                     for c in range(256))


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


def _window_hashes(ids: np.ndarray, n: int) -> np.ndarray:
    """A polynomial hash, sum of (id + 1) * M**k over the window, of every window of n ids (uint64
    arithmetic wraps)."""
    return _windows(_prefix_sums(ids), n)


def _prefix_sums(ids: np.ndarray) -> np.ndarray:
    """[0, then the running sums of (id + 1) * M**i]: what _windows needs, for any n."""
    v = ids.astype(np.uint64) + np.uint64(1)
    prefix = np.zeros(len(v) + 1, np.uint64)
    np.cumsum(v * _powers(len(v))[0][:len(v)], out=prefix[1:])
    return prefix


def _windows(prefix: np.ndarray, n: int) -> np.ndarray:
    """The window hashes of n ids from their prefix sums: each window's sum divided by M**start
    (M is odd, so it has an inverse modulo 2**64); two array passes whatever n is."""
    m = len(prefix) - n
    return (prefix[n:] - prefix[:m]) * _powers(m)[1][:m]


_POWERS: list[np.ndarray] = [np.ones(0, np.uint64), np.ones(0, np.uint64)]


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(M**i, M**-i modulo 2**64) for i < n at least, grown by doubling and kept."""
    if len(_POWERS[0]) < n:
        size = max(n, 2 * len(_POWERS[0]), 1024)
        for k, base in enumerate((int(_MULT), pow(int(_MULT), -1, 1 << 64))):
            steps = np.full(size, base, np.uint64)
            steps[0] = 1
            _POWERS[k] = np.cumprod(steps, dtype=np.uint64)
    return _POWERS[0], _POWERS[1]


def _longest_run(mask: np.ndarray) -> int:
    """The length of the longest run of True in `mask`."""
    if not mask.any():
        return 0
    edges = np.flatnonzero(np.diff(np.concatenate(([False], mask, [False])).view(np.int8)))
    return int((edges[1::2] - edges[::2]).max())


def _hits(h: np.ndarray, table: np.ndarray) -> np.ndarray:
    """h in table (sorted, distinct), by binary search: no re-sorting of the table per document."""
    pos = np.minimum(np.searchsorted(table, h), len(table) - 1)
    return table[pos] == h


class EvalIndex:
    """The n-grams of a set of evaluation items."""

    def __init__(self, items: list[tuple[str, str]], ngram: int):
        """`items`: (item id, text), e.g. ("eval.jsonl:3", "...")."""
        self.ngram, self.item_ids = ngram, [i for i, _ in items]
        self.vocab: dict[str, int] = {}
        grams: dict[tuple, int] = {}     # n-gram of ids -> first item holding it
        hashes: dict[int, list[np.ndarray]] = {}
        for number, (_, text) in enumerate(items):
            ids = [self.vocab.setdefault(u, len(self.vocab)) for u in units(text)]
            if not ids:
                continue
            n = min(ngram, len(ids))
            hashes.setdefault(n, []).append(_window_hashes(np.array(ids, np.int64), n))
            for s in range(len(ids) - n + 1):
                grams.setdefault(tuple(ids[s:s + n]), number)
        self.grams, self.lengths = grams, set(hashes)
        self._ascii_vocab: dict[bytes, int] | None = None
        self.hashes = {n: np.unique(np.concatenate(h)) for n, h in hashes.items()}

    def _may_match(self, text: str) -> bool:
        """A fast scan (no match objects, lower-cased once): False when no window can match. Only
        a run of n units that are all in the evaluation vocabulary can be an n-gram of the index,
        so most documents are ruled out by the longest such run, before any hashing."""
        if text.isascii():
            if self._ascii_vocab is None:
                self._ascii_vocab = {u.encode("ascii"): i for u, i in self.vocab.items()
                                     if u.isascii()}
            words = text.encode("ascii").translate(_ASCII_UNITS).split()
            get = self._ascii_vocab.get
        else:
            lower = text.lower()
            words = (_UNIT if _HAS_CJK.search(lower) else _WORD).findall(lower)
            get = self.vocab.get
        ids = np.fromiter(map(get, words, repeat(-1)), np.int64, len(words))
        longest = _longest_run(ids >= 0)
        usable = [n for n in self.lengths if longest >= n]
        if not usable:
            return False
        prefix = _prefix_sums(ids)
        return any(_hits(_windows(prefix, n), self.hashes[n]).any() for n in usable)

    def find(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """(matched item numbers, sorted; character spans of the matches, merged)."""
        if not self.grams or not self._may_match(text):
            return [], []
        matches = list(_UNIT.finditer(text))
        if not matches:
            return [], []
        vocab = self.vocab
        ids = np.fromiter((vocab.get(m.group(0).lower(), -1) for m in matches), np.int64,
                          len(matches))
        items: set[int] = set()
        unit_spans: list[tuple[int, int]] = []
        for n in sorted(self.lengths):
            if len(ids) < n:
                continue
            h = _window_hashes(ids, n)
            for s in np.flatnonzero(_hits(h, self.hashes[n])).tolist():
                item = self.grams.get(tuple(ids[s:s + n].tolist()))
                if item is not None:     # not a hash collision
                    items.add(item)
                    unit_spans.append((s, s + n - 1))
        if not items:
            return [], []
        spans: list[list[int]] = []
        for a, b in sorted(unit_spans):
            start, end = matches[a].start(), matches[b].end()
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
