"""normalize written the straightforward way, as the oracle of test_clean_equivalence: every step
of the dataprep.clean docstring applied to every text (no ASCII path, no scan that skips steps),
whitespace squeezed line by line with splitlines, split and join. The fast normalize must return
exactly what this one returns. The HTML and NFKC helpers are dataprep.clean's own: the fast paths
under test do not touch them."""
from __future__ import annotations

import unicodedata

from mspretrain.dataprep.steps.clean import _HTML_HINT, _INVISIBLE, _nfkc_keeping_cjk_punctuation, strip_html


def normalize(text: str) -> str:
    if _HTML_HINT.search(text):
        text = strip_html(text)
    text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "ignore")
    if not unicodedata.is_normalized("NFKC", text):
        text = _nfkc_keeping_cjk_punctuation(text)
    text = _INVISIBLE.sub("", text)
    text = "\n".join(" ".join(line.split()) for line in text.splitlines())
    while "\n\n\n" in text:
        text = text.replace("\n\n\n", "\n\n")
    return text.strip("\n")
