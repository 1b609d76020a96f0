"""A labelled near-duplicate set of real text, and precision/recall of NearDedup against exact Jaccard.

The set (see tests/dataprep/data/README.md) is built from text installed on a Debian machine:
licence texts and package copyright files (natural versions of the same licences), Chinese and English
manual pages in several translations (zh_CN, zh_TW, English), the vim tutor in its Chinese editions
and two Chinese message catalogs (GnuPG help, systemd),
plus copies of some of these with small random edits (word or character substitutions, deletions,
insertions and dropped lines) at rates that put their similarity on both sides of the threshold.

Labels are computed, not stored: a pair is a near duplicate when the exact Jaccard similarity of the
two shingle sets (neardup_eval.shingle_set of the normalised texts) reaches the threshold.

    python tests/dataprep/neardup_eval.py build OUT.jsonl.zst [--full]   # (re)build the set
    python tests/dataprep/neardup_eval.py eval  SET.jsonl.zst            # precision/recall per
                                                                         # language, at 0.8 and 0.9
"""
from __future__ import annotations

import gzip
import json
import random
import re
import sys
from pathlib import Path

import zstandard

from mspretrain.dataprep.steps.clean import normalize
import numpy as np

from mspretrain.dataprep.dedup.detect import DedupConfig, NearDedup, shingle_order, shingle_text, signatures

SHARE = Path("/usr/share")


# ------------------------------------------------------------------------------------ sources

def _roff_to_text(roff: str) -> str:
    """A crude man-page renderer: macros out, their text arguments kept, font escapes dropped."""
    out = []
    for line in roff.splitlines():
        if line.startswith(("'", '.\\"', ".\\\"")):
            continue
        if line.startswith("."):
            macro, _, rest = line[1:].partition(" ")
            if macro not in ("SH", "SS", "B", "I", "BR", "BI", "IR", "RB", "IB", "IP", "TP", "TH"):
                continue
            line = rest.replace('"', "")
        line = re.sub(r"\\f[BIRP]|\\f\(..|\\&|\\\*\(..|\\\*.", "", line)
        line = line.replace("\\-", "-").replace("\\(lq", "\u201c").replace("\\(rq", "\u201d")
        out.append(re.sub(r"\\\(..", "", line))
    return "\n".join(out)


def _read(path: Path) -> str:
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    text = data.decode("utf-8")
    return _roff_to_text(text) if re.search(r"\.\d\.gz$", path.name) else text


def natural_sources(full: bool) -> list[tuple[str, str]]:
    """(source name, text) of real documents that exist in several versions on this machine."""
    paths: list[Path] = sorted((SHARE / "common-licenses").iterdir())
    copyrights = sorted(SHARE.glob("doc/*/copyright"))
    limit = 1 << 30 if full else 12_000
    copyrights = [p for p in copyrights if p.stat().st_size <= limit]
    paths += copyrights if full else copyrights[::6]
    for lang in ("zh_CN", "zh_TW"):
        paths += sorted((SHARE / "man" / lang).rglob("*.gz"))
    zh_pages = {p.name for p in (SHARE / "man" / "zh_CN").rglob("*.gz")}
    for section in ("man1", "man5", "man8"):
        paths += [p for p in sorted((SHARE / "man" / section).glob("*.gz")) if p.name in zh_pages]
    paths += sorted((SHARE / "vim").glob("vim*/tutor/tutor.zh*.utf-8"))
    paths += [SHARE / "gnupg" / "help.zh_CN.txt", Path("/usr/lib/systemd/catalog/systemd.zh_CN.catalog")]
    seen, out = set(), []
    for p in paths:
        real = p.resolve()
        if real in seen or not real.is_file():
            continue
        seen.add(real)
        try:
            name = str(p.relative_to(SHARE)) if p.is_relative_to(SHARE) else str(p)
            out.append((name, _read(p)))
        except (UnicodeDecodeError, OSError):
            continue
    return out


# ------------------------------------------------------------------------------------ edits

_HAN = re.compile(r"[\u4e00-\u9fff]")


def edited(text: str, rate: float, rng: random.Random) -> str:
    """A copy of `text` with about `rate` of its tokens (words; Chinese characters) edited."""
    lines = text.split("\n")
    if len(lines) > 4 and rng.random() < 0.3:
        del lines[rng.randrange(len(lines))]
    tokens = re.findall(r"[\u4e00-\u9fff]|[^\s\u4e00-\u9fff]+|\s+", "\n".join(lines))
    words = [t for t in tokens if not t.isspace()] or ["x"]
    out = []
    for tok in tokens:
        if tok.isspace() or rng.random() >= rate:
            out.append(tok)
            continue
        op = rng.randrange(3)
        if op == 0:    # substitute
            out.append(rng.choice(words))
        elif op == 1:  # insert
            out += [tok, "" if _HAN.match(tok) else " ", rng.choice(words)]
        # op == 2: delete
    return "".join(out)


def build(full: bool = False, seed: int = 7) -> list[dict]:
    """The labelled-set documents: natural versions, then edited copies of a subset."""
    rng = random.Random(seed)
    docs = [{"id": name, "source": name, "text": text} for name, text in natural_sources(full)]
    base = [d for d in docs if len(normalize(d["text"])) >= 200]
    picked = base if full else rng.sample(base, min(len(base), 40))
    for d in picked:
        for v in range(2):
            rate = rng.uniform(0.0, 0.08)
            docs.append({"id": f"{d['id']}#edit{v}", "source": d["source"],
                         "text": edited(d["text"], rate, rng), "edit_rate": round(rate, 4)})
    # Exact copies are exact dedup's job: keep the first of each normalised text only.
    seen, unique = set(), []
    for d in docs:
        key = normalize(d["text"])
        if key and key not in seen:
            seen.add(key)
            unique.append(d)
    return unique


def write(docs: list[dict], path: Path) -> None:
    data = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode()
    params = zstandard.ZstdCompressionParameters.from_level(19, window_log=24)
    path.write_bytes(zstandard.ZstdCompressor(compression_params=params).compress(data))


def load(path: Path) -> list[dict]:
    data = zstandard.ZstdDecompressor().stream_reader(path.open("rb")).read()
    return [json.loads(line) for line in data.decode().splitlines()]


# ------------------------------------------------------------------------------------ evaluation

def shingle_set(text: str, order: int) -> set[str]:
    """The shingles of `text` as strings: the reference definition the signatures hash."""
    s = shingle_text(text)
    if len(s) < order:
        return {s.ljust(order, "\0")}
    return {s[i:i + order] for i in range(len(s) - order + 1)}


def estimate(a: np.ndarray, b: np.ndarray) -> float:
    """Signature-estimated Jaccard similarity: the fraction of equal entries."""
    return float(np.count_nonzero(a == b)) / a.shape[-1]


def true_pairs(texts: list[str], cfg: DedupConfig) -> set[tuple[int, int]]:
    """Pairs (i < j) whose exact shingle-set Jaccard similarity reaches cfg.threshold."""
    order = shingle_order(cfg.shingle)
    sets = [shingle_set(t, order) for t in texts]
    sizes = [len(s) for s in sets]
    pairs = set()
    for j in range(len(sets)):
        for i in range(j):
            small, big = sorted((sizes[i], sizes[j]))
            if small < cfg.threshold * big:  # J <= small / big
                continue
            inter = len(sets[i] & sets[j])
            if inter >= cfg.threshold * (sizes[i] + sizes[j] - inter) - 1e-9:
                pairs.add((i, j))
    return pairs


def flagged_pairs(texts: list[str], cfg: DedupConfig, verify: bool = True) -> set[tuple[int, int]]:
    """Pairs (i < j) that NearDedup matches: document j queried against an index of all i < j
    (with exact verification near the threshold, as a build does, unless `verify` is False)."""
    nd = NearDedup(cfg, texts_of=(lambda keys: [texts[int(k)] for k in keys]) if verify else None)
    pairs = set()
    for j, sig in enumerate(signatures(texts, cfg)):
        pairs.update((int(key), j) for key, _ in nd.query(sig, texts[j] if verify else None))
        nd.index(str(j), sig)
    return pairs


def _language(text: str) -> str:
    from mspretrain.dataprep.steps.langid import identify
    return identify(text)[0]


def evaluate(docs: list[dict], cfg: DedupConfig, verify: bool = True) -> dict:
    """Precision and recall overall and per language ("zh", "en", ...; a pair counts for a
    language when both of its documents are identified as it)."""
    texts = [normalize(d["text"]) for d in docs]
    truth, flagged = true_pairs(texts, cfg), flagged_pairs(texts, cfg, verify)
    langs = [_language(t) for t in texts]
    out = {"threshold": cfg.threshold, "docs": len(texts), **_pr(truth, flagged), "languages": {}}
    for lang in sorted(set(langs)):
        keep = lambda pairs: {(i, j) for i, j in pairs if langs[i] == langs[j] == lang}  # noqa: E731
        if keep(truth) or keep(flagged):
            out["languages"][lang] = _pr(keep(truth), keep(flagged))
    return out


def _pr(truth: set, flagged: set) -> dict:
    hits = len(truth & flagged)
    return {"true_pairs": len(truth), "flagged_pairs": len(flagged),
            "precision": round(hits / max(1, len(flagged)), 4),
            "recall": round(hits / max(1, len(truth)), 4)}


def main(argv: list[str]) -> None:
    if len(argv) >= 2 and argv[0] == "build":
        docs = build(full="--full" in argv)
        write(docs, Path(argv[1]))
        print(f"{len(docs)} documents -> {argv[1]}")
    elif len(argv) >= 2 and argv[0] == "eval":
        docs = load(Path(argv[1]))
        for threshold in (0.8, 0.9):
            for verify in (False, True):
                result = evaluate(docs, DedupConfig(threshold=threshold), verify)
                print(json.dumps({"exact_verification": verify, **result}))
    else:
        print(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
