"""The quality filters as they were before the numpy fast path of dataprep.filters: per-text
character classes, Counter-based top n-gram counts, duplicate lines and paragraphs from split
parts. Kept unchanged as the oracle of test_filters_equivalence: the fast quality_reason must
return exactly what this one returns, for any text and any FilterConfig."""
from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from itertools import repeat
from operator import mul

import numpy as np

from mspretrain.dataprep.steps.filters import FilterConfig
from mspretrain.dataprep.steps.text import CJK as _CJK, CJK_RANGES as _CJK_RANGES

# --------------------------------------------------------------------------- character classes

_SPACE, _LETTER, _DIGIT, _SYMBOL, _OTHER = range(5)


def _category_class(cp: int) -> int:
    ch = chr(cp)
    if ch.isspace():
        return _SPACE
    cat = unicodedata.category(ch)
    if cat[0] in "LM":
        return _LETTER
    if cat[0] == "N":
        return _DIGIT
    if cat[0] in "PS":
        return _SYMBOL
    return _OTHER


@functools.cache
def _bmp_class() -> np.ndarray:
    """The class of every BMP code point (64 KiB, ~0.1 s): built on the first non-ASCII text, not
    at import, so importing dataprep (the CLI, a test, a Ray worker) pays nothing for it."""
    return np.array([_category_class(cp) for cp in range(0x10000)], dtype=np.uint8)


_ASCII_CLASS = bytes(_category_class(cp) for cp in range(128)) + bytes(128)
_CLASS_BYTES = [bytes([c]) for c in range(5)]


def code_points(text: str) -> np.ndarray:
    """The code points of `text` as uint32 (lone surrogates included)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def char_classes(text: str, cps: np.ndarray | None = None) -> list[int]:
    """Counts of [space, letter, digit, symbol, other] characters in `text` (`cps`: its code
    points, when the caller has them already)."""
    if text.isascii():  # bytes.translate and count: no per-call numpy overhead
        classes = text.encode("ascii").translate(_ASCII_CLASS)
        counts = [classes.count(c) for c in _CLASS_BYTES[:_OTHER]]
        return counts + [len(classes) - sum(counts)]
    cps = code_points(text) if cps is None else cps
    bmp = _bmp_class()
    if cps.max() <= 0xFFFF:
        classes = bmp[cps]
    else:
        astral = cps > 0xFFFF
        classes = bmp[np.where(astral, 0, cps)]
        classes[astral] = [_category_class(int(cp)) for cp in cps[astral]]
    counts = [np.count_nonzero(classes == c) for c in range(_OTHER)]  # faster than bincount
    return counts + [len(classes) - sum(counts)]


# --------------------------------------------------------------------------- units and n-grams

# Every CJK character is a unit: the steps' one definition of CJK (steps/text.py), not a copy.


@functools.cache
def _is_cjk() -> np.ndarray:
    """A bool per code point (1.1 MB): built on the first non-ASCII text, not at import."""
    table = np.zeros(0x110000, dtype=bool)
    for a, b in _CJK_RANGES:
        table[a:b + 1] = True
    return table


_UNIT = re.compile(f"[{_CJK}]|[^\\s{_CJK}]+")


def units(text: str) -> list[str]:
    """Whitespace-separated tokens, with every CJK character a token of its own."""
    return text.split() if text.isascii() else _UNIT.findall(text)


def top_ngram_passes(text: str, cfg: "FilterConfig", cps: np.ndarray | None = None) -> bool:
    """True when `text` has fewer than cfg.top_ngram_min_units units, or no order's top n-gram
    covers more than its limit (`cps`: the code points of a non-ASCII text, if known)."""
    if not text.isascii():
        cps = code_points(text) if cps is None else cps
        if _is_cjk()[cps].any():
            toks = _UNIT.findall(text)
            return len(toks) < cfg.top_ngram_min_units or not top_ngram_failure(
                toks, cfg.max_top_ngram_fraction)
    toks = text.split()  # no CJK character: the units are the whitespace-separated tokens
    if len(toks) < max(1, cfg.top_ngram_min_units):
        return True
    counts = Counter(toks)
    coverage = list(map(mul, counts.values(), map(len, counts)))
    total, best = sum(coverage), max(coverage)
    if all(n * best <= limit * total for n, limit in cfg.max_top_ngram_fraction):
        return True  # the bound of top_ngram_failure, without building anything more
    return not top_ngram_failure(toks, cfg.max_top_ngram_fraction, counts)


def top_ngram_failure(toks: list[str], orders: tuple[tuple[int, float], ...],
                      unit_counts: Counter | None = None) -> tuple[int, float] | None:
    """The first (order, fraction) whose top n-gram covers more than its limit, else None
    (`unit_counts`: Counter(toks), if the caller has it).

    An n-gram occurs at most as often as each of its units, so its coverage is at most n times the
    largest coverage of a single unit: orders under that bound are skipped without counting.
    """
    total = sum(map(len, toks))
    if total == 0:
        return None
    unit_counts = Counter(toks) if unit_counts is None else unit_counts
    best_unit = max(map(mul, unit_counts.values(), map(len, unit_counts)))
    unit_ids = None
    for n, limit in orders:
        if len(toks) < n:
            break
        if n * best_unit <= limit * total:
            continue
        if n == 1:
            gram, count = unit_counts.most_common(1)[0]
            if count * len(gram) > limit * total:
                return 1, count * len(gram) / total
            continue
        if unit_ids is None:
            index = {u: i for i, u in enumerate(unit_counts)}
            unit_ids = np.fromiter(map(index.__getitem__, toks), np.int64, len(toks))
        start, count = most_common_ngram(unit_ids, n)
        fraction = count * sum(map(len, toks[start:start + n])) / total
        if fraction > limit:
            return n, fraction
    return None


def most_common_ngram(unit_ids: np.ndarray, n: int) -> tuple[int, int]:
    """(start of its first occurrence, count) of the most frequent n-gram of `unit_ids`; among
    equals the first to occur, as Counter(n-grams).most_common(1) picks, at numpy speed."""
    m = len(unit_ids) - n + 1
    width = int(unit_ids.max()) + 1
    keys = unit_ids[:m]
    for j in range(1, n):
        if j > 1 and width ** (j + 1) >= 2**62:   # dense ids again, so the product cannot overflow
            keys = np.unique(keys, return_inverse=True)[1].astype(np.int64)
            keys *= width
        else:
            keys = keys * width
        keys += unit_ids[j:j + m]
    inverse = np.unique(keys, return_inverse=True)[1]
    counts = np.bincount(inverse)
    best = counts.max()
    return int(np.argmax(counts[inverse] == best)), int(best)


# --------------------------------------------------------------------------- lines, paragraphs

_ELLIPSES = ("...", "\u2026")
_BULLETS = ("-", "*", "\u2022", "\u2023", "\u25cf", "\u25e6", "\u2043", "\u25aa", "\u00b7")


def duplicate_fractions(parts: list[str]) -> tuple[float, float]:
    """(share of parts that repeat an earlier part, share of characters in those parts)."""
    parts = list(filter(None, parts))
    if len(parts) < 2:
        return 0.0, 0.0
    distinct = set(parts)
    if len(distinct) == len(parts):
        return 0.0, 0.0
    # A part seen c times repeats c - 1 times: summed over parts, all of them less each one once.
    total = sum(map(len, parts))
    dup_chars = total - sum(map(len, distinct))
    return (len(parts) - len(distinct)) / len(parts), dup_chars / max(1, total)


# --------------------------------------------------------------------------- the filter chain

def quality_reason(text: str, cfg: FilterConfig) -> str | None:
    """None if `text` (already normalised) passes every enabled filter, else the first failing one."""
    off = cfg.disabled
    if len(text) < cfg.min_chars and "too_short" not in off:
        return "too_short"
    if len(text) > cfg.max_chars and "too_long" not in off:
        return "too_long"
    cps = None if text.isascii() else code_points(text)
    classes = char_classes(text, cps)
    nonspace = max(1, sum(classes) - classes[_SPACE])
    if classes[_SYMBOL] > cfg.max_symbol_ratio * nonspace and "symbol_ratio" not in off:
        return "symbol_ratio"
    if classes[_LETTER] < cfg.min_letter_ratio * nonspace and "letter_ratio" not in off:
        return "letter_ratio"
    lines = list(filter(None, text.split("\n")))
    n_lines = max(1, len(lines))
    bullets = sum(map(str.startswith, lines, repeat(_BULLETS)))
    if bullets > cfg.max_bullet_lines * n_lines and "bullet_lines" not in off:
        return "bullet_lines"
    ellipses = sum(map(str.endswith, lines, repeat(_ELLIPSES)))
    if ellipses > cfg.max_ellipsis_lines * n_lines and "ellipsis_lines" not in off:
        return "ellipsis_lines"
    if "\n\n" in text:  # else one paragraph: nothing repeats
        dup_count, dup_chars = duplicate_fractions(text.split("\n\n"))
        if dup_count > cfg.max_dup_paragraph_fraction and "dup_paragraphs" not in off:
            return "dup_paragraphs"
        if dup_chars > cfg.max_dup_paragraph_char_fraction and "dup_paragraph_chars" not in off:
            return "dup_paragraph_chars"
    dup_count, dup_chars = duplicate_fractions(lines)
    if dup_count > cfg.max_dup_line_fraction and "dup_lines" not in off:
        return "dup_lines"
    if dup_chars > cfg.max_dup_line_char_fraction and "dup_line_chars" not in off:
        return "dup_line_chars"
    if "top_ngram" not in off and not top_ngram_passes(text, cfg, cps):
        return "top_ngram"
    return None
