"""Resume on another parallel layout: the plan (which transformation a (dp, mp, pp, optimizer shard)
change needs) is a pure function, checked here on CPU; the transformation itself runs on Ascend."""
import pytest

from mspretrain.train.config import load_config
from mspretrain.train.checkpoint.reshard import Layout, layout_of, plan, record, saved_layout
from mspretrain.train.checkpoint.policy import ResumeError, check_resume, config_record

DP2 = Layout(dp=2)
DP4 = Layout(dp=4)
MP2 = Layout(dp=2, mp=2)
MP4 = Layout(dp=1, mp=4)
PP2 = Layout(dp=2, mp=1, pp=2)
PP2_MP2 = Layout(dp=1, mp=2, pp=2)
OPT = Layout(dp=4, optimizer_shard=True, optimizer_level="level1")
OPT2 = Layout(dp=4, optimizer_shard=True, optimizer_level="level2")


@pytest.mark.parametrize("src, dst, kind, merge_src, merge_dst", [
    (DP2, DP2, "same", False, False),
    (MP2, MP2, "same", False, False),             # sharded, same layout: each rank its own file
    (PP2, PP2, "same", False, False),
    (DP2, DP4, "replicated", False, False),       # the elastic dp resume: one full model.ckpt
    (DP4, Layout(dp=1), "replicated", False, False),
    (DP4, MP2, "slice", False, False),            # full -> sharded: cut with the new strategy only
    (DP2, PP2, "slice", False, True),             # ... whose pipeline stages are merged first
    (DP4, OPT, "slice", False, False),            # optimizer sharding alone shards the moments
    (MP2, DP4, "merge", False, False),            # sharded -> full: the old strategy only
    (PP2, DP4, "merge", True, False),
    (OPT, DP2, "merge", False, False),
    (MP2, MP4, "transform", False, False),        # mp 2 -> 4
    (MP2, Layout(dp=1, mp=2), "transform", False, False),   # dp 2 -> 1 at mp 2: slices move between ranks
    (PP2, PP2_MP2, "transform", True, True),      # pp on both sides: both merged
    (MP2, PP2, "transform", False, True),
    (OPT, OPT2, "transform", False, False),       # another optimizer-sharding level
    (OPT, Layout(dp=2, optimizer_shard=True, optimizer_level="level1"), "transform", False, False),
])
def test_plan_names_the_transformation(src, dst, kind, merge_src, merge_dst):
    p = plan(src, dst)
    assert (p.kind, p.merge_src_stages, p.merge_dst_stages) == (kind, merge_src, merge_dst)
    assert p.needs_transform == (kind in ("slice", "merge", "transform"))
    assert p.src_strategy == (kind in ("merge", "transform"))       # a full source has no strategy
    assert p.dst_strategy == (kind in ("slice", "transform"))       # a full result needs none
    assert src.describe() in p.describe() and dst.describe() in p.describe()


def test_layout_from_config_and_state():
    cfg = load_config(None, ["parallel.model_parallel=2", "parallel.pipeline_stage=2",
                             "parallel.optimizer_shard=true", "parallel.optimizer_level=level2"])
    lay = layout_of(cfg, 8)
    assert lay == Layout(dp=2, mp=2, pp=2, optimizer_shard=True, optimizer_level="level2")
    assert lay.world_size == 8 and lay.sharded
    assert saved_layout({"layout": record(lay)}) == lay
    assert saved_layout({"world_size": 3}) == Layout(dp=3) and not Layout(dp=3).sharded
    assert layout_of(load_config(None, ["parallel.optimizer_level=level3"]), 2) == Layout(dp=2)


def test_a_layout_change_resumes_without_force():
    """The layout keys are not a config change the resume refuses: the checkpoint is transformed."""
    old = load_config(None, ["parallel.model_parallel=2"])
    new = load_config(None, ["parallel.model_parallel=4", "parallel.pipeline_stage=2",
                             "parallel.optimizer_shard=true", "parallel.micro_batch_num=4"])
    said = []
    check_resume({"config": config_record(old), "dataset_fingerprint": "f"}, new, "f", "d", "ckpt", False,
                 out=said.append)
    assert "parallel.model_parallel 2 -> 4" in said[0] and "parallel.pipeline_stage 1 -> 2" in said[0]


def test_the_accumulation_mode_changes_on_resume_without_force():
    """train.accumulate (graph loop or split) sums the same micro-batches in another order: a resume on
    one device from a split-accumulating run may loop; another model still needs --force."""
    old = load_config(None, ["train.accumulate=split"])
    said = []
    check_resume({"config": config_record(old), "dataset_fingerprint": "f"},
                 load_config(None, ["train.accumulate=loop"]), "f", "d", "ckpt", False, out=said.append)
    assert "train.accumulate 'split' -> 'loop'" in said[0]
    with pytest.raises(ResumeError, match="model.num_layers"):
        check_resume({"config": config_record(old), "dataset_fingerprint": "f"},
                     load_config(None, ["train.accumulate=loop", "model.num_layers=3"]), "f", "d", "ckpt", False,
                     out=said.append)


def test_a_transformed_file_is_published_with_its_digest_and_checked_before_it_is_loaded(tmp_path):
    """`publish` moves a finished transformation into place with its sha256 beside it; `verify` (every
    rank, before loading) passes it and refuses it flipped, truncated, or without its record."""
    import numpy as np

    from mspretrain.train import checkpoint as ckpt
    from mspretrain.train.checkpoint.reshard import DIGEST_SUFFIX, publish, verify

    rng = np.random.default_rng(0)
    tensors = [ckpt.HostTensor("w", [64, 8], "Float32", rng.standard_normal(512).astype(np.float32))]
    dest = tmp_path / "resharded" / "step_00000010" / "rank_1" / ckpt.MODEL_FILE
    dest.parent.mkdir(parents=True)
    tmp = dest.with_name(".tmp-" + ckpt.MODEL_FILE)
    written = ckpt.write_model_file(tmp, tensors)
    assert publish(tmp, dest) == written and not tmp.exists()
    verify(dest)
    assert ckpt.load_file(dest)["w"].asnumpy().reshape(-1).tobytes() == tensors[0].data.tobytes()
    good = dest.read_bytes()
    flipped = bytearray(good)
    flipped[-3] ^= 1
    dest.write_bytes(bytes(flipped))
    with pytest.raises(ckpt.CheckpointError, match="sha256 differs"):
        verify(dest)
    dest.write_bytes(good[:-10])
    with pytest.raises(ckpt.CheckpointError, match="truncated"):
        verify(dest)
    dest.write_bytes(good)
    verify(dest)
    dest.with_name(dest.name + DIGEST_SUFFIX).unlink()
    with pytest.raises(ckpt.CheckpointError, match="did not finish"):
        verify(dest)


def test_resharded_files_are_removed_by_the_first_checkpoint_of_the_new_layout(tmp_path):
    """RUN/resharded bridges a resume onto a new layout until the run's own first checkpoint exists."""
    import numpy as np
    from mindspore import Parameter, Tensor

    from mspretrain.train import checkpoint as ckpt

    bridge = tmp_path / "resharded" / "step_00000010" / "rank_0"
    bridge.mkdir(parents=True)
    (bridge / ckpt.MODEL_FILE).write_bytes(b"x")
    params = {"w": Parameter(Tensor(np.ones((3, 2), np.float32)), name="w")}
    state = {"step": 12, "loader": {"cursor": 48}}
    ckpt.write_checkpoint(tmp_path, 12, params, state, keep_max=2)
    assert not (tmp_path / "resharded").exists()
    ckpt.check_checkpoint(tmp_path / "checkpoints" / "step_00000012")
    ckpt.write_checkpoint(tmp_path, 14, params, {"step": 14, "loader": {"cursor": 56}}, keep_max=2)   # none left


def test_a_pipeline_merge_reads_only_the_current_worlds_strategy_files(tmp_path):
    """RUN/strategy/ after a resume on fewer ranks: rank_0..3 of this 4-rank pp=2 layout beside a
    stale rank_7.ckpt of the earlier 8-rank pp=4 one (its stage 3). MindSpore's merge takes one file of
    each stage it finds; the merged strategy must hold this layout's parameters only; the directory
    itself is left as it is."""
    from mindspore.train import node_strategy_pb2 as pb

    from mspretrain.train.checkpoint.reshard import strategy_file
    from sharded_helpers import write_strategy

    strategies = tmp_path / "strategy"
    for r in range(4):
        write_strategy(strategies / f"rank_{r}.ckpt", r // 2, {f"w{r // 2}": ([2], [0, -1])})
    write_strategy(strategies / "rank_7.ckpt", 3, {"stale": ([2], [0, -1])})

    def merged_names(path):
        m = pb.ParallelStrategyMap()
        m.ParseFromString(path.read_bytes())
        return sorted(item.param_name.split("-", 1)[-1] for item in m.parallel_layout_item)   # "STAGE-name"
    assert merged_names(strategy_file(strategies, True, tmp_path / "now" / "merged.ckpt", 4)) == ["w0", "w1"]
    assert "stale" in merged_names(strategy_file(strategies, True, tmp_path / "all" / "merged.ckpt"))
    assert (strategies / "rank_7.ckpt").is_file()
