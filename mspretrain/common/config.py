"""The one config layer of both command lines: a tree of dataclasses, loaded from YAML, overridden by
`--set a.b=v` (values read as YAML) and by flags, validated by pydantic.

Why pydantic: the config trees stay plain dataclasses (readable, `dataclasses.asdict` for hashes and
manifests), and pydantic's documented lax coercion gives one set of rules for both tools: numeric strings
become numbers, integral floats become ints, lists become tuples, unions are really checked. Numbers are
read as YAML 1.2 numbers, so `1e3` is a float (YAML 1.1 would read a string). A value given for a string
field stays the text the user wrote: `run.dir=0x10` is the directory `0x10`, not `16` (YAML would read a
number, and `1e3`, `010` or `true` would each become another text). Errors name the dotted key.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import types
import typing
from pathlib import Path
from typing import Annotated, Any, TypeVar

import pydantic
import yaml

from mspretrain.common.console import USAGE, UsageError

EXIT_CONFIG = USAGE      # both CLIs exit with this on a config error (a usage error)
T = TypeVar("T")


class ConfigError(UsageError):
    """A config value that cannot work; the message names the key (a usage error: exit 2)."""


# ---------------------------------------------------------------- sizes

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "m": 1000**2, "mb": 1000**2, "g": 1000**3,
          "gb": 1000**3, "t": 1000**4, "tb": 1000**4, "kib": 1 << 10, "mib": 1 << 20,
          "gib": 1 << 30, "tib": 1 << 40}


def parse_size(value, key: str = "size") -> int:
    """`2GiB`, `64MB`, `512k`, `1.5KiB`, `1_000`, or an int -> a positive number of bytes."""
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


def _size(value):
    try:
        return parse_size(value)
    except ConfigError as e:
        raise ValueError(str(e).removeprefix("size: ")) from None


Size = Annotated[int, pydantic.BeforeValidator(_size)]
"""A dataclass field type: bytes, given as an int or as `64MB`, `2GiB`."""


# ---------------------------------------------------------------- YAML with 1.2 numbers

class _Loader(yaml.SafeLoader):
    """SafeLoader that reads `1e3`, `2e-5` as floats (YAML 1.2), as every user expects."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                   |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+][0-9]+)?
                   |[-+]?\.(?:inf|Inf|INF)
                   |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def read_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)


@dataclasses.dataclass(frozen=True)
class _Scalar:
    """A plain YAML scalar that YAML typed (number, bool): its value and the text it was written as,
    so that a string field can take the text. Only inside `load`; `_untag` removes every one."""
    value: Any
    text: str


class _TextKeepingLoader(_Loader):
    """_Loader whose numbers and booleans remember their source text (for string fields)."""


def _keeping_text(tag: str):
    construct = _Loader.yaml_constructors[tag]

    def keep(loader, node):
        return _Scalar(construct(loader, node), node.value)
    return keep


for _tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:bool"):
    _TextKeepingLoader.add_constructor(_tag, _keeping_text(_tag))


def _read_config_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_TextKeepingLoader)


def _untag(tp, value):
    """Replace each _Scalar in `value` by its text where the field type `tp` is a string, else by
    its value, following the dataclass fields, lists, tuples and mappings of `tp`."""
    if isinstance(value, _Scalar):
        return value.text if _is_str(tp) else value.value
    if typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if isinstance(value, dict):
        if dataclasses.is_dataclass(tp):
            hints = typing.get_type_hints(tp, include_extras=True)
            return {_untag(str, k): _untag(hints.get(_untag(str, k), Any), v) for k, v in value.items()}
        key_tp, value_tp = args if origin is dict and len(args) == 2 else (Any, Any)
        return {_untag(key_tp, k): _untag(value_tp, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if origin is tuple and args and args[-1] is not Ellipsis and len(args) == len(value):
            return [_untag(a, v) for a, v in zip(args, value)]
        item_tp = args[0] if origin in (list, tuple) and args else Any
        return [_untag(item_tp, v) for v in value]
    return value


def _is_str(tp) -> bool:
    """str, Annotated[str, ...] or a union whose only non-None member is str."""
    if typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(tp) if a is not type(None)]
        return len(members) == 1 and _is_str(members[0])
    return tp is str


# ---------------------------------------------------------------- loading

def load(cls: type[T], path: str | Path | None = None, sets: list[str] | tuple = (),
         overrides: dict | None = None) -> T:
    """YAML file (optional), then `--set a.b=v` strings, then `overrides` {"a.b": value} -> `cls`."""
    raw: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} not found")
        try:
            raw = _read_config_yaml(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: invalid YAML ({e})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
    for key, value in [_parse_set(s) for s in sets] + list((overrides or {}).items()):
        _assign(raw, key, value)
    return validate(cls, _untag(cls, raw))


def parse_set(item: str) -> tuple[str, Any]:
    """`a.b=v` -> ("a.b", v read as YAML)."""
    key, value = _parse_set(item)
    return key, _untag(Any, value)


def _parse_set(item: str) -> tuple[str, Any]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {item!r}: expected key=value, e.g. train.steps=100")
    try:
        return key.strip(), _read_config_yaml(value)
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {item!r}: invalid YAML value ({e})") from None


def _assign(raw: dict, key: str, value) -> None:
    node = raw
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{key}: {p} is not a section")
    node[parts[-1]] = value


def validate(cls: type[T], raw: dict) -> T:
    """Build the dataclass tree `cls` from a mapping; the first problem becomes a ConfigError."""
    _refuse_bools(cls, raw, "")
    try:
        return _adapter(cls).validate_python(raw)
    except pydantic.ValidationError as e:
        raise ConfigError(_describe(cls, e.errors()[0])) from None


def _refuse_bools(cls: type, raw, prefix: str) -> None:
    """`steps: true` is a slip, not 1: pydantic's lax mode would take a bool for a number."""
    if not dataclasses.is_dataclass(cls) or not isinstance(raw, dict):
        return
    hints = typing.get_type_hints(cls, include_extras=True)
    for key, value in raw.items():
        tp = hints.get(key)
        if tp is None:
            continue
        if isinstance(value, bool) and not _accepts_bool(tp):
            raise ConfigError(f"{prefix}{key}: expected {_type_name(tp)}, got {value!r}")
        _refuse_bools(tp, value, f"{prefix}{key}.")


def _accepts_bool(tp) -> bool:
    if typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    if tp is bool or tp is Any:
        return True
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return any(_accepts_bool(a) for a in typing.get_args(tp))
    return False


def _type_name(tp) -> str:
    if typing.get_origin(tp) is Annotated:
        tp = typing.get_args(tp)[0]
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


_ADAPTERS: dict[type, pydantic.TypeAdapter] = {}


def _adapter(cls: type) -> pydantic.TypeAdapter:
    if cls not in _ADAPTERS:
        # unknown keys are errors; nan/inf are typos, not values; nested dataclasses inherit this
        cls.__pydantic_config__ = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False,
                                                      coerce_numbers_to_str=True)
        _ADAPTERS[cls] = pydantic.TypeAdapter(cls)
    return _ADAPTERS[cls]


_EXPECTED = [("int", "int"), ("float", "float"), ("finite", "float"), ("bool", "bool"),
             ("string", "str"), ("dict", "a mapping"), ("dataclass", "a mapping"),
             ("list", "a list"), ("tuple", "a list")]


def _describe(cls: type, err: dict) -> str:
    """`train.steps: expected int, got 2.5`: the dotted key of the deepest config field, then what."""
    keys, tp = [], cls
    for part in err["loc"]:
        fields = _keys(tp) if dataclasses.is_dataclass(tp) else {}
        if part not in fields:
            if err["type"] == "unexpected_keyword_argument":
                keys.append(str(part))
                return f"unknown key {'.'.join(keys)} (known: {', '.join(sorted(fields))})"
            break
        keys.append(part)
        tp = fields[part]
    key = ".".join(keys) or "config"
    if err["type"] == "value_error":
        return f"{key}: {err['msg'].removeprefix('Value error, ')}"
    expected = next((name for prefix, name in _EXPECTED if err["type"].startswith(prefix)), None)
    if expected:
        return f"{key}: expected {expected}, got {err['input']!r}"
    return f"{key}: {err['msg']}, got {err['input']!r}"


def _keys(cls: type) -> dict:
    """{config key: type} of a dataclass's fields; a field with a pydantic alias (a key that is a
    Python keyword, e.g. checkpoint.async) is known by the alias."""
    out = {}
    for name, tp in typing.get_type_hints(cls, include_extras=True).items():
        key = name
        for meta in getattr(tp, "__metadata__", ()):
            alias = getattr(meta, "alias", None) or getattr(meta, "validation_alias", None)
            key = alias if isinstance(alias, str) else alias.choices[0] if getattr(alias, "choices", None) else key
        out[key] = typing.get_args(tp)[0] if typing.get_origin(tp) is Annotated else tp
    return out


def as_dict(cfg) -> dict:
    """The config as plain JSON-able data (tuples become lists)."""
    return _jsonable(dataclasses.asdict(cfg))


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


# ---------------------------------------------------------------- command line

def add_config_options(parser: argparse.ArgumentParser, required: bool = False) -> None:
    """`--config FILE.yaml` and `--set KEY=VALUE [KEY=VALUE ...]` (repeatable), the same in both CLIs."""
    parser.add_argument("--config", required=required, metavar="FILE.yaml", help="YAML config file")
    parser.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
                        help="override config keys (values read as YAML), e.g. --set a.b=1 c=x; "
                             "repeatable")


def report(prog: str, err: UsageError) -> int:
    """Print a usage error (a config error: its key) the same way in both CLIs; returns the exit
    code (2)."""
    what = "config error" if isinstance(err, ConfigError) else "error"
    print(f"{prog}: {what}: {err}", file=sys.stderr)
    return EXIT_CONFIG
