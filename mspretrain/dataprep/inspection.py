"""`dataprep inspect DIR [--sample I] [--split S]`: a manifest summary and one sample decoded back to
text, with the documents it came from (from provenance/<split>.parquet)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from mspretrain.loader.manifest import load_manifest


def read_sample(path: Path, row: int) -> tuple[np.ndarray, int]:
    """(input_ids, sample_id) of one row of one shard, by O(1) random access."""
    import mindspore.dataset as ds
    data = ds.MindDataset([str(path)], columns_list=["input_ids", "sample_id"],
                          sampler=ds.SubsetSampler([row]))
    for ids, sid in data.create_tuple_iterator(output_numpy=True, num_epochs=1):
        return ids, int(sid)
    raise IndexError(f"{path}: no row {row}")


def summary(m) -> list[str]:
    t = m.tokenizer
    lines = [f"dataset   {m.root}", f"fingerprint {m.fingerprint}",
             f"seq_length {m.seq_length} (samples of {m.seq_length + 1} tokens)",
             f"tokenizer {t.file}: {t.type}, vocab {t.vocab_size}, bos {t.bos_id} eos {t.eos_id} "
             f"pad {t.pad_id} unk {t.unk_id}"]
    for name, sp in m.splits.items():
        size = sum(s.bytes for s in sp.shards)
        lines.append(f"split {name}: {sp.num_samples} samples, {sp.num_tokens} tokens, "
                     f"{len(sp.shards)} shard(s), {size} bytes")
    inputs = m.config.get("inputs", [])
    lines.append(f"built from {len(inputs)} input file(s), "
                 f"{sum(i['bytes'] for i in inputs)} bytes; versions {m.versions}")
    return lines


def inspect_dataset(root: str | os.PathLike, sample: int = 0, split: str = "train") -> str:
    m = load_manifest(root)
    lines = summary(m)
    info = m.split(split)
    k, row = info.locate(sample)
    ids, sid = read_sample(m.shard_path(info.shards[k]), row)
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(Path(root) / m.tokenizer.file))
    lines += ["", f"sample {sid} of {split} ({info.shards[k].file}, row {row}): {ids.size} tokens",
              "---", _decode(sp, ids.tolist(), m.tokenizer.eos_id), "---", "documents:"]
    prov = Path(root) / "provenance" / f"{split}.parquet"
    table = pq.read_table(prov, filters=[("sample_id", "==", sid)])
    table = table.sort_by("sample_offset") if table.num_rows else table
    for r in table.to_pylist():
        piece = ids[r["sample_offset"]:r["sample_offset"] + r["length"]].tolist()
        preview = _decode(sp, piece, m.tokenizer.eos_id).replace("\n", " ")
        lines.append(f"  {r['doc_id']}: tokens {r['doc_offset']}..{r['doc_offset'] + r['length']} "
                     f"of the document at sample offset {r['sample_offset']}: "
                     f"{preview[:80]}{'...' if len(preview) > 80 else ''}")
    return "\n".join(lines)


def _decode(sp, ids: list[int], eos: int) -> str:
    """Text with every EOS shown as <eos>."""
    parts, cur = [], []
    for t in ids:
        if t == eos:
            parts.append(sp.decode(cur) + "<eos>")
            cur = []
        else:
            cur.append(t)
    parts.append(sp.decode(cur))
    return "".join(parts)
