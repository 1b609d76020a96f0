"""The command line and the config: YAML + flags + --set, sizes, errors that name the key; inspect;
`python -m mspretrain.dataprep` and the console script; --tokenizer MODEL reuse."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dataprep_helpers import REPO, TEST_SETTINGS
from mspretrain.dataprep.cli import main
from mspretrain.dataprep.config import ConfigError, load_build_config, manifest_config
from mspretrain.common.config import parse_size
from mspretrain.loader.manifest import load_manifest


@pytest.mark.parametrize("text, size", [("2GiB", 2 << 30), ("64MB", 64_000_000), ("512k", 512_000),
                                        ("1048576", 1 << 20), (4096, 4096), ("1.5KiB", 1536)])
def test_sizes(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["12XB", "-5", "0", "GiB", ""])
def test_bad_sizes_name_the_key(bad):
    with pytest.raises(ConfigError, match="shards.max_shard_bytes"):
        load_build_config(overrides={"shards.max_shard_bytes": bad})


def test_flags_override_yaml_and_runtime_options_stay_out_of_the_manifest(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("pack: {seq_length: 32, valid_fraction: 0.2}\nshards: {max_shard_bytes: 64MB}\n"
                    "filters: {max_top_ngram_fraction: [[2, 0.3]]}\nrun: {workers: 3}\n")
    cfg = load_build_config(path, {"pack.seq_length": 128}, ["tokenizer.vocab_size=500"])
    assert (cfg.pack.seq_length, cfg.pack.valid_fraction) == (128, 0.2)
    assert cfg.shards.max_shard_bytes == 64_000_000 and cfg.tokenizer.vocab_size == 500
    assert cfg.filters.max_top_ngram_fraction == ((2, 0.3),)
    assert cfg.run.workers == 3
    assert "run" not in manifest_config(cfg)
    assert manifest_config(cfg) == manifest_config(load_build_config(
        path, {"pack.seq_length": 128, "run.workers": 1}, ["tokenizer.vocab_size=500"]))


@pytest.mark.parametrize("yaml_text, key", [
    ("tokenizer: {vocab_sise: 100}\n", "tokenizer.vocab_sise"),
    ("pack: {seq_length: many}\n", "pack.seq_length"),
    ("tokenizer: {model_type: wordpiece}\n", "tokenizer.model_type"),
    ("filters: {disabled: [no_such_filter]}\n", "filters"),
    ("pack: {valid_fraction: 1.5}\n", "pack.valid_fraction"),
    ("shards: {max_shard_bytes: 100kB}\npack: {seq_length: 4096}\n", "shards.max_shard_bytes"),
])
def test_config_errors_name_the_key_and_exit_2(tmp_path, capsys, yaml_text, key):
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    assert main(["build", str(tmp_path), "--out", str(tmp_path / "o"), "--config", str(path)]) == 2
    assert key in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_vocab_size_and_tokenizer_are_exclusive(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["build", str(tmp_path), "--out", "o", "--vocab-size", "10", "--tokenizer", "m"])
    assert e.value.code == 2


def test_module_and_console_script_both_run():
    for argv in ([sys.executable, "-m", "mspretrain.dataprep", "--help"],
                 [str(Path(sys.executable).with_name("dataprep")), "build", "--help"]):
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "dataprep" in done.stdout


def test_inspect_decodes_a_sample_and_names_its_documents(reference, capsys):
    assert main(["inspect", str(reference), "--sample", "3"]) == 0
    out = capsys.readouterr().out
    m = load_manifest(reference)
    assert m.fingerprint in out and "sample 3 of train" in out
    docs = out.split("documents:")[1].strip().splitlines()
    assert docs and all(":" in d for d in docs)
    assert main(["inspect", str(reference), "--sample", str(10**9)]) == 1
    assert "out of range" in capsys.readouterr().err


def test_given_tokenizer_is_reused_and_gives_the_same_shards(corpus, reference, tmp_path):
    out = tmp_path / "data"
    model = reference / "tokenizer.model"
    settings = [a for a in TEST_SETTINGS if a not in ("--vocab-size", "1200")]
    assert main(["build", str(corpus), "--out", str(out), "--tokenizer", str(model), *settings]) == 0
    assert (out / "tokenizer.model").read_bytes() == model.read_bytes()
    m, ref = load_manifest(out), load_manifest(reference)
    assert m.config["tokenizer"]["model"] == "sha256:" + ref.tokenizer.sha256
    for split in ("train", "valid"):
        assert [s.sha256 for s in m.split(split).shards] == [s.sha256 for s in ref.split(split).shards]
