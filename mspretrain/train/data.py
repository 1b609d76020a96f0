"""The training data of a run: one dataset (`data.path`), a weighted blend (`data.blend`), or a mixture
whose weights change by phase of consumed tokens (`data.mixture`), at the batch size of the step
(`train.rampup`). docs/recipes.md has the recipes.

Everything is a pure function of the loader cursor (global samples consumed): which sample sits at a
position (the loader state contract, mspretrain/loader), which phase a position is in, the batch size
of the step that starts at a cursor, and how many samples and tokens each source gave so far. So a
resume from any checkpoint, on any dp size, continues the same stream, and the per-source counts in
metrics.jsonl and state.json need nothing but the cursor.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from mspretrain.train.step.batching import micro_batches
from mspretrain.train.config import Config, ConfigError

LR_SCALINGS = ("none", "sqrt", "linear")


# ---------------------------------------------------------------- config

def data_kind(cfg: Config) -> str:
    """path | blend | mixture: the one of data.path, data.blend, data.mixture that is set."""
    given = [k for k, v in (("path", cfg.data.path), ("blend", cfg.data.blend), ("mixture", cfg.data.mixture))
             if v]
    if not given:
        raise ConfigError("data.path is empty: set it to a dataset dir (--set data.path=DIR), or set "
                          "data.blend / data.mixture")
    if len(given) > 1:
        raise ConfigError(f"data.{given[0]} and data.{given[1]} exclude each other: set one of data.path, "
                          f"data.blend, data.mixture")
    return given[0]


def _weights(blend, key: str) -> dict[str, float]:
    if not isinstance(blend, Mapping) or not blend:
        raise ConfigError(f"{key} must be a mapping {{dataset dir: weight}} with at least one entry, "
                          f"got {blend!r}")
    for d, w in blend.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w < math.inf:
            raise ConfigError(f"{key}: the weight of {d} must be a positive number, got {w!r}")
    return {str(d): float(w) for d, w in blend.items()}


def mixture_phases(cfg: Config) -> list[tuple[int | None, dict[str, float]]]:
    """data.mixture checked: [(until_tokens or None for the last phase, {dir: weight})]."""
    phases, last = [], 0
    for i, entry in enumerate(cfg.data.mixture):
        key = f"data.mixture[{i}]"
        if not isinstance(entry, Mapping) or set(entry) - {"until_tokens", "blend"} or "blend" not in entry:
            raise ConfigError(f"{key} must be {{until_tokens: N, blend: {{dir: weight}}}} (no until_tokens "
                              f"in the last phase), got {entry!r}")
        until = entry.get("until_tokens")
        final = i == len(cfg.data.mixture) - 1
        if final and until is not None:
            raise ConfigError(f"{key}: the last phase runs to the end: drop its until_tokens ({until})")
        if not final and (isinstance(until, bool) or not isinstance(until, int) or until <= last):
            raise ConfigError(f"{key}.until_tokens must be an integer above the previous phase's "
                              f"({last}), got {until!r}")
        phases.append((until, _weights(entry["blend"], f"{key}.blend")))
        last = until or last
    return phases


def source_dirs(cfg: Config) -> list[str]:
    """Every dataset the run reads, in first-mention order (the index of batch["source"])."""
    kind = data_kind(cfg)
    if kind == "path":
        return [cfg.data.path]
    if kind == "blend":
        return list(_weights(cfg.data.blend, "data.blend"))
    dirs: list[str] = []
    for _, blend in mixture_phases(cfg):
        dirs += [d for d in blend if d not in dirs]
    return dirs


def source_names(dirs: list[str]) -> list[str]:
    """Short names for metrics keys: the dirs' base names (with #i where two are the same)."""
    base = [Path(d).name or str(d) for d in dirs]
    return [b if base.count(b) == 1 else f"{b}#{i}" for i, b in enumerate(base)]


def check_sources(cfg: Config, verify: bool = False) -> list:
    """Every dataset intact (data_check) and all of one tokenizer and sequence length; returns the
    manifests. A mismatch names both datasets and what differs."""
    from mspretrain.train.data_check import DataCheckError, check_dataset, identity

    dirs = source_dirs(cfg)
    manifests = [check_dataset(d, (cfg.data.split, cfg.data.valid_split), full=verify) for d in dirs]
    first = identity(manifests[0])
    for d, m in zip(dirs[1:], manifests[1:]):
        mine = identity(m)
        if mine["seq_length"] != first["seq_length"]:
            raise DataCheckError(f"{d}: seq_length {mine['seq_length']}, but {dirs[0]} has "
                                 f"{first['seq_length']}: every dataset of a blend needs the same seq_length")
        if mine != first:
            raise DataCheckError(f"{d}: tokenizer (sha256 {mine['tokenizer_sha256'][:12]}, vocab "
                                 f"{mine['vocab_size']}) differs from {dirs[0]}'s (sha256 "
                                 f"{first['tokenizer_sha256'][:12]}, vocab {first['vocab_size']}): every "
                                 f"dataset of a blend needs the same tokenizer")
    return manifests


# ---------------------------------------------------------------- batch-size ramp-up

class Rampup:
    """Megatron's batch-size ramp-up as a pure function of the consumed samples: `start` while fewer
    than samples / n were consumed (n = (G - start) / increment increments), then start + increment,
    ..., G from `samples` on. Integer arithmetic (Megatron divides in floats: the same sizes but at a
    float rounding edge)."""

    def __init__(self, cfg: Config, dp_size: int):
        r, g = cfg.train.rampup, cfg.train.global_batch_size
        self.start, self.increment, self.samples, self.final = r.start, r.increment, r.samples, g
        if not 0 < r.start < g:
            raise ConfigError(f"train.rampup.start must be in (0, train.global_batch_size={g}), got {r.start}")
        if r.increment < 1 or (g - r.start) % r.increment:
            raise ConfigError(f"train.rampup.increment must be >= 1 and divide train.global_batch_size - "
                              f"train.rampup.start = {g - r.start}, got {r.increment}")
        if r.samples < 1:
            raise ConfigError(f"train.rampup.samples must be >= 1, got {r.samples}")
        if r.start % dp_size or r.increment % dp_size:
            raise ConfigError(f"train.rampup.start ({r.start}) and increment ({r.increment}) must be "
                              f"multiples of the data-parallel size ({dp_size}): every rank takes an equal "
                              f"slice of each batch")
        k = micro_batches(cfg, dp_size)
        if k > 1 and (r.start % (dp_size * k) or r.increment % (dp_size * k)):
            raise ConfigError(f"train.rampup.start ({r.start}) and increment ({r.increment}) must be multiples "
                              f"of {dp_size * k}: every step runs {k} micro-batches per rank (fixed in the step "
                              f"graph by train.micro_batch_size or parallel.micro_batch_num at the full batch), "
                              f"so during the ramp each micro-batch is batch / (data-parallel size {dp_size} x "
                              f"{k}) samples, smaller than at the full batch")
        self.increments = (g - r.start) // r.increment

    def batch_size(self, consumed: int) -> int:
        if consumed >= self.samples:
            return self.final
        return min(self.final, self.start + self.increment * (consumed * self.increments // self.samples))


def lr_scale(cfg: Config, batch_size: int) -> float:
    """optim.lr_scaling: the learning-rate factor of a step of `batch_size` samples (1 at full size)."""
    mode, ratio = cfg.optim.lr_scaling, batch_size / cfg.train.global_batch_size
    if mode not in LR_SCALINGS:
        raise ConfigError(f"optim.lr_scaling must be one of {', '.join(LR_SCALINGS)}, got {mode!r}")
    return {"none": 1.0, "sqrt": math.sqrt(ratio), "linear": ratio}[mode]


# ---------------------------------------------------------------- the stream

class TrainData:
    """The run's batches: `next(data)` is this rank's slice of the global batch at the cursor, of the
    size train.rampup gives there. state_dict / load_state_dict / fingerprint / cursor / seq_length /
    vocab_size / tokenizer as the Loader's (the trainer and checkpoints use them the same way)."""

    def __init__(self, cfg: Config, dist):
        from mspretrain.loader.blend import BlendSchedule, MixtureSchedule
        from mspretrain.loader.manifest import load_manifest

        self.cfg, self.dist = cfg, dist
        self.kind = data_kind(cfg)
        self.dirs = source_dirs(cfg)
        self.names = source_names(self.dirs)
        self.rampup = Rampup(cfg, dist.dp_size) if cfg.train.rampup.start else None
        lr_scale(cfg, cfg.train.global_batch_size)          # a bad optim.lr_scaling fails here
        self.schedule = None
        if self.kind == "blend":
            self.schedule = BlendSchedule(list(_weights(cfg.data.blend, "data.blend").values()))
        if self.kind == "mixture":      # phases by tokens -> by positions (a sample is seq_length tokens)
            seq = load_manifest(self.dirs[0]).seq_length
            phases = mixture_phases(cfg)
            ends = [None if until is None else -(-until // seq) for until, _ in phases]
            if any(b <= a for a, b in zip([0] + ends[:-2], ends[:-1])):
                raise ConfigError(f"data.mixture: a phase is shorter than one sample ({seq} tokens)")
            self.schedule = MixtureSchedule(len(self.dirs), [
                (end, {self.dirs.index(d): w for d, w in blend.items()}) for end, (_, blend) in zip(ends, phases)])
        self._loader = None
        self.cursor = 0
        self._open(self.batch_size())
        self.seq_length, self.vocab_size = self._loader.seq_length, self._loader.vocab_size
        self.tokenizer = self._loader.tokenizer
        self.fingerprint = self._loader.fingerprint

    def _open(self, global_batch: int) -> None:
        """A loader for batches of `global_batch` at the cursor (the ramp reopens one per size)."""
        from mspretrain.loader import Loader
        from mspretrain.loader.mixture import MixtureLoader

        if self._loader is not None:
            self._loader.close()
        c = self.cfg
        kw = dict(global_batch_size=global_batch, seed=c.seed, dp_rank=self.dist.dp_rank,
                  dp_size=self.dist.dp_size, num_workers=c.data.num_workers, prefetch=c.data.prefetch)
        if self.kind == "mixture":
            self._loader = MixtureLoader(self.dirs, self.schedule, c.data.split, **kw)
        else:
            source = c.data.path if self.kind == "path" else _weights(c.data.blend, "data.blend")
            self._loader = Loader(source, split=c.data.split, **kw)
        self._loader.cursor = self.cursor

    def batch_size(self, cursor: int | None = None) -> int:
        """The global batch of the step that starts at `cursor` (default: now)."""
        cursor = self.cursor if cursor is None else cursor
        return self.rampup.batch_size(cursor) if self.rampup else self.cfg.train.global_batch_size

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        size = self.batch_size()
        if size != self._loader.global_batch_size:
            self._open(size)
        batch = next(self._loader)
        self.cursor = self._loader.cursor
        return batch

    def state_dict(self) -> dict:
        return self._loader.state_dict()

    def state_at(self, cursor: int) -> dict:
        """The state with the cursor at `cursor` (the spike guard's jump past a skipped range)."""
        return self._loader.state_at(cursor)

    def load_state_dict(self, state, force: bool = False) -> None:
        self._loader.load_state_dict(state, force=force)
        self.cursor = self._loader.cursor
        if self.batch_size() != self._loader.global_batch_size:
            self._open(self.batch_size())

    # -- per source --------------------------------------------------------------------------------

    def samples_per_source(self, cursor: int | None = None) -> list[int]:
        """Samples each source gave to the global stream before `cursor` (default: now)."""
        cursor = self.cursor if cursor is None else cursor
        if self.schedule is None:
            return [cursor]
        return [int(n) for n in self.schedule.counts_before(cursor)]

    def consumed(self) -> dict:
        """{name: {"dir", "samples", "tokens"}}: what state.json records (tokens: seq_length a sample)."""
        return {name: {"dir": d, "samples": n, "tokens": n * self.seq_length}
                for name, d, n in zip(self.names, self.dirs, self.samples_per_source())}

    def metrics(self) -> dict:
        """The per-source counts for a metrics.jsonl step record (blends and mixtures only)."""
        if self.kind == "path":
            return {}
        out = {}
        for name, n in zip(self.names, self.samples_per_source()):
            out[f"samples/{name}"] = n
            out[f"tokens/{name}"] = n * self.seq_length
        if self.kind == "mixture":
            out["mixture_phase"] = self.schedule.phase_of(max(0, self.cursor - 1))   # of the step's last sample
        return out

    def current_weights(self) -> dict[str, float]:
        """{dir: weight} of the blend now in force (the mixture phase at the cursor)."""
        if self.kind == "path":
            return {self.dirs[0]: 1.0}
        if self.kind == "blend":
            return _weights(self.cfg.data.blend, "data.blend")
        return mixture_phases(self.cfg)[self.schedule.phase_of(self.cursor)][1]

    def close(self) -> None:
        if self._loader is not None:
            self._loader.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

