"""Files MindSpore writes get the user's umask, like any other file.

MindSpore's MindRecord writer creates shards `-rw-------` and `save_checkpoint` creates `-r--------`,
whatever the umask: a dataset or a checkpoint shared with a team would be unreadable to them. After
those writers finish, the mode is reset to what `open()` would have given (0o666 minus the umask),
keeping a checkpoint read-only (0o444 minus the umask).
"""
from __future__ import annotations

import os
import re


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (/proc), else by the swap."""
    try:
        with open("/proc/self/status") as f:
            m = re.search(r"^Umask:\s*([0-7]+)$", f.read(), re.M)
        if m:
            return int(m.group(1), 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def use_umask(*paths, readonly: bool = False) -> None:
    mode = (0o444 if readonly else 0o666) & ~current_umask()
    for p in paths:
        os.chmod(p, mode)
