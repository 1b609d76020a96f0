"""MinHash signatures ("oph-rot-v1") are exactly what the scheme's plain definition gives, bit for
bit, one text at a time or in batches of any size and order, and unchanged from the signatures
recorded when the scheme was fixed (digests below)."""
from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest

from mspretrain.dataprep.dedup.detect import (_BLOCK_CHARS, DedupConfig, _constants, shingle_order, shingle_text,
                            signatures)
from real_text import man_languages, man_texts

POOL = ("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 \n\t.,;:-_'\"()"
        "éèàüöäßÉÀÜÖÄçñøåæœ" "ΑΒΓΣσςαβγ" "АБВабвжЖ" "İıŞşĞğ" "中文字天地玄黄宇宙洪荒日月" "ガキ・ー한국어"
        "\u00a0\u2014\u2019\u0301\u0000" "𝐀𝟙𠀀😀")
_M64 = (1 << 64) - 1


def _fmix64(h: int) -> int:
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & _M64
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & _M64
    return h ^ (h >> 33)


def reference(text: str, cfg: DedupConfig) -> np.ndarray:
    """The signature of one text, shingle by shingle in Python integers."""
    order, k = shingle_order(cfg.shingle), cfg.num_perm
    mults, salt = _constants(cfg.seed, order)
    mults, salt = [int(m) for m in mults], int(salt)
    s = shingle_text(text)
    s = s.ljust(order, "\0")
    best: dict[int, int] = {}
    for i in range(len(s) - order + 1):
        h = _fmix64((sum(ord(c) * m for c, m in zip(s[i:i + order], mults)) & _M64) ^ salt)
        b = ((h >> 32) * k) >> 32
        best[b] = min(best.get(b, 1 << 32), h & 0xFFFFFFFF)
    # an empty bin takes the next non-empty bin to its right, wrapping around
    return np.array([best[next(j % k for j in range(b, b + k) if j % k in best)]
                     for b in range(k)], np.uint32)


def _random_texts(rng: random.Random, n: int, max_len: int) -> list[str]:
    return ["".join(rng.choice(POOL) for _ in range(rng.randint(0, max_len))) for _ in range(n)]


CONFIGS = [DedupConfig(), DedupConfig(num_perm=100, seed=7), DedupConfig(num_perm=64, shingle="char3"),
           DedupConfig(num_perm=2, shingle="char9")]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.num_perm}-{c.shingle}-{c.seed}")
def test_signatures_are_the_definition(cfg):
    rng = random.Random(cfg.num_perm)
    texts = _random_texts(rng, 500, 12) + _random_texts(rng, 100, 400)
    texts += [t[:600] for lang in man_languages()[::3] for _, t in man_texts(lang, 2, seed=3)]
    texts += ["", "a", "AbCd", "\n" * 7, "ab" * 3000]
    want = np.stack([reference(t, cfg) for t in texts])
    for t, w in zip(texts, want):
        assert np.array_equal(signatures([t], cfg)[0], w), repr(t[:80])
    assert np.array_equal(signatures(texts, cfg), want)
    order = list(range(len(texts)))
    rng.shuffle(order)
    assert np.array_equal(signatures([texts[i] for i in order], cfg), want[order])


def test_long_texts_split_into_blocks_are_the_definition():
    """Texts longer than a block are hashed in overlapping pieces."""
    cfg = DedupConfig(num_perm=64)
    rng = random.Random(3)
    b = _BLOCK_CHARS
    texts = ["".join(rng.choice(POOL) for _ in range(n)) for n in (b - 5, b + 3, 4 * b + 999)]
    texts.append("ascii only " * (b // 5))
    texts.insert(1, "short text between long ones")
    want = np.stack([reference(t, cfg) for t in texts])
    assert np.array_equal(signatures(texts, cfg), want)
    assert all(np.array_equal(signatures([t], cfg)[0], w) for t, w in zip(texts, want))


def _golden_texts() -> list[str]:
    rng = random.Random(2024)
    texts = [""] + ["".join(rng.choice(POOL) for _ in range(n)) for n in range(1, 12)]
    texts += ["".join(rng.choice(POOL) for _ in range(rng.randint(20, 3000))) for _ in range(60)]
    texts += ["".join(rng.choice(POOL[:80]) for _ in range(rng.randint(20, 3000))) for _ in range(30)]
    texts += ["".join(rng.choice(POOL) for _ in range(70_000)), "ab" * 40_000]
    return texts


# sha256 of the signatures of _golden_texts() as the scheme's first implementation computed them
GOLDEN = [
    ({}, "7e3fd772af936c20921ec981e687c83c723b4df8fe8c7c9e9321513f85efa7c1"),
    ({"num_perm": 100, "seed": 7}, "419a57ff3321947c2d7c77d91c839869a43926941333a44e9847fa89c27f4843"),
    ({"num_perm": 4096, "shingle": "char3"},
     "b8171c6d9f0830d9190f6000a98ebba66e4df944b027569f73dd96e6107de002"),
    ({"num_perm": 2, "shingle": "char9"},
     "4bb41425cd076933bda426d494ee4d49fe3fcc8e42c7c19bbdecaf0f71af8566"),
]


@pytest.mark.parametrize("kwargs,digest", GOLDEN, ids=[str(k) for k, _ in GOLDEN])
def test_signatures_are_unchanged_bit_for_bit(kwargs, digest):
    texts = _golden_texts()
    cfg = DedupConfig(**kwargs)
    assert hashlib.sha256(signatures(texts, cfg).tobytes()).hexdigest() == digest
    one_by_one = np.concatenate([signatures([t], cfg) for t in texts])
    assert hashlib.sha256(one_by_one.tobytes()).hexdigest() == digest
