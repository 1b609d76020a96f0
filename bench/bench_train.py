"""Trainer throughput on CPU against a hand-written MindSpore step: tokens/s, peak RSS, MFU, data wait.

    .venv/bin/python bench/bench_train.py [--hidden 512 --layers 4 --seq 256 --batch 4 --steps 12]
        [--repeat 2]   (the reference size: --layers 8 --batch 8 --vocab 8000 --ffn 1408)

The reference, run in the same invocation on the same model (the Llama of
mspretrain/train/models/llama/model.py and the CausalLMLoss of mspretrain/train/step/loss.py, same shapes,
fp32): a plain `nn.TrainOneStepCell` subclass whose construct clips the gradients with
`ops.clip_by_global_norm` before `nn.AdamWeightDecay`, fed pre-made random batches (no loader).
Each run is its own process; its peak RSS is that process's ru_maxrss (read by a wrapper process
around it: RUSAGE_CHILDREN). With --repeat 2 the two alternate (launch, reference, launch,
reference) and the ratios are of the sums. Targets: train launch >= 0.95x the reference's tokens/s,
<= 1.1x its peak RSS, data wait < 2% of step time.

MFU's peak is this machine's fp32 matmul rate, measured here in the same run: the faster of a numpy
sgemm (1024^3) and a MindSpore GRAPH_MODE MatMul of the model's largest projection shape
([batch*seq, hidden] x [hidden, ffn]). The training itself is the real `python -m mspretrain.train launch` on a
real MindRecord dataset with the real loader (worker processes, prefetch); the figures come from its
metrics.jsonl, skipping the first steps (graph compile). Target: data wait under 2% of step time.

    .venv/bin/python bench/bench_train.py --memory-phases [--repeat N] (+ the model flags above)

Where the peak RSS goes: `train launch`'s own phases (the functions trainer.launch calls, in order: imports,
the loader opened and its first batch, the session, the compile step, the later steps) and the bare
step's, each in its own process, this process's RSS (VmRSS, VmHWM) after each; the launch once more with
the loader in-process (data.num_workers=0).

    .venv/bin/python bench/bench_train.py --in-process [--pairs 8] (+ the model flags above)

Step time without the noise of separate processes: the bare step and `train launch`'s own step
(assemble.build_session's cell: grad norm, clipping, the skip test, bias-corrected AdamW; no loader, no
host bookkeeping) built in one process (both graphs at once: about twice one step's RSS), stepped in
pairs, the order swapped every pair; prints the median of the per-pair time ratios (the tokens/s
ratio) with its quartiles. Peak RSS ratios come from the default mode (one process per run): here the
second graph reuses memory the first one's build freed.

    .venv/bin/python bench/bench_train.py --document-mask on,off [--doc-length 64] [--repeat 2]

Packed documents: the same model trained on a dataset whose samples hold documents of about
`--doc-length` tokens (EOS at random), once with model.document_mask, model.reset_position_ids and
train.eod_mask_loss on and once with all three off, in the same run (--repeat N: N alternating pairs);
prints the step-time cost of the block-causal mask (target <= 5%) from the median step times. On a
shared machine two training runs one after the other see different loads, so it then also times
forward + backward of the loss of the two models in one process, alternating between them, best of `--mask-reps` each: the cost with the noise
of the machine mostly taken out. Last, for comparison, what building the same masks on the loader
side in numpy would cost per batch.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))


# the reference step has no packed-document masking: the launch it is compared with runs without it too
NO_DOCUMENT_MASK = ("model.document_mask=false", "model.reset_position_ids=false", "train.eod_mask_loss=false")


def numpy_peak(n: int = 1024, reps: int = 5) -> float:
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    a @ a
    best = min(_timed(lambda: a @ a) for _ in range(reps))
    return 2.0 * n ** 3 / best


def mindspore_peak(m: int, k: int, n: int, reps: int = 5) -> float:
    import mindspore as ms
    from mindspore import Tensor, nn, ops

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")

    class MatMul(nn.Cell):
        def __init__(self):
            super().__init__()
            self.mm = ops.MatMul()

        def construct(self, x, w):
            return self.mm(x, w)

    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((m, k), dtype=np.float32))
    w = Tensor(rng.standard_normal((k, n), dtype=np.float32))
    net = MatMul()
    net(x, w).asnumpy()
    best = min(_timed(lambda: net(x, w).asnumpy()) for _ in range(reps))
    return 2.0 * m * k * n / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def train_cmd(args, tmp: Path, mode: str, peak: float, extra: tuple = (),
              eos_rate: float = 0.0) -> tuple[list[str], Path]:
    """A real `train launch` on a fresh synthetic dataset in tmp (`eos_rate`: packed documents)."""
    from synthetic import make_dataset

    data = make_dataset(tmp / "data", num_train=args.batch * (args.steps + 2), num_valid=args.batch,
                        seq_length=args.seq, vocab_size=args.vocab, seed=0, max_shard_bytes=64 << 20,
                        eos_rate=eos_rate)
    sets = [f"data.path={data}", f"run.dir={tmp / 'run'}", f"model.hidden_size={args.hidden}",
            f"model.num_layers={args.layers}", f"model.num_heads={args.heads}", "model.num_kv_heads=0",
            f"model.ffn_size={args.ffn}", f"model.vocab_size={args.vocab}",
            f"train.steps={args.steps}", f"train.global_batch_size={args.batch}",
            f"data.num_workers={args.workers}", f"precision.dtype={args.dtype}",
            f"recompute.mode={mode}", f"train.peak_tflops={peak / 1e12}", "optim.clip_norm=1.0",
            f"checkpoint.every_steps={args.steps}", "eval.every_steps=0", f"log.every_steps={args.steps}",
            *extra]
    cmd = [sys.executable, "-m", "mspretrain.train", "launch", "--config", str(REPO / "configs" / "tiny.yaml"),
           "--set", *sets]
    return cmd, tmp / "run" / "metrics.jsonl"


def with_peak_rss(cmd: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """Run cmd under a wrapper process; returns (result, the largest descendant's peak RSS in bytes)."""
    wrapper = [sys.executable, __file__, "--rss-of", *cmd]
    proc = subprocess.run(wrapper, cwd=REPO, capture_output=True, text=True)
    rss = 0.0
    for line in proc.stdout.splitlines():
        if line.startswith("PEAK_RSS_KB "):
            rss = float(line.split()[1]) * 1024
    return proc, rss


def train_run(args, mode: str, peak: float, extra: tuple = (),
              eos_rate: float = 0.0) -> tuple[list[dict], float] | None:
    """One `train launch`: its step records after the first `skip`, and its peak RSS."""
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        cmd, metrics = train_cmd(args, Path(tmp), mode, peak, extra, eos_rate)
        proc, rss = with_peak_rss(cmd)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
            return None
        recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [r for r in recs if not r.get("eval")][args.skip:], rss


def reference_run(args, bare: bool = False) -> tuple[float, float] | None:
    """The hand-written step in its own process: (tokens/s after `skip` steps, peak RSS)."""
    cmd = [sys.executable, __file__, "--reference", *map(str, (args.hidden, args.layers, args.heads, args.ffn,
                                                               args.vocab, args.seq, args.batch, args.steps,
                                                               args.skip, int(bare)))]
    proc, rss = with_peak_rss(cmd)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
        return None
    tps = float([x for x in proc.stdout.splitlines() if x.startswith("TOKENS_PER_S ")][-1].split()[1])
    return tps, rss


def reference_step(hidden, layers, heads, ffn, vocab, seq, batch, steps, skip, bare=0) -> None:
    """nn.TrainOneStepCell + global-norm clipping + nn.AdamWeightDecay on models/llama/model.py's Llama;
    `bare`: the plain nn.TrainOneStepCell + AdamWeightDecay (no clipping, no norm), the held-out baseline."""
    import mindspore as ms
    from mindspore import Tensor, nn, ops

    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.llama.model import Llama, ModelArgs

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)

    class ClippedStep(nn.TrainOneStepCell):
        def construct(self, *inputs):
            loss = self.network(*inputs)
            sens = ops.fill(loss.dtype, loss.shape, self.sens)
            grads = self.grad(self.network, self.weights)(*inputs, sens)
            grads = ops.clip_by_global_norm(grads, 1.0)
            return ops.depend(loss, self.optimizer(grads))

    model = Llama(ModelArgs(vocab_size=vocab, seq_length=seq, hidden_size=hidden, num_layers=layers,
                            num_heads=heads, ffn_size=ffn), seed=0)
    net = CausalLMLoss(model, vocab)
    cell = nn.TrainOneStepCell if bare else ClippedStep
    step = cell(net, nn.AdamWeightDecay(net.trainable_params(), 1e-3, weight_decay=0.1))
    step.set_train(True)
    rng = np.random.default_rng(0)
    batches = [Tensor(rng.integers(0, vocab, (batch, seq + 1), dtype=np.int32)) for _ in range(steps)]
    times = []
    for b in batches:
        t = time.perf_counter()
        step(b).asnumpy()
        times.append(time.perf_counter() - t)
    print(f"TOKENS_PER_S {batch * seq * (steps - skip) / sum(times[skip:])}", flush=True)


def _rss_mb() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process, MiB: /proc/self/status VmRSS and VmHWM."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            key, value = line.split(":", 1)
            fields[key] = float(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


_last = [time.perf_counter()]


def _phase(name: str) -> None:
    now, hwm = _rss_mb()
    t = time.perf_counter()
    print(f"PHASE {name}|{now:.0f}|{hwm:.0f}|{t - _last[0]:.2f}", flush=True)
    _last[0] = t


def launch_phases(sets: list[str], steps: int) -> None:
    """`train launch`'s own phases in one process (the functions trainer.launch calls, in its order),
    with this process's RSS after each: imports, the loader opened and its first batch, the session
    (model, optimizer, step cell), the first step (compile), the later steps."""
    _phase("python + numpy")
    import mindspore as ms

    from mspretrain.train.parallel import distributed

    from mspretrain.train.parallel import plan as parallel_plan
    from mspretrain.train.config import load_config
    from mspretrain.train.data import TrainData
    from mspretrain.train.assemble import build_session
    _phase("imports (mindspore, mspretrain)")
    cfg = load_config(REPO / "configs" / "tiny.yaml", sets)
    dist = distributed.setup(cfg, parallel_plan.validate)
    ms.set_seed(cfg.seed)
    with TrainData(cfg, dist) as loader:
        batches = iter(loader)
        batch = next(batches)
        _phase("loader open + first batch")
        session = build_session(cfg, loader.vocab_size, loader.seq_length, dist, loader.tokenizer.eos_id)
        _phase("session (model, optimizer, step cell)")
        for i in range(steps):
            session.train_step(batch["input_ids"], 1e-4)
            _phase(f"step {i + 1}" + (" (compile)" if i == 0 else ""))
            batch = next(batches)


def bare_phases(hidden, layers, heads, ffn, vocab, seq, batch, steps) -> None:
    """The bare reference's phases (reference_step with bare=1), RSS after each."""
    _phase("python + numpy")
    import mindspore as ms
    from mindspore import Tensor, nn

    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.llama.model import Llama, ModelArgs
    _phase("imports (mindspore, mspretrain)")
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    batches = [Tensor(rng.integers(0, vocab, (batch, seq + 1), dtype=np.int32)) for _ in range(steps)]
    _phase("batches made (no loader)")
    model = Llama(ModelArgs(vocab_size=vocab, seq_length=seq, hidden_size=hidden, num_layers=layers,
                            num_heads=heads, ffn_size=ffn), seed=0)
    net = CausalLMLoss(model, vocab)
    step = nn.TrainOneStepCell(net, nn.AdamWeightDecay(net.trainable_params(), 1e-3, weight_decay=0.1))
    step.set_train(True)
    _phase("session (model, optimizer, step cell)")
    for i, b in enumerate(batches):
        step(b).asnumpy()
        _phase(f"step {i + 1}" + (" (compile)" if i == 0 else ""))


def memory_phases(args) -> int:
    """`--memory-phases`: where the peak RSS goes, launch against the bare step, phase by phase, each
    in its own process (alternating with --repeat); the launch once more with the loader in-process
    (data.num_workers=0) to show what the loader's worker saves or costs the trainer process."""
    import statistics

    def run(cmd):
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
            return None
        rows = [x[len("PHASE "):].split("|") for x in proc.stdout.splitlines() if x.startswith("PHASE ")]
        return [(name, float(now), float(hwm), float(secs)) for name, now, hwm, secs in rows]

    results: dict[str, list] = {"train launch": [], "train launch, optim.clip_norm=0": [], "bare step": [],
                                "train launch, data.num_workers=0": []}
    with tempfile.TemporaryDirectory(prefix="bench_mem_") as tmp:
        cmd, _ = train_cmd(args, Path(tmp), "none", 1e12, NO_DOCUMENT_MASK)
        sets = [x for x in cmd[cmd.index("--set") + 1:] if not x.startswith("run.dir=")]
        sets.append(f"run.dir={Path(tmp) / 'run'}")
        shape = [str(x) for x in (args.hidden, args.layers, args.heads, args.ffn, args.vocab, args.seq, args.batch,
                                  args.steps)]
        for _ in range(args.repeat):
            for name, argv in (("train launch", ["--launch-phases", str(args.steps), *sets]),
                               ("train launch, optim.clip_norm=0",
                                ["--launch-phases", str(args.steps), *sets, "optim.clip_norm=0"]),
                               ("bare step", ["--bare-phases", *shape]),
                               ("train launch, data.num_workers=0",
                                ["--launch-phases", str(args.steps), *sets, "data.num_workers=0"])):
                rows = run([sys.executable, __file__, *argv])
                if rows is None:
                    return 1
                results[name].append(rows)
    for name, runs in results.items():
        print(f"{name} ({len(runs)} run(s), medians): phase, RSS after it MiB, peak so far MiB, RSS added, "
              f"seconds")
        previous = 0.0
        for i, (phase, *_) in enumerate(runs[0]):
            now, hwm, secs = (statistics.median(r[i][k] for r in runs) for k in (1, 2, 3))
            print(f"  {phase:<40} {now:>7.0f} {hwm:>7.0f} {now - previous:>+7.0f} {secs:>8.2f}")
            previous = now
    return 0


def main() -> int:
    if sys.argv[1:2] == ["--observe-cost"]:          # docs/long-runs.md
        return observe_cost(sys.argv[2:])
    if sys.argv[1:2] == ["--launch-phases"]:
        launch_phases(sys.argv[3:], int(sys.argv[2]))
        return 0
    if sys.argv[1:2] == ["--bare-phases"]:
        bare_phases(*map(int, sys.argv[2:10]))
        return 0
    if sys.argv[1:2] == ["--checkpoint-cost"]:       # docs/recipes.md (checkpoint.async)
        return checkpoint_cost(sys.argv[2:])
    if sys.argv[1:2] == ["--mindspore-peak"]:
        print(mindspore_peak(*map(int, sys.argv[2:5])))
        return 0
    if sys.argv[1:2] == ["--reference"]:
        reference_step(*map(int, sys.argv[2:12]))
        return 0
    if sys.argv[1:2] == ["--rss-of"]:
        import resource
        rc = subprocess.run(sys.argv[2:], cwd=REPO).returncode
        print(f"PEAK_RSS_KB {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}", flush=True)
        return rc
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--ffn", type=int, default=0, help="MLP width (0: the Llama rule)")
    ap.add_argument("--repeat", type=int, default=1, help="alternating launch / reference pairs")
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2, help="first steps left out (compile)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--recompute", default="none",
                    help="recompute.mode per run, comma-separated: none | full | none,full")
    ap.add_argument("--document-mask", default="",
                    help="on | off | on,off: packed-document masking per run (replaces the recompute runs)")
    ap.add_argument("--doc-length", type=int, default=64, help="mean document length with --document-mask")
    ap.add_argument("--mask-reps", type=int, default=5, help="alternating in-process timings per variant")
    ap.add_argument("--in-process", action="store_true",
                    help="bare step and launch step in one process, stepped alternately (--pairs)")
    ap.add_argument("--pairs", type=int, default=8, help="step pairs with --in-process")
    ap.add_argument("--memory-phases", action="store_true",
                    help="RSS phase by phase: train launch (loader in a worker, and in-process) vs the bare step")
    args = ap.parse_args()
    if args.hidden < 512:
        print("note: the reference comparison is meant for d_model >= 512", file=sys.stderr)

    ffn = args.ffn or 64 * math.ceil(8 * args.hidden / 3 / 64)
    args.ffn = ffn
    peak_np = numpy_peak()
    # in a child process: MindSpore's thread pool in this process would compete with the training runs
    shape = [str(args.batch * args.seq), str(args.hidden), str(ffn)]
    peak_ms = float(subprocess.run([sys.executable, __file__, "--mindspore-peak", *shape], cwd=REPO,
                                   capture_output=True, text=True, check=True).stdout.split()[-1])
    peak = max(peak_np, peak_ms)
    print(f"peak fp32 matmul: numpy sgemm 1024^3 {peak_np / 1e9:.1f} GFLOP/s, MindSpore MatMul "
          f"[{args.batch * args.seq}x{args.hidden}]x[{args.hidden}x{ffn}] {peak_ms / 1e9:.1f} GFLOP/s "
          f"-> peak {peak / 1e9:.1f} GFLOP/s")

    print(f"model: d_model {args.hidden}, {args.layers} layers, {args.heads} heads, ffn {ffn}, vocab "
          f"{args.vocab}, seq {args.seq}, batch {args.batch}, {args.dtype}, {args.workers} loader worker(s)")
    if args.document_mask:
        return document_mask_runs(args, peak)
    if args.memory_phases:
        return memory_phases(args)
    if args.in_process:
        return in_process_steps(args)
    ms_per_step = {}
    launch_tps, ref_tps, launch_rss, ref_rss, bare_tps, bare_rss = [], [], [], [], [], []
    for mode in args.recompute.split(","):
        for _ in range(args.repeat if mode == "none" else 1):
            out = train_run(args, mode, peak, NO_DOCUMENT_MASK)
            if out is None:
                return 1
            recs, rss = out
            step_time = sum(r["step_time_s"] for r in recs)
            wait = sum(r["data_wait_s"] for r in recs)
            tps = args.batch * args.seq * len(recs) / step_time
            mfu = tps * recs[0]["mfu"] / recs[0]["tokens_per_s"]     # the trainer's flops/token over the peak
            ms_per_step[mode] = step_time / len(recs) * 1000
            print(f"train launch, recompute {mode}: steps {args.skip + 1}-{args.steps}: {ms_per_step[mode]:.0f} "
                  f"ms/step, {tps:,.0f} tokens/s, MFU {mfu * 100:.1f}% of the measured peak, peak RSS "
                  f"{rss / 1e9:.2f} GB; data wait {wait / step_time * 100:.2f}% of step time "
                  f"({wait / len(recs) * 1000:.2f} ms/step; target < 2%: "
                  f"{'met' if wait / step_time < 0.02 else 'NOT met'})", flush=True)
            if mode != "none" or args.dtype != "fp32":
                continue
            launch_tps.append(tps)
            launch_rss.append(rss)
            ref = reference_run(args)
            if ref is None:
                return 1
            ref_tps.append(ref[0])
            ref_rss.append(ref[1])
            bare = reference_run(args, bare=True)
            if bare is None:
                return 1
            bare_tps.append(bare[0])
            bare_rss.append(bare[1])
            print(f"bare nn.TrainOneStepCell + AdamWeightDecay (no clipping, no norm): {bare[0]:,.0f} tokens/s, "
                  f"peak RSS {bare[1] / 1e9:.2f} GB", flush=True)
            print(f"hand-written TrainOneStepCell + clip_by_global_norm + AdamWeightDecay: {ref[0]:,.0f} tokens/s, "
                  f"peak RSS {ref[1] / 1e9:.2f} GB", flush=True)
    if ref_tps:
        speed = sum(launch_tps) / sum(ref_tps)
        memory = sum(launch_rss) / sum(ref_rss)
        print(f"train launch / reference: tokens/s {speed:.2f}x (target >= 0.95: "
              f"{'met' if speed >= 0.95 else 'NOT met'}), peak RSS {memory:.2f}x (target <= 1.1: "
              f"{'met' if memory <= 1.1 else 'NOT met'}) over {len(ref_tps)} pair(s)")
        speed, memory = sum(launch_tps) / sum(bare_tps), sum(launch_rss) / sum(bare_rss)
        print(f"train launch / bare step: tokens/s {speed:.2f}x (target >= 0.95: "
              f"{'met' if speed >= 0.95 else 'NOT met'}), peak RSS {memory:.2f}x (target <= 1.1: "
              f"{'met' if memory <= 1.1 else 'NOT met'}); the launch also computes and logs the grad norm")
    if "none" in ms_per_step and "full" in ms_per_step:
        print(f"recompute full / none step time: {ms_per_step['full'] / ms_per_step['none']:.2f}x "
              f"(the forward runs again in backward)")
    return 0


def in_process_steps(args) -> int:
    """`--in-process`: the bare step against `train launch`'s step, in one process, alternating."""
    import os

    import mindspore as ms
    from mindspore import Tensor, nn

    from mspretrain.train.parallel import distributed

    from mspretrain.train.parallel import plan as parallel_plan
    from mspretrain.train.config import load_config
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.llama.model import Llama, ModelArgs
    from mspretrain.train.assemble import build_session

    load0 = os.getloadavg()
    sets = [f"model.hidden_size={args.hidden}", f"model.num_layers={args.layers}", f"model.num_heads={args.heads}",
            "model.num_kv_heads=0", f"model.ffn_size={args.ffn}", f"model.vocab_size={args.vocab}",
            f"train.global_batch_size={args.batch}", f"precision.dtype={args.dtype}", "optim.clip_norm=1.0",
            *NO_DOCUMENT_MASK]
    cfg = load_config(REPO / "configs" / "tiny.yaml", sets)
    dist = distributed.setup(cfg, parallel_plan.validate)        # GRAPH_MODE on CPU, one process
    ms.set_seed(0)
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, args.vocab, (args.batch, args.seq + 1), dtype=np.int32) for _ in range(3)]

    def bare_step():
        model = Llama(ModelArgs(vocab_size=args.vocab, seq_length=args.seq, hidden_size=args.hidden,
                                num_layers=args.layers, num_heads=args.heads, ffn_size=args.ffn), seed=0)
        net = CausalLMLoss(model, args.vocab)
        cell = nn.TrainOneStepCell(net, nn.AdamWeightDecay(net.trainable_params(), 1e-3, weight_decay=0.1))
        cell.set_train(True)
        return lambda b: cell(Tensor(b)).asnumpy()

    def launch_step():
        session = build_session(cfg, args.vocab, args.seq, dist)
        return lambda b: session.train_step(b, 1e-4)

    steps, added = {}, {}
    for name, build in (("bare", bare_step), ("launch", launch_step)):
        before = _rss_mb()[0]
        steps[name] = build()
        steps[name](batches[0])                 # compile
        steps[name](batches[1])
        added[name] = _rss_mb()[0] - before
    times = {"bare": [], "launch": []}
    ratios = []
    for i in range(args.pairs):
        got = {}
        for name in (("launch", "bare") if i % 2 == 0 else ("bare", "launch")):
            got[name] = _timed(lambda: steps[name](batches[i % len(batches)]))
            times[name].append(got[name])
        ratios.append(got["bare"] / got["launch"])
    q1, med, q3 = _quartiles(ratios)
    load1 = os.getloadavg()
    print(f"one process, {args.pairs} alternating step pairs, load average {load0[0]:.2f} at the start, "
          f"{load1[0]:.2f} at the end ({os.cpu_count()} CPUs)")
    print(f"  median step: bare {np.median(times['bare']) * 1000:.0f} ms, "
          f"launch {np.median(times['launch']) * 1000:.0f} ms")
    print(f"train launch step / bare step: tokens/s {med:.3f}x (median of per-pair ratios; quartiles {q1:.3f}.."
          f"{q3:.3f}; target >= 0.95: {'met' if med >= 0.95 else 'NOT met'})")
    print(f"  RSS added by building and compiling each graph, bare first: bare {added['bare']:.0f} MiB, launch "
          f"{added['launch']:.0f} MiB (the second reuses memory the first freed: peak RSS ratios come from the "
          f"default mode, one process per run)")
    return 0


def alternating_grad_times(args, eos_rate: float) -> dict[str, float]:
    """Best time of one forward + backward of the loss, with the three features on and off, timed in turn."""
    import mindspore as ms
    from mindspore import Tensor, nn, ops
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.llama.model import Llama, ModelArgs

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")

    class Grad(nn.Cell):
        def __init__(self, net):
            super().__init__()
            self.net, self.weights = net, net.trainable_params()
            self.grad = ops.GradOperation(get_by_list=True)

        def construct(self, x):
            return self.grad(self.net, self.weights)(x)

    base = dict(vocab_size=args.vocab, seq_length=args.seq, hidden_size=args.hidden, num_layers=args.layers,
                num_heads=args.heads, eos_id=2)
    on = ModelArgs(**base, document_mask=True, reset_position_ids=True)
    nets = {"on": Grad(CausalLMLoss(Llama(on, 1), args.vocab, 2)),
            "off": Grad(CausalLMLoss(Llama(ModelArgs(**base), 1), args.vocab))}
    rng = np.random.default_rng(1)
    ids = rng.integers(3, args.vocab, size=(args.batch, args.seq + 1)).astype(np.int32)
    ids[rng.random(ids.shape) < eos_rate] = 2
    ids = Tensor(ids)
    for net in nets.values():
        net(ids)                                # compile
    best = {k: math.inf for k in nets}
    for _ in range(args.mask_reps):
        for k, net in nets.items():
            best[k] = min(best[k], _timed(lambda: net(ids)[0].asnumpy()))
    return best


def document_mask_runs(args, peak: float) -> int:
    """Step time with the three packed-document features on and off, on the same packed dataset."""
    from mspretrain.train import packing

    mode = args.recompute.split(",")[0]
    eos_rate = 1.0 / args.doc_length
    flags = args.document_mask.split(",")
    for flag in flags:
        if flag not in ("on", "off"):
            print(f"--document-mask: {flag!r} is not on or off", file=sys.stderr)
            return 2
    step_times = {flag: [] for flag in flags}
    for _ in range(args.repeat):            # on, off, on, off, ...: both see the same drift in load
        for flag in flags:
            value = "true" if flag == "on" else "false"
            extra = (f"model.document_mask={value}", f"model.reset_position_ids={value}",
                     f"train.eod_mask_loss={value}")
            out = train_run(args, mode, peak, extra, eos_rate)
            if out is None:
                return 1
            recs = out[0]
            step_times[flag] += [r["step_time_s"] for r in recs]
            step_time = sum(r["step_time_s"] for r in recs)
            tps = args.batch * args.seq * len(recs) / step_time
            print(f"document mask {flag}: steps {args.skip + 1}-{args.steps}: median "
                  f"{np.median([r['step_time_s'] for r in recs]) * 1000:.0f} ms/step, {tps:,.0f} tokens/s "
                  f"(documents of ~{args.doc_length} tokens, recompute {mode})", flush=True)
    ms_per_step = {flag: float(np.median(times)) * 1000 for flag, times in step_times.items()}
    if "on" in ms_per_step and "off" in ms_per_step:
        cost = ms_per_step["on"] / ms_per_step["off"] - 1
        print(f"document mask on / off median step time, {args.repeat} alternating pair(s) of runs: "
              f"{1 + cost:.3f}x ({cost * 100:+.1f}%; target <= 5%: {'met' if cost <= 0.05 else 'NOT met'})")
        best = alternating_grad_times(args, eos_rate)
        cost = best["on"] / best["off"] - 1
        print(f"forward + backward, one process, alternating, best of {args.mask_reps}: "
              f"on {best['on'] * 1000:.0f} ms, off {best['off'] * 1000:.0f} ms: {1 + cost:.3f}x ({cost * 100:+.1f}%; target <= 5%: "
              f"{'met' if cost <= 0.05 else 'NOT met'})")
    # the alternative: masks built by the loader in numpy and fed to the graph as an input
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, args.vocab, size=(args.batch, args.seq)).astype(np.int32)
    tokens[rng.random(tokens.shape) < eos_rate] = 2
    reps = 20
    t = time.perf_counter()
    for _ in range(reps):
        packing.block_causal_mask(tokens, 2)
        packing.positions(tokens, 2)
    per_batch = (time.perf_counter() - t) / reps
    print(f"loader-side alternative: numpy mask + positions {per_batch * 1000:.2f} ms/batch and "
          f"{args.batch * args.seq * args.seq / 1e6:.1f} MB of bool mask per batch to copy into the graph "
          f"(the trainer computes both inside the graph instead)")
    return 0


def observe_cost(argv) -> int:
    """`bench_train.py --observe-cost [--pairs 4 --steps 5] [--in-process]`: what z-loss, the spike
    thresholds and the memory reading cost per step on the 33.9M bench model (by default): "on" with
    train.z_loss=1e-4, armed spike limits from a full window, the peak-memory read and the guard's
    bookkeeping, "off" with none of them (the graph's two threshold comparisons are in both: they are
    always compiled in). The figure is the median of per-pair on/off ratios, with its spread.

    Default: process pairs, the order swapped every pair (on-off, off-on, ...), each process one
    variant: compile, then `--steps` timed steps (its median is the process's figure); one variant's
    graph at a time (~7 GB RSS here). `--in-process`: both variants in one process, stepped in pairs
    (finer: a load change falls on both sides of a pair alike; needs both graphs at once, ~14 GB).
    The host-side parts are also timed alone, many times (microseconds against steps of seconds).
    `--profile-after`: the same pairs again after a closed two-step profiler window (in-process only):
    whether the steps after a window are slower than before it. Target <= 2%."""
    ap = argparse.ArgumentParser(prog="bench_train.py --observe-cost")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--ffn", type=int, default=1408)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=4, help="on/off pairs")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per process (process pairs)")
    ap.add_argument("--in-process", action="store_true", help="both variants in one process")
    ap.add_argument("--profile-after", action="store_true", help="with --in-process: pairs after a window")
    ap.add_argument("--child", choices=("on", "off"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    import os

    if args.child:
        return _observe_child(args)
    load0 = os.getloadavg()
    print(f"model: --hidden {args.hidden} --layers {args.layers} --vocab {args.vocab} --ffn {args.ffn}, "
          f"batch {args.batch} x seq {args.seq}, "
          f"{args.pairs} on/off pairs ({'in one process' if args.in_process else 'of processes'}), order "
          f"swapped every pair; {os.cpu_count()} CPUs, load average {load0[0]:.2f} {load0[1]:.2f} "
          f"{load0[2]:.2f} at the start")
    if args.in_process:
        _observe_in_process(args)
    else:
        ratios, times = [], {"off": [], "on": []}
        for i in range(args.pairs):
            got = {}
            for name in (("on", "off") if i % 2 == 0 else ("off", "on")):
                cmd = [sys.executable, __file__, "--observe-cost", "--child", name, *argv]
                out = subprocess.run(cmd, capture_output=True, text=True)
                if out.returncode:
                    raise SystemExit(f"--child {name} failed (rc {out.returncode}): {out.stderr[-2000:]}")
                if i == 0 and name == "on":
                    print("".join(x for x in out.stderr.splitlines(True) if "M parameters" in x), end="")
                got[name] = json.loads(out.stdout.strip().splitlines()[-1])
                times[name] += got[name]
            ratios.append(float(np.median(got["on"]) / np.median(got["off"])))
            off, on = np.median(got["off"]) * 1000, np.median(got["on"]) * 1000
            print(f"  pair {i + 1}: off {off:.0f} ms, on {on:.0f} ms (median of {args.steps} steps each) -> "
                  f"{(ratios[-1] - 1) * 100:+.2f}%", flush=True)
        _report_ratios("z-loss + spike limits + memory reading (on/off)", ratios, times)
    load1 = os.getloadavg()
    print(f"load average {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f} at the end ({os.cpu_count()} CPUs: above "
          f"that the timed steps share the CPUs with other work)")
    return 0


def _variant(args, name: str):
    """(train step, spike guard, batch) of variant `name` ("on": z-loss 1e-4 and an armed guard)."""
    import mindspore as ms

    from mspretrain.train.observe import spike
    from mspretrain.train.config import load_config
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.models.flops import count_params
    from mspretrain.train.models.llama.model import Llama, ModelArgs
    from mspretrain.train.step.optim import build_optimizer
    from mspretrain.train.step.cell import build_train_step

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    margs = ModelArgs(vocab_size=args.vocab, seq_length=args.seq, hidden_size=args.hidden,
                      num_layers=args.layers, num_heads=args.heads, ffn_size=args.ffn)
    z = 1e-4 if name == "on" else 0.0
    cfg = load_config(None, [f"train.z_loss={z}", "train.spike.warmup=0", "train.spike.window=10"])
    model = Llama(margs, seed=0)
    if name == "on":
        print(f"  ({count_params(model) / 1e6:.1f}M parameters)", file=sys.stderr, flush=True)
    net = CausalLMLoss(model, args.vocab, z_loss=z)
    step = build_train_step(net, build_optimizer(net.trainable_params(), cfg.optim), 1, cfg)
    guard = spike.SpikeGuard(cfg)
    guard.window.extend((10.0 + i, 5.0 + i) for i in range(10))    # thresholds far above any step
    batch = np.random.default_rng(0).integers(0, args.vocab, (args.batch, args.seq + 1), dtype=np.int32)
    return step, guard, batch


def _timed_step(name: str, step, guard, batch, n: int) -> float:
    """One step of variant `name` (the "on" host work included), seconds."""
    from mspretrain.train.observe import monitor as observe

    t = time.perf_counter()
    if name == "on":
        limits = guard.arm(step, n)
        result = step(batch, 1e-4)
        observe.peak_memory_mb("CPU")
        guard.observe(n, result, limits, 0)
    else:
        step(batch, 1e-4)
    return time.perf_counter() - t


def _observe_child(args) -> int:
    step, guard, batch = _variant(args, args.child)
    _timed_step(args.child, step, guard, batch, 1)          # compiles
    times = [_timed_step(args.child, step, guard, batch, i + 2) for i in range(args.steps)]
    print(json.dumps(times))
    return 0


def _observe_in_process(args) -> None:
    from mspretrain.train.observe import monitor as observe

    variants = {name: _variant(args, name) for name in ("off", "on")}
    count = [0]

    def one(name: str) -> float:
        count[0] += 1
        return _timed_step(name, *variants[name], count[0])

    def pairs(n: int) -> tuple[list[float], dict]:
        ratios, times = [], {"off": [], "on": []}
        for i in range(n):
            got = {name: one(name) for name in (("on", "off") if i % 2 == 0 else ("off", "on"))}
            for name in got:
                times[name].append(got[name])
            ratios.append(got["on"] / got["off"])
        return ratios, times

    one("off"), one("on")           # compile both graphs
    ratios, times = pairs(args.pairs)
    _report_ratios("z-loss + spike limits + memory reading (on/off)", ratios, times)
    step, guard, _ = variants["on"]
    _host_parts(guard, step, observe)
    if args.profile_after:
        _profile_after_window(variants["off"][0], variants["off"][2], times, pairs, args.pairs)


def _quartiles(xs: list[float]) -> tuple[float, float, float]:
    q1, med, q3 = np.percentile(xs, [25, 50, 75])
    return float(q1), float(med), float(q3)


def _report_ratios(what: str, ratios: list[float], times: dict) -> None:
    q1, med, q3 = _quartiles(ratios)
    print(f"{what}: median ratio {med:.4f} -> cost {(med - 1) * 100:+.2f}% (target <= +2%); quartiles "
          f"{(q1 - 1) * 100:+.2f}%..{(q3 - 1) * 100:+.2f}%, min..max {(min(ratios) - 1) * 100:+.2f}%.."
          f"{(max(ratios) - 1) * 100:+.2f}% over {len(ratios)} pairs")
    print(f"  median step: off {np.median(times['off']) * 1000:.1f} ms, on {np.median(times['on']) * 1000:.1f} ms")


def _host_parts(guard, step, observe, reps: int = 2000) -> None:
    """The host-side parts of "on", each timed alone: what they add to every step (their sum is the
    floor of the ratio above; z-loss and the graph's comparisons are inside the step graph)."""
    from mspretrain.train.step.cell import StepResult

    result = StepResult(loss=3.0, overflow=False, grad_norm=1.0, loss_scale=1.0)
    parts = {"peak_memory_mb (VmHWM read)": lambda: observe.peak_memory_mb("CPU"),
             "spike thresholds (window mean/std)": lambda: guard.limits(50),
             "set_spike_limits (host -> Parameter)": lambda: step.set_spike_limits(10.0, 5.0),
             "guard.observe (window append)": lambda: guard.observe(50, result, (10.0, 5.0), 0)}
    for name, fn in parts.items():
        fn()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        print(f"  host part: {name}: {(time.perf_counter() - t) / reps * 1e6:.1f} us per step")


def _profile_after_window(step, batch, before_times, pairs, n: int) -> None:
    """A mindspore.profiler window over two steps of "off", closed; then the same pairs again. The
    trainer touches nothing of the profiler outside its window (ProfileWindow.before/after: an int
    compare, an `is None` test), so a cost here would be one the profiler leaves behind."""
    import shutil

    from mindspore.profiler import ProfilerActivity, profile, tensorboard_trace_handler

    out = Path(tempfile.mkdtemp(prefix="observe-cost-profile-"))
    try:
        prof = profile(activities=[ProfilerActivity.CPU], start_profile=False,
                       on_trace_ready=tensorboard_trace_handler(str(out)))
        prof.start()
        step(batch, 1e-4)
        prof.step()
        step(batch, 1e-4)
        prof.stop()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    _, after = pairs(n)
    before_off, after_off = np.median(before_times["off"]), np.median(after["off"])
    before_on, after_on = np.median(before_times["on"]), np.median(after["on"])
    print(f"after a closed profiler window: median step off {before_off * 1000:.1f} -> {after_off * 1000:.1f} ms "
          f"({(after_off / before_off - 1) * 100:+.2f}%), on {before_on * 1000:.1f} -> {after_on * 1000:.1f} ms "
          f"({(after_on / before_on - 1) * 100:+.2f}%) (before vs after in time: the machine's load drift "
          f"is in this figure)")


def checkpoint_cost(argv) -> int:
    """`bench_train.py --checkpoint-cost [--repeat 1]`: what a checkpoint costs the training loop.

    Real `train launch` runs of the same model (hidden 512, 4 layers, vocab 8000: a 241 MB model.ckpt
    with the AdamW moments; batch 4 x seq 256) with a checkpoint
    every 10 steps, synchronous (`sync`) and with checkpoint.async (`async`), alternating (--repeat N
    pairs). From each run's metrics.jsonl wall-clock times: the interval that holds a checkpoint (from
    a checkpoint step's record to the next step's: the save, then that step) against the median
    interval of the steps after the background write (`normal`: no save, and the write of the previous
    checkpoint, paced over a `BackgroundWriter.share` of the interval, done), and each checkpoint
    interval against the median of the normal steps just before and after it (the load of a shared
    machine drifts over a run). Each interval is also split into the step itself (`step_time_s`: data
    and train_step, where a background write competes for the CPU) and the rest (the save on the
    training thread), and a checkpoint's whole cost is summed over the steps of its write.
    Target: async checkpoint interval within 10% of a normal one. The async host
    snapshot's memory is faulted in before the first step (every checkpoint reuses it). Also printed: the load average, and the median interval of the steps
    right after a checkpoint (where a background write shares the CPU with training)."""
    import os
    import statistics
    from datetime import datetime

    from mspretrain.train.checkpoint import BackgroundWriter

    ap = argparse.ArgumentParser(prog="bench_train.py --checkpoint-cost")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--ffn", type=int, default=1408)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=41, help="steps per run (checkpoints at 10, 20, ...)")
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=1, help="alternating sync / async pairs")
    args = ap.parse_args(argv)
    args.workers, args.dtype = 1, "fp32"
    found: dict[str, dict[str, list[float]]] = {
        m: {f"{k}{part}": [] for k in ("ckpt", "after", "during", "normal") for part in ("", "_step", "_rest")}
        | {"local": [], "total": []} for m in ("sync", "async")}
    sizes = []
    # the steps of a write: `share` of the interval (the steps after it are the normal ones)
    half = min(args.every - 2, math.ceil(args.every * BackgroundWriter().share))
    for _ in range(args.repeat):
        for mode in ("sync", "async"):
            extra = (f"checkpoint.every_steps={args.every}", f"checkpoint.async={mode == 'async'}",
                     "checkpoint.keep_max=2", "log.every_steps=1000")
            with tempfile.TemporaryDirectory(prefix="bench_ckpt_") as tmp:
                cmd, metrics = train_cmd(args, Path(tmp), "none", 1e12, extra)
                proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
                if proc.returncode != 0:
                    print(f"{mode} run failed (exit {proc.returncode})", proc.stdout[-3000:], proc.stderr[-3000:],
                          file=sys.stderr)
                    return 1
                recs = [json.loads(line) for line in metrics.read_text().splitlines()]
                ckpts = sorted((Path(tmp) / "run" / "checkpoints").glob("step_*/model.ckpt"))
                sizes.append(ckpts[-1].stat().st_size)
            at = {r["step"]: datetime.fromisoformat(r["time"]).timestamp() for r in recs if not r.get("eval")}
            inner = {r["step"]: r["step_time_s"] for r in recs if not r.get("eval")}
            gap = {step: at[step] - at[step - 1] for step in range(3, args.steps + 1)}   # the first compile
            for step, g in gap.items():
                since = (step - 1) % args.every
                kind = ("ckpt" if since == 0 else "after" if since == 1 else "during" if since <= half
                        else "normal")
                found[mode][kind].append(g)
                # the interval's parts: the step itself (data + train_step, where a background write
                # competes for the CPU) and the rest (the save on the training thread, metrics)
                found[mode][kind + "_step"].append(inner[step])
                found[mode][kind + "_rest"].append(g - inner[step])
                if kind == "ckpt":      # against the normal steps around it: the machine's load drifts
                    near = [gap[s] for s in range(step - 2 * args.every, step + 2 * args.every)
                            if s in gap and (s - 1) % args.every > half]
                    ref = statistics.median(near)
                    found[mode]["local"].append(g / ref)
                    window = [gap[s] for s in range(step, step + half + 1) if s in gap]
                    if len(window) == half + 1:     # the whole checkpoint's cost, however it is spread
                        found[mode]["total"].append(sum(window) - len(window) * ref)
    load = os.getloadavg()
    print(f"model.ckpt {sizes[-1] / 2**20:.0f} MB, checkpoint every {args.every} steps, {args.repeat} "
          f"alternating pair(s); load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on "
          f"{os.cpu_count()} CPUs")
    for mode, kinds in found.items():
        med = {k: statistics.median(v) for k, v in kinds.items()}
        print(f"{mode:5s}: normal step {med['normal'] * 1000:.0f} ms, checkpoint step "
              f"{med['ckpt'] * 1000:.0f} ms ({(med['ckpt'] / med['normal'] - 1) * 100:+.1f}%), the step after "
              f"{med['after'] * 1000:.0f} ms ({(med['after'] / med['normal'] - 1) * 100:+.1f}%); each checkpoint "
              f"step against the normal steps around it: {[f'{(x - 1) * 100:+.0f}%' for x in kinds['local']]} "
              f"(median {(med['local'] - 1) * 100:+.1f}%; target async <= +10%)")
        print(f"       of which outside the step (the save on the training thread): normal "
              f"{med['normal_rest'] * 1000:.0f} ms, checkpoint {med['ckpt_rest'] * 1000:.0f} ms; the step "
              f"itself (data + train_step): normal {med['normal_step'] * 1000:.0f} ms, checkpoint "
              f"{med['ckpt_step'] * 1000:.0f} ms, the step after {med['after_step'] * 1000:.0f} ms")
        print(f"       steps 2-{half} after a checkpoint {med['during'] * 1000:.0f} ms; a checkpoint's "
              f"whole cost (its interval and the next {half}, less as many normal ones): "
              f"{med['total'] * 1000:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
