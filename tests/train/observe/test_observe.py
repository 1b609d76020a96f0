"""Per-step observability of `train launch`: peak_memory_mb (moves with the batch), update_ratio (equal
to what the checkpoints show), the profiler window (exactly steps N..M), z_loss in the eval record."""
import json
import re

import numpy as np
import pytest

from trainer_harness import launch_cmd, records, run

pytestmark = pytest.mark.slow

# wide enough that one batch's activations are far above the RSS noise of a MindSpore process
WIDE = ("model.hidden_size=256", "model.num_heads=4", "train.steps=4", "eval.every_steps=0",
        "checkpoint.every_steps=1", "checkpoint.keep_max=10", "log.every_steps=1",
        "log.detail_every_steps=2")
# MindSpore's fused AdamWeightDecay kernel (optim.name=adamw_nobc) is one operator a step: the
# profiled run counts its occurrences
PROFILED = ("profile.start_step=2", "profile.stop_step=3", "optim.name=adamw_nobc")


def _launch(run_dir, data, *sets):
    out = run(launch_cmd(run_dir, data, *sets))
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.fixture(scope="module")
def runs(tiny_data, tmp_path_factory):
    root = tmp_path_factory.mktemp("observe")
    small = _launch(root / "b32", tiny_data, *WIDE, *PROFILED, "train.global_batch_size=32")
    large = _launch(root / "b64", tiny_data, *WIDE, "train.global_batch_size=64")
    return root, small, large


def _steps(run_dir):
    return [r for r in records(run_dir) if not r.get("eval")]


def _planned_activation_mb(tiny_data, batch):
    from mspretrain.loader.manifest import load_manifest
    from mspretrain.train.config import load_config
    from mspretrain.train.memory import estimate
    from trainer_harness import TINY

    cfg = load_config(TINY, [*WIDE, f"train.global_batch_size={batch}", f"data.path={tiny_data}"])
    m = load_manifest(tiny_data)
    return estimate(cfg, m.seq_length, m.tokenizer.vocab_size).activations / 2 ** 20


def test_peak_memory_is_the_process_own_not_its_launcher(tmp_path):
    """Linux carries ru_maxrss over from the parent (fork/vfork + exec): a train process started by a
    test runner or launcher with a larger peak read that peak at every step. The reading must be the
    child's own: a child that imports only numpy stays far below its parent's 600 MiB."""
    import subprocess
    import sys

    ballast = np.ones(600 * 2 ** 20 // 8)       # 600 MiB, touched: the parent's peak RSS holds it
    code = "from mspretrain.train.observe.monitor import peak_memory_mb; print(peak_memory_mb('CPU'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    child = float(out.stdout)
    assert ballast[-1] == 1.0
    assert 0 < child < 300, child


def test_peak_memory_moves_when_the_batch_doubles(runs, tiny_data):
    root, small_out, _ = runs
    small = [r["peak_memory_mb"] for r in _steps(root / "b32")]
    large = [r["peak_memory_mb"] for r in _steps(root / "b64")]
    assert len(small) == len(large) == 4
    assert small == sorted(small)               # a peak since the process started never falls
    # The planner's activation bytes for the extra 32 samples, which the CPU graph holds at once: the
    # measured peak must grow by at least half of that (allocator reuse and page rounding aside).
    extra = _planned_activation_mb(tiny_data, 64) - _planned_activation_mb(tiny_data, 32)
    assert extra > 20
    assert large[-1] - small[-1] > 0.5 * extra, (small, large, extra)
    assert re.search(r"mem [\d,]+MB", small_out)
    assert re.search(r"measured peak after step 1: [\d,]+ MiB process peak RSS; `train estimate` "
                     r"planned [\d,]+ MiB", small_out)


def test_update_ratio_matches_the_checkpoints(runs):
    import mindspore as ms
    run_dir = runs[0] / "b32"
    recs = {r["step"]: r for r in _steps(run_dir)}
    assert [s for s, r in recs.items() if "update_ratio" in r] == [2, 4]

    def weights(step):
        d = ms.load_checkpoint(str(run_dir / "checkpoints" / f"step_{step:08d}" / "model.ckpt"))
        return {k: v.asnumpy().astype(np.float64) for k, v in d.items()
                if not k.startswith(("adam_", "global_step", "learning_rate", "loss_scale", "beta"))}
    for step in (2, 4):
        before, after = weights(step - 1), weights(step)
        names = [k for k in before if before[k].dtype == np.float64 and before[k].ndim >= 1]
        upd = sum(float(np.square(after[k] - before[k]).sum()) for k in names)
        ref = sum(float(np.square(before[k]).sum()) for k in names)
        assert recs[step]["update_ratio"] == pytest.approx(np.sqrt(upd / ref), rel=1e-9)
        groups = recs[step]["update_ratio_groups"]
        assert set(groups) == {"embed", "layer_0", "layer_1", "norm", "head"}
        assert all(v > 0 for v in groups.values())


def test_profiler_window_holds_exactly_its_steps(runs):
    import csv
    prof = runs[0] / "b32" / "profile"
    summary = (prof / "summary.md").read_text()
    assert summary.startswith("# Profile of steps 2..3 (CPU)")
    assert "| AdamWeightDecay |" in summary
    rows = [r for p in prof.rglob("cpu_op_detail_info*.csv") for r in csv.DictReader(open(p))]
    adam = [r for r in rows if r["op_type"] == "AdamWeightDecay"]
    assert adam and all(int(r["op_occurrences"]) == 2 for r in adam)     # steps 2 and 3, no more
    assert not (runs[0] / "b64" / "profile").exists()                     # no window: nothing


def test_z_loss_is_logged_per_step_and_in_eval(tiny_data, tmp_path):
    run_dir = tmp_path / "run"
    out = _launch(run_dir, tiny_data, "train.steps=4", "train.z_loss=1e-3", "eval.every_steps=4",
                  "log.every_steps=2")
    steps = _steps(run_dir)
    evals = [r for r in records(run_dir) if r.get("eval")]
    assert all(0 < r["z_loss"] < r["loss"] for r in steps)
    assert evals and 0 < evals[0]["val_z_loss"] < evals[0]["val_loss"]
    assert "val_z_loss" in out and re.search(r"loss [\d.]+  z [\d.e+-]+", out)
    assert json.loads((run_dir / "checkpoints" / "step_00000004" / "state.json").read_text())["spike"]
