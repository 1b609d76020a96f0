"""Validation loss and perplexity on the valid split: the first eval.batches batches of its order,
so every evaluation of the same weights reads the same samples and gives the same number."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from train.config import Config, ConfigError


def validation_loss(loss_net, cfg: Config, seq_length: int) -> float:
    """Mean next-token loss over eval.batches batches of micro-batch size (equal token counts, so the
    mean of batch means is the token mean)."""
    from mindspore import Tensor
    from loader import Loader

    if cfg.eval.batches < 1:
        raise ConfigError(f"eval.batches must be >= 1, got {cfg.eval.batches}")
    batch_size = cfg.train.micro_batch_size or cfg.train.global_batch_size // cfg.parallel.data_parallel
    losses = []
    with Loader(cfg.data.path, split=cfg.data.valid_split, global_batch_size=batch_size, seed=cfg.seed,
                num_workers=0) as ld:
        if ld.seq_length != seq_length:
            raise ConfigError(f"{cfg.data.path}: valid split seq_length {ld.seq_length} != {seq_length}")
        for _ in range(cfg.eval.batches):
            losses.append(float(loss_net(Tensor(next(ld)["input_ids"])).asnumpy()))
    return float(np.mean(np.asarray(losses, dtype=np.float64)))


def main(cfg: Config, checkpoint: str | None = None, verify_data: bool = False) -> int:
    """`train eval`: validation loss and perplexity of a checkpoint (default: the run's latest)."""
    import mindspore as ms
    from loader import Loader
    from train import checkpoint as ckpt
    from train.model import CausalLMLoss, Llama, model_args
    from train.step import apply_precision, check_precision

    check_precision(cfg)
    ckpt_dir = Path(checkpoint) if checkpoint else ckpt.latest_checkpoint(cfg.run.dir)
    if ckpt_dir is None:
        raise ckpt.CheckpointError(f"{cfg.run.dir} has no checkpoint yet (no checkpoints/latest); "
                                   f"pass --checkpoint DIR")
    from train.data_check import check_against_checkpoint, check_dataset
    check_against_checkpoint(check_dataset(cfg.data.path, (cfg.data.valid_split,), verify_data),
                             ckpt.read_state(ckpt_dir), ckpt_dir)
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device(cfg.device)
    with Loader(cfg.data.path, split=cfg.data.valid_split, global_batch_size=1, seed=cfg.seed) as ld:
        vocab, seq = ld.vocab_size, ld.seq_length
    model = Llama(model_args(cfg.model, vocab, seq, cfg.device, cfg.precision.dtype), cfg.seed)
    loss_net = CausalLMLoss(apply_precision(model, cfg.precision), model.args.vocab_size)
    weights = {p.name: p for p in loss_net.get_parameters()}
    ckpt.load_params(ckpt_dir, weights, allow_extra=True)
    loss = validation_loss(loss_net, cfg, seq)
    step = ckpt.read_state(ckpt_dir).get("step")
    print(f"checkpoint {ckpt_dir} (step {step}): val_loss {loss:.6f}  val_ppl {math.exp(min(loss, 700)):.4f}"
          f"  ({cfg.eval.batches} batches of split {cfg.data.valid_split!r})")
    return 0
