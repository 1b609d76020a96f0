"""Shared fixtures for the dataprep pipeline tests: a small real corpus cut from the demo corpus
(Debian Reference in English and Chinese, GNU licence texts: real text with natural exact and near
duplicates) in four formats, and the reference build (helpers: dataprep_helpers.py)."""
from __future__ import annotations

import gzip
import io
import json
import shutil
from pathlib import Path

import pytest
import zstandard

from dataprep_helpers import DEMO, run_build


def _zst(path: Path) -> bytes:
    return zstandard.ZstdDecompressor().stream_reader(io.BytesIO(path.read_bytes())).read()


def _paragraphs(text: str, start: int, limit: int) -> str:
    """Whole blank-line paragraphs from byte `start` on, up to about `limit` characters."""
    paras = text[start:].split("\n\n")[1:]
    out, size = [], 0
    for p in paras:
        if size > limit:
            break
        out.append(p)
        size += len(p) + 2
    return "\n\n".join(out) + "\n"


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """~250 KB of real text: en .txt, zh .txt.gz, html paragraphs .jsonl.zst, two licences .txt.zst."""
    root = tmp_path_factory.mktemp("corpus")
    en = gzip.decompress((DEMO / "debian-reference.en.txt.gz").read_bytes()).decode()
    zh = gzip.decompress((DEMO / "debian-reference.zh-cn.txt.gz").read_bytes()).decode()
    (root / "en.txt").write_text(_paragraphs(en, 40_000, 60_000))
    (root / "zh.txt.gz").write_bytes(gzip.compress(_paragraphs(zh, 40_000, 45_000).encode(), mtime=0))
    records = [json.loads(line) for line in _zst(DEMO / "debian-reference-html.jsonl.zst").splitlines()]
    chosen = [r for r in records if r["id"].startswith("ch01.")][:400]
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in chosen).encode()
    (root / "html.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    lic = root / "licenses"
    lic.mkdir()
    for name in ("LGPL-2", "LGPL-2.1"):
        shutil.copyfile(DEMO / "licenses" / f"{name}.txt.zst", lic / f"{name}.txt.zst")
    return root


@pytest.fixture(scope="session")
def reference(corpus, tmp_path_factory) -> Path:
    """One uninterrupted build with --workers 1: the bytes the other builds must reproduce."""
    out = tmp_path_factory.mktemp("ref") / "data"
    assert run_build([corpus], out, "--workers", "1") == 0
    return out
