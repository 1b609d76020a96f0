"""Rebuild demo/corpus/ from its sources (see demo/README.md). Not needed to run the demo: the corpus
is committed. Needs the two Debian packages unpacked somewhere, e.g.

    apt-get download debian-reference-en debian-reference-zh-cn
    for f in debian-reference-*.deb; do dpkg-deb -x "$f" /tmp/debref; done
    python demo/make_corpus.py /tmp/debref /usr/share/common-licenses

Outputs (deterministic bytes for the same sources):
  debian-reference.en.txt.gz, debian-reference.zh-cn.txt.gz   the packages' plain-text editions, as is
  debian-reference-html.jsonl.zst   every <p> of chapters 1-2 of the HTML editions, one record each
                                    (so these paragraphs appear twice in the corpus: natural near
                                    duplicates of the plain-text paragraphs, differing in line breaks)
  licenses/<NAME>.txt.zst           GNU licence texts (versions of one another: natural near duplicates)
"""
from __future__ import annotations

import json
import shutil
import sys
from html.parser import HTMLParser
from pathlib import Path

import zstandard

LICENSES = ("GPL-2", "GPL-3", "LGPL-2", "LGPL-2.1", "LGPL-3", "GFDL-1.2", "GFDL-1.3")
CHAPTERS = ("ch01", "ch02")
LANGS = ("en", "zh-cn")


class Paragraphs(HTMLParser):
    """Text of every <p> element, nested inline markup flattened."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth, self.parts, self.found = 0, [], []

    def handle_starttag(self, tag, attrs):
        if tag == "p":
            self.depth += 1

    def handle_endtag(self, tag):
        if tag == "p" and self.depth:
            self.depth -= 1
            if not self.depth:
                text = " ".join("".join(self.parts).split())
                if text:
                    self.found.append(text)
                self.parts = []

    def handle_data(self, data):
        if self.depth:
            self.parts.append(data)


def main(debref: Path, licenses: Path, out: Path) -> None:
    share = debref / "usr/share/debian-reference"
    out.mkdir(parents=True, exist_ok=True)
    for lang in LANGS:
        shutil.copyfile(share / f"debian-reference.{lang}.txt.gz",
                        out / f"debian-reference.{lang}.txt.gz")
    records = []
    for lang in LANGS:
        for ch in CHAPTERS:
            parser = Paragraphs()
            parser.feed((share / f"{ch}.{lang}.html").read_text(encoding="utf-8"))
            records += [{"id": f"{ch}.{lang}.html#p{i}", "lang": lang, "text": t}
                        for i, t in enumerate(parser.found, 1)]
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    _write_zst(out / "debian-reference-html.jsonl.zst", data)
    for name in LICENSES:
        _write_zst(out / "licenses" / f"{name}.txt.zst", (licenses / name).read_bytes())
    print(f"{len(records)} html paragraphs, {len(LICENSES)} licences -> {out}")


def _write_zst(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zstandard.ZstdCompressor(level=19).compress(data))


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(__file__).parent / "corpus")
