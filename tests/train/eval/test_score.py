"""`train score`: per-token log-probabilities from the model's forward, windows for long documents,
perplexity, and errors that name the input line."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hf_helpers import cli, jsonl


def test_windows_predict_every_token_once():
    from mspretrain.train.eval.score import windows
    ids = list(range(10))
    w = windows(ids, 4)
    assert w == [[0, 1, 2, 3, 4], [4, 5, 6, 7, 8], [8, 9]]
    assert sum(len(x) - 1 for x in w) == 9
    assert windows([5], 4) == [] and windows([5, 6], 4) == [[5, 6]]


def test_score_command(spm_run, spm_data, tmp_path, graph_mode):
    from mindspore import Tensor
    from mspretrain.loader import Loader
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.runinfo import load_run_model

    with Loader(spm_data, split="valid", global_batch_size=2, seed=0, num_workers=0) as ld:
        sample = next(ld)["input_ids"]
    long_doc = np.concatenate([sample[0], sample[1][:30]]).tolist()         # 95 tokens: 2 windows
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"tokens": sample[0].tolist()}) + "\n" + json.dumps({"tokens": long_doc}) + "\n"
                   + json.dumps({"text": "Debian is an operating system."}) + "\n")
    out = tmp_path / "out.jsonl"
    p = cli("score", spm_run, "--input", src, "--out", out)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = jsonl(out)
    assert [len(r["logprobs"]) for r in rows[:2]] == [64, 94]
    model, _, _ = load_run_model(spm_run)
    loss = float(CausalLMLoss(model, model.args.vocab_size)(Tensor(sample[:1])).asnumpy())
    lp = np.asarray(rows[0]["logprobs"])
    assert abs(-lp.mean() - loss) <= 1e-5 * loss
    assert math.isclose(rows[0]["perplexity"], math.exp(-lp.mean()), rel_tol=1e-9)
    assert all(x <= 0 for r in rows for x in r["logprobs"])
    # the first window of the long document is the sample itself: same log-probabilities
    assert np.allclose(rows[1]["logprobs"][:64], rows[0]["logprobs"], atol=1e-6)
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(spm_data / "tokenizer.model"))
    assert rows[2]["num_tokens"] == len(sp.encode("Debian is an operating system.")) + 2   # EOS .. EOS

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens": [2, 5]}\n{"tokens": [2, 99999]}\n')
    p = cli("score", spm_run, "--input", bad, "--out", tmp_path / "x.jsonl")
    assert p.returncode == 1 and f"{bad}:2: token id 99999 outside [0, 1000)" in p.stderr, p.stderr[-2000:]


@pytest.mark.slow
def test_score_masks_documents_like_training(spm_data, spm_run, tmp_path):
    """A run trained with model.document_mask and reset_position_ids: an EOS inside a scored line ends a
    document as in a packed sample, so the tokens after it score the same whatever came before the EOS
    (and the same as that document alone after an EOS). A run trained without them attends across."""
    from hf_helpers import train_run

    masked = train_run(tmp_path / "run", spm_data, "model.document_mask=true",
                       "model.reset_position_ids=true", steps=2)
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(spm_data / "tokenizer.model"))
    a = sp.encode("Debian is an operating system with many packages.")
    a2 = sp.encode("The kernel boots.")
    b = sp.encode("Install it with apt-get and read the manual pages.")
    lines = [[2] + a + [2] + b, [2] + a2 + [2] + b, [2] + b]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"tokens": t}) + "\n" for t in lines))

    def tail_of_b(run):
        out = tmp_path / "out.jsonl"
        p = cli("score", run, "--input", src, "--out", out)
        assert p.returncode == 0, p.stderr[-2000:]
        rows = jsonl(out)
        assert [len(r["logprobs"]) for r in rows] == [len(t) - 1 for t in lines]
        # predictions of b[1:] (b[0] is predicted at the EOS, which attends to what precedes it)
        return [np.asarray(r["logprobs"][-(len(b) - 1):]) for r in rows]

    first, second, alone = tail_of_b(masked)
    assert np.abs(first - second).max() <= 1e-5 and np.abs(first - alone).max() <= 1e-5
    first, second, alone = tail_of_b(spm_run)          # trained with document_mask=false
    assert np.abs(first - second).max() > 1e-3
