"""The one config layer under both command lines: the same `--set a=1 b=2` syntax, the same YAML number
rules, the same error style and exit code (2), errors that name the dotted key."""
from __future__ import annotations

import pytest

from mspretrain.dataprep.cli import main as dataprep_main
from mspretrain.dataprep.config import load_build_config
from mspretrain.common.config import EXIT_CONFIG, ConfigError, parse_set
from mspretrain.train.cli import main as train_main
from mspretrain.train.config import load_config

TINY = "configs/tiny.yaml"


def run_both(capsys, dataprep_sets: list[str], train_sets: list[str], tmp_path) -> tuple:
    """Exit code and stderr of `dataprep build ... --set ...` and `train plan ... --set ...`."""
    code_d = dataprep_main(["build", str(tmp_path), "--out", str(tmp_path / "out"), "--set", *dataprep_sets])
    err_d = capsys.readouterr().err
    code_t = train_main(["plan", "--config", TINY, "--set", *train_sets])
    err_t = capsys.readouterr().err
    return (code_d, err_d), (code_t, err_t)


def test_several_keys_after_one_set_flag_in_both_clis(capsys, tmp_path):
    # the bad key comes second: it is only reported if both KEY=VALUE items were read
    (code_d, err_d), (code_t, err_t) = run_both(
        capsys, ["pack.seq_length=32", "pack.valid_fraction=lots"],
        ["train.steps=5", "optim.lr=fast"], tmp_path)
    assert (code_d, code_t) == (EXIT_CONFIG, EXIT_CONFIG) == (2, 2)
    assert "dataprep build: config error: pack.valid_fraction: expected float, got 'lots'" in err_d
    assert "train plan: config error: optim.lr: expected float, got 'fast'" in err_t
    assert not (tmp_path / "out").exists()


def test_unknown_keys_are_reported_alike(capsys, tmp_path):
    (code_d, err_d), (code_t, err_t) = run_both(capsys, ["pack.seq_lenght=32"], ["train.stpes=5"], tmp_path)
    assert code_d == code_t == 2
    assert "unknown key pack.seq_lenght (known: seq_length, split_seed, valid_fraction)" in err_d
    assert "unknown key train.stpes (known: " in err_t and "steps" in err_t


@pytest.mark.parametrize("value, expected", [("1e3", 1000), ("2.0e3", 2000), ("'300'", 300), ("512", 512)])
def test_numbers_follow_the_same_rules_in_both(value, expected):
    assert load_config(None, [f"train.steps={value}"]).train.steps == expected
    assert load_build_config(sets=[f"tokenizer.vocab_size={value}"]).tokenizer.vocab_size == expected


@pytest.mark.parametrize("value", ["2.5", "1e30", "many", "[1, 2]", "true"])
def test_non_integers_are_refused_in_both(value):
    with pytest.raises(ConfigError, match="train.steps: expected int"):
        load_config(None, [f"train.steps={value}"])
    with pytest.raises(ConfigError, match="tokenizer.vocab_size: expected int"):
        load_build_config(sets=[f"tokenizer.vocab_size={value}"])


def test_a_bool_is_refused_for_a_number_but_taken_for_a_flag(tmp_path):
    with pytest.raises(ConfigError, match="optim.lr: expected float, got False"):
        load_config(None, ["optim.lr=false"])
    assert load_build_config(sets=["run.progress=false"]).run.progress is False


def test_sizes_and_tuples_are_typed_fields(tmp_path):
    cfg = load_build_config(sets=["shards.max_shard_bytes=64MB", "run.chunk_bytes=1MiB",
                                  "filters.max_top_ngram_fraction=[[2, 0.5]]"])
    assert (cfg.shards.max_shard_bytes, cfg.run.chunk_bytes) == (64_000_000, 1 << 20)
    assert cfg.filters.max_top_ngram_fraction == ((2, 0.5),)
    with pytest.raises(ConfigError, match="run.chunk_bytes: '12XB' is not a size"):
        load_build_config(sets=["run.chunk_bytes=12XB"])


def test_a_dataclass_that_checks_itself_names_its_section():
    with pytest.raises(ConfigError, match="^dedup: DedupConfig.num_perm must be in"):
        load_build_config(sets=["dedup.num_perm=1"])


@pytest.mark.parametrize("item", ["no_equals", "=3", " =3"])
def test_malformed_set_items(item):
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_set(item)


@pytest.mark.parametrize("text", ["0x10", "1e3", "010", "true", "1_000", ".5"])
def test_a_string_field_keeps_the_text_the_user_wrote(tmp_path, text):
    """YAML reads these as numbers or a bool; a string field takes them as written (in --set and in
    the YAML file), while a number field still reads the number."""
    cfg = load_config(None, [f"run.dir={text}", f"data.valid_split={text}"])
    assert (cfg.run.dir, cfg.data.valid_split) == (text, text)
    (tmp_path / "c.yaml").write_text(f"run:\n  dir: {text}\neval:\n  blend: {{{text}: 1.0}}\n")
    cfg = load_config(tmp_path / "c.yaml")
    assert cfg.run.dir == text and list(cfg.eval.blend) == [text]
    assert load_build_config(sets=[f"input.text_field={text}"]).input.text_field == text
    assert load_config(None, ["train.steps=0x10"]).train.steps == 16
    assert load_config(None, ["run.dir='0x10'"]).run.dir == "0x10"


def test_a_string_field_keeps_its_text_through_both_clis(tmp_path):
    import json
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[1]
    # train: the run dir is 0x10 (relative to the working directory), not 16
    r = subprocess.run([sys.executable, "-m", "mspretrain.train", "eval", "--config", str(repo / TINY),
                        "--set", "run.dir=0x10", f"data.path={tmp_path}"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 1 and "0x10 has no checkpoint yet" in r.stderr, r.stderr
    # dataprep: the text field is 0x10, not 16
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"id": i, "text": f"doc {i}"}) + "\n"
                                              for i in range(3)))
    r = subprocess.run([sys.executable, "-m", "mspretrain.dataprep", "build", "a.jsonl", "--out", "out",
                        "--no-progress", "--set", "input.text_field=0x10"], cwd=tmp_path,
                       capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert "3 record(s) in a.jsonl have no '0x10' field" in r.stderr
