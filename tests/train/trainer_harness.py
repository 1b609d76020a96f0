"""Helpers for the trainer tests: a tiny dataset, `python -m mspretrain.train` subprocesses, kills, metrics."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from synthetic import make_dataset
from mspretrain.train.config import load_config
from mspretrain.train.models.llama.model import ModelArgs

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny.yaml"


# fp32 reduction order. The layouts compared here (one batch vs K micro-batches; in test_msrun one
# device vs dp ranks) run every sample through the same kernels and differ only in how the per-token
# terms of each sum (the loss sum, every weight gradient, the squared norm) are grouped: K partial sums
# added at the end instead of one running sum. Each regrouped addition rounds once, by at most
# u = 2**-24 = 6.0e-8 of the partial sums' magnitude; with K <= 8 that is log2(8) + 1 = 4 roundings.
# The loss and the squared norm are sums of positive terms (no cancellation): <= 4u. A gradient element
# can cancel, but the norm is carried by the large elements, where cancellation against the partial
# sums' magnitude stays below 4x: 16u = 9.5e-7, i.e. 1e-6 relative. (Weighting micro-batches or ranks
# by their own token count instead of the global one, the old code, is off by 5e-5 to 1e-4.)
REDUCTION_ORDER_RTOL = 1e-6


def tiny_dataset(root: Path) -> Path:
    return make_dataset(root, num_train=256, num_valid=32, seq_length=32, vocab_size=128, seed=3)


def launch_cmd(run_dir: Path, data: Path, *sets: str, resume: str | None = None,
               force: bool = False, command: str = "launch") -> list[str]:
    cmd = [sys.executable, "-m", "mspretrain.train", command, "--config", str(TINY),
           "--set", f"data.path={data}", "--set", f"run.dir={run_dir}"]
    for s in sets:
        cmd += ["--set", s]
    if resume:
        cmd += ["--resume", resume]
    if force:
        cmd.append("--force")
    return cmd


def run(cmd: list[str], env: dict | None = None, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=timeout, **kw)


def records(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:        # a line being written right now
            pass
    return out


def last_step(run_dir: Path) -> int:
    steps = [r["step"] for r in records(run_dir) if not r.get("eval")]
    return max(steps, default=0)


# fields that are a pure function of (config, data, step): everything but the timings
EXACT_FIELDS = ("step", "loss", "lr", "grad_norm", "loss_scale", "overflow", "consumed_samples",
                "eval", "val_loss", "val_ppl", "val_acc")


def exact_view(run_dir: Path) -> list[tuple]:
    """Every record reduced to its deterministic fields, floats as hex (bitwise comparison)."""
    view = []
    for r in records(run_dir):
        view.append(tuple((k, float(r[k]).hex() if isinstance(r[k], float) else r[k])
                          for k in EXACT_FIELDS if k in r))
    return view


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_killed_at(cmd: list[str], run_dir: Path, step: int, delay: float, log: Path,
                  env: dict | None = None, timeout: float = 120) -> bool:
    """Start `cmd`; once metrics.jsonl shows `step`, wait `delay` s and SIGKILL the whole process group
    (main process and loader workers), wherever it is: in a step, an eval, a checkpoint write.
    Returns False if the run finished (exit 0) before it could be killed."""
    with open(log, "a") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, **(env or {})), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and last_step(run_dir) < step:
            if time.monotonic() > deadline:
                raise TimeoutError(f"run did not reach step {step}; log: {log.read_text()[-2000:]}")
            time.sleep(0.005)
        time.sleep(delay)
        if proc.poll() is None:
            kill_group(proc)
            return True
        assert proc.returncode == 0, f"run failed before the kill (rc {proc.returncode}): {log.read_text()[-3000:]}"
        return False
    finally:
        if proc.poll() is None:
            kill_group(proc)


# ---------------------------------------------------------------- in-process train steps

ARGS = ModelArgs(vocab_size=64, seq_length=16, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)
BATCHES = np.random.default_rng(5).integers(3, 64, size=(4, 8, 17)).astype(np.int32)


def make_step(*sets, micro_steps=1, eod=-1, dist=None, combine=None):
    """A TrainStep over a tiny Llama; `eod` >= 0: the EOD loss mask on (that token id is EOS);
    `dist`: built for that layout's ranks (default one process); `combine`: that Reduction instead."""
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.llama.model import Llama
    from mspretrain.train.step.optim import build_optimizer
    from mspretrain.train.parallel.recompute import apply_recompute
    from mspretrain.train.parallel.apply import reduction
    from mspretrain.train.step.cell import Reduction, build_train_step, loops
    from mspretrain.train.step.precision import apply_precision, check_precision

    cfg = load_config(None, list(sets))
    check_precision(cfg)
    model = Llama(ARGS, seed=11)
    loss_net = CausalLMLoss(apply_precision(model, cfg.precision), ARGS.vocab_size, eod, z_loss=cfg.train.z_loss)
    apply_recompute(model, cfg.recompute)
    opt = build_optimizer(loss_net.trainable_params(), cfg.optim)
    if combine is None:
        combine = (Reduction() if dist is None
                   else reduction(cfg, dist, opt.parameters, micro_steps, loops(cfg, micro_steps)))
    return cfg, build_train_step(loss_net, opt, micro_steps, cfg, reduction=combine)


def snapshot(step) -> dict:
    return {k: p.asnumpy().copy() for k, p in step.state_parameters().items()}
