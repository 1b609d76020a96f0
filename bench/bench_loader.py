"""Loader benchmark: throughput with 0/1/2 workers against MindSpore's MindDataset on the same shards,
time to the first batch at cursor 10^7 against cursor 0, and memory per worker.

    .venv/bin/python bench/bench_loader.py [--samples 20000] [--seq-length 1024] [--batch 32]

Everything is measured in one run on the same files (page cache warmed first), and printed as ratios
against the reference measured in that run; absolute rates depend on the machine's load.
The Loader gives a full global shuffle (every batch draws from all shards); MindDataset here reads
the files in order (shuffle=False), its fastest mode.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]                      # the package before tests/loader (a test folder)
sys.path.append(str(REPO / "tests"))            # for synthetic.make_dataset

from mspretrain.loader import Loader                          # noqa: E402
from mspretrain.loader.manifest import load_manifest          # noqa: E402
from mspretrain.loader.order import SampleOrder               # noqa: E402


def build(root: Path, samples: int, seq_length: int) -> Path:
    if (root / "manifest.json").is_file():
        m = load_manifest(root)
        if m.split("train").num_samples == samples and m.seq_length == seq_length:
            return root
    from synthetic import make_dataset
    print(f"building {samples} samples of {seq_length + 1} tokens in {root} ...", file=sys.stderr)
    return make_dataset(root, num_train=samples, num_valid=16, seq_length=seq_length,
                        vocab_size=32000, seed=0, max_shard_bytes=16 << 20)


def warm_cache(files: list[str]) -> None:
    for f in files:
        for path in (f, f + ".db"):
            with open(path, "rb") as fh:
                while fh.read(1 << 22):
                    pass


class Meter:
    """Wall time and CPU time (this process, its threads and the given child processes)."""

    def __init__(self, pids: list[int] = ()):
        self.procs = [psutil.Process()] + [psutil.Process(p) for p in pids]
        self.cpu0, self.t0 = self._cpu(), time.perf_counter()

    def stop(self, samples: int) -> tuple[float, float]:
        """(samples per wall second, samples per CPU second)."""
        return samples / (time.perf_counter() - self.t0), samples / (self._cpu() - self.cpu0)

    def _cpu(self) -> float:
        return sum(sum(p.cpu_times()[:2]) for p in self.procs)


def mindspore_in_order(files: list[str], batch: int, limit: int, workers: int) -> tuple[float, float]:
    import mindspore.dataset as msds
    ds = msds.MindDataset(files, shuffle=False, num_parallel_workers=workers).batch(batch)
    rows = iter(ds.create_tuple_iterator(output_numpy=True, num_epochs=1))
    next(rows)                                         # start-up excluded, as for the Loader
    n, meter = 0, Meter()
    while n < limit:
        n += len(next(rows)[0])
    return meter.stop(n)


def loader_rate(root: Path, batch: int, limit: int, workers: int) -> tuple[tuple[float, float], list[dict]]:
    with Loader(root, global_batch_size=batch, seed=1, num_workers=workers) as ld:
        next(ld)                                       # start-up is measured separately
        n, meter = 0, Meter(ld.worker_pids)
        while n < limit:
            n += len(next(ld)["sample_id"])
        rates = meter.stop(n)
        return rates, [_memory(pid) for pid in ld.worker_pids]


def _memory(pid: int) -> dict:
    info = psutil.Process(pid).memory_full_info()
    return {"rss_mb": info.rss / 2 ** 20, "uss_mb": info.uss / 2 ** 20}


def first_batch_seconds(root: Path, batch: int, cursor: int, workers: int) -> float:
    t0 = time.perf_counter()
    with Loader(root, global_batch_size=batch, seed=1, num_workers=workers) as ld:
        state = ld.state_dict()
        state["cursor"] = cursor
        ld.load_state_dict(state)
        first = next(ld)
        elapsed = time.perf_counter() - t0
    assert first["input_ids"].shape == (batch, ld.seq_length + 1)
    return elapsed


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bench_loader_ds"))
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--seq-length", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--measure", type=int, default=6_000, help="samples per throughput measurement")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved throughput rounds")
    ap.add_argument("--repeats", type=int, default=5, help="first-batch timings per cursor")
    args = ap.parse_args(argv)

    root = build(args.dir, args.samples, args.seq_length)
    m = load_manifest(root)
    files = [str(m.shard_path(s)) for s in m.split("train").shards]
    warm_cache(files)
    sample_mb = (args.seq_length + 1) * 4 / 1e6
    print(f"dataset: {args.samples} samples x {args.seq_length + 1} tokens, {len(files)} shards, "
          f"{sum(s.bytes for s in m.split('train').shards) / 1e6:.1f} MB on disk; batch {args.batch}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")

    # Rounds interleave every configuration, so that load from other processes hits all of them;
    # each reports its best round (interference only ever slows a round down).
    # The Loader goes first in each round: its processes never import MindSpore.
    configs = [("loader", 0), ("loader", 1), ("loader", 2), ("MindDataset", 1), ("MindDataset", 2)]
    rates = {c: [] for c in configs}
    memory = {}
    for round_ in range(args.rounds):
        for kind, w in configs:
            if kind == "loader":
                rate, mem = loader_rate(root, args.batch, args.measure, w)
                if round_ == 0:
                    memory[w] = mem
                    memory.setdefault("main", psutil.Process().memory_info().rss / 2 ** 20)
            else:
                rate = mindspore_in_order(files, args.batch, args.measure, w)
            rates[(kind, w)].append(rate)
    wall = {c: max(r[0] for r in rs) for c, rs in rates.items()}
    cpu = {c: max(r[1] for r in rs) for c, rs in rates.items()}
    ref_wall = max(wall[("MindDataset", 1)], wall[("MindDataset", 2)])
    ref_cpu = max(cpu[("MindDataset", 1)], cpu[("MindDataset", 2)])
    print(f"best of {args.rounds} interleaved rounds of {args.measure} samples each "
          f"(per CPU-second: CPU time of the process, its threads and its workers):")
    for w in (1, 2):
        c = ("MindDataset", w)
        print(f"MindDataset in order, {w} parallel worker(s): {wall[c]:8.0f} samples/s "
              f"{wall[c] * sample_mb:7.1f} MB/s  {cpu[c]:8.0f} samples per CPU-second")
    print("Loader, full global shuffle:")
    for w in (0, 1, 2):
        c = ("loader", w)
        mem = "; ".join(f"worker RSS {x['rss_mb']:.0f} MB (unique {x['uss_mb']:.0f} MB)" for x in memory[w])
        print(f"  num_workers={w}: {wall[c]:8.0f} samples/s {wall[c] * sample_mb:7.1f} MB/s  "
              f"ratio to MindDataset {wall[c] / ref_wall:.2f}  {cpu[c]:8.0f} samples per CPU-second "
              f"(ratio {cpu[c] / ref_cpu:.2f})  {mem}")
    print(f"  main process RSS {memory['main']:.0f} MB (before importing MindSpore)")

    order = SampleOrder(seed=1, sizes=(10 ** 10,))
    t0 = time.perf_counter()
    order.locate(np.arange(10 ** 9, 10 ** 9 + args.batch))
    print(f"order of a virtual 10^10-sample split: first batch at cursor 10^9 located in "
          f"{(time.perf_counter() - t0) * 1e3:.2f} ms (no index built)")

    far = 10 ** 7
    epochs = far // m.split("train").num_samples
    for workers in (0, 2):
        times = {0: [], far: []}
        for _ in range(args.repeats):
            for cursor in (0, far):                     # interleaved, so load drifts hit both
                times[cursor].append(first_batch_seconds(root, args.batch, cursor, workers))
        t0, t1 = statistics.median(times[0]), statistics.median(times[far])
        print(f"time to first batch, num_workers={workers}: cursor 0 {t0 * 1e3:.1f} ms, cursor 10^7 "
              f"(epoch {epochs}) {t1 * 1e3:.1f} ms, ratio {t1 / t0:.2f}")


if __name__ == "__main__":
    main()
