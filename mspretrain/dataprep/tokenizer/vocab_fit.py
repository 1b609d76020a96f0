"""Fit the tokenizer's vocabulary to the corpus.

sentencepiece refuses a vocab_size larger than the pieces its sample can yield, and names the
largest size that works ("Please set it to a value <= N"). A small corpus with the default
tokenizer.vocab_size then trains with that N instead, with a warning; the size used is the model's,
which the manifest records as tokenizer.vocab_size (the report also records the size asked for).
The same sample always gives the same N, so a fitted build stays deterministic.
"""
from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

from mspretrain.dataprep.tokenizer.model import TokenizerError, train_tokenizer

_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")


def train_fitted(sample_file: Path, model_path: Path, cfg) -> int:
    """Train as `train_tokenizer` does; returns the vocabulary size used (`fit_warning` says when it
    is not the one asked for)."""
    try:
        train_tokenizer(sample_file, model_path, cfg)
        return cfg.vocab_size
    except TokenizerError as e:
        m = _TOO_HIGH.search(str(e))
        if not m:
            raise
        fit = int(m.group(2))
    train_tokenizer(sample_file, model_path, replace(cfg, vocab_size=fit))
    return fit


def fit_warning(asked: int, used: int) -> str:
    return (f"dataprep build: warning: tokenizer.vocab_size={asked} is more than this corpus can "
            f"fill; training with the largest size that works, {used} (the manifest records it "
            f"as tokenizer.vocab_size)")
