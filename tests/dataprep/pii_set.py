"""A labelled set for PII redaction and language identification, built at run time from fixed seeds
and the small real-text samples in tests/dataprep/data/real_text.jsonl.zst (translated manual pages
and gettext catalogues of this machine, see `collect`).

- `pii_cases(seed)`: PII strings in the formats six locales write them (zh_CN, en_US, en_GB, de_DE,
  fr_FR, ja_JP), planted in real text of the locale's language with the locale's spacing (no
  spaces around them in Chinese and Japanese) -> (locale, kind, text, planted string).
- `negative_cases(seed)`: real non-PII that looks like it (versions, 4-part versions in their
  contexts, dates, times, hashes, prices, order numbers, timestamps, ISBNs) -> (kind, text, string).

    python tests/dataprep/pii_set.py --collect   # rewrite the samples from /usr/share (once)
"""
from __future__ import annotations

import json
import random
from functools import lru_cache
from pathlib import Path

DATA = Path(__file__).parent / "data" / "real_text.jsonl.zst"
LOCALES = ("zh_CN", "en_US", "en_GB", "de_DE", "fr_FR", "ja_JP")
_TEXT_OF = {"zh_CN": "man:zh_CN", "en_US": "man:en", "en_GB": "man:en", "de_DE": "man:de",
            "fr_FR": "man:fr", "ja_JP": "man:ja"}
# gettext catalogues whose strings are shipped: languages CLD2 knows and three it has no model of
CATALOGUES = ("ia", "fur", "wa", "en_GB", "de", "fr", "ja", "zh_CN", "zh_TW", "he", "es")


@lru_cache(maxsize=1)
def _samples() -> dict[str, list[str]]:
    import zstandard
    lines = zstandard.ZstdDecompressor().decompress(DATA.read_bytes()).decode().splitlines()
    out: dict[str, list[str]] = {}
    for line in lines:
        row = json.loads(line)
        out.setdefault(row["name"], []).append(row["text"])
    return out


def catalogue_texts() -> dict[str, str]:
    """{language: the translated strings of one gettext catalogue in it}."""
    return {name[3:]: texts[0] for name, texts in _samples().items() if name.startswith("mo:")}


# ---------------------------------------------------------------------------- PII generators
def _d(rng, n: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


def _phone(rng, locale: str) -> str:
    d = lambda n: _d(rng, n)   # noqa: E731
    x = rng.randint(2, 9)
    forms = {
        "zh_CN": [f"1{rng.choice('35789')}{d(9)}", f"+86 13{d(1)} {d(4)} {d(4)}", f"+86-18{d(1)}-{d(4)}-{d(4)}",
                  f"010-{x}{d(7)}", f"021-{x}{d(7)}", f"0755-{x}{d(7)}", f"(010) {x}{d(7)}",
                  f"15{d(1)}-{d(4)}-{d(4)}", f"+8613{d(9)}"],
        # (the last three: area codes drawn as the NANP allows them, NXX, assigned or not)
        "en_US": [f"({rng.choice(['212', '415', '401', '617', '312'])}){x}{d(2)}-{d(4)}",
                  f"{rng.choice(['201', '646', '718', '202'])}-{x}{d(2)}-{d(4)}",
                  f"{rng.choice(['305', '512', '503'])}.{x}{d(2)}.{d(4)}", f"+1-{rng.choice(['206', '303'])}-{x}{d(2)}-{d(4)}",
                  f"({rng.choice(['401', '702'])}){x}{d(2)}-{d(4)}x{d(3)}", f"{rng.choice(['214', '404'])}-{x}{d(2)}-{d(4)}x{d(4)}",
                  f"001-{rng.choice(['512', '919'])}-{x}{d(2)}-{d(4)}", f"+1 (415) {x}{d(2)}-{d(4)}",
                  f"({rng.randint(2, 9)}{d(2)}) {x}{d(2)}-{d(4)}", f"{rng.randint(2, 9)}{d(2)}-{x}{d(2)}-{d(4)}",
                  f"1-{rng.randint(2, 9)}{d(2)}-{x}{d(2)}-{d(4)}"],
        "en_GB": [f"0117 496 {d(4)}", f"0161 496 {d(4)}", f"020 7946 {d(4)}", f"+44 20 7946 {d(4)}",
                  f"07{rng.randint(400, 999)} {d(6)}", f"+44(0)113 496 {d(4)}", f"(0121) 496 {d(4)}", f"0909 879 {d(4)}",
                  f"+44 7{rng.randint(400, 999)} {d(6)}", f"01632 960{d(3)}"],
        "de_DE": [f"030 {x}{d(6)}", f"089 {x}{d(6)}", f"+49 30 {x}{d(6)}", f"+49(0)69 {x}{d(6)}",
                  f"(040) {x}{d(6)}", f"0151 {d(8)}", f"+49 171 {d(7)}", f"0221/{x}{d(6)}",
                  f"030-{x}{d(6)}"],
        "fr_FR": [f"01 {d(2)} {d(2)} {d(2)} {d(2)}", f"04 {d(2)} {d(2)} {d(2)} {d(2)}",
                  f"06 {d(2)} {d(2)} {d(2)} {d(2)}", f"+33 (0)6 {d(2)} {d(2)} {d(2)} {d(2)}",
                  f"+33 1 {d(2)} {d(2)} {d(2)} {d(2)}", f"07.{rng.randint(50, 89)}.{d(2)}.{d(2)}.{d(2)}",
                  f"05{d(8)}"],
        "ja_JP": [f"090-{d(4)}-{d(4)}", f"080-{d(4)}-{d(4)}", f"03-{x}{d(3)}-{d(4)}",
                  f"06-{x}{d(3)}-{d(4)}", f"+81 90-{d(4)}-{d(4)}", f"+81-3-{x}{d(3)}-{d(4)}",
                  f"045-{x}{d(2)}-{d(4)}", f"070{d(8)}"],
    }
    return rng.choice(forms[locale])


def _luhn_complete(body: str) -> str:
    from mspretrain.dataprep.steps.pii import luhn_valid
    return next(body + c for c in "0123456789" if luhn_valid(body + c))


_CARD_FORMS = [("4", 16), ("4", 13), ("4", 19), ("51", 16), ("55", 16), ("2221", 16), ("2720", 16),
               ("34", 15), ("37", 15), ("36", 14), ("300", 14), ("38", 14), ("6011", 16),
               ("65", 16), ("644", 16), ("3528", 16), ("3589", 19), ("1800", 15), ("2131", 15),
               ("62", 16), ("62", 19), ("5018", 12), ("6759", 16), ("6304", 19), ("2200", 16)]


def _card(rng, locale: str) -> str:
    prefix, n = rng.choice(_CARD_FORMS)
    digits = _luhn_complete(prefix + _d(rng, n - len(prefix) - 1))
    layout = rng.random()
    if layout < 0.4:
        return digits
    sep = rng.choice(" -")
    if n == 15 and digits[:2] in ("34", "37"):
        return sep.join((digits[:4], digits[4:10], digits[10:]))
    if n == 14:
        return sep.join((digits[:4], digits[4:10], digits[10:]))
    return sep.join(digits[i:i + 4] for i in range(0, n, 4))


def _id_number(rng, locale: str) -> str:
    from mspretrain.dataprep.steps.pii import id_number_valid
    body = (f"{rng.choice(['110105', '310104', '440305', '210903', '510107'])}"
            f"{rng.randint(1950, 2008)}{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}{_d(rng, 3)}")
    return next(body + c for c in "0123456789X" if id_number_valid(body + c))


_NAMES = {"zh_CN": ["xiulan", "wang.wei", "li_na", "zhangmin"], "en_US": ["john.smith", "mary_j", "bwilliams"],
          "en_GB": ["oliver.jones", "amelia.t", "harry_b"], "de_DE": ["hans.mueller", "k.schmidt", "j-weber"],
          "fr_FR": ["marie.dupont", "jlefebvre", "c_moreau"], "ja_JP": ["taro.yamada", "hanako_s", "k-suzuki"]}
_DOMAINS = {"zh_CN": ["163.com", "qq.com", "yahoo.com", "example.cn"], "en_US": ["gmail.com", "example.org"],
            "en_GB": ["example.co.uk", "btinternet.com"], "de_DE": ["web.de", "example.de", "gmx.net"],
            "fr_FR": ["orange.fr", "example.fr", "laposte.net"], "ja_JP": ["example.co.jp", "docomo.ne.jp"]}


def _email(rng, locale: str) -> str:
    return f"{rng.choice(_NAMES[locale])}{rng.choice(['', str(rng.randint(1, 99))])}@" \
           f"{rng.choice(_DOMAINS[locale])}"


def _ip(rng, locale: str) -> str:
    if rng.random() < 0.25:
        return rng.choice([f"2001:db8:{rng.randint(1, 0xffff):x}::{rng.randint(1, 0xffff):x}",
                           f"fe80::{rng.randint(1, 0xffff):x}:{rng.randint(1, 0xffff):x}:{rng.randint(1, 0xffff):x}",
                           "2001:0db8:85a3:0000:0000:8a2e:0370:7334"])
    # (a first octet below 10 now and then: the public addresses that look most like versions)
    return ".".join(str(rng.choice([rng.randint(1, 223), 10, 192, 172, 127, rng.randint(1, 9)])) if i == 0 else
                    str(rng.randint(0, 255)) for i in range(4))


_GENERATORS = {"EMAIL": _email, "IP": _ip, "PHONE": _phone, "CARD": _card, "ID_NUMBER": _id_number}
# the words around a planted string, per language; CJK: glued to the string
_FRAMES = {
    "zh_CN": ["联系方式{}已绑定该账户。", "请发送到{}，谢谢", "来自{}的请求", "号码为{}，", "（{}）", "：{}\n"],
    "en_US": ["call {} today.", "contact: {}\n", "({})", "at {}, please", "sent to {}."],
    "en_GB": ["ring {} today.", "contact: {}\n", "({})", "on {}, please", "sent to {}."],
    "de_DE": ["Tel. {} erreichbar.", "Kontakt: {}\n", "({})", "unter {}, bitte", "an {}."],
    "fr_FR": ["appelez le {} demain.", "contact : {}\n", "({})", "au {}, merci", "à {}."],
    "ja_JP": ["電話番号は{}です。", "メールは{}まで", "「{}」", "（{}）", "アドレス{}から"],
}


def _plant(rng, base: str, s: str, frame: str) -> str:
    """`frame` holding `s` inserted at a line break of `base` (or its end)."""
    breaks = [i for i, c in enumerate(base) if c == "\n"] or [len(base)]
    i = rng.choice(breaks)
    return base[:i] + " " + frame.format(s) + base[i:]


def pii_cases(seed: int = 0, per_kind: int = 24) -> list[tuple[str, str, str, str]]:
    """(locale, kind, text, planted string): per locale and kind, `per_kind` strings (ID numbers
    in zh_CN only) each planted in a real text of the locale's language."""
    rng = random.Random(seed)
    samples = _samples()
    cases = []
    for locale in LOCALES:
        texts = samples[_TEXT_OF[locale]]
        for kind, gen in _GENERATORS.items():
            if kind == "ID_NUMBER" and locale != "zh_CN":
                continue
            for _ in range(per_kind):
                s = gen(rng, locale)
                text = _plant(rng, rng.choice(texts)[:1500], s, rng.choice(_FRAMES[locale]))
                cases.append((locale, kind, text, s))
    return cases


# ------------------------------------------------------------------------- negative cases
def _version4(rng) -> str:
    return f"{rng.randint(0, 12)}.{rng.randint(0, 20)}.{rng.randint(0, 20)}.{rng.randint(0, 99)}"


def _small_version4(rng) -> str:
    # the four-part versions of changelogs start below 10 (X.org's 1.9.99.x, CVS's 1.1.1.1)
    return f"{rng.randint(0, 9)}.{rng.randint(0, 20)}.{rng.choice([rng.randint(0, 20), 99])}.{rng.randint(0, 30)}"


def _negatives(rng) -> list[tuple[str, str]]:
    v = _version4(rng)
    w = _small_version4(rng)
    w3 = w.rsplit(".", 1)[0]
    d = lambda n: _d(rng, n)   # noqa: E731
    y, mo, da = rng.randint(1995, 2026), rng.randint(1, 12), rng.randint(1, 28)
    h, mi, se = rng.randint(0, 23), rng.randint(0, 59), rng.randint(0, 59)
    return [
        ("version4", f"Standards-Version: {v}"), ("version4", f"Version: {v}"),
        ("version4", f"upgraded to v{v}"), ("version4", f"{v}-{rng.randint(1, 9)}"),
        ("version4", f"{v}+dfsg"), ("version4", f"Depends: libfoo (<= {v}-{rng.randint(1, 5)})"),
        ("version4", f"Breaks: bar (>= {v})"), ("version4", f"pkg ({v}) unstable; urgency=medium"),
        ("version4", f"version {v}"), ("version4", f"版本 {v}"),
        # weaker contexts, which own versions that start below 10: a name right before (X.org,
        # the BSDs, standards' sections, a CVS revision after a file name), a version word earlier
        # on the line, another version on the line
        ("version4", f"Require {rng.choice(['renderproto', 'libXrandr', 'xtrans', 'pixman'])} {w}."),
        ("version4", f"{rng.choice(['NetBSD', 'OpenBSD', 'Solaris', 'OpenSSL'])} {w}"),
        ("version4", f"see RFC 2617 section {w}"),
        ("version4", f"{rng.choice(['main.c', 'util.h', 'Makefile.in'])} ({w})"),
        ("version4", f"the next version will be {w}"), ("version4", f"upgrade from {w3} or {w}"),
        ("version4", f"{w} replaces {w3}"),
        ("version", f"{rng.randint(0, 9)}.{rng.randint(0, 30)}.{rng.randint(0, 30)}"),
        ("date", f"{y}-{mo:02d}-{da:02d}"), ("date", f"{da:02d}.{mo:02d}.{y}"), ("date", f"{y}/{mo:02d}/{da:02d}"),
        ("date", f"{y}{mo:02d}{da:02d}"), ("date", f"{y}年{mo}月{da}日"), ("date", f"{mo}/{da}/{y}"),
        ("time", f"{h:02d}:{mi:02d}:{se:02d}"), ("time", f"{y}-{mo:02d}-{da:02d} {h:02d}:{mi:02d}:{se:02d}"),
        ("timestamp", f"{rng.randint(1_000_000_000, 1_800_000_000)}"),
        ("timestamp", f"{rng.randint(1_000_000_000_000, 1_800_000_000_000)}"),
        ("timestamp", f"{y}-{mo:02d}-{da:02d}T{h:02d}:{mi:02d}:{se:02d}+0{rng.randint(0, 9)}00"),
        ("hash", "".join(rng.choice("0123456789abcdef") for _ in range(40))),
        ("hash", "".join(rng.choice("0123456789abcdef") for _ in range(rng.choice([7, 12, 32, 64])))),
        ("price", f"${rng.randint(1, 999)},{d(3)}.{d(2)}"), ("price", f"{rng.randint(1, 999)} {d(3)},{d(2)} €"),
        ("price", f"¥{rng.randint(1, 99)},{d(3)},{d(3)}"), ("price", f"£{rng.randint(1, 9999)}.{d(2)}"),
        ("order", f"订单号{y}{mo:02d}{da:02d}{d(6)}"), ("order", f"Order #{rng.randint(10**6, 10**9)}"),
        ("order", f"Bestellnummer {rng.randint(10**7, 10**10)}"), ("order", f"INV-{y}-{d(6)}"),
        ("order", f"commande n° {d(3)}-{d(7)}-{d(7)}"), ("order", f"注文番号: {d(3)}-{d(7)}-{d(7)}"),
        ("count", f"{rng.randint(1, 999)},{d(3)},{d(3)} bytes"), ("count", f"{rng.randint(1, 999)} {d(3)} {d(3)}"),
        ("isbn", f"ISBN 978-{rng.randint(0, 9)}-{d(2)}-{d(6)}-{rng.randint(0, 9)}"),
        ("uuid", f"{d(8)}-{d(4)}-4{d(3)}-a{d(3)}-{d(12)}"),
    ]


def negative_cases(seed: int = 0, rounds: int = 40) -> list[tuple[str, str, str]]:
    """(kind, text, string): real non-PII strings planted in real text of six languages."""
    rng = random.Random(seed + 1000)
    samples = _samples()
    cases = []
    for _ in range(rounds):
        for kind, s in _negatives(rng):
            locale = rng.choice(LOCALES)
            frame = rng.choice(["{}", " {} ", "({})", "{}。"] if locale in ("zh_CN", "ja_JP") else
                               [" {} ", " ({}) ", " {}. ", "\n{}\n"])
            text = _plant(rng, rng.choice(samples[_TEXT_OF[locale]])[:1500], s, frame)
            cases.append((kind, text, s))
    return cases


# ------------------------------------------------------------------------------ collecting
def collect() -> None:
    """Rewrite DATA from this machine: 10 translated manual pages (1.5 KB each) per language of
    the six locales, and the translated strings of one gettext catalogue per CATALOGUES language.
    Manual pages and catalogues are free software documentation and translations."""
    import gettext
    import re
    import sys

    import zstandard
    sys.path.insert(0, str(Path(__file__).parent))
    from real_text import man_texts
    rows = []
    for lang in ("zh_CN", "en", "de", "fr", "ja"):
        for _, text in man_texts(lang, 10, min_chars=1200, max_chars=1500, seed=23, translated=0.8):
            rows.append({"name": f"man:{lang}", "text": text})
    for lang in CATALOGUES:
        for path in sorted(Path(f"/usr/share/locale/{lang}/LC_MESSAGES").glob("*.mo")):
            with path.open("rb") as f:
                catalogue = gettext.GNUTranslations(f)._catalog
            strings = [re.sub(r"%\S|\\n", " ", v) for k, v in sorted(catalogue.items(), key=str)
                       if k and isinstance(v, str) and v != k and len(v) > 20]
            text = "\n".join(strings)[:1500]
            if len(text) >= 600:
                rows.append({"name": f"mo:{lang}", "text": text})
                break
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
    DATA.write_bytes(zstandard.ZstdCompressor(level=19).compress(data))
    print(f"{DATA}: {len(rows)} texts, {len(data)} bytes, {DATA.stat().st_size} compressed")


if __name__ == "__main__":
    import sys
    if "--collect" in sys.argv:
        collect()
