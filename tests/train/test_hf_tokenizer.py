"""The exported tokenizer through what Hugging Face users call: `AutoTokenizer` (the fast tokenizer of
tokenizer.json, the default of every transformers-based tool), `LlamaTokenizer` (the slow one) and
sentencepiece give the same ids and the same decoding on >= 10,000 texts of the demo corpus (English,
Chinese, code and shell lines) and generated edge cases, for a unigram and a BPE model trained as
`dataprep build` trains them."""
from __future__ import annotations

import gzip
import io
import json
import random

import pytest

from trainer_harness import REPO

transformers = pytest.importorskip("transformers")
CORPUS = REPO / "demo" / "corpus"


def corpus_lines() -> list[str]:
    import zstandard
    out = []
    for name in ("debian-reference.en.txt.gz", "debian-reference.zh-cn.txt.gz"):
        out += gzip.open(CORPUS / name, "rt", encoding="utf-8").read().splitlines()
    with zstandard.ZstdDecompressor().stream_reader(open(CORPUS / "debian-reference-html.jsonl.zst", "rb")) as f:
        out += [json.loads(line)["text"] for line in io.TextIOWrapper(f, encoding="utf-8")]
    return [line for line in out if line.strip()]


def edge_cases(lines: list[str], rng: random.Random) -> list[str]:
    """What the corpus has at its edges, and what looks like a special token."""
    pick = lambda n: rng.sample(lines, n)  # noqa: E731
    out = ["", " ", "  ", "\n", "\t", "\n\n", " \n ", "\r\n", "\u2581", "\u2581x \u2581"]
    out += [" " + x for x in pick(300)] + [x + " " for x in pick(300)] + ["  " + x + "\t " for x in pick(200)]
    out += [x.replace(" ", "\t") for x in pick(200)] + [x.replace(" ", "  ") for x in pick(200)]
    out += ["\n".join(lines[k:k + rng.randint(2, 5)]) for k in rng.sample(range(len(lines) - 5), 500)]
    out += [str(rng.randrange(10 ** rng.randint(1, 25))) for _ in range(200)]
    out += [f"version {rng.randint(0, 99)}.{rng.randint(0, 999)} of {rng.randint(1990, 2030)}-0{rng.randint(1, 9)}"
            for _ in range(100)]
    rare = [(0x1F300, 0x1F6FF), (0x3400, 0x4DBF), (0x0400, 0x04FF), (0x0600, 0x06FF), (0x0900, 0x097F),
            (0x0300, 0x036F), (0x20000, 0x2A6DF), (0xE000, 0xE0FF)]    # emoji, CJK ext., scripts, marks
    for x in pick(400):
        lo, hi = rng.choice(rare)
        chars = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 4)))
        at = rng.randint(0, len(x))
        out.append(x[:at] + chars + x[at:])
    special = ["<s>", "</s>", "<unk>", "<pad>", "<0x41>", "<0x0A>", "<s>x</s>", " <s> ", "</s>\n<s>"]
    out += special + [x[:len(x) // 2] + rng.choice(special) + x[len(x) // 2:] for x in pick(200)]
    out += ["🙂", "👍🏽 ok", "a\u200db", "ﬁ ligature", "Ａ full width", "e\u0301 combining"]
    return out


@pytest.fixture(scope="module")
def texts() -> list[str]:
    rng = random.Random(25)
    lines = corpus_lines()
    chosen = rng.sample(lines, 7500)
    return chosen + edge_cases(lines, rng)


def train(tmp_path, model_type: str):
    """A 1,000-piece model of `model_type` trained on every 8th corpus line with dataprep's settings."""
    from mspretrain.dataprep.config import TokenizerConfig
    from mspretrain.dataprep.tokenizer.model import train_tokenizer
    sample = tmp_path / "sample.txt"
    sample.write_text("\n".join(corpus_lines()[::8]), encoding="utf-8")
    model = tmp_path / f"{model_type}.model"
    train_tokenizer(sample, model, TokenizerConfig(vocab_size=1000, model_type=model_type, num_threads=1,
                                                   character_coverage=0.995))
    return model


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def exported(request, tmp_path_factory):
    """(model file, export dir): the tokenizer files `train export` writes for that model."""
    from mspretrain.train.hf import write_tokenizer
    tmp = tmp_path_factory.mktemp(request.param)
    model = train(tmp, request.param)
    out = tmp / "hf"
    out.mkdir()
    write_tokenizer(model, out, 4096)
    return model, out


def test_fast_slow_and_sentencepiece_give_equal_ids(exported, texts):
    import sentencepiece as spm
    model, out = exported
    assert len(texts) >= 10_000
    sp = spm.SentencePieceProcessor(model_file=str(model))
    fast = transformers.AutoTokenizer.from_pretrained(out)
    slow = transformers.LlamaTokenizer.from_pretrained(out)
    assert fast.is_fast and not slow.is_fast
    want = sp.encode(texts)
    got_fast = fast(texts, add_special_tokens=False)["input_ids"]
    got_slow = [slow.encode(t, add_special_tokens=False) for t in texts]
    assert [t for t, a, b in zip(texts, got_slow, want) if a != b] == []
    # unigram: sentencepiece sums path scores in float32, tokenizers in float64, so where two orders of
    # the same pieces tie exactly (runs of "-" in ASCII tables) the rounding picks one; nothing else
    differ = [(t, a, b) for t, a, b in zip(texts, got_fast, want) if a != b]
    not_ties = [t for t, a, b in differ if sorted(a) != sorted(b)]    # same pieces: the same score
    assert not_ties == [], not_ties[:5]
    if "bpe" in model.name:
        assert differ == []
    ids = (sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id())
    assert (fast.unk_token_id, fast.bos_token_id, fast.eos_token_id, fast.pad_token_id) == ids == (0, 1, 2, 3)


def test_fast_slow_and_sentencepiece_decode_alike(exported, texts):
    import sentencepiece as spm
    model, out = exported
    sp = spm.SentencePieceProcessor(model_file=str(model))
    fast = transformers.AutoTokenizer.from_pretrained(out)
    slow = transformers.LlamaTokenizer.from_pretrained(out)
    ids = sp.encode(texts)
    want = [sp.decode(x) for x in ids]
    assert sum(w == t for w, t in zip(want, texts)) >= len(texts) - 10    # "\u2581" in text reads as a space
    assert [t for t, x, w in zip(texts, ids, want) if fast.decode(x) != w] == []
    assert [t for t, x, w in zip(texts[::10], ids[::10], want[::10]) if slow.decode(x) != w] == []
    # control tokens: no text in sentencepiece, skipped by skip_special_tokens
    doc = [sp.eos_id()] + ids[0] + [sp.eos_id()]
    assert fast.decode(doc, skip_special_tokens=True) == sp.decode(doc) == want[0]


def test_tokenizer_files_are_consistent(exported):
    model, out = exported
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert (config["add_bos_token"], config["add_eos_token"], config["split_special_tokens"]) == (False, False, True)
    tok = json.loads((out / "tokenizer.json").read_text())
    assert tok["model"]["type"] == ("BPE" if "bpe" in model.name else "Unigram")
    assert tok["model"]["byte_fallback"] is True
    assert tok["added_tokens"] == []        # the raw tokenizer.json (TGI, tokenizers) reads "<s>" as text too
    special = {int(k): v["content"] for k, v in config["added_tokens_decoder"].items() if v["special"]}
    assert special == {0: "<unk>", 1: "<s>", 2: "</s>", 3: "<pad>"}


def test_raw_tokenizer_json_equals_sentencepiece(exported, texts):
    """Tools that read tokenizer.json with the tokenizers library alone (no tokenizer_config.json)."""
    import sentencepiece as spm
    from tokenizers import Tokenizer
    model, out = exported
    sp = spm.SentencePieceProcessor(model_file=str(model))
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    some = texts[::5]
    got = [e.ids for e in tok.encode_batch(some, add_special_tokens=True)]
    assert [t for t, a, b in zip(some, got, sp.encode(some)) if sorted(a) != sorted(b)] == []
