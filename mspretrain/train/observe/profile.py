"""A mindspore.profiler window over steps profile.start_step..profile.stop_step (docs/long-runs.md).

The profiler is started right before step start_step and stopped right after stop_step, with a step
mark after each step in between, so the trace holds exactly those steps; outside the window nothing
is created or called. After the window, RUN/profile/summary.md lists the slowest operators and, where
the device measured communication, its share of the step time.

On CPU MindSpore 2.10 profiles the host (ProfilerActivity.CPU): the framework's host-side operator
launches and Python-facing phases, recorded to the trace files under profile.dir; there is no device
timeline and no communication to measure.
"""
from __future__ import annotations

import csv
from pathlib import Path

from mspretrain.train.config import ConfigError

SUMMARY = "summary.md"


def check_profile_config(cfg) -> None:
    p = cfg.profile
    if p.start_step == 0 and p.stop_step == 0:
        return
    if not 1 <= p.start_step <= p.stop_step:
        raise ConfigError(f"profile.start_step and profile.stop_step must satisfy 1 <= start <= stop "
                          f"(0, 0: off), got {p.start_step}, {p.stop_step}")


def profile_dir(cfg, run_dir) -> Path:
    return Path(cfg.profile.dir) if cfg.profile.dir else Path(run_dir) / "profile"


class ProfileWindow:
    """`before(step)` / `after(step)` around each step; `close()` at the end of the loop."""

    def __init__(self, cfg, run_dir, dist):
        self.start, self.stop = cfg.profile.start_step, cfg.profile.stop_step
        self.on = self.start > 0 and dist.is_main
        self.device = cfg.device
        self.dir = profile_dir(cfg, run_dir)
        self.prof = None
        self.steps: list[int] = []

    def before(self, step: int) -> None:
        if self.on and step == self.start and self.prof is None:
            from mindspore.profiler import ProfilerActivity, profile, tensorboard_trace_handler
            activities = [ProfilerActivity.CPU]
            if self.device == "Ascend":
                activities.append(ProfilerActivity.NPU)
            elif self.device == "GPU":
                activities.append(ProfilerActivity.GPU)
            self.dir.mkdir(parents=True, exist_ok=True)
            self.prof = profile(activities=activities, start_profile=False,
                                on_trace_ready=tensorboard_trace_handler(str(self.dir)))
            self.prof.start()

    def after(self, step: int) -> None:
        if self.prof is None:
            return
        self.steps.append(step)
        if step >= self.stop:
            self.close()
        else:
            self.prof.step()

    def close(self) -> None:
        if self.prof is None:
            return
        prof, self.prof = self.prof, None
        prof.stop()
        write_summary(self.dir, self.steps, self.device)


def _csv(root: Path, pattern: str) -> list[dict]:
    rows = []
    for path in sorted(root.rglob(pattern)):
        with open(path, newline="") as f:
            rows.extend({k.strip(): v for k, v in r.items() if k} for r in csv.DictReader(f))
    return rows


def operator_times(root: Path) -> list[tuple[str, float, int]]:
    """(operator type, total ms in the window, occurrences), slowest first: the CPU profiler's
    cpu_op_type_info / cpu_op_detail_info tables, else the device's op_statistic table."""
    rows = _csv(root, "cpu_op_detail_info*.csv")
    out: dict[str, list] = {}
    for r in rows:
        t = out.setdefault(r["op_type"], [0.0, 0])
        t[0] += float(r["op_total_time(ms)"])
        t[1] += int(r["op_occurrences"])
    for r in _csv(root, "op_statistic*.csv"):           # Ascend: OP Type, Total Time(us), Count
        t = out.setdefault(r.get("OP Type", "?"), [0.0, 0])
        t[0] += float(r.get("Total Time(us)", 0) or 0) / 1000
        t[1] += int(float(r.get("Count", 0) or 0))
    return sorted(((k, v[0], v[1]) for k, v in out.items()), key=lambda x: -x[1])


COMM = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "send", "receive", "hccl",
        "nccl")


def write_summary(root: Path, steps: list[int], device: str) -> Path:
    """summary.md: the steps profiled, the slowest operators (by total time), communication share."""
    ops = operator_times(root)
    total = sum(t for _, t, _ in ops)
    comm = sum(t for name, t, _ in ops if any(c in name.lower() for c in COMM))
    n = len(steps)
    lines = [f"# Profile of steps {steps[0]}..{steps[-1]} ({device})" if steps else "# Profile (no steps)",
             "", f"Trace and tables: {root}", "",
             "## Slowest operators (total time over the window's steps)", "",
             "| operator | total ms | ms per step | share | calls |", "|---|---:|---:|---:|---:|"]
    for name, t, calls in ops[:15]:
        lines.append(f"| {name} | {t:.3f} | {t / max(n, 1):.3f} | {t / total * 100 if total else 0:.1f}% "
                     f"| {calls} |")
    if not ops:
        lines.append("| (no operator table in the profiler output) | | | | |")
    lines += ["", "## Communication", ""]
    if comm:
        lines.append(f"Communication operators: {comm:.3f} ms, {comm / total * 100:.1f}% of operator time.")
    else:
        lines.append("No communication measured (one process, or a device whose profiler records no "
                     "communication: the CPU profiler records host operators only).")
    out = root / SUMMARY
    out.write_text("\n".join(lines) + "\n")
    return out
