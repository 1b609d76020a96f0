"""What a long run shows per step beyond the loss (docs/long-runs.md).

- `peak_memory_mb`: on Ascend/GPU MindSpore's runtime figure (`mindspore.runtime.max_memory_allocated`,
  the peak of the memory pool held by tensors since the process started); on CPU that call always
  returns 0 (MindSpore 2.10's documentation says so), so the process's peak resident set size is
  read instead (Linux: VmHWM of /proc/self/status): it includes the ~400 MB of MindSpore itself.
  Not `getrusage` ru_maxrss: Linux carries it over from the process that started this one (a
  launcher or a test runner with a larger peak than the run's would be read at every step). Both
  are peaks since the process started, read without a device sync.
- `update_ratio`: RMS of the weight update over RMS of the weights, overall and per layer group
  (`update_ratio_groups`: embed, layer_N, norm, head), every `log.detail_every_steps` steps. The
  weights are copied to the host before and after that step only, so other steps pay nothing.
- `z_loss`: the z-loss term inside `loss` (train.z_loss), from the step graph.
- The planner's estimate (`train estimate`, mspretrain/train/memory.py) beside the first peak.
"""
from __future__ import annotations

import re
import resource
import sys

import numpy as np

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def peak_memory_mb(device: str) -> float:
    """The process's peak memory so far, MiB: device pool (Ascend/GPU) or resident set (CPU)."""
    if device != "CPU":
        import mindspore as ms
        return ms.runtime.max_memory_allocated() / 2 ** 20
    hwm = _vm_hwm_kib()
    if hwm is not None:
        return hwm / 2 ** 10
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss        # KiB on Linux, bytes on macOS
    return rss / (2 ** 20 if sys.platform == "darwin" else 2 ** 10)


def _vm_hwm_kib() -> int | None:
    """This process's own peak RSS (its address space's high-water mark), KiB; None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def layer_group(name: str) -> str:
    """embed | layer_N | norm | head: the group update_ratio_groups reports a parameter in."""
    m = _LAYER.search(name)
    if m:
        return f"layer_{m.group(1)}"
    if "embed" in name:
        return "embed"
    if "output" in name or "head" in name:
        return "head"
    return "norm"


def update_ratios(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> tuple[float, dict]:
    """RMS(after - before) / RMS(before), over all parameters and per layer group (float64 sums)."""
    upd: dict[str, float] = {}
    ref: dict[str, float] = {}
    for name, old in before.items():
        g = layer_group(name)
        old64 = old.astype(np.float64)
        upd[g] = upd.get(g, 0.0) + float(np.square(after[name].astype(np.float64) - old64).sum())
        ref[g] = ref.get(g, 0.0) + float(np.square(old64).sum())

    def ratio(u: float, r: float) -> float:
        return float(np.sqrt(u / r)) if r > 0 else 0.0
    groups = {g: ratio(upd[g], ref[g]) for g in sorted(upd, key=_group_order)}
    return ratio(sum(upd.values()), sum(ref.values())), groups


def _group_order(g: str):
    order = {"embed": (0, 0), "norm": (2, 0), "head": (3, 0)}
    return order.get(g) or (1, int(g.split("_")[1]))


class StepObserver:
    """Per-step fields for metrics.jsonl: call `before(step)` ahead of the step, `fields(step,
    result)` after it."""

    def __init__(self, cfg, weights, estimate_mb: float | None = None, notice: bool = True):
        self.device = cfg.device
        self.every = cfg.log.detail_every_steps
        self.z_loss = cfg.train.z_loss > 0
        self.weights = list(weights)            # the model's trainable parameters (fp32 masters)
        self.estimate_mb = estimate_mb
        self._before: dict | None = None
        self.first_peak: float | None = None
        self.notice = notice        # False after a spike rollback: the first peak was told already

    def detail_step(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def before(self, step: int) -> None:
        self._before = ({p.name: p.asnumpy().copy() for p in self.weights}
                        if self.detail_step(step) else None)

    def fields(self, step: int, result) -> dict:
        out = {"peak_memory_mb": peak_memory_mb(self.device)}
        if self.z_loss:
            out["z_loss"] = result.z_loss
        if self._before is not None:
            after = {p.name: p.asnumpy() for p in self.weights}
            out["update_ratio"], out["update_ratio_groups"] = update_ratios(self._before, after)
            self._before = None
        return out

    def first_peak_notice(self, record: dict) -> str | None:
        """Once, after the first step: the measured peak beside the planner's estimate."""
        if self.first_peak is not None:
            return None
        self.first_peak = record["peak_memory_mb"]
        if not self.notice:
            return None
        what = "device memory (max allocated)" if self.device != "CPU" else "process peak RSS"
        est = (f"; `train estimate` planned {self.estimate_mb:,.0f} MiB"
               + (" (on CPU the RSS adds MindSpore's own ~400 MiB and the graph keeps every "
                  "intermediate)" if self.device == "CPU" else "")) if self.estimate_mb else ""
        return f"[train] measured peak after step {record['step']}: {self.first_peak:,.0f} MiB {what}{est}"


def planned_mb(cfg, seq_length: int, vocab_size: int) -> float | None:
    """`train estimate`'s per-device total, MiB (None if the planner cannot size this config)."""
    try:
        from mspretrain.train.memory import estimate
        return estimate(cfg, seq_length, vocab_size).total / 2 ** 20
    except Exception:   # noqa: BLE001 (a note beside a measurement must never stop the run)
        return None
