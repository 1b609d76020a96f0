"""Personal data in documents: find it, then redact it (the default), drop the document, or keep it.

Kinds, checked in this order (an earlier kind's placeholder is never matched by a later one):

- EMAIL       `name@host.tld`
- IP          IPv4 (four octets 0-255) and IPv6 (validated by `ipaddress`, at least three groups)
- ID_NUMBER   Chinese resident identity numbers: 18 characters, a valid birth date, and the
              ISO 7064 MOD 11-2 check character
- CARD        bank card numbers: 13-19 digits (optionally in groups of 4 separated by a space or a
              hyphen), a known issuer prefix and a valid Luhn checksum
- PHONE       mainland China mobile numbers (1[3-9] and 9 digits, optionally +86 and 3-4-4 groups)
              and international numbers written with a leading `+country code`, plus the North
              American `(555) 123-4567` / `555-123-4567` forms

A match becomes a placeholder `<KIND>`. False positives are kept low by requiring the shape and a
checksum where one exists, and by refusing a digit, letter or dot right next to a match: version
strings (`2.10.0`, `1.2.3.4-rc1`), dates, hashes and ordinary numbers survive.
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

KINDS = ("EMAIL", "IP", "ID_NUMBER", "CARD", "PHONE")
ACTIONS = ("redact", "drop", "keep")


@dataclass(frozen=True)
class PiiConfig:
    action: str = "redact"        # redact | drop | keep (keep still counts what it finds)

    def __post_init__(self):
        if self.action not in ACTIONS:
            raise ValueError(f"pii.action must be one of {', '.join(ACTIONS)}, got {self.action!r}")


_EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
                    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,}(?![\w-])")
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
# no digit, letter or dot around: "1.2.3.4.5", "v1.2.3.4" and "1.2.3.4-rc1" are versions
_IPV4 = re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?![\w-]|\.\w)")
_IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{0,4}|"
                   r"\d{1,3}(?:\.\d{1,3}){3})(?![\w:])")
# The number patterns begin with the character class of their first character and check the
# character before it with a lookbehind over both ("[1-9](?<![\w.-][1-9])" is "(?<![\w.-])[1-9]"):
# a pattern that starts with a class lets the regex engine skip to candidate characters at C speed
# instead of trying the whole pattern at every position (3-5x faster on text with numbers).
_ID = re.compile(r"[1-9](?<![\w.-][1-9])\d{5}(?:18|19|20)\d{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12]\d|3[01])"
                 r"\d{3}[\dXx](?![\w-]|\.\w)")
# 13-19 digits, or groups of 4 separated by a space or a hyphen
_CARD = re.compile(r"\d(?<![\w.-]\d)(?:\d{3}[ -](?:\d{4}[ -]){1,2}\d{4}(?:\d{1,3})?|\d{12,18})"
                   r"(?![\w-]|\.\w)")
# after the first character (checked again by a lookbehind on it), in this order: mainland China
# mobile with +86, without it, +CC international, North American (555) 123-4567 and 555-123-4567
_PHONE = re.compile(
    r"[\d+(](?<![\w.+-][\d+(])(?:"
    r"(?<=\+)86[ -]?1[3-9]\d(?:\d{8}|[ -]\d{4}[ -]\d{4})"
    r"|(?<=1)[3-9]\d(?:\d{8}|[ -]\d{4}[ -]\d{4})"
    r"|(?<=\+)\d{1,3}(?:[ .-]?\(?\d{1,4}\)?)(?:[ .-]?\d{2,4}){2,4}"
    r"|(?<=\()\d{3}\) ?\d{3}-\d{4}|(?<=\d)\d{2}-\d{3}-\d{4}"
    r")(?![\w-]|\.\w)")
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_ID_CHECK = "10X98765432"
_CARD_PREFIX = re.compile(r"4|5[1-5]|2[2-7]|3[47]|6(?:011|5|2)|35")


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


def _ipv6_ok(s: str) -> bool:
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


def _card_ok(s: str) -> bool:
    digits = s.replace(" ", "").replace("-", "")
    return 13 <= len(digits) <= 19 and bool(_CARD_PREFIX.match(digits)) and luhn_valid(digits)


# IPv4 addresses hold the shape \d.\d{1,3}.\d{1,3}.\d; searched from its first dot (a pattern that
# starts with a literal lets the engine skip to the dots at C speed, 10x faster than trying \d at
# every position), it is found in most texts nowhere
_ANY_IPV4 = re.compile(r"\.(?<=\d\.)\d{1,3}\.\d{1,3}\.\d")
_MAYBE_NUMBER = re.compile(r"\d(?:[ ().-]{0,2}\d){6}")   # ID, card and phone: 7+ digits
# an address ipaddress accepts holds "::" or, without it, 7 colons (6 before an IPv4 tail) with 1-4
# hex digits between them: clock times ("12:30:45") and "a: b" are no trigger (the pattern still
# finds them in a stretch that has one, as whole-text substitution would)
_IPV6_ANCHOR = re.compile(r":(?::|(?:[0-9A-Fa-f]{1,4}:){5})")


def _at_signs(text: str):
    i = text.find("@")
    while i >= 0:
        yield i
        i = text.find("@", i + 1)


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


# (kind, pattern, validator, trigger positions): every match (that the validator accepts) shares a
# whitespace-free stretch with one of the trigger positions (e-mail addresses hold an @, IPv4
# addresses the _ANY_IPV4 shape, IPv6 addresses an _IPV6_ANCHOR; none holds a space or a line
# break), so the stretches without one stay as they are
_TOKEN_RULES = (
    ("EMAIL", _EMAIL, None, _at_signs),
    ("IP", _IPV4, None, _ipv4_anchors),
    ("IP", _IPV6, _ipv6_ok, _ipv6_anchors),
)
# ID, card and phone numbers, which may hold spaces, run only when the text (before the e-mail and
# IP placeholders) has 7 digits close together (_MAYBE_NUMBER); (kind, pattern, validator, the
# fewest digits of a valid match)
_NUMBER_RULES = (
    ("ID_NUMBER", _ID, id_number_valid, 17),
    ("CARD", _CARD, _card_ok, 13),
    ("PHONE", _PHONE, None, 6),
)


def redact(text: str) -> tuple[str, dict[str, int]]:
    """(text with every match replaced by `<KIND>`, {kind: matches}) ({} when there is none).

    The same result as `pattern.sub` over the whole text for each kind in turn (the number kinds
    only when _MAYBE_NUMBER finds something in the text as given), but each pattern searches only
    the stretches where one of its matches can be."""
    counts: dict[str, int] = {}
    original = text
    for kind, pattern, valid, where in _TOKEN_RULES:
        text = _sub_in_tokens(pattern, kind, valid, counts, text, where(text))
    windows, seven_digits = _number_windows(text)
    if windows and (seven_digits or _MAYBE_NUMBER.search(original) is not None):
        text = _sub_in_windows(text, windows, counts)
    return text, counts


def _replacer(kind: str, valid, counts: dict[str, int]):
    """The `repl` of `pattern.sub` for a kind: its placeholder, counted, where `valid` agrees."""
    placeholder = f"<{kind}>"

    def repl(m: re.Match) -> str:
        if valid is not None and not valid(m.group(0)):
            return m.group(0)
        counts[kind] = counts.get(kind, 0) + 1
        return placeholder
    return repl


# Where an ID, card or phone number can be. Every match of the three patterns is made of
# characters of S = digits and " .()+Xx-" only, and holds one of three cores: 11 digits in a row
# (ID, card, mobile), 3 digits, a space or hyphen and 4 digits (grouped card and mobile numbers, all
# North American forms), or "+" and a digit (+86, +CC). So a match lies inside a maximal run of S
# characters that holds a core, and a pattern's matches in the text are its matches in each such
# run, searched with the characters either side of the run in view (they are not in S, so no match
# holds them, and none of the three kinds' placeholders changes them).
#
# The runs are found on a one-byte-per-character sketch of the text, built at C speed: the UTF-8
# encoding with its continuation bytes deleted (so the sketch's offsets are the text's), each
# remaining byte mapped to "0" (a digit), " " (space or hyphen), "+", "." (the rest of S) or "a"
# (not in S). A non-ASCII character is known here by its lead byte only: one whose lead byte also
# starts some non-ASCII digit (Arabic-Indic, Devanagari, fullwidth, ...; `\d` matches them) becomes
# "0". That only widens runs and adds cores, never loses one: a widened run is still bounded by
# characters outside S, and a spurious core only costs a search that finds nothing.
# the lead bytes of the UTF-8 encodings of the non-ASCII characters `\d` matches (Arabic-Indic,
# N'Ko, the Indic and Southeast Asian scripts, Vai and others, fullwidth, and beyond U+FFFF); the
# tests check them against every code point
_DIGIT_LEAD_BYTES = b"\xd9\xdb\xdf\xe0\xe1\xea\xef\xf0"


def _sketch_table() -> bytes:
    table = bytearray(b"a" * 256)
    for c in b"0123456789":
        table[c] = ord("0")
    for c in b" -":
        table[c] = ord(" ")
    for c in b".()Xx":
        table[c] = ord(".")
    table[ord("+")] = ord("+")
    for lead in _DIGIT_LEAD_BYTES:
        table[lead] = ord("0")
    return bytes(table)


_SKETCH = _sketch_table()
_UTF8_CONTINUATION = bytes(range(0x80, 0xC0))
_DIGIT_CORES = (b"000 0000", b"0" * 11)
# "+" and a digit, from which the match (+86 or +CC, no + inside) has at least 6 digits: timezone
# offsets ("+0100") and tables ("+----+") are ruled out here, at C speed, and the search for the
# literal "+0" is fast
_PLUS_CORE = re.compile(rb"\+0(?:[ .+]*0){5}")


def _number_windows(text: str) -> tuple[list[tuple[int, int, int]], bool]:
    """([(start, end, digits in the sketch)] of each run of S characters (see above) that holds a
    core, in order; True when one of the cores is made of ASCII digits, which says that the text
    had 7 digits close together before the e-mail and IP placeholders went in, as no placeholder
    holds a character of S)."""
    sketch = text.encode("utf-8", "surrogatepass").translate(_SKETCH, _UTF8_CONTINUATION)
    ends = {}   # end of a run -> a core in it
    for core in _DIGIT_CORES:
        i = sketch.find(core)
        while i >= 0:
            end = sketch.find(b"a", i)
            if end < 0:
                end = len(sketch)
            ends.setdefault(end, i)
            i = sketch.find(core, end)
    seven_digits = bool(ends) and text.isascii()
    for m in _PLUS_CORE.finditer(sketch):
        end = sketch.find(b"a", m.end())
        ends.setdefault(end if end >= 0 else len(sketch), m.start())
    windows = []
    for end in sorted(ends):
        start = sketch.rfind(b"a", 0, ends[end]) + 1
        windows.append((start, end, sketch.count(b"0", start, end)))
    return windows, seven_digits


def _sub_in_windows(text: str, windows: list[tuple[int, int, int]], counts: dict[str, int]) -> str:
    """The number kinds, one after the other, each as `pattern.sub` over the whole text, where
    every match lies in one of the windows: each window is searched with one character of context
    on either side, which no match holds (see _number_windows). A kind whose valid matches have
    more digits than a window is not searched there: it would change nothing."""
    out, done = [], 0
    repls = [(pattern, _replacer(kind, valid, counts), least)
             for kind, pattern, valid, least in _NUMBER_RULES]
    for start, end, digits in windows:
        a, b = max(start - 1, 0), end + 1
        piece = text[a:b]
        new = piece
        for pattern, repl, least in repls:
            if digits >= least:
                new = pattern.sub(repl, new)
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
            if valid is None or valid(m.group()):
                out += (text[done:a], placeholder)
                done = b
                found += 1
            m = search(text, b, scanned + 1) if b < scanned else None
    if not found:
        return text
    counts[kind] = counts.get(kind, 0) + found
    out.append(text[done:])
    return "".join(out)
