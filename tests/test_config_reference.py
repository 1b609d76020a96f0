"""docs/config-reference.md is generated from the config dataclasses: it must be current, and the
generator must read the comment beside each field."""
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from mspretrain.common.configref import field_comments, rows

REPO = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("config_reference", REPO / "scripts" / "config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_config_reference_is_current():
    doc = (REPO / "docs" / "config-reference.md").read_text(encoding="utf-8")
    assert doc == _generator().generate(), "docs/config-reference.md is stale: run python scripts/config_reference.py"


@dataclass
class _Inner:
    size: int = 3          # how many
    name: str = "x"        # what it is called,
                           # over two lines
    # said above the field
    flag: bool = False
    plain: int = 0


@dataclass
class _Outer:
    inner: _Inner = None
    rate: float = 0.5      # per second


def test_comments_and_nesting_are_read():
    assert field_comments(_Inner) == {"size": "how many", "name": "what it is called, over two lines",
                                     "flag": "said above the field", "plain": ""}
    got = {key: (tp, default, note) for key, tp, default, note in rows(_Outer)}
    assert got["inner.size"] == ("int", "`3`", "how many")
    assert got["inner.flag"] == ("bool", "`False`", "said above the field")
    assert got["inner.plain"] == ("int", "`0`", "")
    assert got["rate"] == ("float", "`0.5`", "per second")
