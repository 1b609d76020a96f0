import pytest

from mspretrain.train.config import load_config
from mspretrain.train.models.llama.model import model_args
from mspretrain.train.parallel.recompute import recompute_plan
from mspretrain.train.step.precision import check_precision
from trainer_harness import REPO


@pytest.mark.parametrize("name,params_b", [("tiny", None), ("llama-1b", 1.1), ("llama-7b", 6.7),
                                           ("llama-13b", 13.0)])
def test_shipped_configs_validate(name, params_b):
    from mspretrain.train.parallel import plan as parallel_plan

    cfg = load_config(REPO / "configs" / f"{name}.yaml")
    check_precision(cfg)
    recompute_plan(cfg.recompute, cfg.model.num_layers)
    p = cfg.parallel
    parallel_plan.validate(cfg, p.data_parallel * p.model_parallel * p.pipeline_stage, vocab_size=32000)
    args = model_args(cfg.model, vocab_size=32000, seq_length=4096, device=cfg.device)
    assert args.hidden_size % args.num_heads == 0 and args.num_heads % args.kv_heads == 0
    if params_b:       # the shapes are the advertised size (embeddings and LM head included)
        d, L, f, hd = args.hidden_size, args.num_layers, args.ffn, args.head_dim
        n = 2 * 32000 * d + L * (2 * d * d + 2 * d * args.kv_heads * hd + 3 * d * f)
        assert n / 1e9 == pytest.approx(params_b, rel=0.05)
        assert cfg.device == "Ascend" and cfg.precision.dtype == "bf16"


@pytest.mark.parametrize("name", ["llama-7b", "llama-13b"])
def test_the_big_configs_are_what_train_estimate_advises(name):
    """On 64 GB devices less the default margin, at 4096 tokens and a 32k vocabulary, the shipped layout
    is the fastest `train estimate` finds at the config's world size, within a node's mp bound."""
    from mspretrain.train.layouts import fastest
    from mspretrain.train.memory import MARGIN, diff_sets, parse_margin
    from mspretrain.train.parallel.topology import MP_ADVISED_MAX

    cfg = load_config(REPO / "configs" / f"{name}.yaml", ["model.vocab_size=32000"])
    usable = 64e9 - parse_margin(MARGIN, 64e9)
    best = fastest(cfg, 4096, 32000, usable)
    assert best is not None and diff_sets(cfg, best.cfg) == []
    assert cfg.parallel.model_parallel <= MP_ADVISED_MAX
