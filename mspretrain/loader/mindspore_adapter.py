"""A thin MindSpore adapter: a `mindspore.dataset.GeneratorDataset` fed by a Loader.

    from mspretrain.loader.mindspore_adapter import to_dataset
    ds = to_dataset(ld)                                  # one item = this rank's slice of a global batch
    for item in ds.create_dict_iterator(output_numpy=True):
        ...train on item["input_ids"]...
        state = ld.state_at(int(item["cursor"]))         # the loader state after this batch

The prefetch caveat: MindSpore's pipeline pulls items ahead of the consumer (its own prefetch queue,
`mindspore.dataset.config.set_prefetch_size`), so the Loader's own `cursor` runs ahead of what the
trainer has taken, and `ld.state_dict()` would skip the prefetched batches on resume. The adapter
therefore puts the cursor after each batch into the item itself (column "cursor", int64 scalar):
the trainer saves `ld.state_at(item["cursor"])` of the last item it really consumed, which is exact
whatever MindSpore prefetched. The generator runs in MindSpore's pipeline thread
(`python_multiprocessing=False`): the Loader's own worker processes do the parallel reading.

Importing this module imports MindSpore; `loader` itself never does.
"""
from __future__ import annotations

import mindspore.dataset as msds
import numpy as np

from mspretrain.loader.core import Loader

COLUMNS = ("input_ids", "sample_id")


class _LoaderSource:
    """Iterable source for GeneratorDataset: the Loader's next `steps` batches (endless if None)."""

    def __init__(self, loader: Loader, columns: tuple[str, ...], steps: int | None):
        self.loader, self.columns, self.steps = loader, columns, steps

    def __iter__(self):
        for batch, cursor in self.loader.with_cursors(self.steps):
            yield tuple(batch[c] for c in self.columns) + (np.array(cursor, dtype=np.int64),)


class _SizedLoaderSource(_LoaderSource):
    """The same, with a length (MindSpore then knows the dataset size)."""

    def __len__(self) -> int:
        if self.loader.epochs is None:
            return self.steps
        return len(self.loader) if self.steps is None else min(self.steps, len(self.loader))


def to_dataset(loader: Loader, steps: int | None = None,
               columns: tuple[str, ...] | None = None) -> msds.GeneratorDataset:
    """A GeneratorDataset yielding `columns` (default input_ids, sample_id, + source for blends) and
    "cursor", one item per global batch, starting at the loader's current cursor."""
    if columns is None:
        columns = COLUMNS + (("source",) if loader.blended else ())
    unknown = set(columns) - {"input_ids", "sample_id", "source"}
    if unknown:
        raise ValueError(f"unknown loader columns {sorted(unknown)}")
    sized = steps is not None or loader.epochs is not None
    source = (_SizedLoaderSource if sized else _LoaderSource)(loader, tuple(columns), steps)
    return msds.GeneratorDataset(source, column_names=list(columns) + ["cursor"], shuffle=False,
                                 num_parallel_workers=1, python_multiprocessing=False)
