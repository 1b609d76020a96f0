"""What a run dir records about itself, so that its checkpoints can be used without the YAML it was
launched with: RUN/run.json (the resolved config and the dataset's shape: seq_length, tokenizer,
fingerprint) and RUN/tokenizer.model (a copy of the dataset's sentencepiece model).

Written by `train launch` when a run starts or resumes (after its checks) and by `train import`; read by `train export`,
`generate`, `score` and `eval` (which refuses a dataset whose tokenizer or seq_length differ).
Also here: reading a checkpoint's model weights into a fresh model of the run's family.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from mspretrain.common.config import validate
from mspretrain.common.errors import MspretrainError
from mspretrain.common.files import atomic_open, atomic_write_text
from mspretrain.train.config import Config

RUN_INFO = "run.json"
RUN_TOKENIZER = "tokenizer.model"
# the loss cell's attribute holding the model: a weight's checkpoint key is "[...]model.<name in the model>"
_MODEL_ATTR = "model"
_OPTIMIZER_PREFIXES = ("adam_m.", "adam_v.", "acc.")


class RunInfoError(MspretrainError, RuntimeError):
    """A run dir that lacks what is needed; the message names the file."""


def dataset_info(data_path) -> dict:
    """The run's dataset: its identity (data_check.identity, as in every state.json), and for
    reference where it was, its fingerprint and its tokenizer's description."""
    from dataclasses import asdict
    from mspretrain.loader.manifest import load_manifest
    from mspretrain.train.data_check import identity

    m = load_manifest(data_path)
    return {**identity(m), "path": str(Path(data_path).resolve()), "fingerprint": m.fingerprint,
            "tokenizer": asdict(m.tokenizer)}


def record_run(cfg: Config) -> None:
    """Write RUN/run.json (+ RUN/tokenizer.model) once a launch has passed its checks and starts
    (the trainer calls this on the main rank), or when `train import` creates a run."""
    from mspretrain.train.data import source_dirs
    run_dir = Path(cfg.run.dir)
    data_path = source_dirs(cfg)[0]     # a blend's datasets share one tokenizer (train.data)
    info = {"config": cfg.to_dict(), "dataset": dataset_info(data_path)}
    run_dir.mkdir(parents=True, exist_ok=True)
    tok = info["dataset"]["tokenizer"]
    if tok["file"]:
        src = Path(data_path) / tok["file"]
        if src.is_file():
            _atomic_copy(src, run_dir / RUN_TOKENIZER)
    atomic_write_text(run_dir / RUN_INFO, json.dumps(info, indent=1, sort_keys=True) + "\n")


def read_run(run_dir) -> dict:
    path = Path(run_dir) / RUN_INFO
    if not path.is_file():
        raise RunInfoError(f"{path} not found: {run_dir} is not a run dir written by `train launch` "
                           f"or `train import`")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise RunInfoError(f"{path}: invalid JSON ({e})") from None


def run_config(run_dir) -> Config:
    return validate(Config, read_run(run_dir)["config"])


def run_tokenizer(run_dir) -> Path | None:
    """RUN/tokenizer.model, checked against the sha256 run.json records for it."""
    from mspretrain.loader.manifest import sha256_file

    path = Path(run_dir) / RUN_TOKENIZER
    if not path.is_file():
        return None
    want = read_run(run_dir).get("dataset", {}).get("tokenizer_sha256")
    if want and sha256_file(path) != want:
        raise RunInfoError(f"{path}: sha256 differs from the tokenizer {Path(run_dir) / RUN_INFO} "
                           f"records ({want[:12]}): it was replaced or damaged after the run started")
    return path


def checkpoint_dir(run_dir, step: int | None = None) -> Path:
    from mspretrain.train import checkpoint as ckpt

    if step is None:
        found = ckpt.latest_checkpoint(run_dir)
        if found is None:
            raise ckpt.CheckpointError(f"{run_dir} has no checkpoint yet (no checkpoints/latest)")
        return found
    path = ckpt.checkpoints_root(run_dir) / ckpt.step_dir_name(step)
    if not (path / ckpt.STATE_FILE).is_file():
        have = [p.name for p in ckpt.list_checkpoints(run_dir)]
        raise ckpt.CheckpointError(f"{path}: no complete checkpoint of step {step} (have: {have})")
    return path


def model_weights(ckpt_dir) -> dict[str, np.ndarray]:
    """The model's weights of a checkpoint, keyed by their name inside the model (optimizer moments and
    counters left out). A sharded checkpoint (rank_R/) is merged into full tensors first."""
    from mspretrain.train import checkpoint as ckpt

    ckpt_dir = Path(ckpt_dir)
    if (ckpt_dir / ckpt.STATE_FILE).is_file():     # a checkpoint of a run: its files' digests first
        ckpt.verify_files(ckpt_dir, ckpt.read_state(ckpt_dir))
    from mspretrain.train.checkpoint.reshard import is_sharded_checkpoint, merged_to_one_device
    if is_sharded_checkpoint(ckpt_dir):
        path = ckpt.model_file(merged_to_one_device(ckpt_dir))
    else:       # model.ckpt or model.safetensors, whichever the checkpoint holds
        try:
            path = ckpt.model_file(ckpt_dir)
        except ckpt.CheckpointError as e:
            raise RunInfoError(str(e)) from None
    out = {}
    for key, value in ckpt.load_file(path).items():
        if key.startswith(_OPTIMIZER_PREFIXES):
            continue
        parts = key.split(".")
        if _MODEL_ATTR in parts[:-1]:
            out[".".join(parts[parts.index(_MODEL_ATTR) + 1:])] = value.asnumpy()
    if not out:
        raise RunInfoError(f"{path}: no model weights found (keys: {sorted(out)[:5]})")
    return out


def model_args_of_run(run_dir, cfg: Config | None = None, eos_id: int | None = None):
    """The run's model arguments, fp32 on CPU; `eos_id`: with its document masking and position reset
    (None: without)."""
    from mspretrain.train.models import spec as model_spec

    cfg = cfg or run_config(run_dir)
    ds = read_run(run_dir)["dataset"]
    return model_spec.of(cfg).model_args(cfg.model, ds["tokenizer"]["vocab_size"], ds["seq_length"], "CPU",
                                         "fp32", eos_id)


def load_run_model(run_dir, step: int | None = None):
    """(the run's model in fp32 with the checkpoint's weights, its Config, the checkpoint dir)."""
    from mspretrain.train.models import spec as model_spec

    cfg = run_config(run_dir)
    ckpt_dir = checkpoint_dir(run_dir, step)
    args = model_args_of_run(run_dir, cfg)
    model = model_spec.of(cfg).build_model(args, cfg.seed)
    set_weights(model, model_weights(ckpt_dir), str(ckpt_dir))
    return model, cfg, ckpt_dir


def set_weights(model, weights: dict[str, np.ndarray], where: str) -> None:
    """Copy `weights` (names inside the model) into `model`; names and shapes must match exactly."""
    from mindspore import Tensor

    params = dict(model.parameters_and_names())
    missing, extra = sorted(set(params) - set(weights)), sorted(set(weights) - set(params))
    if missing or extra:
        raise RunInfoError(f"{where}: weights do not match the model: missing {missing[:5]}, "
                           f"unexpected {extra[:5]}")
    for name, p in params.items():
        w = weights[name]
        if tuple(w.shape) != tuple(p.shape):
            raise RunInfoError(f"{where}: {name} has shape {tuple(w.shape)}, the model {tuple(p.shape)}")
        p.set_data(Tensor(np.ascontiguousarray(w, dtype=np.float32)))


def _atomic_copy(src: Path, dst: Path) -> None:
    with atomic_open(dst) as f, open(src, "rb") as f_src:
        shutil.copyfileobj(f_src, f)
