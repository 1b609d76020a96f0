"""Small real contract-1 datasets shared by the loader tests (built once per session)."""
import pytest

from loader_helpers import read_with_mindspore
from synthetic import make_dataset

SEQ = 16


@pytest.fixture(scope="session")
def dataset(tmp_path_factory):
    """300 train samples in several shards (rows of 17 tokens)."""
    return make_dataset(tmp_path_factory.mktemp("ds") / "a", num_train=300, num_valid=40,
                        seq_length=SEQ, vocab_size=128, seed=0, max_shard_bytes=200_000)


@pytest.fixture(scope="session")
def dataset_b(tmp_path_factory):
    """A second dataset with another size and content, for blends."""
    return make_dataset(tmp_path_factory.mktemp("ds") / "b", num_train=97, num_valid=10,
                        seq_length=SEQ, vocab_size=128, seed=1, max_shard_bytes=200_000)


@pytest.fixture(scope="session")
def reference_rows(dataset):
    """Every train row as MindSpore's own reader returns it, indexed by sample_id."""
    return read_with_mindspore(dataset)
