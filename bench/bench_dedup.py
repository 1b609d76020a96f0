"""Throughput of the document-level dataprep stages on real text, and near-dedup quality.

    .venv/bin/python bench/bench_dedup.py [--mb 30] [--quality] [--quality-full]

Reads up to --mb MB of real text (documentation and manual pages installed under /usr/share), one
document per file (--unit paragraph: per paragraph) with dataprep.readers, and prints, per stage, input MB per CPU-second
in this one process: read, normalize, quality filters, exact key, signatures, NearDedup.add_many.
As a reference measured in the same run it trains a small sentencepiece model on a sample and encodes
the same text with one thread, and prints the ratio of (stages + encoding) to encoding alone.
--quality prints precision/recall (overall and per language, at 0.8 and 0.9, with and without the
exact verification of pairs near the threshold) on the committed labelled set; --quality-full on
the larger one built from this machine (tests/dataprep/neardup_eval.py, a few minutes).
"""
from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import sentencepiece as spm

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "dataprep")]

from mspretrain.dataprep.steps.clean import normalize  # noqa: E402
from mspretrain.dataprep.dedup.detect import DedupConfig, NearDedup, exact_key, signatures  # noqa: E402
from mspretrain.dataprep.steps.filters import FilterConfig, quality_reason  # noqa: E402
from mspretrain.dataprep.readers import Document, list_inputs, read_file  # noqa: E402

SOURCES = ["/usr/share/doc", "/usr/share/man/man1", "/usr/share/man/man3", "/usr/share/man/zh_CN"]


def timed(fn):
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def read_corpus(limit_bytes: int, unit: str = "paragraph") -> list[str]:
    texts, size = [], 0
    for inp in list_inputs([p for p in SOURCES if Path(p).exists()]):
        for rec in read_file(inp, text_unit=unit):
            if isinstance(rec, Document):
                texts.append(rec.text)
                size += len(rec.text.encode())
        if size >= limit_bytes:
            break
    return texts


def spm_reference(texts: list[str]) -> float:
    """CPU seconds to encode `texts` with a small unigram model trained on a sample of them."""
    sample = "\n".join(texts[::10])
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(sample.splitlines()),
                                   model_writer=model, vocab_size=8000, model_type="unigram",
                                   character_coverage=0.9995, byte_fallback=True,
                                   num_threads=1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    _, seconds = timed(lambda: sp.encode(texts, num_threads=1))
    return seconds


def throughput(args) -> None:
    (texts, t_read) = timed(lambda: read_corpus(int(args.mb * 1e6), args.unit))
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(f"corpus: {len(texts)} documents, {mb:.1f} MB, mean {mb * 1e6 / len(texts):.0f} bytes")
    clean, t_norm = timed(lambda: [normalize(t) for t in texts])
    fcfg, dcfg = FilterConfig(), DedupConfig()
    reasons, t_filter = timed(lambda: [quality_reason(t, fcfg) for t in clean])
    _, t_exact = timed(lambda: [exact_key(t) for t in clean])
    sigs, t_sig = timed(lambda: signatures(clean, dcfg))
    nd = NearDedup(dcfg)

    def add_all():
        keys = [str(i) for i in range(len(clean))]
        return [r for i in range(0, len(keys), 1000)
                for r in nd.add_many(keys[i:i + 1000], sigs[i:i + 1000])]
    dups, t_add = timed(add_all)
    t_spm = spm_reference(clean)
    stages = [("read", t_read), ("normalize", t_norm), ("filters", t_filter), ("exact_key", t_exact),
              ("signatures", t_sig), ("near_add_many", t_add), ("spm_encode (ref)", t_spm)]
    for name, seconds in stages:
        print(f"{name:18s} {mb / seconds:8.1f} MB/CPU-s   ({seconds:.2f} s)")
    mine = t_norm + t_filter + t_exact + t_sig + t_add
    print(f"my stages together  {mb / mine:8.1f} MB/CPU-s")
    print(f"ratio (spm encode alone) / (my stages + spm encode) = {t_spm / (mine + t_spm):.2f}")
    rejected = sum(r is not None for r in reasons)
    print(f"filtered {rejected / len(texts):.1%}, near duplicates {sum(d is not None for d in dups)}"
          f" of {len(texts)}; index {nd.nbytes() / max(1, len(nd)):.0f} bytes per kept document")


def quality(full: bool) -> None:
    import neardup_eval
    if full:
        docs = neardup_eval.build(full=True)
    else:
        docs = neardup_eval.load(ROOT / "tests" / "dataprep" / "data" / "neardup.jsonl.zst")
    for threshold in (0.8, 0.9):
        for verify in (False, True):
            result = neardup_eval.evaluate(docs, DedupConfig(threshold=threshold), verify)
            print(f"threshold={threshold} exact verification={verify}: {result}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=30.0)
    ap.add_argument("--unit", choices=["file", "paragraph"], default="file",
                    help="one document per file or per blank-line separated paragraph")
    ap.add_argument("--quality", action="store_true")
    ap.add_argument("--quality-full", action="store_true")
    args = ap.parse_args()
    throughput(args)
    if args.quality or args.quality_full:
        quality(args.quality_full)


if __name__ == "__main__":
    main()
