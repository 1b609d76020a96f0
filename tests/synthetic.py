"""A small, real contract-1 dataset for loader and trainer tests, without running `dataprep build`.

Samples are learnable token patterns (arithmetic progressions modulo the vocabulary), written with
the same rolling MindRecord writer that dataprep uses, with a real manifest.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mspretrain.dataprep.write.shards import ShardWriter
from mspretrain.loader.manifest import (FORMAT_VERSION, Manifest, SplitInfo, TokenizerInfo, compute_fingerprint,
                             write_manifest)


def make_dataset(root, num_train: int = 256, num_valid: int = 32, seq_length: int = 32,
                 vocab_size: int = 128, seed: int = 0, max_shard_bytes: int = 1 << 20,
                 eos_rate: float = 0.0) -> Path:
    """eos_rate > 0: each token is replaced by EOS (id 2) with that probability, so samples hold
    several packed documents."""
    root = Path(root)
    rng = np.random.default_rng(seed)
    splits = {}
    for split, n in (("train", num_train), ("valid", num_valid)):
        start = rng.integers(3, vocab_size, size=(n, 1))
        step = rng.integers(1, 7, size=(n, 1))
        rows = ((start + step * np.arange(seq_length + 1)) % (vocab_size - 3) + 3).astype(np.int32)
        if eos_rate > 0:
            rows[rng.random(rows.shape) < eos_rate] = 2
        writer = ShardWriter(root, split, seq_length, max_shard_bytes)
        writer.write(rows)
        splits[split] = SplitInfo(n, n * (seq_length + 1), tuple(writer.close()))
    config = {"synthetic": True, "seed": seed, "vocab_size": vocab_size}
    if eos_rate > 0:
        config["eos_rate"] = eos_rate
    tok = TokenizerInfo(file="", sha256="", type="synthetic", vocab_size=vocab_size,
                        bos_id=1, eos_id=2, pad_id=0, unk_id=0)
    manifest = Manifest(format_version=FORMAT_VERSION,
                        fingerprint=compute_fingerprint(seq_length, "", splits, config),
                        seq_length=seq_length, tokenizer=tok, splits=splits, config=config)
    write_manifest(root, manifest)
    return root
