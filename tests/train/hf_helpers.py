"""Helpers for the export/import, generation, scoring and eval-suite tests: a small dataset built by
`dataprep build` (real sentencepiece tokenizer, provenance) and a tiny run trained on it."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from trainer_harness import REPO, TINY, run

CORPUS = REPO / "demo" / "corpus" / "debian-reference.en.txt.gz"
BUILD_SETTINGS = ["--seq-length", "64", "--vocab-size", "1000", "--valid-fraction", "0.1",
                  "--set", "tokenizer.character_coverage=0.995", "--set", "tokenizer.num_threads=1",
                  "--set", "tokenizer.byte_fallback=true", "--set", "input.text_unit=paragraph",
                  "--no-progress"]


def build_spm_dataset(out: Path, *extra: str) -> Path:
    """The English half of the demo corpus as a dataset: seq 64, a 1,000-piece unigram tokenizer."""
    from mspretrain.dataprep.cli import main as dataprep_main
    rc = dataprep_main(["build", str(CORPUS), "--out", str(out), *BUILD_SETTINGS, *extra])
    assert rc == 0, f"dataprep build failed ({rc})"
    return out


def train_cmd(command: str, run_dir: Path, data: Path, *sets: str) -> list[str]:
    cmd = [sys.executable, "-m", "mspretrain.train", command, "--config", str(TINY), "--set", f"data.path={data}",
           f"run.dir={run_dir}", "data.num_workers=0", "eval.every_steps=0",
           # a Hugging Face Llama attends across packed documents: compare like with like
           "model.document_mask=false", "model.reset_position_ids=false", "train.eod_mask_loss=false"]
    for s in sets:
        cmd += ["--set", s]
    return cmd


def train_run(run_dir: Path, data: Path, *sets: str, steps: int = 20) -> Path:
    p = run(train_cmd("launch", run_dir, data, f"train.steps={steps}", *sets))
    assert p.returncode == 0, p.stderr[-3000:]
    return run_dir


def cli(*args: str, timeout: float = 300):
    return run([sys.executable, "-m", "mspretrain.train", *map(str, args)], timeout=timeout)


def jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def import_cmd(run_dir: Path, data: Path, hf_dir: Path, *sets: str) -> list[str]:
    cmd = train_cmd("import", run_dir, data, *sets)
    return cmd[:4] + ["--from", str(hf_dir)] + cmd[4:]


def write_lm_eval_task(include: Path, name: str, data: Path, metrics: tuple = ("acc",)) -> Path:
    """An lm-evaluation-harness task named `name` over our task jsonl `data` ({"context", "choices",
    "gold"} lines), written into the --include_path folder `include`: a multiple-choice task whose
    choices follow the context directly, as `train eval --tasks` scores them."""
    include.mkdir(parents=True, exist_ok=True)
    path = include / f"{name}.yaml"
    path.write_text("\n".join([
        f"task: {name}", "dataset_path: json", "dataset_kwargs:", "  data_files:", f"    test: {data}",
        "test_split: test", "output_type: multiple_choice", "doc_to_text: context",
        "doc_to_choice: choices", "doc_to_target: gold", 'target_delimiter: ""', "metric_list:",
        *(f"  - metric: {m}" for m in metrics)]) + "\n")
    return path


def lm_eval_env(tmp: Path) -> dict:
    """The environment lm-eval runs in here: offline (the task is a local file), its own HF home."""
    return {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp / "hf_home"),
            "TOKENIZERS_PARALLELISM": "false"}
