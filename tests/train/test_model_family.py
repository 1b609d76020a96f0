"""A second model family through the model spec, with the worked example of docs/extending.md (Llama
with a GeGLU feed-forward, taken from the page itself): the registry finds it by model.family, its
plan names the model's own primitives, and `train launch` trains it and a run reloads it as that
family; a family the registry does not know is a config error naming the key."""
from __future__ import annotations

import json
import re
import sys
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from trainer_harness import REPO, TINY, launch_cmd, records, run
from mspretrain.train.config import ConfigError, load_config
from mspretrain.train.models import spec

FAMILY = "llama_geglu"


def _example() -> str:
    """The first python block of the section "A new model family" of docs/extending.md."""
    page = (REPO / "docs" / "extending.md").read_text()
    section = page[page.index("## A new model family"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@contextmanager
def _registered(tmp_path: Path):
    """The example imported as a module (so registered), and forgotten afterwards."""
    saved = dict(spec._REGISTRY)
    (tmp_path / "geglu_family.py").write_text(_example())
    sys.path.insert(0, str(tmp_path))
    try:
        import geglu_family
        yield geglu_family
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("geglu_family", None)
        spec._REGISTRY.clear()
        spec._REGISTRY.update(saved)


def _cfg(*sets: str):
    return load_config(TINY, [f"model.family={FAMILY}", *sets])


def test_an_unknown_family_is_a_config_error_and_llama_is_built_in():
    with pytest.raises(ConfigError, match="model.family: 'nope' is not a registered model family"):
        spec.of(load_config(TINY, ["model.family=nope"]))
    assert spec.get("llama").name == "llama" and spec.known("llama") and not spec.known("nope")
    # Llama, the family of every run before the key, is left out of the config record (same bytes)
    assert "family" not in load_config(TINY, []).to_dict()["model"]


def test_the_plan_names_the_families_primitives(tmp_path, graph_mode):
    from mspretrain.train.memory import estimate
    from mspretrain.train.models.llama.model import MLP, CausalLMLoss
    from mspretrain.train.parallel import annotate, make_plan

    with _registered(tmp_path) as family:
        cfg = _cfg("model.vocab_size=128")
        assert spec.of(cfg) is family.SPEC
        plan = make_plan(cfg, vocab_size=128, seq_length=32)
        kinds = {(o.module, o.prim): o.kind for o in plan.ops}
        assert kinds[("layers.0.mlp", "gelu")] == "GeLU" and ("layers.0.mlp", "silu") not in kinds
        args = family.SPEC.model_args(cfg.model, 128, 32, "CPU", "fp32", 2)
        model = family.SPEC.build_model(args, cfg.seed)
        assert isinstance(model.layers[1].mlp, family.GeGLU)
        # the weights Llama's SwiGLU has, by the same names (checkpoints, the plan): Llama's memory terms
        llama = spec.get("llama").build_model(args, cfg.seed)
        assert isinstance(llama.layers[1].mlp, MLP)
        assert [p.name for p in model.get_parameters()] == [p.name for p in llama.get_parameters()]
        assert estimate(cfg, 32, 128).params_total == sum(int(np.prod(p.shape)) for p in model.get_parameters())
        # every planned primitive exists in the built model (and the shared loss) with its kind:
        # annotate is strict
        assert len(annotate(plan, model, CausalLMLoss(model, 128))) == len(plan.ops)


def test_train_launch_trains_the_family_and_a_run_reloads_it(tmp_path, tiny_data):
    """One step of each family from the same data and seed: the GeGLU model is what trained (its loss
    is not Llama's), its run records the family, and the run's model is rebuilt as a GeGLU."""
    steps = ["train.steps=1", "eval.every_steps=0", "checkpoint.every_steps=1"]
    llama_run, geglu_run = tmp_path / "llama", tmp_path / "geglu"
    r = run(launch_cmd(llama_run, tiny_data, *steps))
    assert r.returncode == 0, r.stderr[-2000:]
    (tmp_path / "geglu_family.py").write_text(_example())
    argv = launch_cmd(geglu_run, tiny_data, *steps, f"model.family={FAMILY}")[3:]    # after "-m train"
    script = ("import sys; sys.path.insert(0, sys.argv[1]); import geglu_family; "
              "from mspretrain.train.cli import main; sys.exit(main(sys.argv[2:]))")
    r = run([sys.executable, "-c", script, str(tmp_path), *argv])
    assert r.returncode == 0, r.stderr[-2000:]
    loss = {name: [x["loss"] for x in records(d) if not x.get("eval")] for name, d in
            (("llama", llama_run), ("geglu", geglu_run))}
    assert len(loss["geglu"]) == 1 and np.isfinite(loss["geglu"][0])
    assert loss["geglu"] != loss["llama"]
    assert json.loads((geglu_run / "run.json").read_text())["config"]["model"]["family"] == FAMILY
    assert "family" not in json.loads((llama_run / "run.json").read_text())["config"]["model"]
    from mspretrain.train.runinfo import load_run_model
    with _registered(tmp_path) as family:
        model, cfg, _ = load_run_model(geglu_run)
        assert cfg.model.family == FAMILY and isinstance(model.layers[0].mlp, family.GeGLU)
