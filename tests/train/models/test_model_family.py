"""A second model family through the model spec, with the worked example of docs/extending.md (Llama
with a GeGLU feed-forward, taken from the page itself): the registry finds it by model.family, from
the module or from an installed entry point (group mspretrain.models), its plan names the model's own
primitives, and `train launch` trains it and a run reloads it as that family; a family the registry
does not know, and a plugin that is not a ModelSpec, are config errors naming them."""
from __future__ import annotations

import json
import os
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


def _distribution(root: Path, entry_points: str, modules: dict[str, str]) -> Path:
    """An installed distribution as importlib.metadata finds it on sys.path / PYTHONPATH: its modules
    and a *.dist-info with METADATA and entry_points.txt (what `pip install` of a pyproject with
    [project.entry-points."mspretrain.models"] writes)."""
    root.mkdir(parents=True)
    for name, text in modules.items():
        (root / f"{name}.py").write_text(text)
    info = root / "plugin_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugin-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{spec.PLUGIN_GROUP}]\n{entry_points}")
    return root


@contextmanager
def _on_path(root: Path, *modules: str):
    """`root` on sys.path (so its entry points are installed), and forgotten afterwards."""
    saved = dict(spec._REGISTRY)
    sys.path.insert(0, str(root))
    try:
        yield
    finally:
        sys.path.remove(str(root))
        for m in modules:
            sys.modules.pop(m, None)
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
    from mspretrain.train.step.loss import CausalLMLoss
    from mspretrain.train.memory import estimate
    from mspretrain.train.models.llama.model import MLP
    from mspretrain.train.parallel.plan import make_plan
    from mspretrain.train.parallel.apply import annotate

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


def test_entry_points_are_loaded_when_asked_for_and_checked(tmp_path):
    """A family of an installed package is found by its entry point, and only that one is imported;
    a plugin whose object is not a ModelSpec, one that does not import, and one whose spec has another
    name are config errors naming the entry point; an unknown family's error lists the installed."""
    fake = "SPEC = 'not a spec'\n"
    root = _distribution(tmp_path / "site", "\n".join([
        "notaspec = fake_family:SPEC", "broken = no_such_module_here:SPEC",
        "renamed = renamed_family:SPEC", ""]),
        {"fake_family": fake, "renamed_family": "from mspretrain.train.models.llama import SPEC\n"})
    with _on_path(root, "fake_family", "renamed_family"):
        assert spec.plugin_families() == ["broken", "notaspec", "renamed"]
        assert "fake_family" not in sys.modules                 # listed, not imported
        with pytest.raises(ConfigError, match=r"'notaspec': entry point notaspec = fake_family:SPEC "
                                              r"\(group mspretrain.models\) is a str, not a .*ModelSpec"):
            spec.get("notaspec")
        with pytest.raises(ConfigError, match=r"'broken': entry point .* failed to load: ModuleNotFoundError"):
            spec.get("broken")
        with pytest.raises(ConfigError, match="is the ModelSpec of 'llama'"):
            spec.get("renamed")
        with pytest.raises(ConfigError, match=r"known: broken, llama, notaspec, renamed; .*mspretrain.models"):
            spec.get("nope")
        assert not spec.known("notaspec") and spec.known("llama")


def test_a_plain_dense_is_refused_naming_the_layer(graph_mode):
    """A family's weight matmul built as mindspore's nn.Dense has no O2 casts: precision O2 and the
    parallel plan both refuse it, naming the layer and the Dense to use."""
    from mindspore import nn

    from mspretrain.train.parallel.plan import make_plan

    from mspretrain.train.parallel.apply import annotate
    from mspretrain.train.step.precision import apply_precision

    cfg = load_config(TINY, ["model.vocab_size=128"])
    family = spec.get("llama")
    model = family.build_model(family.model_args(cfg.model, 128, 32, "CPU", "fp32", None), cfg.seed)
    model.layers[1].mlp.w3 = nn.Dense(cfg.model.hidden_size, model.args.ffn, has_bias=False)
    message = r"layer layers.1.mlp.w3 is a plain mindspore.nn.Dense: .* mspretrain.train.models.layers.Dense"
    with pytest.raises(TypeError, match=message):
        apply_precision(model, load_config(TINY, ["precision.dtype=fp16", "precision.amp_level=O2"]).precision)
    plan = make_plan(load_config(TINY, ["model.vocab_size=128", "device=Ascend", "parallel.model_parallel=2"]),
                     world_size=2, vocab_size=128, seq_length=32)
    with pytest.raises(RuntimeError, match="parallel plan: " + message):
        annotate(plan, model)


def test_train_launch_finds_an_installed_family_and_a_run_reloads_it(tmp_path, tiny_data):
    """Two steps of each family from the same data and seed, the GeGLU one found by `train launch`
    through the entry point of a distribution on PYTHONPATH (no import of ours names it): the GeGLU
    model is what trained (its loss is not Llama's), its run records the family, and the run's model
    is rebuilt as a GeGLU, again through the entry point."""
    steps = ["train.steps=2", "eval.every_steps=0", "checkpoint.every_steps=2"]
    llama_run, geglu_run = tmp_path / "llama", tmp_path / "geglu"
    r = run(launch_cmd(llama_run, tiny_data, *steps))
    assert r.returncode == 0, r.stderr[-2000:]
    site = _distribution(tmp_path / "site", f"{FAMILY} = geglu_family:SPEC\n", {"geglu_family": _example()})
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    r = run(launch_cmd(geglu_run, tiny_data, *steps, f"model.family={FAMILY}"), env={"PYTHONPATH": path})
    assert r.returncode == 0, r.stderr[-2000:]
    loss = {name: [x["loss"] for x in records(d) if not x.get("eval")] for name, d in
            (("llama", llama_run), ("geglu", geglu_run))}
    assert len(loss["geglu"]) == 2 and np.isfinite(loss["geglu"]).all()
    assert loss["geglu"] != loss["llama"]
    assert json.loads((geglu_run / "run.json").read_text())["config"]["model"]["family"] == FAMILY
    assert "family" not in json.loads((llama_run / "run.json").read_text())["config"]["model"]
    from mspretrain.train.runinfo import load_run_model
    with _on_path(site, "geglu_family"):
        model, cfg, _ = load_run_model(geglu_run)
        assert cfg.model.family == FAMILY and type(model.layers[0].mlp).__name__ == "GeGLU"
        assert spec.get(FAMILY) is sys.modules["geglu_family"].SPEC
