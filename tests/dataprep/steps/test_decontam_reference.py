"""Decontamination gives exactly what a plain, slow definition gives: the units of the regex, every
window of every length looked up in a dict. Checked on real text in every language this machine has
manual pages in, package documentation, planted evaluation passages with edits at the window edges,
CJK, mixed scripts, odd code points and very short documents."""
from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import pytest

from mspretrain.dataprep.steps import textunits
from mspretrain.dataprep.steps.decontam import EvalIndex
from real_text import man_languages, man_texts

# The definition, written out again: a CJK character (the steps' one set), or a run of letters
# and digits.
from mspretrain.dataprep.steps.text import CJK as _CJK  # noqa: E402
_UNIT = re.compile(rf"[{_CJK}]|[^\W_]+")


class Reference:
    """The n-gram index the simple way: regex units, lower-cased one by one, every window."""

    def __init__(self, items: list[tuple[str, str]], ngram: int):
        self.vocab: dict[str, int] = {}
        self.grams: dict[tuple, int] = {}
        self.lengths: set[int] = set()
        for number, (_, text) in enumerate(items):
            ids = [self.vocab.setdefault(u.lower(), len(self.vocab)) for u in _UNIT.findall(text)]
            if ids:
                n = min(ngram, len(ids))
                self.lengths.add(n)
                for s in range(len(ids) - n + 1):
                    self.grams.setdefault(tuple(ids[s:s + n]), number)

    def find(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        found = list(_UNIT.finditer(text))
        ids = [self.vocab.get(m.group(0).lower(), -1) for m in found]
        items, windows = set(), []
        for n in self.lengths:
            for s in range(len(ids) - n + 1):
                item = self.grams.get(tuple(ids[s:s + n]))
                if item is not None:
                    items.add(item)
                    windows.append((s, s + n - 1))
        spans: list[list[int]] = []
        for a, b in sorted(windows):
            start, end = found[a].start(), found[b].end()
            if spans and start <= spans[-1][1]:
                spans[-1][1] = max(spans[-1][1], end)
            else:
                spans.append([start, end])
        return sorted(items), [tuple(s) for s in spans]


# characters that stress the unit boundaries and the lower case
_ODD = ("İıIiΣσςΟΔΑßẞµªº×÷ǅǈﬁＡａ１٣߀𝐀𝟙𠀀😀\u0301\u0307\u00a0\u2014\u2019_-'.,;:!?\t\n\0"
        "・ー゠ー々〆〇中文字天地玄黄한국어ガキ가힣ｶ\uf900\ud7af\u3040\u30ff\u4dbf\u9fff")


def _pool_text(rng: random.Random, n: int) -> str:
    pool = _ODD + "abcXYZ019 "
    return "".join(rng.choice(pool) for _ in range(n))


def test_the_code_point_tables_are_pythons_own():
    """Per code point, written out one by one: letter or digit as the regex sees it, the CJK
    ranges, and the lower case (İ, Σ and ς folded as documented)."""
    lower, classes = textunits.code_point_tables(0x110000)
    bmp, bmp_classes = textunits.code_point_tables()
    word = re.compile(r"[^\W_]")
    cjk = re.compile(f"[{_CJK}]")
    for c in range(0x110000):
        ch = chr(c)
        alnum, in_cjk = word.match(ch) is not None, cjk.match(ch) is not None
        assert classes[c] == alnum + 2 * in_cjk, hex(c)
        if not (alnum or in_cjk):
            assert lower[c] == 0, hex(c)
        elif c in (0x130, 0x3A3, 0x3C2):
            assert lower[c] == {0x130: ord("i"), 0x3A3: 0x3C3, 0x3C2: 0x3C3}[c]
        else:
            assert lower[c] == ord(ch.lower()), hex(c)
    assert bmp.dtype == np.uint16 and np.array_equal(bmp, lower[:0x10000])
    assert np.array_equal(bmp_classes, classes[:0x10000])


def test_units_are_the_regex_units_and_equal_lower_case_hashes_equal():
    rng = random.Random(5)
    texts = [_pool_text(rng, rng.randint(0, 60)) for _ in range(3000)]
    texts += [t for lang in ("en", "tr", "ru", "ja", "zh_CN", "ko") for _, t in man_texts(lang, 4)]
    texts += ["", " ", "a", "中", "İ", "ΟΔΟΣ οδοσ οδος", "abc中文def", "中文abc", "a・b", "ab中c"]
    # longer than a hashing slice (textunits._HASH_BLOCK), with a unit longer than one
    long = _pool_text(rng, 3 * textunits._HASH_BLOCK)
    texts += [long, long[:5000] + "Ab" * textunits._HASH_BLOCK + long[5000:]]
    by_lower: dict[str, int] = {}
    for text in texts:
        starts, ends, hashes = textunits.units(text)
        spans = [m.span() for m in _UNIT.finditer(text)]
        assert list(zip(starts.tolist(), ends.tolist())) == spans, repr(text)
        for (a, b), h in zip(spans, hashes.tolist()):
            assert by_lower.setdefault(text[a:b].lower(), h) == h, repr(text[a:b])
    starts, ends, hashes = textunits.units(texts[-1])   # a unit hashes the same anywhere
    for i in [0, 1, 1000, int(np.argmax(ends - starts)), len(starts) - 1]:
        assert textunits.units(texts[-1][starts[i]:ends[i]])[2].tolist() == [hashes[i]]
    # different units hash apart here, but for the documented folding (İ as i, Σ and ς as σ)
    folded: dict[int, set[str]] = {}
    for unit, h in by_lower.items():
        folded.setdefault(h, set()).add(unit.replace("\u0307", "").replace("ς", "σ"))
    assert all(len(f) == 1 for f in folded.values())
    assert len(folded) < len(by_lower)   # and the folding did happen


def _edge_edits(rng: random.Random, words: list[str]) -> str:
    """A piece of an evaluation passage with an edit at or near a window edge."""
    k = rng.choice([11, 12, 13, 14, 15, 26, len(words)])
    at = rng.randrange(max(1, len(words) - k + 1))
    piece = words[at:at + k]
    if piece and rng.random() < 0.7:
        i = rng.choice([0, len(piece) - 1, min(12, len(piece) - 1), min(13, len(piece) - 1)])
        edit = rng.choice(["append", "replace", "split", "join", "case", "drop"])
        if edit == "append":
            piece[i] += rng.choice(["s", "_x", "é", "中", "1"])
        elif edit == "replace":
            piece[i] = rng.choice(["zebra", "ΟΔΟΣ", "İstanbul", "k8s"])
        elif edit == "split" and len(piece[i]) > 1:
            cut = rng.randrange(1, len(piece[i]))
            piece[i] = piece[i][:cut] + rng.choice([" ", "-", "_", "\u2014"]) + piece[i][cut:]
        elif edit == "join" and i + 1 < len(piece):
            piece[i:i + 2] = [piece[i] + piece[i + 1]]
        elif edit == "case":
            piece[i] = piece[i].swapcase()
        elif edit == "drop":
            del piece[i]
    sep = rng.choice([" ", "\n", "  ", " — ", ", ", "_", "\u00a0", ""])
    return sep.join(piece)


def _chinese_piece(rng: random.Random, text: str) -> str:
    chars = [c for c in text if "\u4e00" <= c <= "\u9fff"]
    k = rng.choice([12, 13, 14, 30])
    at = rng.randrange(max(1, len(chars) - k + 1))
    piece = "".join(chars[at:at + k])
    return rng.choice([piece, "abc" + piece, piece + "abc", piece[:6] + "x" + piece[6:],
                       piece[:6] + "・" + piece[6:], piece[:6] + " " + piece[6:]])


@pytest.fixture(scope="module")
def evaluation():
    en = [t for _, t in man_texts("en", 40, min_chars=700, seed=31)]
    zh = [t for lang in ("zh_CN", "zh_TW") for _, t in man_texts(lang, 6, min_chars=300, seed=4)]
    tr = [t for _, t in man_texts("tr", 30, min_chars=300, seed=2) if "İ" in t][:3]
    items = [t[150:550] for t in en[:20]] + [t[100:400] for t in zh]
    items += [t[:400] for t in tr]
    items += ["What is two plus two?", "2 + 2", "天地玄黄", "Linux内核模块的加载与卸载需要 root 权限",
              "ΤΟ ΠΡΟΓΡΑΜΜΑ ΕΚΤΥΠΩΝΕΙ ΤΟ ΟΝΟΜΑ ΤΟΥ ΑΡΧΕΙΟΥ ΚΑΙ ΤΟ ΜΕΓΕΘΟΣ ΤΟΥ ΣΤΗΝ ΟΘΟΝΗ ΜΑΣ",
              "İstanbul İzmir Iğdır ıspanak İlk iş günü İçerik ılık ikinci ırmak İçin ilgi ışık",
              "!!! ... ---", ""]
    items = [(f"eval.jsonl:{i + 1}", t) for i, t in enumerate(items)]
    return items, en[20:], zh


def _documents(items, en_hosts, zh) -> list[str]:
    rng = random.Random(17)
    texts = [t for _, t in items]
    docs = [t for lang in man_languages() for _, t in man_texts(lang, 12, min_chars=200, seed=9)]
    docs += [p.read_text(errors="replace")[:5000]
             for p in sorted(Path("/usr/share/doc").glob("*/copyright"))[::25]]
    hosts = en_hosts + docs[:200]
    for _ in range(1500):
        host = rng.choice(hosts)
        at = rng.randrange(len(host) + 1)
        source = rng.choice(texts)
        if rng.random() < 0.25 and any("\u4e00" <= c <= "\u9fff" for c in source):
            piece = _chinese_piece(rng, source)
        else:
            piece = _edge_edits(rng, source.split())
        piece = rng.choice([piece, piece, piece.upper(), piece.title()])
        glue = rng.choice(["", " ", "\n", "x"])
        docs.append(host[:at] + glue + piece + glue + host[at:])
    docs += [_pool_text(rng, rng.randint(0, 40)) for _ in range(300)]
    docs += [" ".join(t.split()[:k]) for t in texts for k in (0, 1, 3, 12, 13, 14)]
    docs += ["", " ", "x", "中", "İstanbul", "ΟΔΟΣ"]
    return docs


@pytest.mark.parametrize("ngram, keys_from", [(13, None), (4, None), (13, 0)])
def test_find_is_the_reference_on_thousands_of_documents(evaluation, ngram, keys_from,
                                                         monkeypatch):
    """keys_from=0: every document short enough takes the first look with the byte keys."""
    if keys_from is not None:
        monkeypatch.setattr(textunits, "_KEYS_FROM", keys_from)
    items, en_hosts, zh = evaluation
    index, reference = EvalIndex(items, ngram), Reference(items, ngram)
    docs = _documents(items, en_hosts, zh)
    assert len(docs) > 2000
    matched = 0
    for doc in docs:
        want = reference.find(doc)
        assert index.find(doc) == want, repr(doc[:200])
        matched += bool(want[0])
    assert matched > 500 and matched < len(docs) - 500   # both sides well represented


def test_a_dotted_capital_i_unit_is_found():
    """'İ' lowers to two code points; the pre-check before numpy hashing lower-cased the whole
    text first and then split it, so it missed such a unit. find() follows the definition."""
    item = "İstanbul İzmir ve Ankara arasında hızlı tren seferleri her gün düzenli olarak yapılır"
    index = EvalIndex([("e:1", item)], 13)
    doc = "Giriş. " + item + " Son."
    assert index.find(doc) == Reference([("e:1", item)], 13).find(doc)
    assert index.find(doc)[0] == [0]


def test_a_long_text_in_pieces_is_the_text_whole(monkeypatch):
    """units() cuts a long text after a character of no unit: the units, their hashes and the
    matches are those of the text taken whole, with cut points next to a run of a Latin letter
    and CJK characters ("linux内核" is one unit), a CJK character that is no letter (・, a unit),
    an underscore (no unit, but a word character), a long run with no cut point at all, and
    evaluation passages across the cut points."""
    monkeypatch.setattr(textunits, "_PIECE", 64)   # many pieces, in a text of a few KB
    rng = random.Random(23)
    passage = " ".join(t for _, t in man_texts("en", 2, min_chars=500, seed=3))[100:500]
    hard = ["linux内核模块", "a・b・c", "x_y_z", "ΟΔΟΣ", "İstanbul", "中文abc", "Z" * 300]
    for round_ in range(40):
        parts = [rng.choice(hard + [passage, _pool_text(rng, 50)]) for _ in range(30)]
        text = rng.choice(["", " ", "_", "・"]).join(parts)
        starts, ends, hashes = textunits.units(text)
        whole = textunits._units(text)
        assert len(text) > 2 * textunits._PIECE
        assert np.array_equal(starts, whole[0]) and np.array_equal(ends, whole[1])
        assert np.array_equal(hashes, whole[2])
        assert list(zip(starts.tolist(), ends.tolist())) == [m.span() for m in _UNIT.finditer(text)]
    items = [("eval.jsonl:1", passage), ("eval.jsonl:2", "linux内核模块的加载与卸载需要权限")]
    index, reference = EvalIndex(items, 13), Reference(items, 13)
    for cut in range(0, len(passage), 7):   # the passage split at every 7th character
        doc = _pool_text(rng, 100) + passage[:cut] + rng.choice(["\n", " — ", "_"]) + \
            passage[cut:] + "linux内核模块的加载与卸载需要权限" * 3
        assert index.find(doc) == reference.find(doc)
    assert index.find("Z" * 200 + " " + passage + " ")[0] == [0]


def test_the_pre_checks_keep_matches_at_the_edges_and_across_lines():
    """find() rules a document out when it has no run of n - 1 known pairs of neighbouring units
    (after no run of n known units). Documents that must get through: a match at the very start
    or end, the whole document one window, CJK windows with punctuation between characters,
    case (Greek lower case with its final sigma), dotted capital I, a window across line breaks
    and hyphens; and items of one or two units. The same words in another order must not match,
    nor a window whose first and last words are longer."""
    en = ("The quick brown fox jumps over the lazy dog while five boxing wizards jump quickly "
          "and a wizard's job is to vex chumps quickly in fog")
    zh = "天地玄黄宇宙洪荒日月盈昃辰宿列张寒来暑往秋收冬藏"
    tr = "İstanbul İzmir Iğdır ıspanak İlk iş günü İçerik ılık ikinci ırmak İçin ilgi ışık"
    el = "ΤΟ ΠΡΟΓΡΑΜΜΑ ΕΚΤΥΠΩΝΕΙ ΤΟ ΟΝΟΜΑ ΤΟΥ ΑΡΧΕΙΟΥ ΚΑΙ ΤΟ ΜΕΓΕΘΟΣ ΤΟΥ ΣΤΗΝ ΟΘΟΝΗ ΜΑΣ"
    items = [(f"e:{i}", t) for i, t in enumerate([en, zh, tr, el, "two words", "alone"])]
    index, reference = EvalIndex(items, 13), Reference(items, 13)
    words = en.split()
    window = " ".join(words[:13])
    must = [window, window + " and more", "Some text before. " + " ".join(words[-13:]),
            "\n".join(words[2:16]), " ".join(words[:6]) + "-\n" + " ".join(words[6:14]),
            window.upper(), window.title(), "(" + window + ")",
            "前言" + zh[:13], zh[-13:] + "。", "，".join(zh[3:16]), " ".join(zh[:13]),
            "Başlık: " + tr, tr + "\n", el.lower(), el.title(),
            "say two words", "TWO\nWORDS", "alone", "(alone)"]
    must_not = [" ".join(reversed(words)), " ".join(words[1::2] + words[::2]),
                " ".join(words[:12]) + " cat " + " ".join(words[12:20]), zh[::-1],
                "two, other words", "alonely", "x" + window + "x",
                tr.lower()]   # İ lower-cases to i and a combining dot: "i̇stanbul" is two units
    for doc in must + must_not:
        assert index.find(doc) == reference.find(doc), doc
    assert all(index.find(doc)[0] for doc in must)
    assert not any(index.find(doc)[0] for doc in must_not)


def test_byte_keys_are_the_units_and_a_function_of_the_folded_lower_case(monkeypatch):
    """byte_keys() finds the regex units of a text whose characters fold below 256 (Latin-1, or
    with typographic quotes and dashes), each with the key byte_key() gives the unit alone; equal
    lower-cased units have equal keys, and different short ones different keys; a text with a character folding to 256 or more has none."""
    monkeypatch.setattr(textunits, "_KEYS_FROM", 0)
    rng = random.Random(8)
    pool = "abcXYZ019 ßÀàÿµªº×÷_-'.,\n\t\0\u00a0\u2014\u2019\u201c\u212a\u212b"   # K, Å signs fold
    texts = ["".join(rng.choice(pool) for _ in range(rng.randint(0, 80))) for _ in range(2000)]
    texts += [t for lang in ("en", "de", "fr") for _, t in man_texts(lang, 4)]
    texts += ["", "a", "abcdefgh", "abcdefghi", "ABCDEFGH abcdefgh", "Straße STRASSE", "İi"]
    by_lower: dict[str, int] = {}
    for text in texts:
        keyed = textunits.byte_keys(text)
        assert keyed is not None, repr(text)
        starts, ends, keys = keyed
        spans = [m.span() for m in _UNIT.finditer(text)]
        assert list(zip(starts.tolist(), ends.tolist())) == spans, repr(text)
        for (a, b), k in zip(spans, keys.tolist()):
            assert textunits.byte_key(text[a:b]) == k, repr(text[a:b])
            assert by_lower.setdefault(text[a:b].lower(), k) == k, repr(text[a:b])
    # up to 8 characters a key is the unit; longer units share a key with their first 8 and
    # their length (the first look only: the hashes decide)
    short = {u: k for u, k in by_lower.items() if len(u) <= 8}
    assert len(set(short.values())) == len(short) > 1000
    for text in ["ΟΔΟΣ", "abc Ω", "中文", "a\U0001d400"]:
        assert textunits.byte_keys(text) is None
        assert textunits.byte_key(text.split()[-1]) is None
