"""The units of decontamination as numpy arrays: where each unit starts and ends, and a 64-bit hash
of its lower-cased characters, in a few whole-array passes instead of a Python object per unit.

A unit is what `re.findall(rf"[{CJK}]|[^\\W_]+", text)` finds: one CJK character (steps/text.py), or
a run of letters and digits. The scan is left to right, so a run that starts with a non-CJK letter
takes the CJK characters after it ("linux内核" is one unit), while CJK characters at the head of a
run are units of their own ("内核linux" is three). Code point tables built once per process from
Python's own regex and `str.lower` give, per character, "letter or digit", "CJK" and the lower-case
code point, so the boundaries are exactly the regex's.

The hash of a unit is a function of `unit.lower()`, so equal lower-cased units always hash equal:
it folds the two spots where Python's `str.lower` is not one code point to one code point ("İ"
lowers to "i" + U+0307, a final "Σ" to "ς"): İ hashes as "i", Σ and ς as "σ". Units that hash
equal are not necessarily equal; callers compare strings where it matters.
"""
from __future__ import annotations

import re

import numpy as np

from mspretrain.dataprep.steps.text import CJK, FIRST_CJK as _FIRST_CJK

_UNICODE = 0x110000
_ALNUM, _CJK = np.uint8(1), np.uint8(2)


def _byte_table(limit: int) -> bytes:
    """bytes.translate table for text of code points < limit (ASCII: 128, Latin-1: 256): a letter
    or digit becomes its lower case (which stays below limit), anything else NUL."""
    return bytes(ord(chr(c).lower()) if c < limit and chr(c).isalnum() else 0 for c in range(256))


_ASCII_LOW, _LATIN1_LOW = _byte_table(128), _byte_table(256)
_TABLES: dict[int, tuple[np.ndarray, np.ndarray]] = {}
_BMP = 0x10000


def code_point_tables(limit: int = _BMP) -> tuple[np.ndarray, np.ndarray]:
    """(lower, cls) for the code points below `limit` (_BMP: what texts without characters beyond
    the BMP need, built in milliseconds; or all of Unicode, 0x110000, a tenth of a second), built
    once per process: lower, the folded lower case of a unit character (uint16 for the BMP, whose
    lower cases stay in it; uint32 else) and 0 for any other; cls, _ALNUM | _CJK bits."""
    if limit not in _TABLES:
        text = np.arange(limit, dtype=np.uint32).tobytes().decode("utf-32-le", "surrogatepass")
        cls = np.zeros(limit, np.uint8)
        for m in re.finditer(r"[^\W_]+", text):
            cls[m.start():m.end()] |= _ALNUM
        for m in re.finditer(f"[{CJK}]+", text):
            cls[m.start():m.end()] |= _CJK
        # İ is the one code point whose lower case is two; Σ's depends on what follows
        lowered = text.replace("\u0130", "i").lower()
        lower = np.frombuffer(lowered.encode("utf-32-le", "surrogatepass"), np.uint32).copy()
        lower[[0x3A3, 0x3C2]] = 0x3C3
        lower[cls == 0] = 0   # a CJK character that is no letter (・) keeps its value: a unit
        _TABLES[limit] = (lower.astype(np.uint16) if limit == _BMP else lower), cls
    return _TABLES[limit]


class _Powers:
    """base**i and scale * base**-i modulo 2**64 for i < len(up), grown by doubling."""

    def __init__(self, base: int, scale: int = 1):
        self.base, self.scale = base, scale
        self.up = self.down = np.ones(0, np.uint64)

    def upto(self, n: int) -> "_Powers":
        if len(self.up) < n:
            size = max(n, 2 * len(self.up), 4096)
            for name, b, first in (("up", self.base, 1),
                                   ("down", pow(self.base, -1, 1 << 64), self.scale)):
                steps = np.full(size, b, np.uint64)
                steps[0] = first
                setattr(self, name, np.cumprod(steps, dtype=np.uint64))
        return self


# odd: invertible modulo 2**64. The scale spreads a short unit's hash (one character: its code
# point times the scale) over the high bits, which the bitmaps of decontam look at.
_CHAR_POW = _Powers(0x9E3779B97F4A7C15, scale=0xBF58476D1CE4E5B9)
_UNIT_POW = _Powers(0xD6E8FEB86659FD93)
# numpy's functions are thin wrappers around these methods; per document they add up
_take, _nonzero = np.ndarray.take, np.ndarray.nonzero


_PIECE = 1 << 15
# a character of no unit: where a text can be cut without changing its units (a CJK character
# that is no letter, ・, is a unit)
_NO_UNIT = re.compile(rf"[^\w{CJK}]|_")


def units(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, hashes) of the units of `text`: character offsets (int64) and uint64 hashes
    of their folded lower case. A long text goes in pieces of about _PIECE characters cut after
    a character of no unit: each piece's arrays then stay in the processor's cache."""
    if len(text) <= 2 * _PIECE:
        return _units(text)
    parts, origin = [], 0
    while origin < len(text):
        end = len(text)
        if end - origin > 2 * _PIECE:
            cut = _NO_UNIT.search(text, origin + _PIECE)
            if cut:
                end = cut.end()
        starts, ends, hashes = _units(text[origin:end])
        parts.append((starts + origin, ends + origin, hashes))
        origin = end
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(3))


def _units(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if text.isascii():
        return _runs(np.frombuffer(text.encode("ascii").translate(_ASCII_LOW), np.uint8))
    try:
        return _runs(np.frombuffer(text.encode("latin-1").translate(_LATIN1_LOW), np.uint8))
    except UnicodeEncodeError:
        pass
    b = text.encode("utf-16-le", "surrogatepass")
    if len(b) == 2 * len(text):   # no character beyond the BMP: UTF-16 units are code points
        cps = np.frombuffer(b, np.uint16)
        if cps.max() < _FIRST_CJK:
            return _runs(_take(code_point_tables()[0], cps))
    else:
        cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)
    return _with_cjk(cps)


def _runs(low: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """units() of a text without CJK characters, from the folded lower case of every character
    (0: not a letter or digit): a unit is a maximal run of letters and digits."""
    letter = np.zeros(len(low) + 2, bool)
    np.not_equal(low, 0, out=letter[1:-1])
    edges = _nonzero(letter[1:] != letter[:-1])[0]
    starts = edges[::2]
    return starts, edges[1::2], _hashes(low, starts)


def _with_cjk(cps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """units() of any text, from its code points."""
    lower, classes = code_point_tables(_BMP if cps.dtype == np.uint16 else _UNICODE)
    low, cls = _take(lower, cps), _take(classes, cps)
    # A character continues the unit before it when it is a letter or digit and the run of
    # letters and digits so far has a non-CJK one (the regex's [^\W_]+ started there): the last
    # "event" up to the character before is such a letter (odd), not a non-letter (even).
    event = _take(_EVENT, cls)
    event += _event_at(len(cls))
    last_event = np.maximum.accumulate(event)
    cont = (cls[1:] & _ALNUM).astype(bool)
    cont &= (last_event[:-1] & 1).astype(bool)
    first = cls != 0
    last = first.copy()
    first[1:] &= ~cont
    last[:-1] &= ~cont
    starts = _nonzero(first)[0]
    return starts, _nonzero(last)[0] + 1, _hashes(low, starts)


# per class: a letter or digit outside the CJK ranges is an odd event, a non-letter an even one,
# a CJK letter none (a large even negative number, below any event)
_EVENT = np.array([0, 1, 0, -(1 << 62)], np.int64)
_EVENTS_AT = [np.zeros(0, np.int64)]


def _event_at(n: int) -> np.ndarray:
    """2 * i for i < n: an event's position, made even."""
    if len(_EVENTS_AT[0]) < n:
        _EVENTS_AT[0] = 2 * np.arange(max(n, 2 * len(_EVENTS_AT[0]), 4096), dtype=np.int64)
    return _EVENTS_AT[0][:n]


def _hashes(low: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The hash of each unit: sum of low[start + k] * M**k, times scale / M**start. A unit's
    characters and the non-unit characters (0) up to the next start sum to the same: a reduceat.
    A long text goes in slices of about _HASH_BLOCK characters cut at unit starts (the powers
    then stay short whatever the text's length: M**start is the same relative to any origin)."""
    if not len(starts):
        return np.zeros(0, np.uint64)
    if len(low) <= _HASH_BLOCK:
        return _slice_hashes(low, starts)
    cuts = np.searchsorted(starts, np.arange(0, len(low), _HASH_BLOCK)[1:])
    cuts = np.unique(np.concatenate(([0], cuts, [len(starts)])))
    out = np.empty(len(starts), np.uint64)
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        origin = int(starts[a])
        end = int(starts[b]) if b < len(starts) else len(low)
        out[a:b] = _slice_hashes(low[origin:end], starts[a:b] - origin)
    return out


_HASH_BLOCK = 1 << 16


def _slice_hashes(low: np.ndarray, starts: np.ndarray) -> np.ndarray:
    n = len(low)
    p = _CHAR_POW.upto(n)
    h = np.add.reduceat(np.multiply(low, p.up[:n]), starts)
    h *= _take(p.down, starts)
    return h


# The byte keys, for a first look at a text whose folded lower case fits a byte a character
# (every code point below 256, or Latin text with typographic quotes and dashes): a unit's key is
# its first 8 folded characters (zeros past its end) and its length, gathered at the unit starts
# instead of a pass over every character like the hash. A function of the folded lower case,
# like the hash (equal units, equal keys), in a space of its own: keys are compared with keys.
_LENGTH_MIX = 0x9E3779B97F4A7C15
_KEY_SPREAD = 0xBF58476D1CE4E5B9   # odd: the top bits, which the bitmaps look at, see every bit
_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(9)], np.uint64)   # the low k bytes
_IS_UNIT = bytes(1 if c else 0 for c in _LATIN1_LOW)
# below this many characters the fixed cost of each numpy call outweighs what the keys save
_KEYS_FROM = 4096


def byte_keys(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(starts, ends, keys) of the units of `text` (character offsets, uint64 keys), or None
    when the folded lower case of a character of `text` is 256 or more, or when `text` is short
    (_KEYS_FROM) or long (units() goes in pieces)."""
    if not _KEYS_FROM <= len(text) <= 2 * _PIECE:
        return None
    try:
        low = text.encode("latin-1").translate(_LATIN1_LOW)
    except UnicodeEncodeError:
        b = text.encode("utf-16-le", "surrogatepass")
        if len(b) != 2 * len(text):
            return None
        folded = _take(code_point_tables()[0], np.frombuffer(b, np.uint16))
        if folded.max() > 0xFF:
            return None
        low = folded.astype(np.uint8).tobytes()
    is_unit = np.frombuffer(b"\0" + low.translate(_IS_UNIT) + b"\0", np.int8)
    edges = _nonzero(is_unit[1:] != is_unit[:-1])[0]
    starts, ends = edges[::2], edges[1::2]
    length = ends - starts
    # the 8 bytes at every offset (past the end: zeros), a view; take copies it once
    at = np.ndarray((len(low),), np.uint64, low + bytes(8), 0, (1,))
    keys = _take(at, starts)
    keys &= _take(_MASKS, np.minimum(length, 8))
    keys += length.astype(np.uint64) * np.uint64(_LENGTH_MIX)
    keys *= np.uint64(_KEY_SPREAD)
    return starts, ends, keys


def byte_key(unit: str) -> int | None:
    """byte_keys' key of a unit (as found in any text), or None when a character of it folds to
    256 or more (no text byte_keys takes holds it)."""
    if max(unit) < "\u0100":
        folded = unit.encode("latin-1").translate(_LATIN1_LOW)
    else:
        lower = code_point_tables(_BMP if max(unit) < "\U00010000" else _UNICODE)[0]
        cps = [int(lower[ord(c)]) for c in unit]
        if max(cps) > 0xFF:
            return None
        folded = bytes(cps)
    key = int.from_bytes(folded[:8], "little") + len(folded) * _LENGTH_MIX
    return key * _KEY_SPREAD % (1 << 64)


def window_prefix(unit_hashes: np.ndarray) -> np.ndarray:
    """[0, then the running sums of hash_i * M2**i]: what `windows` needs, for any n."""
    m = len(unit_hashes)
    prefix = np.zeros(m + 1, np.uint64)
    np.multiply(unit_hashes, _UNIT_POW.upto(m + 1).up[:m], out=prefix[1:])
    prefix[1:].cumsum(out=prefix[1:])
    return prefix


def windows(prefix: np.ndarray, n: int) -> np.ndarray:
    """The hash of every window of n consecutive units, sum of hash_(s+k) * M2**k: the window's
    part of the prefix sums divided by M2**s (M2 is odd, so it has an inverse modulo 2**64)."""
    m = len(prefix) - n
    if m <= 0:
        return np.zeros(0, np.uint64)
    w = prefix[n:] - prefix[:m]
    w *= _UNIT_POW.down[:m]
    return w


def windows_at(prefix: np.ndarray, starts: np.ndarray, n: int) -> np.ndarray:
    """windows(prefix, n)[starts]."""
    w = _take(prefix, starts + n)
    w -= _take(prefix, starts)
    w *= _take(_UNIT_POW.down, starts)
    return w
