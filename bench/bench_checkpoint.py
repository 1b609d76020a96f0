"""What the checkpoint digest costs : writing model.ckpt and its sha256.

    python bench/bench_checkpoint.py [--mb 8 256] [--reps 5] [--dir /tmp]

For each size, three ways of writing the same state (float32 tensors of 4 MB each), alternating, median
and best of --reps each:
  bare    ms.save_checkpoint + fsync: the write alone, no digest (the floor);
  before  bare, then hashlib.file_digest of the file: the digest as a second pass (the old writer);
  after   checkpoint.write_model_file: the same bytes, from views of the tensors (no copy), hashed as
          they are written on a helper thread.
The digest's cost is (before or after) - bare, as a share of the total. The helper thread hides the
hash behind the write and the fsync only when a core is free for it: on a saturated machine (see the
load average printed) `after` pays the whole SHA-256 (about 1 GB/s a core) like `before`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def state(mb: int) -> dict:
    from mindspore import Parameter, Tensor

    rng = np.random.default_rng(0)
    n = max(1, mb // 4)
    return {f"p{i}": Parameter(Tensor(rng.standard_normal(1 << 20).astype(np.float32)), name=f"p{i}")
            for i in range(n)}


def bare(params, path: Path) -> None:
    import mindspore as ms

    ms.save_checkpoint([{"name": k, "data": p} for k, p in params.items()], str(path))
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)


def before(params, path: Path) -> None:
    from mspretrain.train.checkpoint import file_digest

    bare(params, path)
    file_digest(path)


def after(params, path: Path) -> None:
    from mspretrain.train.checkpoint import host_copy, write_model_file

    write_model_file(path, host_copy(params, copy=False))     # as the synchronous writer does


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, nargs="+", default=[8, 256])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write (default: the system temp dir)")
    args = ap.parse_args()
    ways = {"bare": bare, "before": before, "after": after}
    for mb in args.mb:
        params = state(mb)
        times = {k: [] for k in ways}
        with tempfile.TemporaryDirectory(dir=args.dir) as d:
            for _ in range(args.reps):
                for name, fn in ways.items():
                    path = Path(d) / f"{name}.ckpt"
                    if path.exists():
                        os.chmod(path, 0o600)
                        path.unlink()
                    t = time.perf_counter()
                    fn(params, path)
                    times[name].append(time.perf_counter() - t)
        for label, pick in (("median", statistics.median), ("best", min)):
            t = {k: pick(v) for k, v in times.items()}
            print(f"{mb} MB, {label} of {args.reps}: bare {t['bare']:.3f} s, before {t['before']:.3f} s (digest "
                  f"{t['before'] - t['bare']:+.3f} s, {(t['before'] / t['bare'] - 1) * 100:+.1f}%), after "
                  f"{t['after']:.3f} s (digest {t['after'] - t['bare']:+.3f} s, "
                  f"{(t['after'] / t['bare'] - 1) * 100:+.1f}%)", flush=True)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
