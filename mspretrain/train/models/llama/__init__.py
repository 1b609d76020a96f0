"""Llama, the built-in model family: model.py (the math), parallel.py (its parallel plan), memory.py
(its memory terms), hf.py (the Hugging Face mapping), decode.py (the KV-cache decoding cells)."""
from __future__ import annotations

from mspretrain.train.models.llama import hf, memory, parallel
from mspretrain.train.models.spec import ModelSpec, register


# model.py and decode.py import MindSpore: loaded when a model is built, not when the spec is read
def model_args(cfg_model, vocab_size: int, seq_length: int, device: str, dtype: str = "bf16",
               eos_id: int | None = None):
    from mspretrain.train.models.llama.model import model_args as build_args
    return build_args(cfg_model, vocab_size, seq_length, device, dtype, eos_id)


def build_model(args, seed: int):
    from mspretrain.train.models.llama.model import Llama
    return Llama(args, seed)


def decode_cells():
    import mspretrain.train.models.llama.decode as cells
    return cells


SPEC = register(ModelSpec(name="llama", model_args=model_args, build_model=build_model,
                          parallel_plan=parallel, memory_terms=memory, hf_mapping=hf, decode=decode_cells))
