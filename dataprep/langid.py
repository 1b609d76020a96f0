"""Language identification: every document gets an ISO 639-1 code and a probability.

The model is py3langid's (a numpy port of langid.py: byte n-gram naive Bayes over 97 languages,
shipped inside the package, no download). It was picked by measurement against
lingua-language-detector (see bench/bench_quality.py): on the same prefixes of real manual pages in
22 languages it is several times faster per CPU-second at equal accuracy, its model is 2 MB
instead of 96 MB, and it loads in a fraction of a second in every worker.

Only the first PREFIX_CHARS characters are scored: the cost per document is bounded and a few
thousand characters settle the language.

Chinese and Japanese are decided by script first, because a byte n-gram naive Bayes model mixes
badly: on Chinese text full of English commands and paths it can answer "la" with probability 1.
A Han or kana character counts as CJK_WEIGHT letters (one carries about as much as a short word);
when CJK characters hold at least half of that weighted letter count, the text is "ja" if kana
make up at least KANA_SHARE of its CJK characters (Japanese written with kanji always has kana
particles) and "zh" otherwise, with the weighted CJK share as its score. Any other text is
classified with its CJK characters taken out, and, where Latin letters and another alphabet
(Cyrillic, Greek, ...) are mixed, with the words of the smaller of the two taken out: an
untranslated English paragraph with a few Russian headings is English. Source code is mostly "en"
(its keywords are English).
"""
from __future__ import annotations

import re
from functools import lru_cache

PREFIX_CHARS = 2048
UNKNOWN = "und"      # a text with no letters at all
CJK_WEIGHT = 3
KANA_SHARE = 0.1
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_KANA = re.compile(r"[\u3040-\u30ff]")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_LATIN = re.compile(r"[A-Za-z\u00c0-\u024f]+")
_NON_LATIN = re.compile(r"[^\W\d_A-Za-z\u00c0-\u024f]+")


@lru_cache(maxsize=1)
def _identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier
    return LanguageIdentifier.from_pickled_model(MODEL_FILE, norm_probs=True)


def identify(text: str) -> tuple[str, float]:
    """(language code, probability in [0, 1]) of the text's first PREFIX_CHARS characters."""
    head = text[:PREFIX_CHARS]
    letters = sum(map(str.isalpha, head))
    if not letters:
        return UNKNOWN, 0.0
    han, kana = len(_HAN.findall(head)), len(_KANA.findall(head))
    cjk = han + kana
    if cjk:
        share = CJK_WEIGHT * cjk / (CJK_WEIGHT * cjk + letters - cjk)
        if share >= 0.5:
            return ("ja" if kana >= KANA_SHARE * cjk else "zh"), round(share, 4)
        head = _CJK.sub(" ", head)
        letters -= cjk
    latin = sum(map(len, _LATIN.findall(head)))
    if 0 < latin < letters:    # two alphabets: keep the larger one's words
        head = (_NON_LATIN if 2 * latin >= letters else _LATIN).sub(" ", head)
    if not any(map(str.isalpha, head)):
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
