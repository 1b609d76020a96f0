"""The loader state (docs/contracts.md): order, the global cursor, exact resume, elastic data parallelism, state checks."""
import json

import numpy as np
import pytest

from mspretrain.loader import Loader, LoaderError, StateError

from loader_helpers import assert_same_batches, take

N = 300          # train samples of the `dataset` fixture


def ids_of(batches):
    return np.concatenate([b["sample_id"] for b in batches])


def test_batches_have_the_contract_shapes(dataset):
    with Loader(dataset, global_batch_size=8, seed=1) as ld:
        batch = next(ld)
        assert set(batch) == {"input_ids", "sample_id"}
        assert batch["input_ids"].dtype == np.int32 and batch["input_ids"].shape == (8, 17)
        assert batch["sample_id"].dtype == np.int64 and batch["sample_id"].shape == (8,)
        assert (ld.seq_length, ld.vocab_size, ld.num_samples, ld.cursor) == (16, 128, 300, 8)


def test_each_epoch_is_a_fresh_permutation_of_the_split(dataset):
    with Loader(dataset, global_batch_size=20, seed=5) as ld:     # 20 divides 300: 15 steps an epoch
        epochs = [ids_of(take(ld, 15)) for _ in range(3)]
    for ids in epochs:
        assert np.array_equal(np.sort(ids), np.arange(N))          # nothing repeated or skipped
    assert not np.array_equal(epochs[0], epochs[1]) and not np.array_equal(epochs[1], epochs[2])
    assert not np.array_equal(epochs[0], np.arange(N))


def test_batches_straddle_epoch_boundaries_by_the_formula(dataset):
    with Loader(dataset, global_batch_size=64, seed=2) as ld:     # 64 does not divide 300
        ids = ids_of(take(ld, 10))
        positions = np.arange(640)
        expected = ld.locate(positions)[1]
    assert np.array_equal(ids, expected)
    assert np.array_equal(np.sort(ids[:N]), np.arange(N))
    assert np.array_equal(np.sort(ids[N:2 * N]), np.arange(N))


def test_order_depends_on_the_seed_only(dataset):
    def first_ids(seed, **kw):
        with Loader(dataset, global_batch_size=30, seed=seed, **kw) as ld:
            return ids_of(take(ld, 12))
    a = first_ids(1)
    assert np.array_equal(a, first_ids(1, num_workers=2, prefetch=3))
    assert np.mean(a == first_ids(2)) < 0.05


def test_cursor_moves_only_when_a_batch_is_taken(dataset):
    with Loader(dataset, global_batch_size=6, seed=0, num_workers=2, prefetch=4) as ld:
        assert ld.state_dict()["cursor"] == 0
        next(ld)
        assert ld.cursor == 6 and ld.in_flight == 3                 # the workers are ahead
        take(ld, 4)
        state = ld.state_dict()
        assert ld.in_flight == 3                                    # bounded: prefetch 4 minus the one taken
    assert state["cursor"] == 30
    assert json.loads(json.dumps(state)) == state
    assert set(state) >= {"version", "dataset_fingerprint", "seed", "cursor"}


# cursors: mid-epoch, exactly at an epoch boundary, after several epochs (G = 12 and N = 300)
@pytest.mark.parametrize("steps_before", [7, 25, 83])
@pytest.mark.parametrize("workers_a,prefetch_a,workers_b,prefetch_b",
                         [(0, 1, 2, 4), (2, 1, 0, 1), (2, 4, 1, 2)])
def test_exact_resume(dataset, steps_before, workers_a, prefetch_a, workers_b, prefetch_b):
    kw = dict(global_batch_size=12, seed=9)
    with Loader(dataset, num_workers=workers_a, prefetch=prefetch_a, **kw) as a:
        take(a, steps_before)
        state = json.loads(json.dumps(a.state_dict()))
        expected = take(a, 30)                                      # 30 more steps cross an epoch
    with Loader(dataset, num_workers=workers_b, prefetch=prefetch_b, **kw) as b:
        b.load_state_dict(state)
        assert_same_batches(take(b, 30), expected)


def test_resume_after_loading_state_mid_iteration(dataset):
    with Loader(dataset, global_batch_size=10, seed=3, num_workers=2) as ld:
        take(ld, 3)
        state = ld.state_dict()
        later = take(ld, 5)
        ld.load_state_dict(state)                                   # rewind a running pipeline
        assert_same_batches(take(ld, 5), later)


def global_stream(dataset, dp_size, steps, state=None, G=24, workers=0):
    """Per step: the concatenation of every rank's slice, in rank order."""
    loaders = [Loader(dataset, global_batch_size=G, seed=11, dp_rank=r, dp_size=dp_size,
                      num_workers=workers) for r in range(dp_size)]
    if state is not None:
        for ld in loaders:
            ld.load_state_dict(state)
    per_rank = [take(ld, steps) for ld in loaders]
    end_state = loaders[0].state_dict()
    for ld in loaders:
        ld.close()
    steps_out = []
    for s in range(steps):
        steps_out.append({k: np.concatenate([per_rank[r][s][k] for r in range(dp_size)])
                          for k in per_rank[0][s]})
    return steps_out, end_state


def test_union_of_ranks_is_the_global_batch(dataset):
    single, _ = global_stream(dataset, 1, 6)
    for d in (2, 3, 4):
        split, _ = global_stream(dataset, d, 6, workers=1 if d == 2 else 0)
        assert_same_batches(split, single)


@pytest.mark.parametrize("new_dp", [1, 4])
def test_elastic_resume_continues_the_global_stream(dataset, new_dp):
    _, state = global_stream(dataset, 2, 14)            # cursor 336: into the second epoch
    assert state["cursor"] == 14 * 24
    resumed, _ = global_stream(dataset, new_dp, 10, state=state)
    straight, _ = global_stream(dataset, 1, 24)
    assert_same_batches(resumed, straight[14:])


def test_rank_slices_are_disjoint_positions(dataset):
    with Loader(dataset, global_batch_size=12, dp_rank=2, dp_size=3) as ld:
        assert ld.batch_positions(120).tolist() == list(range(128, 132))
        assert next(ld)["input_ids"].shape == (4, 17)


def test_state_of_another_dataset_or_seed_is_refused(dataset, dataset_b):
    with Loader(dataset, global_batch_size=4, seed=1) as ld:
        take(ld, 3)
        state = ld.state_dict()
    with Loader(dataset_b, global_batch_size=4, seed=1) as other:
        with pytest.raises(StateError, match="dataset_fingerprint .* != this dataset's"):
            other.load_state_dict(state)
        other.load_state_dict(state, force=True)
        assert other.cursor == 12
    with Loader(dataset, global_batch_size=4, seed=2) as reseeded:
        with pytest.raises(StateError, match="seed 1 != this loader's seed 2"):
            reseeded.load_state_dict(state)
        reseeded.load_state_dict(state, force=True)
        assert reseeded.cursor == 12 and reseeded.seed == 2
    with Loader(dataset, "valid", global_batch_size=4, seed=1) as valid:
        with pytest.raises(StateError, match="split 'train' != this loader's split 'valid'"):
            valid.load_state_dict(state)


@pytest.mark.parametrize("edit,match", [
    (lambda s: {"cursor": 5}, "lacks field 'version'"),
    (lambda s: {**s, "version": 99}, "version 99"),
    (lambda s: {**s, "cursor": -1}, "'cursor' must be an integer >= 0"),
    (lambda s: {**s, "cursor": 2.5}, "'cursor' must be an integer >= 0"),
])
def test_malformed_state_is_refused(dataset, edit, match):
    with Loader(dataset, global_batch_size=4) as ld:
        with pytest.raises(StateError, match=match):
            ld.load_state_dict(edit(ld.state_dict()))
        assert ld.cursor == 0


def test_finite_epochs_stop_before_a_partial_batch(dataset):
    with Loader(dataset, global_batch_size=64, seed=0, epochs=2) as ld:
        assert len(ld) == 9                                 # 600 // 64
        batches = list(ld)
        assert len(batches) == 9 and len(ld) == 0 and list(ld) == []
    with Loader(dataset, global_batch_size=20, seed=0, epochs=1, num_workers=2, prefetch=8) as ld:
        assert np.array_equal(np.sort(ids_of(list(ld))), np.arange(N))


def test_valid_split_reads_its_own_rows(dataset):
    from loader_helpers import read_with_mindspore
    reference = read_with_mindspore(dataset, "valid")
    with Loader(dataset, "valid", global_batch_size=40, seed=0, epochs=1) as ld:
        (batch,) = list(ld)
    assert np.array_equal(batch["input_ids"], reference[batch["sample_id"]])


@pytest.mark.parametrize("kwargs,match", [
    (dict(global_batch_size=10, dp_size=3), "not divisible by dp_size 3"),
    (dict(global_batch_size=8, dp_size=2, dp_rank=2), r"dp_rank 2 not in \[0, 2\)"),
    (dict(global_batch_size=0), "global_batch_size must be a positive integer"),
    (dict(global_batch_size=8, num_workers=-1), "num_workers must be >= 0"),
    (dict(global_batch_size=8, prefetch=0), "prefetch must be >= 1"),
    (dict(global_batch_size=8, epochs=0), "epochs must be None or >= 1"),
])
def test_bad_arguments_are_named(dataset, kwargs, match):
    with pytest.raises(LoaderError, match=match):
        Loader(dataset, **kwargs)


def test_bad_dataset_dirs_are_named(tmp_path, dataset):
    with pytest.raises(LoaderError, match="manifest.json: not found"):
        Loader(tmp_path, global_batch_size=4)
    with pytest.raises(LoaderError, match="no split 'test'"):
        Loader(dataset, "test", global_batch_size=4)


def test_loader_needs_neither_mindspore_nor_the_other_packages(dataset):
    import subprocess
    import sys
    code = ("import sys; from mspretrain.loader import Loader\n"
            f"ld = Loader({str(dataset)!r}, global_batch_size=8, num_workers=1)\n"
            "assert next(ld)['input_ids'].shape == (8, 17); ld.close()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mindspore' or m.split('.')[:2] in (['mspretrain', 'train'], ['mspretrain', 'dataprep'])))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
