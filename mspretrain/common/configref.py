"""A Markdown reference of a config tree, generated from its dataclasses: every key with its type,
default and the comment written beside the field. The comments in the config modules are the
documentation; `scripts/config_reference.py` writes docs/config-reference.md and CI checks it is current."""
from __future__ import annotations

import dataclasses
import inspect
import io
import re
import tokenize
import typing


def field_comments(cls: type) -> dict[str, str]:
    """What the source says of each field of a dataclass: its trailing comment with the indented
    comment lines below it, or else the comment lines just above it."""
    source = inspect.getsource(cls)
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    by_line = {tok.start[0]: tok.string[1:].strip() for tok in tokens if tok.type == tokenize.COMMENT}
    field_line = re.compile(r"^(\s+)(\w+)\s*:")
    comments: dict[str, list[str]] = {}
    current, above = None, []
    for number, line in enumerate(source.splitlines(), start=1):
        stripped = line.strip()
        match = field_line.match(line)
        if match and not stripped.startswith("#"):
            current = match.group(2)
            comments[current] = [by_line[number]] if number in by_line else above
            above = []
        elif stripped.startswith("#"):
            indent = len(line) - len(line.lstrip())
            if current is not None and indent > 8 and comments[current]:
                comments[current].append(by_line[number])   # continues the field's own comment
            else:
                current = None
                above.append(by_line[number])
        else:
            current, above = None, []
    return {name: " ".join(text) for name, text in comments.items()}


def _type_name(tp) -> str:
    if isinstance(tp, type):
        return tp.__name__
    name = str(tp).replace("typing.", "")
    return re.sub(r"\b[\w.]+\.(\w+)", r"\1", name)


def _key(name: str, tp) -> str:
    """The config key of a field: its pydantic alias when it has one (a key that is a Python keyword;
    with alias choices, the first)."""
    for meta in getattr(tp, "__metadata__", ()):
        alias = getattr(meta, "alias", None) or getattr(meta, "validation_alias", None)
        if isinstance(alias, str):
            return alias
        if alias is not None and getattr(alias, "choices", None):
            return alias.choices[0]
    return name


def _default(f: dataclasses.Field):
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of every leaf of the tree below `cls`."""
    hints = typing.get_type_hints(cls)
    annotated = typing.get_type_hints(cls, include_extras=True)
    notes = field_comments(cls)
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = prefix + _key(f.name, annotated[f.name])
        if dataclasses.is_dataclass(tp):
            out += rows(tp, key + ".")
            continue
        default = _default(f)
        shown = "" if default is None else f"`{default!r}`" if not isinstance(default, str) else f'`"{default}"`'
        out.append((key, _type_name(tp), shown, notes.get(f.name, "")))
    return out


def render(cls: type, title: str, intro: str) -> str:
    lines = [f"## {title}", "", intro, "", "| key | type | default | what it does |", "|---|---|---|---|"]
    for key, tp, default, note in rows(cls):
        note = note.replace("|", "\\|")
        lines.append(f"| `{key}` | {tp.replace('|', '&#124;')} | {default.replace('|', '&#124;')} | {note} |")
    return "\n".join(lines) + "\n"
