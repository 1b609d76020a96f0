"""The evaluation suite: bits per byte from provenance, per-source loss of a blend, generation
metrics, resumable per sample after SIGKILL, refusing another tokenizer or seq_length, capping batches."""
from __future__ import annotations

import json
import math
import re

import pytest

from hf_helpers import CORPUS, jsonl, train_cmd
from train_test_hooks import env as hooks_env
from trainer_harness import run


def test_generation_metrics_by_hand():
    from mspretrain.train.eval.suite import generation_metrics
    m = generation_metrics([[1, 2, 3, 1, 2, 3], [4, 4, 4]])
    # unigrams: 9 in all, distinct {1,2,3,4}; bigrams: 5 + 2 = 7, distinct {12,23,31,44}
    assert m["distinct_1"] == 4 / 9 and m["distinct_2"] == 4 / 7
    # 3-grams: (1,2,3),(2,3,1),(3,1,2),(1,2,3) -> 1 of 4 repeats; (4,4,4) once -> 0
    assert m["distinct_3"] == 4 / 5 and m["repeated_3gram_rate"] == (0.25 + 0.0) / 2
    assert m["mean_length"] == 4.5


def test_validation_batch_size():
    """eval.batch_size: its own; by default twice the training's rows per forward, once when the
    valid split is smaller; a multiple of data_parallel."""
    from mspretrain.train.config import ConfigError, load_config
    from mspretrain.train.eval.suite import validation_batch_size
    from trainer_harness import TINY

    cfg = lambda *sets: load_config(TINY, list(sets))  # noqa: E731
    assert validation_batch_size(cfg()) == 16                      # global batch 8, no accumulation
    assert validation_batch_size(cfg(), num_samples=15) == 8       # a valid split of 15 rows
    assert validation_batch_size(cfg("train.micro_batch_size=2")) == 4
    assert validation_batch_size(cfg("parallel.data_parallel=2", "train.micro_batch_size=2")) == 8
    assert validation_batch_size(cfg("eval.batch_size=24"), num_samples=15) == 24
    for bad, msg in [("eval.batch_size=-1", "eval.batch_size must be >= 0"),
                     ("eval.batch_size=3", "eval.batch_size=3 is not a multiple of parallel.data_parallel=2")]:
        with pytest.raises(ConfigError, match=msg):
            validation_batch_size(cfg(bad, "parallel.data_parallel=2"))


def test_bytes_behind_tokens_are_the_text_bytes(spm_data):
    """For every whole document of the first valid samples, the counted bytes are those of its text
    (sentencepiece decodes back to the text exactly with this tokenizer)."""
    import pyarrow.parquet as pq
    import sentencepiece as spm
    from mspretrain.dataprep.inspection import read_sample
    from mspretrain.loader.manifest import load_manifest
    from mspretrain.train.eval.suite import ByteCounter, doc_starts

    sp = spm.SentencePieceProcessor(model_file=str(spm_data / "tokenizer.model"))
    counter = ByteCounter(spm_data / "tokenizer.model")
    m = load_manifest(spm_data)
    info = m.split("valid")
    prov = pq.read_table(spm_data / "provenance" / "valid.parquet").to_pylist()
    checked = 0
    for sid in range(48):
        k, row = info.locate(sid)
        ids, _ = read_sample(m.shard_path(info.shards[k]), row)
        starts = doc_starts(spm_data, "valid", [sid]).get(sid, [])
        pieces = [r for r in prov if r["sample_id"] == sid]
        assert sorted(starts) == sorted(r["sample_offset"] for r in pieces if r["doc_offset"] == 0)
        for r in pieces:
            piece = ids[r["sample_offset"]:r["sample_offset"] + r["length"]]
            if r["doc_offset"] == 0 and piece[-1] == 2:          # a whole document, EOS last
                text = sp.decode(piece[:-1].tolist())
                assert counter.count(piece, [0]) == len(text.encode("utf-8"))
                checked += 1
        # the sample's bytes are the sum of its pieces' bytes
        total = counter.count(ids, starts)
        assert total == sum(counter.count(ids[r["sample_offset"]:r["sample_offset"] + r["length"]],
                                          [0] if r["doc_offset"] == 0 else []) for r in pieces)
    assert checked >= 5


def eval_cmd(run_dir, data, *sets):
    return train_cmd("eval", run_dir, data, *sets)


def summary_of(stdout: str) -> str:
    return re.search(r"per-sample results: (\S+)", stdout).group(1)


@pytest.mark.slow
def test_eval_suite_resumes_after_sigkill_with_the_same_totals(spm_run, spm_data, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": t}) + "\n" for t in
                               ["Debian", "The package", "To install", "A file"]))
    sets = ("eval.batches=3", f"eval.prompts={prompts}", "eval.gen_tokens=12")
    p = run(eval_cmd(spm_run, spm_data, *sets))
    assert p.returncode == 0, p.stderr[-3000:]
    path = summary_of(p.stdout)
    full = json.loads(open(path.replace(".jsonl", ".summary.json")).read())
    val_loss = float(re.search(r"val_loss ([0-9.]+)", p.stdout).group(1))
    assert abs(full["loss"] - val_loss) <= 1e-5 * val_loss       # the same samples as val_loss
    assert 0.2 < full["bits_per_byte"] < 8 and full["samples"] == 48     # 3 batches of 2 x 8 rows
    assert 0 < full["acc"] < 1 and f"acc {full['acc']:.4f}" in p.stdout
    g = full["generation"]
    assert g["generations"] == 4 and 0 < g["distinct_1"] <= 1 and 1 <= g["mean_length"] <= 12
    # the same eval into another run dir copy, killed after 10 sample lines, then run again
    import shutil
    other = tmp_path / "run"
    shutil.copytree(spm_run, other, ignore=shutil.ignore_patterns("eval"))
    p = run(eval_cmd(other, spm_data, *sets), env=hooks_env(TRAIN_TEST_EVAL_KILL="10"))
    assert p.returncode == -9, p.stderr[-2000:]
    partial = list((other / "eval").glob("*-valid-*.jsonl"))
    assert len(partial) == 1 and not partial[0].read_text().endswith("}\n")    # a torn line
    p = run(eval_cmd(other, spm_data, *sets))
    assert p.returncode == 0, p.stderr[-3000:]
    again = json.loads(open(summary_of(p.stdout).replace(".jsonl", ".summary.json")).read())
    assert [len(jsonl(x)) for x in [partial[0]]] == [48]
    drop = lambda s: {k: v for k, v in s.items() if k != "results"}   # noqa: E731
    assert drop(again) == drop(full)      # bitwise: floats compared exactly


def test_eval_refuses_another_seq_length_or_tokenizer(spm_run, tmp_path):
    from synthetic import make_dataset
    other_seq = make_dataset(tmp_path / "seq32", num_train=16, num_valid=16, seq_length=32, vocab_size=1000)
    p = run(eval_cmd(spm_run, other_seq))
    assert p.returncode == 1 and "seq_length 32, but the checkpoint was trained with seq_length 64" in p.stderr, \
        p.stderr[-2000:]
    other_tok = make_dataset(tmp_path / "tok", num_train=16, num_valid=16, seq_length=64, vocab_size=1000)
    p = run(eval_cmd(spm_run, other_tok))
    assert p.returncode == 1 and "is not the one the checkpoint was trained with" in p.stderr, p.stderr[-2000:]


@pytest.mark.slow
def test_per_source_loss_of_a_blend_and_capped_batches(spm_run, spm_data, tmp_path):
    # a second source with the same tokenizer: the Chinese half of the demo corpus
    from mspretrain.dataprep.cli import main as dataprep_main
    from hf_helpers import BUILD_SETTINGS
    zh = tmp_path / "zh"
    settings = [a for a in BUILD_SETTINGS if a not in ("--vocab-size", "1000")]
    assert dataprep_main(["build", str(CORPUS.with_name("debian-reference.zh-cn.txt.gz")), "--out", str(zh),
                          *settings, "--tokenizer", str(spm_data / "tokenizer.model")]) == 0
    blend = f"eval.blend={{{spm_data}: 1.0, {zh}: 1.0}}"
    p = run(eval_cmd(spm_run, spm_data, blend, "eval.batches=100000"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "eval.batches=100000 capped at" in p.stderr
    s = json.loads(open(summary_of(p.stdout).replace(".jsonl", ".summary.json")).read())
    en, cn = s["per_source"][str(spm_data)], s["per_source"][str(zh)]
    assert en["samples"] + cn["samples"] == s["samples"] and min(en["samples"], cn["samples"]) > 0
    assert math.isclose(en["loss"] * en["tokens"] + cn["loss"] * cn["tokens"], s["loss"] * s["tokens"],
                        rel_tol=1e-12)
    assert cn["loss"] > en["loss"]          # trained on English only
    assert en["bits_per_byte"] and cn["bits_per_byte"]
