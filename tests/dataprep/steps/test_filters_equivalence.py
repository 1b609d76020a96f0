"""quality_reason (numpy fast path, hashed top n-gram bound) returns exactly what the straightforward
implementation it replaced returns (filters_reference, kept unchanged): on real text of this
machine in every language it has (manual pages, raw and normalised; package docs), on adversarial
strings (repeated lines and paragraphs, n-gram spam, CJK, astral and combining characters, every
kind of whitespace, bullets, ellipses, lone surrogates, texts longer than the packed counts hold),
and with every threshold set exactly at a text's own statistic and one float step either side."""
import dataclasses
import gzip
import math
import random
from pathlib import Path

import pytest

import mspretrain.dataprep.steps.filters as filters
import filters_reference as ref
from mspretrain.dataprep.steps.filters import FILTER_NAMES, FilterConfig, quality_reason
from neardup_eval import _read
from real_text import man_languages, man_texts

BASE = FilterConfig()
TIGHT = FilterConfig(top_ngram_min_units=0,
                     max_top_ngram_fraction=((1, 0.05), (2, 0.03), (3, 0.02), (5, 0.01)))
CONFIGS = [BASE, TIGHT,
           FilterConfig(top_ngram_min_units=20, max_top_ngram_fraction=((2, 0.1), (3, 0.08), (4, 0.06))),
           FilterConfig(disabled=FILTER_NAMES[:-1], top_ngram_min_units=0),
           FilterConfig(disabled=("dup_lines", "dup_paragraphs"), max_dup_line_char_fraction=0.02,
                        max_dup_paragraph_char_fraction=0.02, max_bullet_lines=0.05,
                        max_ellipsis_lines=0.01),
           FilterConfig(min_chars=0, max_symbol_ratio=0.05, min_letter_ratio=0.9)]


def _docs() -> list[str]:
    """Real texts: manual pages in every language (normalised bodies and raw pages) and package
    documentation (changelogs, copyright files, READMEs)."""
    out = []
    for lang in man_languages() + ["en"]:
        pages = man_texts(lang, 24, min_chars=200, max_chars=6000, seed=3)
        out += [text for _, text in pages]
        out += [_read(Path(path))[:6000] for path, _ in pages[:4]]   # not normalised
    docs = sorted(Path("/usr/share/doc").glob("*/*"))
    for path in random.Random(1).sample(docs, min(400, len(docs))):
        try:
            data = path.read_bytes() if path.suffix != ".gz" else gzip.decompress(path.read_bytes())
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        out.append(data.decode("utf-8", "replace")[:8000])
    return out


@pytest.fixture(scope="module")
def real_docs():
    docs = _docs()
    assert len(docs) > 800 and len({d[:1000].isascii() for d in docs}) == 2
    return docs


def _agree(text: str, cfg: FilterConfig) -> None:
    got, want = quality_reason(text, cfg), ref.quality_reason(text, cfg)
    assert got == want, (got, want, cfg, text[:300])


def test_real_text_every_config(real_docs):
    for text in real_docs:
        for cfg in CONFIGS:
            _agree(text, cfg)


def _statistics(text: str) -> dict[str, float]:
    """Each filter's own statistic of `text`, computed by the reference helpers."""
    classes = ref.char_classes(text)
    nonspace = max(1, sum(classes) - classes[ref._SPACE])
    lines = [line for line in text.split("\n") if line]
    n_lines = max(1, len(lines))
    stats = {
        "max_symbol_ratio": classes[ref._SYMBOL] / nonspace,
        "min_letter_ratio": classes[ref._LETTER] / nonspace,
        "max_bullet_lines": sum(line.startswith(ref._BULLETS) for line in lines) / n_lines,
        "max_ellipsis_lines": sum(line.endswith(ref._ELLIPSES) for line in lines) / n_lines,
    }
    stats["max_dup_paragraph_fraction"], stats["max_dup_paragraph_char_fraction"] = (
        ref.duplicate_fractions(text.split("\n\n")))
    stats["max_dup_line_fraction"], stats["max_dup_line_char_fraction"] = (
        ref.duplicate_fractions(lines))
    return stats


_FIELD_FILTERS = {"max_symbol_ratio": ("symbol_ratio",), "min_letter_ratio": ("letter_ratio",),
                  "max_bullet_lines": ("bullet_lines",), "max_ellipsis_lines": ("ellipsis_lines",),
                  "max_dup_paragraph_fraction": ("dup_paragraphs",),
                  "max_dup_paragraph_char_fraction": ("dup_paragraph_chars",),
                  "max_dup_line_fraction": ("dup_lines",),
                  "max_dup_line_char_fraction": ("dup_line_chars",)}


def _threshold_configs(text: str) -> list[FilterConfig]:
    """Configs that put one filter's threshold exactly at the text's statistic and one float step
    either side, every other filter disabled (so that this one decides)."""
    configs = []
    for name, value in _statistics(text).items():
        keep = _FIELD_FILTERS[name]
        disabled = tuple(f for f in FILTER_NAMES if f not in keep)
        for v in (math.nextafter(value, -1.0), value, math.nextafter(value, 2.0)):
            configs.append(dataclasses.replace(BASE, disabled=disabled, min_chars=0, **{name: v}))
    units = ref.units(text)
    disabled = FILTER_NAMES[:-1]
    for n in (1, 2, 3, 4, 5):
        top = ref.top_ngram_failure(units, ((n, 0.0),))
        if top is None:
            continue
        for v in (math.nextafter(top[1], -1.0), top[1], math.nextafter(top[1], 2.0)):
            configs.append(dataclasses.replace(BASE, disabled=disabled, top_ngram_min_units=0,
                                               max_top_ngram_fraction=((n, v),)))
        configs.append(dataclasses.replace(BASE, disabled=disabled, top_ngram_min_units=len(units),
                                           max_top_ngram_fraction=((n, top[1] / 2),)))
    return configs


def test_real_text_thresholds_at_its_own_statistics(real_docs):
    flips = 0
    for text in real_docs[::4]:
        for cfg in _threshold_configs(text):
            _agree(text, cfg)
            flips += quality_reason(text, cfg) is not None
    assert flips > 500   # the configs do sit where decisions change


_WHITESPACE = " \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u200a\u2028\u2029\u202f\u3000"
_POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJ",
    "0123456789",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "\u4e00\u4e8c\u4e09\u4e2d\u6587\u5b57\u7684\u662f\u3005\u3006\u3007\u3021\u3038\u2e80\u2fd5"
    "\u3042\u3044\u30a2\u30fb\u30fc\u3105\u3190\u3400\u4dbf\u9fff\uf900\ufaff",
    "\U00020000\U0002a6d6\U0003134f\U0001f600\U0001f4a9\U00010400\U0001d400",   # astral
    "\u0301\u0308\u0327\u20dd\u0e31\u093f",   # combining marks
    "\uac00\ud55c\uae00\u0430\u0431\u044f\u03b1\u03c9\u05d0\u0627\u0e01\u00e9\u00df",
    "\u2022\u2023\u25cf\u25e6\u2043\u25aa\u00b7\u2026-*.",   # bullets, ellipses
    "\u3001\u3002\u300c\u300d\uff0c\uff01\u00a9\u20ac\u2605\u2192",
    "\x00\x07\x7f\u200b\ufeff\ufffe\ud800\udfff\uffff",   # controls, lone surrogates
    _WHITESPACE,
]


def _word(rng: random.Random) -> str:
    pools = rng.sample(_POOLS, rng.randint(1, 3))
    return "".join(rng.choice(rng.choice(pools)) for _ in range(rng.choice((1, 1, 2, 3, 5, 9))))


def _adversarial(rng: random.Random) -> str:
    vocab = [_word(rng) for _ in range(rng.choice((2, 5, 20, 200)))]
    kind = rng.randrange(6)
    if kind == 0:   # spam: a few units over and over, with noise
        words = [rng.choice(vocab[:3]) if rng.random() < 0.7 else rng.choice(vocab)
                 for _ in range(rng.randint(50, 400))]
        return rng.choice(_WHITESPACE[:3]).join(words)
    if kind == 1:   # lines, some repeated, some bullets and ellipses, blank runs
        lines = []
        for _ in range(rng.randint(1, 60)):
            line = " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 12)))
            if rng.random() < 0.2:
                line = rng.choice(ref._BULLETS) + line
            if rng.random() < 0.2:
                line += rng.choice(ref._ELLIPSES)
            lines.append(rng.choice(lines) if lines and rng.random() < 0.3 else line)
        return "\n".join(lines)
    if kind == 2:   # paragraphs, some repeated, with blank-line runs of any length
        paras = []
        for _ in range(rng.randint(1, 12)):
            para = "\n".join(" ".join(rng.choice(vocab) for _ in range(rng.randint(1, 8)))
                             for _ in range(rng.randint(1, 3)))
            paras.append(rng.choice(paras) if paras and rng.random() < 0.4 else para)
        return "".join(p + "\n" * rng.choice((1, 2, 2, 2, 3, 4, 5)) for p in paras)
    if kind == 3:   # characters at random, any class
        return "".join(rng.choice(rng.choice(_POOLS)) for _ in range(rng.randint(0, 3000)))
    if kind == 4:   # CJK prose with spam phrases
        han = _POOLS[3]
        phrase = "".join(rng.choice(han) for _ in range(rng.randint(1, 5)))
        return "".join(phrase if rng.random() < 0.3 else rng.choice(han + "，。 \n")
                       for _ in range(rng.randint(20, 1500)))
    return " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 600)))   # plain words


# random strings mostly fail the character ratios: these let them reach the later filters
LATE = [dataclasses.replace(cfg, disabled=("too_short", "symbol_ratio", "letter_ratio"))
        for cfg in (BASE, TIGHT)]


def test_adversarial_strings(monkeypatch):
    outcomes = []   # what the hashed bound said, where a text reached it
    bound = filters._top_ngram_cleared
    monkeypatch.setattr(filters, "_top_ngram_cleared", lambda *a: outcomes.append(bound(*a))
                        or outcomes[-1])
    rng = random.Random(2026)
    for _ in range(1500):
        text = _adversarial(rng)
        for cfg in [BASE, TIGHT, CONFIGS[3]] + LATE:
            _agree(text, cfg)
        if rng.random() < 0.2:
            for cfg in _threshold_configs(text):
                _agree(text, cfg)
    # both outcomes of the bound were exercised, many times
    assert outcomes.count(True) > 1000 and outcomes.count(False) > 1000


def test_texts_longer_than_the_packed_counts():
    """Past 2**14 characters the class counts and unit lengths take their unpacked path; a unit
    longer than that too."""
    rng = random.Random(5)
    en = "the licenses for most software are designed to take away your freedom to share it "
    texts = [en * 300, ("\u4e2d\u6587\u7684 " + en) * 200, "x" * 20000 + " " + en * 5,
             ("word " * 3000 + "\n") * 3, "\n".join(_adversarial(rng) for _ in range(40))]
    for text in texts:
        assert len(text) > 1 << 14
        for cfg in CONFIGS + _threshold_configs(text):
            _agree(text, cfg)


def test_fast_path_decides_most_texts(real_docs, monkeypatch):
    """The exact count runs only where the hashed bound cannot clear a text: rarely on real text
    (else the speed-up is gone, though the answers would still agree)."""
    exact = []
    monkeypatch.setattr(filters, "top_ngram_passes",
                        lambda *a: exact.append(1) or ref.top_ngram_passes(*a))
    before = dataclasses.replace(BASE, disabled=("top_ngram",))
    reached = [text for text in real_docs if len(ref.units(text)) >= BASE.top_ngram_min_units
               and ref.quality_reason(text, before) is None]
    for text in reached:
        quality_reason(text, BASE)
    assert len(reached) > 500 and len(exact) < 0.03 * len(reached), (len(exact), len(reached))


def test_each_stage_of_the_bound_decides(real_docs, monkeypatch):
    """The hashed bound clears a text at the unit stage, at the window stage (the sum of unit
    coverages over n units in a row) or at the n-gram stage, else the exact count decides: each
    stage both clears and passes texts on, many times, and every answer is the reference's."""
    entered = {"window": set(), "gram": set(), "exact": set()}   # ids of the checks that got there
    check = [0]

    def counted(name, fn):
        def wrapper(*args):
            entered[name].add(check[0])
            return fn(*args)
        return wrapper
    monkeypatch.setattr(filters, "_running_cover", counted("window", filters._running_cover))
    monkeypatch.setattr(filters, "_bucket_cover", counted("gram", filters._bucket_cover))
    monkeypatch.setattr(filters, "top_ngram_passes", counted("exact", filters.top_ngram_passes))
    rng = random.Random(9)
    texts = real_docs[1::3] + [_adversarial(rng) for _ in range(400)]
    reached = 0
    for text in texts:
        for cfg in (BASE, TIGHT, LATE[0]):
            check[0] += 1
            _agree(text, cfg)
            reached += len(ref.units(text)) >= cfg.top_ngram_min_units
    window, gram, exact = entered["window"], entered["gram"], entered["exact"]
    cleared_at_window = window - gram - exact
    cleared_at_gram = (gram & window) - exact
    assert min(len(cleared_at_window), len(cleared_at_gram), len(window & exact)) > 30, (
        reached, len(window), len(gram), len(exact))


def test_paragraphs_split_only_where_they_can_repeat():
    """Paragraphs are split only where a line repeats or LF x 3 occurs: the fractions of the texts
    that skip the split are 0, which only a negative limit fails."""
    texts = ["a b\n\nc d\n\na b", "a\n\n\nb\n\na\n", "\nx y\n\nx y\n", "p\n\n\n\np", "p\nq\n\nr\ns",
             "one\n\ntwo", "one two", "x\n\ny\n\nx\n\ny\n\n\n", "\n\n\n", "l\nl\n\nm"]
    for text in texts:
        for limit in (-1e-300, -0.0, 0.0, 0.2, 0.5):
            for field in ("max_dup_paragraph_fraction", "max_dup_paragraph_char_fraction"):
                cfg = dataclasses.replace(BASE, min_chars=0, disabled=FILTER_NAMES[:6],
                                          **{field: limit})
                _agree(text, cfg)


def test_short_ascii_texts_around_the_unit_minimum():
    """A short ASCII text is counted without numpy and skips top_ngram when it has fewer spaces
    than the unit minimum: around that minimum, with any whitespace between units, and with
    spam that top_ngram fails once it is checked, the answers are the reference's."""
    rng = random.Random(4)
    seps = [" ", "  ", "\n", "\t", " \n ", "\r\n", "\x0b", "\x1f"]
    for n_units in (1, 2, 49, 50, 51, 98, 99, 100, 101, 150):
        for trial in range(6):
            words = ["spam", "eggs"] * n_units if trial % 2 else [
                "".join(rng.choice("abcdefgh") for _ in range(rng.randint(1, 7)))
                for _ in range(n_units)]
            words = words[:n_units]
            sep = seps[trial % len(seps)]
            text = sep.join(words) + rng.choice(("", " ", "\n", "..."))
            for min_units in (0, 1, 50, n_units - 1, n_units, n_units + 1, 100):
                for cfg in (BASE, TIGHT, LATE[0]):
                    _agree(text, dataclasses.replace(cfg, top_ngram_min_units=max(0, min_units)))
