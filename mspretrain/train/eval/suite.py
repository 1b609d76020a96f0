"""The evaluation suite of `train eval` (and of the in-loop eval every eval.every_steps):

- loss, perplexity and **next-token accuracy** (the share of predicted tokens that are the model's
  top-1, first index on ties, over the tokens the loss counts) over the first eval.batches batches of
  eval.batch_size rows of the valid split's order (as train.eval.evaluate.validation_loss reads them), in
  total and **per source** of a blend (eval.blend);
- **bits per byte**: the nats of the predicted tokens over the UTF-8 bytes of the text behind them,
  so models with different tokenizers compare. A token's bytes come from its sentencepiece piece
  ("▁" is a space, a byte-fallback piece one byte, control pieces such as EOS none); the dummy-prefix
  space sentencepiece puts before each document is not in the text, and provenance/<split>.parquet
  says where documents start (doc_offset 0), so it is taken off there;
- generation quality over a prompt set (eval.prompts, greedy, eval.gen_tokens new tokens): distinct-1/2/3
  over all generations, the rate of repeated 3-grams within a generation, and the mean length.

Resumable per sample: each sample's numbers are appended to RUN/eval/<checkpoint>-<split>-...jsonl as
soon as its batch is computed (each generation's tokens likewise). A killed eval, run again, keeps the
complete lines, recomputes from the first batch that is not complete (batches keep their composition,
so every sample's numbers are bitwise those of an uninterrupted run) and gives the same totals.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from pathlib import Path

import numpy as np

from mspretrain.train import hooks
from mspretrain.train.config import Config, ConfigError

LN2 = math.log(2.0)


# ---------------------------------------------------------------- bytes behind tokens

class ByteCounter:
    """UTF-8 bytes of the text behind token ids of one sentencepiece model."""

    def __init__(self, model_file: Path):
        import sentencepiece as spm
        from sentencepiece import sentencepiece_model_pb2 as pb

        sp = spm.SentencePieceProcessor(model_file=str(model_file))
        n = sp.get_piece_size()
        table = np.zeros(n, np.int64)
        space = np.zeros(n, bool)
        for i in range(n):
            if sp.is_control(i) or sp.is_unknown(i):
                continue        # EOS/BOS/PAD stand for no text; <unk> for text that is lost
            if sp.is_byte(i):
                table[i] = 1
                continue
            piece = sp.id_to_piece(i)
            table[i] = len(piece.replace("\u2581", " ").encode("utf-8"))
            space[i] = piece.startswith("\u2581")
        proto = pb.ModelProto()
        proto.ParseFromString(Path(model_file).read_bytes())
        self.table, self.starts_with_space = table, space
        self.dummy_prefix = bool(proto.normalizer_spec.add_dummy_prefix)

    def count(self, ids: np.ndarray, doc_starts=()) -> int:
        """Bytes of `ids`; `doc_starts`: indices into ids where a document begins."""
        total = int(self.table[ids].sum())
        if self.dummy_prefix:
            total -= sum(1 for k in doc_starts if self.starts_with_space[ids[k]])
        return total


def doc_starts(root: Path, split: str, sample_ids) -> dict[int, list[int]]:
    """sample_id -> sample offsets where a document starts, from provenance/<split>.parquet."""
    import pyarrow.parquet as pq

    path = Path(root) / "provenance" / f"{split}.parquet"
    if not path.is_file():
        raise ConfigError(f"{path} not found: bits per byte needs the dataset's provenance")
    table = pq.read_table(path, columns=["sample_id", "sample_offset"],
                          filters=[("sample_id", "in", sorted({int(s) for s in sample_ids})),
                                   ("doc_offset", "==", 0)])
    out: dict[int, list[int]] = {}
    for sid, off in zip(table.column("sample_id").to_pylist(), table.column("sample_offset").to_pylist()):
        out.setdefault(sid, []).append(off)
    return out


# ---------------------------------------------------------------- generation metrics

def ngrams(tokens: list[int], n: int) -> list[tuple]:
    return [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]


def generation_metrics(generations: list[list[int]]) -> dict:
    """distinct-n (unique / total n-grams over all generations), the mean rate of 3-grams that repeat
    an earlier 3-gram of the same generation, and the mean length in tokens."""
    out = {}
    for n in (1, 2, 3):
        grams = [g for gen in generations for g in ngrams(gen, n)]
        out[f"distinct_{n}"] = len(set(grams)) / len(grams) if grams else 0.0
    rates = []
    for gen in generations:
        grams = ngrams(gen, 3)
        if grams:
            rates.append(1.0 - len(set(grams)) / len(grams))
    out["repeated_3gram_rate"] = float(np.mean(rates)) if rates else 0.0
    out["mean_length"] = float(np.mean([len(g) for g in generations])) if generations else 0.0
    out["generations"] = len(generations)
    return out


# ---------------------------------------------------------------- the resumable results file

class ResultsFile:
    """A jsonl file of records keyed by "i"; a torn last line (a killed writer) is cut off."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.records: dict[int, dict] = {}
        if path.is_file():
            data = path.read_bytes()
            good = data[:data.rfind(b"\n") + 1]
            if len(good) != len(data):
                with open(path, "r+b") as f:
                    f.truncate(len(good))
            for line in good.decode("utf-8").splitlines():
                rec = json.loads(line)
                self.records[rec["i"]] = rec
        self._f = open(path, "a", encoding="utf-8")

    def add(self, rec: dict) -> None:
        line = json.dumps(rec, sort_keys=True) + "\n"
        hooks.load().eval_record(self._f, len(self.records), line)
        self._f.write(line)
        self._f.flush()
        self.records[rec["i"]] = rec

    def close(self) -> None:
        self._f.close()


# ---------------------------------------------------------------- the suite

def validation_batch_size(cfg: Config, num_samples: int | None = None) -> int:
    """Rows per validation forward (val_loss, the suite, `train eval --tasks`): eval.batch_size, or by
    default twice the training's rows per forward (parallel.plan.eval_batch_size: micro-batch x
    data_parallel), since evaluation holds no gradients or optimizer state; the training's when the
    valid split (`num_samples`) holds fewer rows than that. A multiple of data_parallel: on Ascend the
    eval graph splits the batch across the data-parallel ranks."""
    from mspretrain.train.parallel.plan import eval_batch_size
    own, dp = cfg.eval.batch_size, cfg.parallel.data_parallel
    if own < 0:
        raise ConfigError(f"eval.batch_size must be >= 0, got {own}")
    if own:
        if own % dp:
            raise ConfigError(f"eval.batch_size={own} is not a multiple of parallel.data_parallel={dp}")
        return own
    train = eval_batch_size(cfg)
    return train if num_samples is not None and num_samples < 2 * train else 2 * train


def validation_loader(cfg: Config, source, split: str):
    """(Loader over the valid split of `source` in validation batches, its batch size)."""
    from mspretrain.loader import Loader
    batch = validation_batch_size(cfg)
    ld = Loader(source, split=split, global_batch_size=batch, seed=cfg.seed, num_workers=0)
    fits = validation_batch_size(cfg, ld.num_samples)
    if fits != batch:
        ld.close()
        ld = Loader(source, split=split, global_batch_size=fits, seed=cfg.seed, num_workers=0)
    return ld, fits


def task_batch_size(run_dir) -> int:
    """Rows per forward of `train eval --tasks`: the run's validation batch."""
    from mspretrain.train.runinfo import run_config
    return validation_batch_size(run_config(run_dir))


def capped_batches(cfg: Config, num_samples: int, batch_size: int, split: str) -> int:
    """eval.batches, capped at the batches the split holds (with a message)."""
    if cfg.eval.batches < 1:
        raise ConfigError(f"eval.batches must be >= 1, got {cfg.eval.batches}")
    have = num_samples // batch_size
    if have < 1:
        raise ConfigError(f"split {split!r} has {num_samples} samples, fewer than one batch of {batch_size}")
    if cfg.eval.batches > have:
        print(f"[eval] eval.batches={cfg.eval.batches} capped at {have}: split {split!r} holds {num_samples} "
              f"samples, {have} batches of {batch_size}", file=sys.stderr, flush=True)
        return have
    return cfg.eval.batches


def eval_source(cfg: Config):
    """The loader source: eval.blend ({dir: weight}) when set, else data.path."""
    return dict(cfg.eval.blend) if cfg.eval.blend else cfg.data.path


def run_suite(model, cfg: Config, run_dir, tag: str) -> dict:
    """Evaluate `model` (a Llama in fp32 or cast for cfg.precision); results under RUN/eval/."""
    from mindspore import Tensor

    split = cfg.data.valid_split
    net = _NETS.get(id(model))
    if net is None:     # one compile per model per process (the in-loop eval runs many times)
        net = _NETS[id(model)] = _log_probs_and_hits(model)
    ld, B = validation_loader(cfg, eval_source(cfg), split)
    with ld:
        nb = capped_batches(cfg, ld.num_samples, B, split)
        eod = ld.tokenizer.eos_id if cfg.train.eod_mask_loss else -1
        roots = [Path(s["dir"]) for s in ld.sources]
        counters = [_byte_counter(r) for r in roots]
        name = f"{tag}-{split}-{ld.fingerprint[:12]}-{nb}x{B}.jsonl"
        results = ResultsFile(Path(run_dir) / "eval" / name)
        try:
            for k in range(nb):
                if all(k * B + j in results.records for j in range(B)):
                    continue
                state = ld.state_dict()
                state["cursor"] = k * B
                ld.load_state_dict(state)
                batch = next(ld)
                ids = batch["input_ids"]
                sources = batch.get("source", np.zeros(B, np.int32))
                logp, hits = (x.asnumpy() for x in net(Tensor(ids)))
                logp = logp.astype(np.float64)
                # train.eod_mask_loss: the loss (and so the accuracy) leaves out predictions from EOS
                keep = ids[:, :-1] != eod if eod >= 0 else np.ones(logp.shape, bool)
                nats, tokens, correct = -(logp * keep).sum(-1), keep.sum(-1), (hits & keep).sum(-1)
                starts = _starts(roots, split, sources, batch["sample_id"], counters)
                for j in range(B):
                    if k * B + j in results.records:
                        continue
                    src, sid = int(sources[j]), int(batch["sample_id"][j])
                    c = counters[src]
                    nbytes = (c.count(ids[j, 1:], [s - 1 for s in starts.get((src, sid), []) if s >= 1])
                              if c else None)
                    results.add({"i": k * B + j, "source": src, "sample_id": sid, "nats": float(nats[j]),
                                 "tokens": int(tokens[j]), "correct": int(correct[j]), "bytes": nbytes})
        finally:
            results.close()
        summary = summarize([results.records[i] for i in range(nb * B)], ld.sources)
    summary["results"] = str(results.path)
    if cfg.eval.prompts:
        summary["generation"] = generation_eval(model, cfg, run_dir, tag)
    out = results.path.with_suffix(".summary.json")
    out.write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return summary


def _log_probs_and_hits(model):
    """A cell: input_ids [B, S+1] -> (log p of each next token fp32 [B, S], whether it is a top-1
    prediction bool [B, S]), from one forward (train.eval.score.TokenLogProbs)."""
    from mspretrain.train.eval.score import TokenLogProbs
    return TokenLogProbs(model, hits=True)


_NETS: dict = {}


def _byte_counter(root: Path):
    from mspretrain.loader.manifest import load_manifest
    m = load_manifest(root)
    model_file = root / m.tokenizer.file if m.tokenizer.file else None
    return ByteCounter(model_file) if model_file and model_file.is_file() else None


def _starts(roots, split, sources, sample_ids, counters) -> dict:
    out = {}
    for src in sorted(set(int(s) for s in sources)):
        if counters[src] is None:
            continue
        sids = [int(s) for s, o in zip(sample_ids, sources) if int(o) == src]
        for sid, offs in doc_starts(roots[src], split, sids).items():
            out[(src, sid)] = offs
    return out


def summarize(records: list[dict], sources: list[dict]) -> dict:
    """Totals over per-sample records, in sample order (float64 sums: the same records, the same bits)."""
    def totals(recs):
        nats = math.fsum(r["nats"] for r in recs)
        tokens = sum(r["tokens"] for r in recs)
        out = {"samples": len(recs), "tokens": tokens, "loss": nats / tokens,
               "ppl": math.exp(min(nats / tokens, 700.0)),
               "acc": sum(r["correct"] for r in recs) / tokens if all("correct" in r for r in recs) else None}
        if recs and all(r["bytes"] is not None for r in recs):
            nbytes = sum(r["bytes"] for r in recs)
            out["bytes"] = nbytes
            out["bits_per_byte"] = nats / LN2 / nbytes if nbytes else None
        return out

    summary = totals(records)
    summary["per_source"] = {s["dir"]: totals([r for r in records if r["source"] == i])
                             for i, s in enumerate(sources)}
    return summary


def generation_eval(model, cfg: Config, run_dir, tag: str) -> dict:
    """Greedy generations for eval.prompts, resumable per prompt, and their metrics."""
    from mspretrain.loader.manifest import load_manifest
    from mspretrain.train.eval.generate import Generator, Sampling, load_prompts

    path = Path(cfg.eval.prompts)
    prompts = load_prompts(path)
    root = Path(next(iter(cfg.eval.blend)) if cfg.eval.blend else cfg.data.path)
    m = load_manifest(root)
    sp = None
    if m.tokenizer.file:
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=str(root / m.tokenizer.file))
    ids = []
    for n, rec in enumerate(prompts, 1):
        if "tokens" in rec:
            ids.append([int(t) for t in rec["tokens"]])
        elif sp is None:
            raise ConfigError(f"{path}:{n}: a text prompt, but {root} has no tokenizer")
        else:
            ids.append([m.tokenizer.eos_id] + sp.encode(rec["text"]))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    results = ResultsFile(Path(run_dir) / "eval" / f"{tag}-gen-{digest}-{cfg.eval.gen_tokens}.jsonl")
    weights = {n: p.asnumpy() for n, p in model.parameters_and_names()}
    B = min(8, max(1, len(ids)))
    try:
        todo = [i for i in range(len(ids)) if i not in results.records]
        if todo:
            gen = Generator(model.args, weights, m.tokenizer.eos_id, m.tokenizer.pad_id, B, family=cfg.model.family)
            for start in range(0, len(todo), B):
                chunk = todo[start:start + B]
                for i, new in zip(chunk, gen.generate([ids[i] for i in chunk],
                                                      Sampling(max_new_tokens=cfg.eval.gen_tokens))):
                    results.add({"i": i, "tokens": new})
    finally:
        results.close()
    eos = m.tokenizer.eos_id
    gens = [[t for t in results.records[i]["tokens"] if t != eos] for i in range(len(ids))]
    return generation_metrics(gens)


def format_summary(s: dict) -> list[str]:
    acc = f"  acc {s['acc']:.4f}" if s.get("acc") is not None else ""
    lines = [f"eval: loss {s['loss']:.6f}  ppl {s['ppl']:.4f}{acc}  ({s['samples']} samples, {s['tokens']} tokens)"
             + (f"  bits/byte {s['bits_per_byte']:.4f} ({s['bytes']} bytes)" if s.get("bits_per_byte") else "")]
    if len(s["per_source"]) > 1:
        for src, t in s["per_source"].items():
            acc = f"  acc {t['acc']:.4f}" if t.get("acc") is not None else ""
            lines.append(f"  source {src}: loss {t['loss']:.6f}  ppl {t['ppl']:.4f}{acc}  ({t['samples']} samples)"
                         + (f"  bits/byte {t['bits_per_byte']:.4f}" if t.get("bits_per_byte") else ""))
    g = s.get("generation")
    if g:
        lines.append(f"  generation ({g['generations']} prompts): distinct-1/2/3 {g['distinct_1']:.3f} / "
                     f"{g['distinct_2']:.3f} / {g['distinct_3']:.3f}  repeated 3-grams "
                     f"{g['repeated_3gram_rate']:.3f}  mean length {g['mean_length']:.1f}")
    lines.append(f"  per-sample results: {s['results']}")
    return lines


def in_loop_mode(cfg: Config, is_main: bool, step: int) -> bool:
    """Whether the trainer's eval at `step` runs the suite (eval.suite_in_loop, on the main rank, on the
    model in memory). A sharded layout, whose ranks hold slices of the weights, is refused at config
    validation (train.parallel.plan.check_suite_in_loop)."""
    return bool(cfg.eval.suite_in_loop and is_main and cfg.eval.every_steps and step % cfg.eval.every_steps == 0)


def in_loop(model, cfg: Config, run_dir, step: int) -> dict:
    """The suite for the trainer's periodic eval: the metrics record's extra fields. The generation
    metrics run only at multiples of eval.suite_every_steps (when set)."""
    every = cfg.eval.suite_every_steps
    if every < 0:
        raise ConfigError(f"eval.suite_every_steps must be >= 0, got {every}")
    if every and step % every:
        cfg = dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, prompts=""))
    s = run_suite(model, cfg, run_dir, f"step_{step:08d}")
    rec = {}        # val_acc comes with val_loss (train.eval.evaluate.validation_loss), of the same batches
    if s.get("bits_per_byte") is not None:
        rec["val_bits_per_byte"] = s["bits_per_byte"]
    if len(s["per_source"]) > 1:
        rec["val_loss_per_source"] = {k: v["loss"] for k, v in s["per_source"].items()}
    if s.get("generation"):
        rec["generation"] = {k: v for k, v in s["generation"].items() if k != "generations"}
    return rec
