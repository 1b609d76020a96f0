"""Quality filters: each rejects a crafted bad document, real English and Chinese text passes."""
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mspretrain.dataprep.steps.clean import normalize
from mspretrain.dataprep.steps.filters import (FILTER_NAMES, FilterConfig, char_counts, most_common_ngram,
                              quality_reason, top_ngram_failure,
                              top_ngram_passes, units)
from mspretrain.dataprep.readers import InputFile, read_file
from neardup_eval import load

DATA = Path(__file__).parents[1] / "data" / "neardup.jsonl.zst"
DEMO_HTML = Path(__file__).parents[3] / "demo" / "corpus" / "debian-reference-html.jsonl.zst"
CFG = FilterConfig()

# Real sentences (GPL-3 preamble; GnuPG's Chinese help) used to build crafted documents.
EN = ("The licenses for most software and other practical works are designed to take away your "
      "freedom to share and change the works. By contrast, the GNU General Public License is "
      "intended to guarantee your freedom to share and change all versions of a program.")
ZH = "在这里指定的数值完全由您自己决定；这些数值永远不会被输出给任何第三方。我们需要它来实现信任网络。"


@pytest.fixture(scope="module")
def real_docs():
    return {d["id"]: normalize(d["text"]) for d in load(DATA) if "#edit" not in d["id"]}


def _lines(*parts):
    return "\n".join(parts)


CRAFTED = {
    "too_short": ["Too short.", "太短了。"],
    "too_long": [EN * 8000],
    "symbol_ratio": [EN[:80] + " " + "#$%&*+=<>|~^" * 30, ZH[:20] + "【】《》〈〉" * 20],
    "letter_ratio": [EN[:60] + " " + " ".join(str(1000 + i) for i in range(80))],
    "bullet_lines": [_lines(*(f"- item {w} of the list" for w in EN.split()[:20])),
                     _lines(*(f"\u2022 {ZH[i:i + 6]}" for i in range(0, 40, 4)))],
    "ellipsis_lines": [_lines(*(f"{EN[i:i + 60]}..." for i in range(0, 300, 60))),
                       _lines(*(f"{ZH[i:i + 12]}\u2026" for i in range(0, 48, 12)))],
    "dup_lines": [_lines(*([EN[:30], EN[40:80]] + ["Same short line."] * 3)),
                  _lines(ZH, "重复的行。", "重复的行。", "重复的行。")],
    "dup_line_chars": [_lines(EN, "a", "b", "c", "d", "e", "f", "g", "h", EN),
                       _lines(ZH, "甲", "乙", "丙", "丁", "戊", "己", "庚", "辛", ZH)],
    "dup_paragraphs": [f"{EN}\n\npara one\nline\n\npara one\nline\n\npara one\nline",
                       f"{ZH}\n\n段落\n\n段落\n\n段落"],
    "dup_paragraph_chars": ["\n\n".join([EN[:100], "x\ny", "z\nw", "u\nv", "s\nt", "q\nr", "o\np",
                                         "m\nn", EN[:100]])],
    "top_ngram": [(EN[:200] + " ") + "buy now " * 40, ZH[:30] + "立即购买" * 30],
}


def test_every_filter_has_a_crafted_case():
    assert set(CRAFTED) == set(FILTER_NAMES)


@pytest.mark.parametrize("name", FILTER_NAMES)
def test_each_filter_rejects_its_crafted_document(name):
    for raw in CRAFTED[name]:
        text = normalize(raw)
        assert quality_reason(text, CFG) == name, text[:200]
        # The filter is what rejects it: disabled, the document passes or fails later in the chain.
        later = quality_reason(text, FilterConfig(disabled=(name,)))
        assert later is None or FILTER_NAMES.index(later) > FILTER_NAMES.index(name)


def test_real_english_text_passes(real_docs):
    english = [k for k in real_docs if k.startswith("common-licenses/")]
    assert len(english) >= 10
    assert {k: quality_reason(real_docs[k], CFG) for k in english} == {k: None for k in english}


def test_real_chinese_text_passes(real_docs):
    # The GnuPG help and the manual pages translated for the most part (many are only partly).
    chinese = [k for k in real_docs if ("zh_CN" in k or "zh_TW" in k or "tutor.zh" in k)
               and sum(map(_is_han, real_docs[k])) > 500 and "vim" not in k
               and "systemd" not in k]  # a catalog of entries with repeated header lines
    assert len(chinese) >= 6 and "gnupg/help.zh_CN.txt" in chinese
    assert {k: quality_reason(real_docs[k], CFG) for k in chinese} == {k: None for k in chinese}


def _is_han(ch):
    return "\u4e00" <= ch <= "\u9fff"


def test_character_counts_agree_on_ascii_unicode_and_long_paths():
    ascii_text = "Hello, world 123!\n\t#$ \x7f"
    assert char_counts(ascii_text) == (18, 10, 4)  # non-space, letters, symbols
    assert char_counts(ascii_text + "中，\U0001F600") == (21, 11, 6)  # 😀 is a symbol
    # past 2**14 characters the packed counts would overflow: counted one class at a time
    assert char_counts((ascii_text + "中，\U0001F600") * 1000) == (21000, 11000, 6000)


def test_chinese_units_are_characters():
    assert units("中文 text，here") == ["中", "文", "text，here"]
    assert units("plain ascii words") == ["plain", "ascii", "words"]


def _naive_top_ngram(toks, orders):
    total = sum(map(len, toks))
    for n, limit in orders:
        if len(toks) < n:
            break
        grams = Counter(tuple(toks[i:i + n]) for i in range(len(toks) - n + 1))
        gram, count = None, 0
        for g, c in grams.items():  # insertion order: the first seen wins a tie
            if c > count:
                gram, count = g, c
        if count * sum(map(len, gram)) / total > limit:
            return n
    return None


def test_top_ngram_skip_bound_is_exact(real_docs):
    """Skipping orders by the unigram bound never changes the outcome (checked with lower limits,
    so that the bound is tested near where it decides)."""
    texts = list(real_docs.values())[:60] + [normalize(t) for c in CRAFTED.values() for t in c]
    for limits in [((2, 0.20), (3, 0.18), (4, 0.16)), ((1, 0.05), (2, 0.03), (3, 0.02), (5, 0.01))]:
        for text in texts:
            toks = units(text)[:3000]
            got = top_ngram_failure(toks, limits)
            assert (got[0] if got else None) == _naive_top_ngram(toks, limits)
            # The filter chain's entry point agrees with the reference on every text.
            cfg = FilterConfig(max_top_ngram_fraction=limits, top_ngram_min_units=0)
            assert top_ngram_passes(text, cfg) == (top_ngram_failure(units(text), limits) is None)


# Real short paragraphs of the demo corpus (English and Chinese) that n-gram statistics would reject:
# "the package" twice in 38 words, "档案库" (archive) six times in 99 characters.
SHORT_REAL = ["ch02.en.html#p113", "ch02.en.html#p250", "ch01.zh-cn.html#p300",
              "ch02.zh-cn.html#p517", "ch02.zh-cn.html#p78"]


def test_real_short_paragraphs_pass_top_ngram():
    docs = {d.doc_id: normalize(d.text) for d in read_file(InputFile(DEMO_HTML, DEMO_HTML.name))
            if d.doc_id in SHORT_REAL}
    assert sorted(docs) == sorted(SHORT_REAL)
    for doc_id, text in docs.items():
        assert len(units(text)) < CFG.top_ngram_min_units, doc_id
        assert quality_reason(text, CFG) is None, doc_id
        # Their n-gram coverage is over the limits: the minimum length is what lets them through.
        assert quality_reason(text, FilterConfig(top_ngram_min_units=0)) == "top_ngram", doc_id


def test_top_ngram_applies_from_min_units():
    spam = normalize("buy now " * 40)                       # 80 units
    assert quality_reason(spam, FilterConfig(top_ngram_min_units=80)) == "top_ngram"
    assert quality_reason(spam, FilterConfig(top_ngram_min_units=81)) is None
    zh = "立即购买" * 25                                     # 100 units: one per character
    assert quality_reason(zh, FilterConfig(top_ngram_min_units=100)) == "top_ngram"
    assert quality_reason(zh, FilterConfig(top_ngram_min_units=101)) is None
    for raw in CRAFTED["top_ngram"]:                        # the crafted cases are long enough
        assert len(units(normalize(raw))) >= CFG.top_ngram_min_units


def test_thresholds_are_configurable():
    text = normalize(CRAFTED["symbol_ratio"][0])
    assert quality_reason(text, FilterConfig(max_symbol_ratio=0.9, min_letter_ratio=0.1)) is None
    assert quality_reason("short", FilterConfig(min_chars=3)) is None


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="disabled.*no_such_filter"):
        FilterConfig(disabled=("no_such_filter",))
    with pytest.raises(ValueError, match="min_chars"):
        FilterConfig(min_chars=10, max_chars=5)
    with pytest.raises(ValueError, match="top_ngram_min_units"):
        FilterConfig(top_ngram_min_units=-1)
    with pytest.raises(ValueError, match="max_top_ngram_fraction"):
        FilterConfig(max_top_ngram_fraction=((3, 0.1), (2, 0.1)))


def test_most_common_ngram_matches_counter_ties_and_wide_ids():
    """The numpy n-gram count picks what Counter.most_common(1) picks: the same count and, among
    equals, the n-gram seen first; ids too wide for one int64 key take the re-densifying path."""
    rng = np.random.default_rng(7)
    for trial in range(300):
        size, vocab = int(rng.integers(4, 60)), int(rng.integers(1, 8))
        ids = rng.integers(0, vocab, size)
        if trial % 3 == 0:
            ids = ids * 999_983 + 10**6   # width**4 > 2**62
        for n in (2, 3, 4):
            grams = list(zip(*(ids[i:].tolist() for i in range(n))))
            gram, count = Counter(grams).most_common(1)[0]
            assert most_common_ngram(ids.astype(np.int64), n) == (grams.index(gram), count)


def test_import_builds_no_character_tables():
    """The per-code-point tables are built on the first non-ASCII text, not at import: importing
    dataprep (the CLI, every worker) pays nothing for them; ASCII text never needs them."""
    code = ("import mspretrain.dataprep.steps.filters as f, mspretrain.dataprep.build\n"
            "assert f._bmp_class.cache_info().currsize == 0 and f._is_cjk.cache_info().currsize == 0\n"
            "f.quality_reason('plain ascii text ' * 40, f.FilterConfig())\n"
            "assert f._bmp_class.cache_info().currsize == 0\n"
            "f.quality_reason('中文的句子，' * 40, f.FilterConfig())\n"
            "assert f._bmp_class.cache_info().currsize == 1 and f._is_cjk.cache_info().currsize == 1\n")
    subprocess.run([sys.executable, "-c", code], check=True)
