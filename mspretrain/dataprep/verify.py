"""`dataprep verify DIR`: check a dataset directory against its manifest; every fault is named.

Checks, in order: the manifest parses and its shards are contiguous; the tokenizer file's checksum and
vocabulary size; for every shard, the data file and its .db exist, their sizes add up to the recorded
bytes, stay at or under the cap, and their sha256 match; no stray shard files; the fingerprint
recomputed from the manifest's contents equals the recorded one (an edited manifest fails here); and,
for every shard whose checksums passed, every row: sample_id == first_sample + row, input_ids of
length seq_length + 1 with every id in [0, vocab_size), and the row count. Provenance files must
exist for every non-empty split and name only sample ids of that split.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mspretrain.common import arrow
from mspretrain.dataprep.write.stray import unexpected_files
from mspretrain.loader.manifest import (SHARDS_DIR, ManifestError, compute_fingerprint, load_manifest,
                                        sha256_file, shard_faults)

READ_BATCH = 256


def verify_dataset(root: str | os.PathLike) -> list[str]:
    root = Path(root)
    try:
        m = load_manifest(root)
    except ManifestError as e:
        return [str(e)]
    faults = _check_tokenizer(root, m)
    for name, split in m.splits.items():
        if split.num_tokens != split.num_samples * (m.seq_length + 1):
            faults.append(f"{root / 'manifest.json'}: split {name!r} num_tokens {split.num_tokens} "
                          f"!= num_samples {split.num_samples} x {m.seq_length + 1}")
    cap = int(m.config.get("shards", {}).get("max_shard_bytes", 2 << 30))
    readable = []
    for name, split in m.splits.items():
        for shard in split.shards:
            problems = _check_files(root, shard, cap)
            faults += problems
            if not problems:
                readable.append(shard)
    listed = {s.file for sp in m.splits.values() for s in sp.shards}
    for p in sorted((root / SHARDS_DIR).glob("*.mindrecord")) if (root / SHARDS_DIR).is_dir() else []:
        if f"{SHARDS_DIR}/{p.name}" not in listed:
            faults.append(f"{p}: shard file not listed in the manifest")
    faults += [f"{root / rel}: file not listed in the manifest (not written by a build)"
               for rel in unexpected_files(root, m) if not rel.startswith(f"{SHARDS_DIR}/")
               or not rel.endswith(".mindrecord")]
    expected = compute_fingerprint(m.seq_length, m.tokenizer.sha256, m.splits, m.config)
    if expected != m.fingerprint:
        faults.append(f"{root / 'manifest.json'}: fingerprint {m.fingerprint[:16]} does not match "
                      f"the manifest's contents ({expected[:16]}): the manifest was edited")
    for shard in readable:
        faults += _check_rows(root / shard.file, shard, m.seq_length, m.tokenizer.vocab_size)
    faults += _check_provenance(root, m)
    return faults


def file_faults(root: Path, m) -> list[str]:
    """The cheap half of verify: every file the manifest lists exists with its size and sha256
    (what a rebuild checks before it says that DIR already holds the dataset)."""
    root = Path(root)
    path = root / (m.tokenizer.file or "tokenizer.model")
    if not path.is_file():
        faults = [f"{path}: tokenizer file missing"]
    elif sha256_file(path) != m.tokenizer.sha256:
        faults = [f"{path}: sha256 differs from the manifest's tokenizer.sha256"]
    else:
        faults = []
    cap = int(m.config.get("shards", {}).get("max_shard_bytes", 2 << 30))
    for split in m.splits.values():
        for shard in split.shards:
            faults += _check_files(root, shard, cap)
    return faults


def _check_tokenizer(root: Path, m) -> list[str]:
    path = root / (m.tokenizer.file or "tokenizer.model")
    if not path.is_file():
        return [f"{path}: tokenizer file missing"]
    if sha256_file(path) != m.tokenizer.sha256:
        return [f"{path}: sha256 differs from the manifest's tokenizer.sha256"]
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(path))
    t = m.tokenizer
    if sp.get_piece_size() != t.vocab_size:
        return [f"{path}: vocabulary of {sp.get_piece_size()} pieces, manifest says {t.vocab_size}"]
    if (sp.eos_id(), sp.bos_id(), sp.unk_id()) != (t.eos_id, t.bos_id, t.unk_id) \
            or not 0 <= t.pad_id < t.vocab_size:
        return [f"{root / 'manifest.json'}: tokenizer special ids differ from {path}'s"]
    return []


def _check_files(root: Path, shard, cap: int) -> list[str]:
    faults = shard_faults(root, shard)
    data = root / shard.file
    if data.is_file() and Path(f"{data}.db").is_file():
        size = data.stat().st_size + Path(f"{data}.db").stat().st_size
        if size > cap:
            faults.append(f"{data}: data + .db are {size} bytes, over the cap of {cap}")
    return faults


def _check_rows(path: Path, shard, seq_length: int, vocab_size: int) -> list[str]:
    import mindspore.dataset as ds
    try:
        data = ds.MindDataset([str(path)], columns_list=["input_ids", "sample_id"], shuffle=False)
        rows = 0
        for ids, sid in data.create_tuple_iterator(output_numpy=True, num_epochs=1):
            want = shard.first_sample + rows
            if int(sid) != want:
                return [f"{path}: row {rows} has sample_id {int(sid)}, expected {want}"]
            if ids.shape != (seq_length + 1,):
                return [f"{path}: sample {want} has shape {ids.shape}, expected ({seq_length + 1},)"]
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
                return [f"{path}: sample {want} has token ids outside [0, {vocab_size})"]
            rows += 1
    except RuntimeError as e:
        return [f"{path}: unreadable as MindRecord ({str(e).splitlines()[0]})"]
    if rows != shard.num_samples:
        return [f"{path}: {rows} rows, manifest says {shard.num_samples}"]
    return []


def _check_provenance(root: Path, m) -> list[str]:
    faults = []
    for name, split in m.splits.items():
        path = root / "provenance" / f"{name}.parquet"
        if not split.num_samples:
            continue
        if not path.is_file():
            faults.append(f"{path}: provenance missing")
            continue
        ids = arrow.to_numpy(arrow.read_parquet(path, columns=["sample_id"]).column("sample_id"))
        if ids.size and (ids.min() < 0 or ids.max() >= split.num_samples
                         or np.any(np.diff(ids) < 0)):
            faults.append(f"{path}: sample ids out of order or outside [0, {split.num_samples})")
    return faults
