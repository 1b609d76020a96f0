"""What `train launch` prints: a notice while the first step compiles, elapsed time and ETA on each
step line (no loss scale in fp32, where it never moves), and a summary at the end."""
from __future__ import annotations

import math
import shlex
import signal
import sys
import time
from pathlib import Path

from mspretrain.train import checkpoint as ckpt
from mspretrain.train.observe.metrics import METRICS_FILE, console_line, read_records


def hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    def __init__(self, cfg, start: int, tokens_per_step: int):
        self.cfg, self.start, self.tokens_per_step = cfg, start, tokens_per_step
        self.t0 = time.perf_counter()
        self.t_first = self.first_step = None   # the first step line seen: the ETA starts there

    def compile_notice(self) -> str:
        return (f"[train] compiling the training graph for step {self.start + 1} (GRAPH_MODE: "
                f"the first step takes much longer than the others)")

    def line(self, record: dict) -> str:
        """The step line, with elapsed time and an ETA from the steps after the first."""
        now = time.perf_counter()
        step, total = record["step"], self.cfg.train.steps
        if self.t_first is None:    # after compilation: the steps from here on set the pace
            self.t_first, self.first_step = now, step
        done_after_first = step - self.first_step
        eta = ""
        if done_after_first > 0:
            per_step = (now - self.t_first) / done_after_first
            eta = f"  eta {hms(per_step * (total - step))}"
        text = console_line(record, total)
        if self.cfg.precision.dtype != "fp16":          # the loss scale only moves in fp16
            text = text.replace(f"  scale {record['loss_scale']:g}", "")
        return f"{text}  elapsed {hms(now - self.t0)}{eta}"

    def summary(self, run_dir: Path) -> str:
        """Steps, tokens, time, final and best val loss, and where the checkpoints are."""
        path = Path(run_dir) / METRICS_FILE
        recs = read_records(path) if path.is_file() else []
        steps = [r for r in recs if not r.get("eval")]
        vals = [r for r in recs if r.get("eval") and isinstance(r.get("val_loss"), float)
                and math.isfinite(r["val_loss"])]
        last = steps[-1]["step"] if steps else self.start
        ran = max(0, last - self.start)
        tokens = ran * self.tokens_per_step
        before = [r for r in steps if r["step"] == self.start] if self.start else [{"consumed_samples": 0}]
        if steps and before and "consumed_samples" in steps[-1] and "consumed_samples" in before[0]:
            # samples really consumed (train.rampup makes early steps smaller)
            per_sample = self.tokens_per_step // self.cfg.train.global_batch_size
            tokens = (steps[-1]["consumed_samples"] - before[0]["consumed_samples"]) * per_sample
        lines = [f"[train] done: step {last}/{self.cfg.train.steps} ({ran} this session, "
                 f"{tokens:,} tokens in {hms(time.perf_counter() - self.t0)})"]
        if steps:
            lines.append(f"[train] final loss {steps[-1]['loss']:.4f}")
        if vals:
            best = min(vals, key=lambda r: r["val_loss"])
            lines.append(f"[train] val loss: final {vals[-1]['val_loss']:.4f} (step {vals[-1]['step']}), "
                         f"best {best['val_loss']:.4f} (step {best['step']})"
                         + (f"; val acc final {vals[-1]['val_acc']:.4f}" if "val_acc" in vals[-1] else ""))
        latest = ckpt.latest_checkpoint(run_dir)
        lines.append(f"[train] checkpoints: {ckpt.checkpoints_root(run_dir)} (latest: "
                     f"{latest.name if latest else 'none'}); metrics: {path}")
        return "\n".join(lines)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def catch_interrupts() -> None:
    """Ctrl-C and SIGTERM end the loop with KeyboardInterrupt (MindSpore's own handler turns
    Ctrl-C into a bare SIGTERM death, exit 143), so `interrupted` can say what was saved."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _interrupt)


def interrupted(args, argv: list[str]) -> int:
    """One line on Ctrl-C: the step reached, the last checkpoint, and the command that resumes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # a second Ctrl-C does not interrupt this
    try:
        from mspretrain.train.config import load_config
        run_dir = Path(load_config(args.config, args.set).run.dir)
        latest = ckpt.latest_checkpoint(run_dir)
    except Exception:   # noqa: BLE001 (the config was not the reason: say what we can)
        run_dir, latest = None, None
    cmd = list(argv)
    if "--resume" not in cmd and not any(a.startswith("--resume=") for a in cmd):
        cmd += ["--resume", "auto"]
    saved = (f"last checkpoint {latest}" if latest else
             "no checkpoint yet (a resume starts over)") if run_dir else "see the run dir"
    print(f"\ntrain {args.command}: interrupted; {saved}; resume with: train "
          f"{shlex.join(cmd)}", file=sys.stderr, flush=True)
    return 130
