import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mspretrain.train import checkpoint as ckpt
from mspretrain.train.checkpoint import background as ckbg, format as ckfmt
from mspretrain.train.observe import metrics
from train_test_hooks import KILL_ENV, env as hook_env


def params(value: float) -> dict:
    from mindspore import Parameter, Tensor

    return {"w": Parameter(Tensor(np.full((3, 2), value, np.float32)), name="w"),
            "global_step": Parameter(Tensor(np.array(int(value), np.int32)), name="global_step")}


def test_write_publish_prune_and_load(tmp_path):
    for step in (2, 4, 6):
        ckpt.write_checkpoint(tmp_path, step, params(step), {"step": step}, keep_max=2)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_00000004", "step_00000006"]
    assert ckpt.latest_checkpoint(tmp_path).name == "step_00000006"
    model = root / "step_00000004" / "model.ckpt"
    assert ckpt.read_state(root / "step_00000004") == {
        "step": 4, "files": {"model.ckpt": {"sha256": ckpt.file_digest(model)["sha256"],
                                            "bytes": model.stat().st_size}}}
    target = params(0.0)
    ckpt.load_params(root / "step_00000004", target)
    assert target["w"].asnumpy().tolist() == [[4.0, 4.0]] * 3 and int(target["global_step"].asnumpy()) == 4


def test_load_refuses_a_different_model(tmp_path):
    from mindspore import Parameter, Tensor

    ckpt.write_checkpoint(tmp_path, 1, params(1.0), {"step": 1}, keep_max=1)
    d = ckpt.latest_checkpoint(tmp_path)
    with pytest.raises(ckpt.CheckpointError, match=r"missing \['v'\]"):
        ckpt.load_params(d, {**params(0.0), "v": Parameter(Tensor(np.zeros(2, np.float32)), name="v")})
    with pytest.raises(ckpt.CheckpointError, match=r"w is Float32\(3, 2\), the model has Float32\(2, 3\)"):
        ckpt.load_params(d, {**params(0.0), "w": Parameter(Tensor(np.zeros((2, 3), np.float32)), name="w")})
    only_w = {"w": params(0.0)["w"]}
    with pytest.raises(ckpt.CheckpointError, match="unexpected"):
        ckpt.load_params(d, only_w)
    ckpt.load_params(d, only_w, allow_extra=True)


_KILLED_WRITER = """
import sys
from mspretrain.train import checkpoint as ckpt, hooks
from test_checkpoint import params
ckpt.write_checkpoint(sys.argv[1], int(sys.argv[2]), params(float(sys.argv[2])), {"step": int(sys.argv[2])}, 5,
                      on_phase=hooks.load().checkpoint_phase)
"""


@pytest.mark.parametrize("phase,latest", [("before_rename", "step_00000001"),
                                          ("before_latest", "step_00000001")])
def test_killed_during_a_write_leaves_the_previous_checkpoint_latest(tmp_path, phase, latest):
    ckpt.write_checkpoint(tmp_path, 1, params(1.0), {"step": 1}, keep_max=5)
    env = dict(os.environ, **hook_env(**{KILL_ENV: f"{phase}:2"}))
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], os.getcwd(), str(Path(__file__).resolve().parent)])
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(tmp_path), "2"], env=env)
    assert proc.returncode == -signal.SIGKILL
    assert ckpt.latest_checkpoint(tmp_path).name == latest
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    if phase == "before_rename":
        assert ".tmp-step_00000002" in names and "step_00000002" not in names
        ckpt.remove_stale_temps(tmp_path)
        assert ".tmp-step_00000002" not in {p.name for p in (tmp_path / "checkpoints").iterdir()}
    else:
        assert "step_00000002" in names       # complete, not published: --resume auto still finds it


def test_unwritable_location_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ckpt.CheckpointError, match=f"cannot write checkpoint {blocker}/checkpoints/step_00000003"):
        ckpt.write_checkpoint(blocker, 3, params(3.0), {"step": 3}, keep_max=1)


def test_latest_naming_a_missing_dir_is_an_error(tmp_path):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest").write_text("step_00000009\n")
    with pytest.raises(ckpt.CheckpointError, match="not a complete checkpoint"):
        ckpt.latest_checkpoint(tmp_path)


def test_metrics_truncate_and_partial_last_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in range(1, 6)]
    lines.insert(2, json.dumps({"step": 2, "eval": True, "val_loss": 0.5}))
    path.write_text("\n".join(lines) + "\n" + '{"step": 6, "lo')      # killed mid-line
    assert metrics.truncate_after(tmp_path, 2) == 3          # steps 3-5; the cut line is not a record
    assert [(r["step"], r.get("eval", False)) for r in metrics.read_records(path)] == \
        [(1, False), (2, False), (2, True)]
    path.write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    with pytest.raises(metrics.MetricsError, match=r"metrics.jsonl:2: not valid JSON"):
        metrics.read_records(path)


def test_compare_runs(tmp_path):
    for name, losses in (("a", [0.5, 0.25, 0.125]), ("b", [0.5, 0.25, 0.125]),
                         ("c", [0.5, np.nextafter(0.25, 1.0), 0.125])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text(
            "".join(json.dumps({"step": i + 1, "loss": float(v)}) + "\n" for i, v in enumerate(losses)))
    out = []
    assert metrics.compare_runs(tmp_path / "a", tmp_path / "b", out.append) == 0
    assert out[-1] == "3/3 common steps bitwise equal"
    out = []
    assert metrics.compare_runs(tmp_path / "a", tmp_path / "c", out.append) == 1   # one ulp apart
    assert "DIFFERENT" in out[1] and out[-1] == "2/3 common steps bitwise equal"


def test_state_format_version_is_written_and_a_newer_one_refused(tmp_path):
    from mspretrain.train.checkpoint.policy import ResumeError
    from mspretrain.train.checkpoint.checkpointer import STATE_FORMAT_VERSION, check_state_version

    check_state_version({"step": 3}, tmp_path)                          # written before versions: 0
    check_state_version({"format_version": STATE_FORMAT_VERSION}, tmp_path)
    for bad in (STATE_FORMAT_VERSION + 1, "1"):
        with pytest.raises(ResumeError, match="format_version"):
            check_state_version({"format_version": bad}, tmp_path)


def test_model_file_is_save_checkpoints_bytes_and_its_digest_is_the_files(tmp_path):
    """write_model_file encodes the records itself and hashes them as they are written: the file is
    byte for byte ms.save_checkpoint's (float32, float16, int32 scalar, a tensor split in slices), the
    digest is the file's, and the host copy is a snapshot (later changes to the parameter do not
    reach it)."""
    import hashlib

    import mindspore as ms
    from mindspore import Parameter, Tensor

    rng = np.random.default_rng(0)
    state = {"w": Parameter(Tensor(rng.standard_normal((300, 7)).astype(np.float32)), name="w"),
             "h": Parameter(Tensor(rng.standard_normal(5).astype(np.float16)), name="h"),
             "global_step": Parameter(Tensor(np.array(3, np.int32)), name="global_step")}
    ms.save_checkpoint([{"name": k, "data": p} for k, p in state.items()], str(tmp_path / "ms.ckpt"))
    copy = ckpt.host_copy(state)
    state["w"].set_data(Tensor(np.zeros((300, 7), np.float32)))
    digest = ckpt.write_model_file(tmp_path / "ours.ckpt", copy)
    ours = (tmp_path / "ours.ckpt").read_bytes()
    assert ours == (tmp_path / "ms.ckpt").read_bytes()
    assert digest == {"sha256": hashlib.sha256(ours).hexdigest(), "bytes": len(ours)}
    # slices: a tensor larger than a slice is several records of one name, loaded back whole
    ckpt.write_model_file(tmp_path / "sliced.ckpt", copy, slice_bytes=1000)
    loaded = ms.load_checkpoint(str(tmp_path / "sliced.ckpt"))
    assert loaded["w"].asnumpy().tobytes() == copy[0].data.tobytes() and loaded["w"].shape == (300, 7)
    assert loaded["h"].asnumpy().tobytes() == copy[1].data.tobytes() and int(loaded["global_step"].asnumpy()) == 3
    assert copy[0].data.any() and not state["w"].asnumpy().any()     # the snapshot kept the old values


def test_a_background_snapshot_is_the_file_image_of_the_parameters_at_that_moment(tmp_path):
    """checkpoint.async's snapshot (`ModelImage.fill` of the parameters' views) holds ms.save_checkpoint's
    bytes for the parameters as they were (later changes do not reach it); written (O_DIRECT where the
    file system takes it) it is that file and its digest, sliced records included; the next snapshot
    reuses the buffer, and tensors of another layout are laid out anew."""
    import hashlib

    import mindspore as ms
    from mindspore import Parameter, Tensor

    rng = np.random.default_rng(2)
    state = {"w": Parameter(Tensor(rng.standard_normal((300, 7)).astype(np.float32)), name="w"),
             "h": Parameter(Tensor(rng.standard_normal(5).astype(np.float16)), name="h"),
             "on": Parameter(Tensor(np.array([True, False, True])), name="on"),
             "global_step": Parameter(Tensor(np.array(3, np.int32)), name="global_step")}

    def saved(name: str) -> bytes:
        ms.save_checkpoint([{"name": k, "data": p} for k, p in state.items()], str(tmp_path / name))
        return (tmp_path / name).read_bytes()

    def written(image, name: str) -> bytes:
        digest = ckpt.write_model_file(tmp_path / name, image)
        data = (tmp_path / name).read_bytes()
        assert digest == {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        return data

    before = saved("before.ckpt")
    image = ckpt.ModelImage().fill(ckpt.host_copy(state, copy=False))
    buffer = image.padded_view().obj
    state["w"].set_data(Tensor(np.ones((300, 7), np.float32)))      # the next step changes the parameters
    assert written(image, "first.ckpt") == before
    assert image.fill(ckpt.host_copy(state, copy=False)) is image and image.padded_view().obj is buffer
    assert written(image, "second.ckpt") == saved("after.ckpt")
    # a tensor over a slice is several records, as in write_model_file's list path
    ckpt.write_model_file(tmp_path / "sliced_list.ckpt", ckpt.host_copy(state), slice_bytes=1000)
    image.fill(ckpt.host_copy(state, copy=False), slice_bytes=1000)
    assert written(image, "sliced.ckpt") == (tmp_path / "sliced_list.ckpt").read_bytes()
    assert ms.load_checkpoint(str(tmp_path / "sliced.ckpt"))["w"].asnumpy().tolist() == [[1.0] * 7] * 300
    # another layout (fewer tensors, a shorter file, the same padded buffer size or not): laid out anew
    del state["w"]
    assert written(image.fill(ckpt.host_copy(state, copy=False)), "smaller.ckpt") == saved("smaller_ms.ckpt")


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
def test_the_snapshot_copy_split_over_threads_copies_every_byte_once(threads):
    """_copy_in_parallel splits the bytes evenly, cutting pieces across threads: the result is the
    plain copy whatever the pieces' sizes (empty ones included)."""
    rng = np.random.default_rng(threads)
    sizes = [0, 1, 4097, 3, 10000, 0, 77]
    srcs = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    out = np.zeros(sum(sizes) + 5, np.uint8)
    copies, at = [], 0
    for src in srcs:
        copies.append((out[at:at + len(src)], src))
        at += len(src)
    ckfmt._copy_in_parallel(copies, threads)
    assert out[:at].tobytes() == b"".join(src.tobytes() for src in srcs) and not out[at:].any()


def test_a_direct_write_the_kernel_refuses_goes_on_through_the_page_cache(tmp_path):
    """_write_direct: an O_DIRECT write of a piece that is not whole blocks is refused (EINVAL, nothing
    written) where O_DIRECT is in force; the fd then drops O_DIRECT and the piece, and every later one,
    is written buffered, at the right offsets."""
    import mmap

    data = memoryview(mmap.mmap(-1, 4 * 4096))[:3 * 4096 + 100]      # page aligned, as ModelImage's
    data[:] = np.random.default_rng(3).integers(0, 256, len(data), dtype=np.uint8).tobytes()
    fd, direct = ckfmt._open_for_image(tmp_path / "f")
    try:
        assert ckfmt._write_direct(fd, data[:8192]) == direct
        assert ckfmt._write_direct(fd, data[8192:]) is False       # 4196 bytes: not whole blocks
        ckfmt._write_all(fd, data[len(data):])
    finally:
        os.close(fd)
    assert (tmp_path / "f").read_bytes() == bytes(data)


def test_a_paced_write_is_the_same_file_spread_over_its_budget_until_hurried(tmp_path, monkeypatch):
    """A background write (`Pacer`) writes the same bytes and digest as the synchronous writer, takes
    about its budget when the machine is faster than that, and finishes at once when hurried (the
    training thread waits for it)."""
    import hashlib
    import threading
    import time

    rng = np.random.default_rng(1)
    tensors = [ckpt.HostTensor(f"t{i}", [n], "Float32", rng.standard_normal(n).astype(np.float32))
               for i, n in enumerate((5000, 1, 20000, 3000))]
    plain = ckpt.write_model_file(tmp_path / "plain.ckpt", tensors)
    monkeypatch.setattr(ckfmt, "PACE_CHUNK", 4096)       # ~28 pacing points in this 113 KB file
    hurry = threading.Event()
    t = time.monotonic()
    paced = ckpt.write_model_file(tmp_path / "paced.ckpt", tensors, pace=ckpt.Pacer(1.0, hurry))
    took = time.monotonic() - t
    assert (tmp_path / "paced.ckpt").read_bytes() == (tmp_path / "plain.ckpt").read_bytes()
    assert paced == plain == {"sha256": hashlib.sha256((tmp_path / "plain.ckpt").read_bytes()).hexdigest(),
                              "bytes": (tmp_path / "plain.ckpt").stat().st_size}
    # the last pacing point is at the last full chunk: at least (size - chunk) / size of the budget
    assert took >= 1.0 * (paced["bytes"] - 4096) / paced["bytes"] - 0.01
    # hurried a moment after it starts, a 30 s budget ends within the time of an unpaced write
    timer = threading.Timer(0.2, hurry.set)
    timer.start()
    t = time.monotonic()
    assert ckpt.write_model_file(tmp_path / "hurried.ckpt", tensors, pace=ckpt.Pacer(30.0, hurry)) == plain
    timer.join()
    assert time.monotonic() - t < 10


def test_background_writer_paces_over_a_share_of_the_checkpoint_interval():
    """The budget is `share` x every_steps x the median interval between `check` calls (one per step);
    no pace before a step was timed or without every_steps; the writing thread runs at a lower
    priority than the training thread (Linux)."""
    import time

    w = ckpt.BackgroundWriter(every_steps=10, share=0.5)
    assert w.budget_s() == 0.0
    for _ in range(4):
        w.check()
        time.sleep(0.05)
    assert 0.5 * 10 * 0.05 <= w.budget_s() < 0.5 * 10 * 0.05 * 4     # sleep overshoots, never undershoots
    assert ckpt.BackgroundWriter().budget_s() == 0.0
    seen = []
    w.start(1, lambda pace: seen.append((pace.budget_s, os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))))
    w.wait()
    assert seen and seen[0][0] > 0
    if sys.platform.startswith("linux"):    # the write runs below the training threads' priority
        base, policy = os.getpriority(os.PRIO_PROCESS, 0), os.sched_getscheduler(0)
        if ckbg._idle_reversible():
            assert seen[0][1:] == (os.SCHED_IDLE, base)
        else:
            assert seen[0][1:] == (policy, min(19, base + ckpt.WRITER_NICE))
        assert (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)) == (policy, base)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread priorities: Linux")
def test_a_waited_for_writer_leaves_sched_idle_where_the_process_may():
    """`wait` (the training thread waits for the write) takes the writing thread out of SCHED_IDLE when
    `_idle_reversible` says the process may; the probe's answer is the kernel's (RLIMIT_NICE,
    CAP_SYS_NICE): an unprivileged process with RLIMIT_NICE 0 may not, and its writer runs
    WRITER_NICE nice levels lower instead, never in a SCHED_IDLE it could not leave."""
    import threading
    import time

    w = ckpt.BackgroundWriter()
    started, seen = threading.Event(), []

    def write(pace):
        started.set()
        time.sleep(0.3)         # the training thread's wait comes while this runs
        seen.append((os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0)))
    w.start(1, write)
    assert started.wait(10)
    time.sleep(0.05)
    w.wait()
    process = (os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0))
    if ckbg._idle_reversible():
        assert seen == [process]
    else:
        assert seen[0] in (process, (process[0], min(19, process[1] + ckpt.WRITER_NICE)))
    import shutil

    if shutil.which("setpriv") and shutil.which("prlimit"):
        # a process without CAP_SYS_NICE and with RLIMIT_NICE 0 (an unprivileged user's default) may
        # enter SCHED_IDLE but not leave it: its writer runs at a lower nice level instead
        probe = ("import os; from mspretrain.train.checkpoint import background as c; c._lower_priority(); "
                 "print(c._idle_reversible(), os.sched_getscheduler(0) == os.SCHED_IDLE, "
                 "os.getpriority(os.PRIO_PROCESS, 0))")
        r = subprocess.run(["prlimit", "--nice=0:0", "setpriv", "--bounding-set", "-sys_nice", "--inh-caps",
                            "-sys_nice", sys.executable, "-c", probe], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(Path(ckpt.__file__).parents[3])})
        if r.returncode == 0 or "setpriv" not in r.stderr:     # setpriv may be refused in a container
            assert r.returncode == 0, r.stderr
            assert r.stdout.split() == ["False", "False", str(min(19, process[1] + ckpt.WRITER_NICE))]
