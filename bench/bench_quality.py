"""Benchmark of the document stages (language ID, PII, decontamination, quality classifier) on real
text, per CPU-second, against plain sentencepiece encoding of the same text measured in the same
run; the language-ID library choice; and our MinHash signatures against datasketch's.

    .venv/bin/python bench/bench_quality.py [--mb 4]

The corpus: manual pages in every language installed under /usr/share/man (roff stripped) and
English ones, cut to at most 4 KB each, about --mb MB. The evaluation set for decontamination is
200 passages of other pages. The quality model is trained on half of the English pages against
Debian changelogs. The sentencepiece model (unigram 8k) is trained on the corpus once, untimed.
Rates are MB of document text per CPU-second of this process (time.process_time).
"""
from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "dataprep")]

from mspretrain.dataprep.steps.clean import normalize  # noqa: E402
from mspretrain.dataprep.steps.decontam import DecontamConfig, EvalIndex, cut  # noqa: E402
from mspretrain.dataprep.dedup.detect import DedupConfig, signatures  # noqa: E402
from mspretrain.dataprep.steps.filters import FilterConfig, quality_reason  # noqa: E402
from mspretrain.dataprep.steps.langid import identify, window  # noqa: E402
from mspretrain.dataprep.steps.pii import PiiConfig, redact  # noqa: E402
from mspretrain.dataprep.steps.quality import QualityFilterConfig, train  # noqa: E402
from mspretrain.dataprep.plan.worker import WorkerSetup, pipeline_for  # noqa: E402
from real_text import man_languages, man_texts  # noqa: E402

_CODE = {"zh_CN": "zh", "zh_TW": "zh", "pt_BR": "pt"}


def corpus(mb: float) -> list[tuple[str, str]]:
    """(language, raw text) of manual pages until about `mb` MB."""
    docs, size = [], 0
    langs = man_languages() + ["en"] * 4
    per = 400
    for seed in range(4):
        for lang in langs:
            for _, text in man_texts(lang, per // len(langs) + 1, min_chars=300, seed=seed):
                docs.append((_CODE.get(lang, lang), text))
                size += len(text.encode())
            if size >= mb * 1e6:
                return docs
    return docs


def rate(fn, texts: list[str]) -> tuple[float, float]:
    """(MB per CPU-second, CPU seconds) of fn over every text."""
    nbytes = sum(len(t.encode()) for t in texts)
    t0 = time.process_time()
    for t in texts:
        fn(t)
    cpu = time.process_time() - t0
    return nbytes / 1e6 / cpu, cpu


def langid_choice(texts: list[tuple[str, str]]) -> None:
    """dataprep.langid (CLD2) against py3langid and lingua, where installed, on the same windows."""
    heads = [(lang, window(t)) for lang, t in texts]
    nbytes = sum(len(h.encode()) for _, h in heads) / 1e6

    def report(name: str, detect) -> None:
        t0 = time.process_time()
        got = [detect(h) for _, h in heads]
        cpu = time.process_time() - t0
        acc = sum(g == lang for g, (lang, _) in zip(got, heads)) / len(heads)
        print(f"langid  {name:58s} {nbytes / cpu:6.2f} MB/CPU-s, agreement with the "
              f"directory's language {acc:.3f}")

    report(f"dataprep.langid (pycld2 {importlib.metadata.version('pycld2')})",
           lambda h: identify(h)[0])
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
        li = LanguageIdentifier.from_pickled_model(MODEL_FILE, norm_probs=True)
        report(f"py3langid {importlib.metadata.version('py3langid')}", lambda h: li.classify(h)[0])
    except ImportError:
        print("langid  py3langid: not installed")
    try:
        from lingua import LanguageDetectorBuilder
    except ImportError:
        print("langid  lingua-language-detector: not installed")
        return
    version = importlib.metadata.version("lingua-language-detector")
    detector = LanguageDetectorBuilder.from_all_languages().with_low_accuracy_mode().build()

    def lingua(h: str) -> str:
        lang = detector.detect_language_of(h)
        return lang.iso_code_639_1.name.lower() if lang else "und"
    report(f"lingua {version} (low accuracy mode)", lingua)


def minhash_choice(texts: list[str]) -> None:
    """Our signatures against datasketch's MinHash.bulk over the same character 5-gram shingles."""
    cfg = DedupConfig()
    nbytes = sum(len(t.encode()) for t in texts) / 1e6
    t0 = time.process_time()
    signatures(texts, cfg)
    ours = nbytes / (time.process_time() - t0)
    print(f"minhash dataprep.dedup.signatures ({cfg.num_perm} bins): {ours:6.2f} MB/CPU-s")
    try:
        import datasketch
    except ImportError:
        print("minhash datasketch: not installed (it is a test extra)")
        return
    from neardup_eval import shingle_set
    t0 = time.process_time()
    sets = [[s.encode("utf-8", "surrogatepass") for s in shingle_set(t, 5)] for t in texts]
    datasketch.MinHash.bulk(sets, num_perm=cfg.num_perm)
    theirs = nbytes / (time.process_time() - t0)
    print(f"minhash datasketch {datasketch.__version__} MinHash.bulk, shingling included: "
          f"{theirs:6.2f} MB/CPU-s ({ours / theirs:.1f}x slower than ours)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=4.0)
    args = ap.parse_args()
    docs = corpus(args.mb)
    raw = [t for _, t in docs]
    texts = [normalize(t) for t in raw]
    print(f"corpus: {len(texts)} documents, {sum(len(t.encode()) for t in texts) / 1e6:.1f} MB, "
          f"{len(set(lang for lang, _ in docs))} languages")
    rng = random.Random(0)
    passages = [t[200:600] for _, t in man_texts("en", 200, seed=99)]
    index = EvalIndex([(f"eval:{i}", p) for i, p in enumerate(passages)], 13)
    good = [t for _, t in man_texts("en", 150, seed=7)]
    changelogs = sorted(Path("/usr/share/doc").glob("*/changelog.Debian.gz"))[:150]
    bad = [normalize(gzip.decompress(p.read_bytes()).decode("utf-8", "replace"))[:4000]
           for p in changelogs]
    t0 = time.process_time()
    model = train(good, bad)
    print(f"quality train: {len(good)} + {len(bad)} documents in "
          f"{time.process_time() - t0:.1f} CPU-s")

    import sentencepiece as spm
    with tempfile.TemporaryDirectory() as tmp:
        sample = Path(tmp) / "sample.txt"
        sample.write_text("\n".join(texts))
        spm.SentencePieceTrainer.train(input=str(sample), model_prefix=f"{tmp}/sp", vocab_size=8000,
                                       model_type="unigram", character_coverage=0.9995,
                                       byte_fallback=True, num_threads=1, minloglevel=2,
                                       input_sentence_size=200000, shuffle_input_sentence=True)
        sp = spm.SentencePieceProcessor(model_file=f"{tmp}/sp.model")
        model_path = Path(tmp) / "q.bin"
        model.save(model_path)
        sp_rate, _ = rate(sp.encode, texts)
        print(f"\nreference: sentencepiece encode (unigram 8k, one thread): {sp_rate:6.2f} MB/CPU-s\n")
        fcfg = FilterConfig()
        stages = [
            ("normalize", normalize, raw),
            ("quality filters (heuristic)", lambda t: quality_reason(t, fcfg), texts),
            ("language ID", identify, texts),
            ("PII (redact)", redact, texts),
            ("decontamination (200 items, 13-grams)", lambda t: cut(t, index.find(t)[1]), texts),
            ("quality classifier (score)", model.score, texts),
            ("MinHash signature (256)", lambda t: signatures([t], DedupConfig()), texts),
        ]
        for name, fn, data in stages:
            r, _ = rate(fn, data)
            print(f"stage   {name:40s} {r:7.2f} MB/CPU-s  ({r / sp_rate:5.2f} x sentencepiece)")
        evals = Path(tmp) / "eval.jsonl"
        import json
        evals.write_text("".join(json.dumps({"text": p}) + "\n" for p in passages))
        r, _ = rate(lambda t: quality_reason(normalize(t), fcfg), raw)
        def plain_with_minhash(t: str) -> None:
            clean = normalize(t)
            if quality_reason(clean, fcfg) is None:
                signatures([clean], DedupConfig())
        both, _ = rate(plain_with_minhash, raw)
        print(f"doc     {'without the new stages':40s} {r:7.2f} MB/CPU-s  ({r / sp_rate:5.2f} x "
              f"sentencepiece); with MinHash {both:6.2f} ({both / sp_rate:4.2f} x)")
        for label, setup in (
            ("language ID + PII + decontamination", WorkerSetup(
                "", "", fcfg, DedupConfig(), 0, 0, PiiConfig("redact"),
                DecontamConfig(files=(str(evals),), action="cut"))),
            ("... + quality classifier", WorkerSetup(
                "", "", FilterConfig(quality=QualityFilterConfig(str(model_path), 0.0)),
                DedupConfig(), 0, 0, PiiConfig("redact"),
                DecontamConfig(files=(str(evals),), action="cut"))),
        ):
            pipe = pipeline_for(setup)
            r, _ = rate(pipe.process, raw)
            def with_minhash(t: str, pipe=pipe) -> None:
                clean, reason, _ = pipe.process(t)
                if not reason:
                    signatures([clean], DedupConfig())
            both, _ = rate(with_minhash, raw)
            print(f"doc     {label:40s} {r:7.2f} MB/CPU-s  ({r / sp_rate:5.2f} x sentencepiece); "
                  f"with MinHash {both:6.2f} ({both / sp_rate:4.2f} x)")
        target_ratio(sp, texts, raw, WorkerSetup(
            "", "", fcfg, DedupConfig(), 0, 0, PiiConfig("redact"),
            DecontamConfig(files=(str(evals),), action="cut")))
    print()
    langid_choice(docs)
    minhash_choice(texts[:400])


def target_ratio(sp, texts: list[str], raw: list[str], setup: WorkerSetup, pairs: int = 3) -> None:
    """The per-document stage with language ID, PII redaction and decontamination on, against
    sentencepiece encoding, alternated (A B A B) `pairs` times: the median of the pairs' ratios."""
    ratios = []
    pipe = pipeline_for(setup)
    for _ in range(pairs):
        ref, _ = rate(sp.encode, texts)
        got, _ = rate(pipe.process, raw)
        ratios.append(got / ref)
    import os
    import statistics
    median = statistics.median(ratios)
    print(f"TARGET whole per-document stage (normalize, filters, language ID, PII, "
          f"decontamination) / sentencepiece encode, per CPU-s: {median:.2f} (median of {pairs} "
          f"pairs {', '.join(f'{r:.2f}' for r in ratios)}; target >= 0.4) "
          f"{'MET' if median >= 0.4 else 'NOT MET'}  (load average {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
