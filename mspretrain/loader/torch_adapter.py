"""A thin PyTorch adapter: a `torch.utils.data.IterableDataset` fed by a Loader.

    from torch.utils.data import DataLoader
    from mspretrain.loader.torch_adapter import LoaderDataset
    data = DataLoader(LoaderDataset(ld), batch_size=None)   # one item = this rank's slice of a global batch
    for item in data:
        loss = model(item["input_ids"])...
        state = ld.state_at(item["cursor"])                  # the loader state after this batch

Items are dicts of CPU tensors (`input_ids` int32 [B, L+1], `sample_id` int64 [B], `source` for blends)
plus `cursor`, the global cursor after the batch: saving `ld.state_at(cursor)` of the last item consumed is
exact, whatever a `DataLoader` read ahead (`pin_memory`, `prefetch_factor`). The Loader has its own worker
processes, so the DataLoader must not start any (`num_workers=0`, its default): each torch worker would
replay the whole stream. Importing this module imports torch; `loader` itself never does.
"""
from __future__ import annotations

import torch
from torch.utils.data import IterableDataset, get_worker_info

from mspretrain.loader.core import Loader


class LoaderDataset(IterableDataset):
    """The Loader's next `steps` batches (endless if None and the loader has no `epochs`)."""

    def __init__(self, loader: Loader, steps: int | None = None):
        super().__init__()
        self.loader, self.steps = loader, steps

    def __iter__(self):
        if get_worker_info() is not None:
            raise RuntimeError("LoaderDataset runs in a DataLoader worker process: use num_workers=0 "
                               "(the Loader's own num_workers does the parallel reading)")
        for batch, cursor in self.loader.with_cursors(self.steps):
            item = {name: torch.from_numpy(array) for name, array in batch.items()}
            item["cursor"] = cursor
            yield item
