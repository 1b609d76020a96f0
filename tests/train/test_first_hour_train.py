"""What a new user meets first in training: a second launch on a busy run dir, extending a run,
metrics without a checkpoint, a dataset that does not fit the checkpoint."""
from __future__ import annotations

import shutil

import pytest

from lock_helpers import hold, kill
from synthetic import make_dataset
from mspretrain.train.config import load_config
from mspretrain.train.step.optim import lr_at
from trainer_harness import TINY, launch_cmd, records, run


def test_two_train_launches_on_one_run_dir(tmp_path, tiny_data):
    run_dir = tmp_path / "run"
    holder = hold("run_dir_lock", run_dir)
    try:
        r = run(launch_cmd(run_dir, tiny_data, "train.steps=2"))
        assert r.returncode == 1, r.stderr
        assert f"run dir {run_dir} is in use by another process (pid {holder.pid}" in r.stderr
        assert not (run_dir / "metrics.jsonl").exists()
    finally:
        kill(holder)


def test_metrics_without_a_checkpoint_are_not_cut_by_a_fresh_start(tmp_path, tiny_data):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    metrics = run_dir / "metrics.jsonl"
    metrics.write_text('{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.5}\n')
    r = run(launch_cmd(run_dir, tiny_data, "train.steps=2"))
    assert r.returncode == 1, r.stderr
    assert "already has metrics.jsonl from an earlier run" in r.stderr
    assert metrics.read_text() == '{"step": 1, "loss": 5.0}\n{"step": 2, "loss": 4.5}\n'


FOUR = ("train.steps=4", "checkpoint.every_steps=2", "eval.every_steps=0", "log.every_steps=1")


@pytest.mark.slow
def test_extend_a_run_resume_policy_and_dataset_checks(tmp_path, tiny_data):
    run_dir = tmp_path / "run"
    r = run(launch_cmd(run_dir, tiny_data, *FOUR))
    assert r.returncode == 0, r.stderr
    # the console: a compile notice, elapsed and ETA, no loss scale in fp32, a summary
    assert "compiling the training graph for step 1" in r.stdout
    line3 = next(x for x in r.stdout.splitlines() if x.startswith("step      3/4"))
    assert "elapsed 0:" in line3 and "eta 0:" in line3 and "scale" not in line3
    assert "[train] done: step 4/4 (4 this session, 1,024 tokens" in r.stdout
    assert f"checkpoints: {run_dir / 'checkpoints'} (latest: step_00000004)" in r.stdout
    assert all(x["time"].endswith("+00:00") for x in records(run_dir))
    # resuming a finished run says so
    r = run(launch_cmd(run_dir, tiny_data, *FOUR, resume="auto"))
    assert r.returncode == 0, r.stderr
    assert "already finished at step 4/4" in r.stdout
    # extending: train.steps and the cadences change without --force, named, lr schedule continues
    r = run(launch_cmd(run_dir, tiny_data, *FOUR, "train.steps=8", "checkpoint.every_steps=4",
                       resume="auto"))
    assert r.returncode == 0, r.stderr
    assert "train.steps 4 -> 8" in r.stdout and "checkpoint.every_steps 2 -> 4" in r.stdout
    cfg = load_config(TINY, [f"data.path={tiny_data}", f"run.dir={run_dir}", *FOUR, "train.steps=8"])
    steps = [x for x in records(run_dir) if not x.get("eval")]
    assert [x["step"] for x in steps] == list(range(1, 9))
    assert [x["lr"] for x in steps[4:]] == [lr_at(s, cfg.optim, 8) for s in range(5, 9)]
    assert_tensorboard_matches_metrics(run_dir)     # a resumed run included
    # a key that changes training is named; --force prints what it overrides
    r = run(launch_cmd(run_dir, tiny_data, *FOUR, "train.steps=9", "optim.weight_decay=0.2",
                       resume="auto"))
    assert r.returncode == 1 and "optim.weight_decay 0.1 -> 0.2" in r.stderr, r.stderr
    other = make_dataset(tmp_path / "other", num_train=64, num_valid=16, seq_length=16,
                         vocab_size=128, seed=9)
    # eval on a dataset with another sequence length: refused, naming both
    r = run(launch_cmd(run_dir, other, *FOUR, command="eval"))
    assert r.returncode == 1, r.stderr
    assert "seq_length 16, but the checkpoint was trained with seq_length 32" in r.stderr, r.stderr
    r = run(launch_cmd(run_dir, other, *FOUR, "train.steps=9", resume="auto", force=True))
    assert r.returncode == 0 and "--force: overriding dataset fingerprint" in r.stderr, r.stderr

    # a damaged shard: a flipped byte fails `eval --verify-data`
    bad = tmp_path / "bad"
    shutil.copytree(tiny_data, bad)
    shard = sorted((bad / "shards").glob("valid-*.mindrecord"))[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    r = run(launch_cmd(run_dir, bad, *FOUR, command="eval") + ["--verify-data"])
    assert r.returncode == 1 and f"{shard}: sha256 differs from the manifest" in r.stderr, r.stderr


def test_dataset_checks_at_start(tmp_path, tiny_data):
    from mspretrain.train.data_check import DataCheckError, check_dataset
    bad = tmp_path / "bad"
    shutil.copytree(tiny_data, bad)
    assert check_dataset(str(bad), ("train", "valid"), full=True).seq_length == 32
    shard = sorted((bad / "shards").glob("train-*.mindrecord"))[0]
    data = shard.read_bytes()
    mid = len(data) // 2
    shard.write_bytes(data[:mid] + bytes([data[mid] ^ 1]) + data[mid + 1:])   # only checksums see it
    check_dataset(str(bad), ("train",))
    with pytest.raises(DataCheckError, match="sha256 differs"):
        check_dataset(str(bad), ("train",), full=True)
    shard.write_bytes(b"\0" * 8 + data[8:])                    # the header's length is gone
    with pytest.raises(DataCheckError, match="no MindRecord header"):
        check_dataset(str(bad), ("train",))
    shard.write_bytes(data[:-100])                              # cut short
    with pytest.raises(DataCheckError, match=r"data \+ \.db are .* the manifest says"):
        check_dataset(str(bad), ("train",))
    r = run(launch_cmd(tmp_path / "fresh", bad, *FOUR))
    assert r.returncode == 1 and f"{shard}: data + .db are" in r.stderr, r.stderr
    assert not (tmp_path / "fresh" / "metrics.jsonl").exists()


def tensorboard_scalars(run_dir) -> dict:
    """{tag: {step: value}} as TensorBoard itself reads RUN/tensorboard/."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def assert_tensorboard_matches_metrics(run_dir) -> None:
    import numpy as np
    tb = tensorboard_scalars(run_dir)
    want: dict = {}
    for rec in records(run_dir):
        prefix = "eval/" if rec.get("eval") else ""
        for k, v in rec.items():
            if k not in ("step", "eval", "time") and not isinstance(v, bool) \
                    and isinstance(v, (int, float)):
                want.setdefault(prefix + k, {})[rec["step"]] = float(np.float32(v))
    assert {"loss", "lr", "grad_norm", "tokens_per_s"} <= set(want)
    assert tb == want


def _fake_run(root, scale: float):
    """A run dir with a metrics.jsonl in the trainer's format (what the plots read)."""
    import json
    root.mkdir()
    lines = []
    for step in range(1, 21):
        lines.append({"step": step, "loss": scale * 5 / step ** 0.3, "lr": 1e-3 * min(1, step / 5),
                      "grad_norm": 1.0 / step, "loss_scale": 65536.0, "overflow": False,
                      "tokens_per_s": 1000.0 + step, "mfu": 0.01})
        if step % 10 == 0:
            lines.append({"step": step, "eval": True, "val_loss": scale * 4.0, "val_ppl": 54.6,
                          "val_acc": 0.1 * step / scale})
    (root / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return root


def test_plot_overlays_runs_and_compare_plot(tmp_path, capsys):
    from PIL import Image
    from mspretrain.train.cli import main
    a, b = _fake_run(tmp_path / "a", 1.0), _fake_run(tmp_path / "b", 1.2)
    out = tmp_path / "plots" / "runs.png"
    assert main(["plot", str(a), str(b), "--out", str(out)]) == 0
    from mspretrain.train.observe.plot import PANELS
    with Image.open(out) as im:       # 8 x 2.4 inches per panel at 100 dpi
        assert im.format == "PNG" and im.size == (800, round(240 * len(PANELS)))
        colours = {c for _, c in im.convert("RGB").getcolors(1 << 20)}
    assert (31, 119, 180) in colours and (255, 127, 14) in colours     # both runs drawn (C0, C1)
    assert main(["compare", str(a), str(b), "--plot", str(tmp_path / "cmp.png")]) == 1
    assert Image.open(tmp_path / "cmp.png").format == "PNG"
    capsys.readouterr()
    assert main(["compare", str(a), str(tmp_path / "nope")]) == 1
    assert "nope/metrics.jsonl: not found" in capsys.readouterr().err


@pytest.mark.slow
def test_ctrl_c_says_what_was_saved_and_how_to_resume(tmp_path, tiny_data):
    import os
    import signal
    import subprocess
    import time

    from trainer_harness import REPO, last_step
    run_dir = tmp_path / "run"
    cmd = launch_cmd(run_dir, tiny_data, "train.steps=1000", "checkpoint.every_steps=3",
                     "eval.every_steps=0")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        while last_step(run_dir) < 4 and proc.poll() is None:
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGINT)      # Ctrl-C: the whole process group
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "Terminated" not in err
    assert "train launch: interrupted; last checkpoint " + str(run_dir / "checkpoints" / "step_") in err
    assert "--resume auto" in err.splitlines()[-1]


def test_msrun_console_filter_keeps_the_trainers_lines_only(tmp_path):
    import io
    import subprocess
    import sys

    from mspretrain.train.log_filter import pump
    lines = [
        "[INFO] DISTRIBUTED(16158,7fcc0559a6c0,python):2026-11-30-13:03:54.358.110 "
        "[mindspore/ccsrc/cluster/rpc/core/communicator/tcp_client.cc:367] Start] Event base",
        "[WARNING] ME(16147:140113741184576,MainProcess):2026-11-30-13:03:06.382.000 "
        "[mindspore/parallel/cluster/process_entity/_api.py:112] The '--tail_worker_log' is set",
        "[train] starting at step 0/8, 1 micro-step(s) per step",
        "step      8/8  loss 4.5909  lr 3.000e-04",
        "[ERROR] ME(1:2,MainProcess): a real error stays visible",
    ]
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdout.write(sys.argv[1])",
                             "\n".join(lines) + "\n"], stdout=subprocess.PIPE)
    console = io.StringIO()
    pump(proc.stdout, tmp_path / "launcher.log", console).join(timeout=30)
    proc.wait()
    assert console.getvalue().splitlines() == lines[2:]
    assert (tmp_path / "launcher.log").read_text().splitlines() == lines
