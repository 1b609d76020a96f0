"""val_acc, the next-token accuracy of the periodic validation: counted in the validation graph
(train.step.loss.CausalLMLoss hits=True) from the loss's own reductions over the vocabulary, checked
against a numpy oracle on the logits of a separate forward of the same weights. A count ratio: equal
exactly. Ties with the top logit count as hits (the rule the split-vocabulary graph can compute)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from trainer_harness import ARGS, BATCHES, launch_cmd, records, run

EOS = 2


def _oracle_hits(logits: np.ndarray, ids: np.ndarray, eod: int) -> tuple[int, int, int]:
    """(hits with ties counted, hits by np.argmax (first index of the top), kept tokens) of a batch:
    logits [B, S, V] of ids[:, :-1], labels ids[:, 1:]; positions whose input is `eod` left out."""
    labels = ids[:, 1:]
    label_logit = np.take_along_axis(logits, labels[..., None], -1)[..., 0]
    keep = ids[:, :-1] != eod if eod >= 0 else np.ones(labels.shape, bool)
    tie_hits = (label_logit >= logits.max(-1)) & keep
    argmax_hits = (logits.argmax(-1) == labels) & keep
    return int(tie_hits.sum()), int(argmax_hits.sum()), int(keep.sum())


@pytest.fixture(scope="module")
def acc_run(tiny_data, tmp_path_factory):
    """configs/tiny.yaml (packed-document mask, EOD loss mask) trained 20 steps, validated at 10 and 20."""
    run_dir = tmp_path_factory.mktemp("acc_run") / "run"
    p = run(launch_cmd(run_dir, tiny_data, "train.steps=20", "eval.every_steps=10", "checkpoint.every_steps=10",
                       "data.num_workers=0"))
    assert p.returncode == 0, p.stderr[-3000:]
    return run_dir, p.stdout


def _validation_oracle(run_dir, step: int) -> tuple[int, int, int]:
    """The oracle over the batches validation reads (evalsuite.validation_loader, capped_batches),
    with the step's checkpoint loaded into a model whose logits come from its own forward."""
    import mindspore as ms
    from mindspore import Tensor
    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train.eval.suite import capped_batches, validation_loader
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.llama.model import Llama, model_args
    from mspretrain.train.runinfo import checkpoint_dir, run_config

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    cfg = run_config(run_dir)
    ld, batch_size = validation_loader(cfg, cfg.data.path, cfg.data.valid_split)
    totals = np.zeros(3, np.int64)
    with ld:
        eos = ld.tokenizer.eos_id
        model = Llama(model_args(cfg.model, ld.vocab_size, ld.seq_length, "CPU", "fp32", eos), cfg.seed)
        holder = CausalLMLoss(model, model.args.vocab_size, eos)     # the names the checkpoint uses
        ckpt.load_params(checkpoint_dir(run_dir, step), {p.name: p for p in holder.get_parameters()},
                         allow_extra=True)
        for _ in range(capped_batches(cfg, ld.num_samples, batch_size, cfg.data.valid_split)):
            ids = next(ld)["input_ids"]
            logits = model(Tensor(ids[:, :-1])).asnumpy()
            totals += _oracle_hits(logits, ids, eos if cfg.train.eod_mask_loss else -1)
    return tuple(int(x) for x in totals)


def test_val_acc_equals_the_numpy_oracle_exactly(acc_run):
    run_dir, stdout = acc_run
    evals = [r for r in records(run_dir) if r.get("eval")]
    assert [r["step"] for r in evals] == [10, 20]
    for rec in evals:
        tie_hits, argmax_hits, tokens = _validation_oracle(run_dir, rec["step"])
        assert tokens > 0 and tie_hits == argmax_hits       # fp32 logits of a trained model: no ties here
        assert rec["val_acc"] == tie_hits / tokens, (rec["val_acc"], tie_hits, tokens)
    assert all(10 / 128 < r["val_acc"] < 1 for r in evals)      # learnable patterns: far above chance (1/128)
    # the console's eval line shows it
    assert re.search(rf"step +20/20  val_loss \S+  val_ppl \S+  val_acc {evals[1]['val_acc']:.4f}", stdout)


def test_train_eval_prints_the_same_val_acc(acc_run, tiny_data):
    run_dir, _ = acc_run
    p = run(launch_cmd(run_dir, tiny_data, "data.num_workers=0", command="eval"))
    assert p.returncode == 0, p.stderr[-3000:]
    last = [r for r in records(run_dir) if r.get("eval")][-1]
    assert re.search(r"val_acc (\S+)", p.stdout).group(1) == f"{last['val_acc']:.4f}"
    assert re.search(r"val_loss (\S+)", p.stdout).group(1) == f"{last['val_loss']:.6f}"


@pytest.mark.parametrize("eod", [-1, EOS])
def test_ties_with_the_top_logit_count_as_hits(graph_mode, eod):
    """An output layer that is zero but for one token's row: at each position every other token's
    logit is exactly 0, so the label ties with the top whenever token 5's logit is <= 0. Each such tied
    label counts (np.argmax, first index, would give 0 hits: the labels are >= 3); the count equals the
    oracle's and the eval suite's per-token hits agree."""
    from mindspore import Tensor
    from mspretrain.train.eval.suite import _log_probs_and_hits
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.llama.model import Llama

    ids = BATCHES[0].copy()
    ids[:, 1:] = np.where(np.arange(16) % 3 == 0, 5, ids[:, 1:])    # label 5 often: hits both ways
    if eod >= 0:
        ids[:, ::7] = eod
    model = Llama(ARGS, seed=11)
    weight = np.zeros(model.output.weight.shape, np.float32)
    weight[5] = model.output.weight.asnumpy()[5]
    model.output.weight.set_data(Tensor(weight))
    loss, hits, tokens = CausalLMLoss(model, ARGS.vocab_size, eod, hits=True)(Tensor(ids))
    logits = model(Tensor(ids[:, :-1])).asnumpy()
    tie_hits, argmax_hits, kept = _oracle_hits(logits, ids, eod)
    assert float(tokens.asnumpy()) == kept and float(hits.asnumpy()) == tie_hits
    assert tie_hits > argmax_hits              # the tie rule is what this counted, not argmax
    five = logits[..., 5]
    assert (five > 0).any() and (five < 0).any()        # both kinds of position are present
    _, suite_hits = _log_probs_and_hits(model)(Tensor(ids))
    label_logit = np.take_along_axis(logits, ids[:, 1:, None], -1)[..., 0]
    assert (suite_hits.asnumpy() == (label_logit >= logits.max(-1))).all()


def test_zeroed_head_every_token_a_hit(graph_mode):
    """All logits equal: every kept position ties with the top, val_acc 1."""
    from mindspore import Tensor
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.llama.model import Llama

    model = Llama(ARGS, seed=11)
    model.output.weight.set_data(Tensor(np.zeros(model.output.weight.shape, np.float32)))
    ids = BATCHES[1].copy()
    ids[:, ::4] = EOS
    _, hits, tokens = CausalLMLoss(model, ARGS.vocab_size, EOS, hits=True)(Tensor(ids))
    assert float(hits.asnumpy()) == float(tokens.asnumpy()) == int((ids[:, :-1] != EOS).sum())
