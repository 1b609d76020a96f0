"""RUN/metrics.jsonl: one JSON line per step (and one per validation), the console line, run compare.

Floats are written with Python's shortest round-trip repr, so `loss` in the file is the exact fp32
value; `compare_runs` checks them bit for bit (float.hex).
"""
from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

from mspretrain.common.errors import MspretrainError
from mspretrain.common.files import atomic_open

METRICS_FILE = "metrics.jsonl"


class MetricsError(MspretrainError, ValueError):
    """A metrics file that cannot be read; the message names the file and the line."""


class MetricsWriter:
    """Appends one line per record, flushed at once (a kill loses at most the line being written)."""

    def __init__(self, run_dir):
        from mspretrain.train.observe.tensorboard import TensorBoardMirror
        self.path = Path(run_dir) / METRICS_FILE
        resumed_at = max((r["step"] for r in read_records(self.path)), default=0) \
            if self.path.is_file() else 0
        self._file = open(self.path, "a")
        self._tb = TensorBoardMirror(run_dir, resumed_at)

    def write(self, record: dict) -> None:
        record = {**record, "time": datetime.now(timezone.utc).isoformat(timespec="milliseconds")}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        self._tb.write(record)

    def close(self) -> None:
        self._file.close()
        self._tb.close()


def read_records(path) -> list[dict]:
    """Every record of a metrics file. A final line cut short by a kill is ignored; any other
    line that is not a JSON object with an integer `step` is an error naming the line."""
    path = Path(path)
    lines = path.read_bytes().split(b"\n")
    records = []
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw.decode("utf-8"))
        except ValueError:                    # not JSON, or not UTF-8 (JSONDecodeError is one)
            if number == len(lines):          # the unterminated last line of a killed run
                break
            text = raw[:80].decode("utf-8", "replace")
            raise MetricsError(f"{path}:{number}: not valid JSON: {text!r}") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("step"), int):
            raise MetricsError(f"{path}:{number}: expected an object with an integer 'step'")
        records.append(rec)
    return records


def truncate_after(run_dir, step: int) -> int:
    """Keep only the records with step <= `step` (rewritten atomically), so a resumed run reads like
    one run. Returns how many records were dropped."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return 0
    records = read_records(path)
    kept = [r for r in records if r["step"] <= step]
    with atomic_open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in kept)
    return len(records) - len(kept)


def train_losses(path) -> dict[int, float]:
    """step -> loss of the training records (validation records have "eval": true)."""
    return {r["step"]: r["loss"] for r in read_records(path) if not r.get("eval")}


def console_line(rec: dict, total_steps: int) -> str:
    if rec.get("eval"):
        z = f"  val_z_loss {rec['val_z_loss']:.2e}" if rec.get("val_z_loss") is not None else ""
        acc = f"  val_acc {rec['val_acc']:.4f}" if rec.get("val_acc") is not None else ""
        return (f"step {rec['step']:>6}/{total_steps}  val_loss {rec['val_loss']:.4f}  "
                f"val_ppl {rec['val_ppl']:.2f}{acc}{z}")
    flags = " overflow(skipped)" if rec["overflow"] else ""
    if rec.get("skipped") and not rec["overflow"]:          # train.spike (mspretrain/train/observe/spike.py)
        flags = f" {rec.get('skip_reason', 'spike')}(skipped)"
    mfu = f"  mfu {rec['mfu'] * 100:.1f}%" if rec.get("mfu") is not None else ""
    mem = f"  mem {rec['peak_memory_mb']:,.0f}MB" if rec.get("peak_memory_mb") is not None else ""
    z = f"  z {rec['z_loss']:.2e}" if rec.get("z_loss") is not None else ""
    upd = f"  upd {rec['update_ratio']:.1e}" if rec.get("update_ratio") is not None else ""
    return (f"step {rec['step']:>6}/{total_steps}  loss {rec['loss']:.4f}{z}  lr {rec['lr']:.3e}  "
            f"gnorm {rec['grad_norm']:.3f}  scale {rec['loss_scale']:g}  "
            f"tok/s {rec['tokens_per_s']:,.0f}{mfu}{mem}{upd}  wait {rec['data_wait_s'] * 1000:.1f}ms{flags}")


def _hex(x) -> str:
    return float(x).hex() if isinstance(x, (int, float)) and not (isinstance(x, float) and math.isnan(x)) \
        else repr(x)


def compare_runs(run_a, run_b, out=print) -> int:
    """Print, step by step, whether the two runs' losses are bitwise equal. 0 only when every common
    step matches (and there is at least one); 1 otherwise."""
    a = train_losses(Path(run_a) / METRICS_FILE)
    b = train_losses(Path(run_b) / METRICS_FILE)
    common = sorted(set(a) & set(b))
    mismatches = 0
    for step in common:
        same = _hex(a[step]) == _hex(b[step])
        mismatches += not same
        out(f"step {step:>6}  {a[step]!r:>22}  {b[step]!r:>22}  {'equal' if same else 'DIFFERENT'}")
    only = sorted(set(a) ^ set(b))
    if only:
        out(f"{len(only)} step(s) in only one run (first: {only[0]})")
    if not common:
        out("no common steps")
        return 1
    out(f"{len(common) - mismatches}/{len(common)} common steps bitwise equal")
    return 0 if mismatches == 0 else 1
