"""A dataset with a planted garbage window: easy rows (token i+1 follows token i) everywhere except
the samples the loader serves at the chosen steps, which are uniform random tokens."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from mspretrain.dataprep.write.shards import ShardWriter
from mspretrain.loader.manifest import (FORMAT_VERSION, Manifest, SplitInfo, TokenizerInfo, compute_fingerprint,
                                        write_manifest)

SEQ, VOCAB = 32, 128


def _write(root: Path, rows: dict, seed: int, garbage: tuple) -> Path:
    splits = {}
    for split, r in rows.items():
        writer = ShardWriter(root, split, SEQ, 1 << 20)
        writer.write(r)
        splits[split] = SplitInfo(len(r), r.size, tuple(writer.close()))
    config = {"synthetic": "spike", "seed": seed, "garbage_steps": list(garbage)}
    tok = TokenizerInfo(file="", sha256="", type="synthetic", vocab_size=VOCAB, bos_id=1, eos_id=2,
                        pad_id=0, unk_id=0)
    write_manifest(root, Manifest(format_version=FORMAT_VERSION,
                                  fingerprint=compute_fingerprint(SEQ, "", splits, config), seq_length=SEQ,
                                  tokenizer=tok, splits=splits, config=config))
    return root


def garbage_dataset(root, steps: tuple[int, int], batch: int = 8, seed: int = 1234,
                    num_train: int = 512) -> Path:
    """`steps` (first, last), 1-based, of a run with global batch `batch` and loader seed `seed`."""
    from mspretrain.loader import Loader

    root = Path(root)
    rng = np.random.default_rng(7)
    rows = {}
    for split, n in (("train", num_train), ("valid", 32)):
        start = rng.integers(0, VOCAB - 3, size=(n, 1))
        rows[split] = ((start + np.arange(SEQ + 1)) % (VOCAB - 3) + 3).astype(np.int32)
    clean = _write(root.with_name(root.name + "-clean"), rows, seed, steps)
    with Loader(clean, split="train", global_batch_size=batch, seed=seed, num_workers=0) as ld:
        for step in range(steps[0], steps[1] + 1):
            cursor = (step - 1) * batch
            _, ids = ld._maker.order.locate(ld.batch_positions(cursor))
            rows["train"][np.asarray(ids)] = rng.integers(3, VOCAB, size=(len(ids), SEQ + 1))
    return _write(root, rows, seed, steps)
