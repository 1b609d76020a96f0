"""A sharded checkpoint written by hand in MindSpore's own formats (per-rank model.ckpt slices and
ParallelStrategyMap strategy files, as an Ascend run with model or pipeline parallelism writes them):
CPU cannot compile a sharded graph, but MindSpore's checkpoint transformation reads these files on
any device, so the merge onto one device runs here for real."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def write_strategy(path: Path, stage: int, layouts: dict) -> None:
    """A strategy file: {param name: (device matrix, tensor map)} (tensor map entries index the device
    matrix from its last dimension; -1: not split)."""
    from mindspore.train import node_strategy_pb2 as pb

    m = pb.ParallelStrategyMap()
    m.current_stage = stage
    item = m.parallel_strategy_item.add()
    item.node_name = "Default/network"
    item.parallel_strategys.stage = stage
    for name, (dev, tmap) in layouts.items():
        li = m.parallel_layout_item.add()
        li.param_name = name
        lay = li.parallel_layouts
        lay.dev_matrix.add().dim.extend(dev)
        lay.tensor_map.add().dim.extend(tmap)
        lay.param_split_shape.add()
        lay.indices_offset.add()
        lay.field, lay.opt_weight_shard_step, lay.opt_weight_shard_size = 0, 0, 0    # no optimizer shard
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(m.SerializeToString())


def shard_checkpoint(ckpt_dir: Path, record_layout: bool = True, fmt: str = "ckpt", cols=()) -> dict:
    """Rewrite the full checkpoint `ckpt_dir` as model parallel 2: every matrix (weights and their
    AdamW moments) split by rows between rank_0 and rank_1 (the matrices named in `cols`: by columns),
    the rest whole on both; strategy files; state.json's file digests (and, with `record_layout`, its
    layout) updated. `fmt` "safetensors": the ranks' files are rank_R/model.safetensors, as
    ms.save_checkpoint(format="safetensors") writes them (MindFormers 2.x's per-rank files). Returns
    the full tensors it started from (numpy; bfloat16 as ml_dtypes')."""
    import mindspore as ms
    from mspretrain.train import checkpoint as ckpt

    # numpy (bfloat16 as ml_dtypes'), not MindSpore ops: no kernel runs, so a test may still set the device
    full = {k: v.asnumpy() for k, v in ckpt.load_file(ckpt.model_file(ckpt_dir)).items()}
    split = {k: int(k in cols) for k, v in full.items() if v.ndim == 2 and v.shape[k in cols] % 2 == 0}
    layouts = {k: ([2], ([-1, 0] if split[k] else [0, -1]) if k in split else [-1] * v.ndim)
               for k, v in full.items()}
    for r in range(2):
        part = [{"name": k, "data": ms.Tensor(np.ascontiguousarray(np.split(v, 2, split[k])[r]) if k in split else v)}
                for k, v in full.items()]
        (ckpt_dir / f"rank_{r}").mkdir()
        ms.save_checkpoint(part, str(ckpt_dir / f"rank_{r}" / ckpt.MODEL_FILES[fmt]), format=fmt)
        write_strategy(ckpt_dir / "strategy" / f"rank_{r}.ckpt", 0, layouts)
    ckpt.model_file(ckpt_dir).unlink()
    state = ckpt.read_state(ckpt_dir)
    state[ckpt.FILES_KEY] = {str(p.relative_to(ckpt_dir)): ckpt.file_digest(p)
                             for p in sorted(ckpt_dir.rglob("*")) if p.suffix in (".ckpt", ".safetensors")}
    if record_layout:
        state["layout"] = {"dp": 1, "mp": 2, "pp": 1, "optimizer_shard": False, "optimizer_level": None}
    else:
        state.pop("layout", None)
    (ckpt_dir / ckpt.STATE_FILE).write_text(json.dumps(state))
    return full
