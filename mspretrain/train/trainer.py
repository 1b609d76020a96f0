"""The training loop: run dir, resume, steps, metrics, validation, checkpoints.

Bad steps: a step is *bad* when its loss is not finite, or when its gradients are not finite and no
dynamic loss scale can be blamed (fp32/bf16, or fp16 already at the minimum scale): the model has
diverged. A bad step's update is skipped (non-finite gradients never reach the weights), a checkpoint
is saved at the first bad step of a streak, and the run stops with exit code 3 after
train.max_bad_steps bad steps in a row. An fp16 overflow above the minimum scale with a finite loss
is a *skipped* step (the scale halves), not a bad one.
"""
from __future__ import annotations

import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from mspretrain.train import checkpoint as ckpt
from mspretrain.train import console
from mspretrain.train.observe import metrics
from mspretrain.train.checkpoint import policy as resume_policy
from mspretrain.train.assemble import Session, build_session
from mspretrain.train.checkpoint.checkpointer import Checkpointer
from mspretrain.train.config import Config, ConfigError
from mspretrain.train.step.optim import check_schedule, lr_at

EXIT_BAD_STEPS = 3


def prepare_run_dir(run_dir: Path) -> None:
    """Create the run dir and check that it is writable, with an error naming it."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise ckpt.CheckpointError(f"run dir {run_dir} is not writable: {e}") from None


def measure_peak_tflops(n: int = 1024, reps: int = 5) -> float:
    """This machine's fp32 matmul rate (numpy sgemm, best of `reps`), in TFLOP/s."""
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    b = a.T.copy()
    a @ b
    best = math.inf
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
    return 2.0 * n ** 3 / best / 1e12


def check_loop_config(cfg: Config) -> None:
    """The loop's own keys; precision, recompute and parallel are checked by their modules."""
    o = cfg.optim
    rules = [("train.steps", cfg.train.steps >= 1, ">= 1"),
             ("train.max_bad_steps", cfg.train.max_bad_steps >= 1, ">= 1"),
             ("train.micro_batch_size", cfg.train.micro_batch_size >= 0, ">= 0 (0: no accumulation)"),
             ("checkpoint.every_steps", cfg.checkpoint.every_steps >= 1, ">= 1"),
             ("checkpoint.keep_max", cfg.checkpoint.keep_max >= 1, ">= 1"),
             ("log.every_steps", cfg.log.every_steps >= 1, ">= 1"),
             ("eval.every_steps", cfg.eval.every_steps >= 0, ">= 0 (0: no validation)"),
             ("optim.lr", o.lr > 0, "> 0"), ("optim.min_lr", 0 <= o.min_lr <= o.lr, "in [0, optim.lr]"),
             ("optim.warmup_steps", o.warmup_steps >= 0, ">= 0"),
             ("optim.beta1", 0 <= o.beta1 < 1, "in [0, 1)"), ("optim.beta2", 0 <= o.beta2 < 1, "in [0, 1)"),
             ("optim.eps", o.eps > 0, "> 0"), ("optim.weight_decay", o.weight_decay >= 0, ">= 0"),
             ("optim.clip_norm", o.clip_norm >= 0, ">= 0 (0: no clipping)")]
    for key, ok, want in rules:
        if not ok:
            section, name = key.split(".")
            raise ConfigError(f"{key} must be {want}, got {getattr(getattr(cfg, section), name)!r}")
    check_schedule(cfg.optim, cfg.train.steps)


def is_bad(result, cfg: Config) -> bool:
    """Diverged, not merely a loss-scale overflow (see the module docstring)."""
    if not math.isfinite(result.loss):
        return True
    scaled = cfg.precision.dtype == "fp16"
    return result.overflow and (not scaled or result.loss_scale <= cfg.precision.loss_scale.min)


def run_lock(run_dir: Path, is_main: bool):
    """One `train launch` per run dir (rank 0 holds it): mspretrain.lock."""
    from contextlib import nullcontext
    from mspretrain.common.lock import run_dir_lock
    if not is_main:
        return nullcontext()
    prepare_run_dir(run_dir)      # its clear error for an unwritable dir comes before the lock's
    return run_dir_lock(run_dir, f"run dir {run_dir}")


def launch(cfg: Config, resume: str | None = None, force: bool = False, verify_data: bool = False) -> int:
    """`train launch`: returns the process exit code."""
    from mspretrain.train.parallel import distributed
    from mspretrain.train.parallel import plan as parallel_plan
    from mspretrain.train.step.cell import accumulate_mode
    from mspretrain.train.step.precision import check_precision
    from mspretrain.train.parallel.recompute import recompute_plan

    dist = distributed.setup(cfg, parallel_plan.validate)     # topology errors included
    if dist.is_main:
        from mspretrain.train.parallel.topology import problems
        for warning in problems(cfg, dist.world_size).warnings:
            print(f"[train] {warning}", file=sys.stderr, flush=True)
    accumulate_mode(cfg)
    check_loop_config(cfg)
    check_precision(cfg)
    recompute_plan(cfg.recompute, cfg.model.num_layers)
    from mspretrain.train.data import check_sources, data_kind
    from mspretrain.train.observe.spike import check_spike_config
    from mspretrain.train.switches import check_switches
    data_kind(cfg)          # exactly one of data.path, data.blend, data.mixture
    check_spike_config(cfg)
    check_switches(cfg)
    run_dir = Path(cfg.run.dir)
    # the lock first: a second launch is told who holds the run, before it looks at what is in it
    created = dist.is_main and not run_dir.exists()
    checked = False
    try:
        with run_lock(run_dir, dist.is_main):
            checkpoints = Checkpointer(cfg, dist)
            resume_from = checkpoints.find(resume)
            check_sources(cfg, verify_data)     # each dataset intact, all of one tokenizer and seq_length
            checked = True
            return _launch_locked(cfg, dist, checkpoints, resume_from, force)
    finally:
        if created and not checked:     # refused before anything was written: leave no run dir
            _remove_empty_run_dir(run_dir)


def _remove_empty_run_dir(run_dir: Path) -> None:
    """The run dir this launch created for its lock, when it holds nothing else."""
    try:
        if all(p.name.startswith(".lock") for p in run_dir.iterdir()):
            shutil.rmtree(run_dir)
    except OSError:
        pass


def _launch_locked(cfg: Config, dist, checkpoints: Checkpointer, resume_from: Path | None, force: bool) -> int:
    run_dir = checkpoints.run_dir
    import mindspore as ms

    ms.set_seed(cfg.seed)       # GRAPH_MODE and the device: set once, by distributed.setup()
    from mspretrain.train.data import TrainData
    from mspretrain.train.switches import apply_switches

    apply_switches(cfg)         # run.mode, precision.graph_kernel, parallel.comm_fusion
    with TrainData(cfg, dist) as loader:
        if dist.is_main:
            ckpt.remove_stale_temps(run_dir)
        session = build_session(cfg, loader.vocab_size, loader.seq_length, dist, loader.tokenizer.eos_id)
        start, bad_streak, state = 0, 0, None
        from mspretrain.train.observe import spike
        guard = spike.SpikeGuard(cfg)
        if resume_from is not None:
            state = checkpoints.load(session, resume_from, loader, force)
            start, bad_streak = state["step"], state.get("bad_streak", 0)
            guard.load_state_dict(state.get("spike"))
            if dist.is_main and (done := resume_policy.finished_notice(start, cfg.train.steps)):
                print(done, flush=True)
        if dist.is_main:
            if resume_from is not None and ckpt.repoint_latest(run_dir, resume_from):
                print(f"[train] {ckpt.checkpoints_root(run_dir) / ckpt.LATEST} now names {resume_from.name}",
                      file=sys.stderr, flush=True)
            dropped = metrics.truncate_after(run_dir, start)
            if state is not None:       # spikes.jsonl: the rollbacks this checkpoint knows
                spike.truncate_events(run_dir, state.get("spike"), start)
            from mspretrain.train.runinfo import record_run
            record_run(cfg)     # RUN/run.json + tokenizer.model, for export/generate/score/eval
            print(f"[train] {'resuming from ' + str(resume_from) if resume_from else 'starting'} at step "
                  f"{start}/{cfg.train.steps}, {session.micro_steps} micro-step(s) per step"
                  + (f", {dropped} metrics line(s) after it dropped" if dropped else ""), flush=True)
        first = True
        while True:
            try:
                return run_steps(cfg, dist, session, loader, checkpoints, start, bad_streak, guard,
                                 announce=first)
            except spike.Rollback as rb:        # back to a checkpoint before the spikes, past their samples
                start, bad_streak = spike.roll_back(rb, run_dir, session, loader, guard, dist)
                first = False       # the graph is compiled and the first peak was told: say neither again


def validation_record(session: Session, cfg: Config, data, step: int) -> dict:
    """The eval record: val_loss and val_acc (next-token accuracy) over the valid split; for a blend
    or mixture, val_loss/<source> and val_acc/<source> of each dataset's valid split and val_loss,
    val_acc their means under the weights now in force."""
    from mspretrain.train.eval.evaluate import validation_loss

    if data.kind == "path":
        extras: dict = {}           # val_acc; val_z_loss with train.z_loss
        val = validation_loss(session.eval_net, cfg, data.seq_length, extras=extras)
        return {"step": step, "eval": True, "val_loss": val, "val_ppl": math.exp(min(val, 700.0)), **extras}
    weights = data.current_weights()
    per_source, accs = {}, {}
    for name, d in zip(data.names, data.dirs):
        extras = {}
        per_source[name] = validation_loss(session.eval_net, cfg, data.seq_length, d, extras=extras)
        if "val_acc" in extras:
            accs[name] = extras["val_acc"]
    total = sum(weights.values())

    def mean(values: dict) -> float:
        return sum(values[name] * weights.get(d, 0.0) for name, d in zip(data.names, data.dirs)) / total
    val = mean(per_source)
    rec = {"step": step, "eval": True, "val_loss": val, "val_ppl": math.exp(min(val, 700.0))}
    if len(accs) == len(per_source):
        rec["val_acc"] = mean(accs)
    rec.update({f"val_loss/{name}": v for name, v in per_source.items()})
    rec.update({f"val_acc/{name}": v for name, v in accs.items()})
    return rec


def ramp_recompile_notice(cfg: Config, compiled: int | None, batch_size: int) -> str | None:
    """Said when a batch-size ramp (train.rampup) gives the Ascend step a global batch it has not run
    yet: each size is a new input shape, so the step graph (and its strategy file) compiles again."""
    if cfg.device != "Ascend" or compiled is None or batch_size == compiled:
        return None
    return (f"[train] train.rampup: global batch {compiled} -> {batch_size} is a new input shape; the step "
            f"graph compiles again for it (minutes for a large model on Ascend; docs/parallel.md)")


def run_steps(cfg: Config, dist, session: Session, loader, checkpoints: Checkpointer, start: int,
              bad_streak: int, guard=None, announce: bool = True) -> int:
    run_dir = checkpoints.run_dir
    from mspretrain.train.observe import monitor as observe
    from mspretrain.train.observe import profile
    from mspretrain.train.observe import spike
    from mspretrain.train.data import lr_scale

    peak = cfg.train.peak_tflops or measure_peak_tflops()
    tokens_per_step = cfg.train.global_batch_size * loader.seq_length
    writer = metrics.MetricsWriter(run_dir) if dist.is_main else None
    progress = console.Progress(cfg, start, tokens_per_step)
    console.catch_interrupts()
    if writer and start < cfg.train.steps and announce:
        print(progress.compile_notice(), flush=True)
    guard = guard or spike.SpikeGuard(cfg)
    observer = observe.StepObserver(cfg, session.model.trainable_params(),
                                    observe.planned_mb(cfg, loader.seq_length, session.args.vocab_size),
                                    notice=announce)
    window = profile.ProfileWindow(cfg, run_dir, dist)
    from mspretrain.train.eval import suite as evalsuite
    checkpoints.start_background(session)
    batches = iter(loader)
    compiled = None             # the global batch the step graph last ran (train.rampup changes it)
    try:
        for step in range(start + 1, cfg.train.steps + 1):
            checkpoints.check()      # a failed background write stops the run here
            limits = guard.arm(session.train_step, step)
            observer.before(step)
            window.before(step)
            t0 = time.perf_counter()
            guard.jump(loader)
            cursor_before = loader.cursor
            batch_size = loader.batch_size()        # train.rampup: a function of the cursor
            if writer and loader.rampup and (notice := ramp_recompile_notice(cfg, compiled, batch_size)):
                print(notice, flush=True)
            compiled = batch_size
            batch = next(batches)
            t1 = time.perf_counter()
            lr = lr_at(step, cfg.optim, cfg.train.steps) * lr_scale(cfg, batch_size)
            result = session.train_step(batch["input_ids"], lr)
            elapsed = time.perf_counter() - t0
            window.after(step)
            tps = batch_size * loader.seq_length / elapsed
            record = {"step": step, "loss": result.loss, "lr": lr, "grad_norm": result.grad_norm,
                      "loss_scale": result.loss_scale, "overflow": result.overflow,
                      "tokens_per_s": tps,
                      "mfu": tps * session.flops_per_token / (peak * 1e12 * dist.world_size),
                      "consumed_samples": loader.cursor, "data_wait_s": t1 - t0, "step_time_s": elapsed}
            if loader.rampup:
                record["batch_size"] = batch_size
            record.update(loader.metrics())         # per source of a blend / mixture: samples, tokens
            # the fused kernel's document limit (a family without these arguments has no such kernel)
            args = session.args
            if getattr(args, "flash_attention", False) and getattr(args, "document_mask", False):
                from mspretrain.train.packing import count_over_limit
                record["docs_over_limit"] = count_over_limit(batch["input_ids"][:, :-1], session.args.eos_id,
                                                             session.args.max_documents)
            record.update(observer.fields(step, result))
            record.update(guard.observe(step, result, limits, cursor_before))
            bad_streak = bad_streak + 1 if is_bad(result, cfg) else 0
            if writer:
                writer.write(record)
                if step % cfg.log.every_steps == 0 or step == cfg.train.steps or bad_streak:
                    print(progress.line(record), flush=True)
                if notice := observer.first_peak_notice(record):
                    print(notice, flush=True)
            if cfg.eval.every_steps and step % cfg.eval.every_steps == 0:
                rec = validation_record(session, cfg, loader, step)
                if evalsuite.in_loop_mode(cfg, dist.is_main, step):
                    rec.update(evalsuite.in_loop(session.model, cfg, run_dir, step))
                if writer:
                    writer.write(rec)
                    print(metrics.console_line(rec, cfg.train.steps), flush=True)
            if guard.needs_rollback():     # before any checkpoint of this step: it is being undone
                raise spike.Rollback(step, loader.cursor, bad_streak)
            stop = bad_streak >= cfg.train.max_bad_steps
            if (step % cfg.checkpoint.every_steps == 0 or step == cfg.train.steps or bad_streak == 1
                    or stop):
                checkpoints.save(step, session, loader, record, bad_streak, {"spike": guard.state_dict()})
            if stop:
                print(f"[train] stopping: {bad_streak} consecutive bad steps (non-finite loss or gradients) "
                      f"(train.max_bad_steps={cfg.train.max_bad_steps}); last checkpoint: step {step}",
                      file=sys.stderr, flush=True)
                return EXIT_BAD_STEPS
    finally:
        try:
            checkpoints.wait()       # the run ends (or rolls back) with its last checkpoint complete
        finally:
            window.close()
            if writer:
                writer.close()
    if writer:
        print(progress.summary(run_dir), flush=True)
    return 0
