"""checkpoint.format safetensors: model.safetensors is the file ms.save_checkpoint(format="safetensors")
writes (the same bytes), read back the same by `safetensors.safe_open` (the independent reader) and by
ms.load_checkpoint(format="safetensors"); written the same by the synchronous and the background
writer; checked by its digest; found by resume whichever format a step dir holds; and a run in it is
killed, resumed and exported with the losses and the tensors of the same run in ckpt format, bit for bit."""
import numpy as np
import pytest

from mspretrain.train import checkpoint as ckpt
from mspretrain.train.checkpoint import safetensors_file
from mspretrain.train.config import ConfigError, load_config
from train_test_hooks import KILL_ENV, env as hook_env
from trainer_harness import exact_view, launch_cmd, run

ST = ckpt.MODEL_FILES["safetensors"]


def mixed_params(scale: float = 1.0) -> dict:
    """fp32 (a matrix, a scalar), bf16, fp16 and an int32 counter: the dtypes a run holds."""
    import mindspore as ms
    from mindspore import Parameter, Tensor

    values = {"model.w": Tensor(np.arange(12, dtype=np.float32).reshape(3, 4) * scale / 7),
              "model.b16": Tensor(np.linspace(-3, 3, 10, dtype=np.float32) * scale, ms.bfloat16),
              "adam_m.model.h": Tensor(np.array([0.1, -2.5, 1000.0], np.float16) * np.float16(scale)),
              "global_step": Tensor(np.array([int(7 * scale)], np.int32)),
              "learning_rate": Tensor(np.float32(3e-3 * scale))}
    return {k: Parameter(v, name=k) for k, v in values.items()}


def tensors_of(params: dict) -> dict:
    """{name: (MindSpore dtype, shape, bytes)}: what a model file must hold of each tensor."""
    return {t.name: (t.dtype, tuple(t.dims), bytes(memoryview(t.data).cast("B")) if isinstance(t.data, np.ndarray)
                     else bytes(t.data)) for t in ckpt.host_copy(params)}


def read_with_safe_open(path) -> tuple[dict, dict]:
    """The file as the safetensors library reads it: (metadata, {name: (dtype code, shape, bytes)})."""
    import torch
    from safetensors import safe_open

    out = {}
    with safe_open(str(path), framework="pt") as f:
        for name in f.keys():
            t = f.get_tensor(name)
            code = f.get_slice(name).get_dtype()
            out[name] = (code, tuple(t.shape), t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        return f.metadata(), out


def test_model_safetensors_is_mindspores_file_and_reads_back_the_same(tmp_path):
    import mindspore as ms

    params = mixed_params()
    final = ckpt.write_checkpoint(tmp_path, 3, params, {"step": 3}, keep_max=2, fmt="safetensors")
    path = final / ST
    assert sorted(p.name for p in final.iterdir()) == [ST, "state.json"]
    assert ckpt.read_state(final)["files"] == {ST: ckpt.file_digest(path)}
    # the same bytes as MindSpore's own writer, metadata {"format": "ms"} included
    ms.save_checkpoint([{"name": k, "data": p} for k, p in params.items()], str(tmp_path / "ms.safetensors"),
                       format="safetensors")
    assert path.read_bytes() == (tmp_path / "ms.safetensors").read_bytes()

    want = tensors_of(params)
    codes = {"Float32": "F32", "BFloat16": "BF16", "Float16": "F16", "Int32": "I32"}
    meta, got = read_with_safe_open(path)
    assert meta == {"format": "ms"}
    assert got == {k: (codes[dt], shape, data) for k, (dt, shape, data) in want.items()}
    assert tensors_of(ms.load_checkpoint(str(path), format="safetensors")) == want
    # and back into parameters through the resume's reader
    target = mixed_params(scale=0.0)
    ckpt.load_params(final, target)
    assert tensors_of(target) == want


def every_dtype() -> list:
    """One tensor of every dtype the safetensors writer knows, under names that sort apart from their
    dtypes (the file orders tensors by dtype, then by name)."""
    rng = np.random.default_rng(0)
    out = []
    for i, dtype in enumerate(reversed(list(safetensors_file._DTYPES))):
        width = {"Bool": 1, "UInt8": 1, "Int8": 1, "Int16": 2, "UInt16": 2, "Float16": 2, "BFloat16": 2,
                 "Int32": 4, "UInt32": 4, "Float32": 4}.get(dtype, 8)
        shape = [i % 3 + 1, 2]
        data = rng.integers(0, 256, size=width * shape[0] * shape[1], dtype=np.uint8).tobytes()
        out.append(ckpt.HostTensor(f"{'zyx'[i % 3]}.t{i}", shape, dtype, data))
    out.append(ckpt.HostTensor("a.scalar", [], "Float32", np.float32(1.5).tobytes()))
    out.append(ckpt.HostTensor("b.empty", [0, 4], "BFloat16", b""))
    return out


def test_background_image_is_the_librarys_file(tmp_path):
    """The background write's image (its header encoded here) gives the bytes the library's writer does,
    for every dtype, refilled with new values and paced; and through a BackgroundWriter the whole
    checkpoint is the synchronous one's."""
    import threading

    tensors = every_dtype()
    sync = ckpt.write_model_file(tmp_path / "sync.safetensors", tensors)
    image = ckpt.ModelImage().fill(tensors, fmt="safetensors")
    assert ckpt.write_model_file(tmp_path / "image.safetensors", image) == sync
    assert (tmp_path / "image.safetensors").read_bytes() == (tmp_path / "sync.safetensors").read_bytes()
    paced = ckpt.write_model_file(tmp_path / "paced.safetensors", tensors, pace=ckpt.Pacer(0.0, threading.Event()))
    assert paced == sync
    with pytest.raises(ckpt.CheckpointError, match="laid out as safetensors"):
        ckpt.write_model_file(tmp_path / "model.ckpt", image)

    first, second = mixed_params(1.0), mixed_params(2.0)
    writer = ckpt.BackgroundWriter()
    for step, params in ((1, first), (2, second)):      # the second reuses the first's layout
        img = writer.image.fill(ckpt.host_copy(params, copy=False), fmt="safetensors")
        writer.start(step, lambda pace, img=img, step=step: ckpt.write_checkpoint(
            tmp_path / "bg", step, img, {"step": step}, keep_max=5, pace=pace))
        writer.wait()
        ckpt.write_checkpoint(tmp_path / "sync", step, params, {"step": step}, keep_max=5, fmt="safetensors")
        a, b = (tmp_path / d / "checkpoints" / ckpt.step_dir_name(step) for d in ("bg", "sync"))
        assert (a / ST).read_bytes() == (b / ST).read_bytes()
        assert ckpt.read_state(a) == ckpt.read_state(b)


def test_a_corrupted_model_safetensors_is_named(tmp_path):
    final = ckpt.write_checkpoint(tmp_path, 2, mixed_params(), {"step": 2, "loader": {"cursor": 16}},
                                  keep_max=2, fmt="safetensors")
    path = final / ST
    good = path.read_bytes()
    path.chmod(0o644)
    path.write_bytes(good[:-3] + bytes([good[-3] ^ 0x10]) + good[-2:])       # one bit of the last tensor
    with pytest.raises(ckpt.CheckpointError, match=f"{path}: sha256 differs"):
        ckpt.check_checkpoint(final)
    with pytest.raises(ckpt.CheckpointError, match=f"{path}: sha256 differs"):
        ckpt.load_params(final, mixed_params())
    path.write_bytes(good[:100])
    with pytest.raises(ckpt.CheckpointError, match=f"{path}: 100 bytes"):
        ckpt.check_checkpoint(final)
    with pytest.raises(ckpt.CheckpointError, match=f"{path}: cannot be read as a checkpoint"):
        ckpt.load_file(path)


def test_a_step_dir_holds_one_model_file_whichever_it_is(tmp_path):
    """Resume takes the model file the step dir holds (a run may change checkpoint.format between
    saves); both, or neither, is an error naming the directory."""
    from mspretrain.train.checkpoint.checkpointer import Checkpointer

    state = {"step": 2, "loader": {"cursor": 16}}
    for fmt in ckpt.FORMATS:
        final = ckpt.write_checkpoint(tmp_path / fmt, 2, mixed_params(), state, keep_max=2, fmt=fmt)
        assert ckpt.model_file(final).name == ckpt.MODEL_FILES[fmt]
        target = mixed_params(scale=0.0)
        ckpt.load_params(final, target)
        assert tensors_of(target) == tensors_of(mixed_params())
    both = tmp_path / "safetensors" / "checkpoints" / "step_00000002"
    (both / ckpt.MODEL_FILE).write_bytes((tmp_path / "ckpt" / "checkpoints" / "step_00000002" / ckpt.MODEL_FILE)
                                         .read_bytes())
    cfg = load_config(None, [f"run.dir={tmp_path / 'safetensors'}"])
    for check in (ckpt.check_checkpoint, lambda d: ckpt.load_params(d, mixed_params()),
                  lambda d: Checkpointer(cfg, None).find(str(d))):
        with pytest.raises(ckpt.CheckpointError, match=f"{both}: holds both model.ckpt and model.safetensors"):
            check(both)
    (both / ckpt.MODEL_FILE).unlink()
    (both / ST).unlink()
    ckpt.write_checkpoint(tmp_path / "bare", 2, mixed_params(), state, keep_max=2)
    bare = tmp_path / "bare" / "checkpoints" / "step_00000002"
    (bare / ckpt.MODEL_FILE).unlink()
    (bare / "state.json").write_text('{"step": 2, "loader": {"cursor": 16}}')    # no digests to miss it
    for check in (lambda d: ckpt.check_checkpoint(d, out=lambda s: None), lambda d: ckpt.load_params(d, {})):
        with pytest.raises(ckpt.CheckpointError, match=f"{bare}: neither model.ckpt nor model.safetensors found"):
            check(bare)


def test_the_key_is_checked_and_left_out_of_records_at_its_default():
    # config.py keeps its own list (importing the checkpoint room would load MindSpore with the config)
    from mspretrain.train.config import CHECKPOINT_FORMATS
    assert CHECKPOINT_FORMATS == ckpt.FORMATS
    with pytest.raises(ConfigError, match="checkpoint.format must be one of ckpt, safetensors, got 'pt'"):
        load_config(None, ["checkpoint.format=pt"])
    # ckpt runs record their config as before the key (run.json, state.json), safetensors ones name it
    assert "format" not in load_config(None, []).to_dict()["checkpoint"]
    assert load_config(None, ["checkpoint.format=safetensors"]).to_dict()["checkpoint"]["format"] == "safetensors"
    assert load_config(None, ["checkpoint.format=safetensors"]).hash() == load_config(None, []).hash()


def test_safetensors_is_accepted_with_the_sharded_layouts():
    """A sharded run writes rank_R/model.safetensors: the shipped 7B and 13B configs (model parallel,
    pipeline stages, optimizer sharding) and each sharding key alone take the key."""
    from pathlib import Path

    configs = Path(__file__).resolve().parents[3] / "configs"
    for name in ("llama-7b.yaml", "llama-13b.yaml"):
        cfg = load_config(configs / name, ["checkpoint.format=safetensors"])
        p = cfg.parallel
        assert cfg.checkpoint.format == "safetensors"
        assert p.model_parallel > 1 or p.pipeline_stage > 1 or p.optimizer_shard, name
    for key in ("parallel.model_parallel=2", "parallel.pipeline_stage=2", "parallel.optimizer_shard=true"):
        assert load_config(None, ["checkpoint.format=safetensors", key]).checkpoint.format == "safetensors"


# ------------------------------------------------ sharded: merged and resharded through .ckpt

def sharded_params() -> dict:
    """The dtypes of a run in matrices MindSpore's transformation splits: fp32 (and its AdamW moment)
    by rows, bf16 by columns (MindSpore 2.10's own safetensors transformation got that one wrong),
    fp16 by rows; a vector, the int32 counter and the scalar learning rate whole."""
    import mindspore as ms
    from mindspore import Parameter, Tensor

    rng = np.random.default_rng(3)
    values = {"model.w": Tensor(rng.standard_normal((4, 6)).astype(np.float32)),
              "model.e": Tensor(rng.standard_normal((6, 4)).astype(np.float32), ms.bfloat16),
              "model.h": Tensor(rng.standard_normal((4, 2)).astype(np.float16)),
              "adam_m.model.w": Tensor(rng.standard_normal((4, 6)).astype(np.float32)),
              "model.n": Tensor(rng.standard_normal(6).astype(np.float32)),
              "global_step": Tensor(np.array([2], np.int32)),
              "learning_rate": Tensor(np.float32(3e-3))}
    return {k: Parameter(v, name=k) for k, v in values.items()}


STATE = {"step": 2, "loader": {"cursor": 16}}
MP4 = {"model.w": ([4], [0, -1]), "model.e": ([4], [-1, 0]), "model.h": ([4], [0, -1]),
       "adam_m.model.w": ([2, 2], [1, -1]), "model.n": ([4], [-1]), "global_step": ([4], [-1]),
       "learning_rate": ([4], [])}


def slices_of(full: dict, r: int) -> dict:
    """Rank r's tensors on MP4, cut from the full ones with numpy: {name: (dtype, shape, bytes)}."""
    out = {}
    for k, v in full.items():
        dev, tmap = MP4[k]
        for axis, m in enumerate(tmap):
            if m != -1:
                size = dev[len(dev) - 1 - m]
                index = (r // int(np.prod(dev[len(dev) - m:]))) % size
                v = np.split(v, size, axis)[index]
        out[k] = (str(v.dtype), v.shape, np.ascontiguousarray(v).tobytes())
    return out


def as_numpy(tensors: dict) -> dict:
    return {k: (str(v.asnumpy().dtype), tuple(v.shape), np.ascontiguousarray(v.asnumpy()).tobytes())
            for k, v in tensors.items()}


def sharded_pair(tmp_path) -> tuple:
    """The same mp=2 checkpoint twice, its ranks' files as model.ckpt and as model.safetensors
    (MindSpore's own writers); and the full tensors."""
    from sharded_helpers import shard_checkpoint

    dirs = {}
    for fmt in ("ckpt", "safetensors"):
        final = ckpt.write_checkpoint(tmp_path / fmt, 2, sharded_params(), STATE, keep_max=2)
        full = shard_checkpoint(final, fmt=fmt, cols={"model.e"})
        ckpt.check_checkpoint(final, out=lambda s: None)
        dirs[fmt] = final
    assert sorted(p.name for p in (dirs["safetensors"] / "rank_1").iterdir()) == [ST]
    return dirs, full


def test_sharded_safetensors_merge_onto_one_device_equals_the_ckpt_merge(tmp_path):
    """merged_to_one_device of rank_R/model.safetensors: CKPT/merged/model.safetensors (its digest
    beside it, checked, kept), the tensors of the ckpt checkpoint's merge bit for bit, and the full
    ones; the ranks' files rewritten as .ckpt for MindSpore's transformation are gone afterwards."""
    from mspretrain.train import runinfo
    from mspretrain.train.checkpoint.reshard import is_sharded_checkpoint, merged_to_one_device, verify

    dirs, full = sharded_pair(tmp_path)
    assert is_sharded_checkpoint(dirs["safetensors"])
    merged = {fmt: merged_to_one_device(d) for fmt, d in dirs.items()}
    assert sorted(p.name for p in merged["safetensors"].iterdir()) == [ST, ST + ".digest.json"]
    verify(merged["safetensors"] / ST)
    got = as_numpy(ckpt.load_file(merged["safetensors"] / ST))
    assert got == as_numpy(ckpt.load_file(merged["ckpt"] / ckpt.MODEL_FILE))
    assert got == {k: (str(v.dtype), v.shape, v.tobytes()) for k, v in full.items()}
    stamp = (merged["safetensors"] / ST).stat().st_mtime_ns
    assert merged_to_one_device(dirs["safetensors"]) == merged["safetensors"]      # kept
    assert (merged["safetensors"] / ST).stat().st_mtime_ns == stamp
    # export/score's reader takes the merge as well
    weights = runinfo.model_weights(dirs["safetensors"])
    assert sorted(weights) == ["e", "h", "n", "w"]
    assert weights["w"].tobytes() == full["model.w"].tobytes()


def test_sharded_safetensors_reshard_equals_the_ckpt_path(tmp_path):
    """mp=2 -> mp=4 (`transform`, rank by rank as the resumed ranks do it) from rank_R/model.safetensors:
    each rank's file holds the tensors the ckpt checkpoint's transformation gives, bit for bit, and
    numpy's slices of the full tensors; in the source's format by default, in the one asked (the
    resuming run's checkpoint.format) otherwise, either way round; and from a full model.safetensors
    (`slice`)."""
    from sharded_helpers import write_strategy

    from mspretrain.train.checkpoint.reshard import Layout, plan, transform, verify

    dirs, full = sharded_pair(tmp_path)
    dst_dir = tmp_path / "dst-strategy"
    for r in range(4):
        write_strategy(dst_dir / f"rank_{r}.ckpt", 0, MP4)
    p = plan(Layout(dp=1, mp=2), Layout(dp=1, mp=4))
    assert p.kind == "transform"

    def resharded(src, out, fmt=None, kind=p):
        for r in range(4):
            transform(kind, src, None, r, dst_dir, out=out, fmt=fmt)
        return {r: ckpt.model_file(out / f"rank_{r}") for r in range(4)}

    ref = resharded(dirs["ckpt"], tmp_path / "from-ckpt")
    runs = {"safetensors": resharded(dirs["safetensors"], tmp_path / "from-st"),
            "ckpt": resharded(dirs["safetensors"], tmp_path / "from-st-as-ckpt", fmt="ckpt"),
            "ckpt->safetensors": resharded(dirs["ckpt"], tmp_path / "from-ckpt-as-st", fmt="safetensors")}
    assert [f.name for f in runs["safetensors"].values()] == [ST] * 4
    assert [f.name for f in runs["ckpt"].values()] == [ckpt.MODEL_FILE] * 4
    assert [f.name for f in runs["ckpt->safetensors"].values()] == [ST] * 4
    assert not (tmp_path / "from-st" / "source").exists()
    for r in range(4):
        want = as_numpy(ckpt.load_file(ref[r]))
        assert want == slices_of(full, r)
        for files in runs.values():
            verify(files[r])
            assert as_numpy(ckpt.load_file(files[r])) == want, (files[r], r)

    # a full model.safetensors sliced onto mp=4
    whole = ckpt.write_checkpoint(tmp_path / "full", 2, sharded_params(), STATE, keep_max=2, fmt="safetensors")
    files = resharded(whole, tmp_path / "sliced", kind=plan(Layout(dp=1), Layout(dp=1, mp=4)))
    assert all(f.name == ST and as_numpy(ckpt.load_file(f)) == slices_of(full, r) for r, f in files.items())


SETS = ("train.steps=8", "checkpoint.every_steps=4", "checkpoint.keep_max=2", "eval.every_steps=0",
        "log.every_steps=1")
SAFETENSORS = SETS + ("checkpoint.format=safetensors",)


@pytest.mark.slow
def test_a_safetensors_run_killed_and_resumed_is_the_ckpt_run_bit_for_bit(tmp_path, tiny_data):
    """The same run three ways: ckpt straight through; safetensors killed inside its step-8 write and
    resumed from step 4's model.safetensors, the rest with the background writer. The losses, the final
    tensors and the HF export are the same bit for bit; the background writer's file is the bytes the
    synchronous one writes of those tensors; plain ms.load_checkpoint(format="safetensors") loads it
    into the model."""
    import mindspore as ms

    from mspretrain.train import runinfo
    from mspretrain.train.hf.convert import WEIGHTS_FILE, export_run

    straight = tmp_path / "straight"
    r = run(launch_cmd(straight, tiny_data, *SETS))
    assert r.returncode == 0, r.stderr
    killed = tmp_path / "killed"
    r = run(launch_cmd(killed, tiny_data, *SAFETENSORS), env=hook_env(**{KILL_ENV: "before_rename:8"}))
    assert r.returncode < 0 and (killed / "checkpoints" / "latest").read_text().strip() == "step_00000004"
    r = run(launch_cmd(killed, tiny_data, *SAFETENSORS, "checkpoint.async=true", resume="auto"))
    assert r.returncode == 0, r.stderr
    assert "step_00000004" in r.stdout
    assert exact_view(killed) == exact_view(straight) and len(exact_view(straight)) == 8

    a, b = (d / "checkpoints" / "step_00000008" for d in (straight, killed))
    ckpt.check_checkpoint(b)
    assert sorted(p.name for p in b.iterdir()) == [ST, "state.json"]
    saved = ckpt.load_file(b / ST)
    assert tensors_of(saved) == tensors_of(ckpt.load_file(a / ckpt.MODEL_FILE))
    ckpt.write_model_file(tmp_path / "sync.safetensors", ckpt.host_copy(saved))
    assert (b / ST).read_bytes() == (tmp_path / "sync.safetensors").read_bytes()
    ms.save_checkpoint([{"name": k, "data": v} for k, v in saved.items()], str(tmp_path / "ms.safetensors"),
                       format="safetensors")
    assert (b / ST).read_bytes() == (tmp_path / "ms.safetensors").read_bytes()

    # MindFormers' way: the model built from the run's config, its weights loaded by MindSpore alone
    from mspretrain.train.models import spec as model_spec
    from mspretrain.train.step.loss import CausalLMLoss
    cfg = runinfo.run_config(killed)
    family = model_spec.of(cfg)
    model = family.build_model(runinfo.model_args_of_run(killed, cfg), seed=99)
    net = CausalLMLoss(model, model.args.vocab_size, -1)
    missed, _ = ms.load_param_into_net(net, ms.load_checkpoint(str(b / ST), format="safetensors"))
    assert missed == []
    weights = {p.name: p for p in net.get_parameters()}
    assert weights and tensors_of(weights) == {k: v for k, v in tensors_of(saved).items() if k in weights}

    for run_dir in (straight, killed):
        export_run(run_dir, tmp_path / f"hf-{run_dir.name}")
    assert ((tmp_path / "hf-killed" / WEIGHTS_FILE).read_bytes()
            == (tmp_path / "hf-straight" / WEIGHTS_FILE).read_bytes())
