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
