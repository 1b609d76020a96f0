"""Text normalisation applied to every document before filtering, dedup and tokenizing.

`normalize` is pure and deterministic. In order:
1. surrogates: valid UTF-16 surrogate pairs are joined into their character, lone ones dropped;
2. leftover HTML: comments, <script>/<style> blocks and tags of known HTML elements are removed
   (block-level tags become line breaks); entities such as `&amp;` `&#20013;` are decoded. Only known
   element names count as tags, so `a<b and c>d` or `vector<int>` survive;
3. Unicode NFKC (full-width Latin letters, digits and symbols become ASCII, compatibility ideographs
   are unified), except that the full-width punctuation of Chinese text (，！？：；（）～) is kept:
   NFKC would turn it into ASCII, which is not how Chinese is written. Chinese characters and
   。、「」“” are untouched by NFKC anyway;
4. control characters out: C0/C1 controls except tab and newline, plus invisible format characters
   (zero-width space, BOM, soft hyphen, bidi overrides); line and paragraph separators, CR, form feed
   and vertical tab become newlines;
5. whitespace: runs of spaces and tabs become one space, lines are stripped, more than one blank line
   in a row becomes one, the whole text is stripped.

Speed (the steps above are the contract): an ASCII text takes steps 4 and 5's mapping of other
whitespace in one bytes.translate; any other text is scanned once for surrogates, invisible
characters and whitespace other than space and LF, and steps 1, 4 and that mapping run only where
the scan finds one (or NFKC changed the text). Runs of blanks are then collapsed by whole-text
calls. tests/dataprep/steps/test_clean_equivalence.py checks the result against the steps applied one by
one to every text.
"""
from __future__ import annotations

import html
import re
import unicodedata
from itertools import repeat

_SURROGATE = re.compile("[\ud800-\udfff]")
_ASCII_CONTROLS = bytes([*range(0x00, 0x09), *range(0x0E, 0x1C), 0x7F])
# the other ASCII whitespace, as step 5 maps it (CR apart: CRLF is one break)
_ASCII_MAP = bytes.maketrans(b"\x0b\x0c\x1c\x1d\x1e\t\x1f", b"\n\n\n\n\n  ")

# Element names from the HTML living standard (plus a few obsolete ones still common in scraped text).
_BLOCK_TAGS = ("address article aside blockquote body br center dd details dialog div dl dt fieldset "
               "figcaption figure footer form h1 h2 h3 h4 h5 h6 head header hr html li main nav ol p "
               "pre section summary table tbody td tfoot th thead title tr ul").split()
_INLINE_TAGS = ("a abbr acronym b bdi bdo big button caption cite code col colgroup data del dfn em "
                "font i iframe img input ins kbd label legend link map mark meta meter noscript "
                "object option output param picture progress q rp rt ruby s samp select small source "
                "span strike strong sub sup svg template textarea time tt u var video wbr").split()
_TAG_NAME = "|".join(sorted(_BLOCK_TAGS + _INLINE_TAGS, key=len, reverse=True))
_HTML_DROP = re.compile(r"<!--.*?-->|<(script|style)\b[^>]*>.*?</\1\s*>|<!DOCTYPE[^>]*>",
                        re.IGNORECASE | re.DOTALL)
_ATTRIBUTE = r"""\s+[A-Za-z_:][-\w:.]*(?:\s*=\s*(?:"[^"<>]*"|'[^'<>]*'|[^\s"'=<>`]+))?"""
_HTML_TAG = re.compile(rf"</?({_TAG_NAME})(?:{_ATTRIBUTE})*\s*/?>", re.IGNORECASE)
_BLOCK = frozenset(_BLOCK_TAGS)
_HTML_HINT = re.compile(r"<[!/A-Za-z]|&#?[0-9A-Za-z]+;")
_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")

# Chinese full-width punctuation rides through NFKC as noncharacters (removed from the input first).
_CJK_PUNCT = "\uff01\uff08\uff09\uff0c\uff1a\uff1b\uff1f\uff5e"
_PROTECT = [(c, chr(0xFDD0 + i)) for i, c in enumerate(_CJK_PUNCT)]
_NONCHARACTERS = re.compile("[\ufdd0-\ufdef]")
_INVISIBLE = re.compile("[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f"
                        "\u00ad\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f"
                        "\ufdd0-\ufdef\ufeff\ufff9-\ufffb\ufffe\uffff]")


def normalize(text: str) -> str:
    """The cleaned form of `text` (see the module docstring)."""
    if ("<" in text or "&" in text) and _HTML_HINT.search(text):
        text = strip_html(text)
    if text.isascii():  # ASCII: C0 controls and DEL out, other whitespace mapped, at C speed
        data = text.encode("ascii").translate(_ASCII_MAP, _ASCII_CONTROLS)
        if b"\r" in data:   # CRLF is one line break
            data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        text = data.decode("ascii")
    else:
        # One scan finds whether any of the rarer steps has work; most texts need none of them.
        special = _SPECIAL.search(text)
        if special and _SURROGATE.search(text):
            text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "ignore")
        if not unicodedata.is_normalized("NFKC", text):
            text = _nfkc_keeping_cjk_punctuation(text)
            special = True   # NFKC may make any of them (e.g. U+3000 becomes a space)
        if special:
            text = _map_whitespace(_INVISIBLE.sub("", text))
    if len(text) > _BLOCK_CHARS:   # bounded copies: block by block
        text = squeeze_whitespace(text)
        while "\n\n\n" in text:
            text = text.replace("\n\n\n", "\n\n")
        return text.strip("\n")
    return _collapse(text)


# Whitespace other than space and LF, the invisible characters, surrogates: where none is present
# (most texts) steps 1 and 4 and the mapping of whitespace have nothing to do.
_SPECIAL = re.compile("[\ud800-\udfff\t\r\x0b\x0c\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029"
                      "\u202f\u205f\u3000" + _INVISIBLE.pattern[1:])
_BLOCK_CHARS = 1 << 20
# A space run, and an LF next to a space or starting a run of three LFs ("\n" first: the search
# skips to each LF at C speed; " \n" in text and the like are several times slower).
_SPACES = re.compile("  +")
_LF_NEXT_TO_BLANK = re.compile("\n(?:(?<= \n)| |\n\n)")
_LFS = re.compile("\n\n\n+")


def _collapse(text: str) -> str:
    """Step 5 for a text whose only whitespace is space and LF: equal to squeeze_whitespace, then
    LF x 3 to LF x 2 until none is left, then strip("\n"). Every run of whitespace becomes one
    space if it holds no LF, one LF if it holds one, two if more, and nothing at either end."""
    if _LF_NEXT_TO_BLANK.search(text):
        # strip every line at C speed (map, no Python loop): indented text has a space run at
        # nearly every LF, which this removes in one pass
        text = "\n".join(map(str.strip, text.split("\n"), repeat(" ")))
        if "\n\n\n" in text:
            text = _LFS.sub("\n\n", text)
    if "  " in text:   # runs inside lines
        text = _SPACES.sub(" ", text)
    return text.strip(" \n")


def squeeze_whitespace(text: str, block: int = _BLOCK_CHARS) -> str:
    """Runs of whitespace inside each line become one space, lines are stripped and joined by LF:
    "\n".join(" ".join(line.split()) for line in text.splitlines()).

    splitlines() breaks at CR, CRLF, VT, FF, FS/GS/RS, NEL, LS and PS as well as LF. A long text is
    done in blocks of about `block` characters, each cut just after an LF: every block then ends
    with a whole line break, so its lines are exactly the text's lines there; this bounds the
    copies alive at once."""
    parts, start = [], 0
    while start < len(text):
        cut = text.find("\n", start + block)
        end = len(text) if cut < 0 else cut + 1
        parts.append(_squeeze(text[start:end]))
        start = end
    return "\n".join(parts)


# splitlines' line breaks other than LF (CRLF first: one break), and the other whitespace of
# str.split(); the ASCII ones come first
_BREAKS = ("\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")
_BLANKS = ("\t", "\x1f", "\xa0", "\u1680", *map(chr, range(0x2000, 0x200B)), "\u202f", "\u205f",
           "\u3000")
_ASCII_BREAKS, _ASCII_BLANKS = _BREAKS[:7], _BLANKS[:2]


def _map_whitespace(text: str) -> str:
    """Every line break of splitlines (CRLF as one) becomes LF, every other whitespace character a
    space."""
    ascii_only = text.isascii()
    for b in _ASCII_BREAKS if ascii_only else _BREAKS:
        if b in text:
            text = text.replace(b, "\n")
    for c in _ASCII_BLANKS if ascii_only else _BLANKS:
        if c in text:
            text = text.replace(c, " ")
    return text


def _squeeze(text: str) -> str:
    """squeeze_whitespace of one block, with whole-text str.replace calls instead of a split and
    a join per line (no Python object per line): every break becomes LF, the last one dropped (as
    splitlines does), every other whitespace character a space, runs of spaces one space, and
    spaces next to a line break or an end go."""
    text = _map_whitespace(text)
    if text.endswith("\n"):
        text = text[:-1]
    if "  " in text:
        text = _SPACES.sub(" ", text)
    if " \n" in text:
        text = text.replace(" \n", "\n")
    if "\n " in text:
        text = text.replace("\n ", "\n")
    return text.strip(" ")


def _nfkc_keeping_cjk_punctuation(text: str) -> str:
    present = [(c, p) for c, p in _PROTECT if c in text]
    if present:  # str.replace per character present: str.translate would visit every character
        text = _NONCHARACTERS.sub("", text)
        for c, p in present:
            text = text.replace(c, p)
    text = unicodedata.normalize("NFKC", text)
    for c, p in present:
        text = text.replace(p, c)
    return text


def strip_html(text: str) -> str:
    """Leftover HTML out: comments, scripts and styles dropped, known tags removed, entities decoded."""
    text = _HTML_DROP.sub("", text)
    text = _HTML_TAG.sub(_tag_replacement, text)
    return _ENTITY.sub(_entity_replacement, text)


def _tag_replacement(m: re.Match) -> str:
    return "\n" if m.group(1).lower() in _BLOCK else ""


def _entity_replacement(m: re.Match) -> str:
    decoded = html.unescape(m.group(0))
    # A code point that is not a character (e.g. &#0; or a surrogate) decodes to U+FFFD: drop it.
    return "" if decoded == "\ufffd" else decoded
