"""Writing a whole checkpoint atomically (temp dir, fsync, rename, then `latest`), checking its files
against the digests in its state.json, and reading it back.

`on_phase(phase, step)` is called at the moments that matter for crash safety: `model_written` (the
model file is written and fsynced), `before_rename` (temp dir complete, not renamed) and
`before_latest` (renamed, latest not yet updated). The trainer passes train.hooks' callback, a no-op
unless a hooks module replaced it: the kill-and-resume tests SIGKILL, slow down or fail the writer there.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import mindspore as ms

from mspretrain.common.files import atomic_write_json, atomic_write_text, fsync_path
from mspretrain.common.fsmode import use_umask
from mspretrain.train.checkpoint.format import (CheckpointError, ModelImage, Pacer, file_digest, host_copy,
                                                load_file, write_model_file)
from mspretrain.train.checkpoint.layout import (FILES_KEY, LATEST, MODEL_FILES, RANK_DIGESTS, RESHARDED,
                                                STATE_FILE, STEP_RE, checkpoints_root, list_checkpoints,
                                                model_file, move_aside, pointer_name, prune, step_dir_name)


def find_resumable(run_dir, warn=None) -> Path | None:
    """The newest checkpoint that passes `check_checkpoint`, for `--resume auto`; None when the run
    has no checkpoint at all (and no `latest`). Each newer one passed over, and a `latest` that is
    missing, garbage or names another, is reported through `warn`. CheckpointError when checkpoints
    exist but none is complete: nothing is changed then."""
    warn = warn or (lambda s: print(s, file=sys.stderr, flush=True))
    root = checkpoints_root(run_dir)
    pointer = root / LATEST
    named = pointer_name(pointer) if pointer.exists() else None
    passed_over = []
    for ckpt in reversed(list_checkpoints(run_dir)):
        try:
            check_checkpoint(ckpt)
        except CheckpointError as e:
            passed_over.append(str(e))
            continue
        for problem in passed_over:
            warn(f"[train] warning: skipping a damaged checkpoint: {problem}")
        if named != ckpt.name:
            said = ("is missing" if not pointer.exists() else
                    f"names {named}" if named else "does not hold a checkpoint name")
            warn(f"[train] warning: {pointer} {said}; resuming from the newest complete checkpoint, "
                 f"{ckpt.name}")
        return ckpt
    if passed_over or pointer.exists():
        found = "; ".join(passed_over) or f"{pointer} exists but no checkpoint directory does"
        raise CheckpointError(f"no complete checkpoint to resume from in {root}: {found}. "
                              f"Nothing was changed.")
    return None


def check_checkpoint(ckpt_dir, out=None) -> dict:
    """state.json of `ckpt_dir`, after checking it (`check_state`), every file's digest and that it
    holds one model file (per rank when sharded); or CheckpointError naming the file."""
    state = read_state(ckpt_dir)
    check_state(state, ckpt_dir)
    verify_files(ckpt_dir, state, out=out)
    ranks = sorted(Path(ckpt_dir).glob("rank_*/"))
    for model_dir in ranks or [Path(ckpt_dir)]:
        model_file(model_dir)
    return state


def write_checkpoint(run_dir, step: int, params: "dict | list | ModelImage", state: dict, keep_max: int,
                     rank: int | None = None, is_main: bool = True, barrier=None,
                     add_files=None, on_phase=None, pace: Pacer | None = None, fmt: str = "ckpt") -> Path:
    """Write checkpoint `step` atomically and publish it as latest. `params`: name -> Parameter, or
    a snapshot of them: their `host_copy`, or a `ModelImage` (a background write). `rank` set: per-rank model file
    (sharded); then every rank calls this, `barrier()` separates the rank writes from the rename.
    `add_files(tmp_dir)`: each rank's extra files (e.g. its parallel strategy), written into the
    temporary directory before the second barrier, so they are published with the checkpoint.
    `on_phase(phase, step)`: see above. `pace`: a background write's rate (`Pacer`). `fmt`: the model
    file's format (checkpoint.format; a `ModelImage` has its own)."""
    root = checkpoints_root(run_dir)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{final.name}"
    try:
        if is_main:
            root.mkdir(parents=True, exist_ok=True)
            if tmp.exists():
                shutil.rmtree(tmp)
            tmp.mkdir()
        if barrier:
            barrier()
        model_dir = tmp / f"rank_{rank}" if rank is not None else tmp
        model_dir.mkdir(exist_ok=True)
        model_path = model_dir / MODEL_FILES[params.format if isinstance(params, ModelImage) else fmt]
        tensors = params if isinstance(params, (list, ModelImage)) else host_copy(params, copy=False)
        digests = {model_path.relative_to(tmp).as_posix(): write_model_file(model_path, tensors, pace=pace)}
        use_umask(model_path, readonly=True)
        if on_phase:
            on_phase("model_written", step)
        fsync_path(model_dir)
        if add_files:
            for path in add_files(tmp) or ():
                fsync_path(path)
                fsync_path(path.parent)
                digests[path.relative_to(tmp).as_posix()] = file_digest(path)
        if rank is not None:        # the main rank merges every rank's digests into state.json
            atomic_write_json(tmp / RANK_DIGESTS.format(rank), digests)
        if barrier:
            barrier()
        if not is_main:
            return final
        if rank is not None:
            digests = _merge_rank_digests(tmp)
        atomic_write_json(tmp / STATE_FILE, {**state, FILES_KEY: dict(sorted(digests.items()))})
        fsync_path(tmp)
        if on_phase:
            on_phase("before_rename", step)
        if final.exists():       # the same step again after a resume from an older (or past a damaged) one
            move_aside(final)
        os.rename(tmp, final)
        fsync_path(root)
        if on_phase:
            on_phase("before_latest", step)
        atomic_write_text(root / LATEST, final.name + "\n")
    except (OSError, RuntimeError, ValueError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"cannot write checkpoint {final}: {e} (earlier checkpoints are untouched)") from e
    prune(run_dir, keep_max)
    if _remove_resharded(run_dir):       # a resume onto a new layout: its bridge is no longer needed
        print(f"[train] removed {Path(run_dir) / 'resharded'}: {final.name} is this layout's own "
              f"checkpoint", file=sys.stderr, flush=True)
    return final


def _remove_resharded(run_dir) -> bool:
    """Remove RUN/resharded (train/checkpoint/reshard.py: the transformed files a resume on a new layout loaded)
    once the run has a checkpoint of its own; returns whether there was one."""
    path = Path(run_dir) / RESHARDED
    if not path.exists():
        return False
    shutil.rmtree(path)
    return True


def _merge_rank_digests(tmp: Path) -> dict:
    merged = {}
    for part in sorted(tmp.glob(RANK_DIGESTS.format("*"))):
        merged.update(json.loads(part.read_text()))
        part.unlink()
    return merged


def verify_files(ckpt_dir, state: dict, out=None) -> None:
    """Every file state.json lists has its recorded size and sha256; CheckpointError names the first
    that does not. A checkpoint without the record (written by an older trainer) is loaded with a
    warning: its files cannot be checked."""
    ckpt_dir = Path(ckpt_dir)
    files = state.get(FILES_KEY)
    if files is None:
        (out or (lambda s: print(s, file=sys.stderr, flush=True)))(
            f"[train] warning: {ckpt_dir / STATE_FILE} records no file digests (written by an older "
            f"trainer): {ckpt_dir.name}'s files are not verified")
        return
    if not isinstance(files, dict) or not files:
        raise CheckpointError(f"{ckpt_dir / STATE_FILE}: field {FILES_KEY!r} must map file names to "
                              f"digests, got {files!r}")
    for rel, want in sorted(files.items()):
        path = ckpt_dir / rel
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (listed in {ckpt_dir / STATE_FILE})")
        size = path.stat().st_size
        if not isinstance(want, dict) or size != want.get("bytes"):
            raise CheckpointError(f"{path}: {size} bytes, {STATE_FILE} recorded "
                                  f"{want.get('bytes') if isinstance(want, dict) else want!r} "
                                  f"(truncated or replaced)")
        if file_digest(path)["sha256"] != want.get("sha256"):
            raise CheckpointError(f"{path}: sha256 differs from the one {STATE_FILE} recorded when it "
                                  f"was written (the file is damaged or was replaced)")


def check_state(state: dict, ckpt_dir) -> None:
    """state.json's fields have their types and agree with each other and with the directory's name:
    a state edited or damaged by hand is an error naming the field before anything is written."""
    where = Path(ckpt_dir) / STATE_FILE

    def need(ok: bool, what: str) -> None:
        if not ok:
            raise CheckpointError(f"{where}: {what}; this checkpoint cannot be resumed as it is")

    def count(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0

    step = state.get("step")
    need(count(step), f"field 'step' must be an integer >= 0, got {step!r}")
    m = STEP_RE.match(Path(ckpt_dir).name)
    need(m is None or int(m.group(1)) == step,
         f"step {step} does not match the directory name {Path(ckpt_dir).name}")
    loader = state.get("loader")
    need(isinstance(loader, dict), f"field 'loader' (the loader state) must be an object, got {loader!r}")
    cursor, batch = loader.get("cursor"), loader.get("global_batch_size")
    need(count(cursor), f"field 'loader.cursor' must be an integer >= 0, got {cursor!r}")
    need(batch is None or (count(batch) and batch > 0),
         f"field 'loader.global_batch_size' must be a positive integer, got {batch!r}")
    need(step == 0 or cursor > 0, f"loader.cursor 0 after {step} steps")
    last = state.get("last_metrics")
    if isinstance(last, dict) and "step" in last:
        need(last["step"] == step, f"last_metrics.step {last['step']!r} != step {step}")
        if "consumed_samples" in last:
            need(last["consumed_samples"] == cursor,
                 f"last_metrics.consumed_samples {last['consumed_samples']!r} != loader.cursor {cursor}")
    need(count(state.get("bad_streak", 0)), f"field 'bad_streak' must be an integer >= 0, got "
                                            f"{state.get('bad_streak')!r}")


def read_state(ckpt_dir) -> dict:
    path = Path(ckpt_dir) / STATE_FILE
    try:
        state = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise CheckpointError(f"{path} not found: {ckpt_dir} is not a complete checkpoint") from None
    except (OSError, ValueError) as e:      # JSONDecodeError and invalid UTF-8 are ValueErrors
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(state).__name__}")
    return state


def load_params(ckpt_dir, params: dict, rank: int | None = None, allow_extra: bool = False,
                verify: bool = True, live: bool = False) -> None:
    """Copy the saved tensors into `params` (name -> Parameter); names and shapes must match exactly
    (`allow_extra`: the file may hold more, e.g. optimizer moments when only weights are wanted).
    `verify`: check the files' digests first (off when `check_checkpoint` has just done it).
    `live`: the parameters belong to a graph that has already run (a spike rollback): they are
    written with an assign op, because a GRAPH_MODE step keeps its own copy of some of them
    (MindSpore 2.10: the optimizer's int32 global_step ignored set_data, so Adam's bias correction
    kept counting from the discarded steps)."""
    path = model_file(Path(ckpt_dir) / (f"rank_{rank}" if rank is not None else ""))
    if verify:
        verify_files(ckpt_dir, read_state(ckpt_dir))
    saved = load_file(path)
    missing = sorted(set(params) - set(saved))
    extra = [] if allow_extra else sorted(set(saved) - set(params))
    if missing or extra:
        raise CheckpointError(f"{path} does not match this model: missing {missing[:5]}, unexpected "
                              f"{extra[:5]} (was it written with another model config?)")
    for name, p in params.items():
        value = saved[name]
        if tuple(value.shape) != tuple(p.shape) or value.dtype != p.dtype:
            raise CheckpointError(f"{path}: {name} is {value.dtype}{tuple(value.shape)}, the model has "
                                  f"{p.dtype}{tuple(p.shape)}")
        if live:
            ms.ops.assign(p, value)
        else:
            p.set_data(value)
