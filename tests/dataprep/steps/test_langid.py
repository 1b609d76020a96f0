"""Language identification on real translated manual pages, the hard cases (Japanese kanji,
Chinese technical text full of English, code), and the language filter of a build."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from dataprep_helpers import run_build
from mspretrain.dataprep.config import ConfigError, load_build_config
from mspretrain.dataprep.steps.langid import identify, language_reason
from real_text import man_languages, man_texts, write_corpus

_CODE = {"zh_CN": "zh", "zh_TW": "zh", "pt_BR": "pt"}
_CLOSE = {"bs": "hr"}    # Bosnian and Croatian: one standard language, nearly the same text


def test_translated_manual_pages_in_every_language_on_this_machine():
    """Pages whose text is mostly translated (see real_text.man_texts): >= 90% right overall, and
    every language right on most of its pages."""
    right = total = 0
    for lang in man_languages() + ["en"]:
        docs = man_texts(lang, 8, translated=0.8)
        want = _CODE.get(lang, lang)
        got = [_CLOSE.get(g, g) for g, _ in map(identify, (text for _, text in docs))]
        right += sum(g == want for g in got)
        total += len(docs)
        if len(docs) >= 4 and lang not in ("sl", "da"):   # few pages really translated
            assert sum(g == want for g in got) >= 0.6 * len(docs), (lang, got)
    assert total >= 150 and right >= 0.9 * total, (right, total)


@pytest.mark.parametrize("text, lang", [
    ("東京都は日本の首都であり、政治と経済の中心地である。", "ja"),           # kanji with kana particles
    ("日本国憲法第九条", "ja"),                                        # kanji only, Japanese forms
    ("中华人民共和国国务院总理", "zh"),                                  # Han only, simplified
    ("中華民國行政院院長", "zh"),                                       # Han only, traditional
    ("使用 pip install numpy==1.26.4 安装依赖，然后运行 python setup.py build 编译扩展模块，"
     "配置文件位于 /etc/foo/foo.conf，日志写入 /var/log/foo.log。", "zh"),  # Chinese with English
    ("The\nlogin\nprogram is used to establish a new session with the system. It is normally "
     "invoked automatically by responding to the login: prompt on the users terminal.\n"
     "命令解释器的初始化脚本也可能执行。\n选项", "en"),                  # English with a little Chinese
    ("The groupmod command modifies the definition of the specified GROUP by modifying the "
     "appropriate entry in the group database.\nПАРАМЕТРЫ\nThe options which apply are:", "en"),
    ("def main(argv):\n    total = sum(int(x) for x in argv)\n    return total\n", "en"),
])
def test_mixed_scripts_and_code(text, lang):
    assert identify(text)[0] == lang


def test_no_letters_is_undetermined_and_scores_are_probabilities():
    assert identify("1234 5678 -- 42") == ("und", 0.0)
    for _, text in man_texts("de", 3, translated=0.8):
        lang, score = identify(text)
        assert lang == "de" and 0.5 < score <= 1.0


def _catalogue(name: str) -> str:
    """The translated strings of a gettext catalogue shipped in tests/dataprep/data."""
    from pii_set import catalogue_texts
    return catalogue_texts()[name]


def test_iso_codes_and_unknown_languages():
    from mspretrain.dataprep.steps.langid import iso_code, script
    assert [iso_code(c) for c in ("iw", "jw", "in", "mo", "zh-Hant", "zh", "haw", "en")] == \
        ["he", "jv", "id", "ro", "zh", "zh", "haw", "en"]
    assert identify("שלום עולם, זהו משפט בעברית על תוכנה חופשית ומערכות הפעלה.")[0] == "he"
    assert script("中華民國行政院院長", "zh") == "Hant" and script("中华人民共和国国务院总理", "zh") == "Hans"
    # languages CLD2 has no model of: its fallback is "en"; they are "und", and [zh, en] drops them
    for name in ("ia", "fur", "wa"):
        lang, score = identify(_catalogue(name))
        assert (lang, score) == ("und", 0.0) or (name == "wa" and lang == "fr"), (name, lang)
        assert language_reason(lang, score, ("zh", "en"), 0.0) == "language"
        assert (language_reason(lang, score, ("zh", "en", "und"), 0.0) is None) == (lang == "und")
    assert identify(_catalogue("en_GB"))[0] == "en"


def test_reasons():
    assert language_reason("de", 0.99, ("zh", "en"), 0.0) == "language"
    assert language_reason("en", 0.4, ("zh", "en"), 0.5) == "language_score"
    assert language_reason("de", 0.99, (), 0.0) is None
    with pytest.raises(ConfigError, match="min_language_score"):
        load_build_config(sets=["filters.min_language_score=2"])
    with pytest.raises(ConfigError, match="'zh-CN' is not an ISO 639-1 code"):
        load_build_config(sets=["filters.languages=[zh-CN, en]"])
    assert load_build_config(sets=["filters.languages=[zh, en]"]).filters.languages == ("zh", "en")


def test_the_build_keeps_chinese_and_english_and_reports_every_language(tmp_path):
    planted = write_corpus(tmp_path / "in")
    out = tmp_path / "data"
    assert run_build([tmp_path / "in"], out, "--set", "filters.languages=[zh, en]") == 0
    report = json.loads((out / "report.json").read_text())
    langs = report["languages"]
    assert {"en", "zh", "de", "fr", "ru", "ja"} <= set(langs), langs
    assert all(v["docs"] > 0 and v["bytes"] > 0 for v in langs.values())
    assert sum(v["docs"] for v in langs.values()) == report["stages"]["read"]["docs"]
    removed = report["stages"]["filter"]["removed_by"]["language"]["docs"]
    assert removed >= 0.9 * planted["others"]
    attrs = pq.read_table(out / "documents" / "attributes.parquet").to_pylist()
    kept = [a for a in attrs if a["fate"] == "kept"]
    assert kept and {a["language"] for a in kept} <= {"zh", "en"}
    assert all(a["fate"] == "language" for a in attrs if a["language"] not in ("zh", "en"))
    # both Chinese scripts are "zh"; the script is an attribute of its own (zh_TW pages: Hant)
    scripts = {a["doc_id"]: a["script"] for a in attrs if a["language"] == "zh"}
    assert set(scripts.values()) == {"Hans", "Hant"}, scripts
    assert all(a["script"] == "" for a in attrs if a["language"] != "zh")
    assert "## Languages" in (out / "report.md").read_text()


def test_undetermined_documents_follow_the_policy():
    """Text CLD2 cannot place is "und": kept with `undetermined: keep`, dropped by default unless
    "und" is listed; other languages are not touched by the policy. A list of names in English
    (iso-codes' msgids, one letter outside ASCII) is English-unplaced, not "und"."""
    names = ("Adamorobe Sign Language\nAgta, Casiguran Dumagat\nAgta, Central Cagayan\n"
             "Ajyíninka Apurucayali\nAl-Sayyid Bedouin Sign Language\nAlbanian Sign Language\n"
             "Algerian Sign Language\nAma (Papua New Guinea)\nAmami-Oshima, Northern")
    lang, score = identify(names)
    assert lang == "en" and score < 0.5
    assert identify("Aperir un file\nSalvar como\nCancellar") == ("und", 0.0)   # Interlingua
    assert language_reason("und", 0.0, ("zh", "en"), 0.5) == "language"
    assert language_reason("und", 0.0, ("zh", "en"), 0.5, "keep") is None
    assert language_reason("und", 0.0, ("zh", "en", "und"), 0.0) is None
    assert language_reason("de", 0.9, ("zh", "en"), 0.0, "keep") == "language"
    assert load_build_config(sets=["filters.undetermined=keep"]).filters.undetermined == "keep"
    with pytest.raises(ConfigError, match="undetermined"):
        load_build_config(sets=["filters.undetermined=maybe"])


@pytest.mark.parametrize("text", [
    "Paste Special\nDuplicate Line\nComment Selection",          # menu labels
    "Arabic, Egyptian\nArmenian\nAssamese",                      # a list of language names
    "San Antonio\nSan Diego\nDallas\nLondon\nManchester\nBirmingham",   # place names
    "Spotify\nSignal Desktop\nRaspberry Pi 4 Model B",            # product names
    "Russian (phonetic, with Win keys)\nPortuguese (Brazil, Dvorak)\nCzech (QWERTY, extended)",
])
def test_english_that_cld2_cannot_place_is_english_unplaced_and_kept(text):
    """CLD2 calls these English only as its fallback (fit < EN_MIN_SCORE), but reliably, and their
    letters are ASCII: "en" with a score below 0.5, kept by [zh, en], dropped by a 0.5 floor."""
    from mspretrain.dataprep.steps.langid import UNPLACED_MAX_SCORE, classify
    lang, score, unplaced = classify(text)
    assert (lang, unplaced) == ("en", True) and 0.0 < score < UNPLACED_MAX_SCORE, (lang, score)
    assert identify(text) == (lang, score)
    assert language_reason(lang, score, ("zh", "en"), 0.0) is None
    assert language_reason(lang, score, ("zh", "en"), 0.5) == "language_score"
    assert language_reason(lang, score, ("zh", "de"), 0.0) == "language"


@pytest.mark.parametrize("text", [
    "Tap tin\nChinh sua\nXem",                        # Vietnamese without diacritics
    "Aperir un file\nSalvar como\nCancellar",          # Interlingua: CLD2 has no model of it
    "Preferencias\nCambiar contrasena\nTamano del archivo",   # Spanish without its accents
    "Vierç\nSalve come\nAnule",                        # Friulian: reliable, but not ASCII
    "Non est istadu possibile abèrrere s'archiviu\nSes seguru de bòllere cantzellare custu elementu?",
    "Permès dineât\nConession pierdude\nGnove schede\nPreferencis\nCambie la password\nDiscjame cumò",
])
def test_short_foreign_strings_are_not_english_unplaced(text):
    """Foreign strings CLD2 calls English only as its fallback stay "und" (dropped by [zh, en]):
    unreliable, or with letters outside ASCII."""
    from mspretrain.dataprep.steps.langid import classify
    lang, score, unplaced = classify(text)
    assert not unplaced and lang != "en", (lang, score)
    assert language_reason(lang, score, ("zh", "en"), 0.0) == "language"


def test_english_unplaced_on_the_dev_set():
    """tests/dataprep/langid_dev.py, documents of >= 20 characters (shorter ones are below any
    sensible filters.min_chars): the rule keeps English CLD2 cannot place and lets in at most one
    foreign document more than CLD2's own answer does (its short strings CLD2 calls English with
    a good fit are kept either way)."""
    from langid_dev import documents
    from mspretrain.dataprep.steps.langid import classify
    docs = [d for d in documents() if len(d[2]) >= 20]
    got = [(lang, classify(text)) for lang, _, text in docs]
    english = [c for lang, c in got if lang == "en"]
    foreign = [c for lang, c in got if lang != "en"]
    assert len(english) >= 250 and len(foreign) >= 300
    assert sum(c[2] for c in english) >= 20                  # English-unplaced, kept
    assert sum(c[2] for c in foreign) <= 1
    # with the lexical second opinion on short windows: 30 of 267 English not "en" (CLD2 and
    # the fit rules alone: 43; py3langid 59), 0 of 317 foreign "en" (alone: 13)
    assert sum(c[0] != "en" for c in english) <= 0.12 * len(english)
    assert sum(c[0] == "en" for c in foreign) <= 0.005 * len(foreign)


@pytest.mark.parametrize("text", [
    "Archivo no encontrado",                                    # Spanish
    "Gagal terhubung ke server",                                # Indonesian
    "Palitan ang password",                                     # Tagalog
    "Date de modification",                                     # French
    "Nu downloaden\nAfsluiten\nHerinner me later",               # Dutch
    "Cambia password\nDimensione del file\nScarica ora",          # Italian
    "Tu modificationes ha essite salvate",                      # Interlingua: no word list
    "Permissio negata\nConexio amissa\nOptiones",                 # Latin: no word list either
])
def test_short_foreign_strings_cld2_calls_english_are_not_english(text):
    """CLD2 calls these English reliably and with a good fit: a few words are too few quadgrams.
    Their words are more frequent in another language (wordfreq): "und", dropped by [zh, en]."""
    import pycld2
    from mspretrain.dataprep.steps.langid import EN_MIN_SCORE, classify, lexical_vote
    reliable, _, details = pycld2.detect(text, bestEffort=True)
    assert reliable and details[0][1] == "en" and details[0][3] >= EN_MIN_SCORE
    assert lexical_vote(text) > 0
    assert classify(text) == ("und", 0.0, False)


@pytest.mark.parametrize("text", [
    "Could not resolve host", "Remind me later\nInstall updates\nRestart now",
    "Sort by Name\nSort by Date\nNew Tab", "Email Address", "Download now", "Change password",
    "Open links in a new window", "The password must contain at least eight characters",
])
def test_short_english_strings_stay_english(text):
    from mspretrain.dataprep.steps.langid import classify, lexical_vote
    assert lexical_vote(text) <= 0
    lang, score, unplaced = classify(text)
    assert (lang, unplaced) == ("en", False) and score > 0.9


def test_short_english_cld2_cannot_place_is_english_unplaced_by_its_words():
    """English CLD2 calls English only as its fallback, unreliably: its words are English
    (lexical_vote < 0), so it is English-unplaced rather than "und"."""
    import pycld2
    from mspretrain.dataprep.steps.langid import EN_MIN_SCORE, classify, lexical_vote
    text = "Quit\nUndo Typing\nRedo"
    reliable, _, details = pycld2.detect(text)
    assert not reliable and details[0][3] < EN_MIN_SCORE
    assert lexical_vote(text) < 0
    lang, score, unplaced = classify(text)
    assert (lang, unplaced) == ("en", True) and 0.0 < score < 0.5


def test_lexical_vote_leaves_other_scripts_and_single_letters_alone():
    from mspretrain.dataprep.steps.langid import lexical_vote
    assert lexical_vote("使用 multilingualization 和 localization，有 l 和 n 中间") == 0
    assert lexical_vote("ssh -q -L -e -i") == 0
    assert lexical_vote("") == 0 and lexical_vote("1234") == 0


def test_long_windows_are_cld2_alone_and_answers_do_not_depend_on_order(monkeypatch):
    """Only windows shorter than SHORT_CHARS get the second opinion: a longer document's code
    and score are what CLD2 and the fit rules alone give. Answers do not depend on what was
    classified before (wordfreq's lists are read-only)."""
    from langid_dev import documents
    from mspretrain.dataprep.steps import langid
    texts = [t for _, _, t in documents() if len(t) >= 20]
    long = [t for t in texts if len(langid.window(t)) >= langid.SHORT_CHARS]
    long += [text for _, text in man_texts("en", 4)] + [text for _, text in man_texts("fr", 4)]
    assert len(long) >= 40
    forward = [langid.classify(t) for t in texts]
    assert [langid.classify(t) for t in reversed(texts)] == forward[::-1]

    def refused(text):
        raise AssertionError("a long window went to the lexical second opinion")
    want = [langid.classify(t) for t in long]
    monkeypatch.setattr(langid, "lexical_vote", refused)
    assert [langid.classify(t) for t in long] == want


def test_the_report_counts_english_unplaced_documents(tmp_path):
    """English-unplaced documents are "en" in attributes.parquet with their (low) score, and the
    report counts them per language."""
    src = tmp_path / "in"
    src.mkdir()
    lists = ["Arabic, Egyptian\nArmenian\nAssamese",
             "San Antonio\nSan Diego\nDallas\nLondon\nManchester\nBirmingham",
             "Russian (phonetic, with Win keys)\nPortuguese (Brazil, Dvorak)\nCzech (QWERTY, extended)"]
    prose = ("The login program is used to establish a new session with the system. It is "
             "normally invoked automatically by responding to the login prompt on the terminal.")
    (src / "a.jsonl").write_text("".join(json.dumps({"id": f"d{i}", "text": t}) + "\n"
                                         for i, t in enumerate(lists + [prose])))
    out = tmp_path / "data"
    assert run_build([src], out, "--set", "filters.languages=[zh, en]") == 0
    report = json.loads((out / "report.json").read_text())
    assert report["languages"]["en"]["docs"] == 4 and report["languages"]["en"]["unplaced"] == 3
    attrs = pq.read_table(out / "documents" / "attributes.parquet").to_pylist()
    scores = sorted(a["language_score"] for a in attrs)
    assert all(a["language"] == "en" for a in attrs) and scores[2] < 0.5 < scores[3]
    assert "| unplaced |" in (out / "report.md").read_text()
