"""PII: each kind found and replaced by its placeholder, look-alikes left alone, and a build whose
decoded samples hold none of the planted strings but their placeholders."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from dataprep_helpers import run_build
from dataprep.config import ConfigError, load_build_config
from dataprep.pii import id_number_valid, luhn_valid, redact
from real_text import PII, SURVIVORS, decoded_samples, write_corpus


@pytest.mark.parametrize("text, kind", [
    ("write to zhang.san@example.com today", "EMAIL"),
    ("联系 wang_wu+list@mail.example.org.cn 获取", "EMAIL"),
    ("server 192.168.10.254 is down", "IP"),
    ("listen on [2001:db8::ff00:42:8329]:443", "IP"),
    ("mobile 13800138000.", "PHONE"),
    ("手机：+86 186-1234-5678", "PHONE"),
    ("call +1 415 555 0132 now", "PHONE"),
    ("call (415) 555-0132 now", "PHONE"),
    ("身份证 11010519491231002X 已登记", "ID_NUMBER"),
    ("card 4111-1111-1111-1111 exp", "CARD"),
    ("amex 378282246310005", "CARD"),
])
def test_each_kind_becomes_its_placeholder(text, kind):
    out, counts = redact(text)
    assert counts == {kind: 1}, (out, counts)
    assert f"<{kind}>" in out
    assert out.replace(f"<{kind}>", "") != text   # the match itself is gone


@pytest.mark.parametrize("text", [
    "mindspore 2.10.0, numpy 1.26.4 and kernel 6.1.0-18-amd64",
    "build 1.2.3.4-rc1 and v10.0.0.1 and 3.14.159.26.5",
    "released 2024-01-15, 2024/01/15 and 15.01.2024 at 12:30:45",
    "sha1 da39a3ee5e6b4b0d3255bfef95601890afd80709, md5 d41d8cd98f00b204e9800998ecf8427e",
    "uuid 123e4567-e89b-12d3-a456-426614174000",
    "counts 42, 1,234,567, 3.14159, 1234567890123, 12345678901234567 and 8080",
    "ISBN 978-3-16-148410-0 and ISSN 2049-3630",
    "C++ std::vector<int> and a::b::c, MAC 00:1a:2b:3c:4d:5e",
    "id 110105194912310021 has a wrong check digit",          # not a valid ID number
    "card 4111 1111 1111 1112 fails Luhn",
])
def test_look_alikes_survive(text):
    assert redact(text) == (text, {})


def test_checksums():
    assert id_number_valid("11010519491231002X") and not id_number_valid("110105194912310021")
    assert luhn_valid("4111111111111111") and not luhn_valid("4111111111111112")


def test_action_is_checked():
    with pytest.raises(ConfigError, match="pii"):
        load_build_config(sets=["pii.action=mask"])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("pii-corpus")
    return root, write_corpus(root)


def test_planted_pii_is_absent_from_the_samples_and_placeholders_are_there(corpus, tmp_path):
    root, planted = corpus
    out = tmp_path / "data"
    assert run_build([root], out, "--workers", "1") == 0
    text = " ".join(decoded_samples(out).split())
    for s, placeholder in planted["pii"].items():
        assert s not in text, s
    for placeholder in set(planted["pii"].values()):
        assert placeholder in text, placeholder
    for s in SURVIVORS:
        assert s in text, s
    report = json.loads((out / "report.json").read_text())
    assert report["pii"]["action"] == "redact"
    assert sum(report["pii"]["matches"].values()) >= len(planted["pii"])
    assert set(report["pii"]["matches"]) == {"EMAIL", "IP", "PHONE", "ID_NUMBER", "CARD"}
    assert "## Personal data (action: redact)" in (out / "report.md").read_text()
    attrs = pq.read_table(out / "documents" / "attributes.parquet").to_pylist()
    assert sum(a["pii"] for a in attrs) == sum(report["pii"]["matches"].values())


def test_drop_removes_the_documents_and_keep_keeps_the_strings(corpus, tmp_path):
    root, planted = corpus
    assert run_build([root], tmp_path / "drop", "--set", "pii.action=drop") == 0
    text = decoded_samples(tmp_path / "drop")
    assert not any(s in text for s in planted["pii"]) and "<EMAIL>" not in text
    report = json.loads((tmp_path / "drop" / "report.json").read_text())
    assert report["stages"]["filter"]["removed_by"]["pii"]["docs"] == report["pii"]["docs"] > 0
    assert run_build([root], tmp_path / "keep", "--set", "pii.action=keep") == 0
    text = " ".join(decoded_samples(tmp_path / "keep").split())
    assert "li.lei@example-mail.cn" in text and "<EMAIL>" not in text


# The number patterns of dataprep.pii are written first-character-first for speed; these are the
# plain forms they must agree with, match for match.
_PLAIN = {
    "_ID": r"(?<![\w.-])[1-9]\d{5}(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])"
           r"\d{3}[\dXx](?![\w-]|\.\w)",
    "_CARD": r"(?<![\w.-])(?:\d{4}[ -]){2,3}\d{4}(?:\d{1,3})?(?![\w-]|\.\w)|"
             r"(?<![\w.-])\d{13,19}(?![\w-]|\.\w)",
    "_PHONE": r"(?<![\w.+-])(?:(?:\+86[ -]?)?1[3-9]\d(?:\d{8}|[ -]\d{4}[ -]\d{4})"
              r"|\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?)(?:[ .-]?\d{2,4}){2,4}"
              r"|\(\d{3}\) ?\d{3}-\d{4}|\d{3}-\d{3}-\d{4})(?![\w-]|\.\w)",
}


@pytest.mark.parametrize("name", sorted(_PLAIN))
def test_fast_number_patterns_match_exactly_what_the_plain_ones_do(name):
    import random
    import re

    from dataprep import pii
    fast, plain = getattr(pii, name), re.compile(_PLAIN[name])
    rng = random.Random(name)
    alphabet = "0123456789" * 4 + "11+86()- .X_a中\n"
    texts = list(PII) + list(SURVIVORS)
    seeds = list(PII) + ["110105194912310021", "(415) 555-0132", "415-555-0132"]

    def piece() -> str:   # random characters, or a planted string with one character changed
        if rng.random() < 0.5:
            return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30)))
        s, i = rng.choice(seeds), rng.randrange(20)
        return s[:i] + rng.choice(["", rng.choice(alphabet)]) + s[i + rng.randint(0, 1):]
    texts += ["".join(piece() for _ in range(rng.randint(1, 4))) for _ in range(3000)]
    found = 0
    for text in texts:
        want = [m.span() for m in plain.finditer(text)]
        assert [m.span() for m in fast.finditer(text)] == want, text
        found += bool(want)
    assert found > 20   # the random texts do hold matches, so the comparison means something


def _plain_redact(text: str) -> tuple[str, dict[str, int]]:
    """redact as `pattern.sub` over the whole text, kind after kind, with the plain patterns."""
    import re

    from dataprep import pii
    rules = [("EMAIL", pii._EMAIL, None, "@" in text),
             ("IP", pii._IPV4, None, re.search(r"\d\.\d{1,3}\.\d{1,3}\.\d", text)),
             ("IP", pii._IPV6, pii._ipv6_ok, "::" in text or text.count(":") >= 3)]
    numbers = re.search(r"\d(?:[ ().-]{0,2}\d){6}", text)
    rules += [("ID_NUMBER", re.compile(_PLAIN["_ID"]), id_number_valid, numbers),
              ("CARD", re.compile(_PLAIN["_CARD"]), pii._card_ok, numbers),
              ("PHONE", re.compile(_PLAIN["_PHONE"]), None, numbers)]
    counts: dict[str, int] = {}
    for kind, pattern, valid, maybe in rules:
        if not maybe:
            continue

        def repl(m, kind=kind, valid=valid):
            if valid is not None and not valid(m.group(0)):
                return m.group(0)
            counts[kind] = counts.get(kind, 0) + 1
            return f"<{kind}>"
        text = pattern.sub(repl, text)
    return text, counts


def test_redact_equals_whole_text_substitution():
    """redact searches only where a match can be; it must give what plain substitution over the
    whole text gives, on real text and on random mixtures of PII, look-alikes and separators."""
    import random

    from real_text import man_texts
    rng = random.Random(5)
    seeds = list(PII) + SURVIVORS + ["a@b.cd", "x.y@z", "1.2.3.4", "::1", "fe80::1:2", "a::b:c",
                                     "(415) 555-0132", "110105194912310021", "+1 2 34 56"]
    alphabet = "0123456789@:.-+() \nabcXx_中"

    def piece() -> str:
        if rng.random() < 0.4:
            return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        s, i = rng.choice(seeds), rng.randrange(20)
        return s[:i] + rng.choice(["", rng.choice(alphabet)]) + s[i + rng.randint(0, 1):]
    texts = ["".join(piece() for _ in range(rng.randint(1, 8))) for _ in range(3000)]
    texts += [t for _, t in man_texts("en", 40, min_chars=300, seed=3)]
    changed = 0
    for text in texts:
        want = _plain_redact(text)
        assert redact(text) == want, text
        changed += want[0] != text
    assert changed > 300


def test_the_ipv4_pre_check_finds_a_candidate_exactly_when_the_scan_does():
    """_ANY_IPV4 (searched from a dot, fast) rules texts out for the _MAYBE_IPV4 scan: it must
    find something exactly when that scan does, or redact would miss an address."""
    import random

    from dataprep import pii
    from real_text import man_texts
    rng = random.Random(9)
    alphabet = "0123456789" * 3 + "..... ab\n:-١٢３"
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(5000)]
    texts += [t for lang in ("en", "de", "ru") for _, t in man_texts(lang, 20, seed=4)]
    hits = 0
    for text in texts:
        want = pii._MAYBE_IPV4.search(text) is not None
        assert (pii._ANY_IPV4.search(text) is not None) == want, text
        hits += want
    assert 100 < hits < len(texts) - 1000   # both answers well represented
