"""The Loader: global-cursor batches of a contract-1 dataset (or a weighted blend of several).

The loader state contract (docs/contracts.md): the sample at global cursor c is perm_{c // N}[c % N]; a step consumes the
global batch [c, c + G) and rank r of D takes [c + r*G/D, c + (r+1)*G/D). For a blend, position c
first picks a source and a sample number in that source's own stream (blend.py). The cursor moves
only when the consumer takes a batch (`next()`), never when a worker prefetches, so `state_dict()`
is exact whatever `num_workers` and `prefetch` are, and restoring it is O(1).
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mspretrain.loader.blend import BlendSchedule
from mspretrain.loader.manifest import Manifest, ManifestError, SplitInfo, canonical_json, load_manifest
from mspretrain.loader.mindrecord import ShardCheck, ShardError
from mspretrain.loader.order import BatchMaker, SampleOrder
from mspretrain.loader.workers import LoaderError, WorkerPool

STATE_VERSION = 1


class StateError(LoaderError):
    """A loader state that does not fit this loader (other dataset, seed, split or version)."""


@dataclass(frozen=True)
class _Source:
    root: Path
    manifest: Manifest
    split: SplitInfo
    weight: float

    @property
    def num_samples(self) -> int:
        return self.split.num_samples


class Loader:
    """Iterate `for batch in loader`: dicts of numpy arrays for this rank's slice of each global batch.

    batch["input_ids"] int32 [G // dp_size, seq_length + 1], batch["sample_id"] int64 (ids within the
    sample's source) and, for blends, batch["source"] int32 (index into the sources as declared).

    source: a dataset dir, or {dir: weight} to blend (same seq_length and tokenizer required).
    global_batch_size (G) and dp_rank/dp_size: this process takes positions
        [c + rank*G/D, c + (rank+1)*G/D) of every global batch [c, c + G).
    num_workers: reader processes (0: read in the calling process); prefetch: batches in flight
        with workers (default max(2, 2 * num_workers)); neither changes what is produced.
    epochs: None for an endless stream, else stop before the first global batch that would pass
        epochs * num_samples positions. timeout_s: longest wait for one batch from the workers.
    verify_shards: before the first row of a shard is read, its data file and index must have the
        sha256 the manifest records (each shard hashed once per loader, by the first process that
        opens it; mindrecord.ShardCheck); a damaged shard is a ShardError naming it.
    """

    def __init__(self, source: str | os.PathLike | Mapping[str | os.PathLike, float],
                 split: str = "train", *, global_batch_size: int, seed: int = 0, dp_rank: int = 0,
                 dp_size: int = 1, num_workers: int = 0, prefetch: int | None = None,
                 epochs: int | None = None, timeout_s: float = 300.0, verify_shards: bool = True):
        _check_args(global_batch_size, dp_rank, dp_size, num_workers, prefetch, epochs)
        self.split_name, self.seed = split, int(seed)
        self.global_batch_size, self.dp_rank, self.dp_size = global_batch_size, dp_rank, dp_size
        self.local_batch_size = global_batch_size // dp_size
        self.num_workers, self.epochs = num_workers, epochs
        self.prefetch = prefetch if prefetch is not None else max(2, 2 * num_workers)
        self.timeout_s = timeout_s
        self.blended = isinstance(source, Mapping)
        self._sources = _open_sources(source, split)
        first = self._sources[0].manifest
        self.seq_length, self.vocab_size = first.seq_length, first.tokenizer.vocab_size
        self.tokenizer = first.tokenizer
        self._blend = BlendSchedule([s.weight for s in self._sources]) if self.blended else None
        self.fingerprint = self._combined_fingerprint()
        self.cursor = 0
        self._order = SampleOrder(self.seed, tuple(s.num_samples for s in self._sources), self._blend)
        checks = tuple(ShardCheck(len(s.split.shards)) for s in self._sources) if verify_shards else None
        self._maker = BatchMaker(self._order, tuple((s.root, s.split) for s in self._sources),
                                 self.seq_length, self.local_batch_size, dp_rank, checks)
        self._pool: WorkerPool | None = None
        self._pool_start = self._next_submit = 0

    # -- sizes -------------------------------------------------------------------------------------

    @property
    def num_samples(self) -> int:
        """Samples in one epoch: of the split, or for a blend the sum over its sources."""
        return sum(s.num_samples for s in self._sources)

    @property
    def total_samples(self) -> int | None:
        """Positions the stream holds (epochs * num_samples), None when endless."""
        return None if self.epochs is None else self.epochs * self.num_samples

    def __len__(self) -> int:
        """Batches left (only with `epochs`); a last partial global batch is not produced."""
        if self.epochs is None:
            raise TypeError("an endless Loader (epochs=None) has no length")
        return max(0, (self.total_samples - self.cursor) // self.global_batch_size)

    @property
    def sources(self) -> list[dict]:
        return [{"dir": str(s.root), "weight": s.weight, "fingerprint": s.manifest.fingerprint,
                 "num_samples": s.num_samples} for s in self._sources]

    # -- order -------------------------------------------------------------------------------------

    def follow_schedule(self, schedule) -> None:
        """From now on position c is `schedule.locate(c)` over this loader's sources (in their
        declared order): e.g. a blend.MixtureSchedule, whose weights change by phase. Call it before
        the first batch: running workers keep the order they were started with."""
        if self._pool is not None:
            raise RuntimeError("follow_schedule: the loader's workers are reading in the old order; call it "
                               "before the first batch")
        if getattr(schedule, "num_sources", len(self._sources)) != len(self._sources):
            raise ValueError(f"follow_schedule: the schedule is over {schedule.num_sources} sources, this "
                             f"loader has {len(self._sources)}")
        self._blend = schedule
        self._order = SampleOrder(self.seed, self._order.sizes, schedule)
        self._maker.order = self._order

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source index, sample id) of global stream positions; a pure function of (seed, weights)."""
        return self._order.locate(positions)

    def batch_positions(self, cursor: int) -> np.ndarray:
        """This rank's positions of the global batch that starts at `cursor`."""
        return self._maker.positions(cursor)

    # -- iteration ---------------------------------------------------------------------------------

    def __iter__(self) -> Loader:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.total_samples is not None and self.cursor + self.global_batch_size > self.total_samples:
            raise StopIteration
        try:
            batch = self._produce(self.cursor)
        except BaseException:
            self._stop_workers()      # an error or Ctrl-C: no worker outlives it; resume restarts them
            raise
        self.cursor += self.global_batch_size
        return batch

    def with_cursors(self, steps: int | None = None):
        """The next `steps` batches (to the end if None), each with the cursor right after it: what a
        framework adapter puts into its items so that `state_at` stays exact behind its prefetching."""
        taken = 0
        while steps is None or taken < steps:
            try:
                batch = next(self)
            except StopIteration:
                return
            taken += 1
            yield batch, self.cursor

    def _produce(self, cursor: int) -> dict[str, np.ndarray]:
        batch = self._maker(cursor) if self.num_workers == 0 else self._from_workers(cursor)
        if not self.blended:
            del batch["source"]
        return batch

    def _from_workers(self, cursor: int) -> dict[str, np.ndarray]:
        G = self.global_batch_size
        if self._pool is None or cursor < self._pool_start or (cursor - self._pool_start) % G:
            self._stop_workers()
            self._pool = WorkerPool(self._maker, self._maker.layout(), self.num_workers, self.prefetch,
                                    self.timeout_s)
            self._pool_start = self._next_submit = cursor
        while self._pool.free_slots and (self.total_samples is None or
                                         self._next_submit + G <= self.total_samples):
            self._pool.submit(self._next_submit)
            self._next_submit += G
        return self._pool.result(cursor)

    # -- state -------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        state = {"version": STATE_VERSION, "dataset_fingerprint": self.fingerprint, "seed": self.seed,
                 "cursor": self.cursor, "split": self.split_name,
                 "global_batch_size": self.global_batch_size}
        if self.blended:
            state["sources"] = [{"fingerprint": s.manifest.fingerprint, "weight": s.weight,
                                 "num_samples": s.num_samples} for s in self._sources]
        return state

    def state_at(self, cursor: int) -> dict:
        """The state as it stood right after the batch that ended at `cursor`. Framework adapters
        whose pipelines read ahead put that cursor into each item; saving `state_at(item cursor)` of
        the last item really consumed is exact, whatever was prefetched."""
        state = self.state_dict()
        state["cursor"] = int(cursor)
        return state

    def load_state_dict(self, state: Mapping, force: bool = False) -> None:
        """Continue at `state["cursor"]`. A state of another dataset, seed or split raises StateError,
        unless `force`: then this loader's own dataset and seed continue at that cursor."""
        try:
            version, cursor = state["version"], state["cursor"]
            fingerprint, seed = state["dataset_fingerprint"], state["seed"]
        except (KeyError, TypeError) as e:
            raise StateError(f"loader state lacks field {e}: {state!r}") from None
        if version != STATE_VERSION:
            raise StateError(f"loader state version {version!r}; this loader reads {STATE_VERSION}")
        if not isinstance(cursor, int) or isinstance(cursor, bool) or cursor < 0:
            raise StateError(f"loader state field 'cursor' must be an integer >= 0, got {cursor!r}")
        problems = []
        if fingerprint != self.fingerprint:
            problems.append(f"dataset_fingerprint {fingerprint} != this dataset's {self.fingerprint}"
                            + _blend_diff(state.get("sources"), self.state_dict().get("sources")))
        if seed != self.seed:
            problems.append(f"seed {seed} != this loader's seed {self.seed}")
        if state.get("split", self.split_name) != self.split_name:
            problems.append(f"split {state['split']!r} != this loader's split {self.split_name!r}")
        if problems and not force:
            raise StateError("cannot restore loader state: " + "; ".join(problems)
                             + " (pass force=True to continue at its cursor anyway)")
        self._stop_workers()
        self.cursor = cursor

    # -- lifetime ----------------------------------------------------------------------------------

    @property
    def worker_pids(self) -> list[int]:
        return self._pool.pids if self._pool is not None else []

    @property
    def in_flight(self) -> int:
        """Batches the workers hold or are making beyond the cursor (at most `prefetch`)."""
        return self._pool.in_flight if self._pool is not None else 0

    def close(self) -> None:
        self._stop_workers()
        self._maker.close()

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _stop_workers(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _combined_fingerprint(self) -> str:
        if not self.blended:
            return self._sources[0].manifest.fingerprint
        parts = [[s.manifest.fingerprint, int(n)] for s, n in zip(self._sources, self._blend.counts)]
        return hashlib.sha256(canonical_json({"blend": parts}).encode()).hexdigest()


def _check_args(global_batch_size, dp_rank, dp_size, num_workers, prefetch, epochs) -> None:
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise LoaderError(message)
    need(isinstance(global_batch_size, int) and global_batch_size >= 1,
         f"global_batch_size must be a positive integer, got {global_batch_size!r}")
    need(isinstance(dp_size, int) and dp_size >= 1, f"dp_size must be >= 1, got {dp_size!r}")
    need(global_batch_size % dp_size == 0,
         f"global_batch_size {global_batch_size} is not divisible by dp_size {dp_size}")
    need(isinstance(dp_rank, int) and 0 <= dp_rank < dp_size, f"dp_rank {dp_rank!r} not in [0, {dp_size})")
    need(isinstance(num_workers, int) and num_workers >= 0, f"num_workers must be >= 0, got {num_workers!r}")
    need(prefetch is None or (isinstance(prefetch, int) and prefetch >= 1),
         f"prefetch must be >= 1, got {prefetch!r}")
    need(epochs is None or (isinstance(epochs, int) and epochs >= 1),
         f"epochs must be None or >= 1, got {epochs!r}")


def _open_sources(source, split: str) -> list[_Source]:
    items = list(source.items()) if isinstance(source, Mapping) else [(source, 1.0)]
    if not items:
        raise LoaderError("a blend needs at least one source")
    sources = []
    for root, weight in items:
        if not isinstance(weight, (int, float)) or not weight > 0 or weight == float("inf"):
            raise LoaderError(f"blend weight of {root} must be a positive number, got {weight!r}")
        try:
            manifest = load_manifest(root)
            info = manifest.split(split)
        except ManifestError as e:
            raise LoaderError(str(e)) from None
        if info.num_samples < 1:
            raise LoaderError(f"{Path(root) / 'manifest.json'}: split {split!r} has no samples")
        for shard in info.shards:
            for path in (manifest.shard_path(shard), Path(f"{manifest.shard_path(shard)}.db")):
                if not path.is_file():
                    raise ShardError(f"{path}: shard file missing (listed in {Path(root) / 'manifest.json'})")
        sources.append(_Source(Path(root), manifest, info, float(weight)))
    first = sources[0].manifest
    for s in sources[1:]:
        if (s.manifest.seq_length, s.manifest.tokenizer.sha256, s.manifest.tokenizer.vocab_size) != \
                (first.seq_length, first.tokenizer.sha256, first.tokenizer.vocab_size):
            raise LoaderError(f"cannot blend {s.root} with {sources[0].root}: seq_length or tokenizer differ")
    return sources


def _blend_diff(saved, current) -> str:
    if saved is None or current is None or saved == current:
        return ""
    return f" (saved sources {saved}, now {current})"
