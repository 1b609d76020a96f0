"""`train eval RUN --tasks FILE.jsonl [...]`: multiple-choice tasks scored by the log-likelihood of each
choice, as lm-evaluation-harness scores its `multiple_choice` tasks (checked against it on the HF export:
tests/train/eval/test_tasks.py).

A task file holds one item a line: {"context": str, "choices": [str, ...], "gold": index}. The choice is
appended to the context exactly as written (lm-eval's `target_delimiter: ""`), so an English choice
carries its own leading space (" Paris"), or the context ends with one: as in lm-eval, the context's
trailing whitespace moves to the front of the continuation before encoding. The continuation's tokens
are those of encode(context + continuation) after the first len(encode(context)), the input is left-
truncated to the model's seq_length + 1 tokens, and the model sees the text from its first token (no
BOS/EOS before it, as lm-eval's HF model by default). Per item:

- ll[c]: the sum of the natural-log probabilities of choice c's tokens (one forward of the run's own
  Llama, mspretrain/train/eval/score.py's TokenLogProbs);
- acc: argmax ll == gold; acc_norm: argmax ll / len(choice in characters) == gold (lm-eval's acc_norm);
  acc_bytes: the same over UTF-8 bytes (lm-eval's acc_bytes; what compares Chinese and English);
  ties go to the first choice (numpy argmax).

`--few-shot K` puts K other items of the same file before each context, each as context + gold choice,
joined by blank lines ("\\n\\n", lm-eval's fewshot_delimiter); item i's shots are drawn with
random.Random(f"{seed}:{i}"), so they do not depend on the order items are scored in.

Results: RUN/eval/<checkpoint>-<state hash>-task-<name>-<file digest>-<K>shot.jsonl (one line per item,
appended as computed: a killed run continues where it stopped) and the .summary.json beside it.
`--all-checkpoints` scores every checkpoint of the run and prints a step x metric table.
"""
from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import numpy as np

from mspretrain.common.errors import MspretrainError

METRICS = ("acc", "acc_norm", "acc_bytes")
FEWSHOT_DELIMITER = "\n\n"


class TaskError(MspretrainError, ValueError):
    """A task file that cannot be scored; the message names the file and line."""


def load_task(path) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise TaskError(f"{path}: no such task file")
    items = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskError(f"{path}:{n}: not JSON ({e.msg})") from None
        where = f"{path}:{n}"
        if not isinstance(rec, dict):
            raise TaskError(f"{where}: expected an object with context, choices, gold")
        context, choices, gold = rec.get("context"), rec.get("choices"), rec.get("gold")
        if not isinstance(context, str) or not context.strip():
            raise TaskError(f"{where}: 'context' must be a non-empty string")
        if not isinstance(choices, list) or len(choices) < 2 or \
                not all(isinstance(c, str) and c for c in choices):
            raise TaskError(f"{where}: 'choices' must be a list of at least two non-empty strings")
        if not isinstance(gold, int) or isinstance(gold, bool) or not 0 <= gold < len(choices):
            raise TaskError(f"{where}: 'gold' must be an index into choices (0..{len(choices) - 1})")
        items.append({"context": context, "choices": choices, "gold": gold})
    if not items:
        raise TaskError(f"{path}: no items")
    return items


def prompt(items: list[dict], i: int, few_shot: int, seed: int) -> str:
    """Item i's context after its `few_shot` examples."""
    if few_shot <= 0:
        return items[i]["context"]
    pool = [j for j in range(len(items)) if j != i]
    if few_shot > len(pool):
        raise TaskError(f"--few-shot {few_shot}: the task has only {len(pool)} other items")
    shots = random.Random(f"{seed}:{i}").sample(pool, few_shot)
    text = FEWSHOT_DELIMITER.join(items[j]["context"] + items[j]["choices"][items[j]["gold"]] for j in shots)
    return text + FEWSHOT_DELIMITER + items[i]["context"]


def encode_pair(encode, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split of (context, continuation) into tokens (its _encode_pair for causal models)."""
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        context, continuation = context[:-n_spaces], context[-n_spaces:] + continuation
    whole = encode(context + continuation)
    head = encode(context)
    return whole[:len(head)], whole[len(head):]


def item_metrics(lls: list[float], choices: list[str], gold: int) -> dict:
    ll = np.asarray(lls, np.float64)
    chars = np.array([len(c) for c in choices], np.float64)
    nbytes = np.array([len(c.encode("utf-8")) for c in choices], np.float64)
    return {"acc": float(np.argmax(ll) == gold), "acc_norm": float(np.argmax(ll / chars) == gold),
            "acc_bytes": float(np.argmax(ll / nbytes) == gold)}


class TaskScorer:
    """Log-likelihoods of continuations under one Llama (fp32), batch rows of seq_length + 1 tokens."""

    def __init__(self, model, seq_length: int, pad_id: int, batch_size: int):
        from mspretrain.train.eval.score import Scorer
        self.seq = seq_length
        self.scorer = Scorer(model, seq_length, pad_id, batch_size)

    def loglikelihoods(self, pairs: list[tuple[list[int], list[int]]]) -> list[float]:
        rows, conts = [], []
        for head, cont in pairs:
            if not cont:
                raise TaskError("a choice encodes to no tokens")
            rows.append((head + cont)[-(self.seq + 1):])
            conts.append(len(cont))
        scores = self.scorer.score(rows)
        return [float(np.sum(lp[-n:], dtype=np.float64)) for lp, n in zip(scores, conts)]


def score_task(scorer: TaskScorer, encode, items: list[dict], few_shot: int, seed: int, results) -> None:
    """Score every item not yet in `results` (an evalsuite.ResultsFile), a batch of items at a time."""
    todo = [i for i in range(len(items)) if i not in results.records]
    per_call = scorer.scorer.batch      # items per call: their choices fill about as many batches
    for start in range(0, len(todo), per_call):
        chunk = todo[start:start + per_call]
        pairs, owner = [], []
        for i in chunk:
            ctx = prompt(items, i, few_shot, seed)
            for k, c in enumerate(items[i]["choices"]):
                head, cont = encode_pair(encode, ctx, c)
                if not cont:
                    raise TaskError(f"item {i + 1}: choice {k} adds no token of its own (it merges into the "
                                    f"context's last token: end the context at a word boundary)")
                if len(cont) > scorer.seq:
                    raise TaskError(f"item {i + 1}: choice {k} is {len(cont)} tokens, more than the model's "
                                    f"context of {scorer.seq} predictions")
                pairs.append((head, cont))
                owner.append(i)
        lls = scorer.loglikelihoods(pairs)
        for i in chunk:
            mine = [ll for o, ll in zip(owner, lls) if o == i]
            item = items[i]
            results.add({"i": i, "lls": mine, "gold": item["gold"],
                         **item_metrics(mine, item["choices"], item["gold"])})


def summarize(records: list[dict]) -> dict:
    out = {m: float(np.mean([r[m] for r in records])) for m in METRICS}
    out["items"] = len(records)
    return out


def result_name(ckpt_dir: Path, task: Path, few_shot: int, seed: int) -> str:
    from mspretrain.train import checkpoint as ckpt
    state = hashlib.sha256((ckpt_dir / ckpt.STATE_FILE).read_bytes()).hexdigest()[:8]
    digest = hashlib.sha256(task.read_bytes()).hexdigest()[:12]
    shots = f"{few_shot}shot" + (f"-seed{seed}" if few_shot else "")
    return f"{ckpt_dir.name}-{state}-task-{task.stem}-{digest}-{shots}.jsonl"


def eval_checkpoint(run_dir, step: int | None, task_files: list[str], few_shot: int, seed: int,
                    batch_size: int) -> tuple[int | None, dict]:
    """Every task on one checkpoint: (its step, {task name: summary})."""
    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train.eval.suite import ResultsFile
    from mspretrain.train.eval.generate import RunModel
    from mspretrain.train.models import spec as model_spec
    from mspretrain.train.runinfo import set_weights
    from mspretrain.train.eval.score import training_args

    rm = RunModel(run_dir, step)
    if rm.sp is None:
        raise TaskError(f"{run_dir} has no tokenizer.model: tasks are text, they need the run's tokenizer")
    model = model_spec.get(rm.family).build_model(training_args(rm), 0)
    set_weights(model, rm.weights, str(rm.ckpt_dir))
    scorer = TaskScorer(model, rm.args.seq_length, rm.pad_id, batch_size)
    ckpt_step = ckpt.read_state(rm.ckpt_dir).get("step")
    out = {}
    for f in task_files:
        path = Path(f)
        items = load_task(path)
        results = ResultsFile(Path(run_dir) / "eval" / result_name(rm.ckpt_dir, path, few_shot, seed))
        try:
            score_task(scorer, rm.sp.encode, items, few_shot, seed, results)
        finally:
            results.close()
        summary = {"task": str(path), "checkpoint": str(rm.ckpt_dir), "step": ckpt_step,
                   "few_shot": few_shot, "seed": seed,
                   **summarize([results.records[i] for i in range(len(items))]),
                   "results": str(results.path)}
        results.path.with_suffix(".summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
        out[path.stem] = summary
    return ckpt_step, out


def main(run_dir, task_files: list[str], step: int | None = None, all_checkpoints: bool = False,
         few_shot: int = 0, seed: int = 1234, batch_size: int = 16) -> int:
    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train.eval.generate import set_graph_mode

    if few_shot < 0:
        from mspretrain.common.console import UsageError
        raise UsageError(f"--few-shot must be >= 0, got {few_shot}")
    for f in task_files:        # every file checked before the first forward
        load_task(f)
    set_graph_mode()
    if all_checkpoints:
        steps = [int(ckpt.read_state(p).get("step", -1)) for p in ckpt.list_checkpoints(run_dir)]
        if not steps:
            raise ckpt.CheckpointError(f"{run_dir} has no checkpoint yet")
    else:
        steps = [step]
    table = []
    for s in steps:
        got_step, summaries = eval_checkpoint(run_dir, s, task_files, few_shot, seed, batch_size)
        for name, summ in summaries.items():
            print(f"task {name} (step {got_step}, {summ['items']} items, {few_shot}-shot): "
                  + "  ".join(f"{m} {summ[m]:.4f}" for m in METRICS) + f"  ({summ['results']})")
        table.append((got_step, summaries))
    if all_checkpoints:
        print("\n".join(format_table(table)))
    return 0


def format_table(table: list[tuple[int | None, dict]]) -> list[str]:
    """step x (task, metric), one row per checkpoint."""
    names = list(table[0][1]) if table else []
    cols = [f"{n}/{m}" for n in names for m in METRICS]
    width = [max(len(c), 6) for c in cols]
    lines = ["step".rjust(10) + "  " + "  ".join(c.rjust(w) for c, w in zip(cols, width))]
    for step, summaries in table:
        vals = [f"{summaries[n][m]:.4f}" for n in names for m in METRICS]
        lines.append(str(step).rjust(10) + "  " + "  ".join(v.rjust(w) for v, w in zip(vals, width)))
    return lines
