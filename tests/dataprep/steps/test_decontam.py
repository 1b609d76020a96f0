"""Decontamination: the n-gram index of evaluation texts, drop and cut, and builds from which the
planted evaluation passages are gone."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dataprep_helpers import run_build
from mspretrain.dataprep.steps.decontam import DecontamError, EvalIndex, cut, read_items, units
from real_text import decoded_samples, write_corpus


def _flat(s: str) -> str:
    return " ".join(s.split())


def test_word_and_character_ngrams_match_and_cut_keeps_the_rest():
    en = ("The quick brown fox jumps over the lazy dog while the five boxing wizards jump quickly "
          "and a wizard's job is to vex chumps quickly in fog")
    zh = "天地玄黄宇宙洪荒日月盈昃辰宿列张寒来暑往秋收冬藏"
    index = EvalIndex([("eval.jsonl:1", en), ("eval.jsonl:2", zh)], 13)
    doc = "Intro line.\n" + en.upper() + "\nOutro line."   # case does not matter
    items, spans = index.find(doc)
    assert items == [0] and cut(doc, spans) == "Intro line.\n\nOutro line."
    items, spans = index.find("前言。" + zh[2:17] + "。后记")   # 15 characters: 3 windows of 13
    assert items == [1] and cut("前言。" + zh[2:17] + "。后记", spans) == "前言。。后记"
    assert index.find("前言。" + zh[2:14] + "。后记") == ([], [])   # 12 characters: no window
    # 12 of 13 words in order is no match
    assert index.find(" ".join(en.split()[:12]) + " cat")[0] == []


def test_the_fast_pre_check_never_hides_a_match(monkeypatch):
    """find() rules most windows out with a bitmap of the known units first; on real text in many
    languages with evaluation passages planted whole, cut short, re-cased and re-spaced, it must
    give what the search without it gives."""
    import random

    from real_text import man_texts
    rng = random.Random(11)
    en = [t for _, t in man_texts("en", 30, min_chars=600, seed=21)]
    evals = [t[100:400] for t in en[:15]] + ["天地玄黄宇宙洪荒日月盈昃辰宿列张寒来暑往秋收冬藏"]
    index = EvalIndex([(f"e:{i}", t) for i, t in enumerate(evals)], 13)
    docs = en[15:] + [t for lang in ("de", "ja", "zh_CN", "ru") for _, t in man_texts(lang, 5)]
    for i in range(60):
        host, passage = rng.choice(docs), rng.choice(evals)
        words = passage.split()
        k = rng.randint(min(8, len(words)), len(words))
        piece = " ".join(words[:k])
        piece = rng.choice([piece, piece.upper(), piece.replace(" ", "\n"), piece + "，"])
        at = rng.randrange(len(host))
        docs.append(host[:at] + piece + host[at:])
    for i in range(10):   # exactly one window's worth of units, in text of other scripts
        host = docs[15 + i]
        piece = " ".join(units(evals[i])[:13])
        docs.append(host[:200] + " " + piece + " " + host[200:])
    fast = [index.find(d) for d in docs]
    from mspretrain.dataprep.steps.decontam import _Bitmap
    monkeypatch.setattr(_Bitmap, "has", lambda self, hashes: np.ones(len(hashes), bool))
    exact = [index.find(d) for d in docs]
    assert fast == exact
    assert sum(bool(items) for items, _ in exact) > 30   # the planted passages are found


def test_a_short_item_is_one_ngram_of_all_its_units():
    index = EvalIndex([("e:1", "What is two plus two?")], 13)
    assert index.find("Q: what is two plus two? A: four")[0] == [0]
    assert index.find("what is two plus three")[0] == []


def test_bad_evaluation_file_names_the_line(tmp_path):
    bad = tmp_path / "eval.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": "no text"}\n')
    with pytest.raises(DecontamError, match=r"eval.jsonl:2: no string field 'text'"):
        read_items(str(bad))
    bad.write_text('{"text": "fine"}\nnot json\n')
    with pytest.raises(DecontamError, match=r"eval.jsonl:2: not JSON"):
        read_items(str(bad))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("decontam-corpus")
    planted = write_corpus(root / "in")
    evals = root / "eval.jsonl"
    evals.write_text("".join(json.dumps({"text": p}, ensure_ascii=False) + "\n"
                             for p in planted["passages"]))
    return root / "in", evals, planted


def _present(text: str, passages: list[str]) -> int:
    """How many passages have a 60-character piece in `text`."""
    return sum(_flat(p)[100:160] in text for p in passages)


def test_planted_passages_reach_the_samples_without_decontamination(corpus, tmp_path):
    root, _, planted = corpus
    assert run_build([root], tmp_path / "data") == 0
    assert _present(_flat(decoded_samples(tmp_path / "data")), planted["passages"]) == \
        len(planted["passages"])


@pytest.mark.parametrize("action", ["drop", "cut"])
def test_planted_passages_are_gone(corpus, tmp_path, action):
    root, evals, planted = corpus
    out = tmp_path / "data"
    assert run_build([root], out, "--decontaminate", str(evals),
                     "--set", f"decontam.action={action}") == 0
    text = _flat(decoded_samples(out))
    assert _present(text, planted["passages"]) == 0
    report = json.loads((out / "report.json").read_text())
    matched = {item for item, _ in report["decontam"]["matches"]}
    assert matched == {f"eval.jsonl:{i}" for i in range(1, len(planted["passages"]) + 1)}
    docs = {doc for _, doc in report["decontam"]["matches"]}
    assert {f"en-zh-{i}" for i in range(12, 12 + len(planted["passages"]))} <= docs
    removed = report["stages"]["filter"]["removed_by"]["decontam"]["docs"]
    if action == "drop":
        assert removed == len(docs)
    else:   # the rest of those documents is still there
        assert removed == 0 and report["decontam"]["docs_cut"] == len(docs)
    assert "| eval.jsonl:1 |" in (out / "report.md").read_text()
    m = json.loads((out / "manifest.json").read_text())
    assert m["config"]["decontam"]["files"][0]["file"] == "eval.jsonl"
    assert len(m["config"]["decontam"]["files"][0]["sha256"]) == 64


def test_a_missing_evaluation_file_is_a_config_error_exit_2(corpus, tmp_path, capsys):
    root, _, _ = corpus
    assert run_build([root], tmp_path / "data", "--decontaminate", str(tmp_path / "nope.jsonl")) == 2
    assert "decontam.files" in capsys.readouterr().err


@pytest.mark.slow
def test_all_stages_on_same_bytes_for_any_workers_and_after_sigkill(corpus, tmp_path):
    """Language filter, PII, decontamination (cut): --workers 1, --workers 3, and a --workers 1
    build killed with SIGKILL in stage 1 and rerun all write the same bytes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from dataprep_helpers import REPO, TEST_SETTINGS, dataset_bytes
    root, evals, _ = corpus
    stages = ["--decontaminate", str(evals), "--set", "decontam.action=cut",
              "--set", "filters.languages=[zh, en]", "--set", "run.chunk_bytes=4KiB"]
    assert run_build([root], tmp_path / "w1", "--workers", "1", *stages) == 0
    assert run_build([root], tmp_path / "w3", "--workers", "3", *stages) == 0
    assert dataset_bytes(tmp_path / "w1") == dataset_bytes(tmp_path / "w3")

    out = tmp_path / "killed"
    argv = [sys.executable, "-m", "mspretrain.dataprep", "build", str(root), "--out", str(out),
            *TEST_SETTINGS, "--workers", "1", *stages]
    proc = subprocess.Popen(argv, cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    markers = out / ".build" / "docs"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if markers.is_dir() and len(list(markers.glob("[0-9]*.json"))) >= 2:
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the build ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (out / "manifest.json").exists()
    assert subprocess.run(argv, cwd=REPO, capture_output=True).returncode == 0
    assert dataset_bytes(out) == dataset_bytes(tmp_path / "w1")
