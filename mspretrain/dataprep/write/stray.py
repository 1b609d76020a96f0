"""Nothing in a finished dataset but what the build wrote on purpose.

An interrupted step (Ctrl-C while sentencepiece trains, a SIGKILL mid-write) can leave a temporary
file (`.NAME.tmpPID...`) under the staging dir; a rerun runs under another pid and does not
overwrite it. `remove_temps` clears them before a dataset is published, and `unexpected_files` is
what `dataprep verify` holds against the manifest: any file a build does not write is a fault.
"""
from __future__ import annotations

import re
from pathlib import Path

from mspretrain.dataprep.dedup.keep import ATTRIBUTES_FILE, DUPLICATES_FILE

_TEMP = re.compile(r"^\..+\.tmp\d*")

# what a build writes besides the manifest's tokenizer and shards
FIXED = {"manifest.json", "report.json", "report.md", DUPLICATES_FILE, ATTRIBUTES_FILE}
PATTERNS = (re.compile(r"^provenance/[A-Za-z0-9_-]+\.parquet$"), re.compile(r"^report_[a-z_]+\.png$"))


def remove_temps(root: Path) -> list[Path]:
    """Delete the temporary files under `root` left by an interrupted write; returns them."""
    gone = [p for p in Path(root).rglob(".*") if p.is_file() and _TEMP.match(p.name)]
    for p in gone:
        p.unlink(missing_ok=True)
    return gone


def unexpected_files(root: Path, manifest) -> list[str]:
    """Files under `root` that neither the manifest lists nor a build writes (relative paths)."""
    root = Path(root)
    listed = set(FIXED) | {manifest.tokenizer.file or "tokenizer.model"}
    for split in manifest.splits.values():
        for shard in split.shards:
            listed |= {shard.file, f"{shard.file}.db"}
    out = []
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel not in listed and not any(x.match(rel) for x in PATTERNS):
            out.append(rel)
    return out
