"""Helpers shared by the loader tests (a plainly named module: every test folder has a conftest)."""
import numpy as np


def read_with_mindspore(root, split="train"):
    import mindspore.dataset as msds
    from mspretrain.loader.manifest import load_manifest
    m = load_manifest(root)
    files = [str(m.shard_path(s)) for s in m.split(split).shards]
    rows = {}
    for r in msds.MindDataset(files, shuffle=False).create_dict_iterator(output_numpy=True, num_epochs=1):
        rows[int(r["sample_id"])] = r["input_ids"]
    return np.stack([rows[i] for i in range(len(rows))])


def take(loader, n):
    return [next(loader) for _ in range(n)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]), k
