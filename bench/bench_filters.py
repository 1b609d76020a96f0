"""Benchmark of the heuristic quality filters, of normalize and of whitespace squeezing against the
straightforward implementations they replaced, on the corpus of bench_quality.py (manual pages in
every installed language, normalised), per CPU-second, alternated (A B A B) in one process.

    .venv/bin/python bench/bench_filters.py [--mb 4] [--pairs 5]

The reference filters are tests/dataprep/filters_reference.py (the implementation before the
numpy fast path); the reference normalize is tests/dataprep/clean_reference.py (every step on
every text, whitespace squeezed line by line); the reference squeeze is one split and join per
line. Both sides decide every document and give every text identically (checked here once more
before timing). The per-character tables of both
are built before timing: the figures are the steady state of a worker.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench"), str(REPO / "tests" / "dataprep")]

import clean_reference  # noqa: E402
import filters_reference  # noqa: E402
from bench_quality import corpus  # noqa: E402
from mspretrain.dataprep.steps.clean import normalize, squeeze_whitespace  # noqa: E402
from mspretrain.dataprep.steps.filters import FilterConfig, quality_reason  # noqa: E402


def per_cpu_second(fn, texts: list[str], nbytes: float) -> float:
    t0 = time.process_time()
    for t in texts:
        fn(t)
    return nbytes / (time.process_time() - t0)


def compare(name: str, new, old, texts: list[str], pairs: int) -> None:
    nbytes = sum(len(t.encode()) for t in texts) / 1e6
    rates = [(per_cpu_second(old, texts, nbytes), per_cpu_second(new, texts, nbytes))
             for _ in range(pairs)]
    ratios = [n / o for o, n in rates]
    print(f"{name:28s} reference {statistics.median(o for o, _ in rates):6.1f} MB/CPU-s, "
          f"ours {statistics.median(n for _, n in rates):6.1f}: {statistics.median(ratios):.2f}x "
          f"(pairs {', '.join(f'{r:.2f}' for r in ratios)}; load average {os.getloadavg()[0]:.1f})")


def old_squeeze(text: str) -> str:
    return "\n".join([" ".join(line.split()) for line in text.splitlines()])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--pairs", type=int, default=5)
    args = ap.parse_args()
    raw = [t for _, t in corpus(args.mb)]
    texts = [normalize(t) for t in raw]
    cfg = FilterConfig()
    assert [quality_reason(t, cfg) for t in texts] == [
        filters_reference.quality_reason(t, cfg) for t in texts]
    assert all(squeeze_whitespace(t) == old_squeeze(t) for t in raw)
    assert texts == [clean_reference.normalize(t) for t in raw]
    print(f"corpus: {len(texts)} documents, {sum(len(t.encode()) for t in texts) / 1e6:.1f} MB")
    compare("quality filters (heuristic)", lambda t: quality_reason(t, cfg),
            lambda t: filters_reference.quality_reason(t, cfg), texts, args.pairs)
    compare("normalize (raw)", normalize, clean_reference.normalize, raw, args.pairs)
    compare("squeeze whitespace (raw)", squeeze_whitespace, old_squeeze, raw, args.pairs)


if __name__ == "__main__":
    main()
