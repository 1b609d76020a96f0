import pytest

from trainer_harness import tiny_dataset


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """A small real contract-1 dataset (MindRecord + manifest): 256 train, 32 valid samples of 33 tokens."""
    return tiny_dataset(tmp_path_factory.mktemp("tiny_data"))


@pytest.fixture
def graph_mode():
    """MindSpore GRAPH_MODE on CPU, for the in-process step/model tests."""
    import mindspore as ms

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    return ms


# ---- export/import, generation, scoring, eval suite (tests/train/hf_helpers.py)

@pytest.fixture(scope="session")
def spm_data(tmp_path_factory):
    """A dataset built by `dataprep build` (sentencepiece tokenizer, provenance): seq 64, vocab 1000."""
    from hf_helpers import build_spm_dataset
    return build_spm_dataset(tmp_path_factory.mktemp("spm") / "data")


@pytest.fixture(scope="session")
def spm_run(spm_data, tmp_path_factory):
    """configs/tiny.yaml (grouped KV heads, untied head) trained 20 steps on spm_data."""
    from hf_helpers import train_run
    return train_run(tmp_path_factory.mktemp("spm_run") / "run", spm_data)
