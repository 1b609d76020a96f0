"""Loss / gradient-norm spike defence (train.spike, docs/long-runs.md).

The host keeps a window of the last `window` applied steps' (loss, grad norm). Before each step it
hands the step graph two thresholds, mean + sigma * std of each (population std, float64, then fp32:
the graph compares in fp32); the graph skips the update when the step's loss or grad norm is above
them, the same way it skips a non-finite gradient, so deciding costs no extra device sync. Until
`warmup` steps have run (and while the window holds fewer than two steps) the thresholds are +inf.

A skipped step leaves the weights, AdamW moments and step counter untouched and is not added to the
window. `rollback`: after `max_consecutive` skipped steps in a row the trainer reloads the newest
checkpoint written before the first of them and, when the loader reaches the samples of the skipped
steps, jumps over them; the range is kept in state.json (`spike.skipped`) and RUN/spikes.jsonl, so a
resume from any later checkpoint jumps over it too. Everything here is a pure function of the steps
seen, saved with each checkpoint: a resumed run takes the same decisions bit for bit. The reload
writes into the compiled step by assign (checkpoint.load_params(live=True)), and a resume cuts
spikes.jsonl back to the rollbacks its checkpoint knows.
"""
from __future__ import annotations

import json
import math
import os
from collections import deque
from pathlib import Path

import numpy as np

from mspretrain.train.config import ConfigError

ACTIONS = ("none", "skip", "rollback")
EVENTS_FILE = "spikes.jsonl"


def check_spike_config(cfg) -> None:
    s = cfg.train.spike
    if s.action not in ACTIONS:
        raise ConfigError(f"train.spike.action must be one of {', '.join(ACTIONS)}, got {s.action!r}")
    for key, ok, want in (("window", s.window >= 2, ">= 2"), ("sigma", s.sigma > 0, "> 0"),
                          ("warmup", s.warmup >= 0, ">= 0"),
                          ("max_consecutive", s.max_consecutive >= 1, ">= 1")):
        if not ok:
            raise ConfigError(f"train.spike.{key} must be {want}, got {getattr(s, key)!r}")
    if cfg.train.z_loss < 0:
        raise ConfigError(f"train.z_loss must be >= 0 (0: off), got {cfg.train.z_loss!r}")


def threshold(values, sigma: float) -> float:
    """mean + sigma * std of `values` (float64), rounded to the fp32 the graph compares with."""
    a = np.asarray(values, dtype=np.float64)
    return float(np.float32(a.mean() + sigma * a.std()))


class SpikeGuard:
    def __init__(self, cfg):
        s = cfg.train.spike
        self.cfg = cfg                  # a rollback loads through the resume's resharding (load_rollback)
        self.action, self.sigma, self.warmup = s.action, float(s.sigma), int(s.warmup)
        self.max_consecutive = int(s.max_consecutive)
        self.window: deque = deque(maxlen=int(s.window))    # (loss, grad_norm) of applied steps
        self.consecutive = 0            # skipped spike steps in a row
        self.first_skipped: tuple | None = None   # (step, cursor before it) of the current streak
        self.skipped: list[dict] = []   # rollback: {"steps": [a, b], "samples": [lo, hi), "back_to": c}

    # ------------------------------------------------------------ before / after a step

    def limits(self, step: int) -> tuple[float, float]:
        if self.action == "none" or step <= self.warmup or len(self.window) < 2:
            return math.inf, math.inf
        losses, norms = zip(*self.window)
        return threshold(losses, self.sigma), threshold(norms, self.sigma)

    def arm(self, train_step, step: int) -> tuple[float, float]:
        lim = self.limits(step)
        train_step.set_spike_limits(*lim)
        return lim

    def observe(self, step: int, result, limits: tuple[float, float], cursor_before: int) -> dict:
        """The metrics fields of the step just run; updates the window and the streak."""
        if result.spiked:
            if self.consecutive == 0:
                self.first_skipped = (step, cursor_before)
            self.consecutive += 1
            over_loss = np.float32(result.loss) > np.float32(limits[0])
            return {"skipped": True, "skip_reason": "loss_spike" if over_loss else "grad_norm_spike",
                    "spike_loss_limit": limits[0], "spike_grad_norm_limit": limits[1]}
        self.consecutive, self.first_skipped = 0, None
        if result.overflow:
            return {"skipped": True, "skip_reason": "overflow"}
        if math.isfinite(result.loss) and math.isfinite(result.grad_norm):
            self.window.append((result.loss, result.grad_norm))
        return {}

    # ------------------------------------------------------------ rollback

    def needs_rollback(self) -> bool:
        return self.action == "rollback" and self.consecutive >= self.max_consecutive

    def plan_rollback(self, step: int, cursor_after: int) -> dict:
        """The range to jump over: the samples of the skipped steps first..step."""
        first, lo = self.first_skipped
        return {"steps": [first, step], "samples": [lo, cursor_after]}

    def jump(self, loader) -> dict | None:
        """Before a batch is read: if the loader stands at the start of a skipped range, move it past
        the range (returns the range)."""
        for rng in self.skipped:
            if loader.cursor == rng["samples"][0]:
                loader.load_state_dict(loader.state_at(rng["samples"][1]))
                return rng
        return None

    # ------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict:
        return {"window": [list(x) for x in self.window], "consecutive": self.consecutive,
                "first_skipped": list(self.first_skipped) if self.first_skipped else None,
                "skipped": [dict(r) for r in self.skipped]}

    def load_state_dict(self, state: dict | None, keep_skipped: bool = False) -> None:
        """From a checkpoint's state.json (`spike`; absent in older checkpoints: an empty window).
        `keep_skipped`: a rollback keeps the ranges known now (the checkpoint predates them)."""
        state = state or {}
        self.window.clear()
        self.window.extend(tuple(x) for x in state.get("window", []))
        self.consecutive = int(state.get("consecutive", 0))
        fs = state.get("first_skipped")
        self.first_skipped = tuple(fs) if fs else None
        saved = [dict(r) for r in state.get("skipped", [])]
        if keep_skipped:
            saved += [r for r in self.skipped if r not in saved]
        self.skipped = saved


def log_event(run_dir, event: dict) -> None:
    """RUN/spikes.jsonl: one line per rollback (the run log; metrics.jsonl is cut back to its step)."""
    with open(Path(run_dir) / EVENTS_FILE, "a") as f:
        f.write(json.dumps(event) + "\n")


def truncate_events(run_dir, state: dict | None, step: int) -> int:
    """Cut RUN/spikes.jsonl back to what a resume from the checkpoint of `step` (its state.json
    `spike`) knows, as metrics.jsonl is cut: a rollback it does not hold is undone by the resume (the
    run takes it again); a no-rollback event is kept if it came at or before `step`. Returns the
    number of lines dropped."""
    path = Path(run_dir) / EVENTS_FILE
    if not path.exists():
        return 0
    known = [dict(r) for r in (state or {}).get("skipped", [])]
    keep, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:        # a line torn by a kill
            dropped += 1
            continue
        rng = {k: event.get(k) for k in ("steps", "samples", "back_to")}
        if (rng in known) if event.get("rollback") else event.get("step", 0) <= step:
            keep.append(line + "\n")
        else:
            dropped += 1
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(keep))
        os.replace(tmp, path)
    return dropped


def rollback_target(run_dir, before_step: int):
    """The newest checkpoint written before step `before_step` (None if there is none)."""
    from mspretrain.train import checkpoint as ckpt
    best = None
    for path in ckpt.list_checkpoints(run_dir):
        s = ckpt.read_state(path).get("step", 0)
        if s < before_step and (best is None or s > best[0]):
            best = (s, path)
    return best


class Rollback(Exception):
    """Raised by the loop after train.spike.max_consecutive skipped steps (the step, the loader
    cursor after it, the bad-step streak); `roll_back` carries it out once the metrics are closed."""

    def __init__(self, step: int, cursor: int, bad_streak: int):
        super().__init__(f"rollback after step {step}")
        self.step, self.cursor, self.bad_streak = step, cursor, bad_streak


def load_rollback(path, state: dict, session, cfg, dist) -> None:
    """The rollback checkpoint into the running step, through the resume's resharding: after a resume on
    another layout, a checkpoint from before it holds the old layout's files (Checkpointer.resharded
    transforms them onto this one, or passes them through when no transformation is needed)."""
    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train.checkpoint.checkpointer import Checkpointer

    ckpt.check_checkpoint(path)        # its files' digests, as a resume checks them
    load_dir = Checkpointer(cfg, dist).resharded(state, path)
    ckpt.load_params(load_dir, session.train_step.state_parameters(), rank=dist.rank if dist.sharded else None,
                     verify=False, live=True)


def roll_back(rb: Rollback, run_dir, session, loader, guard: SpikeGuard, dist) -> tuple[int, int]:
    """Reload the newest checkpoint from before the streak, remember to jump over its samples, cut
    metrics.jsonl back to that step; returns (step to continue after, bad streak). Without such a
    checkpoint the run keeps skipping from where it is (said in the log)."""
    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train import hooks
    from mspretrain.train.observe import metrics

    phase = hooks.load().spike_phase
    phase("rollback_start", rb.step)
    rng = guard.plan_rollback(rb.step, rb.cursor)
    target = rollback_target(run_dir, rng["steps"][0])
    guard.consecutive, guard.first_skipped = 0, None
    if target is None:
        if dist.is_main:
            log_event(run_dir, {"step": rb.step, "rollback": False, **rng,
                                "why": "no checkpoint before the spikes began"})
            print(f"[train] spike: {guard.max_consecutive} skipped steps ({rng['steps'][0]}-{rb.step}) "
                  f"but no checkpoint before step {rng['steps'][0]}: no rollback, skipping on",
                  flush=True)
        return rb.step, rb.bad_streak
    back_to, path = target
    state = ckpt.read_state(path)
    load_rollback(path, state, session, guard.cfg, dist)
    loader.load_state_dict(state["loader"])
    guard.load_state_dict(state.get("spike"), keep_skipped=True)
    rng["back_to"] = back_to
    guard.skipped.append(rng)
    if dist.is_main:
        metrics.truncate_after(run_dir, back_to)
        phase("rollback_loaded", rb.step)
        log_event(run_dir, {"step": rb.step, "rollback": True, **rng})
        print(f"[train] spike: steps {rng['steps'][0]}-{rb.step} skipped; rolled back to {path.name} "
              f"(step {back_to}); samples {rng['samples'][0]}..{rng['samples'][1] - 1} will be skipped",
              flush=True)
    return back_to, state.get("bad_streak", 0)
