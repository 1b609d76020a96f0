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
  first seen among equals) over the characters of all units. A unit is a run of non-space
  characters, except that every CJK character (Han, kana, hangul, ...: steps/text.py) is a unit of
  its own (Chinese has no spaces): so the thresholds of Gopher's word n-grams apply to both. Orders with a tiny upper bound are skipped (the result is exact).
  Only texts of at least `top_ngram_min_units` units (default 100) are checked: n-gram statistics
  mean nothing over a short paragraph, where naming "the package" twice already covers 20%
  (Gopher applies its rules to documents of 50 words and more; 100 units are about 50 words of
  Chinese, where every character is a unit).

How it is computed (the definitions above are the contract; this is only speed): one table gather
gives every character a 64-bit value whose sums are the class counts and, over a unit, a hash of
the unit; lines and paragraphs are counted with whole-text string methods and one set. The top
n-gram filter is first decided by upper bounds over hashed units, cheapest first: the most
characters that the units of one hash bucket cover (times n), the most that the buckets of n units
in a row cover, the most that the n-grams of one bucket cover. Where a bound is under a limit the
exact coverage is too, so the text passes; only where none is does the exact Counter-based count
run. Every result is therefore the exact one (tests/dataprep/steps/test_filters_equivalence.py checks it against the
straightforward implementation).
"""
from __future__ import annotations

import functools
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from operator import mul

import numpy as np

from mspretrain.dataprep.steps.quality import QualityFilterConfig
from mspretrain.dataprep.steps.text import CJK, CJK_RANGES, FIRST_CJK

FILTER_NAMES: tuple[str, ...] = (
    "too_short", "too_long", "symbol_ratio", "letter_ratio", "bullet_lines", "ellipsis_lines",
    "dup_paragraphs", "dup_paragraph_chars", "dup_lines", "dup_line_chars", "top_ngram",
)


@dataclass(frozen=True)
class FilterConfig:
    min_chars: int = 32                     # shorter documents are dropped (too_short)
    max_chars: int = 1_000_000              # longer documents are dropped (too_long)
    max_symbol_ratio: float = 0.25          # most punctuation and symbols per non-space character
    min_letter_ratio: float = 0.60          # fewest letters and marks per non-space character
    max_bullet_lines: float = 0.9           # most lines allowed to start with a bullet
    max_ellipsis_lines: float = 0.3         # most lines allowed to end with an ellipsis
    max_dup_line_fraction: float = 0.3      # most lines that repeat an earlier line
    max_dup_line_char_fraction: float = 0.2  # most characters in repeated lines
    max_dup_paragraph_fraction: float = 0.3  # most paragraphs that repeat an earlier one
    max_dup_paragraph_char_fraction: float = 0.2  # most characters in repeated paragraphs
    # (order, max fraction) pairs, Gopher's word n-gram values.
    max_top_ngram_fraction: tuple[tuple[int, float], ...] = ((2, 0.20), (3, 0.18), (4, 0.16))
    # Texts with fewer units than this skip top_ngram: a short paragraph that says "the package"
    # twice is not repetitive, and n-gram statistics mean nothing over a few dozen words.
    top_ngram_min_units: int = 100
    disabled: tuple[str, ...] = field(default=())  # filter names to skip
    # language identification (dataprep.langid): keep only these ISO 639-1 codes (empty: all),
    # and only documents identified with at least this probability
    languages: tuple[str, ...] = field(default=())
    min_language_score: float = 0.0         # documents identified less surely are dropped
    # what `languages` does with a document the model cannot place ("und", score 0: short UI
    # strings, lists of names, text of a language CLD2 has no model of): drop | keep. drop (unless
    # "und" is listed) keeps foreign text out; keep loses no English UI text but lets in the
    # languages CLD2 does not know (bench/bench_pii.py)
    undetermined: str = "drop"
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
        if self.undetermined not in ("keep", "drop"):
            raise ValueError(f"FilterConfig.undetermined must be keep or drop, "
                             f"got {self.undetermined!r}")
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
    """The class of every BMP code point (64 KiB, ~10 ms): built on the first non-ASCII text, not
    at import, so importing dataprep (the CLI, a test, a Ray worker) pays nothing for it."""
    return np.array([_category_class(cp) for cp in range(0x10000)], dtype=np.uint8)


_ASCII_CLASS = bytes(_category_class(cp) for cp in range(128))
_ASCII_TABLE = _ASCII_CLASS + bytes(128)   # for bytes.translate
_SHORT = 2000   # characters: a text this short takes the no-numpy path where it can


def code_points(text: str) -> np.ndarray:
    """The code points of `text` as uint32 (lone surrogates included)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


# --------------------------------------------------------------------------- units and n-grams

# Every CJK character (steps/text.py) is a unit.
_CJK_RANGES, _CJK = CJK_RANGES, CJK


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
# quality_reason decides most texts with a few numpy passes over their code points. A table gives
# every character a 64-bit value: 0 for a space; else a 1 (bits 0-13), a 1 if it is a letter (bits
# 14-27), a 1 if it is a symbol (bits 28-41) and fixed random bits above. Summed over a text of
# fewer than 2**14 characters, the fields are its non-space, letter and symbol counts; summed
# over a unit, the value is a hash of the unit (of its characters, not their order) whose low
# field is its length. The top n-gram check becomes upper bounds over these hashes, which only
# ever clear a text: where they cannot, the exact count above decides, so the result is always the
# definition's. Each numpy call costs about a microsecond whatever the array's size, so the common
# path keeps them few: one sum for the counts, one reduceat for the unit hashes, one bincount.

_BITS = 14
_ONE, _LETTER_ONE, _SYMBOL_ONE = 1, 1 << _BITS, 1 << 2 * _BITS
_FIELD_MASK = (1 << _BITS) - 1
_RANDOM_MASK = ~np.uint64((1 << 3 * _BITS) - 1)
_CJK_START = FIRST_CJK
# the non-ASCII line markers by code point: (marker, code point, whether it is a bullet)
_RARE = sorted(((c, ord(c), c in _BULLETS) for c in _BULLETS + _ELLIPSES if not c.isascii()),
               key=lambda r: r[1])
_MASK = np.uint64(_FIELD_MASK)


def _values_of(cps: np.ndarray, classes: np.ndarray) -> np.ndarray:
    """The values of code points `cps` of character classes `classes`."""
    with np.errstate(over="ignore"):   # splitmix64 of the code point, for the random bits
        z = cps.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(0x632BE59BD9B4E019)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    fields = (_ONE + _LETTER_ONE * (classes == _LETTER) + _SYMBOL_ONE * (classes == _SYMBOL))
    return np.where(classes == _SPACE, np.uint64(0), (z & _RANDOM_MASK) | fields.astype(np.uint64))


_ASCII_VALUES = _values_of(np.arange(128), np.frombuffer(_ASCII_CLASS, dtype=np.uint8))


@functools.cache
def _bmp_values() -> np.ndarray:
    """The value of every BMP code point (512 KiB, built on the first non-ASCII text)."""
    return _values_of(np.arange(0x10000), _bmp_class())


def _char_values(cps: np.ndarray, top: int) -> np.ndarray:
    """The value of each code point of `cps` (uint8 for an ASCII text, else uint32; `top`: its
    largest code point)."""
    if cps.dtype == np.uint8:
        return _ASCII_VALUES.take(cps)
    table = _bmp_values()
    if top <= 0xFFFF:
        return table.take(cps)   # take: indexing with a uint32 array costs several times more
    astral = cps > 0xFFFF
    out = table.take(np.where(astral, 0, cps))
    rest = cps[astral]
    out[astral] = _values_of(rest, np.array([_category_class(int(cp)) for cp in rest]))
    return out


def _class_counts(values: np.ndarray) -> tuple[int, int, int]:
    """(non-space characters, letters, symbols) of a text of character values `values`."""
    if len(values) <= _FIELD_MASK:   # no field can overflow into the next
        packed = int(values.sum())   # modulo 2**64: only the random bits above wrap
        return (packed & _FIELD_MASK, (packed >> _BITS) & _FIELD_MASK,
                (packed >> 2 * _BITS) & _FIELD_MASK)
    return tuple(int(np.count_nonzero(values & np.uint64(one)))
                 for one in (_ONE, _LETTER_ONE, _SYMBOL_ONE))


def _text_values(text: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(code points, character values, largest code point) of `text`."""
    if text.isascii():
        cps, top = np.frombuffer(text.encode("ascii"), dtype=np.uint8), 0x7F
    else:
        cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        top = int(cps.max())
    return cps, _char_values(cps, top), top


def char_counts(text: str) -> tuple[int, int, int]:
    """(non-space characters, letters, symbols) of `text`, as the ratio filters count them."""
    return _class_counts(_text_values(text)[1])


_GRAM = np.uint64(0xC2B2AE3D27D4EB4F)  # combines the hashes of a gram's units
_MIX = np.uint64(0xD6E8FEB86659FD93)   # multiplicative hashing: the top bits pick the bucket


def _unit_ends(values: np.ndarray, cjk: np.ndarray | None) -> np.ndarray:
    """The index of the last character of each unit of a text of character values `values`
    (`cjk`: which characters are CJK units, None when none is)."""
    nonspace = np.zeros(len(values) + 1, dtype=bool)
    nonspace[:-1] = values   # spaces are 0
    last = nonspace[:-1] > nonspace[1:]   # followed by a space or the end
    if cjk is not None:   # or followed by a CJK character, or CJK itself (and not a space)
        next_cjk = np.zeros(len(values), dtype=bool)
        next_cjk[:-1] = cjk[1:]
        last |= nonspace[:-1] & (cjk | next_cjk)
    return np.flatnonzero(last)


def _bucket_cover(keys: np.ndarray, chars: np.ndarray, shift: int) -> float:
    """The most characters covered by the keys falling in one bucket: at least the coverage of
    any one key."""
    buckets = keys * _MIX
    buckets >>= shift
    return float(np.bincount(buckets.view(np.int64), weights=chars).max())


def _top_ngram_cleared(values: np.ndarray, cjk: np.ndarray | None, total: int,
                       cfg: FilterConfig) -> bool:
    """True when `top_ngram_passes` is certainly True for a text of character values `values`
    (`cjk`: which characters are CJK units, None when none is; `total`: its non-space
    characters); False when only the exact count can tell."""
    if len(values) > _FIELD_MASK:
        return _top_ngram_cleared_long(values, cjk, total, cfg)
    sums = _unit_sums(values, cjk)
    m = len(sums)
    if m < max(1, cfg.top_ngram_min_units):
        return True
    lengths = (sums & _MASK).view(np.int64)   # no unit can overflow its field
    shift = 64 - max(8, (4 * m).bit_length())   # >= 4 buckets per unit
    # the top bits of a unit's sum are a sum of its characters' random bits: a hash already
    buckets = (sums >> shift).view(np.int64)
    cover = np.bincount(buckets, weights=lengths)   # characters per bucket, exact in float64
    best = float(cover.max())   # >= the coverage of every unit
    window = None
    for n, limit in cfg.max_top_ngram_fraction:
        if m < n:
            break
        if n * best <= limit * total:
            continue  # the exact check skips this order too: its best unit covers no more
        if n == 1:
            return False
        # An n-gram occurs at most as often as each of its units, so it covers at most the sum
        # of its units' coverages: at most the largest sum of bucket covers over n units in a row.
        if window is None:
            window = _running_cover(cover, buckets)
        if (window[n:] - window[:-n]).max() / total <= limit:   # as the exact check divides
            continue
        if _ngram_cover(sums, lengths, n, shift) / total > limit:
            return False
    return True


def _ngram_cover(hashes: np.ndarray, lengths: np.ndarray, n: int, shift: int) -> float:
    """_bucket_cover of the n-grams of units with these hashes and character lengths (an n-gram's
    hash mixes its units' hashes in order)."""
    k = len(hashes) - n + 1
    grams = hashes[:k].copy()
    gram_chars = lengths[:k].copy()
    for j in range(1, n):
        grams *= _GRAM
        grams += hashes[j:j + k]
        gram_chars += lengths[j:j + k]
    return _bucket_cover(grams, gram_chars, shift)


def _running_cover(cover: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    """Running sums of the bucket cover of each unit (`buckets`: the bucket of each unit), from 0:
    the difference of two n apart is the sum over those n units in a row."""
    window = np.zeros(len(buckets) + 1)
    np.cumsum(cover.take(buckets), out=window[1:])
    return window


def _unit_sums(values: np.ndarray, cjk: np.ndarray | None) -> np.ndarray:
    """The sum of the character values of each unit of a text of character values `values` (of
    at most _FIELD_MASK characters; `cjk`: see _top_ngram_cleared), in order."""
    if not len(values):
        return values
    nonspace = values.astype(bool)   # spaces are 0
    start = np.empty_like(nonspace)   # a non-space character after a space or at the start
    start[0] = nonspace[0]
    np.greater(nonspace[1:], nonspace[:-1], out=start[1:])
    if cjk is not None:   # or a CJK character, or one right after a CJK character
        after_cjk = np.empty_like(cjk)
        after_cjk[0] = False
        after_cjk[1:] = cjk[:-1]
        start |= nonspace & (cjk | after_cjk)
    starts = start.nonzero()[0]
    if not len(starts):
        return values[:0]
    # from one start to the next: a unit and the spaces after it, which add 0
    return np.add.reduceat(values, starts)


def _top_ngram_cleared_long(values: np.ndarray, cjk: np.ndarray | None, total: int,
                            cfg: FilterConfig) -> bool:
    """_top_ngram_cleared of a text longer than the packed fields hold (units counted apart)."""
    prefix = np.cumsum(values)   # modulo 2**64: differences are exact all the same
    ends = _unit_ends(values, cjk)
    m = len(ends)
    if m < max(1, cfg.top_ngram_min_units):
        return True
    # spaces are 0: the sum over a unit is the difference of the prefix sums at consecutive ends
    at_ends = prefix.take(ends)
    hashes = np.empty_like(at_ends)
    hashes[0] = at_ends[0]
    np.subtract(at_ends[1:], at_ends[:-1], out=hashes[1:])
    at_ends = np.cumsum(values != 0).take(ends)   # a unit may be too long for its field
    lengths = np.diff(at_ends, prepend=0)
    shift = np.uint64(64 - max(8, (4 * m).bit_length()))   # >= 4 buckets per unit
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
        if _ngram_cover(hashes, lengths, n, shift) / total > limit:
            return False
    return True


# LF + ASCII bullet: the search skips from LF to LF at C speed (two str.count calls scan twice,
# each slower than that)
_LF_BULLET = re.compile("\n[-*]")


def _line_counts(text: str, top: int) -> tuple[int, int]:
    """(lines starting with a bullet, lines ending in an ellipsis) among the lines of `text` split
    at LF: LF + bullet (ellipsis + LF) counted in the text, plus the first (last) line; an empty
    line neither starts nor ends with one (`top`: the largest code point of `text`)."""
    bullets = text.startswith(_BULLETS) + len(_LF_BULLET.findall(text))
    ellipses = text.endswith(_ELLIPSES) + text.count("...\n")
    for c, cp, bullet in _RARE:
        if cp > top:
            break
        if c in text:
            if bullet:
                bullets += text.count("\n" + c)
            else:
                ellipses += text.count(c + "\n")
    return bullets, ellipses


def _repeats(parts: list[str], n: int, chars: int) -> tuple[float, float]:
    """duplicate_fractions(parts), given the number of non-empty parts and the characters of all:
    the same numbers from the set of distinct parts alone (most texts repeat nothing)."""
    if n < 2:
        return 0.0, 0.0
    distinct = set(parts)
    distinct.discard("")
    if len(distinct) == n:
        return 0.0, 0.0
    return (n - len(distinct)) / n, (chars - sum(map(len, distinct))) / max(1, chars)


# --------------------------------------------------------------------------- the filter chain

def quality_reason(text: str, cfg: FilterConfig) -> str | None:
    """None if `text` (already normalised) passes every enabled filter, else the first failing one."""
    off = cfg.disabled
    if len(text) < cfg.min_chars and "too_short" not in off:
        return "too_short"
    if len(text) > cfg.max_chars and "too_long" not in off:
        return "too_long"
    if len(text) <= _SHORT and text.isascii():
        # a short ASCII text: counted with bytes methods, no numpy call (each costs about a
        # microsecond, more than counting a few hundred characters); its character values only
        # if top_ngram may need them
        cps = values = None
        top = 0x7F
        classes = text.encode("ascii").translate(_ASCII_TABLE)
        spaces = classes.count(b"\x00")
        nonspace = len(classes) - spaces
        letters, symbols = classes.count(b"\x01"), classes.count(b"\x03")
        few_units = spaces + 1 < max(1, cfg.top_ngram_min_units)   # a unit ends at a space
    else:
        cps, values, top = _text_values(text)
        nonspace, letters, symbols = _class_counts(values)
        few_units = False
    total = nonspace
    nonspace = max(1, nonspace)
    if symbols > cfg.max_symbol_ratio * nonspace and "symbol_ratio" not in off:
        return "symbol_ratio"
    if letters < cfg.min_letter_ratio * nonspace and "letter_ratio" not in off:
        return "letter_ratio"
    lines = text.split("\n")
    n_lines = len(lines) - lines.count("")
    bullets, ellipses = _line_counts(text, top)
    if bullets > cfg.max_bullet_lines * max(1, n_lines) and "bullet_lines" not in off:
        return "bullet_lines"
    if ellipses > cfg.max_ellipsis_lines * max(1, n_lines) and "ellipsis_lines" not in off:
        return "ellipsis_lines"
    dup_lines = _repeats(lines, n_lines, len(text) - len(lines) + 1)
    # A repeated paragraph repeats its first line, a whole line when no paragraph starts or ends
    # with LF (no LF x 3, which needs two empty lines): else there is nothing to split, and the
    # fractions are 0, which fail only a negative limit. Without LF x 2 there is one paragraph,
    # checked by no limit.
    dup_paragraphs = None
    if dup_lines[0] or (len(lines) - n_lines >= 2 and "\n\n\n" in text):
        if "\n\n" in text:
            paragraphs = text.split("\n\n")
            dup_paragraphs = _repeats(paragraphs, len(paragraphs) - paragraphs.count(""),
                                      len(text) - 2 * len(paragraphs) + 2)
    elif (min(cfg.max_dup_paragraph_fraction, cfg.max_dup_paragraph_char_fraction) < 0
          and "\n\n" in text):
        dup_paragraphs = 0.0, 0.0
    if dup_paragraphs is not None:
        dup_count, dup_chars = dup_paragraphs
        if dup_count > cfg.max_dup_paragraph_fraction and "dup_paragraphs" not in off:
            return "dup_paragraphs"
        if dup_chars > cfg.max_dup_paragraph_char_fraction and "dup_paragraph_chars" not in off:
            return "dup_paragraph_chars"
    dup_count, dup_chars = dup_lines
    if dup_count > cfg.max_dup_line_fraction and "dup_lines" not in off:
        return "dup_lines"
    if dup_chars > cfg.max_dup_line_char_fraction and "dup_line_chars" not in off:
        return "dup_line_chars"
    if "top_ngram" in off or few_units:   # fewer units than top_ngram looks at: it passes
        return None
    if values is None:
        cps, values, top = _text_values(text)
    cjk = None
    if top >= _CJK_START:
        cjk = _is_cjk().take(cps)
        cjk = cjk if cjk.any() else None
    if _top_ngram_cleared(values, cjk, total, cfg):
        return None
    return None if top_ngram_passes(text, cfg, cps if top > 0x7F else None) else "top_ngram"
