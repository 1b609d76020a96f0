"""What a batch holds: global positions -> (source, sample id) -> token rows.

`SampleOrder` is the pure function of the loader state contract (seed, the sources' sizes and blend weights ->
which sample sits at each global position). `BatchMaker` turns a cursor into this rank's batch; the
main process uses it directly with num_workers=0, and each worker process runs its own copy, so
workers need nothing from the caller but a cursor.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mspretrain.loader.blend import BlendSchedule
from mspretrain.loader.manifest import SplitInfo
from mspretrain.loader.mindrecord import ShardCheck, ShardError, ShardSet
from mspretrain.loader.permutation import epoch_permutation


@dataclass(frozen=True)
class SampleOrder:
    """Position c -> (source j, sample id): blend slot (if any), then source j's epoch permutation."""
    seed: int
    sizes: tuple[int, ...]                    # samples per epoch of each source
    blend: BlendSchedule | None = None

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        positions = np.asarray(positions, dtype=np.int64)
        if self.blend is None:
            sources, numbers = np.zeros(positions.shape, np.int32), positions
        else:
            sources, numbers = self.blend.locate(positions)
        ids = np.empty(positions.shape, dtype=np.int64)
        for j in np.unique(sources).tolist():
            in_j = sources == j
            epoch, offset = np.divmod(numbers[in_j], self.sizes[j])
            out = np.empty(offset.shape, dtype=np.int64)
            for e in np.unique(epoch).tolist():
                at = epoch == e
                out[at] = epoch_permutation(self.sizes[j], self.seed, j, e).take(offset[at])
            ids[in_j] = out
        return sources.astype(np.int32), ids


@dataclass
class BatchMaker:
    """cursor -> this rank's batch {"input_ids", "sample_id", "source"}; opens shards lazily."""
    order: SampleOrder
    sources: tuple[tuple[Path, SplitInfo], ...]
    seq_length: int
    local_batch_size: int
    dp_rank: int
    checks: tuple[ShardCheck | None, ...] | None = None     # per source: verify shard digests first
    _readers: list[ShardSet] | None = field(default=None, repr=False)

    def positions(self, cursor: int) -> np.ndarray:
        start = cursor + self.dp_rank * self.local_batch_size
        return np.arange(start, start + self.local_batch_size, dtype=np.int64)

    def __call__(self, cursor: int) -> dict[str, np.ndarray]:
        sources, ids = self.order.locate(self.positions(cursor))
        if self._readers is None:
            checks = self.checks or (None,) * len(self.sources)
            self._readers = [ShardSet(root, split, self.seq_length, check=check)
                             for (root, split), check in zip(self.sources, checks)]
        try:
            tokens = self._read(sources, ids)
        except ShardError:
            raise
        except Exception as e:     # a bug or an unforeseen corruption: still say where
            raise ShardError(f"reading the batch at cursor {cursor}: {type(e).__name__}: {e}") from e
        return {"input_ids": tokens, "sample_id": ids, "source": sources}

    def close(self) -> None:
        for r in self._readers or ():
            r.close()
        self._readers = None

    def _read(self, sources: np.ndarray, ids: np.ndarray) -> np.ndarray:
        if len(self._readers) == 1:
            return self._readers[0].read(ids)
        out = np.empty((ids.size, self.seq_length + 1), dtype=np.int32)
        for j in np.unique(sources).tolist():
            where = np.flatnonzero(sources == j)
            out[where] = self._readers[j].read(ids[where])
        return out

    def layout(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Shapes and dtypes of a batch, for the workers' shared slots."""
        b = self.local_batch_size
        return {"input_ids": ((b, self.seq_length + 1), np.dtype(np.int32)),
                "sample_id": ((b,), np.dtype(np.int64)), "source": ((b,), np.dtype(np.int32))}
