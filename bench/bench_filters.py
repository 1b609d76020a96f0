"""Benchmark of every per-document fast path against the plain definition it must equal (the
oracle its tests compare it with), on the corpus of bench_quality.py (manual pages in every installed
language), per CPU-second, alternated (A B A B) in one process; and what each fast path is worth:
the per-document stage's rate against sentencepiece encoding with the fast path and with the
definition in its place (the target is >= 0.4).

    .venv/bin/python bench/bench_filters.py [--mb 4] [--pairs 5]

Fast paths and their definitions: the heuristic quality filters (tests/dataprep/filters_reference.py),
normalize (tests/dataprep/clean_reference.py), whitespace squeezing (one split and join per line),
PII redaction searched only where a match can be (`pii.plain_redact`, every kind over the whole text),
the decontamination index (the regex-unit reference of test_decontam_reference.py, on 200 passages
of the corpus) and MinHash signatures (the shingle-by-shingle reference of
test_minhash_reference.py, on --minhash-docs documents: it is slow).

The reference filters are tests/dataprep/filters_reference.py (the implementation before the
numpy fast path); the reference normalize is tests/dataprep/clean_reference.py (every step on
every text, whitespace squeezed line by line); the reference squeeze is one split and join per
line. Both sides decide every document and give every text identically (checked here once more
before timing). The per-character tables of both
are built before timing: the figures are the steady state of a worker.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench"), str(REPO / "tests" / "dataprep")]

import clean_reference  # noqa: E402
import filters_reference  # noqa: E402
from bench_quality import corpus  # noqa: E402
from test_decontam_reference import Reference as DecontamReference  # noqa: E402
from test_minhash_reference import reference as minhash_reference  # noqa: E402
from mspretrain.dataprep.dedup.detect import DedupConfig, signatures  # noqa: E402
from mspretrain.dataprep.steps import pii  # noqa: E402
from mspretrain.dataprep.steps.clean import normalize, squeeze_whitespace  # noqa: E402
from mspretrain.dataprep.steps.decontam import EvalIndex  # noqa: E402
from mspretrain.dataprep.steps.filters import FilterConfig, quality_reason  # noqa: E402


def per_cpu_second(fn, texts: list[str], nbytes: float) -> float:
    t0 = time.process_time()
    for t in texts:
        fn(t)
    return nbytes / (time.process_time() - t0)


def compare(name: str, new, old, texts: list[str], pairs: int) -> float:
    """Prints both rates and their ratio; returns the CPU seconds per MB the fast path saves."""
    nbytes = sum(len(t.encode()) for t in texts) / 1e6
    rates = [(per_cpu_second(old, texts, nbytes), per_cpu_second(new, texts, nbytes))
             for _ in range(pairs)]
    ratios = [n / o for o, n in rates]
    old_rate, new_rate = (statistics.median(r[i] for r in rates) for i in (0, 1))
    print(f"{name:28s} definition {old_rate:6.1f} MB/CPU-s, fast path {new_rate:6.1f}: "
          f"{statistics.median(ratios):.2f}x (pairs {', '.join(f'{r:.2f}' for r in ratios)}; "
          f"load average {os.getloadavg()[0]:.1f})")
    return 1 / old_rate - 1 / new_rate


def old_squeeze(text: str) -> str:
    return "\n".join([" ".join(line.split()) for line in text.splitlines()])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--minhash-docs", type=int, default=100)
    args = ap.parse_args()
    raw = [t for _, t in corpus(args.mb)]
    texts = [normalize(t) for t in raw]
    cfg, dedup = FilterConfig(), DedupConfig()
    items = [(f"e{i}", t[:600]) for i, t in enumerate(texts[::max(1, len(texts) // 200)][:200])]
    index, index_ref = EvalIndex(items, 13), DecontamReference(items, 13)
    few = texts[:args.minhash_docs]
    # each fast path gives what its definition gives (as its tests check), here once more
    assert [quality_reason(t, cfg) for t in texts] == [
        filters_reference.quality_reason(t, cfg) for t in texts]
    assert all(squeeze_whitespace(t) == old_squeeze(t) for t in raw)
    assert texts == [clean_reference.normalize(t) for t in raw]
    assert all(pii.redact(t) == pii.plain_redact(t) for t in texts)
    assert all(index.find(t) == index_ref.find(t) for t in texts)
    assert (signatures(few, dedup) == [minhash_reference(t, dedup) for t in few]).all()
    mb = sum(len(t.encode()) for t in texts) / 1e6
    print(f"corpus: {len(texts)} documents, {mb:.1f} MB")
    saved = {
        "quality filters (heuristic)": compare(
            "quality filters (heuristic)", lambda t: quality_reason(t, cfg),
            lambda t: filters_reference.quality_reason(t, cfg), texts, args.pairs),
        "normalize (raw)": compare("normalize (raw)", normalize, clean_reference.normalize, raw,
                                   args.pairs),
        "squeeze whitespace (raw)": compare("squeeze whitespace (raw)", squeeze_whitespace,
                                            old_squeeze, raw, args.pairs),
        "PII, searched where needed": compare("PII, searched where needed", pii.redact,
                                              pii.plain_redact, texts, args.pairs),
        "decontamination index": compare("decontamination index", index.find, index_ref.find,
                                         texts, args.pairs),
        "MinHash signatures": compare("MinHash signatures", lambda t: signatures([t], dedup),
                                      lambda t: minhash_reference(t, dedup), few, 1),
    }
    worth(raw, saved, args.pairs)


def worth(raw: list[str], saved: dict[str, float], pairs: int) -> None:
    """The per-document stage of the default build (every default step, then MinHash) against
    sentencepiece encoding, as it is and with each fast path replaced by its definition (its
    measured cost per MB added): a fast path stays where the definition would miss the target."""
    import tempfile

    import sentencepiece as spm
    from mspretrain.dataprep.config import BuildConfig
    from mspretrain.dataprep.steps.pipeline import Pipeline, build_steps
    b = BuildConfig()
    pipe = Pipeline(build_steps(b.filters, b.decontam, b.pii), key_of=lambda t: b"")
    with tempfile.TemporaryDirectory() as tmp:   # bench_quality.py's model: unigram 8k
        (Path(tmp) / "sample.txt").write_text("\n".join(raw))
        spm.SentencePieceTrainer.train(input=f"{tmp}/sample.txt", model_prefix=f"{tmp}/sp",
                                       vocab_size=8000, model_type="unigram",
                                       character_coverage=0.9995, byte_fallback=True, num_threads=1,
                                       minloglevel=2, input_sentence_size=200000,
                                       shuffle_input_sentence=True)
        sp = spm.SentencePieceProcessor(model_file=f"{tmp}/sp.model")
    nbytes = sum(len(t.encode()) for t in raw) / 1e6
    pairs_ = [(per_cpu_second(sp.encode, raw, nbytes),
               nbytes / (_cpu(lambda: [pipe.process(t) for t in raw])
                         + _cpu(lambda: signatures(raw, b.dedup)))) for _ in range(pairs)]
    sp_rate, stage = (statistics.median(p[i] for p in pairs_) for i in (0, 1))
    print(f"\nper-document stage (default steps + MinHash) {stage:.2f} MB/CPU-s, sentencepiece "
          f"{sp_rate:.2f}: {stage / sp_rate:.2f} (target >= 0.4)")
    for name, extra in saved.items():
        ratio = 1 / (1 / stage + extra) / sp_rate
        print(f"  with the definition of {name:28s} {ratio:.2f}  "
              f"{'keep the fast path' if ratio < 0.4 else 'the definition would do'}")


def _cpu(fn) -> float:
    t0 = time.process_time()
    fn()
    return time.process_time() - t0


if __name__ == "__main__":
    main()
