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
        from mspretrain.train.generate import Generator, RunModel

        ms.set_context(mode=ms.GRAPH_MODE)
        ms.set_device("CPU")
        rm = RunModel(run_dir)
        self.gen = Generator(rm.args, rm.weights, eos_id=-1, pad_id=rm.pad_id, batch_size=batch,
                             steps_per_call=steps_per_call)

    def run(self, prompts, new: int) -> tuple[float, list]:
        from mspretrain.train.generate import Sampling
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="a run dir (default: build a dataset and train a tiny run)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--steps-per-call", type=int, default=8, help="decode steps per graph launch (ours)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_generate-"))
    run_dir = Path(args.run) if args.run else None
    if run_dir is None:
        from hf_helpers import build_spm_dataset, train_run
        data = build_spm_dataset(tmp / "data")
        run_dir = train_run(tmp / "run", data, steps=20)
    from mspretrain.train.hf import export_run
    hf_dir = export_run(run_dir, tmp / "hf")
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
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
