"""A dataset whose manifest was edited or whose tokenizer was replaced: `train launch`
refuses it at once, naming the file, before a graph is compiled; `generate` refuses a run whose copy
of the tokenizer was replaced."""
from __future__ import annotations

import json
import shutil

import pytest

from hf_helpers import cli
from mspretrain.loader.manifest import compute_fingerprint, load_manifest
from trainer_harness import launch_cmd, run

SETS = ("train.steps=2", "eval.every_steps=0")


def copy_data(spm_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(spm_data, data)
    for p in data.rglob("*"):
        if p.is_file():
            p.chmod(0o644)
    return data


def edit_manifest(data, edit, refingerprint: bool = False):
    path = data / "manifest.json"
    d = json.loads(path.read_text())
    edit(d)
    if refingerprint:       # a careful hand: the fingerprint recomputed after the edit
        path.write_text(json.dumps(d))
        m = load_manifest(data)
        d["fingerprint"] = compute_fingerprint(m.seq_length, m.tokenizer.sha256, m.splits, m.config)
    path.write_text(json.dumps(d))


def fewer_samples(d, n: int = 10):
    train = d["splits"]["train"]
    train["num_samples"] -= n
    train["shards"][-1]["num_samples"] -= n


def set_tokenizer(**kw):
    return lambda d: d["tokenizer"].update(kw)


def set_seq_length(d):
    d["seq_length"] = 32


@pytest.mark.parametrize("damage, message", [
    ("tokenizer", "tokenizer.model: sha256 differs from tokenizer.sha256 in"),
    ((fewer_samples, False), "manifest.json: its fingerprint is not the hash of its contents"),
    ((set_seq_length, False), "manifest.json: its fingerprint is not the hash of its contents"),
    ((set_seq_length, True), "rows of [65] tokens, the manifest's seq_length 32 needs [33]"),
    ((set_tokenizer(eos_id=5), False), "manifest.json: tokenizer.eos_id is 5, but tokenizer.model has 2"),
    ((set_tokenizer(vocab_size=900), False),
     "manifest.json: tokenizer.vocab_size is 900, but tokenizer.model has 1000"),
])
def test_a_tampered_dataset_is_refused_at_launch(spm_data, tmp_path, damage, message):
    data = copy_data(spm_data, tmp_path)
    if damage == "tokenizer":       # another model in its place (here: one byte changed)
        tok = data / "tokenizer.model"
        raw = bytearray(tok.read_bytes())
        raw[len(raw) // 2] ^= 1
        tok.write_bytes(bytes(raw))
    else:
        edit_manifest(data, *damage)
    run_dir = tmp_path / "run"
    r = run(launch_cmd(run_dir, data, *SETS))
    assert r.returncode == 1, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "tokenizer.model").exists()


def test_generate_refuses_a_replaced_run_tokenizer(spm_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(spm_run, run_dir)
    tok = run_dir / "tokenizer.model"
    tok.chmod(0o644)
    raw = bytearray(tok.read_bytes())
    raw[len(raw) // 2] ^= 1
    tok.write_bytes(bytes(raw))
    r = cli("generate", run_dir, "--prompt", "The", "--max-new-tokens", "2")
    assert r.returncode == 1, r.stderr
    assert f"{tok}: sha256 differs from the tokenizer {run_dir / 'run.json'} records" in r.stderr
