"""normalize (an ASCII path, one scan that skips the rare steps, whitespace runs collapsed by whole-text
regex and str calls) returns exactly what the straightforward implementation returns
(clean_reference): on real text of this machine (manual pages in every language, raw; package
docs) and on random strings built from every kind of whitespace and line break, CRLF, controls,
invisible characters, surrogates, full-width forms, Chinese punctuation, kana, combining marks and
HTML, including texts longer than the block that bounds the copies."""
import gzip
import random
from pathlib import Path

import clean_reference as ref
import mspretrain.dataprep.steps.clean as clean
from mspretrain.dataprep.steps.clean import normalize
from neardup_eval import _read
from real_text import MAN, man_languages

_WHITESPACE = [chr(cp) for cp in range(0x3001) if chr(cp).isspace()] + ["\r\n", "  ", "\n\n\n"]
_POOLS = [
    "abcdefghij ABC xyz 0123456789",
    ".,;:!?-*()[]{}<>/\\'\"@#$%^&=+_|~`",
    "机器学习是人工智能的一个分支。、「」“”，！？：；（）～",
    "ひらがなカタカナ漢字ー・々〆〇",
    "e\u0301a\u0308c\u0327\u20dd\u093f\u0e31",   # combining marks
    "ＡＢＣａｂｃ１２３＃＄％ﬁ①㎏\uf900",   # NFKC changes these
    "\x00\x07\x08\x0e\x1b\x7f\x84\x9f\u00ad\u200b\u200d\u200e\u202e\u2060\ufeff\ufdd0\ufffe",
    "\ud800\udfff\ud83d\ude00\U0001F600\U00020000",   # lone and paired surrogates, astral
    "Ünïcödé ßøå ΑΒΓ абв עברית عربي",
]
_MARKUP = ["<p>", "</div>", "<br/>", "<b>", "&amp;", "&#20013;", "&nbsp;", "<!-- c -->",
           "<script>x</script>", "a<b", "&#0;", "<unknown>"]


def _random_text(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randrange(0, 120)):
        r = rng.random()
        if r < 0.35:
            parts.append(rng.choice(_WHITESPACE) * rng.choice((1, 1, 1, 2, 3, 9)))
        elif r < 0.4:
            parts.append(rng.choice(_MARKUP))
        else:
            pool = rng.choice(_POOLS)
            parts.append("".join(rng.choice(pool) for _ in range(rng.randrange(1, 12))))
    return "".join(parts)


def _agree(text: str) -> None:
    got, want = normalize(text), ref.normalize(text)
    assert got == want, (text[:200], got[:200], want[:200])


def test_random_strings():
    rng = random.Random(11)
    for _ in range(4000):
        _agree(_random_text(rng))


def test_each_whitespace_character_in_every_position():
    for ws in _WHITESPACE:
        for text in (ws, "a" + ws + "b", ws + "a" + ws, "中" + ws + "文", "a " + ws + " b",
                     "a\n" + ws + "\nb", "a\n\n" + ws + "\n\nb", ws * 3 + "x" + ws * 3):
            _agree(text)
            _agree(text.encode("ascii", "ignore").decode() or " ")


def test_real_text():
    rng = random.Random(3)
    texts = []
    for lang in man_languages() + ["man1"]:
        pages = sorted((MAN / lang).rglob("*.gz"))
        for path in rng.sample(pages, min(12, len(pages))):
            try:
                texts.append(_read(path)[:20000])   # raw: roff stripped, not normalised
            except (UnicodeDecodeError, OSError, EOFError):
                continue
    docs = sorted(Path("/usr/share/doc").glob("*/*"))
    for path in rng.sample(docs, min(300, len(docs))):
        try:
            data = path.read_bytes() if path.suffix != ".gz" else gzip.decompress(path.read_bytes())
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        texts.append(data.decode("utf-8", "replace")[:20000])
    assert len(texts) > 400 and len({t.isascii() for t in texts}) == 2
    for text in texts:
        _agree(text)
        _agree(text.replace("\n", "\r\n"))   # CRLF files


def test_texts_longer_than_the_block():
    """Past the block size whitespace is squeezed block by block; the result is the whole text's."""
    rng = random.Random(5)
    assert clean._BLOCK_CHARS == 1 << 20
    line = "word  and\tword \u3000中文，  \n"
    texts = [line * 60000, (line.replace("\n", "\r\n") + "\n\n\n") * 50000,
             "".join(_random_text(rng) for _ in range(6000))]
    for text in texts:
        assert len(text) > clean._BLOCK_CHARS
        _agree(text)
