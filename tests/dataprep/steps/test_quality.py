"""The quality classifier: deterministic training, held-out accuracy on real text, the CLI, and a
build that filters by it and records every score."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dataprep_helpers import run_build
from mspretrain.dataprep.cli import main as dataprep_main
from mspretrain.dataprep.steps.clean import normalize
from mspretrain.dataprep.steps.quality import QualityModel, QualityModelError, train
from real_text import man_texts


def _changelogs(n: int) -> list[str]:
    """Debian changelogs: real text, but lists of version bumps, names and dates."""
    paths = sorted(Path("/usr/share/doc").glob("*/changelog.Debian.gz"))
    out = []
    for p in paths[::3]:
        text = normalize(gzip.decompress(p.read_bytes()).decode("utf-8", "replace"))[:3000]
        if len(text) >= 600:
            out.append(text)
        if len(out) == n:
            break
    return out


@pytest.fixture(scope="module")
def data():
    good = [t for _, t in man_texts("en", 60, seed=2)] + [t for _, t in man_texts("zh_CN", 10)]
    bad = _changelogs(70)
    assert len(good) >= 60 and len(bad) >= 60
    return good, bad


def test_training_is_deterministic_and_separates_held_out_documents(data):
    good, bad = data
    m1 = train(good[::2], bad[::2], steps=120)
    m2 = train(good[::2], bad[::2], steps=120)
    assert (m1.weights == m2.weights).all() and m1.bias == m2.bias
    right = sum(m1.score(t) >= 0.5 for t in good[1::2]) + sum(m1.score(t) < 0.5 for t in bad[1::2])
    assert right >= 0.9 * (len(good[1::2]) + len(bad[1::2]))
    assert 0.0 <= m1.score("") <= 1.0


def test_cli_trains_the_same_model_bytes_twice_and_load_checks_the_file(data, tmp_path, capsys):
    good, bad = data
    pos, neg = tmp_path / "pos.jsonl", tmp_path / "neg.jsonl"
    pos.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in good))
    neg.write_text("".join(json.dumps({"text": t}) + "\n" for t in bad))
    for name in ("a.bin", "b.bin"):
        assert dataprep_main(["quality", "train", "--positive", str(pos), "--negative", str(neg),
                              "--out", str(tmp_path / name)]) == 0
    assert "training accuracy" in capsys.readouterr().out
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()
    model = QualityModel.load(tmp_path / "a.bin")
    assert model.score(good[0]) > model.score(bad[0])
    (tmp_path / "c.bin").write_bytes((tmp_path / "a.bin").read_bytes()[:1000])
    with pytest.raises(QualityModelError, match="truncated"):
        QualityModel.load(tmp_path / "c.bin")
    neg.write_text('{"text": "x"}\n{"body": 1}\n')
    assert dataprep_main(["quality", "train", "--positive", str(pos), "--negative", str(neg),
                          "--out", str(tmp_path / "d.bin")]) == 1
    assert "neg.jsonl:2" in capsys.readouterr().err


def test_build_drops_low_scores_and_records_every_score(data, tmp_path):
    good, bad = data
    model = tmp_path / "q.bin"
    train(good[::2], bad[::2], steps=120).save(model)
    corpus = tmp_path / "in"
    corpus.mkdir()
    docs = [{"id": f"good-{i}", "text": t} for i, t in enumerate(good[1::2])] + \
           [{"id": f"bad-{i}", "text": t} for i, t in enumerate(bad[1::2])]
    (corpus / "docs.jsonl").write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs))
    out = tmp_path / "data"
    assert run_build([corpus], out, "--set", f"filters.quality.model={model}",
                     "--set", "filters.quality.threshold=0.5") == 0
    attrs = {a["doc_id"]: a for a in
             pq.read_table(out / "documents" / "attributes.parquet").to_pylist()}
    scored = [a for a in attrs.values() if a["quality"] is not None]
    assert all(a["fate"] == "quality" for a in scored if a["quality"] < 0.5)
    assert all(a["fate"] != "quality" for a in scored if a["quality"] >= 0.5)
    dropped_bad = sum(a["fate"] == "quality" for k, a in attrs.items() if k.startswith("bad"))
    dropped_good = sum(a["fate"] == "quality" for k, a in attrs.items() if k.startswith("good"))
    assert dropped_bad >= 0.8 * len(bad[1::2]) and dropped_good <= 0.1 * len(good[1::2])
    m = json.loads((out / "manifest.json").read_text())
    assert m["config"]["filters"]["quality"]["model"].startswith("sha256:")
    # every piece of a sample carries its document's score: samples can be re-filtered later
    pieces = [r for s in ("train", "valid")
              for r in pq.read_table(out / "provenance" / f"{s}.parquet").to_pylist()]
    assert pieces and all(r["quality"] == attrs[r["doc_id"]]["quality"] >= 0.5 for r in pieces)
    assert len({r["doc_id"] for r in pieces}) > 10
