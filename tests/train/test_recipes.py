"""Pretraining recipes: data.blend, data.mixture (phases by consumed tokens) and train.rampup (batch-size
ramp-up), each a pure function of the loader cursor: per-source counts match the weights, and runs
killed with SIGKILL (in every mixture phase, during the ramp) resume bit for bit, never repeating or
skipping a sample (checked by sample ids)."""
import json
import random
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from mspretrain.loader.blend import MAX_WINDOW_ERROR, PERIOD, MixtureSchedule
from mspretrain.train.config import ConfigError, load_config

from synthetic import make_dataset
from train_test_hooks import TRACE_ENV, env as hook_env
from trainer_harness import TINY, exact_view, records, run, run_killed_at


def _cfg(*sets):
    return load_config(TINY, list(sets))


def _one_process(rank=0, size=1):
    return SimpleNamespace(dp_rank=rank, dp_size=size)


# ---------------------------------------------------------------- pure functions (fast)

def test_mixture_keeps_one_cursor_per_source_across_phases():
    """Three phases over three sources: every source's sample numbers run 0, 1, 2, ... across the
    phase changes (none repeated, none skipped), each phase's counts follow its weights within the
    blend's window error, and counts_before agrees with locate at every length."""
    ends = [1000, 2500]
    phases = [(ends[0], {0: 3.0, 1: 1.0}), (ends[1], {1: 1.0, 2: 1.0}), (None, {0: 1.0, 1: 2.0, 2: 1.0})]
    mix = MixtureSchedule(3, phases)
    positions = np.arange(4000)
    sources, numbers = mix.locate(positions)
    for j in range(3):
        assert numbers[sources == j].tolist() == list(range(int(np.sum(sources == j))))
    for (lo, hi), (_, weights) in zip([(0, 1000), (1000, 2500), (2500, 4000)], phases):
        total = sum(weights.values())
        for j in range(3):
            count = np.sum(sources[lo:hi] == j)
            assert abs(count - (hi - lo) * weights.get(j, 0.0) / total) <= MAX_WINDOW_ERROR + (hi - lo) / PERIOD
    for length in (0, 1, 999, 1000, 1001, 2500, 3999):
        assert mix.counts_before(length).tolist() == np.bincount(sources[:length], minlength=3).tolist()
    # a pure function of the position: any slice, in any order, is located the same
    some = np.array([3999, 0, 2500, 1000, 999])
    assert [a.tolist() for a in mix.locate(some)] == [sources[some].tolist(), numbers[some].tolist()]


def test_rampup_follows_megatron():
    """train.rampup {start 2, increment 2, samples 48} to 8: Megatron's float formula
    start + increment * int(consumed / (samples / increments)), full size from `samples` on."""
    from mspretrain.train.data import Rampup

    ramp = Rampup(_cfg("train.rampup.start=2", "train.rampup.increment=2", "train.rampup.samples=48"), 1)
    for consumed in range(0, 80):
        megatron = 8 if consumed > 48 else 2 + 2 * int(consumed / (48 / 3))
        assert ramp.batch_size(consumed) == megatron
    sizes, cursor = [], 0
    while cursor < 60:
        sizes.append(ramp.batch_size(cursor))
        cursor += sizes[-1]
    assert sizes == [2] * 8 + [4] * 4 + [6] * 3 + [8] * 2


@pytest.mark.parametrize("sets, message", [
    (("data.path=x", "data.blend={y: 1}"), "data.path and data.blend exclude each other"),
    (("data.blend={y: 0}",), "data.blend: the weight of y must be a positive number"),
    (("data.mixture=[{blend: {a: 1}}, {blend: {b: 1}}]",), r"data.mixture\[0\].until_tokens must be an integer"),
    (("data.mixture=[{until_tokens: 10, blend: {a: 1}}, {until_tokens: 5, blend: {b: 1}}, {blend: {b: 1}}]",),
     r"data.mixture\[1\].until_tokens must be an integer above the previous phase's \(10\)"),
    (("data.mixture=[{until_tokens: 10, blend: {a: 1}}]",), r"data.mixture\[0\]: the last phase runs to the end"),
    (("data.mixture=[{weights: {a: 1}}]",), r"data.mixture\[0\] must be"),
])
def test_data_keys_are_checked(sets, message):
    from mspretrain.train.data import source_dirs
    with pytest.raises(ConfigError, match=message):
        source_dirs(_cfg(*sets))


@pytest.mark.parametrize("sets, message", [
    (("train.rampup.start=3", "train.rampup.increment=2", "train.rampup.samples=8"), "must be >= 1 and divide"),
    (("train.rampup.start=8", "train.rampup.increment=2", "train.rampup.samples=8"), r"must be in \(0, "),
    # 8 / dp 2 / micro 2: 2 micro-batches per rank in every step, so the ramp moves by dp x 2 = 4
    (("train.rampup.start=2", "train.rampup.increment=2", "train.rampup.samples=8",
      "train.micro_batch_size=2"), r"must be multiples of 4: every step runs 2 micro-batches per rank"),
    (("train.rampup.start=2", "train.rampup.increment=1", "train.rampup.samples=8"), "multiples of the data-parallel"),
])
def test_rampup_keys_are_checked(sets, message):
    from mspretrain.train.data import Rampup
    with pytest.raises(ConfigError, match=message):
        Rampup(_cfg(*sets), dp_size=2)


def test_a_loader_follows_a_mixture_schedule_through_its_public_method(tmp_path):
    """Loader.follow_schedule (what MixtureLoader uses, instead of the Loader's private fields): a
    plain blend Loader made to follow a mixture gives the MixtureLoader's batches; it is refused once
    reading began, and for a schedule over another number of sources."""
    from mspretrain.loader import Loader
    from mspretrain.loader.mixture import MixtureLoader

    a = make_dataset(tmp_path / "a", num_train=40, num_valid=4, seq_length=16, vocab_size=64, seed=1)
    b = make_dataset(tmp_path / "b", num_train=40, num_valid=4, seq_length=16, vocab_size=64, seed=2)
    mix = MixtureSchedule(2, [(12, {0: 1.0}), (None, {0: 1.0, 1: 3.0})])
    with MixtureLoader([a, b], mix, global_batch_size=4, seed=7) as m, \
            Loader({str(a): 1.0, str(b): 1.0}, global_batch_size=4, seed=7) as plain:
        plain.follow_schedule(mix)
        for _ in range(8):
            x, y = next(m), next(plain)
            assert all(np.array_equal(x[k], y[k]) for k in ("input_ids", "sample_id", "source"))
        assert m.state_dict()["mixture"]["ends"] == [12]
    with Loader({str(a): 1.0, str(b): 1.0}, global_batch_size=4, num_workers=1) as started:
        next(started)
        with pytest.raises(RuntimeError, match="before the first batch"):
            started.follow_schedule(mix)
        with pytest.raises(ValueError, match="over 3 sources, this loader has 2"):
            Loader({str(a): 1.0, str(b): 1.0}, global_batch_size=4).follow_schedule(
                MixtureSchedule(3, [(None, {0: 1.0})]))


def test_blend_of_other_seq_length_or_tokenizer_names_both(tmp_path):
    from mspretrain.train.data import check_sources
    from mspretrain.train.data_check import DataCheckError

    a = make_dataset(tmp_path / "a", num_train=16, num_valid=4, seq_length=16, vocab_size=64)
    b = make_dataset(tmp_path / "b", num_train=16, num_valid=4, seq_length=32, vocab_size=64)
    c = make_dataset(tmp_path / "c", num_train=16, num_valid=4, seq_length=16, vocab_size=96)
    with pytest.raises(DataCheckError, match=f"{b}: seq_length 32, but {a} has 16"):
        check_sources(_cfg(f"data.blend={{{a}: 1, {b}: 1}}"))
    with pytest.raises(DataCheckError, match=f"{c}: tokenizer .* differs from {a}'s"):
        check_sources(_cfg(f"data.mixture=[{{until_tokens: 64, blend: {{{a}: 1}}}}, {{blend: {{{c}: 1}}}}]"))


def test_ranks_take_slices_of_the_same_stream(tmp_path):
    """A mixture under a ramp: the two dp ranks' batches, side by side, are the one-process batches
    (so a resume on another dp size continues the same samples)."""
    from mspretrain.train.data import TrainData

    a = make_dataset(tmp_path / "a", num_train=64, num_valid=4, seq_length=16, vocab_size=64, seed=1)
    b = make_dataset(tmp_path / "b", num_train=48, num_valid=4, seq_length=16, vocab_size=64, seed=2)
    cfg = _cfg(f"data.mixture=[{{until_tokens: 300, blend: {{{a}: 1}}}}, {{blend: {{{a}: 1, {b}: 2}}}}]",
               "train.rampup.start=2", "train.rampup.increment=2", "train.rampup.samples=24",
               "data.num_workers=0")
    with TrainData(cfg, _one_process()) as one, TrainData(cfg, _one_process(0, 2)) as r0, \
            TrainData(cfg, _one_process(1, 2)) as r1:
        for _ in range(14):
            whole, halves = next(one), (next(r0), next(r1))
            for key in ("input_ids", "sample_id", "source"):
                assert np.array_equal(whole[key], np.concatenate([h[key] for h in halves]))
        assert one.cursor == r0.cursor == r1.cursor == 2 * 4 + 4 * 2 + 6 * 2 + 8 * 6


# ---------------------------------------------------------------- real runs on two dataprep datasets

@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory):
    """English and Chinese halves of the demo corpus, each built by `dataprep build` (seq 64); the
    Chinese one with the English one's tokenizer (a blend needs one tokenizer)."""
    from hf_helpers import BUILD_SETTINGS, REPO, build_spm_dataset
    from mspretrain.dataprep.cli import main as dataprep

    root = tmp_path_factory.mktemp("corpora")
    en = build_spm_dataset(root / "en")
    settings = list(BUILD_SETTINGS)
    i = settings.index("--vocab-size")
    del settings[i:i + 2]
    zh = root / "zh"
    rc = dataprep(["build", str(REPO / "demo" / "corpus" / "debian-reference.zh-cn.txt.gz"), "--out", str(zh),
                   *settings, "--tokenizer", str(en / "tokenizer.model")])
    assert rc == 0
    return en, zh


def launch_cmd(run_dir, *sets, resume=None):
    """`train launch` on configs/tiny.yaml with the data keys in `sets` (no data.path)."""
    import sys
    cmd = [sys.executable, "-m", "mspretrain.train", "launch", "--config", str(TINY), "--set", f"run.dir={run_dir}"]
    for s in sets:
        cmd += ["--set", s]
    return cmd + (["--resume", resume] if resume else [])


def _kill_and_resume(tmp_path, data_sets, kill_steps, trace: bool):
    """(straight run dir, killed run dir): the same config straight through, and killed with SIGKILL
    once past each of `kill_steps` (then resumed with --resume auto until done)."""
    straight, killed, log = tmp_path / "straight", tmp_path / "killed", tmp_path / "killed.log"
    r = run(launch_cmd(straight, *data_sets))
    assert r.returncode == 0, r.stderr[-3000:]
    env = hook_env(**{TRACE_ENV: str(tmp_path / "trace")}) if trace else None
    rng = random.Random(str(kill_steps))
    kills = run_killed_at(launch_cmd(killed, *data_sets), killed, kill_steps[0], rng.uniform(0, 0.04), log, env)
    resume = launch_cmd(killed, *data_sets, resume="auto")
    for step in kill_steps[1:]:
        kills += run_killed_at(resume, killed, step, rng.uniform(0, 0.04), log, env)
    assert kills == len(kill_steps)
    r = run(resume, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return straight, killed


def _per_source_view(run_dir):
    return [{k: v for k, v in r.items() if k.split("/")[0] in ("samples", "tokens", "val_loss", "batch_size")
             or k == "mixture_phase"} for r in records(run_dir)]


@pytest.mark.slow
def test_blend_counts_follow_the_weights_and_resume_bitwise(tmp_path, two_corpora):
    en, zh = two_corpora
    sets = (f"data.blend={{{en}: 0.7, {zh}: 0.3}}", "train.steps=16", "checkpoint.every_steps=4",
            "eval.every_steps=8", "log.every_steps=1")
    straight, killed = _kill_and_resume(tmp_path, sets, [10], trace=False)
    assert exact_view(killed) == exact_view(straight)
    assert _per_source_view(killed) == _per_source_view(straight)

    steps = [r for r in records(straight) if not r.get("eval")]
    # the counts are those of the stream the loader really produces (sources of every position)
    from mspretrain.loader import Loader
    with Loader({str(en): 0.7, str(zh): 0.3}, global_batch_size=8, seed=_cfg().seed) as ld:
        seen = np.zeros(2, dtype=np.int64)
        for r in steps:
            seen += np.bincount(next(ld)["source"], minlength=2)
            assert [r["samples/en"], r["samples/zh"]] == seen.tolist()
            assert r["tokens/en"] == 64 * r["samples/en"]
    n = steps[-1]["consumed_samples"]
    for name, w in (("en", 0.7), ("zh", 0.3)):
        assert abs(steps[-1][f"samples/{name}"] - n * w) <= MAX_WINDOW_ERROR + n / PERIOD
    state = json.loads((killed / "checkpoints" / "step_00000016" / "state.json").read_text())
    assert {k: v["samples"] for k, v in state["consumed"].items()} == {"en": steps[-1]["samples/en"],
                                                                       "zh": steps[-1]["samples/zh"]}
    evals = [r for r in records(straight) if r.get("eval")]
    assert len(evals) == 2
    for r in evals:         # per-source validation; the total is their mean under the weights
        assert r["val_loss"] == pytest.approx(0.7 * r["val_loss/en"] + 0.3 * r["val_loss/zh"], rel=1e-12)
        assert r["val_loss/en"] != r["val_loss/zh"]
        assert r["val_acc"] == pytest.approx(0.7 * r["val_acc/en"] + 0.3 * r["val_acc/zh"], rel=1e-12)
        assert all(0 < r[f"val_acc/{n}"] < 1 for n in ("en", "zh"))


@pytest.mark.slow
def test_mixture_under_rampup_killed_in_every_phase_resumes_bitwise(tmp_path, two_corpora):
    """Three phases (en; en + zh; mostly zh) by consumed tokens and a batch ramp 2 -> 8: the steps are
    of 2 (1-8), 4 (9-12), 6 (13-15), then 8 samples, so phase 0 ends inside step 14 (at sample 40,
    during the ramp) and phase 1 inside step 19 (sample 80). Killed in phase 0 during the ramp, in
    phase 1 and in phase 2: bitwise the straight run, and every step trained exactly the samples the
    stream gives, each source's being its own sample order from its start, none twice."""
    from mspretrain.loader.permutation import epoch_permutation
    from mspretrain.train.data import TrainData

    en, zh = two_corpora
    mixture = (f"data.mixture=[{{until_tokens: {40 * 64}, blend: {{{en}: 1}}}}, "
               f"{{until_tokens: {80 * 64}, blend: {{{en}: 1, {zh}: 1}}}}, {{blend: {{{en}: 1, {zh}: 3}}}}]")
    sets = (mixture, "train.rampup.start=2", "train.rampup.increment=2", "train.rampup.samples=48",
            "optim.lr_scaling=sqrt", "train.steps=24", "checkpoint.every_steps=4", "eval.every_steps=0",
            "log.every_steps=1")
    straight, killed = _kill_and_resume(tmp_path, sets, [7, 17, 22], trace=True)
    assert exact_view(killed) == exact_view(straight)
    assert _per_source_view(killed) == _per_source_view(straight)
    steps = [r for r in records(straight) if not r.get("eval")]
    assert [r["batch_size"] for r in steps] == [2] * 8 + [4] * 4 + [6] * 3 + [8] * 9
    assert [r["mixture_phase"] for r in steps][12:21] == [0, 1, 1, 1, 1, 1, 2, 2, 2]
    assert steps[0]["lr"] == pytest.approx(3e-3 / 5 * 0.5)          # warmup step 1 x sqrt(2 / 8)

    # the stream, read in this process: its sample ids per source are that source's own order
    cfg = _cfg(*sets)
    with TrainData(cfg, _one_process()) as data:
        batches = [next(data) for _ in steps]
        names = data.names
    sources = np.concatenate([b["source"] for b in batches])
    ids = np.concatenate([b["sample_id"] for b in batches])
    for j, name in enumerate(names):
        mine = ids[sources == j]
        size = json.loads((Path(data.dirs[j]) / "manifest.json").read_text())["splits"]["train"]["num_samples"]
        assert len(mine) < size                                            # within the first epoch
        assert mine.tolist() == epoch_permutation(size, cfg.seed, j, 0).take(np.arange(len(mine))).tolist()
        assert len(set(mine.tolist())) == len(mine) == steps[-1][f"samples/{name}"]
    # ... and the killed run trained exactly those rows at every step (the trace: every step call,
    # the re-done ones after each resume too)
    import hashlib

    def digests(rows):
        return [hashlib.sha1(np.ascontiguousarray(r).tobytes()).hexdigest()[:16] for r in rows]
    expected = {tuple(digests(b["input_ids"])): step for step, b in enumerate(batches, 1)}
    trace = [json.loads(line) for line in (tmp_path / "trace" / "rank_0.jsonl").read_text().splitlines()]
    done = [expected.get(tuple(t["rows"])) for t in trace]
    assert None not in done and set(done) == set(range(1, 25))
    assert len(done) > 24           # steps after a checkpoint were run again after each kill


@pytest.mark.slow
def test_rampup_with_micro_batches_trains_the_same_steps(tmp_path, tiny_data):
    """train.rampup with train.micro_batch_size: the step graph keeps its 4 micro-batches (8 / 2) and
    each is batch / 4 during the ramp (4 -> 8 over 16 samples). Step 1 (before any update, so only the
    fp32 summation order differs: 4 partial sums instead of one, each a sum of <= 256 token losses,
    relative error <= ~256 x 2^-24 = 1.5e-5) gives the loss and gradient norm of the same ramp without
    accumulation, and the batch sizes and cursor follow the ramp in both."""
    from trainer_harness import launch_cmd as data_launch

    common = ("train.rampup.start=4", "train.rampup.increment=4", "train.rampup.samples=16", "train.steps=6",
              "checkpoint.every_steps=6", "eval.every_steps=0", "log.every_steps=1")
    runs = {}
    for micro in (0, 2):
        out = tmp_path / f"micro{micro}"
        r = run(data_launch(out, tiny_data, *common, f"train.micro_batch_size={micro}"))
        assert r.returncode == 0, r.stderr[-3000:]
        runs[micro] = [x for x in records(out) if not x.get("eval")]
    for recs in runs.values():
        assert [x["batch_size"] for x in recs] == [4, 4, 4, 4, 8, 8]
        assert [x["consumed_samples"] for x in recs] == [4, 8, 12, 16, 24, 32]
    for key in ("loss", "grad_norm"):
        assert runs[2][0][key] == pytest.approx(runs[0][0][key], rel=1.5e-5)


def test_a_ramp_step_to_a_new_batch_size_is_said_on_ascend():
    """Each ramp size is a new input shape of the step graph: on Ascend (minutes per compile) the loop
    says so once per change; not for the first size, an unchanged one, or on CPU."""
    from mspretrain.train.config import load_config
    from mspretrain.train.trainer import ramp_recompile_notice

    ascend = load_config(TINY, ["device=Ascend"])
    said = ramp_recompile_notice(ascend, 256, 384)
    assert "256 -> 384" in said and "compiles again" in said
    assert ramp_recompile_notice(ascend, None, 256) is None and ramp_recompile_notice(ascend, 384, 384) is None
    assert ramp_recompile_notice(load_config(TINY, []), 256, 384) is None
