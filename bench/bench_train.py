"""Trainer throughput on CPU: tokens/s, MFU and the share of step time spent waiting for data.

    .venv/bin/python bench/bench_train.py [--hidden 512 --layers 4 --seq 256 --batch 4 --steps 12]

MFU's peak is this machine's fp32 matmul rate, measured here in the same run: the faster of a numpy
sgemm (1024^3) and a MindSpore GRAPH_MODE MatMul of the model's largest projection shape
([batch*seq, hidden] x [hidden, ffn]). The training itself is the real `python -m train launch` on a
real MindRecord dataset with the real loader (worker processes, prefetch); the figures come from its
metrics.jsonl, skipping the first steps (graph compile). Target: data wait under 2% of step time.
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


def train_run(args, mode: str, peak: float) -> list[dict] | None:
    """One real `train launch` on a fresh synthetic dataset; its step records after the first `skip`."""
    from synthetic import make_dataset

    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        tmp = Path(tmp)
        data = make_dataset(tmp / "data", num_train=args.batch * (args.steps + 2), num_valid=args.batch,
                            seq_length=args.seq, vocab_size=args.vocab, seed=0, max_shard_bytes=64 << 20)
        sets = [f"data.path={data}", f"run.dir={tmp / 'run'}", f"model.hidden_size={args.hidden}",
                f"model.num_layers={args.layers}", f"model.num_heads={args.heads}", "model.num_kv_heads=0",
                f"train.steps={args.steps}", f"train.global_batch_size={args.batch}",
                f"data.num_workers={args.workers}", f"precision.dtype={args.dtype}",
                f"recompute.mode={mode}", f"train.peak_tflops={peak / 1e12}",
                f"checkpoint.every_steps={args.steps}", "eval.every_steps=0", f"log.every_steps={args.steps}"]
        cmd = [sys.executable, "-m", "train", "launch", "--config", str(REPO / "configs" / "tiny.yaml"),
               "--set", *sets]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:], file=sys.stderr)
            return None
        recs = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in recs if not r.get("eval")][args.skip:]


def main() -> int:
    if sys.argv[1:2] == ["--mindspore-peak"]:
        print(mindspore_peak(*map(int, sys.argv[2:5])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2, help="first steps left out (compile)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--dtype", default="fp32")
    ap.add_argument("--recompute", default="none",
                    help="recompute.mode per run, comma-separated: none | full | none,full")
    args = ap.parse_args()
    if args.hidden < 512:
        print("note: the reference comparison is meant for d_model >= 512", file=sys.stderr)

    ffn = 64 * math.ceil(8 * args.hidden / 3 / 64)
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
    ms_per_step = {}
    for mode in args.recompute.split(","):
        recs = train_run(args, mode, peak)
        if recs is None:
            return 1
        step_time = sum(r["step_time_s"] for r in recs)
        wait = sum(r["data_wait_s"] for r in recs)
        tps = args.batch * args.seq * len(recs) / step_time
        mfu = tps * recs[0]["mfu"] / recs[0]["tokens_per_s"]     # the trainer's flops/token over the peak
        ms_per_step[mode] = step_time / len(recs) * 1000
        print(f"recompute {mode}: steps {args.skip + 1}-{args.steps}: {ms_per_step[mode]:.0f} ms/step, "
              f"{tps:,.0f} tokens/s, MFU {mfu * 100:.1f}% of the measured peak; data wait "
              f"{wait / step_time * 100:.2f}% of step time ({wait / len(recs) * 1000:.2f} ms/step; "
              f"target < 2%: {'met' if wait / step_time < 0.02 else 'NOT met'})")
    if "none" in ms_per_step and "full" in ms_per_step:
        print(f"recompute full / none step time: {ms_per_step['full'] / ms_per_step['none']:.2f}x "
              f"(the forward runs again in backward)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
