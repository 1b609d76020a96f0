"""The typed config of `dataprep build`: one dataclass tree, loaded by the shared config layer
(`mspretrain.config`) from YAML, overridden by flags and `--set a.b=v`. Errors name the bad key.
`manifest_config()` gives the fully resolved config that goes into the manifest and the fingerprint: it
leaves out the runtime-only section (`run`: workers, strict, chunk size, progress bars),
because those never change a byte of the output.

Sizes (`max_shard_bytes`, `sample_bytes`, `chunk_bytes`) accept plain bytes or `64MB`, `2GiB`, `512k`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from mspretrain.dataprep.steps.decontam import DecontamConfig
from mspretrain.dataprep.dedup.detect import DedupConfig
from mspretrain.dataprep.steps.filters import FilterConfig
from mspretrain.dataprep.steps.pii import PiiConfig
from mspretrain.dataprep.write.shards import shard_capacity
from mspretrain.loader.manifest import sha256_file
from mspretrain.common.config import ConfigError, Size, as_dict, load


@dataclass
class InputConfig:
    text_field: str = "text"       # jsonl / parquet field holding the document text
    id_field: str = "id"           # field that becomes the doc_id where present
    text_unit: str = "file"        # plain text: one document per "file" or per blank-line "paragraph"
    # "global": a record's id field is its doc_id, and ids must be unique across all input files (a
    # repeat is dropped as `duplicate_doc_id`, and an id another file already used is warned about
    # per file); "file": ids are namespaced by their file (doc_id REL#ID), for corpora whose ids
    # restart in every file. An integer id is its digits: 1 and "1" are the same id.
    id_scope: str = "global"
    # a record (jsonl line, paragraph, text file, parquet value) over this many bytes is never held:
    # it is a bad record `record_too_long` (counted; --strict fails naming file:line).
    # The default keeps every record the default filters.max_chars (1M characters) can keep, even
    # as JSON with every character \u-escaped (<= 12 bytes each), and bounds what one record costs
    # a process (a few copies of it); a lower cap (>= max_chars) trades those records for memory.
    max_record_bytes: Size = 16 << 20


@dataclass
class TokenizerConfig:
    model: str = ""                # an existing sentencepiece .model to reuse; empty: train one
    vocab_size: int = 32000        # at most; fitted down when the sample yields fewer pieces
    model_type: str = "unigram"    # unigram | bpe
    character_coverage: float = 0.9995  # share of the sample's characters given a piece
    byte_fallback: bool = True     # unknown characters as UTF-8 byte pieces, never <unk>
    num_threads: int = 2           # fixed: sentencepiece's model depends on it; never from --workers
    sample_bytes: Size = 100 << 20  # training sample: at most this much cleaned train text
    max_sentence_length: int = 16384  # longer sample lines are skipped by sentencepiece (bytes)


@dataclass
class PackConfig:
    seq_length: int = 2048         # samples hold seq_length + 1 tokens
    valid_fraction: float = 0.01   # documents held out, chosen by a hash of the doc_id
    split_seed: int = 0            # salt of that hash


@dataclass
class ShardConfig:
    max_shard_bytes: Size = 2 << 30  # data file + .db index, each shard


@dataclass
class RunConfig:
    """Runtime-only: never changes the output bytes, so not part of the manifest or fingerprint."""
    workers: int = 1               # engine local: worker processes that run the tasks (--workers)
    strict: bool = False           # first bad record fails the build
    chunk_bytes: Size = 4 << 20     # raw input text per chunk inside a work unit (memory per task)
    progress: bool = True          # progress bars on stderr (--no-progress)
    engine: str = "local"          # who runs the stage plan: local (worker processes) | ray (Ray
                                   # core tasks, docs/scale-out.md); the same bytes either way
    ray_address: str = ""          # engine ray: "" starts a local Ray instance; auto | HOST:PORT joins
    ray_partitions: int = 0        # both engines: shuffle partitions of the dedup stages (0: one per
                                   # GiB of input, 2 to 256: from the inputs, never the machines)
    ray_cpus: int = 0              # engine ray, local instance only: CPUs it may use (0: all)
    ray_union_find_edges: int = 20_000_000   # both engines: more dedup edges -> min-label rounds
    ray_unit_bytes: Size = 256 << 20   # both engines: uncompressed jsonl/parquet files cut into
                                       # work units of this size (the docs stage's parallelism)
    # both engines: documents a dedup replay task holds in its in-memory LSH index (~2 KB each);
    # beyond, the index is frozen into segments in DIR/.build (same results)
    dedup_memory_docs: int = 1 << 15


@dataclass
class BuildConfig:
    input: InputConfig = field(default_factory=InputConfig)
    filters: FilterConfig = field(default_factory=FilterConfig)
    pii: PiiConfig = field(default_factory=PiiConfig)
    decontam: DecontamConfig = field(default_factory=DecontamConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    pack: PackConfig = field(default_factory=PackConfig)
    shards: ShardConfig = field(default_factory=ShardConfig)
    run: RunConfig = field(default_factory=RunConfig)


def load_build_config(path: str | Path | None = None, overrides: dict | None = None,
                      sets: list[str] | tuple = ()) -> BuildConfig:
    """YAML file (optional), then `--set a.b=v` strings, then `overrides` {"a.b": value} from flags."""
    cfg = load(BuildConfig, path, sets, overrides)
    validate(cfg)
    return cfg


def validate(cfg: BuildConfig) -> None:
    checks = [
        (cfg.input.text_unit in ("file", "paragraph"), "input.text_unit", "file or paragraph"),
        (cfg.input.id_scope in ("global", "file"), "input.id_scope", "global or file"),
        (cfg.tokenizer.model_type in ("unigram", "bpe"), "tokenizer.model_type", "unigram or bpe"),
        (cfg.tokenizer.vocab_size >= 16, "tokenizer.vocab_size", ">= 16"),
        (0 < cfg.tokenizer.character_coverage <= 1, "tokenizer.character_coverage", "in (0, 1]"),
        (cfg.tokenizer.num_threads >= 1, "tokenizer.num_threads", ">= 1"),
        (cfg.pack.seq_length >= 1, "pack.seq_length", ">= 1"),
        (0 <= cfg.pack.valid_fraction < 1, "pack.valid_fraction", "in [0, 1)"),
        (0 < cfg.dedup.threshold <= 1, "dedup.threshold", "in (0, 1]"),
        (cfg.run.workers >= 1, "run.workers", ">= 1"),
        (cfg.run.engine in ("local", "ray"), "run.engine", "local or ray"),
        (cfg.run.ray_partitions >= 0, "run.ray_partitions", ">= 0 (0: from the input size)"),
        (cfg.run.ray_cpus >= 0, "run.ray_cpus", ">= 0"),
        (cfg.run.dedup_memory_docs >= 1, "run.dedup_memory_docs", ">= 1"),
    ]
    for ok, key, want in checks:
        if not ok:
            raise ConfigError(f"{key}: must be {want}, got {_get(cfg, key)!r}")
    if shard_capacity(cfg.shards.max_shard_bytes, cfg.pack.seq_length) < 1:
        raise ConfigError(f"shards.max_shard_bytes: {cfg.shards.max_shard_bytes} bytes cannot hold "
                          f"one sample of {cfg.pack.seq_length + 1} tokens next to MindRecord's "
                          f"header, pages and index; raise it")
    cap = cfg.input.max_record_bytes
    if cap < cfg.filters.max_chars:
        raise ConfigError(f"input.max_record_bytes: {cap} bytes would skip records that "
                          f"filters.max_chars = {cfg.filters.max_chars} keeps; raise it")
    if cfg.tokenizer.model and not Path(cfg.tokenizer.model).is_file():
        raise ConfigError(f"tokenizer.model: {cfg.tokenizer.model} not found")
    for f in cfg.decontam.files:
        if not Path(f).is_file():
            raise ConfigError(f"decontam.files: {f} not found")
    if cfg.filters.quality.model and not Path(cfg.filters.quality.model).is_file():
        raise ConfigError(f"filters.quality.model: {cfg.filters.quality.model} not found")


def manifest_config(cfg: BuildConfig) -> dict:
    """The resolved config as the manifest records it: everything but the runtime-only `run`."""
    d = as_dict(cfg)
    d.pop("run")
    # the default record cap is recorded only when changed: datasets built before the key existed
    # keep their fingerprint (records under the cap read as they always did)
    if cfg.input.max_record_bytes == InputConfig.max_record_bytes:
        d["input"].pop("max_record_bytes")
    if cfg.input.id_scope == InputConfig.id_scope:    # likewise: the default is how ids always were
        d["input"].pop("id_scope")
    # files that change the output are recorded by content, like the inputs
    d["decontam"]["files"] = [{"file": Path(f).name, "sha256": sha256_file(f)} for f in cfg.decontam.files]
    if cfg.filters.quality.model:
        d["filters"]["quality"]["model"] = "sha256:" + sha256_file(cfg.filters.quality.model)
    return d


def _get(cfg, key: str):
    for p in key.split("."):
        cfg = getattr(cfg, p)
    return cfg

