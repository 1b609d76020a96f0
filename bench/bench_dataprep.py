"""Benchmark of `dataprep build` on real text: throughput per stage and end to end, against plain
sentencepiece encoding of the same text with the same model, and peak memory as the corpus grows.

    .venv/bin/python bench/bench_dataprep.py [--mb 200] [--workers 2] [--work /tmp/bench-dataprep]

The corpus is the documentation installed on this machine (/usr/share/doc, then man pages with their
roff markup stripped), cut into documents of at most ~8 KB at blank lines and written as jsonl under
--work (not committed). The tokenizer (unigram, 16k) is trained once on the first 8 MB and given to
every build with --tokenizer, so the timed builds do what a pipeline cannot avoid (read, clean,
filter, dedup, tokenize, pack, write) and the reference is `sp.encode(texts, num_threads=1)` of the
same raw texts with the same model, measured in this run. Memory is the peak RSS of the whole build
process tree (main + workers), sampled every 50 ms. One-worker builds run at --mb / 4, / 2 and --mb,
so the marginal throughput between the smallest and largest (start-up costs cancel) and the growth of
peak memory per input MB can be read off; then --mb again with each of --workers.
With --tokenizer and fewer workers than cores, the build tokenizes and packs during stage 1 (the main
process, while it waits on the workers), so 'tokenize+write' times only the chunks left after it.

    .venv/bin/python bench/bench_dataprep.py --memory 16 64 256 [--dedup-memory-docs N]

prints the peak RSS of the main process, of the worker and of the tree for one-worker builds at each
input size, and its growth per input MB between sizes (the memory bound per worker).

The targets, printed last (--mb 64 --workers 1 is the configuration they are stated for): the local
engine end to end with the default config (language ID and PII redaction on) at >= 0.5 of the
reference's MB per CPU-second, and the whole pipeline (language ID, PII redaction and
decontamination against 200 passages of the corpus, 13-grams) at >= 0.4. Each target build runs
--repeat times, alternating with the reference (A B A B): the printed ratio is the median of the
pairs' ratios, with the load average, because other processes on a shared machine make single
figures noisy.

    .venv/bin/python bench/bench_dataprep.py --engine ray [--mb 64] [--cpus 1 2] [--reps 2] [--pin]

compares `--engine ray` (joining a local Ray instance of N CPUs that the benchmark starts, as a build
joins a running cluster, so Ray's ~5 s start-up is timed apart; work units of --mb / 16 MB) with
itself at 1 CPU and with the local
engine at the same number of workers, on the --mb corpus, and prints the driver's peak RSS (the
`dataprep build` process alone, not the Ray processes it starts) at --mb / 4 and --mb and its growth
per input MB. With --pin each build (the local one with its workers; the Ray instance with the build's
driver) runs on exactly N cores (CPU affinity), so both engines get the same CPUs.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
SOURCES = [Path("/usr/share/doc"), Path("/usr/share/man")]
DOC_BYTES = 8192
_ROFF = re.compile(r"\\f[BIRP]|\\\(.{2}|\\-|\\&|\\e")


def make_corpus(out: Path, mb: int) -> Path:
    """jsonl files holding `mb` MB of real documentation text (deterministic, sorted walk)."""
    done = out / "DONE"
    if done.is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    target, total, part, f = mb * 10**6, 0, 0, None
    for path in _files():
        text = _read_text(path)
        if not text:
            continue
        for k, doc in enumerate(_split_docs(text)):
            if f is None or f.tell() > 16 * 10**6:
                f and f.close()
                f = open(out / f"part-{part:03d}.jsonl", "w", encoding="utf-8")
                part += 1
            f.write(json.dumps({"id": f"{path}#{k}", "text": doc}, ensure_ascii=False) + "\n")
            total += len(doc.encode("utf-8"))
        if total >= target:
            break
    f and f.close()
    done.write_text(str(total))
    return out


def _files():
    for root in SOURCES:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                yield Path(dirpath) / name


def _read_text(path: Path) -> str:
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        if b"\0" in data[:4096]:
            return ""
        text = data.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile):
        return ""
    if "/man/" in str(path):
        text = "\n".join(_ROFF.sub("", ln) for ln in text.splitlines() if not ln.startswith((".", "'")))
    return text


def _split_docs(text: str):
    buf, size = [], 0
    for para in text.split("\n\n"):
        buf.append(para)
        size += len(para)
        if size >= DOC_BYTES:
            yield "\n\n".join(buf)
            buf, size = [], 0
    if buf and "".join(buf).strip():
        yield "\n\n".join(buf)


def load_texts(corpus: Path) -> list[str]:
    return [json.loads(line)["text"] for p in sorted(corpus.glob("*.jsonl")) for line in open(p)]


def largest_doc_mb(corpus: Path) -> float:
    """The longest document's UTF-8 size: its transient copies (reader, pickling to a worker,
    normalising) set a floor under the peak that does not scale with the corpus."""
    return max(len(json.loads(line)["text"].encode("utf-8"))
               for p in sorted(corpus.glob("*.jsonl")) for line in open(p)) / 1e6


def train_model(texts: list[str], work: Path) -> Path:
    import sentencepiece as spm
    model = work / "bench.model"
    if not model.is_file():
        sample, size = work / "sample.txt", 0
        with open(sample, "w", encoding="utf-8") as f:
            for t in texts:
                f.write(t + "\n")
                size += len(t)
                if size > 8 * 10**6:
                    break
        spm.SentencePieceTrainer.train(input=str(sample), model_prefix=str(work / "bench"),
                                       vocab_size=16000, model_type="unigram", num_threads=2,
                                       byte_fallback=True, minloglevel=2)
    return model


def encode_reference(texts: list[str], model: Path) -> float:
    """MB/s of plain `sp.encode(list, num_threads=1)` over the raw texts."""
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(model))
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(texts), 1000):
        sp.encode(texts[i:i + 1000], num_threads=1)
    return nbytes / 1e6 / (time.perf_counter() - t0), nbytes / 1e6 / (time.process_time() - c0)


def run_build(corpus: Path, out: Path, model: Path, workers: int, *extra: str) -> dict:
    """Wall time, CPU time of the whole process tree, peak tree RSS, peak RSS of the main (driver)
    process alone and the report of one build."""
    import shutil
    shutil.rmtree(out, ignore_errors=True)
    argv = [sys.executable, "-m", "mspretrain.dataprep", "build", str(corpus), "--out", str(out),
            "--tokenizer", str(model), "--workers", str(workers), "--no-progress", *extra]
    t0, c0 = time.perf_counter(), _children_cpu()
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    peak = [0, 0, 0]
    stop = threading.Event()
    threading.Thread(target=_sample_rss, args=(proc.pid, peak, stop), daemon=True).start()
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    stop.set()
    if proc.returncode:
        raise SystemExit(f"build failed: {stderr.decode()[-2000:]}")
    report = json.loads((out / "report.json").read_text())
    return {"wall": wall, "cpu": _children_cpu() - c0, "peak_rss": peak[0], "driver_rss": peak[1],
            "worker_rss": peak[2], "report": report}


def _children_cpu() -> float:
    """CPU seconds of finished children and their waited-for descendants (the pool workers)."""
    import resource
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _sample_rss(pid: int, peak: list, stop: threading.Event) -> None:
    try:
        root = psutil.Process(pid)
        while not stop.is_set():
            procs = [root] + root.children(recursive=True)
            rss = 0
            for p in procs:
                try:
                    one = p.memory_info().rss
                except psutil.Error:
                    continue
                rss += one
                if p.pid != pid:
                    peak[2] = max(peak[2], one)
            peak[0] = max(peak[0], rss)
            try:
                peak[1] = max(peak[1], root.memory_info().rss)
            except psutil.Error:
                pass
            time.sleep(0.05)
    except psutil.Error:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--workers", type=int, nargs="+", default=[2])
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench-dataprep"))
    ap.add_argument("--engine", choices=("local", "ray"), default="local")
    ap.add_argument("--cpus", type=int, nargs="+", default=[1, 2], help="--engine ray: CPU counts")
    ap.add_argument("--unit-mb", type=int, help="--engine ray: run.ray_unit_bytes in MB "
                    "(default: --mb / 16)")
    ap.add_argument("--reps", type=int, default=1, help="--engine ray: alternating repetitions")
    ap.add_argument("--pin", action="store_true",
                    help="--engine ray: run each build on exactly its CPU count of cores (affinity)")
    ap.add_argument("--memory", type=int, nargs="+", metavar="MB",
                    help="only the memory benchmark: one-worker builds at these input sizes")
    ap.add_argument("--dedup-memory-docs", type=int, help="--memory: run.dedup_memory_docs")
    ap.add_argument("--repeat", type=int, default=2,
                    help="local engine: runs of each target build (alternated with the reference)")
    ap.add_argument("--targets-only", action="store_true",
                    help="local engine: only the target builds at --mb (no size series)")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.memory:
        return bench_memory(args)
    if args.engine == "ray":
        return bench_ray(args)
    sizes = [args.mb // 4, args.mb // 2, args.mb]
    corpora = {mb: make_corpus(args.work / f"corpus-{mb}", mb) for mb in sizes}
    texts = load_texts(corpora[args.mb])
    model = train_model(texts, args.work)
    if args.targets_only:
        return bench_targets(args, corpora[args.mb], model, texts)
    ref, ref_cpu = reference(texts, model, args.mb)
    del texts
    print(f"{'input':>8} {'workers':>7} {'docs+dedup':>11} {'tokenize+write':>14} {'end-to-end':>11}"
          f" {'ratio':>6} {'MB/CPU-s':>8} {'cpu ratio':>9} {'peak RSS':>9}\n"
          f"{'':17}(stage and end-to-end figures: input MB/s per worker, wall clock; ratio = "
          f"end-to-end MB/s / reference MB/s; cpu ratio = MB per CPU-s of the whole build tree / "
          f"the reference's)")
    one = []
    for corpus, workers in [(corpora[mb], 1) for mb in sizes] + [(corpora[args.mb], w)
                                                                  for w in args.workers]:
        r = run_build(corpus, args.work / "out", model, workers)
        rep = r["report"]
        mb = rep["stages"]["read"]["bytes"] / 1e6
        t = rep["time_s"]
        per = lambda s: mb / s / workers                     # noqa: E731
        e2e = mb / r["wall"]
        print(f"{mb:7.1f}M {workers:7d} {per(t['docs'] + t['dedup']):11.2f} "
              f"{per(t['tokenize+write']):14.2f} {e2e / workers:11.2f} {e2e / ref:6.2f} "
              f"{mb / r['cpu']:8.2f} {mb / r['cpu'] / ref_cpu:9.2f} {r['peak_rss'] / 2**20:7.0f}MB")
        print(f"          stages s {t}, worker cpu s {rep['cpu_s']}, tree cpu {r['cpu']:.1f}s, "
              f"wall {r['wall']:.1f}s, docs {rep['stages']['read']['docs']} -> "
              f"{rep['stages']['dedup']['docs_out']}")
        if workers == 1:
            one.append((mb, r))
    (mb0, r0), (mb1, r1) = one[0], one[-1]
    wall, cpu = r1["wall"] - r0["wall"], r1["cpu"] - r0["cpu"]
    rss = (r1["peak_rss"] - r0["peak_rss"]) / 2**20 / (mb1 - mb0)
    print(f"marginal, 1 worker, {mb0:.0f} -> {mb1:.0f} MB (fixed start-up costs cancel): "
          f"{(mb1 - mb0) / wall:.2f} MB/s wall (ratio {(mb1 - mb0) / wall / ref:.2f}), "
          f"{(mb1 - mb0) / cpu:.2f} MB per CPU-s (cpu ratio {(mb1 - mb0) / cpu / ref_cpu:.2f}); "
          f"peak RSS grows {rss:.2f} MB per input MB -> about "
          f"{(r1['peak_rss'] / 2**20 + rss * (1000 - mb1)) / 1024:.2f} GiB at 1 GB; largest "
          f"document {largest_doc_mb(corpora[sizes[0]]):.1f} MB in the {sizes[0]} MB corpus, "
          f"{largest_doc_mb(corpora[args.mb]):.1f} MB in the {args.mb} MB one (filtered as too_long "
          f"or not, a long document's copies add to the peak: read the growth with that in mind)")
    bench_targets(args, corpora[args.mb], model, load_texts(corpora[args.mb]))


def write_eval_set(texts: list[str], work: Path, items: int = 200) -> Path:
    """An evaluation set for decontamination: `items` passages of 400 characters taken from every
    n-th document of 2,000 characters or more (so some documents do hold one, as a leaked
    benchmark would; a passage of a short document would be a few words that match anywhere)."""
    path = work / "eval.jsonl"
    long = [t for t in texts if len(t) >= 2000]
    step = max(1, len(long) // items)
    with open(path, "w", encoding="utf-8") as f:
        for t in long[::step][:items]:
            f.write(json.dumps({"text": t[1000:1400]}, ensure_ascii=False) + "\n")
    return path


def bench_targets(args, corpus: Path, model: Path, texts: list[str]) -> None:
    """The two end-to-end targets, one worker, each build alternated with the reference (A B A B):
    default config (language ID + PII redaction) >= 0.5, and with decontamination as well >= 0.4,
    of the reference's MB per CPU-second. Prints the median of the pairs' ratios."""
    evals = write_eval_set(texts, args.work)
    runs = [("default config (language ID + PII redact)", 0.5, ()),
            ("language ID + PII + decontamination", 0.4,
             ("--decontaminate", str(evals)))]
    ratios: dict[str, list[float]] = {label: [] for label, _, _ in runs}
    print(f"\ntargets: {corpus.name}, 1 worker, {args.repeat} pairs (reference, build) per target")
    for rep in range(args.repeat):
        for label, _, extra in runs:
            _, ref_cpu = encode_reference(texts, model)
            r = run_build(corpus, args.work / "out", model, 1, *extra)
            rep_ = r["report"]
            mb = rep_["stages"]["read"]["bytes"] / 1e6
            rate = mb / r["cpu"]
            ratios[label].append(rate / ref_cpu)
            print(f"  {label:52s} {rate:6.2f} MB per CPU-s, reference {ref_cpu:6.2f}: "
                  f"{rate / ref_cpu:5.2f}  (worker cpu s {rep_['cpu_s']}, tree cpu "
                  f"{r['cpu']:.1f}s, load average {os.getloadavg()[0]:.1f})")
    for label, target, _ in runs:
        got = statistics.median(ratios[label])
        print(f"TARGET {label}: end-to-end MB per CPU-s / sp.encode's = {got:.2f} (median of "
              f"{len(ratios[label])}; target >= {target}) {'MET' if got >= target else 'NOT MET'}")


def bench_memory(args) -> None:
    """Peak RSS of one-worker builds against input size: the main process, the worker, the tree.
    The main process's floor is MindSpore's import (the MindRecord writer), ~0.4 GB; per-record
    copies are bounded by input.max_record_bytes, the near-dedup index by run.dedup_memory_docs."""
    corpora = {mb: make_corpus(args.work / f"corpus-{mb}", mb) for mb in sorted(args.memory)}
    model = train_model(load_texts(corpora[min(corpora)]), args.work)
    extra = (("--set", f"run.dedup_memory_docs={args.dedup_memory_docs}")
             if args.dedup_memory_docs else ())
    print(f"peak RSS, one worker (load average now {os.getloadavg()[0]:.1f} on {os.cpu_count()} "
          f"cores){'  ' + ' '.join(extra) if extra else ''}")
    print(f"{'input':>8} {'docs':>7} {'kept':>7} {'main':>7} {'worker':>7} {'tree':>7} "
          f"{'largest doc':>11} {'wall':>6}")
    rows = []
    for mb, corpus in corpora.items():
        r = run_build(corpus, args.work / "out", model, 1, *extra)
        rep = r["report"]
        size = rep["stages"]["read"]["bytes"] / 1e6
        rows.append((size, r))
        print(f"{size:7.1f}M {rep['stages']['read']['docs']:7d} {rep['stages']['dedup']['docs_out']:7d} "
              f"{r['driver_rss'] / 2**20:6.0f}M {r['worker_rss'] / 2**20:6.0f}M "
              f"{r['peak_rss'] / 2**20:6.0f}M {largest_doc_mb(corpus):10.1f}M {r['wall']:5.0f}s")
    for (s0, r0), (s1, r1) in zip(rows, rows[1:]):
        per = {k: (r1[k] - r0[k]) / 2**20 / (s1 - s0) for k in ("driver_rss", "worker_rss", "peak_rss")}
        print(f"growth {s0:.0f} -> {s1:.0f} MB, MB per input MB: main {per['driver_rss']:.3f}, "
              f"worker {per['worker_rss']:.3f}, tree {per['peak_rss']:.3f}")


def reference(texts: list[str], model: Path, mb: int) -> tuple[float, float]:
    """The reference of every ratio, measured now and printed: (MB/s wall, MB per CPU-s)."""
    ref, ref_cpu = encode_reference(texts, model)
    print(f"reference: sp.encode(list, num_threads=1) on {mb} MB: {ref:.2f} MB/s wall, "
          f"{ref_cpu:.2f} MB per CPU-s   (load average now {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores)")
    return ref, ref_cpu


def bench_ray(args) -> None:
    """--engine ray at each of --cpus against itself at the fewest and the local engine, --reps
    times alternating (ray, local at each CPU count), medians. Each Ray build joins an instance this
    process started with N CPUs (as a build joins a running cluster): Ray's start-up, paid once per
    cluster, is timed apart and not in the build's wall time."""
    import statistics
    small, mb = args.mb // 4, args.mb
    corpora = {m: make_corpus(args.work / f"corpus-{m}", m) for m in (small, mb)}
    texts = load_texts(corpora[mb])
    model = train_model(texts, args.work)
    ref, ref_cpu = reference(texts, model, mb)
    del texts
    print(f"{'input':>8} {'engine':>6} {'cpus':>4} {'MB/s':>7} {'ratio':>6} {'driver RSS':>10} "
          f"{'MB/CPU-s':>8} {'load':>5}   (ratio = MB/s / reference MB/s; CPU-s: ray = the tasks' "
          f"CPU time, local = the process tree's)")
    runs: dict = {}
    for rep in range(args.reps):
        for cpus in args.cpus:
            sizes = [mb] + ([small] if rep == 0 and cpus == args.cpus[0] else [])
            with _pinned(cpus, args.pin), _ray_instance(cpus) as (address, start_s):
                for m in sizes:
                    runs.setdefault(("ray", cpus, m), []).append(
                        _one(corpora[m], args, model, ref, "ray", cpus, address))
            print(f"          (Ray start-up with {cpus} CPU(s): {start_s:.1f} s, not in the wall "
                  f"times)")
            with _pinned(cpus, args.pin):
                runs.setdefault(("local", cpus, mb), []).append(
                    _one(corpora[mb], args, model, ref, "local", cpus, None))
    lo, hi = args.cpus[0], args.cpus[-1]
    pairs = [a["mbps"] / b["mbps"] for a, b in zip(runs[("ray", hi, mb)], runs[("ray", lo, mb)])]
    print(f"ray {hi} CPUs / {lo} CPU: {statistics.median(pairs):.2f} median of {len(pairs)} "
          f"(pairs {', '.join(f'{p:.2f}' for p in pairs)}; target >= 1.6 for 2 / 1)")
    for c in args.cpus:
        rr, rl = runs[("ray", c, mb)], runs[("local", c, mb)]
        wall = [a["mbps"] / b["mbps"] for a, b in zip(rr, rl)]
        cpu = [a["mb_cpu"] / b["mb_cpu"] for a, b in zip(rr, rl)]
        print(f"ray / local at {c} CPU(s): {statistics.median(wall):.2f} wall (target >= 0.8; pairs "
              f"{', '.join(f'{p:.2f}' for p in wall)}), {statistics.median(cpu):.2f} in MB per CPU-s "
              f"(tasks only: no idle Ray processes)")
    r0, r1 = runs[("ray", lo, small)][0], runs[("ray", lo, mb)][0]
    print(f"driver peak RSS: {r0['driver_rss']:.0f} MB at {r0['size']:.0f} MB, "
          f"{r1['driver_rss']:.0f} MB at {r1['size']:.0f} MB input: "
          f"{(r1['driver_rss'] - r0['driver_rss']) / (r1['size'] - r0['size']):.3f} MB per input MB;"
          f" {r1['driver_rss'] / r1['size']:.2f} MB per input MB overall")


def _one(corpus: Path, args, model: Path, ref: float, engine: str, cpus: int,
         address: str | None) -> dict:
    """One build of the Ray benchmark, printed as a row."""
    # work units of mb/16 by default: enough of them to keep every CPU busy to the end of a stage
    unit = args.unit_mb or max(1, args.mb // 16)
    extra = ("--engine", "ray", "--ray-address", address,
             "--set", f"run.ray_unit_bytes={unit}MB") if engine == "ray" else ()
    load = os.getloadavg()[0]
    r = run_build(corpus, args.work / "out", model, cpus, *extra)
    rep = r["report"]
    size = rep["stages"]["read"]["bytes"] / 1e6
    # CPU seconds: the Ray tasks' own (the report's); the local engine's whole process tree
    cpu = sum(rep["executor"]["task_cpu_s"].values()) if engine == "ray" else r["cpu"]
    row = {"size": size, "mbps": size / r["wall"], "mb_cpu": size / cpu,
           "driver_rss": r["driver_rss"] / 2**20}
    print(f"{size:7.1f}M {engine:>6} {cpus:4d} {row['mbps']:7.2f} {row['mbps'] / ref:6.2f} "
          f"{row['driver_rss']:8.0f}MB {row['mb_cpu']:8.2f} {load:5.1f}   stages s {rep['time_s']}")
    if engine == "ray":
        ray_rep = rep["executor"]
        print(f"          partitions {ray_rep['partitions']}, units {ray_rep['units']}; stage wall s "
              f"{ray_rep['stage_s']}; task CPU s {ray_rep['task_cpu_s']}")
    return row


@contextlib.contextmanager
def _pinned(cpus: int, pin: bool):
    """With --pin, this process and everything it starts (the build and its workers, or the Ray
    instance with its raylet, workers and the build's driver) run on the first `cpus` cores, so "N
    CPUs" means N cores for both engines: a local build with one worker otherwise tokenizes on a
    second core, and Ray's driver and raylet run beside a 1-CPU worker."""
    if not pin:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(before)[:cpus])
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def _ray_instance(cpus: int):
    """A local Ray instance with `cpus` CPUs, on loopback, that the builds join: (address, start-up
    seconds). Stopped on exit (only the processes this call started)."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")   # before ray is imported
    import ray
    t0 = time.perf_counter()
    ctx = ray.init(address="local", num_cpus=cpus, _node_ip_address="127.0.0.1",
                   include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ctx.address_info["gcs_address"], time.perf_counter() - t0
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
