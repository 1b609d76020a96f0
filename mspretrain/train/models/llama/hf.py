"""Llama <-> Hugging Face LlamaForCausalLM (ModelSpec.hf_mapping): weight names, config.json, and
the check that an HF config describes the run's model. The files themselves are read and written by
mspretrain/train/hf/convert.py.

The layouts already agree, so the conversion is a renaming, with no permutation:
- rotary: model.py rotates halves of the head dim (x1 = first half, x2 = second half, angles repeated
  over both halves), which is Hugging Face Llama's `rotate_half`, so q/k weights are copied as they
  are (a checkpoint with interleaved pairs would need its rows permuted; ours has none);
- grouped KV heads: query head h uses KV head h // (num_heads / num_kv_heads) in both;
- nn.Dense weights are [out, in] like torch.nn.Linear; a tied head is `tie_word_embeddings`;
- RMSNorm computes in fp32 with the same epsilon (`rms_norm_eps`); no biases anywhere.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mspretrain.train.models.spec import HFError


def hf_name(name: str) -> str:
    """Llama-relative weight name (model.py) -> Hugging Face LlamaForCausalLM name."""
    parts = name.split(".")
    if name == "tok_embeddings.embedding_table":
        return "model.embed_tokens.weight"
    if name == "norm.weight":
        return "model.norm.weight"
    if name == "output.weight":
        return "lm_head.weight"
    if parts[0] == "layers":
        i, rest = parts[1], ".".join(parts[2:])
        table = {"attention_norm.weight": "input_layernorm.weight",
                 "ffn_norm.weight": "post_attention_layernorm.weight",
                 "attention.wq.weight": "self_attn.q_proj.weight",
                 "attention.wk.weight": "self_attn.k_proj.weight",
                 "attention.wv.weight": "self_attn.v_proj.weight",
                 "attention.wo.weight": "self_attn.o_proj.weight",
                 "mlp.w1.weight": "mlp.gate_proj.weight",
                 "mlp.w3.weight": "mlp.up_proj.weight",
                 "mlp.w2.weight": "mlp.down_proj.weight"}
        if rest in table:
            return f"model.layers.{i}.{table[rest]}"
    raise HFError(f"no Hugging Face name for weight {name!r}")


def hf_config(args, tok: dict | None, dtype: str) -> dict:
    """config.json of LlamaForCausalLM for ModelArgs `args`."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": args.vocab_size, "hidden_size": args.hidden_size,
        "intermediate_size": args.ffn, "num_hidden_layers": args.num_layers,
        "num_attention_heads": args.num_heads, "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim, "hidden_act": "silu", "max_position_embeddings": args.seq_length,
        "rms_norm_eps": args.norm_eps, "rope_theta": args.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": args.rope_theta},
        "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
        "initializer_range": args.init_std, "tie_word_embeddings": args.tie_embeddings,
        "use_cache": True, "pretraining_tp": 1,
        "bos_token_id": (tok or {}).get("bos_id", 1), "eos_token_id": (tok or {}).get("eos_id", 2),
        "pad_token_id": (tok or {}).get("pad_id", 3),
        "torch_dtype": {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype],
    }


_CONFIG_KEYS = [("hidden_size", "hidden_size"), ("num_hidden_layers", "num_layers"),
                ("num_attention_heads", "num_heads"), ("num_key_value_heads", "kv_heads"),
                ("intermediate_size", "ffn"), ("vocab_size", "vocab_size"),
                ("rms_norm_eps", "norm_eps"), ("tie_word_embeddings", "tie_embeddings")]


def check_hf_config(hf_dir: Path, args) -> None:
    """The HF config must describe exactly the model of the run's config."""
    path = hf_dir / "config.json"
    if not path.is_file():
        raise HFError(f"{path} not found")
    c = json.loads(path.read_text())
    if c.get("model_type") != "llama":
        raise HFError(f"{path}: model_type {c.get('model_type')!r}; only 'llama' can be imported")
    for key in ("attention_bias", "mlp_bias"):
        if c.get(key):
            raise HFError(f"{path}: {key} is true; this model has no biases")
    rope = c.get("rope_scaling") or {}
    params = c.get("rope_parameters") or {}
    if rope or params.get("rope_type", "default") != "default":
        raise HFError(f"{path}: rope scaling {rope or params} is not supported (plain rotary only)")
    theta = params.get("rope_theta", c.get("rope_theta", 10000.0))
    c.setdefault("num_key_value_heads", c.get("num_attention_heads"))
    c.setdefault("tie_word_embeddings", False)
    wrong = [f"{hf_key}={c.get(hf_key)!r} but the config gives {getattr(args, ours)!r}"
             for hf_key, ours in _CONFIG_KEYS if c.get(hf_key) != getattr(args, ours)]
    if float(theta) != float(args.rope_theta):
        wrong.append(f"rope_theta={theta!r} but the config gives {args.rope_theta!r}")
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    if head_dim != args.head_dim:
        wrong.append(f"head_dim={head_dim} but the config gives {args.head_dim}")
    if c.get("hidden_act", "silu") != "silu":
        wrong.append(f"hidden_act={c.get('hidden_act')!r} (only silu)")
    if wrong:
        raise HFError(f"{path} does not describe the model of --config: " + "; ".join(wrong)
                      + " (set the model.* keys to match)")


def from_hf(hf: dict[str, np.ndarray], args, where: str) -> dict[str, np.ndarray]:
    """HF tensors -> Llama-relative names (the inverse of hf_name), every expected weight present."""
    names = _llama_names(args)
    out, missing = {}, []
    for name in names:
        key = hf_name(name)
        if key not in hf:
            missing.append(key)
            continue
        out[name] = hf[key]
    if args.tie_embeddings:
        hf = {k: v for k, v in hf.items() if k != "lm_head.weight"}   # saved tied copies are allowed
    extra = sorted(set(hf) - {hf_name(n) for n in names} - {k for k in hf if k.endswith("rotary_emb.inv_freq")})
    if missing or extra:
        raise HFError(f"{where}: missing {missing[:5]}, unexpected {extra[:5]}")
    return out


def _llama_names(args) -> list[str]:
    names = ["tok_embeddings.embedding_table", "norm.weight"]
    for i in range(args.num_layers):
        names += [f"layers.{i}.{n}" for n in ("attention_norm.weight", "ffn_norm.weight",
                                              "attention.wq.weight", "attention.wk.weight",
                                              "attention.wv.weight", "attention.wo.weight",
                                              "mlp.w1.weight", "mlp.w3.weight", "mlp.w2.weight")]
    if not args.tie_embeddings:
        names.append("output.weight")
    return names
