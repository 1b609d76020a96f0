"""The MindSpore adapter: a GeneratorDataset fed by the Loader, with exact cursor semantics."""
import numpy as np

from mspretrain.loader import Loader

from loader_helpers import assert_same_batches, take


def test_dataset_items_are_loader_batches_and_carry_the_cursor(dataset):
    from mspretrain.loader.mindspore_adapter import to_dataset
    kw = dict(global_batch_size=12, seed=2, dp_rank=1, dp_size=2)
    with Loader(dataset, **kw) as plain:
        expected = take(plain, 40)
    with Loader(dataset, num_workers=2, prefetch=2, **kw) as ld:
        ds = to_dataset(ld, steps=40)
        assert ds.get_dataset_size() == 40
        items = list(ds.create_dict_iterator(output_numpy=True, num_epochs=1))
        assert [int(i["cursor"]) for i in items] == [12 * (k + 1) for k in range(40)]
        assert_same_batches([{k: i[k] for k in ("input_ids", "sample_id")} for i in items], expected)
        assert items[0]["input_ids"].dtype == np.int32 and items[0]["input_ids"].shape == (6, 17)


def test_resume_from_the_consumed_item_not_from_what_mindspore_prefetched(dataset):
    from mspretrain.loader.mindspore_adapter import to_dataset
    kw = dict(global_batch_size=8, seed=5)
    with Loader(dataset, **kw) as ld:
        iterator = to_dataset(ld).create_dict_iterator(output_numpy=True, num_epochs=1)
        consumed = [next(iterator) for _ in range(5)]
        state = ld.state_at(int(consumed[-1]["cursor"]))
        following = [next(iterator) for _ in range(3)]
        assert state["cursor"] == 40
        assert ld.cursor >= 64                    # the pipeline ran ahead (fine: not the saved state)
        iterator.stop()
    with Loader(dataset, **kw) as resumed:
        resumed.load_state_dict(state)
        again = take(resumed, 3)
    assert_same_batches(again, [{k: f[k] for k in ("input_ids", "sample_id")} for f in following])


def test_blends_carry_the_source_column(dataset, dataset_b):
    from mspretrain.loader.mindspore_adapter import to_dataset
    with Loader({str(dataset): 0.5, str(dataset_b): 0.5}, global_batch_size=8, seed=1, epochs=1) as ld:
        ds = to_dataset(ld)
        assert ds.get_dataset_size() == (300 + 97) // 8
        items = list(ds.create_dict_iterator(output_numpy=True, num_epochs=1))
    sources = np.concatenate([i["source"] for i in items])
    assert len(items) == 49 and sources.dtype == np.int32 and set(sources.tolist()) == {0, 1}
