"""Validation loss and perplexity on the valid split: the first eval.batches batches of its order,
so every evaluation of the same weights reads the same samples and gives the same number."""
from __future__ import annotations

import hashlib
import math
import sys
from pathlib import Path

import numpy as np

from mspretrain.train.config import Config, ConfigError


def validation_loss(loss_net, cfg: Config, seq_length: int, path: str | None = None,
                    extras: dict | None = None) -> float:
    """Mean next-token loss over eval.batches batches of eval.batch_size rows (evalsuite.
    validation_batch_size; equal token counts, so the mean of batch means is the token mean) of the
    valid split of `path` (default data.path). With train.z_loss the z-loss term is taken out (val_loss
    stays the cross entropy, comparable across runs) and its mean goes to extras["val_z_loss"]. A loss
    cell built with hits=True also gives extras["val_acc"]: the next-token accuracy, hits / tokens
    summed over the batches (ties with the top logit count as hits; train.step.loss.CausalLMLoss)."""
    from mspretrain.train.step.cell import z_loss_reading
    from mindspore import Tensor

    from mspretrain.train.eval.suite import capped_batches, validation_loader

    if cfg.eval.batches < 1:
        raise ConfigError(f"eval.batches must be >= 1, got {cfg.eval.batches}")
    path = path or cfg.data.path
    losses, z_terms = [], []
    hits = tokens = 0
    z_value = z_loss_reading(loss_net)
    ld, batch_size = validation_loader(cfg, path, cfg.data.valid_split)   # the same rows for every layout
    with ld:
        if ld.seq_length != seq_length:
            raise ConfigError(f"{path}: valid split seq_length {ld.seq_length} != {seq_length}")
        for _ in range(capped_batches(cfg, ld.num_samples, batch_size, cfg.data.valid_split)):
            out = loss_net(Tensor(next(ld)["input_ids"]))
            if isinstance(out, (tuple, list)):      # (loss, hits, tokens): counts, exact in fp32
                out, h, n = out
                hits, tokens = hits + round(float(h.asnumpy())), tokens + round(float(n.asnumpy()))
            loss = float(out.asnumpy())
            z = float(z_value.asnumpy()) if z_value is not None else 0.0
            losses.append(loss - z)
            z_terms.append(z)
    if extras is not None and z_value is not None:
        extras["val_z_loss"] = float(np.mean(np.asarray(z_terms, dtype=np.float64)))
    if extras is not None and tokens:
        extras["val_acc"] = hits / tokens
    return float(np.mean(np.asarray(losses, dtype=np.float64)))


def main(cfg: Config, checkpoint: str | None = None, verify_data: bool = False) -> int:
    """`train eval`: validation loss and perplexity of a checkpoint (default: the run's latest)."""
    import mindspore as ms
    from mspretrain.loader import Loader
    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models import spec as model_spec
    from mspretrain.train.step.precision import apply_precision, check_precision

    check_precision(cfg)
    ckpt_dir = Path(checkpoint) if checkpoint else ckpt.latest_checkpoint(cfg.run.dir)
    if ckpt_dir is None:
        raise ckpt.CheckpointError(f"{cfg.run.dir} has no checkpoint yet (no checkpoints/latest); "
                                   f"pass --checkpoint DIR")
    from mspretrain.train.data_check import check_dataset
    check_dataset(cfg.data.path, (cfg.data.valid_split,), verify_data)   # intact?
    check_fits_checkpoint(ckpt_dir, cfg)                                 # its tokenizer, seq_length
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device(cfg.device)
    with Loader(cfg.data.path, split=cfg.data.valid_split, global_batch_size=1, seed=cfg.seed) as ld:
        vocab, seq, eos = ld.vocab_size, ld.seq_length, ld.tokenizer.eos_id
    # the same document masking and EOD loss mask as training, so the numbers compare
    family = model_spec.of(cfg)
    model = family.build_model(family.model_args(cfg.model, vocab, seq, cfg.device, cfg.precision.dtype, eos),
                               cfg.seed)
    loss_net = CausalLMLoss(apply_precision(model, cfg.precision), model.args.vocab_size,
                            eos if cfg.train.eod_mask_loss else -1, hits=True)
    weights = {p.name: p for p in loss_net.get_parameters()}
    ckpt.load_params(one_device(ckpt_dir), weights, allow_extra=True, verify=False)
    extras: dict = {}
    loss = validation_loss(loss_net, cfg, seq, extras=extras)
    step = ckpt.read_state(ckpt_dir).get("step")
    print(f"checkpoint {ckpt_dir} (step {step}): val_loss {loss:.6f}  val_ppl {math.exp(min(loss, 700)):.4f}"
          f"  val_acc {extras['val_acc']:.4f}  ({cfg.eval.batches} batches of split {cfg.data.valid_split!r})")
    from mspretrain.train.eval.suite import format_summary, run_suite
    # the tag names the checkpoint and its state.json: a run dir trained again never reuses old results
    tag = f"{ckpt_dir.name}-{hashlib.sha256((ckpt_dir / ckpt.STATE_FILE).read_bytes()).hexdigest()[:8]}"
    summary = run_suite(model, cfg, cfg.run.dir, tag)
    print("\n".join(format_summary(summary)))
    return 0


def one_device(ckpt_dir: Path) -> Path:
    """The directory of `ckpt_dir`'s full model.ckpt, its files' digests checked first: itself, or for
    a sharded checkpoint (rank_R/, Ascend model/pipeline parallel or optimizer sharding) its slices
    merged onto one device (train.checkpoint.reshard.merged_to_one_device, cached in CKPT/merged/)."""
    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train.checkpoint.reshard import merged_to_one_device

    ckpt.verify_files(ckpt_dir, ckpt.read_state(ckpt_dir))
    return merged_to_one_device(ckpt_dir)


def check_fits_checkpoint(ckpt_dir: Path, cfg: Config) -> None:
    """Refuse a dataset (or blend source) whose tokenizer or seq_length differ from those the
    checkpoint was trained with: its state.json's dataset identity, else the run's RUN/run.json."""
    from mspretrain.loader.manifest import load_manifest
    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train import runinfo
    from mspretrain.train.data_check import check_identity

    ckpt_dir = Path(ckpt_dir).resolve()
    run_dir = ckpt_dir.parent.parent
    saved, where = ckpt.read_state(ckpt_dir).get("dataset"), ckpt_dir / ckpt.STATE_FILE
    if not saved and (run_dir / runinfo.RUN_INFO).is_file():
        saved, where = runinfo.read_run(run_dir)["dataset"], run_dir / runinfo.RUN_INFO
    if not saved or "tokenizer_sha256" not in saved:
        print(f"[eval] neither {where.name} of {ckpt_dir} nor its run records the dataset's identity: "
              f"the tokenizer and seq_length are not checked", file=sys.stderr)
        return
    for path in [cfg.data.path, *cfg.eval.blend]:
        check_identity(load_manifest(path), saved, where)
