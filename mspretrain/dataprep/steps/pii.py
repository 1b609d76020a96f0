"""Personal data in documents: find it, then redact it (the default), drop the document, or keep it.

Kinds, checked in this order (an earlier kind's placeholder is never matched by a later one):

- EMAIL       `name@host.tld`
- IP          IPv4 (four octets 0-255) and IPv6 (validated by `ipaddress`, at least three groups);
              a dotted quad that a version context owns is a version, not an address (see
              `_is_version`); a full eight-group IPv6 address may touch a letter that is no hex
              digit
- ID_NUMBER   Chinese resident identity numbers: 18 characters, a valid birth date, and the
              ISO 7064 MOD 11-2 check character
- CARD        bank card numbers: 12-19 digits, ungrouped or in groups (4-4-4-4, 4-6-5, 4-6-4, with a
              space or a hyphen), whose issuer prefix and length belong to a card network
              (`_NETWORKS`) and whose Luhn checksum holds
- PHONE       telephone numbers that Google's libphonenumber (`phonenumbers`) calls valid, written
              in the national form of one of `pii.phone_regions` or in the international form
              (`+CC ...`, or the region's international prefix such as `00`), with an extension
              (`x507`, `ext. 12`) or not; the North American grouping `(NXX) NXX-XXXX` where a
              NANP region is searched; any number of phone shape after a telephone word, none
              after an order word (`number_context`)

A match becomes a placeholder `<KIND>`. False positives are kept low by requiring the shape and a
checksum or a numbering plan, and by refusing a Latin (or other alphabetic) letter, a digit or a
dot right next to a match: version strings (`2.10.0`, `1.2.3.4-rc1`), dates, hashes, order numbers
and ordinary numbers survive. A CJK character, kana or hangul next to a match is a boundary, not
part of a word: Chinese and Japanese do not put spaces around numbers (`手机号码15341354926已绑定`).
"""
from __future__ import annotations

import copy
import ipaddress
import re
from dataclasses import dataclass, field
from functools import lru_cache

from mspretrain.dataprep.steps.text import CJK as _CJK

KINDS = ("EMAIL", "IP", "ID_NUMBER", "CARD", "PHONE")
ACTIONS = ("redact", "drop", "keep")
# the regions whose national forms are searched; a number written with + and a country code is
# found whatever its country
DEFAULT_PHONE_REGIONS = ("CN", "US", "GB", "DE", "FR", "JP", "KR", "HK", "TW", "SG")


@dataclass(frozen=True)
class PiiConfig:
    action: str = "redact"        # redact | drop | keep (keep still counts what it finds)
    phone_regions: tuple[str, ...] = field(default=DEFAULT_PHONE_REGIONS)

    def __post_init__(self):
        if self.action not in ACTIONS:
            raise ValueError(f"pii.action must be one of {', '.join(ACTIONS)}, got {self.action!r}")
        object.__setattr__(self, "phone_regions", tuple(self.phone_regions))
        import phonenumbers
        known = phonenumbers.SUPPORTED_REGIONS
        bad = [r for r in self.phone_regions if r not in known]
        if bad:
            raise ValueError(f"pii.phone_regions: {bad[0]!r} is not a region phonenumbers knows "
                             f"(ISO 3166-1 alpha-2, upper case, such as CN or GB)")


# ---------------------------------------------------------------------------------- boundaries
# A CJK character (steps/text.py: Han, kana, hangul, ...) next to a match is a boundary.
# a word character (letter, digit, underscore) that is not CJK: what may not touch a match
_W = rf"[^\W{_CJK}]"

_EMAIL = re.compile(rf"(?<!{_W}|[.+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*"
                    rf"[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{{2,}}"
                    rf"(?!{_W}|-)")
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
# no letter, digit or dot around: "1.2.3.4.5", "v1.2.3.4", "1.2.3.4-rc1", "4.6.1.0+dfsg" and
# "1.2.3.4~beta" are versions
_IPV4 = re.compile(rf"(?<!{_W}|\.){_OCTET}(?:\.{_OCTET}){{3}}(?!{_W}|[-+~]|\.{_W})")
_IPV6 = re.compile(rf"(?<!{_W}|[:.])(?:[0-9A-Fa-f]{{0,4}}:){{2,7}}(?:[0-9A-Fa-f]{{0,4}}|"
                   rf"\d{{1,3}}(?:\.\d{{1,3}}){{3}})(?!{_W}|:)")
# an address in full, eight groups of hex digits, is no part of a word even where a letter that
# cannot be a hex digit touches it ("-d home_dir2001:db8:0:0:8:800:200c:417a": Chinese and Japanese
# text glues it to what comes before); searched after _IPV6, which takes the ones with a boundary
_IPV6_FULL = re.compile(r"(?<![0-9A-Fa-f:.])(?:[0-9A-Fa-f]{1,4}:){7}[0-9A-Fa-f]{1,4}"
                        rf"(?!{_W}|:)")
# what owns a dotted quad as a version when it stands before it: a version word (any case, several
# languages) with an optional ":" or "=", or with up to three of the small words that changelogs
# put between ("Standards-Version): updated to 4.6.1.0", "Bump standards version to 3.9.8.0"), a
# comparison of a package constraint ("(>= 1.2.3.4)", "<< 1:4.6.1.0"), or a date and a bracket ("2015-05-09
# (3.8.10.1)", a release list)
_VERSION_BEFORE = re.compile(
    r"(?:(?<![^\W\d_])(?:standards-version|standards|standard|version|versions|versión|versão|"
    r"versione|versie|версия|ver|rel|release|revision|rev|build|firmware|fw|policy|kernel|"
    r"driver|patch|update|upgrade|bump|bumped|changes\s+in|require|requires|depends|build-dep)"
    r"(?:\.?\s*[:=]?\s*|\)?\s*[:=]?\s+(?:(?:to|updated|update|bump|bumped|set|now|is|was|of|the|"
    r"debian|compliance|with|changed|raised|increased|upgraded)\s+){1,3})"
    r"|[<>=]=?\s*(?:\d+:)?|(?:版本|版本号|バージョン|버전|固件|ファームウェア)\s*[:：]?\s*"
    r"|(?<!\d)(?:19|20)\d\d-\d\d-\d\d\s+\()$", re.IGNORECASE)
# a Debian changelog header: "package (1.2.3.4) unstable; urgency=medium"
_CHANGELOG_HEAD = re.compile(r"\) [a-z][\w-]*(?: [a-z][\w-]*)*; urgency=")
# a package's name right before it: one with a separator or a digit in it ("libfoo-dev 1.2.3.4",
# "python3 3.11.2.1", "XFree86 4.3.99.16"), a library ("libXi 1.6.99.1"), or a name and a slash
# ("Chrome/120.0.6099.109", "openssl/1.1.1.1"); a plain word before an address ("server",
# "from", "Tel.") is no package name
_PACKAGE_BEFORE = re.compile(
    r"(?:(?<![\w.+-])(?:[a-z][a-z0-9]*(?:[-+_.][a-z0-9]+)+|[A-Za-z]+[0-9]+[a-z0-9]*|lib[A-Za-z0-9]+)"
    r"\s+"
    r"|(?<![\w/])[A-Za-z][\w.+-]*/)$")

_ID = re.compile(rf"(?<!{_W}|[.-])[1-9]\d{{5}}(?:18|19|20)\d{{2}}(?:0[1-9]|1[0-2])"
                 rf"(?:0[1-9]|[12]\d|3[01])\d{{3}}[\dXx](?!{_W}|-|\.{_W})")
# 12-19 digits in a row, or groups with one separator (a space or a hyphen) used throughout:
# 4-6-5 (American Express), 4-6-4 (Diners Club), 4-4-4(-4), with a tail of 1-3 digits; not after
# a decimal point ("0.4111..."), but after a dot that ends a word ("see p.4111 1111 1111 1111")
_CARD = re.compile(rf"(?<!{_W}|[+-])(?<!\d\.)(?:\d{{4}}([ -])\d{{6}}\1\d{{4,5}}"
                   rf"|\d{{4}}([ -])\d{{4}}(?:\2\d{{4}}){{1,2}}(?:\2\d{{1,3}})?|\d{{12,19}})"
                   rf"(?!{_W}|-|\.{_W})")
# a phone number's shape, which phonenumbers then parses: an optional "+" or "(", digits with at
# most one separator (space, dot, hyphen, slash) or a bracket between them, 7 to 20 digits, and
# an optional extension; not right after a colon ("12:30:45"), unless a word ends there ("Tel:")
_PHONE = re.compile(rf"(?<!{_W}|[.+/#-]|(?<![^\W\d_]):)(?:\+|\(\+?)?\d(?:(?:[ ./-]|\) ?| ?\()?\d){{6,19}}"
                    rf"(?: ?(?:x|ext\.?|#) ?\d{{1,6}})?(?!{_W}|-|[.:]\d)")
# a date in a candidate ("2024-01-15 12", "15.01.2024 0800") or a range of years ("2006-2023"): not
# a phone number
_DATE = re.compile(r"(?<!\d)(?:19|20)\d\d ?[-\u2013] ?(?:19|20)\d\d(?!\d)"
                   r"|(?<!\d)(?:19|20)\d\d([-./ ])(?:0?[1-9]|1[0-2])\1(?:0?[1-9]|[12]\d|3[01])(?!\d)"
                   r"|(?<!\d)(?:0?[1-9]|[12]\d|3[01])([-./ ])(?:0?[1-9]|1[0-2])\2(?:19|20)\d\d(?!\d)")
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"

# Card networks: (issuer prefix ranges as (first, last) of equal length, lengths). From the
# networks' published IIN ranges; a number is a card number when one network has its prefix and
# its length.
_NETWORKS = {
    "Visa": ((("4", "4"),), (13, 16, 19)),
    "Mastercard": ((("51", "55"), ("2221", "2720")), (16,)),
    "American Express": ((("34", "34"), ("37", "37")), (15,)),
    "Diners Club": ((("300", "305"), ("3095", "3095"), ("36", "36"), ("38", "39")),
                    (14, 15, 16, 17, 18, 19)),
    "Discover": ((("6011", "6011"), ("644", "649"), ("65", "65"), ("622126", "622925")),
                 (16, 17, 18, 19)),
    "JCB": ((("3528", "3589"),), (16, 17, 18, 19)),   # the range JCB is assigned, not all of 35
    "JCB (15 digits)": ((("1800", "1800"), ("2131", "2131")), (15,)),
    "UnionPay": ((("62", "62"), ("81", "81")), (16, 17, 18, 19)),
    "Maestro": ((("50", "50"), ("56", "69")), tuple(range(12, 20))),
    "Mir": ((("2200", "2204"),), (16, 17, 18, 19)),
    "RuPay": ((("60", "60"), ("508", "508"), ("652", "653"), ("82", "82")), (16,)),
    "Verve": ((("506099", "506198"), ("650002", "650027")), (16, 18, 19)),
    "UATP": ((("1", "1"),), (15,)),
}


def card_network(digits: str) -> str | None:
    """The network whose issuer prefix and length `digits` has (None: no network's)."""
    for name, (ranges, lengths) in _NETWORKS.items():
        if len(digits) in lengths and any(lo <= digits[:len(lo)] <= hi for lo, hi in ranges):
            return name
    return None


def id_number_valid(s: str) -> bool:
    """ISO 7064 MOD 11-2 check character of an 18-character Chinese identity number."""
    total = sum(int(c) * w for c, w in zip(s[:17], _ID_WEIGHTS))
    return _ID_CHECK[total % 11] == s[17].upper()


def luhn_valid(digits: str) -> bool:
    total = 0
    for i, c in enumerate(reversed(digits)):
        d = ord(c) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


# Weaker version contexts, which own only a quad whose first part is below 10: versions start so
# ("1.2.3.4", "4.6.1.0", "1.9.99.15"), public addresses seldom do (1-9 are 9 of the about 220
# first octets in use), and a quad such as "203.0.113.7" after an ordinary word stays an address.
# - a network word earlier on its line makes it an address whatever else is there ("DNS 1.1.1.1",
#   "ping 8.8.8.8", "the version server is 1.2.3.4")
_NETWORK_WORD = re.compile(
    r"(?<![^\W\d_])(?:ip|ipv4|ips|address|addresses|addr|host|hosts|hostname|server|servers|dns|"
    r"nameserver|resolver|gateway|gw|route|router|ping|traceroute|proxy|peer|client|connect|"
    r"connected|connecting|connection|listen|listening|bind|subnet|netmask|inet|src|dst|lan|wan|"
    r"vpn|firewall|ssh|http|https|ftp|url|地址|ip地址|服务器|アドレス|サーバ)(?![^\W\d_])",
    re.IGNORECASE)
#   (a network word or a version word counts in its clause: after the last ". ", ";" or "。")
_CLAUSE_END = re.compile(r"[.!?;]\s|[;。！？；]")
# - a version word earlier in its clause, other words between ("Next version will be 4.1.4.1",
#   "the next release (4.1.5.1 expected)", "If upgrading from 2.4.1 or 2.4.1.1"), not a part of a
#   path ("read-pat/versions/1")
_VERSION_WORD = re.compile(
    r"(?<![^\W\d_]|/)(?:version|versions|release|released|releases|revision|upgrade|upgraded|"
    r"upgrading|update|updated|updating|bump|bumped|require|requires|required|depends|changelog|"
    r"版本|バージョン|버전)(?![^\W\d_])", re.IGNORECASE)
# - another dotted number of three parts or more on its line, before or after it: a line that
#   lists versions ("Require xproto 7.0.13, xextproto 7.0.3 and xlib 1.1.99.1", "FreeBSD 1.1.5.1,
#   2.0, 2.0.5", "1.21.0.1 should not satisfy a check for 1.22.0.")
_DOTTED3 = re.compile(r"(?<![\w.])\d+\.\d+\.\d+")
# - a name right before it: the X.org and BSD way of naming what has the version ("xlib
#   1.1.99.1", "inputproto 1.9.99.15", "FreeBSD 1.1.5.1", "HEIF 6.5.5.1"), not a small word of a
#   sentence, which an address follows as well ("at", "via"); with a bracket between, a file or
#   package name only (a dot, hyphen, underscore or digit in it: "thinp.h (1.1.1.1)", a CVS
#   revision), since prose puts an address in brackets after any word ("Alice (5.6.7.8)")
_NAME_BEFORE = re.compile(r"(?:^|\s)(\S*[^\W_])\s(\()?$")
_FILE_NAME = re.compile(r"[^\W_][._+-][^\W_]|\d")
_NOT_A_NAME = frozenset(
    "a an the at to from via on in into by is was are be of for and or with as if see use using "
    "call ring contact me us it its this that then than not no number über von nach an bei mit "
    "unter für und oder de du des le la les à au aux en par sur vers avec et ou".split())


_LINE_CHARS = 120


def _small_quad(quad: str) -> bool:
    return int(quad.split(".", 1)[0]) < 10


def _is_version(m: re.Match) -> bool:
    """Whether the dotted quad `m` is owned by a version context: a version word, a comparison or a
    package name right before it on the same line, or a Debian changelog header around it; or, for
    a quad whose first part is below 10, one of the weaker contexts above."""
    text, a, b = m.string, m.start(), m.end()
    line_start = text.rfind("\n", max(0, a - 40), a) + 1
    before = text[max(line_start, a - 40):a]
    if _VERSION_BEFORE.search(before) or _PACKAGE_BEFORE.search(before):
        return True
    if before.endswith("(") and _CHANGELOG_HEAD.match(text, b) is not None:
        return True
    if not _small_quad(m.group()):
        return False
    # the words before it count from the start of its clause ("... for connecting to it.  Require
    # renderproto 0.5.99.26": the sentence before says nothing of this number)
    clause = _CLAUSE_END.split(before)[-1]
    if _NETWORK_WORD.search(clause):
        return False
    if _VERSION_WORD.search(clause):
        return True
    name = _NAME_BEFORE.search(before)
    if name and name.group(1).lower() not in _NOT_A_NAME and (
            name.group(2) is None or _FILE_NAME.search(name.group(1))):
        return True
    # the line around it, at most _LINE_CHARS either side (a text without line breaks stays cheap)
    start = text.rfind("\n", max(0, a - _LINE_CHARS), a) + 1 or max(0, a - _LINE_CHARS)
    end = text.find("\n", b, b + _LINE_CHARS)
    end = min(len(text), b + _LINE_CHARS) if end < 0 else end
    if _NETWORK_WORD.search(text, start, a):
        return False
    return any(not (d.start() < b and a < d.end()) for d in _DOTTED3.finditer(text, start, end))


def _ipv4_ok(m: re.Match) -> bool:
    return not _is_version(m)


def _ipv6_ok(m: re.Match) -> bool:
    s = m.group()
    # without "::", ipaddress wants 8 groups (7 colons, or 6 before an IPv4 tail): saying no here
    # first spares the exception for the many clock times ("12:30:45") the pattern finds
    if "::" not in s and s.count(":") < 6:
        return False
    if len([g for g in re.split(r"[:.]", s) if g]) < 3:
        return False
    try:
        ipaddress.IPv6Address(s)
    except ValueError:
        return False
    return True


def _id_ok(m: re.Match) -> bool:
    return id_number_valid(m.group())


def card_valid(s: str) -> bool:
    """A card number as written (separators allowed): a network's prefix and length, and Luhn."""
    digits = s.replace(" ", "").replace("-", "")
    return card_network(digits) is not None and luhn_valid(digits)


# a card word right before a number (only separators and "number"/"no." between, on one line)
_CARD_WORDS = re.compile(
    r"(?:(?<![<]|[^\W\d_])(?:card|cards|creditcard|visa|mastercard|amex|jcb|discover|maestro|"
    r"kreditkarte|kreditkartennummer|karte|kartennummer|carte|tarjeta|cartão|carta)"
    r"|カード|クレジット|信用卡|银行卡|銀行卡|卡号|卡號|카드)" + r"(?:[ \t:：.=#(（-]|numbers?|no|nr|num|n°|nummer|numéro|"
    r"de|crédito|credit|番号|號碼|号码|は)" + r"{0,12}$", re.IGNORECASE)


def _card_spans(piece: str, before: str = "") -> list[tuple[int, int]]:
    """The card numbers in `piece`: a network's prefix, length and Luhn; or, after a card word
    ("card no.", "カード番号"), any Luhn-valid 13-19 digits, since networks are assigned new issuer
    ranges faster than a table is updated and a card word says what the number is."""
    spans = []
    for m in _CARD.finditer(piece):
        digits = m.group().replace(" ", "").replace("-", "")
        if card_valid(digits) or (13 <= len(digits) <= 19 and luhn_valid(digits)
                                  and _card_context(piece, m.start(), before)):
            spans.append(m.span())
    return spans


def _card_context(text: str, a: int, before: str) -> bool:
    text, a = _joined(text, a, before)
    return _CARD_WORDS.search(text, max(0, a - _CONTEXT_CHARS), a) is not None


# ------------------------------------------------------------------------------------- phones
_EXTENSION = re.compile(r" ?(?:x|ext\.?|#) ?\d{1,6}$")


# a group of one digit next to a dot: "9.11.12.13" is a version; dotted phone numbers are written
# in groups of 2-4 ("06.12.34.56.78", "821.246.2584")
_ONE_DIGIT_DOTTED = re.compile(r"(?<!\d)\d\.|\.\d(?!\d)")


def phone_valid(candidate: str, regions: tuple[str, ...]) -> bool:
    """Whether libphonenumber calls `candidate` a valid number: international (a "+", or an
    international prefix of one of the regions such as "00") or national in one of `regions`
    written as that region writes it (see _national_form). 7-17 digits before any extension.
    A "+" number needs only a length its country has (libphonenumber's
    "possible"): the numbering plan's gaps are no reason to keep it."""
    import phonenumbers
    main = _EXTENSION.sub("", candidate)
    digits = sum(c.isdigit() for c in main)
    if (not 7 <= digits <= 17 or _DATE.search(main) or _ONE_DIGIT_DOTTED.search(main)
            or _mixed_dots(main)):
        return False
    international = candidate.startswith(("+", "(+"))
    if not international and _nanp_grouped(main, regions):
        return True
    if _consecutive(phonenumbers.normalize_digits_only(main)):
        return False
    for region in ("ZZ",) if international else regions:
        if not international and not _length_possible(main, digits, region):
            continue   # spares the parse (most of the cost) for regions it cannot be from
        try:
            number = phonenumbers.parse(candidate, region, keep_raw_input=True)
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(number) and _national_form(number, main, region):
            return True
        if international and phonenumbers.is_possible_number(number):
            # "+1-836-345-3099", "+49 (0) 1333 427261": a country code and a length the
            # country has; nothing but a telephone number is written so
            return True
    return False


# The North American grouping, area code and exchange each NXX (N: 2-9), as the NANP writes its
# numbers: "(NXX)NXX-XXXX", "(NXX) NXX-XXXX", "NXX-NXX-XXXX", "NXX.NXX.XXXX", with "1-" or "001-"
# before or not. Nothing else is written so, so it is a telephone number where a NANP region is
# searched even when libphonenumber does not list its area code as assigned (as a "+1" number
# needs only a possible length). Ungrouped ten-digit runs are not: they read as order numbers.
_NANP = re.compile(r"(?:(?:1|001)[ .-])?(?:\([2-9]\d\d\) ?[2-9]\d\d-|[2-9]\d\d-[2-9]\d\d-|"
                   r"[2-9]\d\d\.[2-9]\d\d\.)\d{4}")
_NANP_REGIONS = frozenset(("US", "CA", "PR", "AG", "AI", "AS", "BB", "BM", "BS", "DM", "DO",
                           "GD", "GU", "JM", "KN", "KY", "LC", "MP", "MS", "SX", "TC", "TT",
                           "VC", "VG", "VI"))


def _nanp_grouped(main: str, regions: tuple[str, ...]) -> bool:
    return _NANP.fullmatch(main) is not None and not _NANP_REGIONS.isdisjoint(regions)


def _consecutive(digits: str) -> bool:
    """Nine digits or more in counting order, up or down ("0123456789", "1234567890",
    "987654321"): a sample, a ruler or a character class, not a telephone number."""
    return len(digits) >= 9 and (digits in "01234567890" or digits in "09876543210")


# ------------------------------------------------------------------------------ number contexts
# What the words right before a number say it is. A telephone word ("Tel.", "call", "电话") makes
# a number of phone shape a phone number even where libphonenumber calls it invalid (an unallocated
# area code: people and generators write such numbers, and they still are someone's number); an
# order, invoice or tracking word makes it no phone number even where it is valid ("订单号
# 15473442778"). Only separators and a few small words ("number", "no.", "号码", "は") may stand
# between the word and the number, on the same line. A Latin word has no letter right before it,
# and is no placeholder's "<PHONE>" (no "<" before it).
_CONNECT = (r"(?:[ \t:：.=#(（-]|numbers?|no|nr|num|n°|nummer|numéro|de|du|le|au|at|on|us|me|is|"
            r"unter|号码|號碼|番号|番號|は|为|為|是|号|號)")
_PHONE_WORDS = re.compile(
    r"(?:(?<![<]|[^\W\d_])(?:tel|tél|tele|telephone|téléphone|telefon|telefono|teléfono|telefonnummer|"
    r"rufnummer|fon|phone|ph|mobile|mobil|mob|handy|cell|cellphone|fax|call|ring|dial|sms|"
    r"whatsapp|appelez|appeler|appelle|portable|anrufen)"
    r"|电话|電話|手机|手機|座机|座機|传真|傳真|携帯|ケータイ|℡|☎|✆|📞)" + _CONNECT + r"{0,12}$",
    re.IGNORECASE)
_ORDER_WORDS = re.compile(
    r"(?:(?<![<]|[^\W\d_])(?:order|orders|invoice|inv|tracking|track|shipment|parcel|reference|ref|"
    r"booking|reservation|confirmation|transaction|txn|ticket|serial|sku|po|id|"
    r"bestellung|bestellnummer|auftrag|auftragsnummer|rechnung|rechnungsnummer|sendung|"
    r"sendungsnummer|kundennummer|commande|facture|suivi|colis|référence|dossier)"
    r"|订单|訂單|单号|單號|运单|運單|快递|快遞|发票|發票|流水号|交易号|编号|編號|"
    r"注文|伝票|追跡|請求書|受付|予約|問い合わせ|お問合せ)" + _CONNECT + r"{0,12}$",
    re.IGNORECASE)
_CONTEXT_CHARS = 40   # how far before a number its context word may start


def _joined(text: str, a: int, before: str) -> tuple[str, int]:
    """(the text up to a with `before` in front, a in it): where a number's context words are
    searched when `text` is a piece of a longer text that `before` precedes."""
    return (before + text[:a], len(before) + a) if before else (text, a)


def number_context(text: str, a: int, before: str = "") -> str:
    """"phone", "order" or "" (neither): what the words right before text[a:] say of a number
    there (`before`: the text that precedes `text`, if `text` is a piece of a longer one)."""
    text, a = _joined(text, a, before)
    start = max(0, a - _CONTEXT_CHARS)
    if _ORDER_WORDS.search(text, start, a):
        return "order"
    if _PHONE_WORDS.search(text, start, a):
        return "phone"
    return ""


def phone_shaped(candidate: str) -> bool:
    """Whether `candidate` has a telephone number's shape, valid or not: 7-15 digits before any
    extension, and no date, version or pair of decimals in it. A "+" number is left to
    phone_valid, which knows the country codes."""
    main = _EXTENSION.sub("", candidate)
    return (7 <= sum(c.isdigit() for c in main) <= 15 and not candidate.startswith(("+", "(+"))
            and not (_DATE.search(main) or _ONE_DIGIT_DOTTED.search(main) or _mixed_dots(main)))


class PhoneCheck:
    """phone_valid for fixed regions, remembering its answers. A corpus repeats the same digit
    strings (years, table rows, licence addresses) thousands of times, and libphonenumber's parse is
    most of the cost of a check. Held per worker by the PII step, bounded, and a pure function of the
    candidate either way: the same bytes with or without it."""

    def __init__(self, regions: tuple[str, ...], size: int = 1 << 16):
        self.regions, self._size = tuple(regions), size
        self._seen: dict[str, bool] = {}

    def __call__(self, candidate: str) -> bool:
        valid = self._seen.get(candidate)
        if valid is None:
            if len(self._seen) >= self._size:
                self._seen.clear()
            valid = self._seen[candidate] = phone_valid(candidate, self.regions)
        return valid


def _phone_check(phones) -> PhoneCheck:
    return phones if isinstance(phones, PhoneCheck) else PhoneCheck(phones)


@lru_cache(maxsize=None)
def _region_lengths(region: str) -> tuple[str, frozenset[int], tuple[str, ...]]:
    """(national prefix, possible national significant number lengths, international prefixes
    as digits) of a region, from phonenumbers' metadata."""
    import phonenumbers
    meta = phonenumbers.PhoneMetadata.metadata_for_region(region)
    idd = tuple(p for p in (meta.international_prefix or "").split("|") if p.isdigit())
    return (meta.national_prefix or "", frozenset(meta.general_desc.possible_length or ()),
            idd + ((meta.preferred_international_prefix,) if meta.preferred_international_prefix
                   and meta.preferred_international_prefix.isdigit() else ()))


def _length_possible(written: str, digits: int, region: str) -> bool:
    """Whether a number of `digits` digits written as `written` can be national in `region`
    (its length, with its national prefix or without, is one the region has) or can start with
    one of its international prefixes (then phonenumbers decides)."""
    prefix, lengths, idd = _region_lengths(region)
    head = "".join(c for c in written[:8] if c.isdigit())
    if any(head.startswith(p) for p in idd) or not lengths:
        return True
    return digits in lengths or (bool(prefix) and head.startswith(prefix)
                                 and digits - len(prefix) in lengths)


def _national_form(number, written: str, region: str) -> bool:
    """Whether a number read from `written` in `region` is written in international form ("+",
    or an international prefix: "001 415 555 0132" in China) or, read as national, with the
    digits of the region's national form, with or without the national prefix ("(415) 555-0132"
    and "1 415 555 0132"; "030 1234567"). libphonenumber itself also accepts national numbers
    whose national prefix is left out ("4711081542" reads as Hohhot's 0471 108 1542), which is
    what order numbers and counts look like."""
    import phonenumbers
    source = number.country_code_source
    if source == phonenumbers.CountryCodeSource.FROM_NUMBER_WITHOUT_PLUS_SIGN:
        # the country code written without "+" ("1 415 555 0132"): grouped, or it is any number
        # that starts with a country code ("8228680966", a millisecond timestamp)
        return not _UNBROKEN.fullmatch(written)
    if source != phonenumbers.CountryCodeSource.FROM_DEFAULT_COUNTRY:
        return True
    digits = phonenumbers.normalize_digits_only(written)
    bare = copy.copy(number)
    bare.extension = None
    national_form = phonenumbers.format_number(bare, phonenumbers.PhoneNumberFormat.NATIONAL)
    national = phonenumbers.normalize_digits_only(national_form)
    prefix = phonenumbers.PhoneMetadata.metadata_for_region(region).national_prefix or ""
    if digits not in (national, prefix + national):
        return False
    if prefix and _first_group_past_area_code(bare, written, prefix):
        return False
    if _UNBROKEN.fullmatch(written):
        # one unbroken run of digits without a national prefix is a phone number only as a mobile
        # number of 11 digits or more ("15341354926" in China): shorter runs, and other kinds of
        # number, read as order numbers and counts
        # (with the national prefix, 9 digits or more: 7-8 unbroken digits after a 0 are the
        # shortest German numbers, and far more often hashes and counts: "0294912")
        return bool(prefix) and digits.startswith(prefix) and len(digits) >= 9 or (
            len(digits) >= 11 and
            phonenumbers.number_type(number) == phonenumbers.PhoneNumberType.MOBILE)
    if not prefix:
        # where there is no national prefix (Hong Kong, Singapore) any 8 digits may be valid: the
        # groups as written must be those of the region's format ("2345 6789", not "23 456 789")
        return _group_ends(written) <= _group_ends(national_form)
    return True


def _mixed_dots(written: str) -> bool:
    """Dotted numbers use dots between every group ("06.12.34.56.78", "821.246.2584"); a dot beside
    another separator is a pair of decimals or a version and a count ("145.34 579.282")."""
    seps = re.findall(r"\d([ ./-])(?=\d)", written)
    if written.startswith("+"):
        seps = seps[1:]          # the one after the country code: "+33 6.12.34.56.78"
    return "." in seps and len(set(seps)) > 1


def _first_group_past_area_code(number, written: str, prefix: str) -> bool:
    """Whether the first group as written runs two digits or more past a geographic area code, or
    one digit that is the national prefix: groups that people write ("0207 946 0958" for London's
    020 7946 0958 runs one past) do not, but a US ZIP+4 does ("02110-1301": Düsseldorf's 0211 with
    01301, or Seoul's 02 with 110 1301, which libphonenumber's metadata both allow)."""
    import phonenumbers
    area = phonenumbers.length_of_geographical_area_code(number)
    groups = re.findall(r"\d+", written)
    if not area or len(groups) < 2:
        return False
    first = groups[0]
    past = first[(len(prefix) if first.startswith(prefix) else 0) + area:]
    return len(past) >= 2 or past.startswith(prefix)


_UNBROKEN = re.compile(r"\(?\d+\)?")


def _group_ends(s: str) -> set[int]:
    """The digit counts at which each group of digits of `s` ends."""
    ends, n = set(), 0
    for group in re.findall(r"\d+", s):
        n += len(group)
        ends.add(n)
    return ends


def _phone_spans(piece: str, check: PhoneCheck, before: str = "") -> list[tuple[int, int]]:
    """The phone numbers in `piece` (`before`: the text before it, for the contexts): each
    _PHONE candidate that is valid, or else its longest valid prefix that ends before a space
    ("0117 496 0842 2024": a number and a year), the rest tried again the same way. After a
    telephone word, or with an extension, a candidate of phone shape is a phone number, valid or
    not; after an order word none is."""
    spans = []
    pos = 0
    while True:
        m = _PHONE.search(piece, pos)
        if m is None:
            return spans
        a, b = m.span()
        if piece[a] == "(" and ")" not in m.group():
            a += 1   # a bracket around the whole number ("(736-679-4736)"), not an area code's
        context = number_context(piece, a, before)
        end = 0 if context == "order" else _longest_valid(piece, a, b, check)
        if not end and (context == "phone" or _EXTENSION.search(m.group())):
            # after a telephone word, or with an extension ("648-766-4270x12789"): a phone
            end = _longest_valid(piece, a, b, lambda c: phone_shaped(c) or check(c))
        if end:
            spans.append((a, end))
            pos = end
        else:
            nxt = piece.find(" ", a + 1, b)   # try again from the next group
            pos = nxt + 1 if nxt >= 0 else b


def _longest_valid(piece: str, a: int, b: int, check) -> int:
    """The end of the longest piece[a:end] that `check` accepts, with end == b or end at a space
    inside, whose ending passes _PHONE's lookahead; 0 when none."""
    ends = [b] + [i for i in range(b - 1, a, -1) if piece[i] == " " and piece[i - 1].isdigit()]
    for end in ends[:6]:
        cand = piece[a:end]
        if end != b and _PHONE.fullmatch(cand) is None:
            continue
        if check(cand):
            return end
    return 0


# ------------------------------------------------------------------------------------ redact
def _at_signs(text: str):
    i = text.find("@")
    while i >= 0:
        yield i
        i = text.find("@", i + 1)


# IPv4 addresses hold the shape \d.\d{1,3}.\d{1,3}.\d; searched from its first dot (a pattern that
# starts with a literal lets the engine skip to the dots at C speed)
_ANY_IPV4 = re.compile(r"\.(?<=\d\.)\d{1,3}\.\d{1,3}\.\d")
# an address ipaddress accepts holds "::" or, without it, 7 colons (6 before an IPv4 tail) with 1-4
# hex digits between them: clock times ("12:30:45") and "a: b" are no trigger
_IPV6_ANCHOR = re.compile(r":(?::|(?:[0-9A-Fa-f]{1,4}:){5})")


def _ipv4_anchors(text: str):
    """The first dot of each _ANY_IPV4 match: every IPv4 address holds the shape, and an occurrence
    of it that overlaps a match (finditer does not report it) is in the same token."""
    return (m.start() for m in _ANY_IPV4.finditer(text))


def _ipv6_anchors(text: str):
    # an IPv6 address holds "::" or three colons (found with at most three finds, not a count)
    i = text.find(":")
    j = text.find(":", i + 1) if i >= 0 else -1
    if j < 0 or (j != i + 1 and text.find(":", j + 1) < 0):
        return ()
    return (m.start() for m in _IPV6_ANCHOR.finditer(text, i))


# (kind, pattern, validator of the match, trigger positions): every match (that the validator
# accepts) shares a whitespace-free stretch with one of the trigger positions (e-mail addresses hold
# an @, IPv4 addresses the _ANY_IPV4 shape, IPv6 addresses an _IPV6_ANCHOR; none holds a space or a
# line break), so the stretches without one stay as they are
_TOKEN_RULES = (
    ("EMAIL", _EMAIL, None, _at_signs),
    ("IP", _IPV4, _ipv4_ok, _ipv4_anchors),
    ("IP", _IPV6, _ipv6_ok, _ipv6_anchors),
    ("IP", _IPV6_FULL, None, _ipv6_anchors),
)


def redact(text: str, phones: tuple[str, ...] | PhoneCheck = DEFAULT_PHONE_REGIONS
           ) -> tuple[str, dict[str, int]]:
    """(text with every match replaced by `<KIND>`, {kind: matches}) ({} when there is none).
    `phones`: the phone regions, or a PhoneCheck for them that a caller keeps across documents.

    The same result as substituting each kind over the whole text in turn (`plain_redact`), but
    each kind is searched only in the stretches where one of its matches can be."""
    counts: dict[str, int] = {}
    for kind, pattern, valid, where in _TOKEN_RULES:
        text = _sub_in_tokens(pattern, kind, valid, counts, text, where(text))
    windows = _number_windows(text)
    if windows:
        text = _sub_in_windows(text, windows, counts, _phone_check(phones))
    return text, counts


def _number_rules(phones: tuple[str, ...] | PhoneCheck):
    """(kind, function of a text, and of the text before it, giving the spans of its matches) of
    the number kinds, in order."""
    check = _phone_check(phones)
    def spans(pattern, valid):
        return lambda s, before="": [m.span() for m in pattern.finditer(s) if valid(m)]
    return (("ID_NUMBER", spans(_ID, _id_ok)), ("CARD", _card_spans),
            ("PHONE", lambda s, before="": _phone_spans(s, check, before)))


def _replace(text: str, spans: list[tuple[int, int]], kind: str, counts: dict[str, int]) -> str:
    if not spans:
        return text
    counts[kind] = counts.get(kind, 0) + len(spans)
    out, done = [], 0
    for a, b in spans:
        out += (text[done:a], f"<{kind}>")
        done = b
    out.append(text[done:])
    return "".join(out)


def plain_redact(text: str, phones: tuple[str, ...] | PhoneCheck = DEFAULT_PHONE_REGIONS
                 ) -> tuple[str, dict[str, int]]:
    """`redact` by its definition: each kind substituted over the whole text in turn. Slower (it
    searches everywhere); the tests check that `redact` gives the same."""
    counts: dict[str, int] = {}
    for kind, pattern, valid, _ in _TOKEN_RULES:
        text = _replace(text, [m.span() for m in pattern.finditer(text) if valid is None or valid(m)],
                        kind, counts)
    for kind, find in _number_rules(phones):
        text = _replace(text, find(text), kind, counts)
    return text, counts


# Where an ID, card or phone number can be. Every match of the three kinds is made of characters
# of S = digits and " .:()+/Xx#" and hyphen only (and "ext"), and holds 7 digits with at most 3
# characters of S between neighbours (the core). So a match lies inside a maximal run of S
# characters (letters "e", "t" of "ext" included, see below) that holds a core, and each kind's
# matches in the text are its matches in each such run, searched with the characters either side
# of the run in view (they are not in S, so no match holds them; no placeholder changes them).
#
# The runs are found on a one-byte-per-character sketch of the text, built at C speed: the UTF-8
# encoding with its continuation bytes deleted (so the sketch's offsets are the text's), each
# remaining byte mapped to "0" (a digit), "." (the rest of S) or "a" (not in S). A non-ASCII
# character is known here by its lead byte only: one whose lead byte also starts some non-ASCII
# digit (Arabic-Indic, Devanagari, fullwidth, ...; `\d` matches them) becomes "0". That only
# widens runs and adds cores, never loses one: a widened run is still bounded by characters
# outside S, and a spurious core only costs a search that finds nothing.
# the lead bytes of the UTF-8 encodings of the non-ASCII characters `\d` matches; the tests check
# them against every code point
_DIGIT_LEAD_BYTES = b"\xd9\xdb\xdf\xe0\xe1\xea\xef\xf0"


def _sketch_table() -> bytes:
    table = bytearray(b"a" * 256)
    for c in b"0123456789":
        table[c] = ord("0")
    for c in b" -.:()+/Xx#ext":
        table[c] = ord(".")
    for lead in _DIGIT_LEAD_BYTES:
        table[lead] = ord("0")
    return bytes(table)


_SKETCH = _sketch_table()
_UTF8_CONTINUATION = bytes(range(0x80, 0xC0))
_CORE = re.compile(rb"0(?:\.{0,3}0){6}")


def _number_windows(text: str) -> list[tuple[int, int]]:
    """[(start, end)] of each run of S characters (see above) that holds a core, in order."""
    sketch = text.encode("utf-8", "surrogatepass").translate(_SKETCH, _UTF8_CONTINUATION)
    windows = []
    m = _CORE.search(sketch)
    while m is not None:
        start = sketch.rfind(b"a", 0, m.start()) + 1
        end = sketch.find(b"a", m.end())
        if end < 0:
            end = len(sketch)
        windows.append((start, end))
        m = _CORE.search(sketch, end)
    return windows


def _sub_in_windows(text: str, windows: list[tuple[int, int]], counts: dict[str, int],
                    check: PhoneCheck) -> str:
    """The number kinds, one after the other, each as substitution over the whole text, where
    every match lies in one of the windows: each window is searched with one character of context
    on either side, which no match holds (see _number_windows)."""
    out, done = [], 0
    rules = _number_rules(check)
    for start, end in windows:
        a, b = max(start - 1, 0), end + 1
        piece = new = text[a:b]
        # the context words of a number (number_context) lie before it on its line, with nothing
        # of another window between: the text before the window shows them as the whole text does
        before = text[max(0, a - _CONTEXT_CHARS - 1):a]
        for kind, find in rules:
            new = _replace(new, find(new, before), kind, counts)
        if new != piece:   # the context characters are the same in both: keep the middle
            right = len(piece) - (start - a) - (end - start)
            out += (text[done:start], new[start - a:len(new) - right])
            done = end
    if not out:
        return text
    out.append(text[done:])
    return "".join(out)


def _sub_in_tokens(pattern: re.Pattern, kind: str, valid, counts: dict[str, int], text: str,
                   triggers) -> str:
    """pattern.sub over the text, each match (that `valid` accepts, if given) becoming `<KIND>`, for
    a pattern whose every match holds no space or line break and holds one of the (increasing)
    trigger positions: only the stretches between spaces and line breaks around the triggers are
    searched. The search of a stretch starts at its first character with the text before it still
    visible to a lookbehind, and ends one character after it, for a lookahead."""
    out, done, scanned, found = [], 0, 0, 0
    find, rfind, search, size = text.find, text.rfind, pattern.search, len(text)
    placeholder = f"<{kind}>"
    for i in triggers:
        if i < scanned:
            continue
        space = rfind(" ", scanned, i)
        lf = rfind("\n", space + 1 if space >= 0 else scanned, i)
        start = (lf if lf >= 0 else space if space >= 0 else scanned - 1) + 1
        scanned = find(" ", i)
        if scanned < 0:
            scanned = size
        lf = find("\n", i, scanned)
        if lf >= 0:
            scanned = lf
        m = search(text, start, scanned + 1)
        while m is not None:
            a, b = m.span()
            if valid is None or valid(m):
                out += (text[done:a], placeholder)
                done = b
                found += 1
            m = search(text, b, scanned + 1) if b < scanned else None
    if not found:
        return text
    counts[kind] = counts.get(kind, 0) + found
    out.append(text[done:])
    return "".join(out)
