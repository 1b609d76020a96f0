"""train.z_loss: the loss grows by z * mean(logsumexp(logits)^2) over the loss tokens, checked against
numpy on a known batch, and the step reports the term it added."""
import numpy as np
import pytest

from trainer_harness import ARGS, BATCHES, make_step

Z = 1e-2      # large enough that the term (~0.17 at init) is far above fp32 rounding of a ~4.2 loss


def _lse_sq(logits: np.ndarray) -> np.ndarray:
    """logsumexp(logits)^2 per position, in float64."""
    x = logits.astype(np.float64).reshape(-1, logits.shape[-1])
    top = x.max(-1, keepdims=True)
    lse = (np.log(np.exp(x - top).sum(-1, keepdims=True)) + top).reshape(-1)
    return lse * lse


def _tolerance(n_tokens: int, loss: float) -> float:
    # Each loss is an fp32 mean of n per-token values of size ~loss: a sum of n fp32 terms is off by
    # at most n * eps * |sum| (sequential summation bound), i.e. n * eps * loss after the division;
    # two such losses are subtracted, and the numpy side is float64 (negligible).
    return 2 * n_tokens * np.finfo(np.float32).eps * loss


@pytest.mark.parametrize("eod", [-1, 7])
def test_z_loss_adds_the_expected_term(graph_mode, eod):
    from mindspore import Tensor
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.llama.model import Llama

    ids = BATCHES[0].copy()
    if eod >= 0:
        ids[:, ::5] = eod                           # some EOS inputs: left out of both means
    model = Llama(ARGS, seed=11)
    plain = CausalLMLoss(model, ARGS.vocab_size, eod)
    with_z = CausalLMLoss(model, ARGS.vocab_size, eod, z_loss=Z)
    base = float(plain(Tensor(ids)).asnumpy())
    total = float(with_z(Tensor(ids)).asnumpy())
    logits = model(Tensor(ids[:, :-1])).asnumpy()
    keep = (ids[:, :-1] != eod).reshape(-1) if eod >= 0 else np.ones(ids[:, :-1].size, bool)
    expected = Z * _lse_sq(logits)[keep].mean()
    tol = _tolerance(int(keep.sum()), total)
    assert abs((total - base) - expected) <= tol, (total - base, expected, tol)
    assert expected > 100 * tol                     # the check can tell z-loss from no z-loss
    reading = float(with_z.z_value.asnumpy())       # what the metrics log as z_loss
    assert abs(reading - expected) <= tol


def test_step_reports_z_loss_and_it_is_not_checkpointed(graph_mode):
    _, plain = make_step("optim.clip_norm=0")
    _, zed = make_step("optim.clip_norm=0", f"train.z_loss={Z}")
    a, b = plain(BATCHES[0], 0.0), zed(BATCHES[0], 0.0)
    assert a.z_loss == 0.0
    assert b.z_loss > 0 and abs((b.loss - a.loss) - b.z_loss) <= _tolerance(BATCHES[0][:, 1:].size, b.loss)
    assert set(plain.state_parameters()) == set(zed.state_parameters())   # same checkpoint layout


def test_z_loss_with_accumulation_is_the_mean_over_micro_batches(graph_mode):
    _, whole = make_step("optim.clip_norm=0", f"train.z_loss={Z}")
    _, loop = make_step("optim.clip_norm=0", f"train.z_loss={Z}", "train.accumulate=loop", micro_steps=4)
    a, b = whole(BATCHES[0], 0.0), loop(BATCHES[0], 0.0)
    assert abs(a.z_loss - b.z_loss) <= _tolerance(BATCHES[0][:, 1:].size, a.z_loss)


@pytest.mark.parametrize("device", ["CPU", "Ascend"])
def test_split_accumulation_reports_every_micro_batchs_z_loss(graph_mode, device):
    """K = 2 split (MicroBatchSum; on an Ascend config MindSpore's GradAccumulation, run here on the CPU
    target) reads the z-loss once after both micro-batches: it must hold both terms, as the loop's
    per-micro-batch readings do. Both add the same two fp32 micro-batch sums (1e-6 relative covers a
    regrouping); the whole batch's term (K = 1) pins the absolute value, which one micro-batch's half
    would miss by 50%."""
    sets = ("optim.clip_norm=0", f"train.z_loss={Z}", f"device={device}")
    _, split = make_step(*sets, "train.accumulate=split", micro_steps=2)
    _, loop = make_step(*sets, "train.accumulate=loop", micro_steps=2)
    _, whole = make_step(*sets)
    assert split.step_cell.loop is False and loop.step_cell.loop is True
    for batch in BATCHES[:2]:                       # twice: the reading restarts from zero each step
        a, b, c = split(batch, 0.0), loop(batch, 0.0), whole(batch, 0.0)
        assert a.z_loss == pytest.approx(b.z_loss, rel=1e-6)
        assert a.z_loss > 0 and abs(a.z_loss - c.z_loss) <= _tolerance(batch[:, 1:].size, c.z_loss)
        assert a.loss == pytest.approx(b.loss, rel=1e-6)
