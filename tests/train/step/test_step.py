import numpy as np
import pytest

from mspretrain.train.config import ConfigError, load_config
from mspretrain.train.step.optim import lr_at, no_decay

from trainer_harness import ARGS, BATCHES, REDUCTION_ORDER_RTOL, make_step, snapshot


def test_lr_schedule_is_warmup_then_cosine():
    o = load_config(None, ["optim.lr=1.0", "optim.min_lr=0.1", "optim.warmup_steps=4"]).optim
    lrs = [lr_at(s, o, 20) for s in range(1, 21)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a > b for a, b in zip(lrs[3:], lrs[4:]))          # strictly decreasing after warmup
    assert lrs[-1] == pytest.approx(0.1) and lr_at(25, o, 20) == pytest.approx(0.1)
    assert lr_at(12, o, 20) == pytest.approx(0.55)                 # half-way: the mean of lr and min_lr


EOS = 5                 # in BATCHES (ids 3..63) about 1 token in 60 is this "EOS"


def _eos_heavy(batch):
    """BATCHES[i] with EOS at unequal rates per micro-batch, so that token counts differ."""
    out = batch.copy()
    out[::2, ::3] = EOS         # every other sample (micro-batches of 2: one sample each) loses 1/3
    out[0, :8] = EOS
    return out


@pytest.mark.parametrize("mode", ["loop", "split"])
@pytest.mark.parametrize("eod", [-1, EOS])
def test_gradient_accumulation_is_exact(graph_mode, mode, eod):
    """4 micro-batches of 2 accumulate to the gradient of one batch of 8, in both in-graph accumulation
    modes (loop: a while loop over micro-batches; split: one backward), also with the EOD loss mask and
    unequal token counts per micro-batch: every micro-batch's loss sum is divided by the whole batch's
    token count, so the two differ only by the order of fp32 sums."""
    _, whole = make_step("optim.clip_norm=0", eod=eod)
    _, accum = make_step("optim.clip_norm=0", f"train.accumulate={mode}", micro_steps=4, eod=eod)
    for batch in BATCHES[:2]:
        batch = _eos_heavy(batch) if eod >= 0 else batch
        a, b = whole(batch, 1e-3), accum(batch, 1e-3)
        assert a.loss == pytest.approx(b.loss, rel=REDUCTION_ORDER_RTOL)
        assert a.grad_norm == pytest.approx(b.grad_norm, rel=REDUCTION_ORDER_RTOL)
    wa, wb = snapshot(whole), snapshot(accum)
    for name in wa:
        np.testing.assert_allclose(wa[name], wb[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert wb["global_step"] == 2
    assert len(accum.accumulators) == (len(whole.step_cell.weights) if mode == "loop" else 0)
    assert not whole.accumulators                          # K = 1: no accumulators at all


def test_accumulators_restart_from_zero_each_step(graph_mode):
    """The loop mode's accumulators are zeroed inside the step: the same batch twice from the same
    state gives the same gradient norm (a leftover sum would double it)."""
    _, step = make_step("optim.clip_norm=0", "train.accumulate=loop", micro_steps=2)
    first = step(BATCHES[0], 0.0)                   # lr 0: the weights do not move
    second = step(BATCHES[0], 0.0)
    assert first.grad_norm == second.grad_norm and first.loss == second.loss
    assert any(a.asnumpy().any() for a in step.accumulators)


def test_clipping_bounds_the_update_and_reports_the_raw_norm(graph_mode):
    _, free = make_step("optim.clip_norm=0")
    _, clipped = make_step("optim.clip_norm=0.01")
    r_free, r_clip = free(BATCHES[0], 1e-3), clipped(BATCHES[0], 1e-3)
    assert r_free.grad_norm == pytest.approx(r_clip.grad_norm) and r_clip.grad_norm > 0.1
    # AdamW's first moment after one step is (1 - beta1) * g: its global norm shows the clipped g
    m = np.sqrt(sum((v ** 2).sum() for k, v in snapshot(clipped).items() if k.startswith("adam_m.")))
    assert m == pytest.approx(0.1 * 0.01, rel=1e-3)


def test_norms_are_not_decayed(graph_mode):
    """With zero gradients AdamW only decays: matrices shrink by lr * wd, norm weights stay 1."""
    _, step = make_step("optim.weight_decay=0.5")
    before = snapshot(step)
    from mindspore import Tensor, ops
    opt = step.step_cell.optimizer            # an update with exactly zero gradients
    ops.assign(opt.learning_rate, Tensor(np.float32(0.1)))
    opt(tuple(ops.zeros_like(p) for p in opt.parameters))
    after = snapshot(step)
    w = "model.layers.0.attention.wq.weight"
    np.testing.assert_allclose(after[w], before[w] * (1 - 0.1 * 0.5), rtol=1e-6)
    np.testing.assert_array_equal(after["model.layers.0.ffn_norm.weight"], before["model.layers.0.ffn_norm.weight"])
    assert no_decay("model.norm.weight", 1) and not no_decay("model.output.weight", 2)


def test_fp16_overflow_skips_the_step_and_moves_the_scale(graph_mode):
    """A huge initial scale overflows fp16 gradients: flagged, weights and moments untouched, scale
    halved each time; after `window` clean steps the scale grows by `factor`."""
    _, step = make_step("precision.dtype=fp16", "precision.amp_level=O2",
                        "precision.loss_scale.init=1099511627776.0",  # 2**40
                        "precision.loss_scale.window=2", "precision.loss_scale.factor=2.0")
    before = snapshot(step)
    r = step(BATCHES[0], 1e-3)
    assert r.overflow and r.loss_scale == 2.0 ** 40 and np.isfinite(r.loss)
    after = snapshot(step)
    for name in before:
        if name not in ("loss_scale", "learning_rate"):
            np.testing.assert_array_equal(before[name], after[name], err_msg=name)
    assert after["loss_scale"] == 2.0 ** 39 and after["global_step"] == 0
    scales, flags = [], []
    for i in range(40):
        r = step(BATCHES[i % 4], 1e-3)
        scales.append(r.loss_scale)
        flags.append(r.overflow)
        if len(flags) >= 3 and flags[-3:] == [False, False, False]:
            break
    first_clean = flags.index(False)
    assert all(flags[:first_clean]) and scales[first_clean] < 2.0 ** 39
    assert [s / scales[first_clean] for s in scales[first_clean:first_clean + 3]] == [1.0, 1.0, 2.0]
    assert snapshot(step)["global_step"] > 0                        # clean steps did update


@pytest.mark.parametrize("level", ["O1", "O2"])
def test_fp16_levels_track_fp32(graph_mode, level):
    _, ref = make_step()
    _, half = make_step("precision.dtype=fp16", f"precision.amp_level={level}")
    for batch in BATCHES[:2]:
        a, b = ref(batch, 1e-3), half(batch, 1e-3)
        assert not b.overflow and b.loss_scale == 65536.0
        assert b.loss == pytest.approx(a.loss, abs=2e-2) and b.loss != a.loss


def _auto_o2_step(*sets):
    """The reference: the step as precision O2 was built before the held casts, by MindSpore's
    auto_mixed_precision(O2) (to_float(fp16) on every cell, _OutputTo32 on the logits) with the RMSNorms
    back in fp32; the model and loss otherwise as make_step builds them."""
    from mindspore import amp
    from mindspore.common import dtype as mstype

    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.layers import RMSNorm

    from mspretrain.train.models.llama.model import Llama
    from mspretrain.train.step.optim import build_optimizer
    from mspretrain.train.step.cell import build_train_step

    cfg = load_config(None, list(sets))
    model = Llama(ARGS, seed=11)
    wrapped = amp.auto_mixed_precision(model, "O2", dtype=mstype.float16)
    for _, cell in model.cells_and_names():
        if isinstance(cell, RMSNorm):
            cell.to_float(mstype.float32)
    loss = CausalLMLoss(wrapped, ARGS.vocab_size, -1)
    return build_train_step(loss, build_optimizer(loss.trainable_params(), cfg.optim), 1, cfg)


def test_explicit_o2_matches_mindspores_auto_o2(graph_mode):
    """O2 as the model's own held casts computes what auto_mixed_precision(O2) did. The forward
    is the same primitives in the same dtypes (the embeddings are cast after the lookup instead of
    the table before it: the same values), so the step-1 loss is bitwise equal. The one difference is
    backward: the embedding table's gradient now sums the positions of a token in fp32, where auto O2
    summed them in fp16. A row that n positions share then differs by at most (n - 1) fp16 roundings,
    relative (u = 2^-11), which bounds the step-1 grad norm's relative difference by (n_max - 1) * u.
    The later losses may differ through the weights moved by those updates; they must stay within one
    fp16 rounding of the loss itself (u * loss), far below fp16-vs-fp32's differences (2e-2 above)."""
    sets = ("precision.dtype=fp16", "precision.amp_level=O2")
    _, explicit = make_step(*sets)
    auto = _auto_o2_step(*sets)
    u = 2.0 ** -11
    for i, batch in enumerate(BATCHES):
        a, b = explicit(batch, 1e-3), auto(batch, 1e-3)
        assert not a.overflow and not b.overflow
        if i == 0:
            assert a.loss == b.loss
            n_max = np.bincount(batch[:, :-1].ravel()).max()
            assert a.grad_norm == pytest.approx(b.grad_norm, rel=(n_max - 1) * u)
        else:
            assert a.loss == pytest.approx(b.loss, abs=u * b.loss)


def test_precision_config_errors():
    from mspretrain.train.step.precision import check_precision

    with pytest.raises(ConfigError, match="bf16 needs device Ascend"):
        check_precision(load_config(None, ["precision.dtype=bf16"]))
    check_precision(load_config(None, ["precision.dtype=bf16", "device=Ascend"]))
    with pytest.raises(ConfigError, match="precision.dtype"):
        check_precision(load_config(None, ["precision.dtype=fp8"]))
    with pytest.raises(ConfigError, match="amp_level"):
        check_precision(load_config(None, ["precision.amp_level=O3"]))
    with pytest.raises(ConfigError, match="loss_scale"):
        check_precision(load_config(None, ["precision.dtype=fp16", "precision.loss_scale.factor=1.0"]))
    o1_mp = ["device=Ascend", "precision.dtype=bf16", "precision.amp_level=O1", "parallel.model_parallel=2"]
    with pytest.raises(ConfigError) as err:
        check_precision(load_config(None, o1_mp))
    for key in ("precision.amp_level=O1", "parallel.model_parallel=2", "precision.amp_level=O2"):
        assert key in str(err.value)
    check_precision(load_config(None, [*o1_mp[:3], "parallel.model_parallel=1"]))     # O1 on one slice
    check_precision(load_config(None, [*o1_mp[:2], "precision.amp_level=O2", o1_mp[3]]))


def test_pipeline_accumulator_hands_over_the_sums_and_zeroes_them(graph_mode):
    """The part of the pipeline (pp > 1, Ascend only) path that CPU can run: PipelineAccumulator as a
    graph of its own. The pipeline pass would have summed the micro-batch gradients into `accu_grads.*`;
    here they are set by hand. It must return those sums (not the `grads` it is given: with pipeline
    stages those are only the last micro-batch's) and leave the buffers zero for the next step."""
    import numpy as np
    from mindspore import Parameter, ParameterTuple, Tensor, nn

    from mspretrain.train.step.cell import ACCU_PREFIX, PipelineAccumulator

    params = ParameterTuple([Parameter(Tensor(np.zeros((2, 3), np.float32)), name="w"),
                             Parameter(Tensor(np.zeros(4, np.float32)), name="b")])
    acc = PipelineAccumulator(params)
    assert [p.name for p in acc.accu_grads] == [f"{ACCU_PREFIX}.w", f"{ACCU_PREFIX}.b"]
    sums = [np.arange(6, dtype=np.float32).reshape(2, 3) + 1, np.full(4, 2.5, np.float32)]
    for p, v in zip(acc.accu_grads, sums):
        p.set_data(Tensor(v))

    class Step(nn.Cell):
        def __init__(self):
            super().__init__()
            self.acc = acc

        def construct(self, g0, g1):
            return self.acc((g0, g1))

    last = (Tensor(np.full((2, 3), 9.0, np.float32)), Tensor(np.full(4, 9.0, np.float32)))
    out = Step()(*last)
    for got, want in zip(out, sums):
        np.testing.assert_array_equal(got.asnumpy(), want)
    for p in acc.accu_grads:
        assert not p.asnumpy().any()


@pytest.mark.parametrize("shape", [(7,), (64, 64), (3, 5, 129)])
def test_the_norms_square_sums_agree_by_either_kernel(graph_mode, shape):
    """The gradient norm's square sums: the element-wise form (what the semi-auto compiler lays out on
    Ascend) and the dot product (CPU/GPU, one pass). Both are fp32 sums of n positive terms, so each
    is within (n - 1) u of the exact sum whatever its order (u = 2**-24): checked against float64."""
    from mindspore import Tensor, nn

    from mspretrain.train.step.cell import _dot_square_sum, _square_sum

    class Sums(nn.Cell):
        def construct(self, g):
            return _square_sum(g), _dot_square_sum(g)

    g = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    exact = float(np.square(g.astype(np.float64)).sum())
    bound = (g.size - 1) * 2.0 ** -24
    for value in Sums()(Tensor(g)):
        assert value.shape == (1,)
        assert float(value.asnumpy()[0]) == pytest.approx(exact, rel=bound)
