"""The typed config of `dataprep build`: one dataclass tree, loaded from YAML, overridden by the CLI.

Every key can be set in the YAML file; command-line flags (and `--set a.b=v`) override it. Errors name
the bad key. `manifest_config()` gives the fully resolved config that goes into the manifest and the
fingerprint: it leaves out the runtime-only section (`run`: workers, strict, chunk size, progress bars),
because those never change a byte of the output.

Sizes (`max_shard_bytes`, `sample_bytes`, `chunk_bytes`) accept plain bytes or `64MB`, `2GiB`, `512k`.
"""
from __future__ import annotations

import dataclasses
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dataprep.decontam import DecontamConfig
from dataprep.dedup import DedupConfig
from dataprep.filters import FilterConfig
from dataprep.pii import PiiConfig
from dataprep.shards import shard_capacity


class ConfigError(ValueError):
    """A config value that cannot work; the message names the key."""


@dataclass
class InputConfig:
    text_field: str = "text"       # jsonl / parquet field holding the document text
    id_field: str = "id"           # field that becomes the doc_id where present
    text_unit: str = "file"        # plain text: one document per "file" or per blank-line "paragraph"


@dataclass
class TokenizerConfig:
    model: str = ""                # an existing sentencepiece .model to reuse; empty: train one
    vocab_size: int = 32000
    model_type: str = "unigram"    # unigram | bpe
    character_coverage: float = 0.9995
    byte_fallback: bool = True
    num_threads: int = 2           # fixed: sentencepiece's model depends on it; never from --workers
    sample_bytes: int = 100 << 20  # training sample: at most this much cleaned train text
    max_sentence_length: int = 16384


@dataclass
class PackConfig:
    seq_length: int = 2048         # samples hold seq_length + 1 tokens
    valid_fraction: float = 0.01   # documents held out, chosen by a hash of the doc_id
    split_seed: int = 0            # salt of that hash


@dataclass
class ShardConfig:
    max_shard_bytes: int = 2 << 30  # data file + .db index, each shard


@dataclass
class RunConfig:
    """Runtime-only: never changes the output bytes, so not part of the manifest or fingerprint."""
    workers: int = 1
    strict: bool = False           # first bad record fails the build
    chunk_bytes: int = 4 << 20     # raw input text per work unit sent to a worker
    progress: bool = True


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


SIZE_KEYS = {"shards.max_shard_bytes", "tokenizer.sample_bytes", "run.chunk_bytes"}
_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40}


def parse_size(value, key: str = "size") -> int:
    """`2GiB`, `64MB`, `512k`, `1_000`, or an int -> bytes."""
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    else:
        m = re.fullmatch(r"\s*([0-9][0-9_]*(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value))
        unit = m and m.group(2).lower()
        if not m or unit not in _UNITS:
            raise ConfigError(f"{key}: {value!r} is not a size (examples: 2GiB, 64MB, 1048576)")
        n = int(float(m.group(1).replace("_", "")) * _UNITS[unit])
    if n <= 0:
        raise ConfigError(f"{key}: size must be positive, got {value!r}")
    return n


def load_build_config(path: str | Path | None = None, overrides: dict | None = None,
                      sets: list[str] | tuple = ()) -> BuildConfig:
    """YAML file (optional), then `--set a.b=v` strings, then `overrides` {"a.b": value} from flags."""
    raw: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} not found")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: invalid YAML ({e})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
    items = [_parse_set(s) for s in sets] + list((overrides or {}).items())
    for key, value in items:
        node = raw
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key}: {p} is not a section")
        node[parts[-1]] = value
    cfg = _build(BuildConfig, raw, "")
    validate(cfg)
    return cfg


def validate(cfg: BuildConfig) -> None:
    checks = [
        (cfg.input.text_unit in ("file", "paragraph"), "input.text_unit", "file or paragraph"),
        (cfg.tokenizer.model_type in ("unigram", "bpe"), "tokenizer.model_type", "unigram or bpe"),
        (cfg.tokenizer.vocab_size >= 16, "tokenizer.vocab_size", ">= 16"),
        (0 < cfg.tokenizer.character_coverage <= 1, "tokenizer.character_coverage", "in (0, 1]"),
        (cfg.tokenizer.num_threads >= 1, "tokenizer.num_threads", ">= 1"),
        (cfg.pack.seq_length >= 1, "pack.seq_length", ">= 1"),
        (0 <= cfg.pack.valid_fraction < 1, "pack.valid_fraction", "in [0, 1)"),
        (0 < cfg.dedup.threshold <= 1, "dedup.threshold", "in (0, 1]"),
        (cfg.run.workers >= 1, "run.workers", ">= 1"),
    ]
    for ok, key, want in checks:
        if not ok:
            raise ConfigError(f"{key}: must be {want}, got {_get(cfg, key)!r}")
    if shard_capacity(cfg.shards.max_shard_bytes, cfg.pack.seq_length) < 1:
        raise ConfigError(f"shards.max_shard_bytes: {cfg.shards.max_shard_bytes} bytes cannot hold "
                          f"one sample of {cfg.pack.seq_length + 1} tokens next to MindRecord's "
                          f"header, pages and index; raise it")
    if cfg.tokenizer.model and not Path(cfg.tokenizer.model).is_file():
        raise ConfigError(f"tokenizer.model: {cfg.tokenizer.model} not found")
    for f in cfg.decontam.files:
        if not Path(f).is_file():
            raise ConfigError(f"decontam.files: {f} not found")
    if cfg.filters.quality.model and not Path(cfg.filters.quality.model).is_file():
        raise ConfigError(f"filters.quality.model: {cfg.filters.quality.model} not found")


def manifest_config(cfg: BuildConfig) -> dict:
    """The resolved config as the manifest records it: everything but the runtime-only `run`."""
    d = dataclasses.asdict(cfg)
    d.pop("run")
    # files that change the output are recorded by content, like the inputs
    d["decontam"]["files"] = [{"file": Path(f).name, "sha256": _sha256(f)} for f in cfg.decontam.files]
    if cfg.filters.quality.model:
        d["filters"]["quality"]["model"] = "sha256:" + _sha256(cfg.filters.quality.model)
    return _jsonable(d)


def _sha256(path: str) -> str:
    import hashlib
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _parse_set(item: str) -> tuple[str, object]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. pack.seq_length=128")
    return key.strip(), yaml.safe_load(value)


def _build(cls, raw, where: str):
    if not isinstance(raw, dict):
        raise ConfigError(f"{where or 'config'}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(raw) - set(names))
    if unknown:
        raise ConfigError(f"unknown key {_join(where, unknown[0])} (known: {', '.join(names)})")
    kwargs = {name: _coerce(hints[name], value, _join(where, name)) for name, value in raw.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:   # a dataclass that validates itself (e.g. A's configs)
        raise ConfigError(f"{where or 'config'}: {e}") from None


def _coerce(tp, value, key: str):
    if key in SIZE_KEYS:
        return parse_size(value, key)
    if dataclasses.is_dataclass(tp):
        return _build(tp, value if value is not None else {}, key)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None and len(args) < len(typing.get_args(tp)):
            return None
        for a in args:
            try:
                return _coerce(a, value, key)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: {value!r} does not fit {tp}")
    simple = {bool: (bool,), int: (int,), float: (int, float), str: (str, int, float)}
    if tp in simple:
        if isinstance(value, simple[tp]) and (tp is bool or not isinstance(value, bool)):
            return tp(value)
        raise ConfigError(f"{key}: expected {tp.__name__}, got {value!r}")
    if tp in (dict, list, tuple) or origin in (dict, list, tuple):
        want = origin or tp
        ok = isinstance(value, dict) if want is dict else isinstance(value, (list, tuple))
        if not ok:
            raise ConfigError(f"{key}: expected {want.__name__}, got {value!r}")
        return want(value) if want is not tuple else _to_tuple(value)
    return value


def _to_tuple(value):
    return tuple(_to_tuple(v) if isinstance(v, list) else v for v in value)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def _get(cfg, key: str):
    for p in key.split("."):
        cfg = getattr(cfg, p)
    return cfg


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
