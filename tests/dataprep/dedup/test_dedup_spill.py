"""The near-dedup index spilled to disk in segments: memory holds a bounded number of kept
documents whatever the input, and every answer equals the all-in-memory index's."""
from __future__ import annotations

import json

import random
from pathlib import Path

import numpy as np
import pyarrow as pa

from mspretrain.dataprep.steps.clean import normalize
from mspretrain.dataprep.dedup.detect import DedupConfig, NearDedup, signatures
from mspretrain.dataprep.dedup.keep import DedupPass
from dataprep_helpers import dataset_bytes, run_build
from neardup_eval import edited, load

DATA = Path(__file__).parents[1] / "data" / "neardup.jsonl.zst"   # labelled real near-duplicates


def _stream():
    """Real texts, their edited copies (near duplicates at many similarities) and exact repeats."""
    texts = [normalize(d["text"]) for d in load(DATA)]
    rng = random.Random(7)
    stream = texts + [edited(rng.choice(texts), rng.uniform(0, 0.3), rng) for _ in range(300)]
    return stream + texts[::5]


def test_spilled_index_gives_the_answers_of_the_index_in_memory(tmp_path):
    cfg = DedupConfig()
    stream = _stream()
    sigs = signatures(stream, cfg)
    keys = [f"k{i}" for i in range(len(stream))]
    text = {k: t for k, t in zip(keys, stream)}
    whole = NearDedup(cfg, texts_of=lambda keys: [text[k] for k in keys])
    spilled = NearDedup(cfg, texts_of=lambda keys: [text[k] for k in keys],
                        spill=tmp_path / "near", hot_docs=50)
    for i in range(0, len(keys), 37):
        batch = slice(i, i + 37)
        rows = stream[batch]
        want = whole.add_many(keys[batch], sigs[batch], rows.__getitem__)
        assert spilled.add_many(keys[batch], sigs[batch], rows.__getitem__) == want
        assert spilled.docs_in_memory < 50 + 37
    assert sum(r is not None for r in [whole.query(s) for s in sigs[-50:]]) > 0
    assert spilled.frozen >= len(whole) // 87 >= 4 and len(spilled) == len(whole)
    # merged as a binary counter: few segments, each at least twice the size of the next
    assert 1 < spilled.segments <= spilled.frozen.bit_length()
    counts = [seg.count for seg in spilled._segments]
    assert all(a >= 2 * b for a, b in zip(counts, counts[1:]))
    assert len(list((tmp_path / "near").glob("near-*"))) == 5 * spilled.segments
    assert spilled.docs_in_memory < 87
    for s in sigs[::9]:   # single queries, through the segments too
        assert spilled.query(s) == whole.query(s)


def _chunk(rng, start: int, n: int, sigs: np.ndarray) -> pa.Table:
    ids = [f"doc-{start + i}" for i in range(n)]
    return pa.table({"doc_id": ids, "source": ["a.jsonl"] * n, "reason": [""] * n,
                     "key": [rng.bytes(16) for _ in range(n)], "sig": [s.tobytes() for s in sigs],
                     "bytes_clean": [100] * n, "language": ["en"] * n, "script": [""] * n,
                     "language_score": [0.9] * n, "quality": [None] * n, "pii": [0] * n,
                     "decontam": [""] * n, "split": ["train"] * n})


def test_dedup_pass_holds_a_bounded_index_and_decides_as_without_spilling(tmp_path):
    cfg = DedupConfig()
    rng = np.random.default_rng(1)
    base = rng.integers(0, 2**32, size=(400, cfg.num_perm), dtype=np.uint32)
    copies = base[rng.integers(0, 400, 200)].copy()
    copies[:, ::10] += 1          # ~90% of entries equal: near duplicates of earlier documents
    all_sigs = np.concatenate([base, copies])
    spilled = DedupPass(cfg, spill=tmp_path / "near", hot_docs=64)
    whole = DedupPass(cfg)
    rows = {"spilled": [], "whole": []}
    keeps = {"spilled": [], "whole": []}
    for start in range(0, len(all_sigs), 100):
        table = _chunk(np.random.default_rng(start), start, 100, all_sigs[start:start + 100])
        for name, dp in (("spilled", spilled), ("whole", whole)):
            decided = dp.consume(table, np.dtype("uint32"))
            rows[name].append(decided.duplicates)
            keeps[name].append(decided.keep)
        assert spilled.near.docs_in_memory < 64 + 100
    a, b = spilled.finish(), whole.finish()
    assert a.near == b.near and a.near[0] == 200
    assert (np.concatenate(keeps["spilled"]) == np.concatenate(keeps["whole"])).all()
    assert pa.concat_tables(rows["spilled"]).equals(pa.concat_tables(rows["whole"]))
    # a segment each time a chunk's kept documents bring memory to 64 or more: the 4 chunks of
    # distinct documents (merged into one); the near duplicates after them are never kept
    assert spilled.near.frozen == 4 and spilled.near.segments == 1
    assert len(list((tmp_path / "near").glob("near-*"))) == 5
    assert spilled.near.docs_in_memory == 0 and len(spilled.near) == 400


def test_a_build_whose_index_spills_writes_the_same_bytes(corpus, reference, tmp_path):
    out = tmp_path / "data"
    assert run_build([corpus], out, "--workers", "1", "--set", "run.dedup_memory_docs=2") == 0
    spills = json.loads((out / "report.json").read_text())["executor"]["index_spills"]
    assert spills >= 10               # the index really went to disk, many times
    assert dataset_bytes(out) == dataset_bytes(reference)
    assert not (out / ".build").exists()


def test_repeated_ids_and_exact_keys_are_caught_across_chunks_from_the_store_on_disk(tmp_path):
    """The seen ids and kept exact keys live in SQLite under the spill dir: every repeat is caught,
    in the same chunk or any earlier one, as a plain in-order set/dict pass decides."""
    cfg = DedupConfig()
    rng = np.random.default_rng(7)
    n, per_chunk = 600, 50
    ids = [f"doc-{i}" for i in rng.integers(0, 450, n)]          # ~1/4 repeated ids
    keys = [bytes([k]) * 16 for k in rng.integers(0, 255, n)]     # many exact repeats
    sigs = rng.integers(0, 2**32, size=(n, cfg.num_perm), dtype=np.uint32)   # no near pairs
    seen, kept_keys, want = set(), {}, []
    for d, k in zip(ids, keys):
        if d in seen:
            want.append(("duplicate_doc_id", None))
            continue
        seen.add(d)
        if k in kept_keys:
            want.append(("exact", kept_keys[k]))
        else:
            kept_keys[k] = d
            want.append(("kept", None))
    dp = DedupPass(cfg, spill=tmp_path / "near", hot_docs=64)
    got, dups = [], []
    for s in range(0, n, per_chunk):
        t = _chunk(rng, s, per_chunk, sigs[s:s + per_chunk])
        t = t.set_column(0, "doc_id", pa.array(ids[s:s + per_chunk]))
        t = t.set_column(t.schema.get_field_index("key"), "key", pa.array(keys[s:s + per_chunk]))
        decided = dp.consume(t, np.dtype("uint32"))
        got += decided.fate
        dups += zip(decided.duplicates.column("doc_id").to_pylist(),
                    decided.duplicates.column("kept_doc_id").to_pylist())
    assert got == [fate for fate, _ in want]
    assert dups == [(d, k) for d, (fate, k) in zip(ids, want) if fate == "exact"]
    assert len(dp.finish().duplicate_ids) == want.count(("duplicate_doc_id", None)) > 100
    assert (tmp_path / "near" / "seen.sqlite").stat().st_size > 0


def test_segments_merged_a_few_entries_at_a_time_answer_as_the_index_in_memory(tmp_path, monkeypatch):
    """Merges cut into blocks of 7 entries (ties between the two segments fall across block ends):
    the merged cells stay sorted with the older document first, and every lookup is unchanged."""
    from mspretrain.dataprep.dedup import detect as dedup
    monkeypatch.setattr(dedup._Segment, "_BLOCK", 7)
    cfg = DedupConfig()
    stream = _stream()[:400]
    sigs = signatures(stream, cfg)
    keys = [f"k{i}" for i in range(len(stream))]
    whole = NearDedup(cfg)
    spilled = NearDedup(cfg, spill=tmp_path / "near", hot_docs=20)
    for i in range(0, len(keys), 23):
        want = whole.add_many(keys[i:i + 23], sigs[i:i + 23])
        assert spilled.add_many(keys[i:i + 23], sigs[i:i + 23]) == want
    assert spilled.frozen >= 8 and spilled.segments < spilled.frozen
    for seg in spilled._segments:
        cells, numbers = np.asarray(seg._load("cells")), np.asarray(seg._load("numbers"))
        assert (np.diff(cells.astype(np.float64)) >= 0).all()
        same = cells[1:] == cells[:-1]
        assert (numbers[1:][same] > numbers[:-1][same]).all()
        assert [seg.key(n) for n in range(seg.first, seg.first + seg.count, 7)] == \
            [whole._key(n) for n in range(seg.first, seg.first + seg.count, 7)]
    for s in sigs[::5]:
        assert spilled.query(s) == whole.query(s)
