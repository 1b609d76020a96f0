"""Resume on another parallel layout: the plan (which transformation a (dp, mp, pp, optimizer shard)
change needs) is a pure function, checked here on CPU; the transformation itself runs on Ascend."""
import pytest

from mspretrain.train.config import load_config
from mspretrain.train.reshard import Layout, layout_of, plan, record, saved_layout
from mspretrain.train.resume_policy import check_resume, config_record

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
