"""`train eval RUN --tasks`: multiple-choice scoring, checked against lm-evaluation-harness (`lm_eval`,
the real client, run as its own CLI on the HF export with a task defined from the same local jsonl)."""
from __future__ import annotations

import glob
import gzip
import json
import random
import re
import sys

import pytest

from hf_helpers import CORPUS, cli, jsonl, lm_eval_env, write_lm_eval_task
from trainer_harness import REPO, run


def corpus_items(lang: str, n: int, seed: int, long: int = 0) -> list[dict]:
    """Items from real corpus lines: the context is the start of a line, the gold choice what follows
    (25 characters, 6 in Chinese), the others as much of other lines; half the English contexts end in
    a space. The last `long` items have three more lines before the context: longer than the tiny
    model's 64-token context (Chinese is 3 byte tokens a character here), so they are left-truncated."""
    path = REPO / "demo" / "corpus" / {"en": CORPUS.name, "zh": "debian-reference.zh-cn.txt.gz"}[lang]
    lines = [x.strip() for x in gzip.open(path, "rt", encoding="utf-8")]
    lines = [x for x in lines if len(x) > 40 and "--" not in x and sum(c.isalpha() for c in x) > 0.7 * len(x)]
    rng = random.Random(seed)
    items = []
    for k in range(n):
        picked = rng.sample(lines, 4)
        cut = picked[0].rfind(" ", 0, len(picked[0]) // 2) if lang == "en" else min(len(picked[0]) // 2, 10)
        while lang == "zh" and cut > 1 and (picked[0][cut - 1].isascii() or picked[0][cut].isascii()):
            cut -= 1            # not inside a Latin word: the choice must add tokens of its own
        context = picked[0][:cut]
        size = 25 if lang == "en" else 6       # a Chinese character is 3 byte-fallback tokens here
        choices = [picked[0][cut:cut + size]] + [x[len(x) // 2:len(x) // 2 + size] for x in picked[1:]]
        if lang == "zh":        # no space at the cut: the choice's first token starts a new piece
            choices = [c.replace(" ", "") or "的" for c in choices]
            context = context.replace(" ", "")
        if lang == "en" and k % 2:
            context, choices = context + " ", [c.lstrip() for c in choices]
        if k >= n - long:
            context = "\n".join(rng.sample(lines, 3)) + "\n" + context
        gold = rng.randrange(4)
        choices[0], choices[gold] = choices[gold], choices[0]
        items.append({"context": context, "choices": choices, "gold": gold})
    return items


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    d = tmp_path_factory.mktemp("tasks")
    for lang, n, long in (("en", 12, 2), ("zh", 8, 1)):
        (d / f"{lang}.jsonl").write_text("".join(json.dumps(i, ensure_ascii=False) + "\n"
                                                 for i in corpus_items(lang, n, 7, long)), encoding="utf-8")
    return d


def results_of(run_dir, task: str, shots: str = "0shot", step: int = 20) -> list[dict]:
    [path] = glob.glob(str(run_dir / "eval" / f"step_{step:08d}-*-task-{task}-*-{shots}.jsonl"))
    return sorted(jsonl(path), key=lambda r: r["i"])


def test_tasks_score_every_item(spm_run, tasks):
    p = cli("eval", spm_run, "--tasks", tasks / "en.jsonl", tasks / "zh.jsonl")
    assert p.returncode == 0, p.stderr[-3000:]
    assert re.search(r"task en \(step 20, 12 items, 0-shot\): acc [0-9.]+  acc_norm", p.stdout), p.stdout
    assert "task zh (step 20, 8 items" in p.stdout
    for task, n in (("en", 12), ("zh", 8)):
        recs = results_of(spm_run, task)
        items = jsonl(tasks / f"{task}.jsonl")
        assert [r["i"] for r in recs] == list(range(n))
        for r, item in zip(recs, items):
            assert len(r["lls"]) == len(item["choices"]) and all(ll < 0 for ll in r["lls"])
            best = max(range(len(r["lls"])), key=lambda c: r["lls"][c])
            assert r["acc"] == float(best == item["gold"])
        [summary] = glob.glob(str(spm_run / "eval" / f"step_00000020-*-task-{task}-*-0shot.summary.json"))
        s = json.loads(open(summary).read())
        assert s["items"] == n and s["acc"] == sum(r["acc"] for r in recs) / n


def test_few_shot_is_seeded_and_all_checkpoints_tabulate(spm_run, tasks):
    p = cli("eval", spm_run, "--tasks", tasks / "en.jsonl", "--few-shot", 2, "--seed", 5, "--all-checkpoints")
    assert p.returncode == 0, p.stderr[-3000:]
    table = p.stdout[p.stdout.index("      step"):].splitlines()
    assert table[0].split()[:4] == ["step", "en/acc", "en/acc_norm", "en/acc_bytes"]
    assert [int(line.split()[0]) for line in table[1:]] == [10, 20]      # tiny.yaml: every 10 steps
    shots = results_of(spm_run, "en", "2shot-seed5")
    assert results_of(spm_run, "en", "2shot-seed5", step=10) != shots
    zero = results_of(spm_run, "en")
    # the shots change the context, but for the last two (long) items left-truncation cuts them away
    assert all(a["lls"] != b["lls"] for a, b in zip(shots[:-2], zero[:-2]))
    p = cli("eval", spm_run, "--tasks", tasks / "en.jsonl", "--few-shot", 2, "--seed", 6)
    assert p.returncode == 0, p.stderr[-3000:]
    other = results_of(spm_run, "en", "2shot-seed6")      # another seed draws other shots
    assert any(a["lls"] != b["lls"] for a, b in zip(shots, other))


def test_bad_task_file_is_one_line(spm_run, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"context": "a", "choices": ["b", "c"], "gold": 0}) + "\n"
                   + json.dumps({"context": "a", "choices": ["b"], "gold": 0}) + "\n")
    p = cli("eval", spm_run, "--tasks", bad)
    assert p.returncode == 1 and f"{bad}:2: 'choices' must be a list" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr




@pytest.mark.slow
def test_equals_lm_evaluation_harness(spm_run, tasks, tmp_path):
    pytest.importorskip("lm_eval")
    export = tmp_path / "hf"
    p = cli("export", spm_run, "--format", "hf", "--out", export)
    assert p.returncode == 0, p.stderr[-3000:]
    p = cli("eval", spm_run, "--tasks", tasks / "en.jsonl", tasks / "zh.jsonl")
    assert p.returncode == 0, p.stderr[-3000:]
    include = tmp_path / "lm_eval_tasks"
    for task in ("en", "zh"):
        write_lm_eval_task(include, f"mspretrain_{task}", tasks / f"{task}.jsonl",
                           ("acc", "acc_norm", "acc_bytes"))
    env = lm_eval_env(tmp_path)
    out = tmp_path / "lm_eval_out"
    p = run([sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={export},dtype=float32",
             "--include_path", str(include), "--tasks", "mspretrain_en,mspretrain_zh", "--device", "cpu",
             "--batch_size", "8", "--log_samples", "--output_path", str(out)], env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=str(spm_run / "tokenizer.model"))
    for task, want in (("en", 2), ("zh", 1)):      # items longer than the model: both truncate them left
        longer = [i for i in jsonl(tasks / f"{task}.jsonl")
                  if len(sp.encode(i["context"] + min(i["choices"], key=len))) > 65]
        assert len(longer) == want
    [results] = glob.glob(str(out / "*" / "results_*.json"))
    summary = json.loads(open(results).read())["results"]
    for task in ("en", "zh"):
        [samples] = glob.glob(str(out / "*" / f"samples_mspretrain_{task}_*.jsonl"))
        theirs = sorted(jsonl(samples), key=lambda r: r["doc_id"])
        ours = results_of(spm_run, task)
        assert [r["doc_id"] for r in theirs] == [r["i"] for r in ours]
        for a, b in zip(theirs, ours):
            lls = [float(x[0]) for x in a["filtered_resps"]]
            # fp32 forwards of the same weights (MindSpore, torch); lm-eval also sums the log-probs in fp32,
            # whose rounding grows with the sum: 1e-4, or a few fp32 ulps of a long (byte-fallback) choice
            for x, y in zip(lls, b["lls"]):
                assert abs(x - y) <= max(1e-4, 8 * 2.0 ** -24 * abs(y)), (task, a["doc_id"], lls, b["lls"])
            assert (a["acc"], a["acc_norm"], a["acc_bytes"]) == (b["acc"], b["acc_norm"], b["acc_bytes"])
        mine = json.loads(open(glob.glob(str(spm_run / "eval" / f"step_00000020-*-task-{task}-*-0shot.summary.json"))[0]).read())
        for m in ("acc", "acc_norm", "acc_bytes"):
            assert summary[f"mspretrain_{task}"][f"{m},none"] == pytest.approx(mine[m], abs=1e-12)
