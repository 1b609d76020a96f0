"""The step is put together in one place, with everything it needs given at construction: how the
ranks combine is chosen for the layout before the step is built, and the parallel form is a new object."""
from __future__ import annotations

import numpy as np
import pytest

from mspretrain.train.config import load_config
from mspretrain.train.parallel.distributed import layout

SMALL = ["model.vocab_size=128", "model.hidden_size=64", "model.num_heads=4", "model.num_layers=2",
         "precision.dtype=fp32", "train.global_batch_size=8", "train.micro_batch_size=2", "seed=3"]


def _session(*sets):
    from mspretrain.train.assemble import build_session

    cfg = load_config(None, [*SMALL, *sets])
    return build_session(cfg, 128, 16, layout(cfg, 0, 1))


def test_one_ascend_device_accumulates_its_own_gradients_not_empty_accumulators(graph_mode):
    """One NPU with K = 4 split accumulation runs no AutoParallel, so no compiler pass fills
    `accu_grads`: the step must take GradAccumulation's own summed gradient. The same batch through
    the loop accumulation gives the same gradient in another summation order: the grad norms agree to
    fp32 rounding of a sum of 4 micro-batches (a few ulps; 1e-6 relative), and neither is 0."""
    from mindspore import nn
    from mindspore.parallel.nn import GradAccumulation

    split = _session("device=Ascend")           # train.accumulate auto: split on Ascend
    cell = split.train_step.step_cell
    assert isinstance(cell.network, GradAccumulation) and isinstance(cell.grad_reducer, nn.Identity)
    assert not cell.reduce_overflow and split.train_step is not None and split.micro_steps == 4
    loop = _session("device=Ascend", "train.accumulate=loop")
    assert loop.train_step.step_cell.loop
    batch = np.random.default_rng(0).integers(3, 128, (8, 17), dtype=np.int32)
    a, b = split.train_step(batch, 1e-3), loop.train_step(batch, 1e-3)
    assert b.grad_norm > 0 and a.grad_norm > 0
    assert a.grad_norm == pytest.approx(b.grad_norm, rel=1e-6)
    assert a.loss == pytest.approx(b.loss, rel=1e-6)


def test_one_rank_gets_no_reduction_and_the_parallel_form_is_a_new_object(graph_mode):
    from mindspore import nn

    from mspretrain.train.parallel.apply import GlobalLossStep, parallelize, reduction
    from trainer_harness import make_step

    for device in ("Ascend", "CPU"):
        cfg = load_config(None, [*SMALL, f"device={device}"])
        combine = reduction(cfg, layout(cfg, 0, 1), [], 4, loop=False)
        assert combine.grad_reducer is None and not combine.reduce_overflow and not combine.loss_is_share
    dp2 = load_config(None, ["parallel.data_parallel=2"])
    _, step = make_step("parallel.data_parallel=2", dist=layout(dp2, 0, 2))
    before = (step.cell, step.keep_state, step.step_cell.grad_reducer)
    run = parallelize(dp2, layout(dp2, 0, 2), None, step)
    assert isinstance(run, GlobalLossStep) and run is not step
    assert (step.cell, step.keep_state, step.step_cell.grad_reducer) == before
    assert isinstance(step.step_cell.grad_reducer, nn.DistributedGradReducer)
