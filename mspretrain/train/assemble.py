"""The one place the training step is put together: the model, its precision and recompute, the loss,
the optimizer, the accumulation, how the ranks combine, and the parallel form of the step.

Everything a step needs is given when it is built (train.step.Reduction says how the ranks combine);
`parallelize` then returns the object to run, leaving the built step as it is.
"""
from __future__ import annotations

from dataclasses import dataclass

from mspretrain.train import hooks
from mspretrain.train.config import Config, ConfigError
from mspretrain.train.models import spec as model_spec
from mspretrain.train.models.flops import count_params, flops_per_token
from mspretrain.train.parallel import apply as parallel
from mspretrain.train.parallel.recompute import apply_recompute
from mspretrain.train.step import batching
from mspretrain.train.step.cell import build_train_step, loops
from mspretrain.train.step.loss import CausalLMLoss
from mspretrain.train.step.optim import build_optimizer
from mspretrain.train.step.precision import apply_precision


@dataclass
class Session:
    """Everything built for one process: model, loss, optimizer and the train step."""
    args: object                # the family's model arguments (ModelSpec.model_args)
    model: object               # the family's model (ModelSpec.build_model), fp32 master weights
    loss_net: object            # CausalLMLoss over the mixed-precision cell
    optimizer: object
    train_step: object          # what the loop runs: the TrainStep, or its parallel form
    flops_per_token: float
    micro_steps: int
    eval_net: object            # the loss cell validation runs (parallel-wrapped on Ascend)


def build_session(cfg: Config, vocab_size: int, seq_length: int, dist, eos_id: int | None = None) -> Session:
    """The model of cfg's family, its precision and recompute, the losses, the optimizer and the
    train step, built once and in this order; then the parallel form of the step (a new object)."""
    family = model_spec.of(cfg)
    args = family.model_args(cfg.model, vocab_size, seq_length, cfg.device, cfg.precision.dtype, eos_id)
    if args.vocab_size < vocab_size:
        raise ConfigError(f"model.vocab_size ({args.vocab_size}) is smaller than the dataset's tokenizer "
                          f"vocabulary ({vocab_size})")
    batching.check_batch(cfg, dist.dp_size)
    model = family.build_model(args, cfg.seed)
    compute = apply_precision(model, cfg.precision)
    apply_recompute(model, cfg.recompute)
    eod = eos_id if cfg.train.eod_mask_loss and eos_id is not None else -1
    # validation: the mean, and the next-token hits for val_acc
    loss_net = CausalLMLoss(compute, args.vocab_size, eod, z_loss=cfg.train.z_loss, hits=True)
    # the step: token-loss sum / the global batch's token count
    train_loss = loss_net.summed(lazy_inline=parallel.lazy_inline_loss(cfg))
    optimizer = build_optimizer(loss_net.trainable_params(), cfg.optim)
    pipeline = parallel.pipeline_loss_cell(cfg, train_loss)
    if pipeline is None:
        k = batching.micro_batches(cfg, dist.dp_size)
        combine = parallel.reduction(cfg, dist, optimizer.parameters, k, loops(cfg, k))
        step = build_train_step(train_loss, optimizer, k, cfg, reduction=combine)
    else:       # Ascend pipeline stages: its micro-batches are the accumulation
        k = cfg.parallel.micro_batch_num
        combine = parallel.reduction(cfg, dist, optimizer.parameters, k, loop=False)
        step = build_train_step(train_loss, optimizer, k, cfg, network=pipeline, splits_batch=True,
                                reduction=combine)
    run = parallel.parallelize(cfg, dist, model, step, loss_cell=loss_net)
    run = hooks.load().wrap_step(run, dist, model)
    eval_net = parallel.parallel_forward(cfg, dist, model, loss_net)
    return Session(args, model, loss_net, optimizer, run,
                   flops_per_token(args, count_params(model)), step.micro_steps, eval_net)
