"""The dataset directory contract (docs/contracts.md): manifest.json and how to read it.

This is the one module `dataprep` (the writer) and `loader` (the reader) share. It knows the layout
and the sample schema, nothing about how a dataset is built or iterated.
"""
from __future__ import annotations

import bisect
import functools
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from mspretrain.common.errors import MspretrainError
from mspretrain.common.files import atomic_write_json

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
TOKENIZER_FILE = "tokenizer.model"
SHARDS_DIR = "shards"
SPLITS = ("train", "valid")

# MindRecord schema of every shard: documents packed back to back, seq_length + 1 tokens per sample.
def mindrecord_schema(seq_length: int) -> dict:
    return {
        "input_ids": {"type": "int32", "shape": [seq_length + 1]},
        "sample_id": {"type": "int64"},
    }


def shard_file_name(split: str, index: int) -> str:
    """Shards are named by position alone: MindRecord embeds the base name in the file bytes."""
    return f"{SHARDS_DIR}/{split}-{index:05d}.mindrecord"


class ManifestError(MspretrainError, ValueError):
    """A dataset directory that does not satisfy the contract; the message names the file and field."""


@dataclass(frozen=True)
class ShardInfo:
    file: str              # relative to the dataset dir; the index is `file + ".db"`
    first_sample: int
    num_samples: int
    bytes: int             # data file plus its .db index
    sha256: str            # of the data file
    db_sha256: str = ""    # of the .db index


@dataclass(frozen=True)
class SplitInfo:
    num_samples: int
    num_tokens: int
    shards: tuple[ShardInfo, ...]

    def locate(self, sample: int) -> tuple[int, int]:
        """(shard index, row in shard) of global sample `sample`, in O(log #shards)."""
        if not 0 <= sample < self.num_samples:
            raise IndexError(f"sample {sample} out of range [0, {self.num_samples})")
        k = bisect.bisect_right(self._starts, sample) - 1
        return k, sample - self.shards[k].first_sample

    @functools.cached_property
    def _starts(self) -> list[int]:
        return [s.first_sample for s in self.shards]


@dataclass(frozen=True)
class TokenizerInfo:
    file: str
    sha256: str
    type: str
    vocab_size: int
    bos_id: int
    eos_id: int
    pad_id: int
    unk_id: int = 0


@dataclass(frozen=True)
class Manifest:
    format_version: int
    fingerprint: str
    seq_length: int
    tokenizer: TokenizerInfo
    splits: dict[str, SplitInfo]
    config: dict = field(default_factory=dict)
    versions: dict = field(default_factory=dict)
    root: Path | None = None   # where it was loaded from; not serialised

    def split(self, name: str) -> SplitInfo:
        if name not in self.splits:
            raise ManifestError(f"{self._where()}: no split {name!r} (has {sorted(self.splits)})")
        return self.splits[name]

    def shard_path(self, shard: ShardInfo) -> Path:
        return Path(self.root or ".") / shard.file

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("root")
        return d

    def _where(self) -> str:
        return str(Path(self.root or ".") / MANIFEST_FILE)


def compute_fingerprint(seq_length: int, tokenizer_sha256: str, splits: dict[str, SplitInfo],
                        config: dict) -> str:
    """A hash over what determines the bytes: config, tokenizer and every shard's checksums."""
    payload = {
        "format_version": FORMAT_VERSION,
        "seq_length": seq_length,
        "tokenizer_sha256": tokenizer_sha256,
        "config": config,
        "shards": {name: [[s.file, s.num_samples, s.sha256, s.db_sha256] for s in sp.shards]
                   for name, sp in sorted(splits.items())},
    }
    return hashlib.sha256(canonical_json(payload).encode()).hexdigest()


def canonical_json(obj) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def shard_faults(root: str | os.PathLike, shard, digests: bool = True) -> list[str]:
    """A shard against the manifest's record of it, every fault named: its data file and .db index
    exist, their sizes add up to `shard.bytes` and, with `digests`, each has its recorded sha256."""
    data, db = Path(root) / shard.file, Path(root) / f"{shard.file}.db"
    missing = [f"{p}: missing (listed in the manifest)" for p in (data, db) if not p.is_file()]
    if missing:
        return missing
    size = data.stat().st_size + db.stat().st_size
    faults = [] if size == shard.bytes else [f"{data}: data + .db are {size} bytes, the manifest says {shard.bytes}"]
    return faults + (digest_faults(data, shard.sha256, shard.db_sha256) if digests else [])


def digest_faults(data: str | os.PathLike, sha256: str, db_sha256: str) -> list[str]:
    """A shard's data file and its .db index against their recorded sha256 (db_sha256 "": manifests
    that predate the index's digest record none)."""
    faults = []
    if sha256_file(data) != sha256:
        faults.append(f"{data}: sha256 differs from the manifest (corrupted or replaced)")
    if db_sha256 and sha256_file(f"{data}.db") != db_sha256:
        faults.append(f"{data}.db: sha256 differs from the manifest (corrupted or replaced)")
    return faults


def write_manifest(root: str | os.PathLike, manifest: Manifest) -> Path:
    """Write atomically (temp file + rename): a reader never sees a half-written manifest."""
    path = Path(root) / MANIFEST_FILE
    atomic_write_json(path, manifest.to_dict(), indent=2)
    return path


def load_manifest(root: str | os.PathLike) -> Manifest:
    root = Path(root)
    path = root / MANIFEST_FILE
    if not path.is_file():
        raise ManifestError(f"{path}: not found; is {root} a dataset built by `dataprep build`?")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ManifestError(f"{path}: invalid JSON ({e})") from None
    if d.get("format_version") != FORMAT_VERSION:
        raise ManifestError(f"{path}: format_version {d.get('format_version')!r}, "
                            f"this code reads {FORMAT_VERSION}")
    try:
        splits = {}
        for name, sp in d["splits"].items():
            shards = tuple(ShardInfo(**s) for s in sp["shards"])
            splits[name] = SplitInfo(sp["num_samples"], sp["num_tokens"], shards)
            _check_contiguous(path, name, splits[name])
        return Manifest(format_version=d["format_version"], fingerprint=d["fingerprint"],
                        seq_length=int(d["seq_length"]), tokenizer=TokenizerInfo(**d["tokenizer"]),
                        splits=splits, config=d.get("config", {}), versions=d.get("versions", {}),
                        root=root)
    except (KeyError, TypeError) as e:
        raise ManifestError(f"{path}: missing or malformed field ({e})") from None


def _check_contiguous(path: Path, name: str, split: SplitInfo) -> None:
    expected = 0
    for s in split.shards:
        if s.first_sample != expected:
            raise ManifestError(f"{path}: split {name!r} shard {s.file} starts at {s.first_sample}, "
                                f"expected {expected}")
        expected += s.num_samples
    if expected != split.num_samples:
        raise ManifestError(f"{path}: split {name!r} shards hold {expected} samples, "
                            f"num_samples says {split.num_samples}")
