"""Deterministic weighted blending with O(1) work per position and no O(N) index.

The weights are quantised to integer counts n_j summing to a period P = 2^16 (largest remainder, at
least one slot per source). Inside one period, source j's k-th slot ideally falls at time
(k + 1/2) * P / n_j; merging all sources' ideal times in order (ties to the lower source index) gives
the schedule: this is the Sainte-Lague/Webster apportionment, an error-minimising interleave like
Megatron's greedy blend, but periodic, so only P entries are stored (not one per sample).

Position c of the blended stream belongs to source `sched[c % P]` and is that source's sample number
`(c // P) * n_j + rank[c % P]`, where rank counts the earlier slots of the same source in the period.
Each source then has its own endless epoch/permutation stream (see permutation.py).

Tolerance (tested in tests/loader/test_blend.py): over any window of L consecutive positions the count of
source j differs from L * w_j by at most MAX_WINDOW_ERROR + L / P (the second term is the
quantisation of the weights, < 0.02 samples for L = 1,000).
"""
from __future__ import annotations

import numpy as np

PERIOD = 1 << 16
MAX_WINDOW_ERROR = 2.0


def quantise(weights: list[float], period: int = PERIOD) -> np.ndarray:
    """Integer slot counts per source, summing to `period`, each >= 1, proportional to weights."""
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0 or not np.all(np.isfinite(w)) or np.any(w <= 0):
        raise ValueError(f"blend weights must be positive finite numbers, got {list(weights)}")
    if w.size > period // 2:
        raise ValueError(f"too many sources ({w.size}) for a blend period of {period}")
    ideal = w / w.sum() * period
    counts = np.maximum(1, np.floor(ideal)).astype(np.int64)
    while counts.sum() != period:       # largest remainder first; at most #sources passes
        error = ideal - counts
        if counts.sum() < period:
            counts[np.argmax(error)] += 1
        else:
            error[counts <= 1] = np.inf
            counts[np.argmin(error)] -= 1
    return counts


class BlendSchedule:
    """Maps blended positions to (source index, sample number within that source's stream)."""

    def __init__(self, weights: list[float], period: int = PERIOD):
        self.period = period
        self.counts = quantise(weights, period)
        sources = np.repeat(np.arange(self.counts.size), self.counts)
        slot = np.concatenate([np.arange(n) for n in self.counts])
        times = (slot + 0.5) / self.counts[sources]
        order = np.lexsort((sources, times))
        self.sched = sources[order].astype(np.int32)
        self.rank = slot[order].astype(np.int64)   # slot k of a source comes after its slots < k

    @property
    def weights(self) -> np.ndarray:
        """The realised (quantised) weights."""
        return self.counts / self.period

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        positions = np.asarray(positions, dtype=np.int64)
        cycle, offset = np.divmod(positions, self.period)
        source = self.sched[offset]
        return source, cycle * self.counts[source] + self.rank[offset]
