"""Exact and near dedup: signatures, LSH parameters, NearDedup semantics and quality on real text."""
import json
import multiprocessing
import random
from pathlib import Path

import datasketch  # the reference MinHash (a test extra)
import numpy as np
import pytest

from mspretrain.dataprep.steps.clean import normalize
from mspretrain.dataprep.dedup.detect import (DedupConfig, NearDedup, describe, exact_jaccard, exact_key,
                            lsh_params, signatures)
from neardup_eval import edited, estimate, evaluate, load, shingle_set

DATA = Path(__file__).parents[1] / "data" / "neardup.jsonl.zst"


@pytest.fixture(scope="module")
def labelled():
    return load(DATA)


@pytest.fixture(scope="module")
def texts(labelled):
    return [normalize(d["text"]) for d in labelled]


def _jaccard(a: str, b: str, order: int = 5) -> float:
    x, y = shingle_set(a, order), shingle_set(b, order)
    return len(x & y) / len(x | y)


# ------------------------------------------------------------------------------------ exact

def test_exact_key_is_a_16_byte_digest_of_the_text():
    assert exact_key("中文 text") == exact_key("中文 text") and len(exact_key("x")) == 16
    assert exact_key("text") != exact_key("Text") != exact_key("text ")


# ------------------------------------------------------------------------------------ parameters

@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.9, 0.95])
@pytest.mark.parametrize("num_perm", [64, 128, 256])
def test_lsh_params_catch_pairs_at_the_threshold(threshold, num_perm):
    bands, rows = lsh_params(threshold, num_perm)
    assert bands * rows <= num_perm
    assert 1 - (1 - threshold ** rows) ** bands >= 0.995
    # One more row would break that promise (the parameters are the most selective that keep it).
    more = num_perm // (rows + 1)
    assert rows == num_perm or 1 - (1 - threshold ** (rows + 1)) ** more < 0.995


def test_describe_records_the_scheme():
    d = describe(DedupConfig())
    assert json.loads(json.dumps(d)) == d
    assert d["scheme"] == "oph-rot-v1" and (d["bands"], d["rows"]) == lsh_params(0.8, 256)
    assert d["shingle"] == "char5"
    # no library version: the scheme is ours, so the fingerprint changes only with the output bytes
    assert not any("version" in k for k in d)


def test_bad_config_names_the_field():
    for kwargs, field in [({"threshold": 1.5}, "threshold"), ({"num_perm": 1}, "num_perm"),
                          ({"shingle": "word5"}, "shingle")]:
        with pytest.raises(ValueError, match=field):
            DedupConfig(**kwargs)


# ------------------------------------------------------------------------------------ signatures

def test_signatures_are_pure_whatever_the_batch(texts):
    cfg = DedupConfig()
    batch = texts[:120] + ["", "abc", "中文", "x" * 200_000]  # crosses several hashing blocks
    sigs = signatures(batch, cfg)
    assert sigs.shape == (len(batch), cfg.num_perm) and sigs.dtype == np.uint32
    for i in [0, 57, 119, 120, 121, 122, 123]:
        assert np.array_equal(signatures([batch[i]], cfg)[0], sigs[i])
    assert np.array_equal(signatures(batch[::-1], cfg)[::-1], sigs)
    assert not np.array_equal(signatures(batch[:5], DedupConfig(seed=2)), sigs[:5])
    assert signatures([], cfg).shape == (0, cfg.num_perm)


def _signatures_in_child(texts):
    return signatures(texts, DedupConfig())


def test_signatures_match_in_a_spawned_worker(texts):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        child = pool.apply(_signatures_in_child, (texts[:40],))
    assert np.array_equal(child, signatures(texts[:40], DedupConfig()))


def test_estimates_agree_with_exact_jaccard_in_expectation(texts):
    """Over many pairs of real text spread across similarities, the estimate is unbiased and its
    error is what MinHash with the same number of permutations gives (datasketch as reference)."""
    rng = random.Random(3)
    base = [t for t in texts if len(t) > 1500][:40]
    pairs = [(t, normalize(edited(t, rng.uniform(0, 0.4), rng))) for t in base for _ in range(4)]
    cfg = DedupConfig(num_perm=128)
    a = signatures([p[0] for p in pairs], cfg)
    b = signatures([p[1] for p in pairs], cfg)
    exact = np.array([_jaccard(x, y) for x, y in pairs])
    ours = np.array([estimate(x, y) for x, y in zip(a, b)])
    ref = []
    for x, y in pairs:
        m1, m2 = datasketch.MinHash(num_perm=128, seed=1), datasketch.MinHash(num_perm=128, seed=1)
        m1.update_batch([s.encode() for s in shingle_set(x, 5)])
        m2.update_batch([s.encode() for s in shingle_set(y, 5)])
        ref.append(m1.jaccard(m2))
    ref = np.array(ref)
    assert exact.min() < 0.6 and exact.max() > 0.95
    assert abs((ours - exact).mean()) < 0.01
    rmse_ours, rmse_ref = np.sqrt(((ours - exact) ** 2).mean()), np.sqrt(((ref - exact) ** 2).mean())
    assert rmse_ours < 1.3 * rmse_ref + 0.005, (rmse_ours, rmse_ref)


# ------------------------------------------------------------------------------------ NearDedup

def _docs():
    rng = random.Random(11)
    a = ("Permission is hereby granted, free of charge, to any person obtaining a copy of this "
         "software and associated documentation files, to deal in the Software without restriction")
    b = "本程序是自由软件；您可以在自由软件基金会发布的GNU通用公共许可证的条款下重新发布或修改它。" * 3
    return [a, b, a.replace("Software", "software", 1), normalize(edited(b, 0.005, rng)),
            "completely different text about something else entirely, nothing alike at all", a]


def test_first_in_input_order_is_kept():
    cfg = DedupConfig()
    docs = _docs()
    sigs = signatures(docs, cfg)
    nd = NearDedup(cfg)
    got = [nd.add(f"d{i}", s) for i, s in enumerate(sigs)]
    assert _jaccard(docs[1], docs[3]) > 0.85 and _jaccard(docs[0], docs[2]) > 0.85
    assert got[0] is None and got[1] is None and got[4] is None
    assert got[2][0] == "d0" and got[3][0] == "d1" and got[5] == ("d0", 1.0)
    assert got[2][1] == pytest.approx(_jaccard(docs[0], docs[2]), abs=0.08)
    assert len(nd) == 3


def test_a_dropped_document_is_not_a_representative():
    """C is close to B (dropped as a duplicate of A) but not to A: C is kept."""
    cfg = DedupConfig(threshold=0.8)
    words = [f"w{i:03d}" for i in range(400)]
    a = " ".join(words)
    b = " ".join(words[40:] + [f"b{i:03d}" for i in range(30)])
    c = " ".join(words[80:] + [f"b{i:03d}" for i in range(30)] + [f"c{i:03d}" for i in range(30)])
    assert _jaccard(a, b) > 0.8 and _jaccard(b, c) > 0.8 and _jaccard(a, c) < 0.75
    nd = NearDedup(cfg)
    got = [nd.add(k, s) for k, s in zip("ABC", signatures([a, b, c], cfg))]
    assert got[0] is None and got[1][0] == "A" and got[2] is None


def test_add_many_equals_add_one_by_one(texts):
    cfg = DedupConfig()
    stream = texts + texts[::4]  # exact repeats too, as if exact dedup were off
    sigs = signatures(stream, cfg)
    keys = [f"k{i}" for i in range(len(stream))]
    one = NearDedup(cfg)
    expected = [one.add(k, s) for k, s in zip(keys, sigs)]
    assert sum(r is not None for r in expected) > len(texts) // 4
    for batch in [2, 33, 1000]:
        nd = NearDedup(cfg)
        got = []
        for i in range(0, len(keys), batch):
            got += nd.add_many(keys[i:i + batch], sigs[i:i + batch])
        assert got == expected


def test_exact_jaccard_equals_the_shingle_set_definition(texts):
    cfg = DedupConfig()
    rng = random.Random(11)
    for _ in range(20):
        a, b = rng.choice(texts), rng.choice(texts)
        b = edited(a, rng.uniform(0, 0.2), rng) if rng.random() < 0.7 else b
        assert exact_jaccard(a, b, cfg) == pytest.approx(_jaccard(a, b), abs=1e-12)
    assert exact_jaccard("abc", "abc", cfg) == 1.0


def test_signature_shape_is_checked():
    nd = NearDedup(DedupConfig())
    with pytest.raises(ValueError, match="shape"):
        nd.add("x", np.zeros(128, dtype=np.uint32))


def test_index_grows_and_keeps_finding_everything():
    cfg = DedupConfig()
    rng = random.Random(5)
    vocab = [f"tok{i}" for i in range(5000)]
    docs = [" ".join(rng.choice(vocab) for _ in range(40)) for _ in range(3000)]
    sigs = signatures(docs, cfg)
    nd = NearDedup(cfg)
    assert all(r is None for r in nd.add_many([str(i) for i in range(len(docs))], sigs))
    again = nd.add_many([f"again{i}" for i in range(len(docs))], sigs)
    assert [r[0] for r in again] == [str(i) for i in range(len(docs))]


def test_signature_store_grows_with_little_slack():
    """Kept signatures grow by a quarter at a time (not doubling): at most 25% unused rows beyond
    the first 1024, and the same answers however the store grew."""
    cfg = DedupConfig()
    rng = np.random.default_rng(3)
    nd = NearDedup(cfg)
    for i in range(0, 6000, 500):
        sigs = rng.integers(0, 2**32, size=(500, cfg.num_perm), dtype=np.uint32)
        assert all(r is None for r in nd.add_many([f"{i + j}" for j in range(500)], sigs))
        store = nd.nbytes() - nd._table.nbytes()
        assert store <= max(1024, 1.25 * len(nd)) * cfg.num_perm * 2, (len(nd), store)
    assert nd.add("again", sigs[7]) == ("5507", 1.0)


# ------------------------------------------------------------------------------------ quality

def test_precision_and_recall_on_real_near_duplicates(labelled):
    """The labelled set: licence and copyright texts, zh/en manual pages and their translations,
    and edited copies (tests/dataprep/data/README.md). Labels: exact Jaccard >= 0.8."""
    sources = {d["source"].split("/")[0] for d in labelled}
    assert {"common-licenses", "doc", "man", "vim", "gnupg"} <= sources
    result = evaluate(labelled, DedupConfig(threshold=0.8))
    assert result["true_pairs"] >= 100 and result["languages"]["zh"]["true_pairs"] >= 15
    assert result["precision"] >= 0.99 and result["recall"] >= 0.99, result
    assert result["languages"]["zh"]["recall"] >= 0.97, result
    assert result["languages"]["zh"]["precision"] >= 0.99, result
    high = evaluate(labelled, DedupConfig(threshold=0.9))
    assert high["precision"] >= 0.99 and high["recall"] >= 0.99, high


def test_the_signature_estimate_alone_misses_pairs_that_exact_verification_settles(labelled):
    """Without the texts, pairs close to the threshold fall on the wrong side of it: what the
    exact verification fixes."""
    result = evaluate(labelled, DedupConfig(threshold=0.8), verify=False)
    assert result["precision"] < 0.99 or result["recall"] < 0.99, result


def test_near_threshold_pairs_are_settled_by_the_exact_similarity(texts):
    """Pairs whose estimate lies within the margin get their exact Jaccard similarity."""
    cfg = DedupConfig(threshold=0.8)
    rng = random.Random(3)
    base = max(texts, key=len)[:3000]
    checked = 0
    for rate in [0.02 + 0.004 * k for k in range(15)]:
        copy = edited(base, rate, rng)
        exact = _jaccard(base, copy)
        nd = NearDedup(cfg, texts_of=lambda keys: [base] * len(keys))
        nd.add("base", signatures([base], cfg)[0], base)
        hit = nd.add("copy", signatures([copy], cfg)[0], copy)
        assert (hit is not None) == (exact >= 0.8), (rate, exact, hit)
        if hit is not None and abs(hit[1] - exact) < 1e-9:
            checked += 1
    assert checked >= 1      # some pairs did take the exact path
