"""Memory planner vs measured peak memory of real CPU training steps.

    .venv/bin/python bench/bench_memory.py [--sizes 256,512,1024] [--batches 1,4] [--steps 2]

For each model width and micro-batch, a fresh subprocess builds train/model.py's Llama with
train/step.py's TrainStep (fp32, AdamW: the trainer's own cells), runs a few GRAPH_MODE steps on random
tokens and reports its peak RSS (ru_maxrss) minus its RSS just before the model was built. The parent
prints that growth next to `train.memory.estimate` for the same config, with the relative error, then
splits both into what grows with the batch (activations: the slope between the two batches) and the
rest (static: parameters, gradients, Adam states, plus on CPU MindSpore's compiled graphs).

CPU accounting compared: fp32 weights 4 + gradients 4 + Adam m 4 + v 4 = 16 bytes/parameter (no fp16
copy, no separate fp32 master on CPU), the activations of one micro-batch (every layer, nothing
recomputed) and the logits. Not in the estimate but in the measurement: MindSpore's compiled graphs
and kernel workspaces, the gradients of a micro-step before they are added into the trainer's
accumulators (4 more bytes/parameter), and whatever the CPU backend's memory pool does not reuse.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SEQ, BATCH, LAYERS, VOCAB = 256, 4, 4, 8192


def sets_for(hidden: int, batch: int) -> list[str]:
    return [f"model.hidden_size={hidden}", f"model.num_layers={LAYERS}", f"model.num_heads={hidden // 64}",
            f"model.vocab_size={VOCAB}", f"train.global_batch_size={batch}", "precision.dtype=fp32",
            "device=CPU", "model.flash_attention=false"]


def child(hidden: int, batch: int, steps: int) -> dict:
    """Runs in the subprocess: build, train `steps` steps, report memory in bytes."""
    import numpy as np
    import psutil
    import mindspore as ms

    from train.config import load_config
    from train.model import CausalLMLoss, Llama, count_params, model_args
    from train.optim import build_optimizer
    from train.step import TrainStep

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)
    cfg = load_config(None, sets_for(hidden, batch))
    before = psutil.Process().memory_info().rss
    args = model_args(cfg.model, VOCAB, SEQ, "CPU")
    model = Llama(args, cfg.seed)
    loss_net = CausalLMLoss(model, VOCAB)
    optimizer = build_optimizer(loss_net.trainable_params(), cfg.optim)
    step = TrainStep(loss_net, optimizer, 1, cfg.optim.clip_norm, False, cfg.precision.loss_scale)
    rng = np.random.default_rng(0)
    losses = []
    for i in range(steps):
        tokens = rng.integers(0, VOCAB, size=(batch, SEQ + 1), dtype=np.int32)
        losses.append(step(tokens, 1e-4).loss)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"params": count_params(model), "before": before, "peak": peak, "losses": losses}


def measure(hidden: int, batch: int, steps: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(hidden), "--batch", str(batch),
                          "--steps", str(steps)], capture_output=True, text=True, cwd=REPO)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if out.returncode or line is None:
        raise SystemExit(f"hidden {hidden} batch {batch}: child failed:\n{out.stderr[-3000:]}")
    res = json.loads(line[len("RESULT "):])
    res["growth"] = res["peak"] - res["before"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,512,1024", help="model widths (hidden_size), comma-separated")
    ap.add_argument("--batches", default="1,4", help="two micro-batch sizes (the activation slope)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=BATCH, help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.child:
        print("RESULT " + json.dumps(child(opts.child, opts.batch, opts.steps)), flush=True)
        return

    from train.config import load_config
    from train.memory import GB, estimate

    b1, b2 = (int(x) for x in opts.batches.split(","))
    print(f"seq {SEQ}, layers {LAYERS}, vocab {VOCAB}, fp32 AdamW, {opts.steps} steps; measured = peak RSS "
          f"- RSS before building the model; GB = 1e9 bytes", flush=True)
    print(f"{'hidden':>6} {'params':>8} {'batch':>5} {'estimate':>9} {'measured':>9} {'error':>7} | "
          f"{'static est':>10} {'meas':>7} | {'activ/sample est':>16} {'meas':>7}")
    fit = []                            # (params, static measured, activation/sample measured, estimated)
    for hidden in [int(x) for x in opts.sizes.split(",")]:
        ests, meas = {}, {}
        for batch in (b1, b2):
            cfg = load_config(None, sets_for(hidden, batch))
            ests[batch] = estimate(cfg, SEQ, VOCAB)
            meas[batch] = measure(hidden, batch, opts.steps)
            assert ests[batch].params_total == meas[batch]["params"]
        # split: what grows with the batch (slope) and what does not (intercept)
        act_est = (ests[b2].total - ests[b1].total) / (b2 - b1)
        act_meas = (meas[b2]["growth"] - meas[b1]["growth"]) / (b2 - b1)
        static_est = ests[b1].total - act_est * b1
        static_meas = meas[b1]["growth"] - act_meas * b1
        for batch in (b1, b2):
            est, got = ests[batch].total, meas[batch]["growth"]
            split = (f"{static_est / GB:>10.3f} {static_meas / GB:>7.3f} | {act_est / GB:>16.3f} "
                     f"{act_meas / GB:>7.3f}") if batch == b2 else ""
            print(f"{hidden:>6} {meas[batch]['params'] / 1e6:>7.1f}M {batch:>5} {est / GB:>9.3f} "
                  f"{got / GB:>9.3f} {100 * (est - got) / got:>+6.1f}% | {split}", flush=True)
        fit.append((meas[b1]["params"], static_meas, act_meas, act_est))
    if len(fit) > 1:                    # bytes per parameter: slope of the static part over model size
        (n0, s0, a0, e0), (n1, s1, a1, e1) = fit[0], fit[-1]
        print(f"static slope: {(s1 - s0) / (n1 - n0):.1f} bytes/parameter measured vs 16 estimated; "
              f"activations: measured / estimated = {a0 / e0:.1f}x .. {a1 / e1:.1f}x")


if __name__ == "__main__":
    main()
