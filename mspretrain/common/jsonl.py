"""JSON lines read for a person: blank lines skipped, and a bad line named by `file:line`."""
from __future__ import annotations

import json
import os
from typing import Iterator


def read_json_lines(path: str | os.PathLike, error: type[Exception] = ValueError
                    ) -> Iterator[tuple[int, object]]:
    """(line number, parsed value) of every non-blank line; `error("FILE:LINE: not JSON (...)")` on
    the first line that does not parse. Checking the value's shape is the caller's job."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{path}:{line_no}: not JSON ({e.msg})") from None
