"""What a background checkpoint write costs the training steps beside it, in one process.

    python bench/bench_checkpoint_beside_step.py [--reps 5] [--mb 241] [--batch 1024]

A MindSpore GRAPH_MODE train step (4 dense 1024x1024 layers, AdamW; CPU kernels on MindSpore's thread
pool, as the trainer's) runs in a loop; at a step boundary a model-file write of --mb MB (the bench
model's 241 MB by default) starts on a background thread, in these ways, alternating:
  plain       checkpoint.write_model_file unpaced, at the process's priority (the writer before);
  paced       the snapshot (checkpoint.ModelImage) written paced over 5 step times (checkpoint.Pacer),
              in 8 MiB pieces past the page cache (O_DIRECT);
  paced+nice  paced, and the thread WRITER_NICE nice levels lower (the writer where SCHED_IDLE cannot
              be undone: an unprivileged process);
  paced+idle  paced, the thread in SCHED_IDLE (checkpoint._lower_priority where it may: the writer now);
  idle        unpaced, in SCHED_IDLE.
Per write: the first step's excess over the median of the 3 steps before it, and the excess of the 6
steps from the write's start summed (the write's whole cost to training). Medians over --reps. The
steps are compared with their neighbours in the same process, so a shared machine's drifting load
moves both sides alike; the load average is printed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MODES = ("plain", "paced", "paced+nice", "paced+idle", "idle")


def train_step(batch: int, python_s: float = 0.0):
    import mindspore as ms
    from mindspore import Tensor, nn

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.layers = nn.SequentialCell([nn.Dense(1024, 1024) for _ in range(4)])

        def construct(self, x):
            return self.layers(x).sum()

    net = Net()
    step = nn.TrainOneStepCell(net, nn.AdamWeightDecay(net.trainable_params(), 1e-3))
    x = Tensor(np.random.default_rng(0).standard_normal((batch, 1024)).astype(np.float32))

    def one() -> float:
        t = time.perf_counter()
        step(x).asnumpy()
        t1 = time.perf_counter()
        while time.perf_counter() - t1 < python_s:     # the training loop's own Python work (the GIL held)
            pass
        return time.perf_counter() - t
    for _ in range(3):      # compile
        one()
    return one


def tensors(mb: int) -> list:
    """About the bench model's tensors: an embedding and its moments, then many smaller ones."""
    from mspretrain.train.checkpoint import HostTensor

    sizes = [8000 * 512] * 3 + [512 * 1408] * 36 + [512 * 512] * 48 + [512] * 30
    scale = mb * 2**20 / 4 / sum(sizes)
    rng = np.random.default_rng(0)
    return [HostTensor(f"t{i}", [int(n * scale)], "Float32", rng.standard_normal(int(n * scale)).astype(np.float32))
            for i, n in enumerate(sizes)]


def one_write(mode: str, one, state: list, image, where: str) -> tuple[float, float, float, float]:
    from mspretrain.train import checkpoint as ckpt

    ref = statistics.median(one() for _ in range(3))
    hurry, took = threading.Event(), []
    pace = ckpt.Pacer(5 * ref, hurry) if mode.startswith("paced") else None
    with tempfile.TemporaryDirectory(dir=where) as d:
        def write():
            tid = threading.get_native_id()
            if mode == "paced+nice":
                os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + ckpt.WRITER_NICE))
            elif mode.endswith("idle"):
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            t = time.perf_counter()
            ckpt.write_model_file(os.path.join(d, "model.ckpt"), state if pace is None else image, pace=pace)
            took.append(time.perf_counter() - t)
        th = threading.Thread(target=write)
        th.start()
        during = [one() for _ in range(6)]
        hurry.set()
        th.join()
    return during[0] - ref, sum(during) - 6 * ref, ref, took[0]


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench_checkpoint_beside_step.py")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--mb", type=int, default=241)
    ap.add_argument("--batch", type=int, default=1024, help="rows per step (sets the step time)")
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--python-ms", type=float, default=0.0,
                    help="after each step, this long of Python (holding the GIL), as the training loop's own work")
    ap.add_argument("--modes", default=",".join(MODES), help=f"a comma-separated choice of {MODES}")
    args = ap.parse_args()
    modes = args.modes.split(",")
    from mspretrain.train.checkpoint import ModelImage

    one, state = train_step(args.batch, args.python_ms / 1000), tensors(args.mb)
    image = ModelImage().fill(state)        # a background write's snapshot, as the trainer takes it
    found = {m: [] for m in modes}
    for _ in range(args.reps):
        for mode in modes:
            found[mode].append(one_write(mode, one, state, image, args.dir))
    load = os.getloadavg()
    print(f"{args.mb} MB written beside a {statistics.median(r[2] for rs in found.values() for r in rs) * 1000:.0f} ms "
          f"step, {args.reps} alternating reps; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on "
          f"{os.cpu_count()} CPUs")
    for mode, rs in found.items():
        print(f"{mode:11s} first step {statistics.median(r[0] for r in rs) * 1000:+5.0f} ms "
              f"({statistics.median(r[0] / r[2] for r in rs) * 100:+4.0f}%), 6 steps summed "
              f"{statistics.median(r[1] for r in rs) * 1000:+5.0f} ms, the write {statistics.median(r[3] for r in rs):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
