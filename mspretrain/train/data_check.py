"""Is this the dataset a run or a checkpoint expects? Checked at the start of `train launch` and
`train eval`, before any step.

Quick (always, milliseconds): the manifest loads and its fingerprint is the hash of what it records
(seq_length, tokenizer sha256, every shard's name, size in samples and checksums, the build config: a
hand edit shows); the tokenizer file has the sha256 the manifest records, and the vocabulary size and
special ids the manifest gives are the model's own; every shard of the splits in use and its .db
index exist, their sizes add up to what the manifest records, and each data file starts with a
readable MindRecord header whose sample width is seq_length + 1. The shards' own bytes are checked by
the loader, each shard when it is first read (mspretrain/loader/mindrecord.py). With a checkpoint: the dataset's identity (tokenizer sha256, vocabulary size,
sequence length) is the one the checkpoint was trained on (`identity`, recorded in its state.json and
in RUN/run.json). Full
(`--verify-data`): the sha256 of every shard, index and the tokenizer file, as `dataprep verify` does.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

from mspretrain.common.errors import MspretrainError
from mspretrain.loader.manifest import (ManifestError, compute_fingerprint, digest_faults, load_manifest,
                                        sha256_file, shard_faults)


class DataCheckError(MspretrainError, RuntimeError):
    """The dataset is damaged or is not the one expected; the message names the file and the fix."""


def identity(manifest_or_loader) -> dict:
    """What the weights of a run depend on in its dataset: the tokenizer and the sequence length. The
    one record of it, kept in every checkpoint's state.json and in RUN/run.json."""
    tok = manifest_or_loader.tokenizer
    return {"tokenizer_sha256": tok.sha256, "vocab_size": tok.vocab_size,
            "seq_length": manifest_or_loader.seq_length}


def check_identity(manifest, saved: dict, where) -> None:
    """The dataset of `manifest` has the tokenizer and sequence length of the `saved` identity (read
    from `where`); otherwise DataCheckError naming both and the fix."""
    mine = identity(manifest)
    if mine["seq_length"] != saved["seq_length"]:
        raise DataCheckError(
            f"{manifest.root}: seq_length {mine['seq_length']}, but the checkpoint was trained with "
            f"seq_length {saved['seq_length']} ({where}); use a dataset built with --seq-length "
            f"{saved['seq_length']}")
    if (mine["tokenizer_sha256"], mine["vocab_size"]) != (saved["tokenizer_sha256"], saved["vocab_size"]):
        tok = manifest.tokenizer
        raise DataCheckError(
            f"{manifest.root}: tokenizer {tok.file or tok.type} (sha256 {tok.sha256[:12]}, vocab "
            f"{tok.vocab_size}) is not the one the checkpoint was trained with (sha256 "
            f"{saved['tokenizer_sha256'][:12]}, vocab {saved['vocab_size']}, {where}): its token ids "
            f"mean other text. Use a dataset built with the checkpoint's tokenizer "
            f"(dataprep build --tokenizer MODEL).")


def check_dataset(path: str, splits: tuple[str, ...], full: bool = False):
    """The manifest, after the quick (or, with `full`, checksum) checks of `splits`; or DataCheckError."""
    root = Path(path)
    try:
        m = load_manifest(root)
    except ManifestError as e:
        raise DataCheckError(str(e)) from None
    faults = _manifest_faults(root, m)
    for name in splits:
        split = m.splits.get(name)
        for shard in split.shards if split else ():
            faults += _shard_faults(root, shard, m.seq_length, full)
    if faults:
        hint = "" if full else "; run `dataprep verify` on it for a full check"
        raise DataCheckError(f"dataset {root} is damaged: " + "; ".join(faults[:5])
                             + (f" (and {len(faults) - 5} more)" if len(faults) > 5 else "") + hint)
    return m


def _manifest_faults(root: Path, m) -> list[str]:
    """What the manifest vouches for and can be checked cheaply: its own fingerprint, the tokenizer."""
    where = root / "manifest.json"
    if compute_fingerprint(m.seq_length, m.tokenizer.sha256, m.splits, m.config) != m.fingerprint:
        return [f"{where}: its fingerprint is not the hash of its contents (seq_length, tokenizer, "
                f"shards or config were edited after the build)"]
    tok = m.tokenizer
    if not tok.file:
        return []           # no tokenizer file (a synthetic dataset): nothing to check it against
    path = root / tok.file
    if not path.is_file():
        return [f"{path}: tokenizer file missing (listed in {where})"]
    if sha256_file(path) != tok.sha256:
        return [f"{path}: sha256 differs from tokenizer.sha256 in {where} (replaced or damaged)"]
    return _tokenizer_id_faults(path, tok, where)


def _tokenizer_id_faults(path: Path, tok, where: Path) -> list[str]:
    """The manifest's vocab_size and special ids are those of the sentencepiece model itself."""
    import sentencepiece as spm
    try:
        sp = spm.SentencePieceProcessor(model_file=str(path))
    except (RuntimeError, OSError) as e:
        return [f"{path}: not a sentencepiece model ({e})"]
    pad = sp.pad_id() if sp.pad_id() >= 0 else sp.eos_id()      # what dataprep records
    model = {"vocab_size": sp.get_piece_size(), "bos_id": sp.bos_id(), "eos_id": sp.eos_id(),
             "pad_id": pad, "unk_id": sp.unk_id()}
    return [f"{where}: tokenizer.{key} is {getattr(tok, key)!r}, but {path.name} has {value}"
            for key, value in model.items() if getattr(tok, key) != value]


def _shard_faults(root: Path, shard, seq_length: int, full: bool) -> list[str]:
    faults = shard_faults(root, shard, digests=False)
    if faults:
        return faults
    header = _header_fault(root / shard.file, seq_length)
    if header:
        return [header]
    return digest_faults(root / shard.file, shard.sha256, shard.db_sha256) if full else []


def _header_fault(data: Path, seq_length: int) -> str | None:
    """A MindRecord data file starts with the length of its JSON header, then the header, whose
    schema gives input_ids seq_length + 1 tokens."""
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
    try:
        shape = header["schema"][0]["schema"]["input_ids"]["shape"]
    except (KeyError, IndexError, TypeError):
        return f"{data}: its MindRecord header has no input_ids field"
    if shape != [seq_length + 1]:
        return f"{data}: rows of {shape} tokens, the manifest's seq_length {seq_length} needs [{seq_length + 1}]"
    return None
