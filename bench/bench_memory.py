"""Memory planner vs measured peak memory of real CPU training steps, and the accumulation modes.

    .venv/bin/python bench/bench_memory.py [--sizes 256,512,1024] [--batches 1,4] [--steps 2]
        [--accumulate 4] [--mmap-threshold 131072] [--dtype fp32|fp16]

Every measurement is a fresh subprocess that builds the Llama of mspretrain/train/models/llama/model.py
with mspretrain/train/step/cell.py's TrainStepCell (AdamW; fp32 unless --dtype fp16, then O2 with dynamic
loss scaling) and runs GRAPH_MODE steps on random tokens. It reads RSS and ru_maxrss (peak) at:
  base   after `import mindspore` and set_context (not counted: the interpreter and the library);
  built  after the model, the optimizer and the step cell exist (RSS): the weights, plus the float64
         draws of model init that glibc keeps in its heap (--mmap-threshold shows it);
  step   the peak after the first step (one graph: forward, backward, norm, clip, AdamW, whose moments
         are first written there) vs estimated gradients + accumulators + activations + Adam moments
         + the update's buffers;
  total  the peak after the last step - base vs estimate.total.
A tiny model (hidden 64, vocab 256, same layers and sequence) run the same way gives the MindSpore
runtime's own cost (compiled graph, kernels): it is printed and subtracted. The activations alone are
compared through the step phase's slope over the batch, where no static term enters. Nothing is
fitted to these measurements: the estimate is train.memory's count from the code.

--document-mask: the step-phase growth with packed-document masking (block-causal mask, position reset,
EOD loss mask) on minus off, same model and batch, at each size and batch, against the planner's
document term (train.models.llama.memory.document_activation_bytes); samples hold documents of ~64 tokens.

--accumulate K: the step-phase growth of one step over a batch of K * (largest --batches) samples,
for the whole batch at once (K = 1), K micro-batches in a graph while-loop (train.accumulate=loop) and
K micro-batches sliced and summed before one backward (train.accumulate=split), at the largest size.
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
EOS = 2


def sets_for(hidden: int, batch: int, vocab: int = VOCAB) -> list[str]:
    dtype = CHILD_ENV.get("BENCH_DTYPE", "fp32")
    docs = "true" if CHILD_ENV.get("BENCH_DOCS") == "on" else "false"
    return [f"model.hidden_size={hidden}", f"model.num_layers={LAYERS}", f"model.num_heads={max(1, hidden // 64)}",
            f"model.vocab_size={vocab}", f"train.global_batch_size={batch}", f"precision.dtype={dtype}",
            "precision.amp_level=O2", "device=CPU", "model.flash_attention=false",
            f"model.document_mask={docs}", f"model.reset_position_ids={docs}", f"train.eod_mask_loss={docs}"]


def child(hidden: int, batch: int, vocab: int, steps: int, micro: int = 1, mode: str = "loop") -> dict:
    """Runs in the subprocess: build, train `steps` steps, report memory in bytes at each phase."""
    import numpy as np
    import psutil
    import mindspore as ms

    from mspretrain.train.config import load_config
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.flops import count_params
    from mspretrain.train.models.llama.model import Llama, model_args
    from mspretrain.train.step.optim import build_optimizer
    from mspretrain.train.step.cell import build_train_step
    from mspretrain.train.step.precision import apply_precision

    def mark() -> dict:
        return {"rss": psutil.Process().memory_info().rss,
                "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)
    cfg = load_config(None, [*sets_for(hidden, batch, vocab), f"train.accumulate={mode}"])
    out = {"base": mark()}
    dtype = cfg.precision.dtype
    docs = cfg.model.document_mask
    model = Llama(model_args(cfg.model, vocab, SEQ, "CPU", dtype, EOS if docs else None), cfg.seed)
    loss_net = CausalLMLoss(apply_precision(model, cfg.precision), vocab, EOS if docs else -1)
    optimizer = build_optimizer(loss_net.trainable_params(), cfg.optim)
    step = build_train_step(loss_net, optimizer, micro, cfg)      # the EOD mask comes from loss_net
    out["built"] = mark()
    rng = np.random.default_rng(0)
    losses = []
    for i in range(steps):
        tokens = rng.integers(3, vocab, size=(batch, SEQ + 1), dtype=np.int32)
        tokens[rng.random(tokens.shape) < 1 / 64] = EOS         # packed documents of ~64 tokens
        losses.append(step(tokens, 1e-4).loss)
        if i == 0:
            out["step"] = mark()
    out["end"] = mark()
    out.update(params=count_params(model), losses=losses)
    return out


def measure(hidden: int, batch: int, steps: int, vocab: int = VOCAB, micro: int = 1, mode: str = "loop",
            docs: str = "off") -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(hidden), "--batch", str(batch),
                          "--vocab", str(vocab), "--steps", str(steps), "--micro", str(micro), "--mode", mode],
                         capture_output=True, text=True, cwd=REPO, env={**CHILD_ENV, "BENCH_DOCS": docs})
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    if out.returncode or line is None:
        raise SystemExit(f"hidden {hidden} batch {batch}: child failed:\n{out.stderr[-3000:]}")
    r = json.loads(line[len("RESULT "):])
    base = r["base"]["rss"]
    return {"params": r["params"], "losses": r["losses"],
            "built": r["built"]["rss"] - base,                  # host weights (+ init leftovers)
            "step": r["step"]["peak"] - r["built"]["rss"],      # growth in the first step
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
    ap.add_argument("--accumulate", type=int, default=4, metavar="K",
                    help="compare the accumulation modes with K micro-batches (0: skip)")
    ap.add_argument("--document-mask", action="store_true",
                    help="only measure packed-document masking on vs off against the planner's document term")
    ap.add_argument("--child", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--vocab", type=int, default=VOCAB, help=argparse.SUPPRESS)
    ap.add_argument("--micro", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="loop", help=argparse.SUPPRESS)
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
        res = child(opts.child, opts.batch, opts.vocab, opts.steps, opts.micro, opts.mode)
        print("RESULT " + json.dumps(res), flush=True)
        return

    from mspretrain.train.config import load_config
    from mspretrain.train.memory import estimate

    if opts.document_mask:
        return document_mask_runs(opts)
    tiny = measure(*TINY[:1], 1, opts.steps, vocab=TINY[1])
    rt = {"step": tiny["step"], "total": tiny["total"] - tiny["built"]}
    malloc = f"MALLOC_MMAP_THRESHOLD_={opts.mmap_threshold}" if opts.mmap_threshold else "default glibc malloc"
    print(f"seq {SEQ}, layers {LAYERS}, vocab {VOCAB}, {opts.dtype} AdamW, {opts.steps} steps, {malloc}; MB = 1e6 bytes")
    print(f"MindSpore runtime (tiny model, hidden {TINY[0]}, vocab {TINY[1]}, {tiny['params']} params): "
          f"step graph {mb(rt['step']).strip()} MB, total {mb(rt['total']).strip()} MB: subtracted below")
    print(f"{'hidden':>6} {'params':>7} {'batch':>5} | {'weights est':>11} {'meas':>6} {'err':>7} | "
          f"{'step est':>9} {'meas':>6} {'err':>7} | {'total est':>9} {'meas':>6} {'err':>7}")
    errors, parts, slopes = [], [], []
    batches = [int(x) for x in opts.batches.split(",")]
    sizes = [int(x) for x in opts.sizes.split(",")]
    for hidden in sizes:
        grown = {}
        for batch in batches:
            est = estimate(load_config(None, sets_for(hidden, batch)), SEQ, VOCAB)
            got = measure(hidden, batch, opts.steps)
            assert est.params_total == got["params"]
            e_step = est.grads + est.accumulators + est.activations + est.optimizer + est.step_temps
            m_step = got["step"] - rt["step"]
            m_total = got["total"] - rt["total"]
            errors.append((est.total - m_total) / m_total)
            grown[batch] = (est.activations, got["step"])
            parts.append(f"{hidden:>6} {batch:>5} | weights {mb(est.weights)} grads {mb(est.grads)} "
                         f"Adam m+v {mb(est.optimizer)} accumulators {mb(est.accumulators)} update "
                         f"{mb(est.step_temps)} | activations {mb(est.activations)} (layers "
                         f"{mb(sum(est.layer_activations))}, head {mb(est.head_activations)})")
            print(f"{hidden:>6} {got['params'] / 1e6:>6.1f}M {batch:>5} | {mb(est.weights):>11} "
                  f"{mb(got['built']):>6} {pct(est.weights, got['built'])} | {mb(e_step):>9} {mb(m_step):>6} "
                  f"{pct(e_step, m_step)} | {mb(est.total):>9} {mb(m_total):>6} {pct(est.total, m_total)}",
                  flush=True)
        if len(batches) > 1:         # what grows with the batch: activations only, nothing static in it
            (e0, m0), (e1, m1) = grown[batches[0]], grown[batches[-1]]
            db = batches[-1] - batches[0]
            slopes.append((hidden, (e1 - e0) / db, (m1 - m0) / db))
    print(f"total error: {100 * min(errors):+.0f}% .. {100 * max(errors):+.0f}% "
          f"(mean |error| {100 * sum(abs(e) for e in errors) / len(errors):.0f}%)")
    print("\nestimate by component (MB):")
    print("\n".join(parts))
    for hidden, e, m in slopes:
        print(f"activations per sample, hidden {hidden}: estimate {mb(e).strip()} MB, measured (step-phase "
              f"slope over the batch) {mb(m).strip()} MB, error {pct(e, m).strip()}")
    if opts.accumulate > 1:
        k, hidden, micro = opts.accumulate, sizes[-1], batches[-1]
        print(f"\naccumulation, hidden {hidden}, {k} micro-batches of {micro} (batch {k * micro}): "
              f"step-phase growth")
        for label, n, mode in ((f"whole batch of {k * micro}, K=1", 1, "loop"),
                               (f"loop: while-loop over {k}", k, "loop"),
                               (f"split: {k} slices, one backward", k, "split"),
                               (f"one micro-batch of {micro}, K=1", 1, "loop")):
            batch = micro if label.startswith("one") else k * micro
            got = measure(hidden, batch, opts.steps, micro=n, mode=mode)
            print(f"  {label:<34} {mb(got['step'] - rt['step']).strip():>6} MB  (losses "
                  f"{', '.join(f'{x:.4f}' for x in got['losses'])})", flush=True)


def document_mask_runs(opts) -> None:
    """Step-phase growth with the packed-document features on minus off, against the planner's term."""
    from mspretrain.train.config import load_config
    from mspretrain.train.models.llama.memory import document_activation_bytes

    print(f"seq {SEQ}, layers {LAYERS}, vocab {VOCAB}, {opts.dtype}; step-phase growth on - off (MB = 1e6 bytes)")
    print(f"{'hidden':>6} {'batch':>5} | {'off':>6} {'on':>6} {'on-off':>7} | {'estimate':>8} {'err':>7}")
    for hidden in (int(x) for x in opts.sizes.split(",")):
        for batch in (int(x) for x in opts.batches.split(",")):
            off = measure(hidden, batch, opts.steps, docs="off")["step"]
            on = measure(hidden, batch, opts.steps, docs="on")["step"]
            CHILD_ENV["BENCH_DOCS"] = "on"
            est = document_activation_bytes(load_config(None, sets_for(hidden, batch)), SEQ, batch)
            CHILD_ENV.pop("BENCH_DOCS")
            print(f"{hidden:>6} {batch:>5} | {mb(off)} {mb(on)} {mb(on - off):>7} | {mb(est):>8} "
                  f"{pct(est, on - off)}", flush=True)


if __name__ == "__main__":
    main()
