"""A document's id and split travel with it through the build: stage 1 computes the split once and
stores it in the chunk file, stage 4 takes it from there and writes the doc ids beside the tokens
(SplitTokens), and stage 5 packs them and writes the provenance from that record alone."""
from __future__ import annotations

import json

import numpy as np
import pytest
import pyarrow.compute as pc
import pyarrow.parquet as pq
import sentencepiece as spm

from mspretrain.dataprep.dedup.detect import DedupConfig, exact_key
from mspretrain.dataprep.steps.filters import FILTER_NAMES, FilterConfig
from mspretrain.dataprep.readers import Document
from mspretrain.dataprep.steps.base import Step, StepDoc
from mspretrain.dataprep.steps.pipeline import DocMemo, DocResult, Pipeline, build_steps
from mspretrain.dataprep.plan.chunks import ChunkTask, clean_chunk, tokenize_chunk
from mspretrain.dataprep.plan.layout import Ctx
from mspretrain.dataprep.plan.worker import Worker, WorkerSetup, worker_for
from mspretrain.dataprep.records import SplitTokens, split_of
from real_text import man_texts

SENTENCES = ["The package manager keeps a list of installed packages.",
             "A mirror serves the archive over HTTP to every client machine.",
             "Configuration files live under the etc directory of the system.",
             "The kernel loads modules for the hardware it finds at boot."]


def _docs(n: int) -> list[Document]:
    return [Document(f"doc-{i}", f"{SENTENCES[i % 4]} Paragraph {i} of the manual.", "t.jsonl")
            for i in range(n)]


def test_split_tokens_round_trip_keeps_every_id_exactly(tmp_path):
    ids = ["a", "中文:3", "ends-in-nul\x00", "", "x" * 300]
    part = SplitTokens(np.arange(12, dtype=np.int32), np.array([2, 3, 1, 4, 2], np.int32), ids)
    empty = SplitTokens(np.zeros(0, np.int32), np.zeros(0, np.int32), [])
    np.savez(tmp_path / "t.npz", **part.arrays("train"), **empty.arrays("valid"))
    with np.load(tmp_path / "t.npz") as z:   # no pickle: plain arrays only
        back, none = SplitTokens.load(z, "train"), SplitTokens.load(z, "valid", tokens=False)
    assert back.doc_ids == ids
    assert np.array_equal(back.tokens, part.tokens) and np.array_equal(back.lens, part.lens)
    assert none.doc_ids == [] and none.tokens is None and len(none.lens) == 0


def test_stage_1_stores_the_split_and_stage_4_follows_the_stored_column(tmp_path):
    docs_dir, tokens_dir = tmp_path / "docs", tmp_path / "tokens"
    docs_dir.mkdir()
    tokens_dir.mkdir()
    worker = Worker(WorkerSetup(str(docs_dir), str(tokens_dir),
                                FilterConfig(min_chars=1, disabled=FILTER_NAMES), DedupConfig(),
                                valid_fraction=0.5, split_seed=7))
    docs = _docs(24)
    assert clean_chunk(worker, ChunkTask(0, docs, []))["docs_out"] == len(docs)
    chunk = docs_dir / "00000.parquet"
    table = pq.read_table(chunk)
    stored = table.column("split").to_pylist()
    assert stored == [split_of(d.doc_id, 0.5, 7) for d in docs]
    assert set(stored) == {"train", "valid"}

    # swap every stored split: stage 4 must follow the column, not recompute it from the id
    swapped = pc.if_else(pc.equal(table.column("split"), "train"), "valid", "train")
    pq.write_table(table.set_column(table.schema.get_field_index("split"), "split", swapped), chunk)
    (tmp_path / "sample.txt").write_text("\n".join(d.text for d in docs) + "\n")
    spm.SentencePieceTrainer.train(input=str(tmp_path / "sample.txt"),
                                   model_prefix=str(tmp_path / "m"), vocab_size=80,
                                   hard_vocab_limit=False, minloglevel=2)
    keep = np.ones(len(docs), bool)
    keep[3] = False
    tokenize_chunk(worker, (0, np.packbits(keep).tobytes(), str(tmp_path / "m.model")))
    with np.load(tokens_dir / "00000.npz") as z:
        got = {s: SplitTokens.load(z, s) for s in ("train", "valid")}
    for split, other in (("train", "valid"), ("valid", "train")):
        want = [d.doc_id for d, s, k in zip(docs, stored, keep) if s == other and k]
        assert got[split].doc_ids == want
        assert len(got[split].lens) == len(want) and got[split].lens.sum() == got[split].tokens.size


def test_repeated_documents_come_from_the_memo_and_write_the_same_bytes(tmp_path, monkeypatch):
    """A text met again (in the same chunk or a later one) is not processed again, and the chunk
    files are byte for byte those of a run without the memo, kept and dropped documents alike."""
    texts = [man_texts("en", 3)[i][1] for i in range(3)] + ["too short", "Write to the maintainer, x.y@example.com, with questions about the package."]
    order = [0, 1, 0, 3, 4, 2, 1, 3, 4, 0]   # repeats within a chunk and across chunks
    docs = [Document(f"d{i}", texts[t], "t.jsonl") for i, t in enumerate(order)]
    tasks = [ChunkTask(0, docs[:5], []), ChunkTask(1, docs[5:], [])]
    calls = []
    real = Pipeline.process
    monkeypatch.setattr(Pipeline, "process",
                        lambda self, t, *meta: calls.append(t) or real(self, t, *meta))

    def run(root, memo):
        for d in ("docs", "tokens"):
            (root / d).mkdir(parents=True)
        worker = Worker(WorkerSetup(str(root / "docs"), str(root / "tokens"), FilterConfig(),
                                    DedupConfig(), valid_fraction=0.5, split_seed=7))
        worker.pipeline.memo = memo
        markers = [clean_chunk(worker, t) for t in tasks]
        return [{k: v for k, v in m.items() if k not in ("pid", "cpu_s")} for m in markers]

    with_memo = run(tmp_path / "a", DocMemo())
    assert sorted(calls) == sorted(texts)               # once per distinct text
    calls.clear()
    without = run(tmp_path / "b", DocMemo(budget=0))    # nothing fits: every text processed
    assert len(calls) == len(docs)
    assert with_memo == without and with_memo[0]["filters"]["too_short"][0] == 1
    for name in ("00000.parquet", "00001.parquet"):
        a, b = (tmp_path / r / "docs" / name for r in "ab")
        assert a.read_bytes() == b.read_bytes()
    assert pq.read_table(tmp_path / "a/docs/00000.parquet").column("pii").to_pylist()[4] == 1


def test_the_memo_keeps_the_most_recently_used_within_its_budget():
    memo = DocMemo(budget=44)          # raw and cleaned characters count
    results = {k: DocResult("x" * 10, "", {}, b"") for k in "abcde"}
    for k in "abcd":
        memo.put(k, results[k])
    assert memo.get("a") is results["a"]          # a is now the most recent
    memo.put("e", results["e"])                    # 55 > 44: the least recent (b) goes
    assert memo.get("b") is None and memo.get("a") is results["a"] and memo.size == 44
    memo.put("big", DocResult("x" * 9, "", {}, b""))   # 12 > a quarter: not kept
    assert memo.get("big") is None and memo.size == 44


def test_an_evaluation_file_rewritten_under_its_name_is_read_again(tmp_path):
    """A process that served one build (a Ray worker lives across builds) and then serves the same
    build dir with the evaluation file rewritten forgets its memo and cached index."""
    from mspretrain.dataprep.config import load_build_config
    from mspretrain.dataprep.workdir import WorkDir

    text = man_texts("en", 1)[0][1]
    evals = tmp_path / "eval.jsonl"
    work = WorkDir(tmp_path / "out")
    docs = [Document("d0", text, "t.jsonl")]
    dropped = []
    for passage in (text[100:600], "nothing of the kind appears in the document at all " * 3):
        evals.write_text(json.dumps({"text": passage}) + "\n")
        cfg = load_build_config(overrides={"decontam.files": [str(evals)],
                                           "decontam.action": "drop"})
        for d in (work.docs, work.tokens):
            d.mkdir(parents=True, exist_ok=True)
            for f in d.iterdir():
                f.unlink()
        worker = worker_for(Ctx(str(work.out), cfg, partitions=1))
        dropped.append(clean_chunk(worker, ChunkTask(0, docs, []))["filters"]["decontam"][0])
    assert dropped == [1, 0]


def test_a_tokenizer_written_again_at_the_same_path_is_loaded_again(tmp_path):
    sample = tmp_path / "sample.txt"
    model = tmp_path / "m.model"
    sizes = []
    worker = Worker(None)       # one process that keeps its loaded tokenizer
    for vocab in (60, 90):
        sample.write_text("\n".join(SENTENCES * 3) + "\n")
        spm.SentencePieceTrainer.train(input=str(sample), model_prefix=str(tmp_path / "new"),
                                       vocab_size=vocab, hard_vocab_limit=False, minloglevel=2)
        (tmp_path / "new.model").replace(model)
        sizes.append(worker.processor(str(model)).get_piece_size())
    assert sizes[0] != sizes[1]


class _Licence(Step):
    """A step that reads what the reader knew of the record: drops the proprietary ones."""
    name = "licence"
    reasons = ("licence",)
    reads_metadata = True

    def __call__(self, doc: StepDoc) -> str:
        with pytest.raises(TypeError):
            doc.metadata["licence"] = "mine"      # read-only: the next step sees what was read
        return "licence" if doc.metadata.get("licence") == "proprietary" else ""


def test_a_documents_metadata_reaches_a_step_that_reads_it_and_keys_the_memo(tmp_path):
    """Document.metadata reaches every step as a read-only doc.metadata; a pipeline with a step that
    reads it tells apart one text under two metadata (the memo keys by both), and still takes a
    repeat of the same text and metadata from the memo."""
    text = SENTENCES[0] + " " + SENTENCES[1]
    docs = [Document("a", text, "t.jsonl", {"licence": "cc-by"}),
            Document("b", text, "t.jsonl", {"licence": "proprietary"}),
            Document("c", text, "t.jsonl", {"licence": "cc-by"}),
            Document("d", text, "t.jsonl")]
    for d in ("docs", "tokens"):
        (tmp_path / d).mkdir()
    worker = Worker(WorkerSetup(str(tmp_path / "docs"), str(tmp_path / "tokens"),
                                FilterConfig(min_chars=1, disabled=FILTER_NAMES), DedupConfig(),
                                valid_fraction=0.0, split_seed=7))
    steps = build_steps(worker.setup.filters, worker.setup.decontam, worker.setup.pii)
    worker._pipeline = Pipeline(steps + [_Licence()], exact_key)
    calls = []
    real = worker.pipeline.process
    worker.pipeline.process = lambda t, meta: calls.append(dict(meta)) or real(t, meta)
    marker = clean_chunk(worker, ChunkTask(0, docs, []))
    reasons = pq.read_table(tmp_path / "docs" / "00000.parquet").column("reason").to_pylist()
    assert reasons == ["", "licence", "", ""]
    assert marker["filters"]["licence"][0] == 1 and marker["docs_out"] == 3
    assert calls == [{"licence": "cc-by"}, {"licence": "proprietary"}, {}]   # c: from the memo

    plain = Pipeline(steps, exact_key)       # no step reads metadata: keyed by the text alone
    assert not plain.reads_metadata and worker.pipeline.reads_metadata
    new = []
    assert plain.result(text, new, docs[0].metadata) is plain.result(text, new, docs[1].metadata)
