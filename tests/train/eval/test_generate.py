"""KV-cache generation (mspretrain/train/eval/generate.py): its logits are models/llama/model.py's forward, decoding is
deterministic for a seed, and the command reports bad prompts by file and line."""
from __future__ import annotations


import numpy as np
import pytest

from hf_helpers import cli, jsonl

ARGS = dict(vocab_size=96, seq_length=16, hidden_size=32, num_layers=2, num_heads=4)


def model_and_weights(tied: bool, kv_heads: int):
    from mspretrain.train.models.llama.model import Llama, ModelArgs
    args = ModelArgs(**ARGS, num_kv_heads=kv_heads, tie_embeddings=tied)
    model = Llama(args, seed=7)
    return args, model, {n: p.asnumpy() for n, p in model.parameters_and_names()}


@pytest.mark.parametrize("tied,kv_heads", [(False, 2), (True, 1)])
def test_prefill_and_decode_logits_are_the_model_forward(graph_mode, tied, kv_heads):
    from mindspore import Tensor, mutable
    from mspretrain.train.models.llama.decode import DecodeStep, Prefill, Weights

    args, model, w = model_and_weights(tied, kv_heads)
    tokens = np.random.default_rng(1).integers(0, args.vocab_size, (2, 16)).astype(np.int32)
    ref = model(Tensor(tokens)).asnumpy()
    prompt = 5
    padded = tokens.copy()
    padded[:, prompt:] = 3                  # what comes after the prompt must not matter
    fused = Weights(args, w)
    logits, kc, vc = Prefill(args, fused)(Tensor(padded), Tensor(np.array([prompt - 1] * 2, np.int32)))
    assert np.abs(logits.asnumpy() - ref[:, prompt - 1]).max() <= 1e-5
    step = DecodeStep(args, fused)
    for pos in range(prompt, 16):
        logits, kc, vc = step(Tensor(tokens[:, pos]), Tensor(np.array([pos, pos], np.int32)), mutable(kc), mutable(vc))
        assert np.abs(logits.asnumpy() - ref[:, pos]).max() <= 1e-5, pos


@pytest.fixture(scope="module")
def gen():
    import mindspore as ms
    from mspretrain.train.eval.generate import Generator

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    args, _, w = model_and_weights(False, 2)
    return Generator(args, w, eos_id=-1, pad_id=3, batch_size=2)   # no EOS: max_new_tokens each


def test_rows_of_different_lengths_decode_independently(gen):
    from mspretrain.train.eval.generate import Sampling

    a, b, c = [5, 9, 11, 40], [7, 8], [60]
    greedy = Sampling(max_new_tokens=8)
    together = gen.generate([a, b, c], greedy)        # batches [a, b], [c]
    assert [len(r) for r in together] == [8, 8, 8]
    assert together == [gen.generate([p], greedy)[0] for p in (a, b, c)]
    sampled = Sampling(8, temperature=1.0, seed=2)   # prompt i samples from stream (seed, i)
    assert gen.generate([a, b], sampled)[0] == gen.generate([a], sampled)[0]
    # a prompt of 14 tokens grows to the end of the rotary table (position 16) and no further
    long = gen.generate([list(range(10, 24))], Sampling(max_new_tokens=10))[0]
    assert len(long) == 3


def test_sampling_is_deterministic_for_a_seed(gen):
    from mspretrain.train.eval.generate import Sampling

    prompts = [[5, 6, 7], [9]]
    s = Sampling(max_new_tokens=10, temperature=1.5, top_p=0.95, seed=3)
    first = gen.generate(prompts, s)
    assert first == gen.generate(prompts, s)
    assert first != gen.generate(prompts, Sampling(10, 1.5, 0.95, seed=4))
    assert all(len(r) == 10 for r in first)
    greedy = gen.generate(prompts, Sampling(max_new_tokens=10))
    assert gen.generate(prompts, Sampling(10, temperature=1.0, top_p=1e-6, seed=9)) == greedy


def test_generate_command(spm_run, tmp_path):
    p = cli("generate", spm_run, "--prompt", "The package", "--max-new-tokens", 8)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("The package")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"tokens": [1, "x"]}\n')
    p = cli("generate", spm_run, "--prompts", bad)
    assert p.returncode == 1 and f"{bad}:2: field 'tokens' must be a list of integers" in p.stderr
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"text": "Debian"}\n{"tokens": [2, 300, 301]}\n')
    out1, out2 = tmp_path / "o1.jsonl", tmp_path / "o2.jsonl"
    for out in (out1, out2):
        p = cli("generate", spm_run, "--prompts", prompts, "--temperature", "0.8", "--top-p", "0.9",
                "--seed", "5", "--max-new-tokens", 12, "--out", out)
        assert p.returncode == 0, p.stderr[-2000:]
    assert out1.read_text() == out2.read_text()
    rows = jsonl(out1)
    assert [r["prompt_tokens"][0] for r in rows] == [2, 2] and all(1 <= len(r["tokens"]) <= 12 for r in rows)


def test_chunked_decoding_is_the_full_forward_and_stops_at_eos(gen, graph_mode):
    """Greedy decoding in chunks of 3 steps per graph launch (the last chunk padded) gives the argmax
    of the model's full forward at every step; a row stops right after the EOS it produced; sampled
    tokens do not depend on the chunk size (the n-th token draws the n-th number of its stream)."""
    from mindspore import Tensor
    from mspretrain.train.eval.generate import Generator, Sampling

    args, model, w = model_and_weights(False, 2)
    prompts = [[5, 9, 11, 40], [7, 8]]

    def full_forward_greedy(p, n):
        seq = list(p)
        for _ in range(n):
            x = np.full((1, args.seq_length), 3, np.int32)
            x[0, :len(seq)] = seq
            seq.append(int(model(Tensor(x)).asnumpy()[0, len(seq) - 1].argmax()))
        return seq[len(p):]

    greedy = gen.generate(prompts, Sampling(max_new_tokens=8))
    assert greedy == [full_forward_greedy(p, 8) for p in prompts]
    eos = greedy[1][2]                                  # a token row 1 produces (maybe earlier too)
    chunked = Generator(args, w, eos_id=eos, pad_id=3, batch_size=2, steps_per_call=3)

    def until_eos(row):
        return row[:row.index(eos) + 1] if eos in row else row

    assert chunked.generate(prompts, Sampling(max_new_tokens=8)) == [until_eos(r) for r in greedy]
    s = Sampling(max_new_tokens=10, temperature=1.2, top_p=0.9, seed=11)
    assert chunked.generate(prompts, s) == [until_eos(r) for r in gen.generate(prompts, s)]
