"""Document quality filters (Gopher-style), measured in characters so that Chinese works as English does.

`quality_reason(text, cfg)` checks a normalised text against the filters in FILTER_NAMES order and
returns the name of the first one that fails, or None. Definitions (all fractions are of characters
unless noted; "non-space" characters exclude whitespace):

- too_short / too_long: len(text) outside [min_chars, max_chars].
- symbol_ratio: punctuation and symbol characters (Unicode P*, S*) / non-space characters.
- letter_ratio: letters (Unicode L*, M*, which includes Chinese characters) / non-space characters,
  below min_letter_ratio: catches number dumps and tables as well as markup.
- bullet_lines / ellipsis_lines: share of lines (count) that start with a bullet / end in an ellipsis.
- dup_paragraphs / dup_paragraph_chars: blank-line separated paragraphs that repeat an earlier
  one, by count / by characters (checked first, as in Gopher: a repeated paragraph also repeats
  its lines).
- dup_lines / dup_line_chars: the same for lines.
- top_ngram: for each order n, the characters covered by the most frequent n-gram of units (the
  first seen among equals) over
  the characters of all units. A unit is a run of non-space characters, except that every Han, kana
  and other CJK character is a unit of its own (Chinese has no spaces): so the thresholds of Gopher's
  word n-grams apply to both. Orders with a tiny upper bound are skipped (the result is exact).
  Only texts of at least `top_ngram_min_units` units (default 100) are checked: n-gram statistics
  mean nothing over a short paragraph, where naming "the package" twice already covers 20%
  (Gopher applies its rules to documents of 50 words and more; 100 units are about 50 words of
  Chinese, where every character is a unit).
"""
from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from operator import mul

import numpy as np

from dataprep.quality import QualityFilterConfig

FILTER_NAMES: tuple[str, ...] = (
    "too_short", "too_long", "symbol_ratio", "letter_ratio", "bullet_lines", "ellipsis_lines",
    "dup_paragraphs", "dup_paragraph_chars", "dup_lines", "dup_line_chars", "top_ngram",
)


@dataclass(frozen=True)
class FilterConfig:
    min_chars: int = 32
    max_chars: int = 1_000_000
    max_symbol_ratio: float = 0.25
    min_letter_ratio: float = 0.60
    max_bullet_lines: float = 0.9
    max_ellipsis_lines: float = 0.3
    max_dup_line_fraction: float = 0.3
    max_dup_line_char_fraction: float = 0.2
    max_dup_paragraph_fraction: float = 0.3
    max_dup_paragraph_char_fraction: float = 0.2
    # (order, max fraction) pairs, Gopher's word n-gram values.
    max_top_ngram_fraction: tuple[tuple[int, float], ...] = ((2, 0.20), (3, 0.18), (4, 0.16))
    # Texts with fewer units than this skip top_ngram: a short paragraph that says "the package"
    # twice is not repetitive, and n-gram statistics mean nothing over a few dozen words.
    top_ngram_min_units: int = 100
    disabled: tuple[str, ...] = field(default=())  # filter names to skip
    # language identification (dataprep.langid): keep only these ISO 639-1 codes (empty: all),
    # and only documents identified with at least this probability
    languages: tuple[str, ...] = field(default=())
    min_language_score: float = 0.0
    quality: QualityFilterConfig = field(default_factory=QualityFilterConfig)

    def __post_init__(self):
        unknown = set(self.disabled) - set(FILTER_NAMES)
        if unknown:
            raise ValueError(f"FilterConfig.disabled: unknown filter(s) {sorted(unknown)}; "
                             f"known: {', '.join(FILTER_NAMES)}")
        if self.min_chars < 0 or self.max_chars < self.min_chars:
            raise ValueError(f"FilterConfig: need 0 <= min_chars <= max_chars, "
                             f"got {self.min_chars}, {self.max_chars}")
        bad = [c for c in self.languages if not re.fullmatch(r"[a-z]{2,3}", str(c))]
        if bad:
            raise ValueError(f"FilterConfig.languages: {bad[0]!r} is not an ISO 639-1 code such as "
                             f"'zh' or 'en' (Traditional and Simplified Chinese are both 'zh')")
        if not 0.0 <= self.min_language_score <= 1.0:
            raise ValueError(f"FilterConfig.min_language_score must be in [0, 1], "
                             f"got {self.min_language_score}")
        if self.top_ngram_min_units < 0:
            raise ValueError(f"FilterConfig.top_ngram_min_units must be >= 0, "
                             f"got {self.top_ngram_min_units}")
        orders = [n for n, _ in self.max_top_ngram_fraction]
        if any(n < 1 for n in orders) or orders != sorted(set(orders)):
            raise ValueError(f"FilterConfig.max_top_ngram_fraction: orders must be increasing "
                             f"and >= 1, got {orders}")


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

# Scripts written without spaces (Han, kana, bopomofo, CJK symbols): each character is a unit.
_CJK_RANGES = [(0x2E80, 0x2FDF), (0x3005, 0x3007), (0x3021, 0x3029), (0x3038, 0x303B),
               (0x3040, 0x30FF), (0x3100, 0x312F), (0x3190, 0x31FF), (0x3400, 0x4DBF),
               (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x3134F)]
_CJK = "".join(f"{chr(a)}-{chr(b)}" for a, b in _CJK_RANGES)


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


# --------------------------------------------------------------------------- fast path
# quality_reason decides most texts with one pass of numpy over their code points: a table gives
# each character's class and whether it is CJK (the character ratios and the units in one
# gather), and the top n-gram check becomes an upper bound computed on hashed units. The bound
# only ever clears a text: where it cannot, the exact count above decides, so the result is
# always that of the definition.

_CJK_FLAG = 8   # added to a character's class in _char_table when the character is a CJK unit
_ASCII_TABLE = np.frombuffer(_ASCII_CLASS, dtype=np.uint8)  # no ASCII character is CJK


@functools.cache
def _bmp_table() -> np.ndarray:
    """class | _CJK_FLAG * is-CJK of every BMP code point (64 KiB, built on first non-ASCII use)."""
    return _bmp_class() | (_is_cjk()[:0x10000].astype(np.uint8) << 3)


def _char_table(cps: np.ndarray) -> np.ndarray:
    """class | _CJK_FLAG * is-CJK of each code point in `cps` (uint8)."""
    if cps.dtype == np.uint8:
        return _ASCII_TABLE.take(cps)
    table = _bmp_table()
    if cps.max() <= 0xFFFF:
        return table.take(cps)   # take: indexing with a uint32 array costs 4x more
    astral = cps > 0xFFFF
    out = table[np.where(astral, 0, cps)]
    out[astral] = [_category_class(int(cp)) | _CJK_FLAG * int(_is_cjk()[cp]) for cp in cps[astral]]
    return out


# Polynomial hashing of units modulo 2**64 (numpy's uint64 wraps): unit u of code points c_0..c_k
# hashes to sum c_j R**j, from prefix sums over the text times R**-start. Collisions only merge
# buckets, which raises the bound: they can cost time, never change a decision.
_R = 0x9E3779B97F4A7C15                 # odd, so invertible modulo 2**64
_R_INV = pow(_R, -1, 1 << 64)
_GRAM = np.uint64(0xC2B2AE3D27D4EB4F)  # combines the hashes of a gram's units
_MIX = np.uint64(0xD6E8FEB86659FD93)   # multiplicative hashing: the top bits pick the bucket
_POWERS: list[np.ndarray] = [np.ones(0, np.uint64), np.ones(0, np.uint64)]  # R**j, R**-j


def _powers(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(R**j, R**-j) for j < n at least, modulo 2**64; grown by doubling, kept for later texts."""
    if len(_POWERS[0]) < n:
        size = max(n, 2 * len(_POWERS[0]), 4096)
        for i, base in enumerate((_R, _R_INV)):
            table = np.full(size, base, dtype=np.uint64)
            table[0] = 1
            _POWERS[i] = np.cumprod(table, out=table)
    return _POWERS[0], _POWERS[1]


def _unit_edges(chars: np.ndarray, cjk: bool) -> tuple[np.ndarray, int]:
    """(start and end of each unit, interleaved; the number of units) of a text whose _char_table
    values are `chars`."""
    nonspace = np.zeros(len(chars) + 2, dtype=bool)
    np.not_equal(chars, _SPACE, out=nonspace[1:-1])
    if not cjk:   # the units are the runs of non-space characters
        edges = np.flatnonzero(nonspace[1:] != nonspace[:-1])
        return edges, len(edges) // 2
    is_cjk = np.zeros(len(chars) + 2, dtype=bool)
    np.greater_equal(chars, _CJK_FLAG, out=is_cjk[1:-1])
    # a unit starts at a non-space character after a space or a CJK character, or at a CJK one
    starts = np.flatnonzero(nonspace[1:-1] & (~nonspace[:-2] | is_cjk[1:-1] | is_cjk[:-2]))
    ends = np.flatnonzero(nonspace[1:-1] & (~nonspace[2:] | is_cjk[1:-1] | is_cjk[2:])) + 1
    edges = np.empty(2 * len(starts), dtype=np.intp)
    edges[0::2] = starts
    edges[1::2] = ends
    return edges, len(starts)


def _bucket_cover(keys: np.ndarray, chars: np.ndarray, shift: np.uint64) -> float:
    """The most characters covered by the keys falling in one bucket: at least the coverage of
    any one key."""
    buckets = ((keys * _MIX) >> shift).view(np.int64)
    return float(np.bincount(buckets, weights=chars).max())


def _top_ngram_cleared(cps: np.ndarray, chars: np.ndarray, cjk: bool, total: int,
                       cfg: FilterConfig) -> bool:
    """True when `top_ngram_passes` is certainly True for the text of code points `cps`
    (`chars`: their _char_table values, `total`: its non-space characters); False when only the
    exact count can tell."""
    edges, m = _unit_edges(chars, cjk)
    if m < max(1, cfg.top_ngram_min_units):
        return True
    powers, inverses = _powers(len(cps))
    starts, ends = edges[0::2], edges[1::2]
    # sums over [start, end) of c_j R**j (reduceat: each from its index to the next one)
    sums = np.add.reduceat(cps * powers[:len(cps)], edges[:-1] if edges[-1] == len(cps) else edges)
    hashes = sums[0::2] * inverses.take(starts)
    lengths = ends - starts
    shift = np.uint64(64 - max(10, (4 * m).bit_length()))   # >= 4 buckets per unit
    best = None
    for n, limit in cfg.max_top_ngram_fraction:
        if m < n:
            break
        if best is None:
            best = _bucket_cover(hashes, lengths, shift)  # >= the coverage of every unit
        if n * best <= limit * total:
            continue  # the exact check skips this order too: its best unit covers no more
        if n == 1:
            return False
        k = m - n + 1
        grams = hashes[:k].copy()
        for j in range(1, n):
            grams *= _GRAM
            grams += hashes[j:j + k]
        cum = np.zeros(m + 1, dtype=np.int64)
        np.cumsum(lengths, out=cum[1:])
        if _bucket_cover(grams, cum[n:] - cum[:k], shift) / total > limit:
            return False
    return True


# Counts of spaces, letters, symbols and CJK characters packed in one integer of 4 x 16 bits per
# _char_table value: one sum counts them all (exact below 2**16 characters; longer texts bincount).
_FIELD = 16
_PACKED = np.array([sum(1 << (_FIELD * f) for f, hit in enumerate(
    (v & 7 == _SPACE, v & 7 == _LETTER, v & 7 == _SYMBOL, v >= _CJK_FLAG)) if hit)
    for v in range(2 * _CJK_FLAG)], dtype=np.uint64)


def _class_counts(chars: np.ndarray) -> tuple[int, int, int, int]:
    """(spaces, letters, symbols, CJK characters) among `chars` (_char_table values)."""
    if len(chars) < 1 << _FIELD:
        packed = int(_PACKED.take(chars).sum())
        return tuple((packed >> (_FIELD * f)) & ((1 << _FIELD) - 1) for f in range(4))
    counts = np.bincount(chars, minlength=2 * _CJK_FLAG)
    classes = (counts[:_CJK_FLAG] + counts[_CJK_FLAG:]).tolist()
    return classes[_SPACE], classes[_LETTER], classes[_SYMBOL], int(counts[_CJK_FLAG:].sum())


def _line_counts(text: str, ascii_only: bool) -> tuple[int, int]:
    """(lines starting with a bullet, lines ending in an ellipsis) among the non-empty lines of
    `text` split at LF: a count of LF + bullet (ellipsis + LF) plus the first (last) line."""
    bullets = text.startswith(_BULLETS)
    ellipses = text.endswith(_ELLIPSES)
    for b in (_BULLETS[:2] if ascii_only else _BULLETS):
        if b in text:
            bullets += text.count("\n" + b)
    ellipses += text.count("...\n")
    if not ascii_only:
        ellipses += text.count("\u2026\n")
    return bullets, ellipses


def _line_duplicates(lines: list[str], n_lines: int) -> tuple[float, float]:
    """duplicate_fractions of the non-empty ones of `lines` (n_lines of them)."""
    distinct = set(lines)
    distinct.discard("")
    if len(distinct) == n_lines:
        return 0.0, 0.0
    return duplicate_fractions(lines)


# --------------------------------------------------------------------------- the filter chain

def quality_reason(text: str, cfg: FilterConfig) -> str | None:
    """None if `text` (already normalised) passes every enabled filter, else the first failing one."""
    off = cfg.disabled
    if len(text) < cfg.min_chars and "too_short" not in off:
        return "too_short"
    if len(text) > cfg.max_chars and "too_long" not in off:
        return "too_long"
    ascii_only = text.isascii()
    cps = (np.frombuffer(text.encode("ascii"), dtype=np.uint8) if ascii_only
           else code_points(text))
    chars = _char_table(cps)
    space, letters, symbols, cjk = _class_counts(chars)
    nonspace = max(1, len(text) - space)
    if symbols > cfg.max_symbol_ratio * nonspace and "symbol_ratio" not in off:
        return "symbol_ratio"
    if letters < cfg.min_letter_ratio * nonspace and "letter_ratio" not in off:
        return "letter_ratio"
    lines = text.split("\n")
    n_lines = len(lines) - lines.count("")
    bullets, ellipses = _line_counts(text, ascii_only)
    n_lines = max(1, n_lines)
    if bullets > cfg.max_bullet_lines * n_lines and "bullet_lines" not in off:
        return "bullet_lines"
    if ellipses > cfg.max_ellipsis_lines * n_lines and "ellipsis_lines" not in off:
        return "ellipsis_lines"
    if "\n\n" in text:  # else one paragraph: nothing repeats
        dup_count, dup_chars = duplicate_fractions(text.split("\n\n"))
        if dup_count > cfg.max_dup_paragraph_fraction and "dup_paragraphs" not in off:
            return "dup_paragraphs"
        if dup_chars > cfg.max_dup_paragraph_char_fraction and "dup_paragraph_chars" not in off:
            return "dup_paragraph_chars"
    dup_count, dup_chars = _line_duplicates(lines, len(lines) - lines.count(""))
    if dup_count > cfg.max_dup_line_fraction and "dup_lines" not in off:
        return "dup_lines"
    if dup_chars > cfg.max_dup_line_char_fraction and "dup_line_chars" not in off:
        return "dup_line_chars"
    if "top_ngram" in off:
        return None
    if _top_ngram_cleared(cps, chars, cjk, len(text) - space, cfg):
        return None
    exact_cps = cps if not ascii_only else None
    return None if top_ngram_passes(text, cfg, exact_cps) else "top_ngram"
