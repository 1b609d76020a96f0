"""Hugging Face format: `train export` (a run's checkpoint -> config.json, model.safetensors,
tokenizer files, generation_config.json) and `train import` (an HF checkpoint -> step 0 of a new run).
The model family's mapping (ModelSpec.hf_mapping; Llama's: mspretrain/train/models/llama/hf.py) names
the weights and writes and checks config.json; this module reads and writes the files.

Tokenizer: the dataset's sentencepiece model is copied as tokenizer.model (the slow `LlamaTokenizer`)
and converted to tokenizer.json (the fast tokenizer, mspretrain/train/hf/tokenizer.py), with a
tokenizer_config.json that adds neither BOS nor EOS (documents are packed without BOS, each ending in
EOS; ids unk 0 / bos 1 / eos 2 / pad 3 are the model's own).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mspretrain.common.files import atomic_path
from mspretrain.train.config import Config, ConfigError
from mspretrain.train.models.spec import HFError

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
EXPORT_DTYPES = ("fp32", "bf16", "fp16")


def hf_mapping(cfg):
    """The model family's Hugging Face mapping; HFError when the family has none."""
    from mspretrain.train.models import spec

    mapping = spec.of(cfg).hf_mapping
    if mapping is None:
        raise HFError(f"model.family {cfg.model.family!r} has no Hugging Face mapping")
    return mapping


# ---------------------------------------------------------------- export

def export_run(run_dir, out_dir, step: int | None = None, dtype: str = "fp32") -> Path:
    """Write the HF directory for the run's checkpoint `step` (default: latest). Returns out_dir."""
    from mspretrain.train import runinfo

    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(EXPORT_DTYPES)}, got {dtype!r}")
    info = runinfo.read_run(run_dir)
    cfg = runinfo.run_config(run_dir)
    args = runinfo.model_args_of_run(run_dir, cfg)
    mapping = hf_mapping(cfg)
    ckpt_dir = runinfo.checkpoint_dir(run_dir, step)
    weights = runinfo.model_weights(ckpt_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {mapping.hf_name(k): v for k, v in sorted(weights.items())}
    if args.tie_embeddings and "lm_head.weight" in tensors:
        raise HFError(f"{ckpt_dir}: tied embeddings but an output weight is present")
    write_safetensors(out / WEIGHTS_FILE, tensors, dtype)
    tok = info["dataset"]["tokenizer"]
    (out / "config.json").write_text(json.dumps(mapping.hf_config(args, tok, dtype), indent=2) + "\n")
    gen = {"bos_token_id": tok.get("bos_id", 1), "eos_token_id": tok.get("eos_id", 2),
           "pad_token_id": tok.get("pad_id", 3), "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    spm_file = runinfo.run_tokenizer(run_dir)
    if spm_file is not None:
        write_tokenizer(spm_file, out, args.seq_length)
    else:
        print(f"[export] {run_dir} has no tokenizer.model (a dataset without a sentencepiece model): "
              f"no tokenizer files written")
    state = json.loads((ckpt_dir / "state.json").read_text())
    print(f"[export] {ckpt_dir} (step {state.get('step')}) -> {out} ({len(tensors)} tensors, {dtype})")
    return out


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str) -> None:
    """One safetensors file; bf16 is written as the upper 16 bits of fp32, rounded to nearest even."""
    from safetensors import TensorSpec, serialize_file

    arrays, specs = {}, {}
    for name, value in tensors.items():
        value = np.ascontiguousarray(value, dtype=np.float32)
        if dtype == "fp16":
            arr, st = value.astype(np.float16), "float16"
        elif dtype == "bf16":
            arr, st = _to_bf16_bits(value), "bfloat16"
        else:
            arr, st = value, "float32"
        arr = np.ascontiguousarray(arr)
        arrays[name] = arr      # kept alive while serialize_file reads the pointers
        specs[name] = TensorSpec(dtype=st, shape=list(arr.shape), data_ptr=arr.ctypes.data, data_len=arr.nbytes)
    with atomic_path(path) as tmp:
        serialize_file(specs, str(tmp), {"format": "pt"})


def _to_bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


def write_tokenizer(spm_file: Path, out: Path, seq_length: int) -> None:
    """tokenizer.json (the fast tokenizer, mspretrain/train/hf/tokenizer.py), tokenizer.model and the
    configs for LlamaTokenizer; says so when the fast tokenizer may differ from sentencepiece."""
    from mspretrain.train.hf import tokenizer as hf_tokenizer

    for problem in hf_tokenizer.write(spm_file, out, seq_length):
        print(f"[export] warning: {spm_file}: {problem}; tokenizer.json may encode such text differently "
              f"from sentencepiece (tokenizer.model, LlamaTokenizer, is exact)")


# ---------------------------------------------------------------- import

def read_hf_weights(hf_dir: Path) -> dict[str, np.ndarray]:
    """Every tensor of model.safetensors (or of the files a .index.json lists), as fp32 numpy."""
    from safetensors import deserialize

    if (hf_dir / WEIGHTS_FILE).is_file():
        files = [hf_dir / WEIGHTS_FILE]
    elif (hf_dir / INDEX_FILE).is_file():
        index = json.loads((hf_dir / INDEX_FILE).read_text())
        files = [hf_dir / f for f in sorted(set(index["weight_map"].values()))]
    else:
        raise HFError(f"{hf_dir}: neither {WEIGHTS_FILE} nor {INDEX_FILE} (only safetensors are read)")
    out = {}
    for f in files:
        for name, t in deserialize(f.read_bytes()):
            if t["dtype"] not in _NP:
                raise HFError(f"{f}: tensor {name} has dtype {t['dtype']}; fp32, fp16 and bf16 are read")
            out[name] = _to_fp32(np.frombuffer(bytes(t["data"]), dtype=_NP[t["dtype"]]), t["dtype"],
                                 t["shape"])
    return out


_NP = {"F32": np.float32, "float32": np.float32, "F16": np.float16, "float16": np.float16,
       "BF16": np.uint16, "bfloat16": np.uint16, "F64": np.float64, "float64": np.float64}


def _to_fp32(raw: np.ndarray, dtype: str, shape) -> np.ndarray:
    if dtype in ("BF16", "bfloat16"):
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32).reshape(shape)


def check_tokenizer(hf_dir: Path, data_path: str) -> None:
    """The HF tokenizer must be the dataset's: same pieces for the same ids and the same special ids,
    read from tokenizer.model (sentencepiece) or, when that is absent, from tokenizer.json."""
    import sentencepiece as spm
    from mspretrain.loader.manifest import load_manifest

    m = load_manifest(data_path)
    ours = Path(data_path) / m.tokenizer.file if m.tokenizer.file else None
    if ours is None or not ours.is_file():
        print(f"[import] {data_path} has no sentencepiece model: the tokenizer is not checked")
        return
    theirs = hf_dir / "tokenizer.model"
    if not theirs.is_file():
        if (hf_dir / "tokenizer.json").is_file():
            return check_tokenizer_json(hf_dir, ours)
        raise HFError(f"{hf_dir} has neither tokenizer.model nor tokenizer.json, so it cannot be checked "
                      f"against the dataset's {ours}; training would read ids of another vocabulary")
    if theirs.read_bytes() == ours.read_bytes():
        return
    a = spm.SentencePieceProcessor(model_file=str(theirs))
    b = spm.SentencePieceProcessor(model_file=str(ours))
    _same_pieces([a.id_to_piece(i) for i in range(a.get_piece_size())], b, theirs, ours)
    ids = [(x.unk_id(), x.bos_id(), x.eos_id(), x.pad_id()) for x in (a, b)]
    if ids[0] != ids[1]:
        raise HFError(f"tokenizer mismatch: special ids (unk, bos, eos, pad) {ids[0]} in {theirs}, "
                      f"{ids[1]} in {ours}")


def _same_pieces(pieces: list[str], sp, where: Path, ours: Path) -> None:
    if len(pieces) != sp.get_piece_size():
        raise HFError(f"tokenizer mismatch: {where} has {len(pieces)} pieces, the dataset's {ours} "
                      f"{sp.get_piece_size()}")
    for i, piece in enumerate(pieces):
        if piece != sp.id_to_piece(i):
            raise HFError(f"tokenizer mismatch: id {i} is {piece!r} in {where} but "
                          f"{sp.id_to_piece(i)!r} in the dataset's {ours}")


# texts whose ids tell whether a fast tokenizer encodes like sentencepiece (dummy prefix, spaces,
# line breaks, digits, byte fallback, strings that look like special tokens)
PROBE_TEXTS = ["The licence is granted", " a leading space", "trailing space ", "two  spaces\tand a tab",
               "line\nbreaks\n\n", "12345 digits", "中文和 English", "emoji 🙂", "<s> and </s> are text"]


def check_tokenizer_json(hf_dir: Path, ours: Path) -> None:
    """tokenizer.json without tokenizer.model: its vocabulary and special ids must be the dataset's;
    texts it encodes otherwise than sentencepiece are named (a warning: training reads the dataset's
    ids, only tools that tokenize with this tokenizer.json would see other ids)."""
    import sentencepiece as spm
    from tokenizers import Tokenizer

    path = hf_dir / "tokenizer.json"
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:      # the library's own error types: one line naming the file
        raise HFError(f"{path}: not a tokenizers file ({str(e).splitlines()[0]})") from None
    sp = spm.SentencePieceProcessor(model_file=str(ours))
    n = tok.get_vocab_size(with_added_tokens=True)
    _same_pieces([tok.id_to_token(i) for i in range(n)], sp, path, ours)
    config = hf_dir / "tokenizer_config.json"
    named = json.loads(config.read_text()) if config.is_file() else {}
    for key, want in (("unk_token", sp.unk_id()), ("bos_token", sp.bos_id()), ("eos_token", sp.eos_id()),
                      ("pad_token", sp.pad_id())):
        token = named.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        if token is None or want < 0:
            continue
        if tok.token_to_id(token) != want:
            raise HFError(f"tokenizer mismatch: {config} gives {key} {token!r}, id {tok.token_to_id(token)} "
                          f"in {path}, but the dataset's {ours} has id {want}")
    for text in PROBE_TEXTS:
        if tok.encode(text, add_special_tokens=False).ids != sp.encode(text):
            print(f"[import] warning: {path} encodes {text!r} to other ids than the dataset's {ours} "
                  f"(same vocabulary; the dataset's ids are what training reads)")


def import_run(cfg: Config, hf_dir) -> Path:
    """`train import`: write step 0 of run cfg.run.dir (weights from `hf_dir`, fresh optimizer state),
    so that `train launch --resume auto` continues pretraining from it. Returns the checkpoint dir."""
    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train import assemble, runinfo, trainer
    from mspretrain.train.checkpoint.checkpointer import Checkpointer
    from mspretrain.train.parallel import distributed
    from mspretrain.train.parallel import plan as parallel_plan
    from mspretrain.train.checkpoint import policy as resume_policy
    from mspretrain.train.step.precision import check_precision

    hf_dir = Path(hf_dir)
    if not cfg.data.path:
        raise ConfigError("data.path is empty: set it to the dataset to continue on (--set data.path=DIR)")
    run_dir = Path(cfg.run.dir)
    if ckpt.list_checkpoints(run_dir) or (ckpt.checkpoints_root(run_dir) / ckpt.LATEST).exists():
        raise resume_policy.ResumeError(f"{run_dir} already has checkpoints; import into a new run dir. "
                                  f"Nothing was changed.")
    check_tokenizer(hf_dir, cfg.data.path)
    dist = distributed.setup(cfg, parallel_plan.validate)
    trainer.check_loop_config(cfg)
    check_precision(cfg)
    import mindspore as ms
    from mspretrain.train.data import TrainData

    ms.set_seed(cfg.seed)
    with TrainData(cfg, dist) as loader:        # the stream the continued run will read
        session = assemble.build_session(cfg, loader.vocab_size, loader.seq_length, dist,
                                        loader.tokenizer.eos_id)
        mapping = hf_mapping(cfg)
        mapping.check_hf_config(hf_dir, session.args)
        weights = mapping.from_hf(read_hf_weights(hf_dir), session.args, str(hf_dir))
        runinfo.set_weights(session.model, weights, str(hf_dir))
        runinfo.record_run(cfg)
        trainer.prepare_run_dir(run_dir)
        record = {"step": 0, "imported_from": str(hf_dir.resolve())}
        Checkpointer(cfg, dist).save(0, session, loader, record, 0)
    final = ckpt.latest_checkpoint(run_dir)
    print(f"[import] {hf_dir} -> {final}; continue with: train launch --config ... "
          f"--set run.dir={run_dir} --resume auto")
    return final
