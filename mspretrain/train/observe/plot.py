"""`train plot RUN [RUN ...] --out FILE.png` (and `train compare A B --plot FILE.png`): the curves of
one or several runs, overlaid, against the step.

Panels: loss and val loss, learning rate, gradient norm, loss scale, tokens/s, peak memory, update
ratio, val next-token accuracy. Read from each run's
metrics.jsonl; a run that lacks a metric (no validation, say) leaves its panel empty for that run.
`--config F.yaml [--set ...]` adds the configured learning-rate schedule (optim.schedule over
train.steps, a pure function of the step: mspretrain/train/step/optim.py) to the lr panel, with or without
runs: what a run will do before it starts, or what a resume with another optim.decay_start_step would.
matplotlib, Agg backend (no display needed): the `viz` extra.
"""
from __future__ import annotations

from pathlib import Path

from mspretrain.common.console import UsageError, ctrl_c_deferred
from mspretrain.train.observe.metrics import METRICS_FILE, MetricsError, read_records

PANELS = (("loss", "loss"), ("lr", "learning rate"), ("grad_norm", "gradient norm"),
          ("loss_scale", "loss scale"), ("tokens_per_s", "tokens/s"))
# long runs (mspretrain/train/observe/monitor.py): peak memory every step, update ratio every detail step
PANELS += (("peak_memory_mb", "peak memory MiB"), ("update_ratio", "update RMS / weight RMS"))
# validation records (eval: true): the next-token accuracy beside the val loss of the first panel
PANELS += (("val_acc", "next-token accuracy (val)"),)
EVAL_KEYS = {"val_acc"}


def run_records(run) -> list[dict]:
    path = Path(run) / METRICS_FILE
    if not path.is_file():
        raise MetricsError(f"{path}: not found; is {run} a run dir written by `train launch`?")
    return read_records(path)


def plot_runs(runs: list[str], out: str, schedule_cfg=None) -> Path:
    """`schedule_cfg`: a train Config whose learning-rate schedule is drawn too (dashed, black)."""
    with ctrl_c_deferred():     # matplotlib, interrupted mid-draw, raises an error of its own
        return _plot_runs(runs, out, schedule_cfg)


def _plot_runs(runs: list[str], out: str, schedule_cfg) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = {str(r): run_records(r) for r in runs}
    if not data and schedule_cfg is None:
        raise UsageError("nothing to plot: give run dirs, or --config for the learning-rate schedule")
    fig, axes = plt.subplots(len(PANELS), 1, figsize=(8, 2.4 * len(PANELS)), dpi=100, sharex=True)
    for i, (name, recs) in enumerate(data.items()):
        colour = f"C{i % 10}"
        steps = [r for r in recs if not r.get("eval")]
        evals = [r for r in recs if r.get("eval") and "val_loss" in r]
        for ax, (key, _) in zip(axes, PANELS):
            pts = [(r["step"], r[key]) for r in (evals if key in EVAL_KEYS else steps)
                   if isinstance(r.get(key), (int, float))]
            if pts:
                style = dict(ls="--", marker="o", ms=3) if key in EVAL_KEYS else {}
                ax.plot(*zip(*pts), color=colour, label=name if key == "loss" else None, lw=1.2, **style)
        if evals:
            axes[0].plot([r["step"] for r in evals], [r["val_loss"] for r in evals], color=colour,
                         ls="--", marker="o", ms=3, label=f"{name} (val)")
    if schedule_cfg is not None:
        from mspretrain.train.step.optim import check_schedule, schedule_points
        check_schedule(schedule_cfg.optim, schedule_cfg.train.steps)
        o = schedule_cfg.optim
        axes[1].plot(*schedule_points(o, schedule_cfg.train.steps), color="black", ls="--", lw=1.0,
                     label=f"{o.schedule} schedule" + (f" ({o.decay} decay)" if o.schedule == "wsd" else ""))
        axes[1].legend(fontsize=8)
    for ax, (key, title) in zip(axes, PANELS):
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
        if key in ("loss_scale",):
            ax.set_yscale("log", base=2)
        if key == "update_ratio" and ax.has_data():
            ax.set_yscale("log")
    if data:
        axes[0].legend(fontsize=8)
    axes[-1].set_xlabel("step")
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Software": None})
    plt.close(fig)
    return out
