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

    def counts_before(self, length: int) -> np.ndarray:
        """Samples of each source among positions [0, length) (int64 [sources])."""
        cycles, rest = divmod(int(length), self.period)
        return cycles * self.counts + np.bincount(self.sched[:rest], minlength=self.counts.size)


class MixtureSchedule:
    """A blend whose weights change in phases: phase k covers the blended positions [starts[k], ends[k])
    (the last phase is endless) with its own BlendSchedule over a subset of the sources.

    Every source keeps one cursor across the phases: the sample numbers a source's positions get run
    on, from where the earlier phases left it, so a phase change neither repeats nor skips a sample of
    any source. Like BlendSchedule, a pure function of the positions (same `locate` contract).
    """

    def __init__(self, num_sources: int, phases: list[tuple[int | None, dict[int, float]]],
                 period: int = PERIOD):
        """phases: (end position or None for the last, {source index: weight}) in order."""
        if not phases or phases[-1][0] is not None or any(end is None for end, _ in phases[:-1]):
            raise ValueError("a mixture needs phases with an end position each, but for the last")
        self.num_sources = num_sources
        self.ends = np.array([end for end, _ in phases[:-1]], dtype=np.int64)
        if np.any(np.diff(np.concatenate([[0], self.ends])) <= 0):
            raise ValueError(f"mixture phase ends must increase from above 0, got {self.ends.tolist()}")
        self.starts = np.concatenate([[0], self.ends]).astype(np.int64)
        self.members = [np.array(sorted(w), dtype=np.int32) for _, w in phases]
        self.blends = [BlendSchedule([w[j] for j in m], period) for m, (_, w) in zip(self.members, phases)]
        # base[k][j]: samples of source j the phases before k consumed (its cursor when phase k starts)
        self.base = np.zeros((len(phases), num_sources), dtype=np.int64)
        for k in range(1, len(phases)):
            self.base[k] = self.base[k - 1] + self._phase_counts(k - 1, self.ends[k - 1] - self.starts[k - 1])

    @property
    def counts(self) -> list[list[int]]:
        """The quantised slot counts of each phase, by source (0 where a phase leaves it out)."""
        out = []
        for m, b in zip(self.members, self.blends):
            row = [0] * self.num_sources
            for j, n in zip(m.tolist(), b.counts.tolist()):
                row[j] = n
            out.append(row)
        return out

    def phase_of(self, position: int) -> int:
        return int(np.searchsorted(self.ends, position, side="right"))

    def _phase_counts(self, k: int, length: int) -> np.ndarray:
        out = np.zeros(self.num_sources, dtype=np.int64)
        out[self.members[k]] = self.blends[k].counts_before(length)
        return out

    def counts_before(self, length: int) -> np.ndarray:
        """Samples of each source among positions [0, length)."""
        k = self.phase_of(max(0, int(length) - 1)) if length > 0 else 0
        return self.base[k] + self._phase_counts(k, int(length) - self.starts[k])

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        positions = np.asarray(positions, dtype=np.int64)
        phase = np.searchsorted(self.ends, positions, side="right")
        sources = np.empty(positions.shape, dtype=np.int32)
        numbers = np.empty(positions.shape, dtype=np.int64)
        for k in np.unique(phase).tolist():
            at = phase == k
            local, number = self.blends[k].locate(positions[at] - self.starts[k])
            sources[at] = self.members[k][local]
            numbers[at] = self.base[k][sources[at]] + number
        return sources, numbers
