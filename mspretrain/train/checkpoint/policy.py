"""What may change when a run is resumed, and what `--force` overrides.

A checkpoint records the config it was trained with (state.json "config"). On resume the keys that
differ are named, old -> new:
  - keys that never change the loss curve (run dir, logging, checkpoint and eval cadence, loader
    workers and prefetch, the peak-TFLOPs figure), the data-parallel size (an elastic resume: the
    loader continues the same global sample stream), `train.steps` and `train.global_batch_size` (the
    final batch: the steps after the checkpoint take that many samples from its cursor on, the same
    stream; a ramp continues to the new size) change freely, each logged. Extending a run
    (a larger train.steps) continues the learning-rate schedule as if the new train.steps had been
    set from the start: lr_at(step, optim, new train.steps) is a pure function of the step, so the
    warmup is never repeated and the cosine reaches optim.min_lr at the new last step;
  - any other key (model, optimizer, precision, data order, ...) refuses the resume unless `--force`,
    and with `--force` each overridden key is printed, as is a different dataset.
A checkpoint from before this record falls back to the config hash.
"""
from __future__ import annotations

import sys
from pathlib import Path

from mspretrain.common.errors import MspretrainError
from mspretrain.train.step.optim import lr_at

# keys that may differ on resume without --force (prefixes end in ".")
SAFE = ("run.", "log.", "checkpoint.", "eval.", "data.path", "data.num_workers", "data.prefetch",
        "train.peak_tflops", "train.steps",
        "train.global_batch_size",   # the stream is a function of the cursor, not of the batch size
        "optim.decay_start_step",    # a WSD decay started from a stable checkpoint (optim.py)
        "parallel.data_parallel",    # elastic resume: the loader continues the same sample stream
        # another layout: the checkpoint is transformed onto it (train.checkpoint.reshard); the same model and
        # stream, only the reduction order differs
        "parallel.model_parallel", "parallel.pipeline_stage", "parallel.optimizer_shard",
        "parallel.optimizer_level", "parallel.micro_batch_num", "parallel.stage_offsets",
        "parallel.sequence_parallel", "parallel.vocab_emb_dp",
        "train.accumulate")          # graph loop or split: the same micro-batch sums in another order


class ResumeError(MspretrainError, RuntimeError):
    """The run dir and the resume request disagree; the message says what to pass."""


def config_record(cfg) -> dict:
    """The flat config a checkpoint records: {"a.b": value}."""
    return _flat(cfg.to_dict())


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _safe(key: str) -> bool:
    return any(key == s or (s.endswith(".") and key.startswith(s)) for s in SAFE)


def check_resume(state: dict, cfg, loader_fingerprint: str, data_path: str, ckpt_dir: Path,
                 force: bool, out=None) -> None:
    """Raise ResumeError for changes that need --force; print the changes that are allowed and,
    with --force, everything it overrides."""
    out = out or (lambda s: print(s, flush=True))
    saved = state.get("config")
    problems, notes = [], []
    if saved is None:                               # an older checkpoint: the hash only
        if state.get("config_hash") != cfg.hash():
            problems.append(f"config hash {state.get('config_hash')} != this config's {cfg.hash()} "
                            f"(the checkpoint does not record which keys)")
    else:
        mine = config_record(cfg)
        for key in sorted(set(saved) | set(mine)):
            old, new = saved.get(key, "<absent>"), mine.get(key, "<absent>")
            if old == new:
                continue
            change = f"{key} {old!r} -> {new!r}"
            (notes if _safe(key) else problems).append(change)
    decay = cfg.optim.decay_start_step
    if saved and saved.get("optim.decay_start_step", 0) != decay and 0 < decay < int(state.get("step", 0)):
        problems.append(f"optim.decay_start_step {decay} is before the checkpoint's step {state['step']} "
                        f"(the steps after {decay} were trained at the stable lr)")
    if state.get("dataset_fingerprint") != loader_fingerprint:
        problems.append(f"dataset fingerprint {str(state.get('dataset_fingerprint'))[:16]} -> "
                        f"{data_path}'s {loader_fingerprint[:16]} (another dataset)")
    if problems and not force:
        raise ResumeError(f"cannot resume from {ckpt_dir}: " + "; ".join(problems)
                          + ". Change them back, or pass --force to continue with them.")
    if notes:
        out("[train] resuming with changed settings: " + "; ".join(notes))
        step = int(state.get("step", 0))
        old_total = (saved or {}).get("train.steps")
        if old_total is not None and old_total != cfg.train.steps:
            out(f"[train] train.steps {old_total} -> {cfg.train.steps}: the learning-rate schedule "
                f"continues as if {cfg.train.steps} steps had been set from the start (lr at step "
                f"{step + 1}: {lr_at(step + 1, cfg.optim, cfg.train.steps):.4g})")
        old_batch = (saved or {}).get("train.global_batch_size")
        if old_batch is not None and old_batch != cfg.train.global_batch_size:
            cursor = (state.get("loader") or {}).get("cursor")
            out(f"[train] train.global_batch_size {old_batch} -> {cfg.train.global_batch_size}: the steps "
                f"after {step} take {cfg.train.global_batch_size} samples each, continuing the same sample "
                f"stream at sample {cursor}; the learning rate stays a function of the step")
    if problems:
        print("[train] --force: overriding " + "; ".join(problems), file=sys.stderr, flush=True)


def check_fresh_start(run_dir: Path) -> None:
    """No --resume: refuse a run dir whose metrics.jsonl an earlier run wrote (it would be cut)."""
    metrics = Path(run_dir) / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        raise ResumeError(f"{run_dir} already has {metrics.name} from an earlier run (no checkpoint "
                          f"to resume from); set run.dir to a new directory, or delete {metrics} to "
                          f"start over. Nothing was changed.")


def finished_notice(start: int, total: int) -> str | None:
    """The line to print when a resumed run has nothing left to do."""
    if start >= total:
        return (f"[train] this run already finished at step {start}/{total}; nothing to do "
                f"(raise train.steps to extend it)")
    return None
