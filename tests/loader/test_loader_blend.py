"""Blends: {dir: weight} mixed deterministically; cursor, state and resume cover them."""
import json

import numpy as np
import pytest

from mspretrain.loader import Loader, LoaderError, StateError
from mspretrain.loader.blend import MAX_WINDOW_ERROR, PERIOD

from loader_helpers import assert_same_batches, read_with_mindspore, take


@pytest.fixture(scope="module")
def blend(dataset, dataset_b):
    return {str(dataset): 0.7, str(dataset_b): 0.3}


def test_blended_batches_carry_their_source_and_its_rows(blend, dataset, dataset_b):
    refs = [read_with_mindspore(dataset), read_with_mindspore(dataset_b)]
    with Loader(blend, global_batch_size=32, seed=3) as ld:
        assert ld.num_samples == 300 + 97 and ld.blended
        batches = take(ld, 10)
    for b in batches:
        assert b["source"].dtype == np.int32 and b["source"].shape == (32,)
        for j in (0, 1):
            mine = b["source"] == j
            assert np.array_equal(b["input_ids"][mine], refs[j][b["sample_id"][mine]])
    sources = np.concatenate([b["source"] for b in batches])
    assert abs(np.mean(sources == 1) - 0.3) < 0.01


def test_realised_proportions_hold_over_every_window(blend):
    with Loader(blend, global_batch_size=4, seed=0) as ld:
        sources, _ = ld.locate(np.arange(10 ** 9, 10 ** 9 + 20_000))       # anywhere in the stream
    for j, w in enumerate([0.7, 0.3]):
        counts = np.concatenate([[0], np.cumsum(sources == j)])
        window = counts[2000:] - counts[:-2000]
        assert np.max(np.abs(window - 2000 * w)) <= MAX_WINDOW_ERROR + 2000 / PERIOD


def test_each_source_runs_through_its_own_epochs(blend):
    with Loader(blend, global_batch_size=97, seed=4) as ld:
        batches = take(ld, 12)
    sources = np.concatenate([b["source"] for b in batches])
    ids = np.concatenate([b["sample_id"] for b in batches])
    small = ids[sources == 1]                                # dataset_b: 97 samples an epoch
    assert small.size > 3 * 97
    epochs = [small[k * 97:(k + 1) * 97] for k in range(3)]
    for e in epochs:
        assert np.array_equal(np.sort(e), np.arange(97))
    assert not np.array_equal(epochs[0], epochs[1])


def test_blend_is_deterministic_and_resumes_exactly(blend):
    kw = dict(global_batch_size=16, seed=6)
    with Loader(blend, num_workers=2, prefetch=3, **kw) as a:
        take(a, 40)
        state = json.loads(json.dumps(a.state_dict()))
        expected = take(a, 20)
    assert [s["weight"] for s in state["sources"]] == [0.7, 0.3]
    with Loader(blend, **kw) as b:
        b.load_state_dict(state)
        assert_same_batches(take(b, 20), expected)
    # elastic: two ranks together give the same global batches
    ranks = [Loader(blend, dp_rank=r, dp_size=2, **kw) for r in range(2)]
    for ld in ranks:
        ld.load_state_dict(state)
    halves = [take(ld, 20) for ld in ranks]
    joined = [{k: np.concatenate([halves[0][s][k], halves[1][s][k]]) for k in expected[s]}
              for s in range(20)]
    assert_same_batches(joined, expected)
    for ld in ranks:
        ld.close()


def test_state_of_another_blend_is_refused(blend, dataset, dataset_b):
    with Loader(blend, global_batch_size=8, seed=1) as ld:
        next(ld)
        state = ld.state_dict()
    reweighted = {str(dataset): 0.5, str(dataset_b): 0.5}
    with Loader(reweighted, global_batch_size=8, seed=1) as other:
        with pytest.raises(StateError, match="dataset_fingerprint .*saved sources"):
            other.load_state_dict(state)
    with Loader(dataset, global_batch_size=8, seed=1) as single:
        with pytest.raises(StateError, match="dataset_fingerprint"):
            single.load_state_dict(state)


def test_blend_of_mismatched_datasets_is_refused(tmp_path, dataset):
    from synthetic import make_dataset
    longer = make_dataset(tmp_path / "long", num_train=20, num_valid=4, seq_length=24,
                          max_shard_bytes=200_000)
    with pytest.raises(LoaderError, match="seq_length or tokenizer differ"):
        Loader({str(dataset): 1, str(longer): 1}, global_batch_size=4)
    with pytest.raises(LoaderError, match="weight of .* must be a positive number"):
        Loader({str(dataset): 0}, global_batch_size=4)
