"""`train export --format hf` and `train import`, checked by Hugging Face transformers itself (torch CPU):
logits and loss, greedy generation, the tokenizer, and import(export(run)) bit for bit."""
from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest

from hf_helpers import cli, import_cmd, jsonl, train_cmd
from trainer_harness import run

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def exported(spm_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "model"
    p = cli("export", spm_run, "--format", "hf", "--out", out)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def hf_model(exported):
    model = transformers.LlamaForCausalLM.from_pretrained(exported, torch_dtype=torch.float32)
    return model.eval()


def valid_batches(data, n: int, batch: int = 8, seed: int = 1234) -> list[np.ndarray]:
    """The samples `train eval` reads: the first n batches of the valid split's order."""
    from mspretrain.loader import Loader
    with Loader(data, split="valid", global_batch_size=batch, seed=seed, num_workers=0) as ld:
        return [next(ld)["input_ids"] for _ in range(n)]


def test_export_files(exported, spm_data):
    names = sorted(p.name for p in exported.iterdir())
    assert names == ["config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
                     "tokenizer.json", "tokenizer.model", "tokenizer_config.json"]
    config = json.loads((exported / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["tie_word_embeddings"]) == \
        (4, 2, False)
    assert (exported / "tokenizer.model").read_bytes() == (spm_data / "tokenizer.model").read_bytes()


def test_logits_match_the_trainer_forward(spm_run, spm_data, hf_model, graph_mode):
    from mindspore import Tensor
    from mspretrain.train.runinfo import load_run_model

    model, _, _ = load_run_model(spm_run)
    tokens = valid_batches(spm_data, 1)[0][:, :-1]
    ours = model(Tensor(tokens)).asnumpy()
    with torch.no_grad():
        theirs = hf_model(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    assert ours.shape == theirs.shape
    diff = float(np.abs(ours - theirs).max())
    assert diff <= 1e-4, diff
    assert np.abs(ours).max() > 1.0     # a trained model, not all zeros


def test_loss_and_accuracy_equal_train_eval(spm_run, spm_data, hf_model):
    p = run(train_cmd("eval", spm_run, spm_data))
    assert p.returncode == 0, p.stderr[-3000:]
    val_loss = float(re.search(r"val_loss ([0-9.]+)", p.stdout).group(1))
    acc = float(re.search(r"eval: loss [0-9.]+ +ppl [0-9.]+ +acc ([0-9.]+) +\((\d+) samples", p.stdout).group(1))
    assert "(32 samples" in p.stdout        # eval.batch_size 0: twice configs/tiny.yaml's batch of 8
    losses, hits, close, n = [], 0, 0, 0
    for batch in valid_batches(spm_data, 2, 16):        # configs/tiny.yaml: eval.batches 2
        ids = torch.from_numpy(batch.astype(np.int64))
        with torch.no_grad():
            logits = hf_model(ids[:, :-1]).logits
        losses.append(float(torch.nn.functional.cross_entropy(
            logits.reshape(-1, hf_model.config.vocab_size), ids[:, 1:].reshape(-1))))
        hits += int((logits.argmax(-1) == ids[:, 1:]).sum())
        top2 = logits.topk(2, -1).values
        close += int((top2[..., 0] - top2[..., 1] <= 1e-4).sum())  # the logits' tolerance: argmax may differ
        n += ids[:, 1:].numel()
    hf_loss = float(np.mean(losses))
    assert abs(hf_loss - val_loss) / val_loss <= 1e-5, (hf_loss, val_loss)
    assert 0.05 < acc < 0.9
    assert abs(acc * n - hits) <= close + 0.5e-4 * n, (acc, hits / n, close)   # printed with 4 decimals


def test_tokenizer_gives_the_dataset_ids(exported, spm_data):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(spm_data / "tokenizer.model"))
    texts = ["Debian is a free operating system.\nIt uses  two spaces and 12345 digits.",
             " a leading space", "apt-get install foo\n\n\nbar", "中文 和 emoji 🙂 bytes",
             "tabs\tand trailing space ", "The licence is granted", "<s> and </s> are text"]
    # the fast tokenizer (tokenizer.json, what AutoTokenizer and every tool on it load) and the slow one;
    # tests/train/hf/test_hf_tokenizer.py compares them on 10,000 texts
    for tok in (transformers.AutoTokenizer.from_pretrained(exported),
                transformers.LlamaTokenizer.from_pretrained(exported)):
        for text in texts:
            assert tok(text)["input_ids"] == sp.encode(text), (type(tok).__name__, text)
            assert tok.decode(sp.encode(text)) == text
        assert (tok.unk_token_id, tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2, 3)


def test_greedy_generation_matches_transformers(spm_run, spm_data, hf_model, tmp_path):
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(spm_data / "tokenizer.model"))
    prompts = [[2] + sp.encode("The package manager"), [2] + sp.encode("Debian"),
               valid_batches(spm_data, 1)[0][0, :20].tolist()]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"tokens": p}) + "\n" for p in prompts))
    out = tmp_path / "out.jsonl"
    p = cli("generate", spm_run, "--prompts", path, "--max-new-tokens", 16, "--out", out)
    assert p.returncode == 0, p.stderr[-3000:]
    ours = [r["tokens"] for r in jsonl(out)]
    for prompt, mine in zip(prompts, ours):
        with torch.no_grad():
            full = hf_model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False,
                                     eos_token_id=2, pad_token_id=3)
        assert full[0, len(prompt):].tolist() == mine


@pytest.mark.slow
def test_import_of_export_is_bitwise_and_trains(spm_run, spm_data, exported, tmp_path):
    from mspretrain.train.runinfo import checkpoint_dir, model_weights

    new = tmp_path / "imported"
    train = ("train.steps=4", "checkpoint.every_steps=2")       # import with the config it trains with
    p = run(import_cmd(new, spm_data, exported, *train))
    assert p.returncode == 0, p.stderr[-3000:]
    before = model_weights(checkpoint_dir(spm_run))
    after = model_weights(checkpoint_dir(new, 0))
    assert sorted(before) == sorted(after)
    for name in before:
        assert before[name].tobytes() == after[name].tobytes(), name
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"text": "Debian"}\n{"text": "The package"}\n')
    p = run(train_cmd("launch", new, spm_data, *train, "eval.every_steps=2", "eval.suite_in_loop=true",
                      "eval.suite_every_steps=4", f"eval.prompts={prompts}", "eval.gen_tokens=4",
                      "eval.batch_size=4") + ["--resume", "auto"])
    assert p.returncode == 0, p.stderr[-3000:]
    losses = [r["loss"] for r in jsonl(new / "metrics.jsonl") if not r.get("eval")]
    evals = [r for r in jsonl(new / "metrics.jsonl") if r.get("eval")]      # the in-loop eval suite
    assert [r["step"] for r in evals] == [2, 4] and all(0 < r["val_bits_per_byte"] < 8 for r in evals)
    assert all(0 < r["val_acc"] < 1 for r in evals)
    # the generation metrics at multiples of eval.suite_every_steps only; batches of eval.batch_size rows
    assert ["generation" in r for r in evals] == [False, True]
    assert sorted(p.name.split("-")[-1] for p in (new / "eval").glob("step_*-valid-*.jsonl")) == ["2x4.jsonl"] * 2
    assert len(losses) == 4 and all(np.isfinite(losses))
    trained = model_weights(checkpoint_dir(new))
    assert any(trained[n].tobytes() != after[n].tobytes() for n in after)
    # it continued from the imported weights: its first loss is far below a fresh model's (~ln 1000)
    assert losses[0] < 6.5


def test_bf16_export_loads_close(spm_run, spm_data, hf_model, tmp_path):
    out = tmp_path / "bf16"
    p = cli("export", spm_run, "--format", "hf", "--out", out, "--dtype", "bf16")
    assert p.returncode == 0, p.stderr[-3000:]
    m = transformers.LlamaForCausalLM.from_pretrained(out, torch_dtype="auto")
    assert m.dtype == torch.bfloat16
    w32 = hf_model.model.embed_tokens.weight.detach()
    w16 = m.model.embed_tokens.weight.detach().float()
    assert torch.equal(w16, w32.to(torch.bfloat16).float())     # round to nearest even, like torch


def test_import_refuses_another_tokenizer_and_model(spm_data, exported, tmp_path):
    import sentencepiece as spm
    other = tmp_path / "other"
    shutil.copytree(exported, other)
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(f"line {i} of another corpus with other words" for i in range(200)))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=40, hard_vocab_limit=False,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=3, minloglevel=2)
    shutil.copyfile(tmp_path / "sp.model", other / "tokenizer.model")
    p = run(import_cmd(tmp_path / "r1", spm_data, other))
    assert p.returncode == 1 and "tokenizer mismatch" in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "r1" / "checkpoints").exists()
    p = run(import_cmd(tmp_path / "r2", spm_data, exported, "model.hidden_size=32"))
    assert p.returncode == 1 and "hidden_size=64 but the config gives 32" in p.stderr, p.stderr[-2000:]
    # a model whose tokenizer is only a tokenizer.json: checked from it (here: another vocabulary)
    from mspretrain.train.hf.tokenizer import build
    (other / "tokenizer.model").unlink()
    build(tmp_path / "sp.model").save(str(other / "tokenizer.json"))
    p = run(import_cmd(tmp_path / "r3", spm_data, other))
    assert p.returncode == 1 and "tokenizer mismatch" in p.stderr and "tokenizer.json" in p.stderr, p.stderr[-2000:]


def test_import_reads_a_tokenizer_json_only_model(spm_data, exported, tmp_path):
    other = tmp_path / "fast-only"
    shutil.copytree(exported, other)
    (other / "tokenizer.model").unlink()
    p = run(import_cmd(tmp_path / "run", spm_data, other))
    assert p.returncode == 0, p.stderr[-2000:]
    assert "warning" not in p.stdout + p.stderr      # its tokenizer.json encodes the probes as sentencepiece
    assert (tmp_path / "run" / "checkpoints" / "latest").exists()


@pytest.mark.slow
def test_tied_head_and_plain_attention_export_exactly(spm_data, tmp_path, graph_mode):
    from mindspore import Tensor
    from hf_helpers import train_run
    from mspretrain.train.runinfo import load_run_model

    run_dir = train_run(tmp_path / "tied", spm_data, "model.tie_embeddings=true", "model.num_kv_heads=0",
                        steps=3)
    out = tmp_path / "hf"
    p = cli("export", run_dir, "--format", "hf", "--out", out)
    assert p.returncode == 0, p.stderr[-3000:]
    hf = transformers.LlamaForCausalLM.from_pretrained(out, torch_dtype=torch.float32).eval()
    assert hf.config.tie_word_embeddings and hf.config.num_key_value_heads == 4
    model, _, _ = load_run_model(run_dir)
    tokens = valid_batches(spm_data, 1)[0][:4, :-1]
    with torch.no_grad():
        theirs = hf(torch.from_numpy(tokens.astype(np.int64))).logits.numpy()
    assert float(np.abs(model(Tensor(tokens)).asnumpy() - theirs).max()) <= 1e-4
