"""report.json and report.md: what every stage took in and let out, and why.

Counts come from the per-chunk markers in the work dir, so a resumed build reports the whole corpus.
Timings (`time_s`, `cpu_s`) and worker pids describe the run that finished the build; they are why
report.* is excluded from the byte-determinism promise (every other file in DIR is covered).
Bytes are UTF-8 bytes of document text: raw as read, then after cleaning.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mspretrain.dataprep.errors import id_conflicts, id_warnings
from mspretrain.dataprep.steps.pipeline import Pipeline
from mspretrain.dataprep.report import plots
from mspretrain.dataprep.report.per_file import per_file_counts
from mspretrain.common.files import atomic_write_bytes, atomic_write_json


def length_bins(doc_tokens: np.ndarray) -> np.ndarray:
    """Documents per power-of-two bin (bin k: lengths 2**k .. 2**(k+1) - 1; 0 and 1 in bin 0)."""
    return np.bincount(np.floor(np.log2(np.maximum(doc_tokens, 1))).astype(int))


def add_bins(total: np.ndarray, bins: np.ndarray) -> np.ndarray:
    """Two length_bins counts summed (the longer one's length)."""
    out = np.zeros(max(len(total), len(bins)), np.int64)
    out[:len(total)] += total
    out[:len(bins)] += bins
    return out


def _summed(bins: list) -> np.ndarray:
    """Several length_bins counts (lists) summed."""
    total = np.zeros(0, np.int64)
    for b in bins:
        total = add_bins(total, np.asarray(b, np.int64))
    return total


def histogram_of_bins(bins) -> dict:
    """Documents per power-of-two token-length bin, from (summed) length_bins: {"<=1": n, "2-3": n, ...}."""
    out = {}
    for k, n in enumerate(bins.tolist()):
        if n:
            out["<=1" if k == 0 else f"{1 << k}-{(1 << (k + 1)) - 1}"] = n
    return out


def build_report(work, cfg, plan, manifest, left_out: dict) -> dict:
    """The report of a finished build: `plan` is what the stage plan returned (plan/run.py
    PlanResult), `left_out` what the input directories held and the build did not read."""
    dedup, tails = plan.dedup, plan.tails
    docs = sorted(work.done_chunks(work.docs).values(), key=lambda m: m["index"])
    toks = sorted(work.done_chunks(work.tokens).values(), key=lambda m: m["index"])
    total = lambda key: sum(m[key] for m in docs)          # noqa: E731
    filters: dict = {name: {"docs": 0, "bytes": 0}                             # check order
                     for name in Pipeline.reasons}
    for m in docs:
        for name, (n, b) in m["filters"].items():
            f = filters.setdefault(name, {"docs": 0, "bytes": 0})
            f["docs"] += n
            f["bytes"] += b
    bad = _bad_records(docs, dedup)
    filtered_docs, filtered_bytes = total("docs_out"), total("bytes_out")
    split_tokens = {s: sum(m["tokens"][s] for m in toks) for s in ("train", "valid")}
    split_docs = {s: sum(m["docs"][s] for m in toks) for s in ("train", "valid")}
    split_bytes = {s: sum(m["bytes"][s] for m in toks) for s in ("train", "valid")}
    text_tokens = sum(split_tokens.values()) - sum(split_docs.values())   # EOS not counted
    rate = lambda n, d: round(n / d, 6) if d else 0.0     # noqa: E731
    return {
        "output": str(work.out),
        "stages": {
            "read": {"files": len(manifest.config["inputs"]), "docs": total("docs_in"),
                     "bytes": total("bytes_in"),
                     "bad_records": sum(e[0] for f in bad.values() for e in f.values())},
            "clean": {"docs": total("docs_in"), "bytes_in": total("bytes_in"),
                      "bytes_out": total("bytes_clean")},
            "filter": {"docs_in": total("docs_in"), "bytes_in": total("bytes_clean"),
                       "docs_out": filtered_docs, "bytes_out": filtered_bytes,
                       "removed_by": filters},
            "dedup": {"docs_in": filtered_docs, "bytes_in": filtered_bytes,
                      "duplicate_ids": len(dedup.duplicate_ids),
                      "exact": {"docs": dedup.exact[0], "bytes": dedup.exact[1],
                                "rate": rate(dedup.exact[0], filtered_docs)},
                      "near": {"docs": dedup.near[0], "bytes": dedup.near[1],
                               "rate": rate(dedup.near[0], filtered_docs)},
                      "docs_out": dedup.kept_docs, "bytes_out": dedup.kept_bytes},
            "tokenize": {"docs": split_docs, "bytes": split_bytes, "tokens": split_tokens,
                         "bytes_per_token": rate(sum(split_bytes.values()), text_tokens)},
            "pack": {s: {"samples": sp.num_samples, "tokens": sp.num_tokens,
                         "tail_tokens_dropped": tails[s]} for s, sp in manifest.splits.items()},
        },
        "bad_records": bad,
        "inputs": per_file_counts(work, _chunk_keeps(work, docs),
                                  [f["file"] for f in manifest.config["inputs"]], manifest),
        "skipped_files": skipped_files(bad),
        "id_conflicts": id_conflicts(dedup.duplicate_ids),
        # what the input directories held and the build did not read (readers.list_inputs)
        "left_out": left_out,
        "token_length_histogram": histogram_of_bins(_summed(plan.length_bins)),
        "token_rank_frequency": plots.token_rank_frequency(work, manifest.tokenizer.vocab_size),
        "plots": list(plots.FILES.values()) if plots.available() else [],
        "tokenizer": {"vocab_size": manifest.tokenizer.vocab_size, "type": manifest.tokenizer.type,
                      "vocab_size_requested": None if cfg.tokenizer.model else cfg.tokenizer.vocab_size},
        "shards": [{"file": sh.file, "samples": sh.num_samples, "bytes": sh.bytes}
                   for sp in manifest.splits.values() for sh in sp.shards],
        "max_shard_bytes": cfg.shards.max_shard_bytes,
        "time_s": plan.time_s,
        "chunks_reused": plan.chunks_reused,   # > 0: this run resumed an interrupted build
        "workers": cfg.run.workers,
        "worker_pids": {"docs": sorted({m["pid"] for m in docs}),
                        "tokenize": sorted({m["pid"] for m in toks})},
        "cpu_s": {"docs": round(sum(m["cpu_s"] for m in docs), 3),
                  "tokenize": round(sum(m["cpu_s"] for m in toks), 3)},
        "chunks": len(docs),
        "fingerprint": manifest.fingerprint,
        "executor": plan.executor,   # where the tasks ran, tasks per stage
        **document_stages(docs, cfg),
    }


def document_stages(markers: list[dict], cfg) -> dict:
    """Language, PII and decontamination counts over the chunk markers (input order)."""
    langs: dict = {}
    pii: dict = {}
    pii_languages: dict = {}   # language of the document -> {kind: matches}
    matches: list = []
    for m in markers:
        for lang, (n, b, *more) in m.get("languages", {}).items():
            entry = langs.setdefault(lang, {"docs": 0, "bytes": 0, "score_sum": 0.0, "unplaced": 0})
            entry["docs"] += n
            entry["bytes"] += b
            entry["score_sum"] += more[0] if more else 0.0
            # documents "en" only as English-unplaced (dataprep.langid.classify; older markers: 0)
            entry["unplaced"] += more[1] if len(more) > 1 else 0
        for kind, n in m.get("pii", {}).items():
            pii[kind] = pii.get(kind, 0) + n
        for lang, kinds in m.get("pii_languages", {}).items():
            entry = pii_languages.setdefault(lang, {})
            for kind, n in kinds.items():
                entry[kind] = entry.get(kind, 0) + n
        matches += m.get("decontam", [])
    for entry in langs.values():   # the mean of the documents' language scores
        entry["mean_score"] = round(entry.pop("score_sum") / max(1, entry["docs"]), 4)
    langs = dict(sorted(langs.items(), key=lambda kv: (-kv[1]["bytes"], kv[0])))
    return {
        "languages": langs,
        "pii": {"action": cfg.pii.action, "docs": sum(m.get("pii_docs", 0) for m in markers),
                "matches": dict(sorted(pii.items())),
                "by_language": {lang: dict(sorted(kinds.items()))
                                for lang, kinds in sorted(pii_languages.items())}},
        "decontam": {"action": cfg.decontam.action, "files": list(cfg.decontam.files),
                     "docs_cut": sum(m.get("decontam_cut", 0) for m in markers),
                     "matches": matches},   # [evaluation item, doc_id]
    }


def _bad_records(markers: list[dict], dedup) -> dict:
    """{file: {reason: [count, first line, first detail]}} over all chunks, plus duplicate ids."""
    out: dict = {}
    for m in markers:
        for file, reasons in m["bad"].items():
            for reason, (n, line, detail) in reasons.items():
                entry = out.setdefault(file, {}).setdefault(reason, [0, line, detail])
                entry[0] += n
    for source, doc_id, *_ in dedup.duplicate_ids:
        entry = out.setdefault(source, {}).setdefault("duplicate_doc_id", [0, 0, f"id {doc_id!r}"])
        entry[0] += 1
    return out


def skipped_files(bad: dict) -> dict:
    """{file: why} of the input files skipped whole (binary content)."""
    return {f: r["binary_file"][2] for f, r in bad.items() if "binary_file" in r}


def write_report(root: Path, report: dict) -> None:
    atomic_write_json(root / "report.json", report)
    if report.get("plots"):
        plots.write_plots(root, report)
    atomic_write_bytes(root / "report.md", to_markdown(report).encode())


def to_markdown(r: dict) -> str:
    st = r["stages"]
    lines = ["# dataprep build report", "", f"Fingerprint `{r['fingerprint']}`", "",
             "## Stages", "", "| stage | docs in | bytes in | docs out | bytes out |",
             "|---|---:|---:|---:|---:|",
             f"| read | | | {st['read']['docs']} | {st['read']['bytes']} |",
             f"| clean | {st['clean']['docs']} | {st['clean']['bytes_in']} | {st['clean']['docs']} "
             f"| {st['clean']['bytes_out']} |",
             f"| quality filters | {st['filter']['docs_in']} | {st['filter']['bytes_in']} "
             f"| {st['filter']['docs_out']} | {st['filter']['bytes_out']} |",
             f"| dedup | {st['dedup']['docs_in']} | {st['dedup']['bytes_in']} "
             f"| {st['dedup']['docs_out']} | {st['dedup']['bytes_out']} |", "",
             "## Filters (documents removed, in check order)", "", "| filter | docs | bytes |",
             "|---|---:|---:|"]
    lines += [f"| {k} | {v['docs']} | {v['bytes']} |" for k, v in st["filter"]["removed_by"].items()]
    d = st["dedup"]
    lines += ["", "## Duplicates", "",
              f"- exact: {d['exact']['docs']} documents ({d['exact']['rate']:.2%}), "
              f"{d['exact']['bytes']} bytes",
              f"- near: {d['near']['docs']} documents ({d['near']['rate']:.2%}), "
              f"{d['near']['bytes']} bytes",
              f"- duplicate doc ids: {d['duplicate_ids']}", "", "## Bad records", ""]
    if not r["bad_records"]:
        lines.append("None.")
    else:
        lines += ["| file | reason | count | first line | detail |", "|---|---|---:|---:|---|"]
        for file, reasons in r["bad_records"].items():
            lines += [f"| {file} | {reason} | {n} | {line} | {detail} |"
                      for reason, (n, line, detail) in reasons.items()]
    lines += _document_stages_md(r)
    lines += ["", "## Input files", "", "| file | docs read | docs kept | tokens (with EOS) "
              "| samples with its text |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {f} | {c['docs_read']} | {c['docs_kept']} | {c['tokens']} | {c['samples']} |"
              for f, c in r.get("inputs", {}).items()]
    if r.get("skipped_files"):
        lines += ["", "Skipped whole (not text):", ""]
        lines += [f"- {f}: {why}" for f, why in r["skipped_files"].items()]
    if r.get("left_out"):
        lines += ["", "Left out of the input directories (not read):", ""]
        lines += [f"- {k.replace('_', ' ')}: {len(v)}: {', '.join(v[:20])}"
                  f"{' ...' if len(v) > 20 else ''}" for k, v in r["left_out"].items()]
    if r.get("id_conflicts"):
        lines += ["", "Ids already used by another file (dropped; see input.id_scope):", ""]
        lines += [f"- {w[len('warning: '):]}" for w in id_warnings(r["id_conflicts"])]
    t = st["tokenize"]
    lines += ["", "## Tokens", "", f"Tokenizer: {r['tokenizer']['type']}, vocab "
              f"{r['tokenizer']['vocab_size']}; {t['bytes_per_token']} bytes per token.", "",
              "| split | docs | bytes | tokens (with EOS) | samples | tail tokens dropped |",
              "|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {s} | {t['docs'][s]} | {t['bytes'][s]} | {t['tokens'][s]} | {p['samples']} "
              f"| {p['tail_tokens_dropped']} |" for s, p in st["pack"].items()]
    lines += ["", "Document length in tokens:", "", "| tokens | docs |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in r["token_length_histogram"].items()]
    lines += [""] + [f"![{name[len('report_'):-len('.png')].replace('_', ' ')}]({name})"
                     for name in r.get("plots", [])]
    lines += ["", f"## Shards (cap {r['max_shard_bytes']} bytes, data + index)", "",
              "| file | samples | bytes |", "|---|---:|---:|"]
    lines += [f"| {s['file']} | {s['samples']} | {s['bytes']} |" for s in r["shards"]]
    lines += ["", f"## Time ({r['workers']} workers)", "", "| stage | wall s |", "|---|---:|"]
    lines += [f"| {k} | {v} |" for k, v in r["time_s"].items()]
    lines += ["", f"Worker CPU s: {json.dumps(r['cpu_s'])}", ""]
    ex = r["executor"]
    lines += [f"Executor: {ex['where']}", "", "| stage | tasks | reused |", "|---|---:|---:|"]
    lines += [f"| {k} | {v} | {ex['tasks_reused'].get(k, 0)} |" for k, v in ex["tasks"].items()]
    lines += [""]
    return "\n".join(lines)


def _document_stages_md(r: dict) -> list[str]:
    lines = ["", "## Languages (documents read, after cleaning)", "",
             "| language | docs | bytes | mean score | unplaced |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {k} | {v['docs']} | {v['bytes']} | {v.get('mean_score', 0.0):.3f} | {v.get('unplaced', 0)} |"
              for k, v in r.get("languages", {}).items()]
    pii = r.get("pii", {"action": "redact", "docs": 0, "matches": {}})
    lines += ["", f"## Personal data (action: {pii['action']})", "",
              f"{pii['docs']} documents held personal data.", "", "| kind | matches |", "|---|---:|"]
    lines += [f"| {k} | {n} |" for k, n in pii["matches"].items()]
    by_language = pii.get("by_language", {})
    if by_language:
        kinds = sorted({k for v in by_language.values() for k in v})
        lines += ["", "Matches by the language of the document:", "",
                  "| language | " + " | ".join(kinds) + " |", "|---|" + "---:|" * len(kinds)]
        lines += [f"| {lang} | " + " | ".join(str(v.get(k, 0)) for k in kinds) + " |"
                  for lang, v in by_language.items()]
    dc = r.get("decontam", {"action": "drop", "files": [], "docs_cut": 0, "matches": []})
    lines += ["", f"## Decontamination (action: {dc['action']})", ""]
    if not dc["files"]:
        lines.append("No evaluation files.")
    else:
        lines += [f"Evaluation files: {', '.join(dc['files'])}; {len(dc['matches'])} matches, "
                  f"{dc['docs_cut']} documents cut.", "", "| evaluation item | document |",
                  "|---|---|"]
        lines += [f"| {item} | {doc} |" for item, doc in dc["matches"]]
    return lines


def summary(r: dict) -> str:
    st = r["stages"]
    d, pack = st["dedup"], st["pack"]
    return "\n".join([
        f"docs: {st['read']['docs']} read, {st['filter']['docs_out']} after filters, "
        f"{d['docs_out']} after dedup ({st['read']['bad_records']} bad records)",
        f"duplicates: exact {d['exact']['rate']:.1%}, near {d['near']['rate']:.1%}",
        "samples: " + ", ".join(f"{s} {p['samples']}" for s, p in pack.items())
        + f"; tokens: {sum(st['tokenize']['tokens'].values())} "
        f"({st['tokenize']['bytes_per_token']} bytes/token)",
        f"shards: {len(r['shards'])}, output: {r['output']}",
    ] + [f"skipped {f}: {why}" for f, why in r.get("skipped_files", {}).items()]
      + [f"left out of the inputs: {len(v)} {k.replace('_', ' ')} (see report.json left_out)"
         for k, v in r.get("left_out", {}).items()])


def _chunk_keeps(work, docs: list[dict]):
    """(chunk index, keep mask) of every stage-1 chunk in input order (plan/units.settle_unit)."""
    for marker in docs:
        yield marker["index"], np.load(work.plan / "keep" / f"{marker['index']}.npy")
