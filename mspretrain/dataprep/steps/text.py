"""The one definition of CJK characters that every step shares (filters, PII, decontamination).

CJK here means the characters of East Asian scripts that are written without spaces between words,
or that glue to their neighbours without one: Han (the unified ideographs of the BMP and of planes
2 and 3, compatibility ideographs, radicals), kana (with half-width katakana), bopomofo, hangul
(syllables and jamo: Korean puts spaces between words, but particles glue to numbers and names,
"010-1234-5678로"), the letter-like signs of the CJK symbols block (々 〆 〇, Hangzhou numerals,
kana repeat marks), enclosed CJK signs and full-width Latin letters. Spaces and punctuation are
not in it: the ideographic space U+3000 is a space, "。" and "、" are punctuation as anywhere.

What a step does with it:

- the quality filters and decontamination count every CJK character as a unit of its own (a word,
  for n-gram statistics), since these scripts give no spaces to split at;
- PII redaction takes a CJK character next to a number as a boundary, not as part of a word
  ("手机号码15341354926已绑定").
"""
from __future__ import annotations

CJK_RANGES: tuple[tuple[int, int], ...] = (
    (0x1100, 0x11FF),     # hangul jamo
    (0x2E80, 0x2FDF),     # CJK and Kangxi radicals
    (0x3005, 0x3007),     # 々 〆 〇
    (0x3021, 0x3029),     # Hangzhou numerals
    (0x3031, 0x3035),     # kana repeat marks
    (0x3038, 0x303C),     # Suzhou numerals, 〻 〼
    (0x3040, 0x30FF),     # hiragana, katakana
    (0x3100, 0x312F),     # bopomofo
    (0x3130, 0x318F),     # hangul compatibility jamo
    (0x3190, 0x31FF),     # kanbun, bopomofo extended, strokes, katakana extensions
    (0x3200, 0x32FF),     # enclosed CJK letters
    (0x3400, 0x4DBF),     # ideographs, extension A
    (0x4E00, 0x9FFF),     # ideographs
    (0xA960, 0xA97F),     # hangul jamo extended-A
    (0xAC00, 0xD7FF),     # hangul syllables, jamo extended-B
    (0xF900, 0xFAFF),     # compatibility ideographs
    (0xFF21, 0xFF3A),     # full-width Latin capitals
    (0xFF41, 0xFF5A),     # full-width Latin small letters
    (0xFF66, 0xFFDC),     # half-width katakana and hangul
    (0x20000, 0x3FFFF),   # ideographs of planes 2 and 3 (extensions B-I, compatibility supplement)
)
# the same set as the inside of a regex character class: f"[{CJK}]"
CJK = "".join(f"{chr(a)}-{chr(b)}" for a, b in CJK_RANGES)
FIRST_CJK = CJK_RANGES[0][0]   # no code point below it is CJK
