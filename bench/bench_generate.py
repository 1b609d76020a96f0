"""Generation throughput: `train generate`'s KV-cache decoder against transformers' greedy `generate`
on the exported model, same prompts, same machine, same run (needs the `hf` extra: torch, transformers).

    .venv/bin/python bench/bench_generate.py [--run RUN] [--prompts 8] [--prompt-len 16] [--new 32]

Without --run it builds a small dataset from the demo corpus and trains configs/tiny.yaml for a few
steps first (about a minute). Both sides decode greedily in fp32 exactly --new tokens per prompt (no
early stop), after one warm-up call each (graph compile, caches); tokens/s counts new tokens.
Target: ours >= 0.5x transformers.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "tests" / "train"))
sys.path.insert(0, str(REPO))


def prompts_from_valid(run_dir: Path, n: int, length: int) -> list[list[int]]:
    from loader import Loader
    from train.runinfo import read_run
    data = read_run(run_dir)["dataset"]["path"]
    with Loader(data, split="valid", global_batch_size=n, seed=0, num_workers=0) as ld:
        return next(ld)["input_ids"][:, :length].tolist()


def ours(run_dir: Path, prompts, new: int, batch: int, reps: int) -> tuple[float, list]:
    import mindspore as ms
    from train.generate import Generator, RunModel, Sampling

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    rm = RunModel(run_dir)
    gen = Generator(rm.args, rm.weights, eos_id=-1, pad_id=rm.pad_id, batch_size=batch)
    s = Sampling(max_new_tokens=new)
    gen.generate(prompts[:batch], s)                       # warm-up: compile
    t = time.perf_counter()
    for _ in range(reps):
        out = gen.generate(prompts, s)
    return reps * len(prompts) * new / (time.perf_counter() - t), out


def theirs(hf_dir: Path, prompts, new: int, batch: int, reps: int) -> tuple[float, list]:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()

    def run():
        out = []
        for i in range(0, len(prompts), batch):
            ids = torch.tensor(prompts[i:i + batch])
            with torch.no_grad():
                full = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                      min_new_tokens=new, do_sample=False, use_cache=True,
                                      pad_token_id=model.config.pad_token_id)
            out += full[:, ids.shape[1]:].tolist()
        return out

    run()                                                   # warm-up
    t = time.perf_counter()
    for _ in range(reps):
        out = run()
    return reps * len(prompts) * new / (time.perf_counter() - t), out


def theirs_in_subprocess(hf_dir: Path, prompts, new: int, batch: int, reps: int) -> tuple[float, list]:
    """transformers in its own process: MindSpore's runtime threads in this one would slow torch."""
    spec = json.dumps({"hf_dir": str(hf_dir), "prompts": prompts, "new": new, "batch": batch, "reps": reps})
    p = subprocess.run([sys.executable, __file__, "--hf-worker", spec], capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(p.stderr[-3000:])
    result = json.loads(p.stdout.strip().splitlines()[-1])
    return result["tok_s"], result["out"]


def main() -> int:
    if len(sys.argv) == 3 and sys.argv[1] == "--hf-worker":
        spec = json.loads(sys.argv[2])
        tok_s, out = theirs(Path(spec["hf_dir"]), spec["prompts"], spec["new"], spec["batch"], spec["reps"])
        print(json.dumps({"tok_s": tok_s, "out": out}))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="a run dir (default: build a dataset and train a tiny run)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench_generate-"))
    run_dir = Path(args.run) if args.run else None
    if run_dir is None:
        from hf_helpers import build_spm_dataset, train_run
        data = build_spm_dataset(tmp / "data")
        run_dir = train_run(tmp / "run", data, steps=20)
    from train.hf import export_run
    hf_dir = export_run(run_dir, tmp / "hf")
    prompts = prompts_from_valid(run_dir, args.prompts, args.prompt_len)
    print(f"{len(prompts)} prompts of {args.prompt_len} tokens, {args.new} new tokens each, greedy fp32")
    for batch in (1, len(prompts)):
        a, out_a = ours(run_dir, prompts, args.new, batch, args.reps)
        b, out_b = theirs_in_subprocess(hf_dir, prompts, args.new, batch, args.reps)
        same = sum(x == y for x, y in zip(out_a, out_b))
        print(f"batch {batch}: train generate {a:,.0f} tok/s   transformers {b:,.0f} tok/s   "
              f"ratio {a / b:.2f}x (target >= 0.5x)   identical generations {same}/{len(prompts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
