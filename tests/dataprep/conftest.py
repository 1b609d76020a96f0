"""Shared fixtures for the dataprep pipeline tests: a small real corpus cut from the demo corpus
(Debian Reference in English and Chinese, GNU licence texts: real text with natural exact and near
duplicates) in four formats, and helpers that run `dataprep build` and compare dataset directories."""
from __future__ import annotations

import gzip
import io
import json
import shutil
from pathlib import Path

import pytest
import zstandard

from dataprep.cli import main as dataprep_main

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo" / "corpus"

# Small on purpose: seq 64, vocab 1200 at coverage 0.995; every test build takes a few seconds.
TEST_SETTINGS = ["--seq-length", "64", "--vocab-size", "1200", "--valid-fraction", "0.1",
                 "--set", "tokenizer.character_coverage=0.995", "--set", "tokenizer.num_threads=1",
                 "--set", "input.text_unit=paragraph", "--set", "run.chunk_bytes=16KiB",
                 "--no-progress"]


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


def run_build(inputs, out, *extra: str) -> int:
    """`dataprep build` in this process, with the small test settings; returns the exit code."""
    return dataprep_main(["build", *map(str, inputs), "--out", str(out), *TEST_SETTINGS, *extra])


@pytest.fixture(scope="session")
def reference(corpus, tmp_path_factory) -> Path:
    """One uninterrupted build with --workers 1: the bytes the other builds must reproduce."""
    out = tmp_path_factory.mktemp("ref") / "data"
    assert run_build([corpus], out, "--workers", "1") == 0
    return out


def dataset_bytes(root: Path) -> dict[str, bytes]:
    """Every file of a dataset dir except report.* (which holds timings), by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in ("report.json", "report.md")}


def tree_snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}
