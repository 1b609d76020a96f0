"""optim.name (bias-corrected AdamW against a numpy reference) and optim.schedule (pure functions of the
step; a WSD decay started from a stable checkpoint equals a straight run, bitwise)."""
import numpy as np
import pytest

from mspretrain.train.config import ConfigError, load_config
from mspretrain.train.step.optim import check_schedule, lr_at

from trainer_harness import BATCHES, exact_view, launch_cmd, make_step, run, snapshot

U32 = 2.0 ** -24        # fp32 unit roundoff


def _reference(p, grads, lr, wd, b1, b2, eps, bias_correction=True):
    """numpy float64 AdamW: torch.optim.AdamW's update (bias_correction) or MindSpore's
    AdamWeightDecay (without); returns the parameter, m, v, each step's update size and the bounds of
    fp32's error in m and v (each step: 3 roundings of terms of size b*|m| + (1 - b)*|g|, plus the
    earlier steps' error; m itself may cancel to near zero, so the bound is absolute)."""
    p, m, v = p.astype(np.float64), np.zeros(p.shape), np.zeros(p.shape)
    sizes, m_err, v_err = [], np.zeros(p.shape), np.zeros(p.shape)
    for t, g in enumerate(grads, start=1):
        g = g.astype(np.float64)
        m_err = b1 * m_err + 4 * U32 * (b1 * np.abs(m) + (1 - b1) * np.abs(g))
        v_err = b2 * v_err + 4 * U32 * (b2 * v + (1 - b2) * g * g)
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        if bias_correction:
            update = (lr / (1 - b1 ** t)) * m / (np.sqrt(v) / np.sqrt(1 - b2 ** t) + eps)
            p = p * (1 - lr * wd) - update
        else:
            update = lr * m / (np.sqrt(v) + eps)
            p = p - update - lr * wd * p
        sizes.append(np.abs(update))
    return p, m, v, sizes, m_err, v_err


def _optimizer_run(name: str, grads_w, grads_n, lr, wd):
    """Three real optimizer calls in a GRAPH_MODE cell (as the train step makes them) on a matrix
    (decayed) and a norm vector (not decayed)."""
    import mindspore as ms
    from mindspore import Parameter, Tensor, nn
    from mspretrain.train.step.optim import build_optimizer

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    cfg = load_config(None, [f"optim.name={name}", f"optim.lr={lr}", f"optim.weight_decay={wd}"])

    class Weights(nn.Cell):
        def __init__(self):
            super().__init__()
            self.proj = Parameter(Tensor(W0), name="proj.weight")
            self.norm = Parameter(Tensor(N0), name="norm.weight")

    class Apply(nn.Cell):
        def __init__(self, optimizer):
            super().__init__(auto_prefix=False)
            self.optimizer = optimizer

        def construct(self, gw, gn):
            return self.optimizer((gw, gn))

    net = Weights()
    opt = build_optimizer(net.trainable_params(), cfg.optim)
    step = Apply(opt)
    for gw, gn in zip(grads_w, grads_n):
        step(Tensor(gw), Tensor(gn))
    state = {p.name: p.asnumpy() for p in step.get_parameters()}
    return net.proj.asnumpy(), net.norm.asnumpy(), state, cfg.optim


RNG = np.random.default_rng(7)
W0 = RNG.standard_normal((16, 24)).astype(np.float32)
N0 = (1.0 + 0.1 * RNG.standard_normal(24)).astype(np.float32)
# gradients of mixed scales, as real ones are (a few near zero, where eps matters)
GW = [(RNG.standard_normal((16, 24)) * 10.0 ** RNG.uniform(-6, 0, (16, 24))).astype(np.float32)
      for _ in range(3)]
GN = [(RNG.standard_normal(24) * 1e-2).astype(np.float32) for _ in range(3)]


def _tolerance(p_ref, sizes):
    """Bound on |fp32 - exact| after three steps: each step rounds the parameter a few times
    (decay, subtract: <= 4 ulp of |p|) and the update through ~10 fp32 operations, the bias
    corrections (1 - b^t cancels: ~20 ulp) and the moments' own accumulated rounding (<= 64 ulp
    of the update, generous)."""
    return sum(U32 * (4 * np.abs(p_ref) + 64 * s) for s in sizes)


@pytest.mark.parametrize("name", ["adamw", "adamw_nobc"])
def test_adamw_matches_numpy_reference_for_three_steps(name):
    lr, wd = 1e-2, 0.1
    w, n, state, o = _optimizer_run(name, GW, GN, lr, wd)
    bc = name == "adamw"
    for got, p0, grads, decay, key in ((w, W0, GW, wd, "proj.weight"), (n, N0, GN, 0.0, "norm.weight")):
        # the hyperparameters as the graph holds them (fp32), the arithmetic exact (float64)
        b1, b2, eps, lr32 = (float(np.float32(x)) for x in (o.beta1, o.beta2, o.eps, lr))
        p_ref, m_ref, v_ref, sizes, m_err, v_err = _reference(p0, grads, lr32, decay, b1, b2, eps, bc)
        assert np.all(np.abs(got - p_ref) <= _tolerance(p_ref, sizes)), key
        assert np.all(np.abs(state[f"adam_m.{key}"] - m_ref) <= m_err), key
        assert np.all(np.abs(state[f"adam_v.{key}"] - v_ref) <= v_err), key
    assert int(state["global_step"].item()) == 3


def test_bias_correction_matters_early():
    """The reference itself tells the two apart: at step 1 AdamW moves a weight by about lr (the
    bias-corrected m / sqrt(v) is +-1), AdamWeightDecay by (1 - b1) / sqrt(1 - b2) * lr = 0.45 lr."""
    lr = 1e-2
    bc = _reference(W0, GW[:1], lr, 0.0, 0.9, 0.95, 1e-8, True)[3]
    nobc = _reference(W0, GW[:1], lr, 0.0, 0.9, 0.95, 1e-8, False)[3]
    big = np.abs(GW[0]) > 1e-4
    np.testing.assert_allclose(bc[0][big], lr, rtol=1e-3)
    np.testing.assert_allclose(nobc[0][big], lr * 0.1 / np.sqrt(0.05), rtol=1e-3)


@pytest.mark.slow
def test_train_step_keeps_moments_and_step_count(graph_mode):
    """Inside the one-graph train step: moments and the update count are step parameters (so every
    checkpoint holds them); the default is the bias-corrected one."""
    _, step = make_step()
    assert type(step.step_cell.optimizer).__name__ == "AdamW"
    for batch in BATCHES[:3]:
        step(batch, 1e-3)
    state = snapshot(step)
    assert int(state["global_step"].item()) == 3
    for key in (p.name for p in step.step_cell.weights):
        assert f"adam_m.{key}" in state and f"adam_v.{key}" in state
        assert np.any(state[f"adam_m.{key}"] != 0)
    assert load_config(None, []).optim.name == "adamw"


def test_unknown_optimizer_is_a_config_error(graph_mode):
    with pytest.raises(ConfigError, match="optim.name must be one of adamw, adamw_nobc"):
        make_step("optim.name=adam")


# One optimizer call in a GRAPH_MODE cell over a single 16M-element (64 MiB) matrix, in a process of its
# own; prints how far the peak RSS rose over the RSS before the call (compile + run), MiB.
_PEAK_OF_ONE_UPDATE = """
import sys
import numpy as np, mindspore as ms
from mindspore import Parameter, Tensor, nn
from mspretrain.train.config import load_config
from mspretrain.train.step.optim import build_optimizer

def status(key):
    return next(float(x.split()[1]) / 1024 for x in open("/proc/self/status") if x.startswith(key))

ms.set_context(mode=ms.GRAPH_MODE)
ms.set_device("CPU")
w = Parameter(Tensor(np.ones((4096, 4096), np.float32)), name="proj.weight")
opt = build_optimizer([w], load_config(None, ["optim.name=" + sys.argv[1]]).optim)

class Apply(nn.Cell):
    def __init__(self):
        super().__init__(auto_prefix=False)
        self.optimizer = opt

    def construct(self, g):
        return self.optimizer((g,))

g = Tensor(np.full((4096, 4096), 1e-3, np.float32))
before = status("VmRSS:")
Apply()(g)
print(status("VmHWM:") - before)
"""


@pytest.mark.slow
def test_adamw_update_holds_no_parameter_sized_temporaries(tmp_path):
    """The bias-corrected update runs MindSpore's in-place AdamWeightDecay kernel like adamw_nobc: no
    parameter-sized temporaries. Written element-wise, each of its ~10 operations held one (64 MiB
    here) through the graph: +900 MiB over adamw_nobc. Half a parameter is far above the noise of
    the scalar work and far below one temporary."""
    import sys

    script = tmp_path / "peak_of_one_update.py"          # MindSpore compiles from source files only
    script.write_text(_PEAK_OF_ONE_UPDATE)
    peaks = {}
    for name in ("adamw_nobc", "adamw"):
        out = run([sys.executable, str(script), name])
        assert out.returncode == 0, out.stderr[-2000:]
        peaks[name] = float(out.stdout.split()[-1])
    assert peaks["adamw"] - peaks["adamw_nobc"] < 32, peaks


# ---------------------------------------------------------------- schedules

def _optim(*sets):
    return load_config(None, ["optim.lr=1.0", "optim.min_lr=0.1", "optim.warmup_steps=4", *sets]).optim


def test_wsd_is_warmup_stable_then_decay():
    o = _optim("optim.schedule=wsd")                         # decay_fraction 0.2 of 20 steps: 17..20
    lrs = [lr_at(s, o, 20) for s in range(1, 21)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]
    assert lrs[4:16] == [1.0] * 12
    assert lrs[16:] == pytest.approx([0.775, 0.55, 0.325, 0.1])
    shapes = {d: [lr_at(s, _optim("optim.schedule=wsd", f"optim.decay={d}"), 20) for s in range(17, 21)]
              for d in ("linear", "cosine", "sqrt")}
    assert shapes["cosine"] == pytest.approx([0.1 + 0.45 * (1 + np.cos(np.pi * k / 4)) for k in (1, 2, 3, 4)])
    assert shapes["sqrt"] == pytest.approx([1 - 0.9 * np.sqrt(k / 4) for k in (1, 2, 3, 4)])
    assert shapes["sqrt"][0] < shapes["linear"][0] < shapes["cosine"][0]


def test_decay_start_step_overrides_the_fraction():
    o = _optim("optim.schedule=wsd", "optim.decay_start_step=10")
    assert [lr_at(s, o, 20) for s in (10, 11, 20, 30)] == pytest.approx([1.0, 0.91, 0.1, 0.1])


def test_linear_and_constant_schedules():
    lin, const = _optim("optim.schedule=linear"), _optim("optim.schedule=constant")
    assert [lr_at(s, lin, 20) for s in (4, 12, 20)] == pytest.approx([1.0, 0.55, 0.1])
    assert [lr_at(s, const, 20) for s in (2, 4, 20, 40)] == [0.5, 1.0, 1.0, 1.0]


@pytest.mark.parametrize("sets, message", [
    (("optim.schedule=step",), "optim.schedule must be one of cosine, wsd, linear, constant"),
    (("optim.schedule=wsd", "optim.decay=exp"), "optim.decay must be one of linear, cosine, sqrt"),
    (("optim.decay_fraction=1.5",), r"optim.decay_fraction must be in \[0, 1\]"),
    (("optim.decay_start_step=8",), "needs optim.schedule=wsd"),
    (("optim.schedule=wsd", "optim.decay_start_step=20"), r"in \[optim.warmup_steps, train.steps\)"),
])
def test_bad_schedule_keys_are_named(sets, message):
    with pytest.raises(ConfigError, match=message):
        check_schedule(_optim(*sets), 20)


@pytest.mark.slow
def test_wsd_decay_resumed_from_a_stable_checkpoint_equals_a_straight_run(tmp_path, tiny_data):
    """Continued training: a run trained at the stable lr to step 12 (decay_fraction 0), then resumed
    with `--set optim.decay_start_step=12 --set train.steps=20`, gives every step's loss bit for bit as
    a run that had the decay start at 12 from the beginning."""
    common = ("optim.schedule=wsd", "optim.decay_fraction=0", "optim.decay=sqrt", "checkpoint.every_steps=6",
              "eval.every_steps=0")
    straight, stable = tmp_path / "straight", tmp_path / "stable"
    r = run(launch_cmd(straight, tiny_data, *common, "optim.decay_start_step=12", "train.steps=20"))
    assert r.returncode == 0, r.stderr
    r = run(launch_cmd(stable, tiny_data, *common, "train.steps=12"))
    assert r.returncode == 0, r.stderr
    ckpt = stable / "checkpoints" / "step_00000012"
    r = run(launch_cmd(stable, tiny_data, *common, "optim.decay_start_step=12", "train.steps=20",
                       resume=str(ckpt)))
    assert r.returncode == 0, r.stderr
    assert "optim.decay_start_step 0 -> 12" in r.stdout
    ref, got = exact_view(straight), exact_view(stable)
    assert len(ref) == 20 and got == ref
    lrs = [dict(x)["lr"] for x in ref]
    assert len(set(lrs[5:12])) == 1 and float.fromhex(lrs[-1]) == pytest.approx(3e-4)   # stable, then decayed


def test_train_plot_draws_the_configured_schedule(tmp_path, capsys):
    """`train plot --config F --set ... --out F.png` draws the lr schedule without any run; the picture
    changes with the schedule; a bad schedule key is a config error (exit 2)."""
    from mspretrain.train.cli import main
    from trainer_harness import TINY

    pngs = {}
    for schedule in ("cosine", "wsd"):
        out = tmp_path / f"{schedule}.png"
        assert main(["plot", "--config", str(TINY), "--set", f"optim.schedule={schedule}", "--out", str(out)]) == 0
        pngs[schedule] = out.read_bytes()
    assert pngs["cosine"][:8] == b"\x89PNG\r\n\x1a\n" and pngs["cosine"] != pngs["wsd"]
    assert main(["plot", "--config", str(TINY), "--set", "optim.decay=exp", "optim.schedule=wsd",
                 "--out", str(tmp_path / "x.png")]) == 2
    assert "optim.decay must be one of" in capsys.readouterr().err
    assert main(["plot", "--out", str(tmp_path / "y.png")]) == 2
