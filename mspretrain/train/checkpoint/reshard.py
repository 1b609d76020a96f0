"""Resume on another parallel layout: which checkpoint transformation a (dp, mp, pp, optimizer shard)
change needs, and (Ascend) doing it with MindSpore's checkpoint transformation, MindFormers' way.

A checkpoint records its layout (state.json "layout", `record`). At `--resume` the trainer compares it
with the run's (`plan`, a pure function, unit-tested on CPU):
  - same: the same layout; each rank loads its own file (rank_R/model.ckpt, or the one model.ckpt;
    model.safetensors in checkpoint.format safetensors, here and below);
  - replicated: neither layout shards the model (only the data-parallel size differs, the elastic
    resume): every rank loads the one full model file;
  - slice: a full checkpoint onto a sharded layout: each rank cuts its slices out of the model file
    (transform with no source strategy);
  - merge: a sharded checkpoint onto an unsharded layout: the ranks' slices are joined into full
    tensors (transform with no destination strategy);
  - transform: sharded onto another sharded layout (any change of dp, mp, pp or optimizer sharding
    moves slices between ranks), through both strategies.
Strategy files of a pipeline (pp > 1) hold one stage each: they are merged first
(`mindspore.parallel.merge_pipeline_strategys`), on both sides.

`transform` (Ascend; CPU cannot shard) follows MindFormers' resume with `auto_trans_ckpt`: after the
step graph is compiled (which writes this rank's destination strategy, train.parallel.apply.strategy_path),
the main rank merges the strategy files, then every rank builds its own file with
`mindspore.parallel.rank_list_for_transform` + `transform_checkpoint_by_rank` into
RUN/resharded/step_XXXXXXXX/rank_R/model.ckpt (or model.safetensors), which it loads like its own. The
loader state carries over as for a dp change: the stream is a function of the global cursor.

A transformed file is written under a temporary name, fsynced, and published with its sha256 and size
beside it (model.ckpt.digest.json or model.safetensors.digest.json, `publish`); every rank checks the
file it is about to load against that record (`verify`: with an unsharded destination all ranks load
the main rank's one file), so a damaged or half-written transformation is an error naming the file,
as for a checkpoint. RUN/resharded is only the bridge to the first checkpoint on the new layout: it is
removed once the resumed run has published its own (checkpoint.write_checkpoint).

The model files may be model.ckpt or model.safetensors (checkpoint.format; the sharded runs of
MindFormers 2.x keep rank_R/*.safetensors). `transform_checkpoint_by_rank` reads .ckpt files only, so a
source in safetensors is first rewritten as model.ckpt, rank by rank (`as_ckpt`: the same tensors in
ms.save_checkpoint's bytes, as format.write_model_file writes them; the ranks share the files between
them), under RUN/resharded/STEP/source/, removed once every rank has its result; the transformation
then runs as for a ckpt checkpoint, and its result is written in the format asked (the resuming run's
checkpoint.format; a merge onto one device: the checkpoint's own). MindSpore's own reader of sharded
safetensors (`transform_checkpoints` on a directory of rank_R/*.safetensors) is not used: it transforms
every destination rank in one process, and with output_format="safetensors" MindSpore 2.10 wrote a
bfloat16 tensor split along its second dimension with the wrong elements (on CPU, a hand-made mp=2
checkpoint resharded onto mp=4; with output_format="ckpt" the same call was right).
"""
from __future__ import annotations

import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

KINDS = ("same", "replicated", "slice", "merge", "transform")
DIGEST_SUFFIX = ".digest.json"      # beside each transformed file: {"sha256", "bytes"}


@dataclass(frozen=True)
class Layout:
    dp: int
    mp: int = 1
    pp: int = 1
    optimizer_shard: bool = False
    optimizer_level: str | None = None     # with optimizer_shard: which states are sharded (level1..3)

    @property
    def world_size(self) -> int:
        return self.dp * self.mp * self.pp

    @property
    def sharded(self) -> bool:
        """Per-rank files: some tensor is split across ranks (distributed.is_sharded)."""
        return self.mp > 1 or self.pp > 1 or self.optimizer_shard

    def describe(self) -> str:
        shard = f", optimizer shard {self.optimizer_level}" if self.optimizer_shard else ""
        return f"dp {self.dp} x mp {self.mp} x pp {self.pp}{shard}"


def layout_of(cfg, world_size: int) -> Layout:
    """The layout a run of `cfg` on `world_size` processes trains with."""
    p = cfg.parallel
    mp, pp = p.model_parallel, p.pipeline_stage
    return Layout(dp=max(1, world_size // (mp * pp)), mp=mp, pp=pp, optimizer_shard=bool(p.optimizer_shard),
                  optimizer_level=p.optimizer_level if p.optimizer_shard else None)


def record(layout: Layout) -> dict:
    """state.json's "layout"."""
    return asdict(layout)


def saved_layout(state: dict) -> Layout:
    """The layout a checkpoint was written with (without the record: data parallel over its
    `world_size` processes; the trainer resumes such a checkpoint as before, without a plan)."""
    rec = state.get("layout")
    if isinstance(rec, dict):
        return Layout(**{k: rec[k] for k in ("dp", "mp", "pp", "optimizer_shard", "optimizer_level") if k in rec})
    return Layout(dp=int(state.get("world_size") or 1))


@dataclass(frozen=True)
class Plan:
    kind: str                       # one of KINDS
    src: Layout
    dst: Layout
    merge_src_stages: bool          # the source strategies are per pipeline stage: merge them first
    merge_dst_stages: bool

    @property
    def needs_transform(self) -> bool:
        return self.kind in ("slice", "merge", "transform")

    @property
    def src_strategy(self) -> bool:
        """The transformation reads the checkpoint's strategy (else the source is full tensors)."""
        return self.kind in ("merge", "transform")

    @property
    def dst_strategy(self) -> bool:
        """The transformation reads this run's compiled strategy (else the result is full tensors)."""
        return self.kind in ("slice", "transform")

    def describe(self) -> str:
        what = {"same": "the same layout: each rank loads its own file",
                "replicated": "no sharding on either side: every rank loads the full model file",
                "slice": "a full checkpoint onto a sharded layout: each rank takes its slices",
                "merge": "a sharded checkpoint onto an unsharded layout: the slices are joined",
                "transform": "a sharded checkpoint onto another sharded layout: the slices are "
                             "redistributed through both strategies"}[self.kind]
        merges = [side for side, flag in (("the checkpoint's", self.merge_src_stages),
                                          ("this run's", self.merge_dst_stages)) if flag]
        extra = f"; {' and '.join(merges)} pipeline-stage strategies merged first" if merges else ""
        return f"checkpoint layout {self.src.describe()} -> {self.dst.describe()}: {what}{extra}"


def plan(src: Layout, dst: Layout) -> Plan:
    """What loading a checkpoint of layout `src` into a run of layout `dst` takes."""
    if src == dst:
        kind = "same"
    elif not src.sharded and not dst.sharded:
        kind = "replicated"
    elif not src.sharded:
        kind = "slice"
    elif not dst.sharded:
        kind = "merge"
    else:
        kind = "transform"
    transforming = kind in ("slice", "merge", "transform")
    return Plan(kind, src, dst, merge_src_stages=transforming and src.sharded and src.pp > 1,
                merge_dst_stages=transforming and dst.sharded and dst.pp > 1)


# ---------------------------------------------------------------- doing it (Ascend)

def strategy_file(strategy_dir: Path, pipeline: bool, merged: Path, world: int | None = None) -> Path:
    """One strategy file for the whole network: the stages' files merged when `pipeline`, else any
    rank's (without pipeline stages every rank compiles the same strategy). `world`: merge only the
    files of ranks below it (RUN/strategy/ keeps the files of a larger layout the run was resumed from,
    and MindSpore's merge reads every file of the directory)."""
    from mindspore.parallel import merge_pipeline_strategys

    strategy_dir = Path(strategy_dir)
    if pipeline:
        if not merged.is_file():
            merged.parent.mkdir(parents=True, exist_ok=True)
            merge_pipeline_strategys(str(current_ranks(strategy_dir, world, merged.with_suffix(".ranks"))),
                                     str(merged))
        return merged
    files = sorted(strategy_dir.glob("rank_*.ckpt"))
    if not files:
        from mspretrain.train.checkpoint import CheckpointError
        raise CheckpointError(f"{strategy_dir}: no strategy files (rank_R.ckpt): a sharded checkpoint needs "
                              f"them to be transformed onto another layout")
    return files[0]


def current_ranks(strategy_dir: Path, world: int | None, out: Path) -> Path:
    """`strategy_dir` itself, or (`world` given) `out` holding copies of its rank_R.ckpt for R < world."""
    if world is None:
        return strategy_dir
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for r in range(world):
        src = strategy_dir / f"rank_{r}.ckpt"
        if src.is_file():
            shutil.copyfile(src, out / src.name)
    return out


def transform(p: Plan, ckpt_dir: Path, run_dir: Path | None, rank: int, this_strategy_dir: Path | None,
              barrier=None, out: Path | None = None, fmt: str | None = None) -> Path:
    """Build this rank's checkpoint for the new layout: RUN/resharded/STEP/rank_R/model.ckpt, or
    model.safetensors with `fmt` "safetensors" (default: the checkpoint's own format), or under `out`;
    returns RUN/resharded/STEP (load it with rank=R, or without a rank when the new layout is
    unsharded). The main rank merges the strategies and the ranks share the rewriting of safetensors
    sources as .ckpt (`as_ckpt`; between `barrier()` calls); each rank then transforms only the source
    ranks its slices come from."""
    from mindspore.parallel import rank_list_for_transform, transform_checkpoint_by_rank

    from mspretrain.train.checkpoint import MODEL_FILE, MODEL_FILES, RESHARDED, model_format

    ckpt_dir = Path(ckpt_dir)
    out = Path(out) if out is not None else Path(run_dir) / RESHARDED / ckpt_dir.name
    merged = out / "strategy"
    sources = source_files(ckpt_dir, p.src.sharded)
    fmt = fmt or model_format(next(iter(sources.values())))
    converted = out / "source"

    def strategies():
        src = strategy_file(ckpt_dir / "strategy", p.merge_src_stages, merged / "source.ckpt",
                            p.src.world_size) if p.src_strategy else None
        dst = strategy_file(this_strategy_dir, p.merge_dst_stages, merged / "destination.ckpt",
                            p.dst.world_size) if p.dst_strategy else None
        return src, dst
    if barrier:
        barrier()           # every rank has compiled: its destination strategy file is written
    if rank == 0:
        src, dst = strategies()
    workers = p.dst.world_size      # with barriers: the ranks share the rewriting; alone: all of it
    ckpt_files = {r: as_ckpt(path, converted / f"rank_{r}", write=i % workers == rank if barrier else True)
                  for i, (r, path) in enumerate(sorted(sources.items()))}
    if barrier:
        barrier()           # the merged strategy files and the sources as .ckpt exist
    if rank != 0:
        src, dst = strategies()
    src_s, dst_s = (str(src) if src else None), (str(dst) if dst else None)
    target_rank = rank if p.dst.sharded else 0
    name = MODEL_FILES[fmt]
    if p.dst.sharded or rank == 0:
        needed = rank_list_for_transform(target_rank, src_s, dst_s)
        files = {r: str(ckpt_files[r if p.src.sharded else 0]) for r in needed}
        dest = out / (f"rank_{target_rank}" if p.dst.sharded else "") / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        for other in set(MODEL_FILES.values()) - {name}:       # an earlier attempt in the other format
            for stale in (dest.with_name(other), dest.with_name(other + DIGEST_SUFFIX)):
                stale.unlink(missing_ok=True)
        tmp = dest.with_name(".tmp-" + MODEL_FILE)      # MindSpore wants the .ckpt suffix
        transform_checkpoint_by_rank(target_rank, files, str(tmp), src_s, dst_s)
        if fmt != "ckpt":
            tmp = rewrite(tmp, dest.with_name(".tmp-" + name))
        publish(tmp, dest)
    if barrier:
        barrier()
    if rank == 0 or not barrier:    # every rank has its result: the rewritten sources are not needed again
        shutil.rmtree(converted, ignore_errors=True)
    verify(out / (f"rank_{rank}" if p.dst.sharded else "") / name)     # the file this rank loads
    return out


def source_files(ckpt_dir: Path, sharded: bool) -> dict[int, Path]:
    """The checkpoint's model file of each source rank (model.ckpt or model.safetensors): rank_R/'s
    when `sharded`, else {0: the one full file}."""
    from mspretrain.train.checkpoint import CheckpointError, model_file

    if not sharded:
        return {0: model_file(ckpt_dir)}
    found = {int(d.name[len("rank_"):]): model_file(d) for d in Path(ckpt_dir).glob("rank_*")
             if d.is_dir() and d.name[len("rank_"):].isdigit()}
    if not found:
        raise CheckpointError(f"{ckpt_dir}: no rank_R/ directories: not a sharded checkpoint")
    return found


def as_ckpt(path: Path, out_dir: Path, write: bool) -> Path:
    """`path` itself when it is a model.ckpt; else the .ckpt it is rewritten as, out_dir/model.ckpt
    (written now when `write`: this rank's share; another rank's otherwise)."""
    from mspretrain.train.checkpoint import MODEL_FILE, model_format

    if model_format(path) == "ckpt":
        return path
    dest = out_dir / MODEL_FILE
    if write:
        out_dir.mkdir(parents=True, exist_ok=True)
        rewrite(path, dest.with_name(".tmp-" + MODEL_FILE)).replace(dest)
    return dest


def rewrite(src: Path, dest: Path) -> Path:
    """The tensors of model file `src` written into `dest`, in the format of `dest`'s name
    (format.write_model_file: the bytes ms.save_checkpoint writes), fsynced; returns `dest` and
    removes `src` when it was a temporary file (.tmp-*)."""
    from mspretrain.train.checkpoint import host_copy, load_file, write_model_file

    write_model_file(dest, host_copy(load_file(src), copy=False))
    if src.name.startswith(".tmp-"):
        src.unlink()
    return dest


def publish(tmp: Path, dest: Path) -> dict:
    """Move a finished transformation `tmp` to `dest` (fsynced first) and record its digest beside it;
    returns the digest."""
    from mspretrain.common import files
    from mspretrain.train.checkpoint import CheckpointError, file_digest

    if not tmp.is_file():
        raise CheckpointError(f"the checkpoint transformation wrote nothing into {tmp}")
    digest = file_digest(tmp)
    files.publish(tmp, dest)
    files.atomic_write_json(dest.with_name(dest.name + DIGEST_SUFFIX), digest)
    return digest


def verify(path: Path) -> None:
    """`path` (a transformed model file) has the size and sha256 recorded when it was written;
    CheckpointError naming it otherwise (or when the record is missing or unreadable)."""
    import json

    from mspretrain.train.checkpoint import FILES_KEY, CheckpointError, verify_files

    path = Path(path)
    record = path.with_name(path.name + DIGEST_SUFFIX)
    try:
        want = json.loads(record.read_bytes())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: its digest record {record.name} cannot be read ({e}); the "
                              f"transformation did not finish: delete {path.parent} and resume again") from None
    verify_files(path.parent, {FILES_KEY: {path.name: want}})


# ---------------------------------------------------------------- one device (eval, export, doctor)

ONE_DEVICE = Layout(dp=1)
MERGED_DIR = "merged"       # CKPT/merged/model.ckpt (or .safetensors): a sharded checkpoint's full tensors, kept


def is_sharded_checkpoint(ckpt_dir) -> bool:
    """Per-rank files (CKPT/rank_R/model.ckpt or model.safetensors) and no full model file."""
    from mspretrain.train.checkpoint import MODEL_FILES
    ckpt_dir = Path(ckpt_dir)
    return (not any((ckpt_dir / name).is_file() for name in MODEL_FILES.values())
            and any((ckpt_dir / "rank_0" / name).is_file() for name in MODEL_FILES.values()))


def merge_plan(state: dict, strategy_dir: Path) -> Plan:
    """The transformation of a sharded checkpoint onto one device: its recorded layout, or (a checkpoint
    written before layouts were recorded) pipeline stages whenever its ranks' strategy files differ
    (without stages every rank compiles the same strategy; with them each file holds its stage)."""
    from mspretrain.train.checkpoint import CheckpointError

    if isinstance(state.get("layout"), dict):
        src = saved_layout(state)
    else:
        files = sorted(Path(strategy_dir).glob("rank_*.ckpt"))
        staged = len({f.read_bytes() for f in files}) > 1
        src = Layout(dp=1, pp=2) if staged else Layout(dp=1, mp=2)   # for a merge only stages matter
    p = plan(src, ONE_DEVICE)
    if p.kind != "merge":
        raise CheckpointError(f"{strategy_dir.parent}: per-rank files, but its layout ({src.describe()}) "
                              f"shards nothing; there is nothing to merge")
    return p


def merged_to_one_device(ckpt_dir, out: Path | None = None) -> Path:
    """The directory whose model file holds `ckpt_dir`'s full tensors: `ckpt_dir` itself when it has one
    (model.ckpt or model.safetensors), else its ranks' slices joined with MindSpore's checkpoint
    transformation (the strategy files CKPT/strategy/rank_R.ckpt, pipeline stages merged first) into
    `out` (default CKPT/merged/), as model.ckpt or model.safetensors like the ranks' files, built once:
    a directory appears complete or not at all. For `train eval` (loss, tasks, the in-loop suite of a
    sharded run), export/generate/score (runinfo.model_weights) and the doctor's pp rung."""
    import shutil

    from mspretrain.train.checkpoint import (CheckpointError, MODEL_FILE, MODEL_FILES, model_file, model_format,
                                             read_state)

    ckpt_dir = Path(ckpt_dir)
    if any((ckpt_dir / name).is_file() for name in MODEL_FILES.values()):
        return ckpt_dir
    if not is_sharded_checkpoint(ckpt_dir):
        raise CheckpointError(f"{ckpt_dir}: neither {MODEL_FILE} nor rank_0/{MODEL_FILE}")
    fmt = model_format(model_file(ckpt_dir / "rank_0"))       # the merge is written in the shards' format
    name = MODEL_FILES[fmt]
    out = Path(out) if out is not None else ckpt_dir / MERGED_DIR
    if (out / name).is_file():
        try:
            verify(out / name)
            return out
        except CheckpointError as e:    # damaged, or cached before merges recorded a digest
            print(f"[reshard] {out} is not usable ({e}); merging the shards again", file=sys.stderr)
    p = merge_plan(read_state(ckpt_dir), ckpt_dir / "strategy")
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    transform(p, ckpt_dir, None, 0, None, out=partial, fmt=fmt)
    if not (partial / name).is_file():
        raise CheckpointError(f"{ckpt_dir}: merging the shards wrote nothing into {partial}")
    if out.exists():        # an incomplete or older cache (rank_0/*.ckpt): ours to replace
        shutil.rmtree(out)
    partial.rename(out)
    return out
