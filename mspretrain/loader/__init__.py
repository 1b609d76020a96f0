"""A multiprocess, prefetching MindRecord loader with a global sample cursor (docs/contracts.md).

    from mspretrain.loader import Loader
    with Loader("data/ds", global_batch_size=32, seed=1, dp_rank=r, dp_size=d, num_workers=2) as ld:
        for batch in ld:            # {"input_ids": int32 [32 // d, L + 1], "sample_id": int64 [...]}
            ...
            state = ld.state_dict() # {version, dataset_fingerprint, seed, cursor, ...}; JSON-able

The MindSpore adapter lives in `loader.mindspore_adapter` (imported on demand).
"""
from mspretrain.loader.core import Loader, StateError
from mspretrain.loader.manifest import ManifestError
from mspretrain.loader.mindrecord import ShardError
from mspretrain.loader.workers import LoaderError, WorkerError

__all__ = ["Loader", "LoaderError", "ManifestError", "ShardError", "StateError", "WorkerError"]
