"""Language identification: every document gets an ISO 639-1 code and a probability.

The model is py3langid's (a numpy port of langid.py: byte n-gram naive Bayes over 97 languages,
shipped inside the package, no download). It was picked by measurement against
lingua-language-detector (see bench/bench_quality.py): on the same prefixes of real manual pages in
22 languages it is several times faster per CPU-second at equal accuracy, its model is 2 MB
instead of 96 MB, and it loads in a fraction of a second in every worker.

Only the first PREFIX_CHARS characters are scored: the cost per document is bounded and a few
thousand characters settle the language. Japanese written in kanji with kana is "ja" (kana are
decisive), Chinese technical text with English commands and paths stays "zh", and source code is
mostly scored as "en" (its keywords are English).
"""
from __future__ import annotations

from functools import lru_cache

PREFIX_CHARS = 2048
UNKNOWN = "und"      # a text with no letters at all


@lru_cache(maxsize=1)
def _identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier
    return LanguageIdentifier.from_pickled_model(MODEL_FILE, norm_probs=True)


def identify(text: str) -> tuple[str, float]:
    """(language code, probability in [0, 1]) of the text's first PREFIX_CHARS characters."""
    head = text[:PREFIX_CHARS]
    if not any(c.isalpha() for c in head):
        return UNKNOWN, 0.0
    lang, prob = _identifier().classify(head)
    return str(lang), round(float(prob), 4)


def language_reason(lang: str, score: float, languages: tuple[str, ...],
                    min_score: float) -> str | None:
    """'language' when `lang` is not one of `languages` (empty: any), 'language_score' when the
    identification is less sure than `min_score`; None to keep."""
    if languages and lang not in languages:
        return "language"
    if score < min_score:
        return "language_score"
    return None
