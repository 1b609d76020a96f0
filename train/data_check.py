"""Is this the dataset a run or a checkpoint expects? Checked at the start of `train launch` and
`train eval`, before any step.

Quick (always, milliseconds): the manifest loads; every shard of the splits in use and its .db index
exist, their sizes add up to what the manifest records, and each data file starts with a readable
MindRecord header. With a checkpoint: the dataset's tokenizer (sha256 and vocabulary size) and
sequence length are those the checkpoint was trained on (recorded in its state.json). Full
(`--verify-data`): the sha256 of every shard, index and the tokenizer file, as `dataprep verify` does.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

from loader.manifest import ManifestError, load_manifest, sha256_file


class DataCheckError(RuntimeError):
    """The dataset is damaged or is not the one expected; the message names the file and the fix."""


def identity(manifest_or_loader) -> dict:
    """What a checkpoint records about its dataset: the tokenizer and the sequence length."""
    tok = manifest_or_loader.tokenizer
    return {"tokenizer_sha256": tok.sha256, "vocab_size": tok.vocab_size,
            "seq_length": manifest_or_loader.seq_length}


def check_dataset(path: str, splits: tuple[str, ...], full: bool = False):
    """The manifest, after the quick (or, with `full`, checksum) checks of `splits`; or DataCheckError."""
    root = Path(path)
    try:
        m = load_manifest(root)
    except ManifestError as e:
        raise DataCheckError(str(e)) from None
    faults = []
    for name in splits:
        split = m.splits.get(name)
        for shard in split.shards if split else ():
            faults += _shard_faults(root, shard, full)
    if full:
        tok = root / (m.tokenizer.file or "tokenizer.model")
        if tok.is_file() and sha256_file(tok) != m.tokenizer.sha256:
            faults.append(f"{tok}: sha256 differs from the manifest's tokenizer.sha256")
    if faults:
        hint = "" if full else "; run `dataprep verify` on it for a full check"
        raise DataCheckError(f"dataset {root} is damaged: " + "; ".join(faults[:5])
                             + (f" (and {len(faults) - 5} more)" if len(faults) > 5 else "") + hint)
    return m


def check_against_checkpoint(manifest, state: dict, ckpt_dir) -> None:
    """The dataset's tokenizer and sequence length are the checkpoint's (when it recorded them)."""
    saved = state.get("dataset")
    if not saved:
        return
    mine = identity(manifest)
    diff = [f"{k} {saved.get(k)!r} (checkpoint) != {mine[k]!r} (dataset)"
            for k in ("tokenizer_sha256", "vocab_size", "seq_length") if saved.get(k) != mine[k]]
    if diff:
        raise DataCheckError(f"{manifest.root} does not fit checkpoint {ckpt_dir}: " + "; ".join(diff)
                             + ". Use a dataset built with the checkpoint's tokenizer "
                               "(dataprep build --tokenizer MODEL) and sequence length.")


def _shard_faults(root: Path, shard, full: bool) -> list[str]:
    data, db = root / shard.file, root / f"{shard.file}.db"
    missing = [f"{p}: missing" for p in (data, db) if not p.is_file()]
    if missing:
        return missing
    size = data.stat().st_size + db.stat().st_size
    if size != shard.bytes:
        return [f"{data}: data + .db are {size} bytes, the manifest says {shard.bytes}"]
    header = _header_fault(data)
    if header:
        return [header]
    if full:
        if sha256_file(data) != shard.sha256:
            return [f"{data}: sha256 differs from the manifest (corrupted or replaced)"]
        if shard.db_sha256 and sha256_file(db) != shard.db_sha256:
            return [f"{db}: sha256 differs from the manifest (corrupted or replaced)"]
    return []


def _header_fault(data: Path) -> str | None:
    """A MindRecord data file starts with the length of its JSON header, then the header."""
    with open(data, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else 0
        try:
            if not 0 < n < (1 << 24):
                raise ValueError
            header = json.loads(f.read(n))
            if not isinstance(header, dict) or "header_size" not in header:
                raise ValueError
        except (ValueError, UnicodeDecodeError):
            return f"{data}: no MindRecord header at its start"
    return None
