"""normalize: NFKC, control characters, surrogates, HTML, whitespace; Chinese kept intact."""
import json

import pytest

from mspretrain.dataprep.steps.clean import normalize, squeeze_whitespace

CHINESE = "机器学习是人工智能的一个分支。它研究计算机怎样模拟人类的学习行为，以获取新的知识或技能。"


def test_nfkc_turns_full_width_into_half_width():
    assert normalize("ＡＢＣ　ａｂｃ　１２３") == "ABC abc 123"
    assert normalize("ﬁle ① ㎏") == "file 1 kg"


def test_chinese_text_is_kept_intact():
    assert normalize(CHINESE) == CHINESE
    assert normalize("中文、日本語。「引号」") == "中文、日本語。「引号」"
    # Chinese full-width punctuation is kept (NFKC alone would make it ASCII); other full-width
    # symbols still become ASCII.
    assert normalize("你好，世界！（测试）？是：对；１～２") == "你好，世界！（测试）？是：对；1～2"
    assert normalize("ＡＢ＃＄％＆＋") == "AB#$%&+"
    assert normalize("\ufdd0x\ufdef") == "x"  # noncharacters do not turn into punctuation
    # A compatibility ideograph is unified with its standard form.
    assert normalize("\uf900") == "\u8c48"


def test_control_and_invisible_characters_are_removed():
    assert normalize("a\x00b\x07c\x1bd\x7fe\x9ff") == "abcdef"
    assert normalize("zero\u200bwidth\ufeff soft\u00adhyphen \u202eoverride") == (
        "zerowidth softhyphen override")
    # Joiners that scripts and emoji need stay.
    assert normalize("\U0001F468\u200d\U0001F469") == "\U0001F468\u200d\U0001F469"


def test_line_separators_become_newlines():
    assert normalize("a\r\nb\rc\x0bd\x0ce\u2028f\u2029g\x85h") == "a\nb\nc\nd\ne\nf\ng\nh"


def test_surrogates_pairs_joined_lone_ones_dropped():
    paired = json.loads('"smile \\ud83d\\ude00"')
    assert normalize(paired) == "smile \U0001F600"
    raw_pair = "x\ud83d\ude00y"  # a str holding the two halves, as from a surrogatepass decode
    assert normalize(raw_pair) == "x\U0001F600y"
    assert normalize("lone \ud800 high and \udfff low") == "lone high and low"
    assert normalize("\udc80中文") == "中文"


def test_html_tags_and_entities_are_stripped():
    html = ("<html><head><title>T</title><style>p {color: red}</style></head><body>"
            "<!-- a comment --><p>Hello&nbsp;<b>world</b> &amp; friends&#33;</p>"
            "<script>var x = 1 < 2;</script><div>中文&#20013;&#x6587;</div></body></html>")
    assert normalize(html) == "T\n\nHello world & friends!\n\n中文中文"
    assert normalize("&lt;p&gt; is a tag") == "<p> is a tag"


def test_text_that_only_looks_like_html_survives():
    for text in ["if a<b && c>d then", "std::vector<int> v;", "AT&T and R&D", "x &= y;",
                 "<unknown-element> stays", "a <= b >= c"]:
        assert normalize(text) == text


def test_whitespace_is_normalised():
    text = "  lead\t\tand   inner  \ntrail   \n\n\n\n\nnext para \t\n\n  \n\n last  "
    assert normalize(text) == "lead and inner\ntrail\n\nnext para\n\nlast"
    assert normalize("\u3000\u3000中文段落缩进。\u00a0") == "中文段落缩进。"
    assert normalize(" \n\t\n ") == ""


@pytest.mark.parametrize("text", [
    CHINESE, "ＡＢＣ<p>x&amp;y</p>\r\n\n\n z", "a\ud800b\u200b c", "   ", "Ünïcödé\u0301 ｔｅｘｔ"])
def test_normalize_is_idempotent_and_deterministic(text):
    once = normalize(text)
    assert normalize(once) == once
    assert normalize(text) == once


def test_long_text_squeezed_in_blocks_equals_the_whole_text_at_once():
    """Blocks are cut just after an LF; every kind of line break, CRLF split or not, empty lines and
    a text ending with or without a break must give what one pass over the whole text gives."""
    import random
    rng = random.Random(7)
    pieces = ["word", "  ", "\r\n", "\n\n", "中文", "x y", "\u200b"] + [   # every whitespace character
        chr(cp) for cp in range(0x3001) if chr(cp).isspace()]
    for trial in range(3000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 60)))
        whole = "\n".join([" ".join(line.split()) for line in text.splitlines()])
        for block in (1, 2, 3, 5, 8, 1 << 20):
            assert squeeze_whitespace(text, block) == whole, (trial, block, text)
