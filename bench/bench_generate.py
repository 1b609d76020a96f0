"""Generation throughput: `train generate`'s KV-cache decoder against transformers' greedy `generate`
on the exported model, same prompts, same machine, same run (needs the `hf` extra: torch, transformers).

    .venv/bin/python bench/bench_generate.py [--run RUN] [--prompts 8] [--prompt-len 16] [--new 32]
                                             [--reps 5] [--steps-per-call 8]

Without --run it builds a small dataset from the demo corpus (seq 64, 1,000-piece tokenizer) and trains
configs/tiny.yaml on it for 20 steps first (about a minute): hidden 64, 2 layers, 4 query / 2 KV heads.
Both sides decode greedily in fp32 exactly --new tokens per prompt (no early stop), at batch 1 and at
batch --prompts, after one warm-up pass each (graph compile, caches). transformers runs in its own
process (MindSpore's runtime threads would slow torch in this one) and the two alternate, A B A B:
each repetition times one pass of ours, then one of theirs, and the ratio of that pair is kept; the
report gives the median ratio over --reps pairs and the load average. tokens/s counts new tokens.
Target: ours >= 0.5x transformers at every batch size reported.

The task rows time the scorer (`train eval --tasks`, mspretrain/train/eval/tasks.py) against
lm-evaluation-harness (`lm_eval`, needs the `hf` extra and lm_eval) on the same export: one multiple-
choice task of --task-items English items from the demo corpus (4 choices each, the items of
tests/train/eval/test_tasks.py), 0-shot, --task-batch rows per forward on both sides, each side with its
model loaded once, tokenization included. Ours: `score_task` into a fresh results file per pass. Theirs,
in its own process, two ways: `lm_eval.simple_evaluate` with its HFLM built once (what the lm_eval CLI
does per task: task set-up from the same local jsonl, no network, requests, scoring, metrics), and
`HFLM.loglikelihood` on the (context, choice) requests alone (its scoring, the stricter comparison).
A B A B as above; items/s; both sides report their accuracy, which must be equal.
Target: ours >= 1.0x lm-evaluation-harness in both.

    .venv/bin/python bench/bench_generate.py --rows tasks [--run RUN] [--task-items 64] [--task-batch 16]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "train"))
sys.path.insert(0, str(REPO))
TARGET = 0.5
TASK_TARGET = 1.0
EOS_ID = 2          # the exported tokenizer keeps unk 0, bos 1, eos 2, pad 3 (docs/export.md)


def prompts_from_valid(run_dir: Path, n: int, length: int) -> list[list[int]]:
    from mspretrain.loader import Loader
    from mspretrain.train.runinfo import read_run
    data = read_run(run_dir)["dataset"]["path"]
    with Loader(data, split="valid", global_batch_size=n, seed=0, num_workers=0) as ld:
        return next(ld)["input_ids"][:, :length].tolist()


class Ours:
    def __init__(self, run_dir: Path, batch: int, steps_per_call: int):
        import mindspore as ms
        from mspretrain.train.eval.generate import Generator, RunModel

        ms.set_context(mode=ms.GRAPH_MODE)
        ms.set_device("CPU")
        rm = RunModel(run_dir)
        self.gen = Generator(rm.args, rm.weights, eos_id=-1, pad_id=rm.pad_id, batch_size=batch,
                             steps_per_call=steps_per_call)

    def run(self, prompts, new: int) -> tuple[float, list]:
        from mspretrain.train.eval.generate import Sampling
        t = time.perf_counter()
        out = self.gen.generate(prompts, Sampling(max_new_tokens=new))
        return time.perf_counter() - t, out


def hf_worker(hf_dir: str) -> int:
    """Answers one JSON request per stdin line with one timed greedy pass."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    for line in sys.stdin:
        req = json.loads(line)
        prompts, new, batch = req["prompts"], req["new"], req["batch"]
        t = time.perf_counter()
        out = []
        for i in range(0, len(prompts), batch):
            ids = torch.tensor(prompts[i:i + batch])
            with torch.no_grad():
                full = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                      min_new_tokens=new, do_sample=False, use_cache=True,
                                      pad_token_id=model.config.pad_token_id)
            out += full[:, ids.shape[1]:].tolist()
        print(json.dumps({"seconds": time.perf_counter() - t, "out": out}), flush=True)
    return 0


def _until_eos(tokens: list[int]) -> list[int]:
    """The tokens before the first EOS: both sides produce --new tokens (ours does not stop, transformers
    is held to min_new_tokens, which forbids EOS), so they agree only up to the first EOS ours picks."""
    return tokens[:tokens.index(EOS_ID)] if EOS_ID in tokens else tokens


def lm_eval_worker(hf_dir: str, include: str, batch: int) -> int:
    """Answers one request per stdin line with one timed lm_eval pass over the task: "evaluate" runs
    `simple_evaluate` (what the lm_eval CLI runs: task set-up, requests, scoring, metrics), a list of
    items runs HFLM.loglikelihood on their (context, choice) requests alone (the scoring)."""
    import logging
    from lm_eval import simple_evaluate
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    logging.disable(logging.WARNING)
    lm = HFLM(pretrained=hf_dir, dtype="float32", batch_size=batch, device="cpu")
    tm = TaskManager(include_path=include)
    for line in sys.stdin:
        req = json.loads(line)
        t = time.perf_counter()
        if req == "evaluate":
            res = simple_evaluate(model=lm, tasks=["bench_task"], task_manager=tm, log_samples=False,
                                  verbosity="ERROR")
            acc = res["results"]["bench_task"]["acc,none"]
        else:
            reqs = [Instance("loglikelihood", doc=item, arguments=(item["context"], c), idx=k)
                    for item in req for k, c in enumerate(item["choices"])]
            lls = [ll for ll, _ in lm.loglikelihood(reqs, disable_tqdm=True)]
            picks, at = [], 0
            for item in req:
                mine = lls[at:at + len(item["choices"])]
                at += len(mine)
                picks.append(float(max(range(len(mine)), key=mine.__getitem__) == item["gold"]))
            acc = sum(picks) / len(picks)
        print(json.dumps({"seconds": time.perf_counter() - t, "acc": acc}), flush=True)
    return 0


class OursTasks:
    """`train eval --tasks`'s scorer with its model loaded once."""

    def __init__(self, run_dir: Path, batch: int, tmp: Path):
        from mspretrain.train.eval.generate import RunModel, set_graph_mode
        from mspretrain.train.models.llama.model import Llama
        from mspretrain.train.runinfo import set_weights
        from mspretrain.train.eval.score import training_args
        from mspretrain.train.eval.tasks import TaskScorer

        set_graph_mode()
        rm = RunModel(run_dir)
        model = Llama(training_args(rm), 0)
        set_weights(model, rm.weights, str(rm.ckpt_dir))
        self.scorer, self.encode, self.tmp, self.k = TaskScorer(model, rm.args.seq_length, rm.pad_id, batch), \
            rm.sp.encode, tmp, 0

    def run(self, items) -> tuple[float, float]:
        from mspretrain.train.eval.suite import ResultsFile
        from mspretrain.train.eval.tasks import score_task, summarize
        self.k += 1
        results = ResultsFile(self.tmp / f"pass-{self.k}.jsonl")
        t = time.perf_counter()
        try:
            score_task(self.scorer, self.encode, items, 0, 1234, results)
        finally:
            results.close()
        seconds = time.perf_counter() - t
        return seconds, summarize([results.records[i] for i in range(len(items))])["acc"]


class TheirsTasks:
    def __init__(self, hf_dir: Path, task_file: Path, batch: int, tmp: Path):
        from hf_helpers import lm_eval_env, write_lm_eval_task
        include = tmp / "lm_eval_tasks"
        write_lm_eval_task(include, "bench_task", task_file)
        env = lm_eval_env(tmp)
        self.log = open(tmp / "lm_eval.log", "w")
        self.p = subprocess.Popen([sys.executable, __file__, "--lm-eval-worker", str(hf_dir), str(include),
                                   str(batch)], text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self.log, env=env)

    def run(self, request) -> tuple[float, float]:
        self.p.stdin.write(json.dumps(request) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"the lm_eval worker exited ({self.p.wait()}): see {self.log.name}")
        r = json.loads(line)
        return r["seconds"], r["acc"]

    def close(self):
        self.p.stdin.close()
        self.p.wait()
        self.log.close()


def task_row(run_dir: Path, hf_dir: Path, tmp: Path, n_items: int, batch: int, reps: int) -> bool:
    from mspretrain.train.eval.tasks import load_task
    from test_tasks import corpus_items
    items = [i for i in corpus_items("en", 2 * n_items, 7) if all(i["choices"])][:n_items]   # no empty choice
    task_file = tmp / "bench_task.jsonl"
    task_file.write_text("".join(json.dumps(i) + "\n" for i in items))
    items = load_task(task_file)       # what `train eval --tasks` reads
    print(f"task scorer: {n_items} items x 4 choices, 0-shot, {batch} rows per forward, {reps} A/B pairs")
    ours, theirs = OursTasks(run_dir, batch, tmp), TheirsTasks(hf_dir, task_file, batch, tmp)
    ok = True
    try:
        ours.run(items)                 # warm-up: compile
        theirs.run("evaluate")          # warm-up: the task's dataset cache
        for what, request in (("lm_eval simple_evaluate (the CLI's work)", "evaluate"),
                              ("lm_eval HFLM.loglikelihood (scoring alone)", items)):
            ratios, ta, tb = [], [], []
            for _ in range(reps):
                a, acc_a = ours.run(items)
                b, acc_b = theirs.run(request)
                ratios.append(b / a)
                ta.append(a)
                tb.append(b)
            ratio = statistics.median(ratios)
            same = abs(acc_a - acc_b) < 1e-12
            ok &= ratio >= TASK_TARGET and same
            print(f"tasks: train eval --tasks {n_items / statistics.median(ta):,.1f} items/s   {what} "
                  f"{n_items / statistics.median(tb):,.1f} items/s   median ratio {ratio:.2f}x "
                  f"(pairs {', '.join(f'{r:.2f}' for r in ratios)}; target >= {TASK_TARGET}x: "
                  f"{'met' if ratio >= TASK_TARGET else 'NOT met'})   accuracy {acc_a:.4f} vs {acc_b:.4f}"
                  f"{'' if same else ' DIFFERENT'}")
    finally:
        theirs.close()
    return ok


class Theirs:
    def __init__(self, hf_dir: Path):
        self.p = subprocess.Popen([sys.executable, __file__, "--hf-worker", str(hf_dir)], text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def run(self, prompts, new: int, batch: int) -> tuple[float, list]:
        self.p.stdin.write(json.dumps({"prompts": prompts, "new": new, "batch": batch}) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"the transformers worker exited ({self.p.wait()})")
        r = json.loads(line)
        return r["seconds"], r["out"]

    def close(self):
        self.p.stdin.close()
        self.p.wait()


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--hf-worker":
        return hf_worker(sys.argv[2])
    if len(sys.argv) == 5 and sys.argv[1] == "--lm-eval-worker":
        return lm_eval_worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="a run dir (default: build a dataset and train a tiny run)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps-per-call", type=int, default=8, help="decode steps per graph launch (ours)")
    ap.add_argument("--rows", default="generate,tasks", help="which rows: generate, tasks or both")
    ap.add_argument("--task-items", type=int, default=64)
    ap.add_argument("--task-batch", type=int, default=16, help="rows per forward, both sides")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_generate-"))
    run_dir = Path(args.run) if args.run else None
    if run_dir is None:
        from hf_helpers import build_spm_dataset, train_run
        data = build_spm_dataset(tmp / "data")
        run_dir = train_run(tmp / "run", data, steps=20)
    from mspretrain.train.hf.convert import export_run
    hf_dir = export_run(run_dir, tmp / "hf")
    ok = True
    rows = set(args.rows.split(","))
    if "generate" in rows:
        ok &= generate_row(run_dir, hf_dir, args)
    if "tasks" in rows:
        ok &= task_row(run_dir, hf_dir, tmp, args.task_items, args.task_batch, args.reps)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0 if ok else 1


def generate_row(run_dir: Path, hf_dir: Path, args) -> bool:
    prompts = prompts_from_valid(run_dir, args.prompts, args.prompt_len)
    n_tok = len(prompts) * args.new
    print(f"{len(prompts)} prompts of {args.prompt_len} tokens, {args.new} new tokens each, greedy fp32, "
          f"{args.steps_per_call} decode steps per graph launch, {args.reps} A/B pairs")
    theirs = Theirs(hf_dir)
    ok = True
    try:
        for batch in (1, len(prompts)):
            ours = Ours(run_dir, batch, args.steps_per_call)
            ours.run(prompts, args.new)                      # warm-up: compile
            theirs.run(prompts, args.new, batch)             # warm-up
            ratios, ta, tb = [], [], []
            for _ in range(args.reps):
                a, out_a = ours.run(prompts, args.new)
                b, out_b = theirs.run(prompts, args.new, batch)
                ratios.append(b / a)
                ta.append(a)
                tb.append(b)
            same = sum(_until_eos(x) == y[:len(_until_eos(x))] for x, y in zip(out_a, out_b))
            ratio = statistics.median(ratios)
            ok &= ratio >= TARGET
            print(f"batch {batch}: train generate {n_tok / statistics.median(ta):,.0f} tok/s   transformers "
                  f"{n_tok / statistics.median(tb):,.0f} tok/s   median ratio {ratio:.2f}x "
                  f"(pairs {', '.join(f'{r:.2f}' for r in ratios)}; target >= {TARGET}x: "
                  f"{'met' if ratio >= TARGET else 'NOT met'})   identical up to EOS {same}/{len(prompts)}")
    finally:
        theirs.close()
    return ok


if __name__ == "__main__":
    sys.exit(main())
