"""Language identification: every document gets an ISO 639-1 code and a score in [0, 1].

The model is Google's CLD2 through pycld2 (a naive Bayes over quadgrams with script detection, its
tables compiled into the extension: nothing to download). It was picked by measurement on this
machine (bench/bench_quality.py, manual pages in 24 languages, same 2 KB prefixes): CLD2 about
20 MB per CPU-second with 92% agreement with the pages' directory language, py3langid 0.2.2
1.6 MB/CPU-s (94%: its automaton is a Python loop over bytes), lingua-language-detector 2.1.1
0.3 MB/CPU-s (87%, and 96 MB of models; 2.2.0 has no build for this platform). Most
disagreements are pages whose translation left whole paragraphs in English.

The score is the share of the text CLD2 assigns to the winning language (a page of Chinese full
of English commands scores lower than plain Chinese, but stays "zh"; Japanese with kanji and kana
is "ja"). Traditional Chinese ("zh-Hant") is "zh". Only a window of WINDOW_CHARS characters from
the middle of the text is read, so the cost per document is bounded: on the manual pages of
bench/bench_quality.py a middle window of 1024 characters agrees with the pages' language as often
as the first 2048 did (0.842 against 0.841) at 1.7 times the speed (the start of a document is
more often a title, a header or a licence than its body). A text without letters, or one CLD2
cannot place, is "und" with score 0.
"""
from __future__ import annotations

import re

WINDOW_CHARS = 1024
UNKNOWN = "und"
# what CLD2 refuses as input (it wants valid UTF-8 without C0 controls other than whitespace)
_REFUSED = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def identify(text: str) -> tuple[str, float]:
    """(language code, score in [0, 1]) of the text's middle WINDOW_CHARS characters."""
    import pycld2
    head = _REFUSED.sub(" ", window(text))
    if not any(map(str.isalpha, head)):
        return UNKNOWN, 0.0
    _, _, details = pycld2.detect(head, bestEffort=True)
    _, code, percent, _ = details[0]
    if code in ("un", "xxx"):
        return UNKNOWN, 0.0
    return code.split("-")[0], round(percent / 100.0, 4)


def window(text: str) -> str:
    """The WINDOW_CHARS characters in the middle of `text` (all of a shorter text)."""
    if len(text) <= WINDOW_CHARS:
        return text
    start = (len(text) - WINDOW_CHARS) // 2
    return text[start:start + WINDOW_CHARS]


def language_reason(lang: str, score: float, languages: tuple[str, ...],
                    min_score: float) -> str | None:
    """'language' when `lang` is not one of `languages` (empty: any), 'language_score' when the
    identification is less sure than `min_score`; None to keep."""
    if languages and lang not in languages:
        return "language"
    if score < min_score:
        return "language_score"
    return None
