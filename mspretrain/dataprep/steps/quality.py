"""A document quality classifier: hashed character n-gram logistic regression, trained in seconds.

Features (fastText-style, but on characters so that Chinese needs no word segmenter): the
character n-grams of orders `orders` of the lower-cased first `max_chars` characters, hashed into
2**dim_bits buckets with a fixed multiply-xor hash over code points (vectorised in numpy). A
document's feature vector is its n-gram counts divided by their total, so its score is
sigmoid(bias + mean weight of its n-grams) whatever its length.

Training is full-batch Adam on the class-balanced logistic loss with a small L2 penalty, a fixed
number of steps, float64 arithmetic in a fixed order: the same inputs give the same model bytes.
The model file is a one-line JSON header followed by the float32 weights (no timestamps).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mspretrain.common.errors import MspretrainError
from mspretrain.dataprep.steps.decontam import DecontamError, read_items
from mspretrain.common.files import atomic_write_bytes

MAGIC = b"mspretrain-quality-v1\n"
_M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F)


class QualityModelError(MspretrainError, ValueError):
    """A quality model file that cannot be read; the message names it."""


@dataclass(frozen=True)
class QualityFilterConfig:
    model: str = ""            # a model from `dataprep quality train`; empty: no quality filter
    threshold: float = 0.5     # documents scoring below it are dropped ("quality")


@dataclass
class QualityModel:
    weights: np.ndarray        # float32 [2**dim_bits]
    bias: float
    orders: tuple[int, ...] = (2, 4)
    dim_bits: int = 18
    max_chars: int = 20000

    def score(self, text: str) -> float:
        """P(high quality) of one document, rounded to 4 decimals (stable for provenance)."""
        b = ngram_buckets(text, self.orders, self.dim_bits, self.max_chars)
        z = self.bias + (float(self.weights[b].astype(np.float64).mean()) if len(b) else 0.0)
        return round(1.0 / (1.0 + np.exp(-z)), 4)

    def save(self, path: str | os.PathLike) -> None:
        header = {"orders": list(self.orders), "dim_bits": self.dim_bits,
                  "max_chars": self.max_chars, "bias": self.bias}
        data = MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + \
            self.weights.astype("<f4").tobytes()
        atomic_write_bytes(path, data)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "QualityModel":
        try:
            data = Path(path).read_bytes()
        except OSError as e:
            raise QualityModelError(f"filters.quality.model: cannot read {path} ({e})") from None
        if not data.startswith(MAGIC):
            raise QualityModelError(f"filters.quality.model: {path} is not a model written by "
                                    f"`dataprep quality train`")
        try:
            header_end = data.index(b"\n", len(MAGIC))
            h = json.loads(data[len(MAGIC):header_end])
            dim = 1 << int(h["dim_bits"])
        except (ValueError, KeyError, TypeError):
            raise QualityModelError(f"filters.quality.model: {path}: damaged header") from None
        if len(data) - header_end - 1 != 4 * dim:
            raise QualityModelError(f"filters.quality.model: {path} is truncated")
        weights = np.frombuffer(data[header_end + 1:], "<f4")
        return cls(weights, float(h["bias"]), tuple(h["orders"]), int(h["dim_bits"]),
                   int(h["max_chars"]))


def ngram_buckets(text: str, orders: tuple[int, ...], dim_bits: int, max_chars: int) -> np.ndarray:
    """Bucket numbers of every character n-gram (each order in `orders`) of the text's head."""
    s = text[:max_chars].lower()
    cps = np.frombuffer(s.encode("utf-32-le", "surrogatepass"), np.uint32).astype(np.uint64)
    out = []
    for n in orders:
        if len(cps) < n:
            continue
        m = len(cps) - n + 1
        h = np.full(m, np.uint64(n), np.uint64)
        for k in range(n):
            h = (h ^ cps[k:k + m]) * _M1
        h ^= h >> np.uint64(29)
        h *= _M2
        out.append((h >> np.uint64(64 - dim_bits)).astype(np.int64))
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def train(positive: list[str], negative: list[str], orders: tuple[int, ...] = (2, 4),
          dim_bits: int = 18, max_chars: int = 20000, steps: int = 150, lr: float = 0.05,
          l2: float = 1e-6) -> QualityModel:
    """Fit the classifier: positive documents score towards 1, negative ones towards 0."""
    if not positive or not negative:
        raise ValueError("quality train: need at least one positive and one negative document")
    texts = list(positive) + list(negative)
    y = np.r_[np.ones(len(positive)), np.zeros(len(negative))]
    # each class weighs half of the loss, whatever the sizes
    cw = np.where(y == 1, 0.5 / len(positive), 0.5 / len(negative))
    buckets = [ngram_buckets(t, orders, dim_bits, max_chars) for t in texts]
    lens = np.array([max(1, len(b)) for b in buckets], np.float64)
    flat = np.concatenate(buckets)
    doc_of = np.repeat(np.arange(len(texts)), [len(b) for b in buckets])
    dim = 1 << dim_bits
    w, b = np.zeros(dim), 0.0
    m_w, v_w, m_b, v_b = np.zeros(dim), np.zeros(dim), 0.0, 0.0
    beta1, beta2, eps = 0.9, 0.999, 1e-8
    for t in range(1, steps + 1):
        z = b + np.bincount(doc_of, weights=w[flat], minlength=len(texts)) / lens
        p = 1.0 / (1.0 + np.exp(-z))
        r = (p - y) * cw                                   # d loss / d z, per document
        g_w = np.bincount(flat, weights=(r / lens)[doc_of], minlength=dim) + l2 * w
        g_b = float(r.sum())
        m_w = beta1 * m_w + (1 - beta1) * g_w
        v_w = beta2 * v_w + (1 - beta2) * g_w * g_w
        m_b = beta1 * m_b + (1 - beta1) * g_b
        v_b = beta2 * v_b + (1 - beta2) * g_b * g_b
        c1, c2 = 1 - beta1 ** t, 1 - beta2 ** t
        w -= lr * (m_w / c1) / (np.sqrt(v_w / c2) + eps)
        b -= lr * (m_b / c1) / (np.sqrt(v_b / c2) + eps)
    return QualityModel(w.astype(np.float32), float(b), tuple(orders), dim_bits, max_chars)


def read_texts(path: str, text_field: str = "text") -> list[str]:
    """Documents of a training file: JSON lines with `text_field`, or plain text, one document per
    blank-line separated paragraph."""
    p = Path(path)
    if not p.is_file():
        raise QualityModelError(f"{path} not found")
    if p.suffix in (".jsonl", ".json"):
        try:
            return [text for _, text in read_items(path, text_field)]
        except DecontamError as e:      # the same JSON-lines reader, the same file:line messages
            raise QualityModelError(str(e)) from None
    raw = p.read_text(encoding="utf-8")
    return [para.strip() for para in raw.split("\n\n") if para.strip()]


