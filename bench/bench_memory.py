"""Memory planner vs measured peak memory of real CPU training steps, component by component.

    .venv/bin/python bench/bench_memory.py [--sizes 256,512,1024] [--batches 1,4] [--steps 2]
        [--probe-unscale 512] [--mmap-threshold 131072] [--dtype fp32|fp16]

Every measurement is a fresh subprocess that builds train/model.py's Llama with train/step.py's
TrainStep (AdamW, K = 1: the trainer's own cells; fp32 unless --dtype fp16, then O2 with dynamic loss
scaling) and runs GRAPH_MODE steps on random tokens. It reads RSS and ru_maxrss (peak) at:
  base   after `import mindspore` and set_context (not counted: the interpreter and the library);
  built  after the model, the optimizer and the TrainStep exist (RSS): the weights, plus the float64
         draws of model init that glibc keeps in its heap (--mmap-threshold shows it; later
         allocations reuse that heap, so the total does not change);
  micro  the peak after the first MicroStep (forward + backward + accumulate) vs estimated gradients,
         accumulators and activations (the accumulators are lazy zeros until first written);
  apply  the peak after the first ApplyStep vs estimated Adam moments (also first written there) and
         ApplyStep's own buffers;
  total  the peak after the last step - base vs estimate.total.
A tiny model (hidden 64, vocab 256, same layers and sequence) run the same way gives the MindSpore
runtime's own cost of the two graphs (compiled graphs, kernels): it is printed and subtracted from each
phase. The activations alone are compared through the micro phase's slope over the batch, where no
static term enters. --probe-unscale measures ApplyStep's per-gradient unscale op (train.step._divide)
alone, against step._multiply, in a separate graph: the one CPU kernel cost the estimate does not
model. Nothing is fitted to these measurements: the estimate is train.memory's count from the code.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SEQ, LAYERS, VOCAB = 256, 4, 8192
CHILD_ENV = dict(os.environ)
TINY = (64, 256)                        # hidden, vocab of the runtime-cost reference


def sets_for(hidden: int, batch: int, vocab: int = VOCAB) -> list[str]:
    dtype = CHILD_ENV.get("BENCH_DTYPE", "fp32")
    return [f"model.hidden_size={hidden}", f"model.num_layers={LAYERS}", f"model.num_heads={max(1, hidden // 64)}",
            f"model.vocab_size={vocab}", f"train.global_batch_size={batch}", f"precision.dtype={dtype}",
            "precision.amp_level=O2", "device=CPU", "model.flash_attention=false"]


def child(hidden: int, batch: int, vocab: int, steps: int) -> dict:
    """Runs in the subprocess: build, train `steps` steps, report memory in bytes at each phase."""
    import numpy as np
    import psutil
    import mindspore as ms

    from train.config import load_config
    from train.model import CausalLMLoss, Llama, count_params, model_args
    from train.optim import build_optimizer
    from train.step import TrainStep, apply_precision

    def mark() -> dict:
        return {"rss": psutil.Process().memory_info().rss,
                "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)
    cfg = load_config(None, sets_for(hidden, batch, vocab))
    out = {"base": mark()}
    dtype = cfg.precision.dtype
    model = Llama(model_args(cfg.model, vocab, SEQ, "CPU", dtype), cfg.seed)
    loss_net = CausalLMLoss(apply_precision(model, cfg.precision), vocab)
    optimizer = build_optimizer(loss_net.trainable_params(), cfg.optim)
    step = TrainStep(loss_net, optimizer, 1, cfg.optim.clip_norm, dtype == "fp16", cfg.precision.loss_scale)
    out["built"] = mark()
    rng = np.random.default_rng(0)
    lr = ms.Tensor(1e-4, ms.float32)
    losses = []
    for i in range(steps):
        tokens = ms.Tensor(rng.integers(0, vocab, size=(batch, SEQ + 1), dtype=np.int32))
        losses.append(float(step.micro(tokens).asnumpy()))
        if i == 0:
            out["micro"] = mark()
        step.apply(lr)
        if i == 0:
            out["apply"] = mark()
    out["end"] = mark()
    out.update(params=count_params(model), losses=losses)
    return out


def probe_unscale(hidden: int, op: str) -> dict:
    """Runs in the subprocess: the growth of one graph that applies ApplyStep's per-gradient scalar op
    (train.step._divide, or _multiply for comparison) to every accumulator and sums the results."""
    import psutil
    import mindspore as ms
    from mindspore import nn, ops

    from train.config import load_config
    from train.model import CausalLMLoss, Llama, model_args
    from train.optim import build_optimizer
    from train.step import TrainStep, _divide, _multiply

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    cfg = load_config(None, sets_for(hidden, 1))
    loss_net = CausalLMLoss(Llama(model_args(cfg.model, VOCAB, SEQ, "CPU"), cfg.seed), VOCAB)
    optimizer = build_optimizer(loss_net.trainable_params(), cfg.optim)
    acc = TrainStep(loss_net, optimizer, 1, 1.0, False, cfg.precision.loss_scale).accumulators
    fn = _divide if op == "divide" else _multiply

    class Probe(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.acc, self.hyper_map = acc, ops.HyperMap()

        def construct(self, x):
            return ops.addn(self.hyper_map(ops.reduce_sum, self.hyper_map(ops.partial(fn, x), self.acc)))

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    before = max(before, psutil.Process().memory_info().rss)
    Probe()(ms.Tensor(2.0, ms.float32))
    return {"growth": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before,
            "grads": 4 * sum(int(a.size) for a in acc)}


def measure(hidden: int, batch: int, steps: int, vocab: int = VOCAB, probe: str = "") -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(hidden), "--batch", str(batch),
                          "--vocab", str(vocab), "--steps", str(steps), "--probe", probe],
                         capture_output=True, text=True, cwd=REPO, env=CHILD_ENV)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if out.returncode or line is None:
        raise SystemExit(f"hidden {hidden} batch {batch}: child failed:\n{out.stderr[-3000:]}")
    r = json.loads(line[len("RESULT "):])
    if probe:
        return r
    base = r["base"]["rss"]
    return {"params": r["params"], "losses": r["losses"],
            "built": r["built"]["rss"] - base,                  # host weights (+ init leftovers)
            "micro": r["micro"]["peak"] - r["built"]["rss"],    # growth in the first micro-step
            "apply": r["apply"]["peak"] - r["micro"]["peak"],   # further growth in the first apply
            "total": r["end"]["peak"] - base}


def mb(x: float) -> str:
    return f"{x / 1e6:8.0f}"


def pct(est: float, got: float) -> str:
    return f"{100 * (est - got) / got:+6.0f}%" if got > 0 else "    n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,512,1024", help="model widths (hidden_size), comma-separated")
    ap.add_argument("--batches", default="1,4", help="micro-batch sizes, comma-separated")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--probe-unscale", type=int, default=512, metavar="HIDDEN",
                    help="also measure ApplyStep's unscale op alone at this width (0: skip)")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--vocab", type=int, default=VOCAB, help=argparse.SUPPRESS)
    ap.add_argument("--probe", default="", help=argparse.SUPPRESS)
    ap.add_argument("--mmap-threshold", type=int, default=0, metavar="BYTES",
                    help="run the children with MALLOC_MMAP_THRESHOLD_=BYTES (e.g. 131072): glibc then hands "
                         "freed large arrays (the float64 weight draws of model init) back to the system")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "fp16"),
                    help="precision of the runs (fp16: precision.amp_level O2 with dynamic loss scaling)")
    opts = ap.parse_args()
    if not opts.child:
        CHILD_ENV["BENCH_DTYPE"] = opts.dtype
    if opts.mmap_threshold:
        CHILD_ENV["MALLOC_MMAP_THRESHOLD_"] = str(opts.mmap_threshold)
    if opts.child:
        res = (probe_unscale(opts.child, opts.probe) if opts.probe
               else child(opts.child, opts.batch, opts.vocab, opts.steps))
        print("RESULT " + json.dumps(res), flush=True)
        return

    from train.config import load_config
    from train.memory import estimate

    tiny = measure(*TINY[:1], 1, opts.steps, vocab=TINY[1])
    rt = {"micro": tiny["micro"], "apply": tiny["apply"], "total": tiny["total"] - tiny["built"]}
    malloc = f"MALLOC_MMAP_THRESHOLD_={opts.mmap_threshold}" if opts.mmap_threshold else "default glibc malloc"
    print(f"seq {SEQ}, layers {LAYERS}, vocab {VOCAB}, {opts.dtype} AdamW, {opts.steps} steps, {malloc}; MB = 1e6 bytes")
    print(f"MindSpore runtime (tiny model, hidden {TINY[0]}, vocab {TINY[1]}, {tiny['params']} params): "
          f"micro graph {mb(rt['micro']).strip()} MB, apply graph {mb(rt['apply']).strip()} MB, "
          f"total {mb(rt['total']).strip()} MB: subtracted below")
    print(f"{'hidden':>6} {'params':>7} {'batch':>5} | {'weights est':>11} {'meas':>6} {'err':>7} | "
          f"{'micro est':>9} {'meas':>6} {'err':>7} | {'apply est':>9} {'meas':>6} {'err':>7} | "
          f"{'total est':>9} {'meas':>6} {'err':>7}")
    errors, parts, slopes = [], [], []
    batches = [int(x) for x in opts.batches.split(",")]
    for hidden in [int(x) for x in opts.sizes.split(",")]:
        micro = {}
        for batch in batches:
            est = estimate(load_config(None, sets_for(hidden, batch)), SEQ, VOCAB)
            got = measure(hidden, batch, opts.steps)
            assert est.params_total == got["params"]
            e_micro = est.grads + est.accumulators + est.activations
            e_apply = est.optimizer + est.step_temps
            m_micro, m_apply = got["micro"] - rt["micro"], got["apply"] - rt["apply"]
            m_total = got["total"] - rt["total"]
            errors.append((est.total - m_total) / m_total)
            micro[batch] = (est.activations, got["micro"])
            parts.append(f"{hidden:>6} {batch:>5} | weights {mb(est.weights)} grads {mb(est.grads)} "
                         f"Adam m+v {mb(est.optimizer)} accumulators {mb(est.accumulators)} apply step "
                         f"{mb(est.step_temps)} | activations {mb(est.activations)} (layers "
                         f"{mb(sum(est.layer_activations))}, head {mb(est.head_activations)})")
            print(f"{hidden:>6} {got['params'] / 1e6:>6.1f}M {batch:>5} | {mb(est.weights):>11} "
                  f"{mb(got['built']):>6} {pct(est.weights, got['built'])} | {mb(e_micro):>9} {mb(m_micro):>6} "
                  f"{pct(e_micro, m_micro)} | {mb(e_apply):>9} {mb(m_apply):>6} {pct(e_apply, m_apply)} | "
                  f"{mb(est.total):>9} {mb(m_total):>6} {pct(est.total, m_total)}", flush=True)
        if len(batches) > 1:         # what grows with the batch: activations only, nothing static in it
            (e0, m0), (e1, m1) = micro[batches[0]], micro[batches[-1]]
            db = batches[-1] - batches[0]
            slopes.append((hidden, (e1 - e0) / db, (m1 - m0) / db))
    print(f"total error: {100 * min(errors):+.0f}% .. {100 * max(errors):+.0f}% "
          f"(mean |error| {100 * sum(abs(e) for e in errors) / len(errors):.0f}%)")
    print("\nestimate by component (MB):")
    print("\n".join(parts))
    for hidden, e, m in slopes:
        print(f"activations per sample, hidden {hidden}: estimate {mb(e).strip()} MB, measured (micro-phase "
              f"slope over the batch) {mb(m).strip()} MB, error {pct(e, m).strip()}")
    if opts.probe_unscale:
        h = opts.probe_unscale
        div, mul = (measure(h, 1, 1, probe=op) for op in ("divide", "multiply"))
        print(f"unscale probe, hidden {h} ({mb(div['grads']).strip()} MB of fp32 gradients): one graph "
              f"applying step._divide to every accumulator grows {div['growth'] / div['grads']:.1f}x the "
              f"gradients, step._multiply {mul['growth'] / mul['grads']:.1f}x (the estimate counts 1x)")


if __name__ == "__main__":
    main()
