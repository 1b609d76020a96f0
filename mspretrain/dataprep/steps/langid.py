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
more often a title, a header or a licence than its body).

Codes are ISO 639-1 where the language has one: CLD2's old codes are mapped (`iw` -> `he`, `jw` ->
`jv`, `in` -> `id`, `mo` -> `ro`), both Chinese scripts are `zh` (`script` says which), and a
language without an ISO 639-1 code keeps CLD2's ISO 639-2/3 code (`haw`, `ceb`). "und" with
score 0: a text without letters, one CLD2 cannot place (`un`, `xx-...`), and one it calls English
only because English is its fallback: CLD2 answers "en" for text in languages it has no model of
(Interlingua, Friulian, Walloon, Sardinian, ...), with a normalized score (how well the text fits
the language's model, per KB) far below real English's. On gettext catalogues of 136 languages
and manual pages on this machine (bench/bench_pii.py), English windows score >= 542 and 99% of
them >= 705, while all but one of the non-English ones CLD2 calls "en" score 96-544 (median 285):
below EN_MIN_SCORE = 550 "en" gives way to CLD2's second language if that one fits at least as
well (a Chinese page whose window starts with a paragraph of English), else to "und".

English that CLD2 can only call English as its fallback is not always foreign: short UI strings,
menu labels, lists of person, place, product or language names fit English's model as poorly as
Interlingua does (fit 60-545 on tests/dataprep/langid_dev.py's English against 240-540 for its
foreign strings), so the fit cannot tell them apart. Two other things do, on that set: the letters
(English needs no letter outside ASCII, while Friulian, Sardinian, Walloon and most other Latin-script
languages use some: >= 4 % of their letters there) and CLD2's own reliability, which it computes
from how far its first language is ahead of the next one, chunk by chunk, and which it gives for
English names and UI strings (about half of them) but not for a language it has no model of, whose
quadgrams fit several Romance models alike (one of the set's 317 foreign documents of 20
characters or more, an Interlingua one). Interlingua is the exception (ASCII, and reliably "English" in a catalogue
of sentences): its short words give it away ("le", "de", "un", "non"), so a window whose
lowercase words of three letters or fewer are mostly outside English's closed class of them is
not English-unplaced. Such a document is "en", *unplaced*: `classify` says so, and its score is below 0.5
(UNPLACED_MAX_SCORE times its fit over EN_MIN_SCORE), so that `filters.min_language_score: 0.5`
drops it again; the report counts these documents (`languages.*.unplaced`).

A short window (< SHORT_CHARS characters, all of a short document) is too few quadgrams for CLD2:
it calls "Archivo no encontrado", "Palitan ang password" or "Date de modification" English,
reliably and with a good fit. Such a window CLD2 calls English gets a second opinion from its
words (wordfreq 3.1.1's frequency lists, which ship in its wheel): `lexical_vote` counts the words
clearly more frequent (LEXICAL_MARGIN) in one of LEXICAL_LANGUAGES than in English against those
clearly more frequent in English. More foreign than English: "und" (a language without a list,
Interlingua or Latin, still looks Italian or Spanish more than English). More English: a window
CLD2 calls English only as its fallback is English-unplaced even where the rules above say "und"
("Quit", "Undo Typing"). Chosen on tests/dataprep/langid_dev.py, `filters.undetermined: drop`:
foreign kept 13 -> 0 of 317, English dropped 43 -> 30 of 267 (py3langid 0.2.2: 18 kept, 59
dropped). Longer windows are untouched (the held-out catalogues' documents are all >= 300
characters: their figures do not change); a short window CLD2 calls English costs about 0.1 ms
instead of 0.02, and the lists 0.7 CPU-s and 120 MB once per process, on the first such window.
"""
from __future__ import annotations

import re

WINDOW_CHARS = 1024
UNKNOWN = "und"
EN_MIN_SCORE = 550.0
# English-unplaced: the most letters outside ASCII (per letter of the window; a list of country
# names has a few: "Côte d'Ivoire", "Åland"), and the score at EN_MIN_SCORE's fit
UNPLACED_MAX_NON_ASCII = 0.01
UNPLACED_MAX_SCORE = 0.5
# English's short lowercase words are a closed class (articles, prepositions, pronouns, a few
# verbs): a window whose lowercase words of <= 3 letters are mostly outside it ("le", "de", "un",
# "es", "non", "pro": Interlingua's gettext catalogue; Interlingua is ASCII and CLD2 calls it
# reliably English) is not English; names and UI labels have few such words, or English ones
_EN_SHORT = frozenset("""a an the of to in on at by for from with and or nor but not no is are was
be has had have do did it its as if so up off out all any new use set get add via per can may you
your we our my me he she his her they them this that who how why what when one two too yet now own
see run key""".split())
_WORD = re.compile(r"[^\W\d_]+")
# Windows shorter than this get a lexical second opinion when CLD2 calls them English: a few
# words are too few quadgrams for CLD2 ("Archivo no encontrado" is reliably English to it)
SHORT_CHARS = 200
# a word votes for a language when it is at least this much (Zipf, log10) more frequent there
# than in English: 10**1.5, about 30 times
LEXICAL_MARGIN = 1.5
# the Latin-script languages wordfreq has lists of (Tagalog is its "fil") that short foreign
# strings are mistaken for English in; their small lists (words of Zipf >= 3) against English's
# large one (down to Zipf 1: the names and brands English lists are full of are English words)
LEXICAL_LANGUAGES = ("fr", "de", "es", "pt", "it", "nl", "id", "ms", "fil", "ca", "pl", "sv", "da",
                     "nb", "fi", "ro", "tr", "vi")
# a letter of a script other than Latin's
_NON_LATIN = re.compile(r"[^\W\d_a-zA-Z\u00c0-\u024f\u1e00-\u1eff]")
# CLD2's codes that are not ISO 639-1 (older or private ones) -> ISO 639-1
_ISO = {"iw": "he", "jw": "jv", "in": "id", "mo": "ro", "zh-Hant": "zh", "sr-ME": "sr"}
# what CLD2 refuses as input (it wants valid UTF-8 without C0 controls other than whitespace)
_REFUSED = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ud800-\udfff]")


def identify(text: str) -> tuple[str, float]:
    """(language code, score in [0, 1]) of the text's middle WINDOW_CHARS characters."""
    return classify(text)[:2]


def classify(text: str) -> tuple[str, float, bool]:
    """`identify`'s (code, score), and whether the document is English-unplaced: "en" although
    CLD2 found it English only as its fallback (see the module's docstring)."""
    import pycld2
    head = _REFUSED.sub(" ", window(text))
    if not any(map(str.isalpha, head)):
        return UNKNOWN, 0.0, False
    _, _, details = pycld2.detect(head, bestEffort=True)
    _, code, percent, fit = details[0]
    if code == "en" and fit < EN_MIN_SCORE:
        # English only as CLD2's fallback: the next language it found, if any (a Chinese page
        # whose window starts with a paragraph of English), else English-unplaced or none
        en_fit = fit
        _, code, percent, fit = details[1]
        if fit < EN_MIN_SCORE:
            return _unplaced(head, en_fit)
    elif code == "en" and len(head) < SHORT_CHARS and lexical_vote(head) > 0:
        return UNKNOWN, 0.0, False
    if code in ("un", "xxx") or code.startswith("xx-"):
        return UNKNOWN, 0.0, False
    return iso_code(code), round(percent / 100.0, 4), False


def _unplaced(head: str, fit: float) -> tuple[str, float, bool]:
    """("en", a score < UNPLACED_MAX_SCORE, True) for a window CLD2 calls English only as its
    fallback that is English by its words (`lexical_vote` < 0, short windows) or, where they do
    not tell (0, or a longer window), by `_fallback_english`; else ("und", 0.0, False)."""
    vote = lexical_vote(head) if len(head) < SHORT_CHARS else 0
    if vote > 0 or (vote == 0 and not _fallback_english(head)):
        return UNKNOWN, 0.0, False
    return "en", round(UNPLACED_MAX_SCORE * min(fit / EN_MIN_SCORE, 0.9999), 4), True


def _fallback_english(head: str) -> bool:
    """Whether a window CLD2 calls English only as its fallback is English all the same: its
    letters are ASCII, CLD2 calls it English reliably without bestEffort, and its short lowercase
    words are mostly English ones."""
    import pycld2
    letters = [c for c in head if c.isalpha()]
    if sum(not c.isascii() for c in letters) > UNPLACED_MAX_NON_ASCII * len(letters):
        return False
    reliable, _, details = pycld2.detect(head)
    if not reliable or details[0][1] != "en":
        return False
    short = [w for w in _WORD.findall(head) if len(w) <= 3 and w.islower()]
    other = sum(w not in _EN_SHORT for w in short)
    return not (other >= 3 and 3 * other > len(short))


def lexical_vote(text: str) -> int:
    """How much more a text's words belong to another language than to English: the most, over
    LEXICAL_LANGUAGES, of its words at least LEXICAL_MARGIN more frequent in that language than
    in English less those at least as much more frequent in English (> 0: foreign, < 0: English,
    0: the words do not tell). Single letters do not vote (options, initials, "l'"), and a text
    with letters of another script (a Chinese page quoting English) gets 0. wordfreq's lists are
    loaded once per process, on the first call."""
    if _NON_LATIN.search(text):
        return 0
    from wordfreq import get_frequency_dict
    ratio = 10 ** LEXICAL_MARGIN
    words = [w.lower() for w in _WORD.findall(text) if len(w) > 1]

    def freqs(lang: str, wordlist: str) -> list[float]:
        # wordfreq's dictionary read directly (zipf_frequency would tokenize each word again);
        # a word it does not list counts as once per 10**9 words, Zipf 0
        table = get_frequency_dict(lang, wordlist)
        return [table.get(w, 1e-9) for w in words]
    english = freqs("en", "large")

    def votes(lang: str) -> int:
        pairs = list(zip(freqs(lang, "small"), english))
        return sum(f >= ratio * en for f, en in pairs) - sum(en >= ratio * f for f, en in pairs)
    return max(map(votes, LEXICAL_LANGUAGES))


def iso_code(cld2_code: str) -> str:
    """The ISO 639-1 code (639-2/3 where there is none) of a CLD2 language code."""
    return _ISO.get(cld2_code, cld2_code.split("-")[0])


def script(text: str, lang: str) -> str:
    """The ISO 15924 script of a "zh" text, which `identify` does not tell apart: "Hant" when CLD2
    reads the window as traditional Chinese, else "Hans"; "" for other codes."""
    if lang != "zh":
        return ""
    import pycld2
    head = _REFUSED.sub(" ", window(text))
    codes = [d[1] for d in pycld2.detect(head, bestEffort=True)[2]]
    return "Hant" if codes and codes[0] == "zh-Hant" else "Hans"


def window(text: str) -> str:
    """The WINDOW_CHARS characters in the middle of `text` (all of a shorter text)."""
    if len(text) <= WINDOW_CHARS:
        return text
    start = (len(text) - WINDOW_CHARS) // 2
    return text[start:start + WINDOW_CHARS]


def language_reason(lang: str, score: float, languages: tuple[str, ...],
                    min_score: float, undetermined: str = "drop") -> str | None:
    """'language' when `lang` is not one of `languages` (empty: any), 'language_score' when the
    identification is less sure than `min_score`; None to keep. An undetermined document ("und")
    is kept where `undetermined` is "keep" or "und" is listed, whatever its score (it has none),
    else it is a 'language' drop."""
    if lang == UNKNOWN and languages:
        return None if undetermined == "keep" or UNKNOWN in languages else "language"
    if languages and lang not in languages:
        return "language"
    if score < min_score and lang != UNKNOWN:
        return "language_score"
    return None
