"""A held-out labelled set for PII redaction, generated once and committed (data/pii_heldout.jsonl.zst),
kept apart from the development set of pii_set.py (its hand-written formats and frames are what the
rules were tuned on; nothing here was looked at while tuning, except the rows marked "dev").

Rows (zstd-compressed JSON lines): `set` ("pii" or "negative"), `split` ("dev" or "heldout"),
`locale`, `kind`, `text`, `s` (the string that must become a placeholder, or must survive).

- pii: PII from Faker (pinned in the `test` extra) in six locales, 30 per kind and locale
  (Chinese identity numbers in zh_CN only), each planted in a real text of its locale's language
  (tests/dataprep/data/real_text.jsonl.zst) in a frame of its own (frames with a telephone word
  for about half the phone numbers, neutral ones for the rest); a smaller draw of other seeds is
  the "dev" split.
- negative: real non-PII from this machine's Debian changelogs (/usr/share/doc/*/changelog*.gz),
  each with its own line: four-part dotted numbers (versions, except those that are addresses:
  loopback and private ranges, or a line about hosts and resolvers, which are left out), long
  digit runs (bug numbers, timestamps, counts); plus order numbers that libphonenumber may call
  valid in order, invoice and tracking frames of the six languages. Split in halves by a hash of
  the line.

    python tests/dataprep/pii_heldout.py   # rewrite the file (needs faker; once)
"""
from __future__ import annotations

import json
import random
import re
import zlib
from functools import lru_cache
from pathlib import Path

DATA = Path(__file__).parent / "data" / "pii_heldout.jsonl.zst"
LOCALES = ("zh_CN", "en_US", "en_GB", "de_DE", "fr_FR", "ja_JP")

# frames of the held-out set; "{}" is the planted string (CJK: glued to it)
_PHONE_FRAMES = {
    "zh_CN": ["电话 {}", "联系电话：{}", "手机{}（工作日）", "客服电话{}。"],
    "en_US": ["call {} for details", "Phone: {}", "Tel. {}", "mobile {} (evenings)"],
    "en_GB": ["ring us on {}", "Tel: {}", "Phone {}.", "mobile: {}"],
    "de_DE": ["Telefon {}", "Tel.: {}", "Rufnummer {}", "Handy: {}"],
    "fr_FR": ["Tél. {}", "téléphone : {}", "appelez le {}", "portable {}"],
    "ja_JP": ["電話 {}", "電話番号：{}", "TEL {}", "携帯{}まで"],
}
_NEUTRAL_FRAMES = {
    "zh_CN": ["{}", "（{}）", "请联系{}，", "信息：{}"],
    "en_US": ["{}", "({})", "reach me at {}.", "- {}"],
    "en_GB": ["{}", "({})", "details: {}", "write to {}."],
    "de_DE": ["{}", "({})", "Kontakt: {}", "über {}."],
    "fr_FR": ["{}", "({})", "contact : {}", "via {}."],
    "ja_JP": ["{}", "（{}）", "連絡先：{}", "{}へ"],
}
_ORDER_FRAMES = {
    "zh_CN": ["订单号：{}", "您的订单{}已发货", "快递单号 {}"],
    "en_US": ["Order number {}", "invoice #{}", "tracking number: {}"],
    "en_GB": ["order no. {}", "Invoice {}", "Your order {} has shipped"],
    "de_DE": ["Bestellnummer {}", "Rechnung Nr. {}", "Sendungsnummer: {}"],
    "fr_FR": ["commande n° {}", "facture {}", "numéro de suivi : {}"],
    "ja_JP": ["注文番号：{}", "お問い合わせ番号 {}", "伝票番号{}"],
}
_CJK_LOCALES = ("zh_CN", "ja_JP")


@lru_cache(maxsize=1)
def rows() -> list[dict]:
    import zstandard
    text = zstandard.ZstdDecompressor().decompress(DATA.read_bytes()).decode()
    return [json.loads(line) for line in text.splitlines()]


def pii_cases(split: str = "heldout") -> list[tuple[str, str, str, str]]:
    """(locale, kind, text, planted string), as pii_set.pii_cases."""
    return [(r["locale"], r["kind"], r["text"], r["s"]) for r in rows()
            if r["set"] == "pii" and r["split"] == split]


def negative_cases(split: str = "heldout") -> list[tuple[str, str, str]]:
    """(kind, text, string that must survive), as pii_set.negative_cases."""
    return [(r["kind"], r["text"], r["s"]) for r in rows()
            if r["set"] == "negative" and r["split"] == split]


# ------------------------------------------------------------------------------- generating
def _plant(rng, base: str, s: str, frame: str, locale: str) -> str:
    breaks = [i for i, c in enumerate(base) if c == "\n"] or [len(base)]
    i = rng.choice(breaks)
    sep = "" if locale in _CJK_LOCALES else " "
    return base[:i] + sep + frame.format(s) + sep + base[i:]


def _faker_pii(rng, split: str, per_kind: int) -> list[dict]:
    from faker import Faker
    from pii_set import _TEXT_OF, _samples
    samples = _samples()
    out = []
    for locale in LOCALES:
        fake = Faker(locale)
        fake.seed_instance(zlib.crc32((locale + split).encode()))
        kinds = {"EMAIL": fake.email, "PHONE": fake.phone_number, "CARD": fake.credit_card_number,
                 "IP": lambda: rng.choice([fake.ipv4_public, fake.ipv4_private, fake.ipv6])()}
        if locale == "zh_CN":
            kinds["ID_NUMBER"] = fake.ssn
        for kind, gen in kinds.items():
            for k in range(per_kind):
                s = gen()
                frames = (_PHONE_FRAMES if kind == "PHONE" and k % 2 == 0 else _NEUTRAL_FRAMES)
                text = _plant(rng, rng.choice(samples[_TEXT_OF[locale]])[:1500], s,
                              rng.choice(frames[locale]), locale)
                out.append({"set": "pii", "split": split, "locale": locale, "kind": kind,
                            "text": text, "s": s})
    return out


_DOTTED4 = re.compile(r"(?<![\w.])\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}(?![\w]|\.\w)")
_DIGITS = re.compile(r"(?<![\w.,:-])\d{7,}(?![\w.,:-])")
# an address rather than a version: loopback, private and reserved ranges, or a line about networks
_ADDRESS = re.compile(r"^(?:127|10|0|255|224|192\.168|172\.(?:1[6-9]|2\d|3[01]))\.")
_NETWORK_LINE = re.compile(r"(?i)\b(?:ip|ipv4|address|addr|host|hosts|resolver|dns|nameserver|"
                           r"server|route|gateway|listen|bind|localhost|subnet|netmask)\b")


def _split(line: str) -> str:
    return "dev" if zlib.crc32(line.encode()) % 2 else "heldout"


def _real_negatives() -> list[dict]:
    import glob
    import gzip
    out, seen = [], set()
    for path in sorted(glob.glob("/usr/share/doc/*/changelog*.gz")):
        try:
            text = gzip.open(path, "rt", errors="replace").read(200_000)
        except (OSError, EOFError):
            continue
        for line in text.split("\n"):
            line = line.strip()
            if not line or line in seen or len(line) > 300:
                continue
            seen.add(line)
            for m in _DOTTED4.finditer(line):
                if _ADDRESS.match(m.group()) or _NETWORK_LINE.search(line):
                    continue
                out.append({"set": "negative", "split": _split(line), "locale": "", "kind": "version4",
                            "text": line, "s": m.group()})
            for m in _DIGITS.finditer(line):
                if "@" in line[max(0, m.start() - 1):m.end() + 40].split(" ")[0]:
                    continue   # part of an e-mail address: PII
                out.append({"set": "negative", "split": _split(line), "locale": "", "kind": "digits",
                            "text": line, "s": m.group()})
    return out


def _order_negatives(rng) -> list[dict]:
    from pii_set import _TEXT_OF, _samples
    samples = _samples()
    out = []
    for k in range(80):
        locale = LOCALES[k % len(LOCALES)]
        # 11 digits that start like a Chinese mobile number half of the time: valid-looking
        s = (rng.choice(["13", "15", "18"]) + "".join(rng.choice("0123456789") for _ in range(9))
             if k % 2 else "".join(rng.choice("123456789") for _ in range(rng.choice([8, 10, 11]))))
        text = _plant(rng, rng.choice(samples[_TEXT_OF[locale]])[:1500], s,
                      rng.choice(_ORDER_FRAMES[locale]), locale)
        out.append({"set": "negative", "split": "dev" if k % 4 == 0 else "heldout",
                    "locale": locale, "kind": "order", "text": text, "s": s})
    return out


def generate() -> None:
    import zstandard
    rng = random.Random(36)
    data = (_faker_pii(rng, "heldout", 30) + _faker_pii(rng, "dev", 10) + _real_negatives()
            + _order_negatives(rng))
    raw = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in data).encode()
    DATA.write_bytes(zstandard.ZstdCompressor(level=19).compress(raw))
    counts: dict = {}
    for r in data:
        key = (r["set"], r["split"], r["kind"])
        counts[key] = counts.get(key, 0) + 1
    print(f"{DATA}: {len(data)} rows, {DATA.stat().st_size} bytes", sorted(counts.items()))


if __name__ == "__main__":
    import sys
    sys.path.insert(0, str(Path(__file__).parent))
    generate()
