"""What the plan's tasks hand back to the plan (plan/run.py): a dataclass per kind of task marker.

A task builds its marker and hands it on as `to_dict()`: the executors move plain dicts (over a
process pipe or to Ray) and add their accounting to them (`task_cpu_s`; `reused` for a marker an
earlier try wrote), and the per-unit markers are also the JSON files of done/ in the work dir,
which a resumed build reads back. The plan reads every one back typed, with `from_dict`. In the
order of the stages (plan/__init__.py)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import ClassVar

from mspretrain.dataprep.records import InputFile
from mspretrain.loader.manifest import ShardInfo


@dataclass(frozen=True, kw_only=True)
class Marker:
    # found done: written by an earlier try of the task (done() adds it; never stored)
    reused: bool | None = None
    # fields that hold nested records: field name -> the record's class
    records: ClassVar[dict] = {}

    @classmethod
    def from_dict(cls, d: dict):
        """The marker of a task's dict; keys it does not know (the executor's) are left out."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        for name, record in cls.records.items():
            if name in kw:
                v = kw[name]
                kw[name] = [_record(record, x) for x in v] if isinstance(v, list) else _record(record, v)
        return cls(**kw)

    def to_dict(self) -> dict:
        """The dict a task returns and stores: every field but those that are None."""
        return {k: v for k, v in asdict(self).items() if v is not None}


def _record(cls, value):
    return value if isinstance(value, cls) else cls(**value)


@dataclass(frozen=True, kw_only=True)
class HashMarker(Marker):
    """The sha256 of an input file (never stored)."""
    sha256: str


@dataclass(frozen=True, kw_only=True)
class PartsMarker(Marker):
    """plan_file: the work units a large input file is cut into (never stored)."""
    parts: list[InputFile]
    records: ClassVar[dict] = {"parts": InputFile}


@dataclass(frozen=True, kw_only=True)
class Chunk:
    """A chunk in a unit's marker: its index in the work dir, and whether an earlier try of the task
    wrote its outputs (they were read back, not computed again)."""
    index: int
    reused: bool


@dataclass(frozen=True, kw_only=True)
class ChunkDocs(Chunk):
    rows: int      # documents read (stage 1)


@dataclass(frozen=True, kw_only=True)
class DocsMarker(Marker):
    """docs_unit: the unit's chunks, or the first bad record or reader failure that stops the build
    (`stop` [file, line, reason, detail], `stop_kind` "strict" or "error"; never stored)."""
    unit: int
    chunks: list[ChunkDocs] = field(default_factory=list)
    rows: int | None = None
    sig_dtype: str | None = None
    stop: list | None = None
    stop_kind: str | None = None
    records: ClassVar[dict] = {"chunks": ChunkDocs}


@dataclass(frozen=True, kw_only=True)
class EdgesMarker(Marker):
    """exact_reduce, cells_reduce: the partition's edges."""
    part: int
    edges: int


@dataclass(frozen=True, kw_only=True)
class RoundMarker(Marker):
    """label_round: labels changed, and labels sent to the neighbours' partitions."""
    changed: int
    sent: int


@dataclass(frozen=True, kw_only=True)
class ReplayMarker(Marker):
    """replay: the partition's documents and drops, and how often its LSH index went to disk."""
    part: int
    docs: int
    drops: int
    frozen: int


@dataclass(frozen=True, kw_only=True)
class SettleMarker(Marker):
    """settle_unit: the unit's dedup counts (exact, near: [docs, bytes]) and duplicate ids
    ([source, doc_id, first source])."""
    unit: int
    kept_docs: int
    kept_bytes: int
    train_bytes: int
    exact: list
    near: list
    duplicate_ids: list


@dataclass(frozen=True, kw_only=True)
class SampleMarker(Marker):
    """sample_unit: the unit's piece of the tokenizer training sample."""
    unit: int
    sample_docs: int
    sample_bytes: int


@dataclass(frozen=True, kw_only=True)
class TokenizerMarker(Marker):
    """train_tokenizer_task: the trained vocabulary's size, or why there is none."""
    vocab_size: int | None = None
    error: str | None = None


@dataclass(frozen=True, kw_only=True)
class ChunkTokens(Chunk):
    tokens: dict   # split -> tokens (stage 4)


@dataclass(frozen=True, kw_only=True)
class TokensMarker(Marker):
    """tokenize_unit: token counts per chunk and split."""
    unit: int
    chunks: list[ChunkTokens]
    records: ClassVar[dict] = {"chunks": ChunkTokens}


@dataclass(frozen=True, kw_only=True)
class WriteMarker(Marker):
    """write_shard: the shard written."""
    split: str
    shard: ShardInfo
    records: ClassVar[dict] = {"shard": ShardInfo}


@dataclass(frozen=True, kw_only=True)
class ProvenanceMarker(Marker):
    """write_provenance: the split's document length bins (report/summary.py length_bins) and its
    token stream's length."""
    split: str
    length_bins: list
    tokens: int
