"""The units of decontamination as numpy arrays: where each unit starts and ends, and a 64-bit hash
of its lower-cased characters, in a few whole-array passes instead of a Python object per unit.

A unit is what `re.findall(rf"[{CJK}]|[^\\W_]+", text)` finds: one character of the CJK ranges, or
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

CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_FIRST_CJK = 0x3040
_UNICODE = 0x110000
_M = np.uint64(0x9E3779B97F4A7C15)     # odd: invertible modulo 2**64
_M2 = np.uint64(0xD6E8FEB86659FD93)
_ALNUM, _CJK = np.uint8(1), np.uint8(2)

# ASCII: a letter or digit becomes its lower case, anything else NUL (bytes.translate, at C speed)
_ASCII_LOW = bytes(c + 32 if 65 <= c <= 90 else c if chr(c).isalnum() and c < 128 else 0
                   for c in range(256))

_tables: dict[str, np.ndarray] = {}


def _code_point_tables() -> tuple[np.ndarray, np.ndarray]:
    """(lower: uint32 per code point, the folded lower case of a unit character and 0 for any
    other; cls: uint8 per code point, _ALNUM | _CJK bits)."""
    if not _tables:
        every = np.arange(_UNICODE, dtype=np.uint32)
        text = every.tobytes().decode("utf-32-le", "surrogatepass")
        cls = np.zeros(_UNICODE, np.uint8)
        for m in re.finditer(r"[^\W_]+", text):
            cls[m.start():m.end()] |= _ALNUM
        for m in re.finditer(f"[{CJK}]+", text):
            cls[m.start():m.end()] |= _CJK
        # İ is the one code point whose lower case is two; Σ's depends on what follows
        lowered = text.replace("\u0130", "i").lower()
        lower = np.frombuffer(lowered.encode("utf-32-le", "surrogatepass"), np.uint32).copy()
        lower[[0x3A3, 0x3C2]] = 0x3C3
        lower[cls == 0] = 0   # a CJK character that is no letter (・) keeps its value: a unit
        _tables["lower"], _tables["cls"] = lower, cls
    return _tables["lower"], _tables["cls"]


_POWERS: dict[int, np.ndarray] = {}


def _powers(base: np.uint64, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(base**i, base**-i modulo 2**64) for i < n at least, grown by doubling and kept."""
    key = int(base)
    have = _POWERS.get(key)
    if have is None or have.shape[1] < n:
        size = max(n, 2 * (0 if have is None else have.shape[1]), 4096)
        out = np.empty((2, size), np.uint64)
        for k, b in enumerate((key, pow(key, -1, 1 << 64))):
            steps = np.full(size, b, np.uint64)
            steps[0] = 1
            np.cumprod(steps, dtype=np.uint64, out=out[k])
        _POWERS[key] = have = out
    return have[0], have[1]


def units(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, ends, hashes) of the units of `text`: character offsets (int64) and uint64 hashes
    of their folded lower case."""
    if text.isascii():
        return _runs(np.frombuffer(text.encode("ascii").translate(_ASCII_LOW), np.uint8))
    cps = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)
    if cps.max() < _FIRST_CJK:   # below the CJK ranges and in the BMP: the 16-bit table
        return _runs(np.take(_low16(), cps))
    return _with_cjk(cps)


def _runs(low: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """units() of a text without CJK characters, from the folded lower case of every character
    (0: not a letter or digit): a unit is a maximal run of letters and digits."""
    letter = np.zeros(len(low) + 2, bool)
    np.not_equal(low, 0, out=letter[1:-1])
    edges = np.flatnonzero(letter[1:] != letter[:-1])
    starts = edges[::2]
    return starts, edges[1::2], _hashes(low, starts)


def _with_cjk(cps: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """units() of a text with CJK characters, from its code points."""
    lower, classes = _code_point_tables()
    low, cls = np.take(lower, cps), np.take(classes, cps)
    alnum, cjk = (cls & _ALNUM) != 0, (cls & _CJK) != 0
    n = len(cls)
    # the regex starts a unit at a CJK character that is no letter, and at a letter or digit
    # when every character of its run before it is CJK (the run so far held single units)
    run_start = np.maximum.accumulate(np.where(alnum, 0, np.arange(1, n + 1)))
    breakers = np.zeros(n + 1, np.int64)
    np.cumsum(alnum & ~cjk, out=breakers[1:])
    first = (cjk & ~alnum) | (alnum & (breakers[:n] == breakers[run_start]))
    next_alnum = np.append(alnum[1:], False)
    next_first = np.append(first[1:], False)
    last = (alnum | cjk) & (~next_alnum | next_first)
    starts = np.flatnonzero(first)
    return starts, np.flatnonzero(last) + 1, _hashes(low, starts)


def _hashes(low: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The hash of each unit: sum of low[start + k] * M**k. A unit's characters and the non-unit
    characters (0) up to the next unit's start sum to the same, so one reduceat does it."""
    if not len(starts):
        return np.zeros(0, np.uint64)
    pw, inv = _powers(_M, len(low))
    h = np.add.reduceat(np.multiply(low, pw[:len(low)], dtype=np.uint64), starts)
    h *= np.take(inv, starts)
    # scramble: the polynomial alone is linear, and windows are hashed from these again
    h ^= h >> np.uint64(31)
    h *= np.uint64(0xBF58476D1CE4E5B9)
    h ^= h >> np.uint64(29)
    return h


def _low16() -> np.ndarray:
    """The lower table of the BMP as uint16 (lower-case of a BMP character stays in the BMP)."""
    if "low16" not in _tables:
        _tables["low16"] = _code_point_tables()[0][:0x10000].astype(np.uint16)
    return _tables["low16"]


def window_prefix(unit_hashes: np.ndarray) -> np.ndarray:
    """[0, then the running sums of hash_i * M2**i]: what `windows` needs, for any n."""
    m = len(unit_hashes)
    pw = _powers(_M2, m + 1)[0]
    prefix = np.empty(m + 1, np.uint64)
    prefix[0] = 0
    np.cumsum(unit_hashes * pw[:m], out=prefix[1:])
    return prefix


def windows(prefix: np.ndarray, n: int) -> np.ndarray:
    """The hash of every window of n consecutive units, sum of hash_(s+k) * M2**k: the window's
    part of the prefix sums divided by M2**s (M2 is odd, so it has an inverse modulo 2**64)."""
    m = len(prefix) - n
    if m <= 0:
        return np.zeros(0, np.uint64)
    w = prefix[n:] - prefix[:m]
    w *= _powers(_M2, m)[1][:m]
    return w
